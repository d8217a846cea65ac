"""Softmax decomposition at integer policies: every float softmax becomes Arm's
six integer pieces, and the FP32 program computes the same softmax."""

from __future__ import annotations

import collections

import torch
from torch import nn

from codec_tosa._passes.decompose_softmax import decompose_softmax

aten = torch.ops.aten


class _TwoSoftmaxes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1) + nn.functional.softmax(x * 3, dim=1)


def _targets(ep: torch.export.ExportedProgram) -> collections.Counter:
    return collections.Counter(n.target for n in ep.graph.nodes if n.op == "call_function")


def test_every_softmax_becomes_the_six_pieces_and_computes_the_same() -> None:
    x = torch.randn(2, 5, 7)
    ep = torch.export.export(_TwoSoftmaxes(), (x,))
    assert decompose_softmax(ep) == 2
    targets = _targets(ep)
    assert not {aten.softmax.int, aten._softmax.default} & set(targets)
    for t in (aten.amax.default, aten.exp.default, aten.sum.dim_IntList, aten.reciprocal.default):
        assert targets[t] == 2
    assert targets[aten.sub.Tensor] == 2
    reduced = {aten.amax.default: (2, 5, 1), aten.sum.dim_IntList: (2, 5, 1)}
    for n in ep.graph.nodes:  # later passes read shapes from meta["val"]
        if n.target in reduced and n.args[1] == [-1]:
            assert tuple(n.meta["val"].shape) == reduced[n.target]
        elif n.op == "call_function":
            assert isinstance(n.meta["val"], torch.Tensor)
    g = torch.Generator().manual_seed(1234)
    for _ in range(4):  # held-out inputs, with large logits for the max subtraction to matter
        h = torch.randn(2, 5, 7, generator=g) * 30
        torch.testing.assert_close(ep.module()(h), _TwoSoftmaxes()(h), rtol=1e-5, atol=1e-6)


def test_integer_softmax_dtype_is_left_alone() -> None:
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x, dim=-1, dtype=torch.float64)

    ep = torch.export.export(M(), (torch.randn(3, 4),))
    assert decompose_softmax(ep) == 0
