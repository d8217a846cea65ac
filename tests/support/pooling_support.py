"""Shared by the pooling and tosa_stats tests: lower small models both ways."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.arm import stock
from codec_tosa.serialization.pooled import PooledTosaSerializer, PoolingStats
from codec_tosa.serialization.tosa_stats import TosaStats, tosa_stats


@dataclass
class Lowered:
    """One delegate: stock bytes, pooled bytes, and what pooling did."""

    program: torch.export.ExportedProgram  # untouched copy of the partition
    stock: bytes
    pooled: bytes
    stats: PoolingStats

    @property
    def before(self) -> TosaStats:
        return tosa_stats(self.stock)

    @property
    def after(self) -> TosaStats:
        return tosa_stats(self.pooled)


def lower_pooled(program: torch.export.ExportedProgram, tosa_spec: str) -> tuple[bytes, PoolingStats]:
    spec = arm_adapter.tosa_compile_spec(tosa_spec)
    serializer = arm_adapter.new_serializer(spec, PooledTosaSerializer)
    tosa_bytes = arm_adapter.lower_into(copy.deepcopy(program), spec, serializer)
    return tosa_bytes, serializer.stats


def lower_both(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], tosa_spec: str, int8: bool = False
) -> Lowered:
    """Stock Arm lowering and pooled lowering of the single delegate of `model`."""
    spec = arm_adapter.tosa_compile_spec(tosa_spec)
    if int8:
        program = stock.stock_int8_program(model.eval(), inputs, spec)
    else:
        program = torch.export.export(model.eval(), inputs)
    (part,) = stock.stock_partitions(program, spec)
    pooled, stats = lower_pooled(part.program, tosa_spec)
    return Lowered(part.program, part.tosa_bytes, pooled, stats)


class ConvNet(torch.nn.Module):
    """Convolutions, a residual add, a mean and a linear head: rescale-heavy in INT8."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(x))
        z = self.dw(self.c2(y)) + y
        return self.head(z.mean((2, 3)))


CONV_INPUTS = (torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)


class Attention(torch.nn.Module):
    """Two batched matmuls and repeated reshapes to the same shapes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(2, 8, 3, 16).unbind(2)
        a = torch.softmax(q @ k.transpose(1, 2), dim=-1) @ v
        return (a.reshape(16, 16) + x.reshape(16, 16)).reshape(2, 8, 16)


ATTENTION_INPUTS = (torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(2)),)


class Branches(torch.nn.Module):
    """`torch.cond` with the same helper constants in every block."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def yes(x: torch.Tensor) -> torch.Tensor:
            return (x.reshape(4, 4) * 2.0 * x.reshape(4, 4)).reshape(16)

        def no(x: torch.Tensor) -> torch.Tensor:
            return (x.reshape(4, 4) * 3.0 * x.reshape(4, 4)).reshape(16)

        y = torch.cond(x.sum() > 0, yes, no, (x,))
        return (y.reshape(4, 4) * 2.0 * y.reshape(4, 4)).reshape(16)


BRANCH_INPUTS = (torch.randn(16, generator=torch.Generator().manual_seed(3)),)
