"""A run-time check of the stack under a launcher: Horovod's world, an allreduce, an allgather.

Run `hvd-dynbatch check` under horovodrun, mpirun or srun on a new cluster before training:
each rank prints what it sees as one JSON line, so a wrong world size, a missing MPI
controller or a broken network shows up in seconds.
"""
from __future__ import annotations

import socket

from ..backend import comm as comm_module


def run_check() -> dict:
    """Initialise Horovod and report this rank's view of the job.

    Collective: every rank must call it. Returns a dict with Horovod's rank and size, whether
    Horovod runs on MPI, mpi4py's world, the sum of all ranks from a Horovod allreduce, and the
    ranks as gathered by the toolkit's communicator (mpi4py under MPI, Horovod under Gloo).
    """
    import horovod.torch as hvd
    import torch
    from mpi4py import MPI

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum, name="check.sum")
    communicator = comm_module.for_horovod()
    gathered = communicator.allgather([hvd.rank()])
    return {
        "host": socket.gethostname(),
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "horovod_on_mpi": bool(hvd.mpi_enabled()),
        "mpi_world_rank": MPI.COMM_WORLD.Get_rank(),
        "mpi_world_size": MPI.COMM_WORLD.Get_size(),
        "allreduce_sum_of_ranks": float(total.item()),
        "exchange_backend": communicator.backend,
        "allgathered_ranks": [int(r) for r in gathered[:, 0]],
    }
