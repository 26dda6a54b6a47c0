"""The training loop's backend: every Horovod call the loop makes, behind one small interface.

`HorovodBackend` binds the loop to a Horovod job: the batch-weighted `DistributedOptimizer`
(see `weighting`), the initial broadcast of the weights, the asynchronous sum-allreduce that
ABS-SGD overlaps with compute, and Horovod Elastic's state object and retry loop.
`LocalBackend` is a job of one process with the same interface and no Horovod at all, so the
loop runs in a unit test. The exchange of the toolkit's own few numbers per rank is the
`Communicator` (`comm`), which each backend hands out.
"""
from __future__ import annotations

import abc
import os
import sys
from typing import Optional

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

    def communicator(self) -> Communicator:
        from .comm import for_horovod

        return for_horovod()

    def local_rank(self) -> int:
        return self._hvd.local_rank()

    def weighted_optimizer(self, optimizer, model, batching, scaler=None,
                           fp16_allreduce: bool = False):
        from .weighting import DistributedOptimizer

        compression = self._hvd.Compression.fp16 if fp16_allreduce else self._hvd.Compression.none
        return DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    batching=batching, nap=self._nap, scaler=scaler,
                                    compression=compression)

    def broadcast_parameters(self, model) -> None:
        self._hvd.broadcast_parameters(model.state_dict(), root_rank=0)

    def allreduce_sum_async(self, tensor, name: str):
        return self._hvd.allreduce_async(tensor, op=self._hvd.Sum, name=name)

    def done(self, handle) -> bool:
        return bool(self._hvd.poll(handle))

    def wait(self, handle):
        if self._nap is not None:
            from .weighting import wait_napping

            wait_napping([handle], self._hvd.poll, self._nap)
        return self._hvd.synchronize(handle)

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


def stopped_by_peer(exc: BaseException) -> bool:
    """Whether `exc` is Horovod's error for a collective that failed because another rank
    did (a non-elastic job then ends)."""
    from horovod.common.exceptions import HorovodInternalError

    return isinstance(exc, HorovodInternalError)
