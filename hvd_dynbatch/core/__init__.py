"""Pure logic: the batch controller and its apportioning, the step sampler's arithmetic, the
learning-rate rules, the ABS-SGD window rule, the step timer, the emulated slowdown and the
cluster simulator.

These modules import only numpy and the standard library (and `hvd_dynbatch.errors`), so they
are unit-tested in one process and shared by the training loop and the simulator alike.
"""
