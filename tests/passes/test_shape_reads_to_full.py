"""`ShapeReadsToFullPass`: an operator that reads only its input's shape becomes a `full`."""

from __future__ import annotations

import torch

from codec_tosa._passes.shape_reads_to_full import ShapeReadsToFullPass


def shape_reads_to_full(gm: torch.fx.GraphModule) -> int:
    """Run the pass; how many it rewrote (what `PassResult.modified` says too)."""
    pass_ = ShapeReadsToFullPass()
    assert pass_(gm).modified == (pass_.count > 0)
    return pass_.count


class Likes(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > torch.zeros_like(x), x, torch.ones_like(x)) + torch.full_like(x, 2.5)


def test_like_operators_become_constants_reading_no_input() -> None:
    x = torch.randn(2, 3, 4)
    gm = torch.export.export(Likes(), (x,)).module(check_guards=False)
    assert shape_reads_to_full(gm) == 3
    fulls = [n for n in gm.graph.nodes if n.target is torch.ops.aten.full.default]
    assert len(fulls) == 3 and all(not any(isinstance(a, torch.fx.Node) for a in n.args) for n in fulls)
    assert not [n for n in gm.graph.nodes if "like" in str(n.target)]
    held_out = torch.randn(2, 3, 4)
    torch.testing.assert_close(gm(held_out), Likes()(held_out), rtol=0, atol=0)


def test_a_channels_last_input_keeps_its_like_operators() -> None:
    # full() makes a contiguous tensor; the rewrite would change the outputs' layout
    x = torch.randn(1, 3, 4, 4).to(memory_format=torch.channels_last)
    gm = torch.export.export(Likes(), (x,)).module(check_guards=False)
    assert shape_reads_to_full(gm) == 0
    assert len([n for n in gm.graph.nodes if "like" in str(n.target)]) == 3
