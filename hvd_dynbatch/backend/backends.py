"""The training loop's backend: every Horovod call the loop makes, behind one small interface.

`HorovodBackend` binds the loop to a Horovod job: the batch-weighted `DistributedOptimizer`
(see `weighting`), the initial broadcast of the weights, the asynchronous sum-allreduce that
ABS-SGD overlaps with compute, and Horovod Elastic's state object and retry loop.
`LocalBackend` is a job of one process with the same interface and no Horovod at all, so the
loop runs in a unit test. The exchange of the toolkit's own few numbers per rank is the
`Communicator` (`comm`), which each backend hands out.

Horovod reduces CUDA tensors with NCCL, which takes one rank per GPU: two ranks on one GPU
fail at the first allreduce ("Duplicate GPU detected"), and Horovod refuses a reduction whose
tensors are on the GPU on some ranks and on the CPU on others. Where ranks share a GPU (an
emulated heterogeneous job on one GPU) or some train on the CPU and others on a GPU,
`bind_device` says so and every reduction from then on goes through host memory, as Horovod's
CPU operations (Gloo or MPI): gradients, the initial broadcast, ABS-SGD's window sums. Each
GPU rank then copies its gradients to the host and the sums back, which costs what moving
them costs; one rank per GPU keeps NCCL.
"""
from __future__ import annotations

import abc
import hashlib
import os
import sys
from typing import Optional, Sequence

from .comm import Communicator, LocalCommunicator


class Backend(abc.ABC):
    """What the training loop needs from the job it runs in."""

    @abc.abstractmethod
    def communicator(self) -> Communicator:
        """The communicator of the current world (call again after an elastic reset)."""

    @abc.abstractmethod
    def local_rank(self) -> int:
        """This rank's index among the ranks of its node (which GPU it takes)."""

    @abc.abstractmethod
    def weighted_optimizer(self, optimizer, model, batching, scaler=None,
                           fp16_allreduce: bool = False):
        """`optimizer` with gradients weighted by `batching.weight` and summed over the ranks
        (as float16 with `fp16_allreduce`), telling `batching` where each step is, and with
        `scaler` the loss scaler's part done after the sum (see
        `weighting.DistributedOptimizer`)."""

    @abc.abstractmethod
    def bind_device(self, device) -> bool:
        """Tell the backend the device this rank computes on; whether its reductions go
        through host memory from now on (see the module docstring). Collective."""

    @abc.abstractmethod
    def broadcast_parameters(self, model) -> None:
        """Give every rank rank 0's weights. Collective."""

    @abc.abstractmethod
    def allreduce_sum_async(self, tensor, name: str):
        """Start summing `tensor` over the ranks; returns a handle. Collective."""

    @abc.abstractmethod
    def done(self, handle) -> bool:
        """Whether the reduction of `handle` has finished (local)."""

    @abc.abstractmethod
    def wait(self, handle):
        """Wait for the reduction of `handle` and return the sum."""

    @abc.abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called it. Collective."""


class LocalBackend(Backend):
    """A job of one process: the reductions are the identity."""

    def communicator(self) -> Communicator:
        return LocalCommunicator()

    def local_rank(self) -> int:
        return 0

    def weighted_optimizer(self, optimizer, model, batching, scaler=None,
                           fp16_allreduce: bool = False):
        from .weighting import LocalOptimizer

        return LocalOptimizer(optimizer, batching, scaler)

    def bind_device(self, device) -> bool:
        return False

    def broadcast_parameters(self, model) -> None:
        pass

    def allreduce_sum_async(self, tensor, name: str):
        return tensor

    def done(self, handle) -> bool:
        return True

    def wait(self, handle):
        return handle

    def barrier(self) -> None:
        pass


class HorovodBackend(Backend):
    """The running Horovod job (initialises Horovod). With `nap` (seconds) a rank waiting for
    a reduction naps between polls instead of spinning (see `weighting.wait_napping`)."""

    def __init__(self, nap: Optional[float] = None):
        import horovod.torch as hvd

        hvd.init()
        self._hvd, self._nap = hvd, nap
        self._host = _ThroughHost(hvd.Compression.none)

    def communicator(self) -> Communicator:
        from .comm import for_horovod

        return for_horovod()

    def local_rank(self) -> int:
        return self._hvd.local_rank()

    def weighted_optimizer(self, optimizer, model, batching, scaler=None,
                           fp16_allreduce: bool = False):
        from .weighting import DistributedOptimizer

        if fp16_allreduce:
            self._host.inner = self._hvd.Compression.fp16
        return DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    batching=batching, nap=self._nap, scaler=scaler,
                                    compression=self._host)

    def bind_device(self, device) -> bool:
        ids = self.communicator().allgather([gpu_id(device)])[:, 0]
        self._host.on = reduce_through_host(ids)
        return self._host.on

    def broadcast_parameters(self, model) -> None:
        state = model.state_dict()
        if not self._host.on:
            self._hvd.broadcast_parameters(state, root_rank=0)
            return
        host = {name: tensor.cpu() for name, tensor in state.items()}
        self._hvd.broadcast_parameters(host, root_rank=0)
        for name, tensor in state.items():
            tensor.copy_(host[name])

    def allreduce_sum_async(self, tensor, name: str):
        sent, ctx = self._host.compress(tensor)
        return self._hvd.allreduce_async(sent, op=self._hvd.Sum, name=name), ctx

    def done(self, handle) -> bool:
        return bool(self._hvd.poll(handle[0]))

    def wait(self, handle):
        handle, ctx = handle
        if self._nap is not None:
            from .weighting import wait_napping

            wait_napping([handle], self._hvd.poll, self._nap)
        return self._host.decompress(self._hvd.synchronize(handle), ctx)

    def barrier(self) -> None:
        self._hvd.barrier()

    def run_elastic(self, model, optimizer, progress: dict, on_reset, train) -> None:
        """Run `train(state)` under Horovod Elastic until it returns: `state` (a `TorchState`
        of `model`, `optimizer` and the plain-values dict `progress`) is committed by
        `state.commit()` and restored on failures; `on_reset()` runs on every reset, before
        the state sync (so it must not communicate)."""
        if os.environ.get("HOROVOD_ELASTIC") != "1" and self._hvd.rank() == 0:
            # horovodrun sets it in elastic mode (--host-discovery-script, --min-np).
            print("hvd-dynbatch: warning: --elastic, but this job was not started in "
                  "horovodrun's elastic mode (--host-discovery-script, --min-np/--max-np): "
                  "it cannot grow or shrink, and a lost worker ends it", file=sys.stderr,
                  flush=True)
        state = self._hvd.elastic.TorchState(model=model, optimizer=optimizer,
                                             progress=progress)
        state.register_reset_callbacks([on_reset])
        self._hvd.elastic.run(train)(state)


class _ThroughHost:
    """A Horovod compressor (`compression=`) that, while `on`, hands Horovod a host copy of
    each CUDA tensor it reduces and puts the sum back on the tensor's device, around the
    compressor `inner` (none, or fp16 for --fp16-allreduce)."""

    def __init__(self, inner):
        self.inner, self.on = inner, False

    def compress(self, tensor):
        tensor, ctx = self.inner.compress(tensor)
        if not self.on or tensor.device.type == "cpu":
            return tensor, (None, ctx)
        return tensor.cpu(), (tensor.device, ctx)

    def decompress(self, tensor, ctx):
        device, inner = ctx
        return self.inner.decompress(tensor if device is None else tensor.to(device), inner)


def gpu_id(device) -> float:
    """A number that names `device`'s physical GPU the same in every process (from its UUID,
    whatever CUDA_VISIBLE_DEVICES numbers it), -1 for the CPU."""
    if device.type != "cuda":
        return -1.0
    import torch

    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return float(int(hashlib.sha256(uuid.encode()).hexdigest()[:12], 16))   # exact in float64


def reduce_through_host(gpu_ids: Sequence[float]) -> bool:
    """Whether a job whose ranks compute on `gpu_ids` (`gpu_id` of each) must reduce through
    host memory: some GPU has two ranks, or some ranks are on GPUs and others on the CPU."""
    gpus = [g for g in gpu_ids if g >= 0]
    return bool(gpus) and (len(set(gpus)) < len(gpus) or len(gpus) < len(gpu_ids))


def stopped_by_peer(exc: BaseException) -> bool:
    """Whether `exc` is Horovod's error for a collective that failed because another rank
    did (a non-elastic job then ends)."""
    from horovod.common.exceptions import HorovodInternalError

    return isinstance(exc, HorovodInternalError)
