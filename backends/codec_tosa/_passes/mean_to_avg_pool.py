"""Pass: a spatial mean (global average pooling) as one avg_pool2d (docs/DESIGN.md, "Integer targets").

``mean.dim(x, [-2, -1], keepdim)`` on an NCHW tensor is ``avg_pool2d(x,
kernel=(H, W))``: the same average, bit for bit in FP32 up to summation order.
`CodecQuantizer` rewrites it so before Arm's annotation transforms, which
would otherwise decompose the mean into a sum and a multiplication by 1/N:
in INT8 that is a REDUCE_SUM in int32 between RESCALEs and an int32 MUL,
where TOSA's INT8 ``AVG_POOL2D`` takes the average in one operator at the
input's scale (the `_averaging` row of the commutation table). On
ShuffleNetV2 the sum and product cost Vela 6% of the cycles on U55-128 and
25% on U85-256 (docs/results/ethos_u.md).

``adaptive_avg_pool2d(x, (oh, ow))`` with H, W divisible by oh, ow is the
same avg_pool2d with kernel and stride (H/oh, W/ow); it is rewritten too,
because ExecuTorch's decomposition would otherwise turn the global one into
``mean.dim`` after this pass.
"""

from __future__ import annotations

import torch
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.pass_base import CodecPass

_MEAN = torch.ops.aten.mean.dim
# A kernel covering the whole input has one output at any stride; stride 1 is
# the one Ethos-U takes (Vela refuses AVG_POOL2D strides above 3, and Arm's
# Ethos-U partitioner then leaves the pool on the CPU).
_GLOBAL_STRIDE = [1, 1]
_ADAPTIVE = (torch.ops.aten.adaptive_avg_pool2d.default, torch.ops.aten._adaptive_avg_pool2d.default)


class MeanToAvgPoolPass(CodecPass):
    """Every spatial mean of a 4-D tensor (and divisible adaptive average pool) as one avg_pool2d, in place."""

    def call(self, gm: torch.fx.GraphModule) -> PassResult:
        graph = gm.graph
        count = 0
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target in _ADAPTIVE and _divisible(node):
                count += _adaptive_to_avg_pool(graph, node)
                continue
            if node.op != "call_function" or node.target is not _MEAN or not _spatial(node):
                continue
            x = node.args[0]
            keepdim = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
            n, c, h, w = x.meta["val"].shape
            with graph.inserting_before(node):
                pooled = graph.call_function(torch.ops.aten.avg_pool2d.default, (x, [h, w], _GLOBAL_STRIDE))
                pooled.meta = dict(node.meta)
                pooled.meta["val"] = x.meta["val"].new_empty((n, c, 1, 1))
                out = pooled
                if not keepdim:
                    out = graph.call_function(torch.ops.aten.view.default, (pooled, [n, c]))
                    out.meta = dict(node.meta)
            node.replace_all_uses_with(out)
            graph.erase_node(node)
            count += 1
        return self.done(gm, count)


def _spatial(node: torch.fx.Node) -> bool:
    """A mean over exactly the last two dims of a static 4-D float tensor."""
    x = node.args[0]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if not isinstance(val, torch.Tensor) or val.dim() != 4 or not val.is_floating_point() or dims is None:
        return False
    if node.kwargs.get("dtype") is not None or any(not isinstance(d, int) for d in val.shape):
        return False
    return sorted(d % 4 for d in dims) == [2, 3]


def _divisible(node: torch.fx.Node) -> bool:
    x = node.args[0]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 4 or any(not isinstance(d, int) for d in val.shape):
        return False
    oh, ow = node.args[1]
    return oh > 0 and ow > 0 and val.shape[2] % oh == 0 and val.shape[3] % ow == 0


def _adaptive_to_avg_pool(graph: torch.fx.Graph, node: torch.fx.Node) -> int:
    x = node.args[0]
    h, w = x.meta["val"].shape[2:]
    oh, ow = node.args[1]
    kernel = [h // oh, w // ow]
    stride = _GLOBAL_STRIDE if (oh, ow) == (1, 1) else kernel
    with graph.inserting_before(node):
        pooled = graph.call_function(torch.ops.aten.avg_pool2d.default, (x, kernel, stride))
    pooled.meta = dict(node.meta)
    node.replace_all_uses_with(pooled)
    graph.erase_node(node)
    return 1
