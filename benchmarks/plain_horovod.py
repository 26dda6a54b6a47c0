"""Baseline for the overhead benchmark: the same training with plain Horovod, equal batches.

Run under a launcher (horovodrun -np 2 ... python benchmarks/plain_horovod.py ...). Each rank
takes an equal slice of the same shuffled order, `hvd.DistributedOptimizer` averages the
gradients, and nothing is timed per rank or exchanged; glibc keeps freed memory, as on the
train command's CPU ranks (`backend.host_memory`), so the two loops differ only in what they
do. With `--commit-every N` the loop runs under Horovod Elastic (in horovodrun's elastic mode)
as an elastic `hvd-dynbatch train` job's does: a `TorchState` of the model and optimizer,
committed every N steps. Rank 0 prints one JSON line with the median step time, the
throughput derived from it and the commits made (to `--output`, if given, instead of stdout: a
launcher can break a rank's output lines).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hvd_dynbatch.backend.host_memory import keep_freed_memory
from hvd_dynbatch.data.datasets import load_dataset
from hvd_dynbatch.training.models import build_model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--output", help="File for the JSON line (default: stdout).")
    parser.add_argument("--commit-every", type=int, default=0,
                        help="Run under Horovod Elastic, committing every N steps (0: not).")
    args = parser.parse_args()

    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(1)
    keep_freed_memory()
    data = load_dataset(args.dataset, seed=0)
    torch.manual_seed(0)
    model = build_model(args.model, data.input_shape, data.num_classes)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9),
        named_parameters=model.named_parameters())
    local = args.global_batch // hvd.size()
    order = np.random.default_rng(0).permutation(len(data.train))
    times, commits = [], []

    def train(state):
        while state.step < args.steps:
            start = (state.step * args.global_batch) % (len(order) - args.global_batch + 1)
            mine = order[start + hvd.rank() * local:start + (hvd.rank() + 1) * local]
            began = time.perf_counter()
            x, y = data.train.fetch(mine)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            times.append(time.perf_counter() - began)
            state.step += 1
            if args.commit_every and state.step % args.commit_every == 0:
                state.commit()
                commits.append(state.step)

    if args.commit_every:
        hvd.elastic.run(train)(hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0))
    else:
        train(types.SimpleNamespace(step=0))
    if hvd.rank() == 0:
        kept = times[len(times) // 4:]
        median = statistics.median(kept)
        line = json.dumps({"median_step_time": median,
                           "samples_per_sec": local * hvd.size() / median,
                           "commits": len(commits)})
        if args.output:
            Path(args.output).write_text(line + "\n")
        else:
            print(line)


if __name__ == "__main__":
    main()
