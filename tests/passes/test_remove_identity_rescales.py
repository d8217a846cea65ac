"""`_passes/remove_identity_rescales`: only an int32 -> int32 RESCALE by exactly 1
with zero points 0 goes."""

from __future__ import annotations

import torch
import torch.fx

from codec_tosa._passes.remove_identity_rescales import remove_identity_rescales


def rescale(x, dtype, scales, input_zp, output_zp):  # stands in for Arm's tosa.RESCALE
    return x


def _graph(cases: list[tuple[torch.dtype, torch.dtype, list[float], int, int]]) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    outs = []
    for k, (src, dst, scales, izp, ozp) in enumerate(cases):
        x = g.placeholder(f"x{k}")
        x.meta["val"] = torch.zeros(2, dtype=src)
        r = g.call_function(rescale, (x, dst, scales, izp, ozp))
        r.meta["val"] = torch.zeros(2, dtype=dst)
        outs.append(r)
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g)


def test_only_the_identity_goes():
    gm = _graph([
        (torch.int32, torch.int32, [1.0, 1.0], 0, 0),  # identity, per channel
        (torch.int32, torch.int32, [1.0 + 2**-40], 0, 0),  # not exactly 1
        (torch.int32, torch.int8, [1.0], 0, 0),  # narrows: clamps to int8
        (torch.int8, torch.int32, [1.0], 0, 0),  # widens int8 codes
        (torch.int32, torch.int32, [1.0], 0, 3),  # moves the zero point
    ])
    assert remove_identity_rescales(gm, rescale) == 1
    kept = [n for n in gm.graph.nodes if n.target is rescale]
    assert [n.args[0].name for n in kept] == ["x1", "x2", "x3", "x4"]
    assert gm.graph.output_node().args[0][0].name == "x0"
