"""Accounting rules (accounting.py) and SDPA kept whole in the analysis export."""

from __future__ import annotations

import torch

from codec_tosa import analyze
from codec_tosa.planning.accounting import OURS, PAPER, account, was_inplace
from codec_tosa.planning.analysis import port_graph


class _ConvBlock(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 1)
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.conv(x))
        y += x  # add_ in the exported training IR
        return torch.relu(y).view(1, -1).transpose(0, 1)


class _Attention(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _graph(model: torch.nn.Module, *inputs: torch.Tensor):  # type: ignore[no-untyped-def]
    return port_graph(torch.export.export(model.eval(), inputs))


def test_inplace_provenance_marks_relu_and_add_but_not_the_functional_relu() -> None:
    g = _graph(_ConvBlock(), torch.randn(1, 4, 2, 2))
    marked = {g.op_target[op] for op in range(g.num_ops) if was_inplace(g, op)}
    assert marked == {"aten.relu.default", "aten.add.Tensor"}
    assert sum(was_inplace(g, op) for op in range(g.num_ops)) == 2  # torch.relu stays charged


def test_paper_accounting_drops_views_and_inplace_ops_and_keeps_codecs() -> None:
    g = _graph(_ConvBlock(), torch.randn(1, 4, 2, 2))
    for policy in ("Z", "Y", "W"):
        ours, paper = analyze(g, policy=policy), account(analyze(g, policy=policy), PAPER)
        free = {g.op_name[op] for op in PAPER.free_ops(g)}
        charged = sum(r.total for r in ours.per_op if r.node in free and not r.target.startswith("codec."))
        assert paper.traffic.traffic_bytes == ours.traffic.traffic_bytes - charged
        assert paper.traffic.codec_traffic_bytes == ours.traffic.codec_traffic_bytes
        assert paper.codec_items_m == ours.codec_items_m
    assert account(ours, OURS) is ours


def test_sdpa_is_one_operator_encoded_at_y_and_plain_at_z() -> None:
    g = _graph(_Attention(), *(torch.randn(1, 2, 8, 4) for _ in range(3)))
    assert [g.op_target[op] for op in range(g.num_ops)] == ["aten.scaled_dot_product_attention.default"]
    assert analyze(g, policy="Z").codec_items_m == 0
    # three inputs encoded, one output decoded
    assert analyze(g, policy="Y").codec_counts() == {"encode": 3, "decode": 1, "transcode": 0}
