"""The communication layer: the one place that talks to Horovod or MPI for the toolkit's own data.

Everything else (the timing exchange, evaluation, the training loop) depends only on the small
`Communicator` interface, so single-process code and tests can hand in `LocalCommunicator`.

Two implementations exchange between ranks:

* `MPICommunicator` uses mpi4py on the communicator Horovod runs on. It applies when Horovod
  runs on its MPI controller (`mpirun`, `horovodrun --mpi`).
* `HorovodCommunicator` uses Horovod's own allgather. Under Gloo (`horovodrun --gloo` and every
  elastic run) each process is an MPI singleton, so mpi4py cannot reach the other ranks and
  this is the only way.

`for_horovod()` picks between them; it must be called after `hvd.init()`.
"""
from __future__ import annotations

import abc
from typing import Callable, Sequence

import numpy as np


class Communicator(abc.ABC):
    """Rank, size and an all-gather of a few floats per rank."""

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank in the job."""

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """The number of ranks in the job."""

    @property
    @abc.abstractmethod
    def backend(self) -> str:
        """A short name of what carries the data ("local", "mpi4py", "horovod")."""

    @abc.abstractmethod
    def allgather(self, values: Sequence[float]) -> np.ndarray:
        """Gather `values` (the same length on every rank) from all ranks.

        Collective: every rank must call it, in the same order as the other collectives.
        Returns a float64 array of shape (size, len(values)) whose row r is rank r's values.
        """

    def allgather_async(self, values: Sequence[float]) -> Callable[[], np.ndarray]:
        """Start an `allgather` of `values`; returns the function that waits for its result.

        Collective, like `allgather`, and no other collective of this communicator may run
        between the two calls. Here the gather runs when the result is asked for; under
        MPI and Horovod it starts at once.
        """
        values = list(values)
        return lambda: self.allgather(values)


class LocalCommunicator(Communicator):
    """A job of one process: rank 0 of 1. For single-process use and tests."""

    rank = 0
    size = 1
    backend = "local"

    def allgather(self, values: Sequence[float]) -> np.ndarray:
        return np.asarray(values, dtype=np.float64).reshape(1, -1)


class MPICommunicator(Communicator):
    """All-gather over an mpi4py communicator (MPI's Iallgather on a float64 buffer)."""

    backend = "mpi4py"

    def __init__(self, comm):
        # Read once: MPI may be finalised by the time an error message asks for them
        # (another rank's exit can end the job), and a call then aborts the process.
        self._comm, self._rank, self._size = comm, comm.Get_rank(), comm.Get_size()

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def allgather(self, values: Sequence[float]) -> np.ndarray:
        return self.allgather_async(values)()

    def allgather_async(self, values: Sequence[float]) -> Callable[[], np.ndarray]:
        """Start MPI's non-blocking Iallgather now; the returned function waits for it.

        Started before the optimizer waits for the gradients, it progresses while Horovod's
        background thread drives MPI for their allreduce, so the exchange rarely waits.
        """
        send = np.ascontiguousarray(values, dtype=np.float64)
        recv = np.empty((self.size, send.size), dtype=np.float64)
        request = self._comm.Iallgather(send, recv)

        def result() -> np.ndarray:
            request.Wait()
            return recv
        return result


class HorovodCommunicator(Communicator):
    """All-gather through Horovod's allgather; works under every Horovod controller."""

    backend = "horovod"

    def __init__(self):
        import horovod.torch as hvd

        self._hvd = hvd

    @property
    def rank(self) -> int:
        return self._hvd.rank()

    @property
    def size(self) -> int:
        return self._hvd.size()

    def allgather(self, values: Sequence[float]) -> np.ndarray:
        return self.allgather_async(values)()

    def allgather_async(self, values: Sequence[float]) -> Callable[[], np.ndarray]:
        """Submit the all-gather to Horovod now: started just before the optimizer waits
        for the gradients, it is negotiated in the same coordination cycle as they are."""
        import torch

        row = torch.as_tensor(np.asarray(values, dtype=np.float64)).reshape(1, -1)
        # Horovod matches collectives across ranks by name. Unnamed ops get a per-process
        # counter, which differs between survivors and a newly joined worker in elastic runs;
        # one fixed name is safe because only one gather is under way at a time.
        handle = self._hvd.allgather_async(row, name="hvd_dynbatch.allgather")
        return lambda: self._hvd.synchronize(handle).numpy()


def for_horovod() -> Communicator:
    """The communicator for the running Horovod job (call after `hvd.init()`).

    mpi4py when Horovod runs on MPI and mpi4py's world is Horovod's world; Horovod's allgather
    otherwise (Gloo, elastic runs, or Horovod started on a sub-communicator).
    """
    import horovod.torch as hvd

    if hvd.size() == 1:
        return LocalCommunicator()
    if hvd.mpi_enabled():
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        if world.Get_size() == hvd.size() and world.Get_rank() == hvd.rank():
            return MPICommunicator(world)
    return HorovodCommunicator()
