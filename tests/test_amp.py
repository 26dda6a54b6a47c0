"""float16 mixed precision: the loss scaler's part after the weighted allreduce, the overflow
that is skipped alike on every rank, Horovod's fp16 compression, channels_last, and the
timing that leaves cuDNN's autotuning out. All of it runs on the CPU here (torch's CPU
autocast and GradScaler); on a GPU the same code runs with CUDA's."""
import time

import pytest
import torch
from torch.utils.data import TensorDataset

from hvd_dynbatch.backend.backends import LocalBackend
from hvd_dynbatch.backend.comm import LocalCommunicator
from hvd_dynbatch.backend.device import loss_scaler, to_device
from hvd_dynbatch.backend.weighting import LocalOptimizer
from hvd_dynbatch.errors import DynBatchError
from hvd_dynbatch.tools.launch import Launcher
from hvd_dynbatch.training.batching import DynamicBatching
from hvd_dynbatch.training.config import TrainConfig
from hvd_dynbatch.training.metrics import read_metrics, step_records
from hvd_dynbatch.training.trainer import train
from launcher import CLI, run_ranks

CPU = torch.device("cpu")


class CountedSteps:
    """Stands in for a DynamicBatching: counts the optimizer's calls."""

    def __init__(self):
        self.computed = self.reduced = self.done = 0

    def compute_done(self):
        self.computed += 1

    def gradients_reduced(self):
        self.reduced += 1

    def step_done(self):
        self.done += 1


def scaled_optimizer(init_scale: float):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    batching = CountedSteps()
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    optimizer = LocalOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), batching, scaler)
    return model, optimizer, scaler, batching


def test_the_loss_scaler_is_for_fp16_only():
    assert isinstance(loss_scaler(CPU, "fp16"), torch.amp.GradScaler)
    assert loss_scaler(CPU, "bf16") is None and loss_scaler(CPU, "off") is None


def test_a_scaled_step_applies_the_unscaled_gradient():
    model, optimizer, scaler, batching = scaled_optimizer(1024.0)
    x = torch.randn(4, 3)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    plain = torch.optim.SGD(reference.parameters(), lr=0.1)
    reference(x).pow(2).mean().backward()
    plain.step()
    scaler.scale(model(x).pow(2).mean()).backward()
    optimizer.step()
    assert optimizer.finite and not optimizer.overflowed
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs)
    assert (batching.computed, batching.reduced, batching.done) == (1, 1, 1)


def test_an_overflow_is_skipped_the_scale_backs_off_and_the_step_still_closes():
    model, optimizer, scaler, batching = scaled_optimizer(65536.0)
    before = [p.detach().clone() for p in model.parameters()]
    # 1e35 x 65536 is past float32's largest value: the scaled gradients are infinite.
    scaler.scale(model(torch.ones(2, 3)).sum() * 1e35).backward()
    optimizer.step()
    assert not optimizer.finite and optimizer.overflowed
    assert scaler.get_scale() == 32768.0
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert batching.done == 1


def test_a_gradient_not_finite_at_scale_one_is_not_an_overflow():
    model, optimizer, scaler, _ = scaled_optimizer(1.0)
    scaler.scale(model(torch.ones(2, 3)).sum() * float("nan")).backward()
    optimizer.step()
    assert not optimizer.finite and not optimizer.overflowed


def test_abs_sgd_refuses_fp16_and_says_what_to_use():
    for options in (dict(amp="fp16"), dict(fp16_allreduce=True)):
        with pytest.raises(DynBatchError, match="use --amp bf16"):
            TrainConfig(batching="abs", **options)


def test_channels_last_lays_out_images_only():
    images, labels = torch.randn(2, 3, 4, 4), torch.arange(2)
    x, y = to_device((images, labels), CPU, channels_last=True)
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert not images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(x, images) and torch.equal(y, labels)


@pytest.mark.parametrize("autotuning, first_step_timed", [(False, True), (True, False)])
def test_with_autotuning_the_first_step_at_a_batch_size_is_not_timed(autotuning,
                                                                      first_step_timed):
    data = TensorDataset(torch.arange(100), torch.arange(100))
    batching = DynamicBatching(data, 10, LocalCommunicator(), adjust_every=100,
                               autotuning=autotuning, untimed_steps=0)
    steps = iter(batching.loader())
    for k in range(2):
        next(steps)
        if k == 0:
            time.sleep(0.3)   # the first step at this size: cuDNN timing its algorithms
        batching.step_done()
    # The median of the two steps' times, or of the second's alone.
    assert (batching.timer.smoothed > 0.1) == first_step_timed


def test_an_fp16_run_on_the_cpu_learns_and_overflows_do_not_stop_it(tmp_path):
    metrics = tmp_path / "fp16.jsonl"
    summary = train(TrainConfig(model="cnn", amp="fp16", device="cpu", max_steps=60,
                                global_batch=64, lr=0.1, eval_every=60, channels_last=True,
                                metrics=str(metrics), progress=False), LocalBackend())
    steps = step_records(read_metrics(str(metrics)))
    losses = [r["loss"] for r in steps]
    assert sum(losses[-5:]) < 0.4 * sum(losses[:5]), losses
    assert summary["final_accuracy"] > 0.6
    # The scaler starts at 2^16, which the first steps' gradients overflow: those steps are
    # skipped under the default --on-nan stop, counted apart and marked.
    overflowed = [r["step"] for r in steps if r.get("overflow")]
    assert summary["overflow_steps"] == len(overflowed) >= 1
    assert summary["skipped_steps"] == 0


@pytest.mark.processes
def test_fp16_with_fp16_allreduce_on_two_ranks_reaches_90_percent(tmp_path):
    metrics = tmp_path / "fp16.jsonl"
    job = run_ranks(Launcher.GLOO, 2, [
        *CLI, "train", "--model", "cnn", "--amp", "fp16", "--fp16-allreduce",
        "--channels-last", "--global-batch", "128", "--lr", "0.1", "--epochs", "40",
        "--eval-every", "20", "--target-accuracy", "0.9", "--slowdown", "1,2",
        "--metrics", str(metrics), "--no-progress"], timeout=300)
    assert job.returncode == 0, job.explain()
    summary = read_metrics(str(metrics))[-1]
    assert summary["config"]["amp"] == "fp16" and summary["config"]["fp16_allreduce"]
    assert summary["final_accuracy"] >= 0.9 and summary["time_to_target"] is not None
    # The skip-or-step decision is taken on the summed gradient: every rank took the same.
    assert summary["weights_identical"], summary["weights_checksums"]


@pytest.mark.gpu
def test_an_fp16_run_on_a_gpu_with_channels_last_and_cudnn_benchmark_learns():
    summary = train(TrainConfig(model="cnn", amp="fp16", device="cuda", max_steps=60,
                                global_batch=64, lr=0.1, eval_every=60, channels_last=True,
                                cudnn_benchmark=True, progress=False), LocalBackend())
    assert summary["device"].startswith("cuda") and summary["final_accuracy"] > 0.6
