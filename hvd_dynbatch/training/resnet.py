"""ResNet-18/50 (He et al., "Deep Residual Learning for Image Recognition", 2016).

The layout of the paper's Table 1: a stem, four stages of basic (two 3x3) or bottleneck
(1x1, 3x3, 1x1, expansion 4) blocks at widths 64-512, global average pooling, one linear
layer. For small images (CIFAR-sized, or the 8x8 digits) the stem is one 3x3 convolution
without the stride-2 and max-pool, as is usual for such inputs.
"""
from __future__ import annotations

from typing import Sequence

from torch import nn


class _Block(nn.Module):
    def __init__(self, inp: int, width: int, stride: int, bottleneck: bool):
        super().__init__()
        out = width * (4 if bottleneck else 1)
        if bottleneck:
            self.body = nn.Sequential(
                _conv_bn(inp, width, 1, 1), nn.ReLU(inplace=True),
                _conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),
                _conv_bn(width, out, 1, 1))
        else:
            self.body = nn.Sequential(
                _conv_bn(inp, width, 3, stride), nn.ReLU(inplace=True),
                _conv_bn(width, out, 3, 1))
        self.shortcut = (nn.Identity() if stride == 1 and inp == out
                         else _conv_bn(inp, out, 1, stride))
        self.out_channels = out

    def forward(self, x):
        return (self.body(x) + self.shortcut(x)).relu()


def _conv_bn(inp: int, out: int, kernel: int, stride: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(inp, out, kernel, stride, kernel // 2, bias=False),
                         nn.BatchNorm2d(out))


class ResNet(nn.Module):
    """A ResNet with `blocks[k]` blocks in stage k."""

    def __init__(self, blocks: Sequence[int], bottleneck: bool, in_channels: int = 3,
                 num_classes: int = 1000, small_input: bool = False):
        super().__init__()
        if small_input:
            stem = [nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64),
                    nn.ReLU(inplace=True)]
        else:
            stem = [nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                    nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
        layers, channels = list(stem), 64
        for stage, count in enumerate(blocks):
            for i in range(count):
                block = _Block(channels, 64 * 2 ** stage, 2 if i == 0 and stage > 0 else 1,
                               bottleneck)
                layers.append(block)
                channels = block.out_channels
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x):
        return self.classifier(self.features(x))
