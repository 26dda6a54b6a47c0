"""hvd-dynbatch: data-parallel training with Horovod on workers that are not alike.

A training script takes `DynamicBatching` (its loader, the step's weight, timing, the
exchange and the controller) and the weighted `DistributedOptimizer`; see
`examples/pytorch_mnist_dynbatch.py`. The pure pieces (controller, sampler, timer, slowdown,
the cluster simulator) import only numpy and the standard library. The pieces bound to torch
or Horovod (`DynamicBatching`, `DistributedOptimizer`, `for_horovod`, `train`) are imported
when first used, so importing this package starts nothing. A script that trains on the CPU
should call `keep_freed_memory()` first: glibc otherwise hands a step's large tensors back to
the kernel, and the next step pays for fresh pages (`backend.host_memory`).
"""
from .core.controller import BatchController, ControllerConfig, Rule, apportion
from .core.heterogeneity import Slowdown, preset_factors
from .core.sampler import StepPlan, VariableBatchSampler
from .core.simulator import Scenario, simulate
from .core.timing import StepTimer
from .errors import DynBatchError

__version__ = "0.1.0"

_LAZY = {
    "DynamicBatching": "training.batching",
    "StepRecord": "training.batching",
    "BatchLoader": "data.loader",
    "DistributedOptimizer": "backend.weighting",
    "batch_weight": "backend.weighting",
    "for_horovod": "backend.comm",
    "keep_freed_memory": "backend.host_memory",
    "Communicator": "backend.comm",
    "LocalCommunicator": "backend.comm",
    "TrainConfig": "training.config",
    "train": "training.trainer",
}

__all__ = ["BatchController", "ControllerConfig", "Rule", "apportion", "DynBatchError",
           "Slowdown", "preset_factors", "Scenario", "simulate", "StepPlan",
           "VariableBatchSampler", "StepTimer", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
