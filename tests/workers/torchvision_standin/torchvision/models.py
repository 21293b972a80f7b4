"""``tiny_resnet``: a small residual conv net taking 3x224x224 images to 1000 classes."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class _Block(nn.Module):
    def __init__(self, channels: int, norm_layer: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = norm_layer(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = norm_layer(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


class TinyResNet(nn.Module):
    def __init__(
        self, num_classes: int = 1000, norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d
    ) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 7, stride=4, padding=3, bias=False),
            norm_layer(16),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        self.block = _Block(16, norm_layer)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.block(self.stem(x))), 1))


def tiny_resnet(norm_layer: Callable[[int], nn.Module] = nn.BatchNorm2d) -> TinyResNet:
    """As torchvision's resnets, ``norm_layer`` replaces BatchNorm2d (Horovod's
    pytorch_synthetic_benchmark.py passes ``hvd.SyncBatchNorm``)."""
    return TinyResNet(norm_layer=norm_layer)
