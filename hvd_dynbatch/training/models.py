"""Models by name: small ones for the embedded data, ResNets for image benchmarks.

None has dropout, and only the ResNets have batch-norm, so `linear`, `mlp` and `cnn` train to
the same weights on N ranks as on one (the property dynamic batching is tested with).
The ResNets are written here because torchvision cannot be installed beside a CPU torch on
every machine; `torchvision:NAME` uses torchvision's model where it is installed.
"""
from __future__ import annotations

from typing import Callable, Dict, Sequence

from torch import nn

from ..errors import DynBatchError
from .resnet import ResNet


def _linear(shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(_numel(shape), classes))


def _mlp(shape, classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(_numel(shape), 128), nn.ReLU(),
                         nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, classes))


def _cnn(shape, classes):
    return nn.Sequential(
        nn.Conv2d(shape[0], 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(32 * 16, 64), nn.ReLU(), nn.Linear(64, classes))


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _resnet(blocks: Sequence[int], bottleneck: bool):
    def build(shape, classes):
        return ResNet(blocks, bottleneck, in_channels=shape[0], num_classes=classes,
                      small_input=min(shape[1:]) < 64)
    return build


MODELS: Dict[str, Callable] = {
    "linear": _linear,
    "mlp": _mlp,
    "cnn": _cnn,
    "resnet18": _resnet((2, 2, 2, 2), bottleneck=False),
    "resnet50": _resnet((3, 4, 6, 3), bottleneck=True),
}


def build_model(name: str, input_shape: Sequence[int], num_classes: int):
    """A freshly initialised model for inputs of `input_shape` (C, H, W) and `num_classes`."""
    if name.startswith("torchvision:"):
        try:
            import torchvision.models
        except ImportError:
            raise DynBatchError(f"model '{name}' needs torchvision, which is not "
                                f"installed") from None
        factory = getattr(torchvision.models, name.split(":", 1)[1], None)
        if factory is None:
            raise DynBatchError(f"torchvision has no model '{name.split(':', 1)[1]}'")
        return factory(num_classes=num_classes)
    if name not in MODELS:
        raise DynBatchError(f"unknown model '{name}'; choose one of {', '.join(MODELS)} "
                            f"or torchvision:NAME")
    return MODELS[name](tuple(input_shape), num_classes)


def least_batch(model: nn.Module) -> int:
    """The smallest batch `model` can train on: 2 with batch norm (whose statistics need more
    than one sample per channel), else 1."""
    has_batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    return 2 if has_batch_norm else 1
