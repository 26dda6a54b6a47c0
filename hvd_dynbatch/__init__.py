"""hvd-dynbatch: data-parallel training with Horovod on workers that are not alike.

A training script takes `DynamicBatching` (its loader, the step's weight, timing, the
exchange and the controller) and the weighted `DistributedOptimizer`; see
`examples/pytorch_mnist_dynbatch.py`. The pure pieces (controller, sampler, timer, slowdown,
the cluster simulator) import only numpy and the standard library. The pieces bound to torch
or Horovod (`DynamicBatching`, `DistributedOptimizer`, `for_horovod`, `train`) are imported
when first used, so importing this package starts nothing.
"""
from .controller import BatchController, ControllerConfig, Rule, apportion
from .errors import DynBatchError
from .heterogeneity import Slowdown, preset_factors
from .sampler import StepPlan, VariableBatchSampler
from .simulator import Scenario, simulate
from .timing import StepTimer

__version__ = "0.1.0"

_LAZY = {
    "DynamicBatching": "batching",
    "StepRecord": "batching",
    "BatchLoader": "loader",
    "DistributedOptimizer": "weighting",
    "batch_weight": "weighting",
    "for_horovod": "comm",
    "Communicator": "comm",
    "LocalCommunicator": "comm",
    "TrainConfig": "config",
    "train": "training",
}

__all__ = ["BatchController", "ControllerConfig", "Rule", "apportion", "DynBatchError",
           "Slowdown", "preset_factors", "Scenario", "simulate", "StepPlan",
           "VariableBatchSampler", "StepTimer", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
