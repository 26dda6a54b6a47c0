"""The training loop in one process with `LocalBackend`: no Horovod, no launcher.

The loop's bookkeeping (every step once, evaluations where due, the summary) and its
arithmetic are checked against plain PyTorch replays of the samples the run logged.
"""
import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hvd_dynbatch.backend.backends import LocalBackend
from hvd_dynbatch.data.datasets import load_dataset
from hvd_dynbatch.errors import DynBatchError
from hvd_dynbatch.training.config import TrainConfig
from hvd_dynbatch.training.metrics import read_metrics, steady_steps, step_records
from hvd_dynbatch.training.models import build_model
from hvd_dynbatch.training.trainer import Trainer, train
from evaluation import replay_delayed_sgd, top1_top5
from launcher import assert_same_weights

LR, MOMENTUM, SEED = 0.05, 0.9, 5


def run(tmp_path: Path, **options):
    """`train` in this process; its summary, metrics records, saved weights and the samples
    of each step."""
    config = TrainConfig(model="mlp", dataset="digits", lr=LR, momentum=MOMENTUM, seed=SEED,
                         metrics=str(tmp_path / "metrics.jsonl"),
                         save_model=str(tmp_path / "model.pt"),
                         sample_log=str(tmp_path / "samples"), progress=False, **options)
    summary = train(config, LocalBackend())
    samples = {}
    for f in (tmp_path / "samples").iterdir():
        for line in f.read_text().splitlines():
            record = json.loads(line)
            samples[record["step"]] = record["indices"]
    return summary, read_metrics(config.metrics), torch.load(config.save_model), samples


def fresh_model():
    data = load_dataset("digits")
    torch.manual_seed(SEED)
    return data, build_model("mlp", data.input_shape, data.num_classes)


def test_synchronous_loop_is_plain_sgd_over_the_planned_steps(tmp_path):
    summary, records, weights, samples = run(tmp_path, global_batch=64, max_steps=30,
                                             eval_every=10)
    steps = step_records(records)
    assert [r["step"] for r in steps] == list(range(30)) == sorted(samples)
    assert [r["global_batch"] for r in steps] == [len(samples[s]) for s in range(30)]
    # 1437 training digits: 22 whole steps of 64, then a short one of 29 ends epoch 0.
    assert steps[22]["global_batch"] == 29 and steps[23]["epoch"] == 1
    assert [r["step"] for r in records if r.get("type") == "eval"] == [10, 20, 30]
    assert (summary["steps"], summary["epochs_completed"], summary["world_size"]) == (30, 1, 1)
    assert summary["samples"] == sum(len(v) for v in samples.values())

    data, model = fresh_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(30):
        x, y = data.train.fetch(samples[step])
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert_same_weights(weights, model.state_dict(), atol=1e-7)
    assert summary["final_accuracy"] == pytest.approx(top1_top5(weights, "mlp", data)[0])


def test_a_slowed_rank_alone_marks_the_steps_it_calibrated_on_and_they_are_not_steady(
        tmp_path):
    _, records, _, _ = run(tmp_path, global_batch=64, max_steps=20, eval_every=0,
                           slowdown="3")
    marked = [r["step"] for r in step_records(records) if r.get("emulator_calibration")]
    assert marked == list(range(12))
    assert [r["step"] for r in steady_steps(records)] == list(range(12, 20))


@pytest.mark.parametrize("staleness, momentum", [
    ("none", MOMENTUM), ("predict", MOMENTUM), ("momentum", 2 * MOMENTUM - 1),
    ("dc", MOMENTUM)])
def test_abs_loop_applies_the_last_window_before_the_final_evaluation(
        tmp_path, staleness, momentum):
    """ABS-SGD's update k applies window k-1's mean gradient, compensated for its staleness
    as the rule says (replayed here in plain PyTorch); the last window is applied at the
    end, before the last step's evaluation, which is therefore of the saved weights."""
    summary, records, weights, samples = run(
        tmp_path, batching="abs", global_batch=64, micro_batch=8, max_steps=6, eval_every=3,
        staleness=staleness)
    assert [r["step"] for r in step_records(records)] == list(range(6)) == sorted(samples)
    assert [r["step"] for r in records if r.get("type") == "eval"] == [3, 6]
    data, model = fresh_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=momentum)
    replay_delayed_sgd(model, opt, data.train, [[samples[step]] for step in range(6)],
                       staleness)
    assert_same_weights(weights, model.state_dict(), atol=1e-7)
    assert summary["final_accuracy"] == pytest.approx(top1_top5(weights, "mlp", data)[0])


def abs_trainer(staleness: str = "predict") -> Trainer:
    backend = LocalBackend()
    trainer = Trainer(TrainConfig(model="mlp", batching="abs", global_batch=32, micro_batch=8,
                                  seed=SEED, progress=False, staleness=staleness), backend)
    trainer.join_world(backend.communicator())
    return trainer


def test_abs_state_carries_the_pending_update_to_a_new_trainer():
    first = abs_trainer("dc")
    for _ in range(3):
        first.steps.train_step(LR, first.emulator, first.samples_log, 1)
    state = first.steps.state_dict()
    assert state["reduced"] is not None and state["step"] == 3
    second = abs_trainer("dc")
    # Deep copies, as from a file: torch's load_state_dict would share the momentum buffers.
    second.model.load_state_dict(copy.deepcopy(first.model.state_dict()))
    second.optimizer.load_state_dict(copy.deepcopy(first.optimizer.state_dict()))
    second.steps.load_state_dict(copy.deepcopy(state))
    tensors = ("reduced", "staleness")
    saved = {k: v for k, v in state.items() if k not in tensors}
    restored = second.steps.state_dict()
    assert {k: v for k, v in restored.items() if k not in tensors} == saved
    # The staleness rule's state (delay compensation's last change of the weights) came
    # along.
    assert all(torch.equal(a, b) for a, b in zip(restored["staleness"]["change"],
                                                 state["staleness"]["change"], strict=True))
    # Both apply the same pending gradient: the same weights after.
    assert first.steps.drain(LR) and second.steps.drain(LR)
    assert_same_weights(second.model.state_dict(), first.model.state_dict(), atol=1e-7)
    assert not second.steps.drain(LR)


def test_abs_state_from_another_world_size_is_refused():
    trainer = abs_trainer()
    state = trainer.steps.state_dict()
    with pytest.raises(DynBatchError, match="saved by 2 ranks and cannot resume on 1"):
        trainer.steps.load_state_dict({**state, "world_size": 2})
    with pytest.raises(DynBatchError, match="cannot go on with 64"):
        trainer.steps.load_state_dict(state, global_batch=64)


class CountingBackend(LocalBackend):
    """A one-process backend that counts its barriers."""

    def __init__(self):
        self.barriers = 0

    def barrier(self):
        self.barriers += 1


def test_every_rank_meets_at_a_barrier_before_it_may_exit_a_finished_or_stopped_run(
        tmp_path):
    """A run that ends alike on every rank waits at a barrier (so no rank exits, and shuts
    Horovod down, while another is still in the last gather); one stopped by a signal too.
    An error that one rank may hit alone must not wait there: it would hang."""
    from hvd_dynbatch.training.trainer import Stopped, _last_collective_done

    backend = CountingBackend()
    train(TrainConfig(model="linear", dataset="digits", global_batch=64, max_steps=2,
                      eval_every=100000, progress=False), backend)
    assert backend.barriers == 1
    for error, barriers in ((Stopped("stopped by SIGTERM"), 2), (DynBatchError("bad"), 2)):
        with pytest.raises(type(error)):
            with _last_collective_done(backend):
                raise error
        assert backend.barriers == barriers
