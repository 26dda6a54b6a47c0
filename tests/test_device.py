"""Where a rank computes: the --device choice, batches moved there, the --amp precision, and
the clock that waits for the GPU. The CUDA paths that can be reached without a GPU run
against a stand-in for `torch.cuda`; the ones that need a GPU are marked and skip here."""
import time

import pytest
import torch

from hvd_dynbatch.backend.backends import LocalBackend, _ThroughHost, reduce_through_host
from hvd_dynbatch.backend.device import (autocast, check_device_spec, parameters_device,
                                         resolve_device, to_device, wait_for_compute)
from hvd_dynbatch.errors import DynBatchError
from hvd_dynbatch.training.config import TrainConfig
from hvd_dynbatch.training.metrics import read_metrics, step_records
from hvd_dynbatch.training.trainer import train
from launcher import expect_user_error, run_cli


@pytest.mark.parametrize("spec", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_specs_that_are_understood(spec):
    check_device_spec(spec)


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", ""])
def test_a_bad_device_is_refused_with_the_choices_named(spec):
    with pytest.raises(DynBatchError, match="choose auto, cpu, cuda or cuda:N"):
        TrainConfig(device=spec)


def test_without_cuda_auto_is_the_cpu_and_asking_for_a_gpu_is_an_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto", 3) == torch.device("cpu")
    assert resolve_device("cpu", 0) == torch.device("cpu")
    for spec in ("cuda", "cuda:0"):
        with pytest.raises(DynBatchError, match=f"--device {spec}: this machine has no GPU"):
            resolve_device(spec, 0)


@pytest.fixture
def two_gpus(monkeypatch):
    """`torch.cuda` as on a node with 2 GPUs; returns the devices set current."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def test_each_rank_of_a_node_takes_the_gpu_of_its_local_rank(two_gpus):
    assert [resolve_device("auto", r) for r in (0, 1)] == \
        [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert resolve_device("cuda", 1) == torch.device("cuda", 1)
    assert resolve_device("cuda:0", 1) == torch.device("cuda", 0)   # explicit: any rank
    assert two_gpus == [0, 1, 1, 0]


def test_more_ranks_than_gpus_on_a_node_is_an_error_that_says_so(two_gpus):
    with pytest.raises(DynBatchError, match="needs GPU 2 but the node has 2; start at most 2 "
                                            r".*\(--device cuda:0\) for the ranks to share"):
        resolve_device("auto", 2)
    with pytest.raises(DynBatchError, match="needs GPU 5 but the node has 2"):
        resolve_device("cuda:5", 0)


@pytest.mark.parametrize("gpus, through_host", [
    ([7.0, 9.0], False),             # a GPU each: NCCL
    ([-1.0, -1.0], False),           # all on the CPU
    ([7.0, 7.0], True),              # two ranks on one GPU: NCCL would refuse
    ([7.0, 9.0, 7.0], True),
    ([7.0, -1.0], True),             # GPU and CPU ranks: Horovod refuses mixed devices
    ([3.0], False),
])
def test_reductions_go_through_host_memory_where_ranks_share_a_gpu_or_mix_devices(
        gpus, through_host):
    assert reduce_through_host(gpus) is through_host


def test_the_host_compressor_wraps_another_and_leaves_cpu_tensors_where_they_are():
    import horovod.torch as hvd

    staged = _ThroughHost(hvd.Compression.fp16)
    staged.on = True
    grad = torch.tensor([1.5, -2.25])
    sent, ctx = staged.compress(grad)
    assert sent.dtype == torch.float16 and sent.device.type == "cpu"
    back = staged.decompress(sent, ctx)
    assert back.dtype == torch.float32 and torch.equal(back, grad)


@pytest.mark.gpu
def test_the_host_compressor_sends_a_host_copy_of_a_gpu_tensor_and_returns_the_sum_there():
    import horovod.torch as hvd

    staged = _ThroughHost(hvd.Compression.none)
    grad = torch.arange(4.0, device="cuda")
    assert staged.compress(grad)[0] is grad           # off: the tensor itself, to NCCL
    staged.on = True
    sent, ctx = staged.compress(grad)
    assert sent.device.type == "cpu" and torch.equal(sent, grad.cpu())
    back = staged.decompress(sent * 2, ctx)
    assert back.device == grad.device and torch.equal(back, grad * 2)


class _Batch:
    """A tensor stand-in that records how it was moved."""

    def __init__(self, pinned):
        self.pinned, self.moves = pinned, []

    def is_pinned(self):
        return self.pinned

    def to(self, device, non_blocking=False):
        self.moves.append((device, non_blocking))
        return self


def test_a_batch_from_pinned_memory_is_copied_without_blocking():
    pinned, pageable = _Batch(True), _Batch(False)
    cuda = torch.device("cuda", 0)
    assert to_device((pinned, pageable), cuda) == (pinned, pageable)
    assert (pinned.moves, pageable.moves) == ([(cuda, True)], [(cuda, False)])


def test_a_cpu_batch_stays_the_same_tensors():
    x, y = torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)
    moved = to_device((x, y), torch.device("cpu"))
    assert moved[0] is x and moved[1] is y


def test_the_device_of_a_model_and_of_its_optimizer():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert parameters_device(model) == parameters_device(optimizer) == torch.device("cpu")
    assert parameters_device(torch.nn.ReLU()) == torch.device("cpu")


def test_on_a_gpu_the_wait_records_an_event_on_the_current_stream_and_waits_for_it(
        monkeypatch):
    calls = []

    class Event:
        def record(self, stream):
            calls.append(("record", stream))

        def synchronize(self):
            calls.append(("synchronize",))

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d: f"stream of {d}")
    wait_for_compute(torch.device("cuda", 1))
    assert calls == [("record", "stream of cuda:1"), ("synchronize",)]
    calls.clear()
    wait_for_compute(torch.device("cpu"))
    assert calls == []


@pytest.mark.gpu
def test_the_wait_lasts_until_the_gpu_has_finished_its_kernels():
    gpu = torch.device("cuda", 0)
    a = torch.randn(4096, 4096, device=gpu)
    wait_for_compute(gpu)
    started = time.perf_counter()
    for _ in range(20):
        a = a @ a / 64
    queued = time.perf_counter() - started
    wait_for_compute(gpu)
    finished = time.perf_counter() - started
    assert finished > 2 * queued


@pytest.mark.gpu
def test_the_wait_leaves_other_streams_running():
    gpu = torch.device("cuda", 0)
    side = torch.cuda.Stream(gpu)
    a = torch.randn(4096, 4096, device=gpu)
    wait_for_compute(gpu)
    with torch.cuda.stream(side):
        for _ in range(40):
            a = a @ a / 64
    started = time.perf_counter()
    wait_for_compute(gpu)
    assert time.perf_counter() - started < 0.01
    assert not side.query()   # the side stream's work is still running
    side.synchronize()



@pytest.mark.processes
def test_asking_for_a_gpu_where_there_is_none_is_a_user_error():
    # Also on a GPU machine: the processes the suite starts see no GPU (see conftest).
    expect_user_error(run_cli(["train", "--device", "cuda", "--max-steps", "1"]),
                      "--device cuda: this machine has no GPU that torch can use")


def test_a_run_on_the_cpu_named_explicitly_trains(tmp_path):
    summary = train(TrainConfig(model="mlp", device="cpu", max_steps=3, progress=False),
                    LocalBackend())
    assert summary["steps"] == 3 and summary["config"]["device"] == "cpu"


def test_bf16_autocast_runs_the_forward_pass_in_bfloat16_and_off_in_float32():
    layer, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    with autocast(torch.device("cpu"), "bf16"):
        low = layer(x)
    with autocast(torch.device("cpu"), "off"):
        full = layer(x)
    assert (low.dtype, full.dtype, layer.weight.dtype) == \
        (torch.bfloat16, torch.float32, torch.float32)
    torch.testing.assert_close(low.float(), full, rtol=0.02, atol=0.02)


def test_an_unknown_precision_is_refused_with_the_choices_named():
    with pytest.raises(DynBatchError, match="unknown --amp 'fp8': choose off, bf16 or fp16"):
        TrainConfig(amp="fp8")


def _cpu_run(tmp_path, batching, amp):
    """A short CNN run on the digits in this process: its saved weights, its step losses,
    its summary."""
    metrics, model = tmp_path / f"{amp}.jsonl", tmp_path / f"{amp}.pt"
    summary = train(TrainConfig(model="cnn", amp=amp, device="cpu", batching=batching,
                                max_steps=60, global_batch=64, lr=0.1, eval_every=60,
                                metrics=str(metrics), save_model=str(model), progress=False),
                    LocalBackend())
    losses = [r["loss"] for r in step_records(read_metrics(str(metrics)))]
    return torch.load(model), losses, summary


@pytest.mark.parametrize("batching", ["dynamic", "abs"])
def test_a_bf16_run_on_the_cpu_keeps_float32_weights_and_learns(tmp_path, batching):
    weights, losses, summary = _cpu_run(tmp_path, batching, "bf16")
    _, full_losses, _ = _cpu_run(tmp_path, batching, "off")
    assert all(w.dtype == torch.float32 for w in weights.values())
    # The first step is the same in both runs (ABS-SGD's first window has no cap: all of B,
    # on the same samples and weights), so its loss differs only by the forward pass's
    # precision: close, and not equal, as it is in bfloat16.
    assert losses[0] == pytest.approx(full_losses[0], rel=0.05)
    assert losses[0] != full_losses[0]
    assert sum(losses[-5:]) < 0.4 * sum(losses[:5]), losses
    assert summary["final_accuracy"] > 0.6
