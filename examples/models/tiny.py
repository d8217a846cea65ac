"""A small ShuffleNet-like demo model that exports and lowers in seconds.

It has every structure the placement algorithm cares about in ShuffleNetV2
(channel split, concatenation, channel shuffle, pooling, a linear head) at a
size that keeps fast tests fast.
"""

from __future__ import annotations

import torch
from torch import nn


def _channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    # view -> transpose -> clone (contiguous) -> view, as torchvision does.
    b, c, h, w = x.shape
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, c, h, w)


class _Unit(nn.Module):
    """Stride-1 ShuffleNetV2 unit: split, transform one half, concat, shuffle."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        half = channels // 2
        self.branch = nn.Sequential(
            nn.Conv2d(half, half, 1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(inplace=True),
            nn.Conv2d(half, half, 3, padding=1, groups=half, bias=False),
            nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(inplace=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left, right = x.chunk(2, dim=1)
        return _channel_shuffle(torch.cat((left, self.branch(right)), dim=1), 2)


class TinyShuffleNet(nn.Module):
    def __init__(self, channels: int = 16, units: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        self.units = nn.Sequential(*[_Unit(channels) for _ in range(units)])
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.units(self.stem(x))
        return self.head(x.mean((2, 3)))


def tiny_shufflenet(seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Input (1, 3, 32, 32); 3 units of 16 channels; 10 classes."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyShuffleNet().eval()
        example = (torch.randn(1, 3, 32, 32),)
    return model, example
