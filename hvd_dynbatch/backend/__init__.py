"""The Horovod backend: every Horovod and mpi4py call of the library.

`comm` exchanges the toolkit's few numbers per rank (mpi4py when Horovod runs on MPI, Horovod's
allgather otherwise), `weighting` is the batch-weighted `DistributedOptimizer`, and `backends`
is what the training loop needs from a job (`HorovodBackend`, and `LocalBackend` for one
process). Horovod is imported when first used, so importing this package starts nothing.
"""
