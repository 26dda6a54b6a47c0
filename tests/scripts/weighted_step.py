"""The library's weighted optimizer, called as a user's script calls it, under Horovod's options.

Two ranks train unequal slices (3 and 9 samples) of one batch of 12 for one SGD step with
`hvd_dynbatch.DistributedOptimizer` and `set_batch_size`, and rank 0 compares the weights with
one step of the whole batch in this process. Each case is one of Horovod's ways to start the
allreduce: per gradient, in groups, with two backward passes per step (each pass's loss over
the passes, the batch size set once), and a sparse embedding gradient. Rank 0 prints one JSON
line: the largest weight difference per case, and whether a step with a NaN gradient on one
rank was skipped on both with the weights unchanged.
"""
import copy
import json
import sys

import horovod.torch as hvd
import torch
import torch.nn.functional as F

from hvd_dynbatch import DistributedOptimizer

hvd.init()
torch.manual_seed(0)
SLICES = [(0, 3), (3, 12)]
x, y = torch.randn(12, 5), torch.randint(0, 3, (12,))
tokens = torch.randint(0, 7, (12,))


def build(sparse: bool) -> torch.nn.Module:
    torch.manual_seed(1)
    if sparse:
        return torch.nn.Sequential(torch.nn.Embedding(7, 4, sparse=True), torch.nn.Linear(4, 3))
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def loss_of(model, sparse: bool, rows) -> torch.Tensor:
    return F.cross_entropy(model(tokens[rows] if sparse else x[rows]), y[rows])


def step(case: str, nan: bool = False) -> dict:
    sparse = case == "sparse"
    model = build(sparse)
    reference = copy.deepcopy(model)
    options = {"groups": {"groups": 1},
               "two passes": {"backward_passes_per_step": 2}}.get(case, {})
    optimizer = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                     named_parameters=model.named_parameters(), **options)
    start, end = SLICES[hvd.rank()]
    optimizer.set_batch_size(end - start, 12)
    optimizer.zero_grad()
    if case == "two passes":
        middle = (start + end) // 2
        for rows in (slice(start, middle), slice(middle, end)):
            share = (rows.stop - rows.start) / (end - start)
            (loss_of(model, sparse, rows) * share).backward()
    else:
        loss = loss_of(model, sparse, slice(start, end))
        (loss * float("nan") if nan and hvd.rank() == 1 else loss).backward()
    optimizer.step()
    if nan:
        unchanged = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                          reference.state_dict().values()))
        return {"skipped": not optimizer.finite, "unchanged": unchanged}
    whole = torch.optim.SGD(reference.parameters(), lr=0.5)
    loss_of(reference, sparse, slice(0, 12)).backward()
    whole.step()
    return {"difference": max((a - b).abs().max().item() for a, b in
                              zip(model.state_dict().values(), reference.state_dict().values()))}


report = {case: step(case) for case in ("per gradient", "groups", "two passes", "sparse")}
report["nan"] = step("per gradient", nan=True)
if hvd.rank() == 0:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
hvd.barrier()
