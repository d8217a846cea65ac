"""Pass: softmax as amax, sub, exp, sum, reciprocal and mul at integer policies
(docs/DESIGN.md, "Integer targets").

Arm's INT8 flow has no softmax operator: its quantizer decomposes softmax
*before* quantizing (Arm's ``DecomposeSoftmaxPass``, into exactly these six
operators), and its TOSA lowering then takes each piece in INT8: a
``REDUCE_MAX`` on codes, int32 ``SUB``/``MUL``/``REDUCE_SUM`` with RESCALEs,
and the exponential and reciprocal as 256-entry ``TABLE``s. The plan is
written after Arm's hooks, so the softmax must be decomposed here for the
plan to give each piece a domain; otherwise it stays FP32 on the CPU.

``softmax(x) = exp(x - amax(x)) * (1 / sum(exp(x - amax(x))))``, the stable
form: ``x - amax(x) <= 0``, so the exponential's table covers (0, 1].
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

aten = torch.ops.aten
_SOFTMAX = (aten.softmax.int, aten._softmax.default, aten._safe_softmax.default)


def decompose_softmax(ep: ExportedProgram) -> int:
    """Rewrite every float softmax in place; return how many."""
    graph = ep.graph_module.graph
    found = [n for n in graph.nodes if _decomposable(n)]
    for node in found:
        node.replace_all_uses_with(_pieces(graph, node))
        graph.erase_node(node)
    if found:
        ep.graph_module.recompile()
    return len(found)


def _decomposable(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target not in _SOFTMAX:
        return False
    x = node.args[0]
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    out = node.meta.get("val")
    # a softmax that changes dtype (softmax(x, dtype=...)) is left to the CPU
    return isinstance(val, torch.Tensor) and val.is_floating_point() \
        and isinstance(out, torch.Tensor) and out.dtype == val.dtype


def _pieces(graph: torch.fx.Graph, node: torch.fx.Node) -> torch.fx.Node:
    """The six operators before `node`, each with its meta["val"]; returns the last."""
    x, dim = node.args[0], node.args[1]
    assert isinstance(x, torch.fx.Node)

    def call(target: object, args: tuple, val: torch.Tensor) -> torch.fx.Node:
        n = graph.call_function(target, args)  # type: ignore[arg-type]
        n.meta = dict(node.meta)
        n.meta["val"] = val
        return n

    with graph.inserting_before(node):
        v = x.meta["val"]
        mx = call(aten.amax.default, (x, [dim], True), v.amax(dim, keepdim=True))
        shifted = call(aten.sub.Tensor, (x, mx), v - mx.meta["val"])
        e = call(aten.exp.default, (shifted,), shifted.meta["val"].exp())
        s = call(aten.sum.dim_IntList, (e, [dim], True), e.meta["val"].sum(dim, keepdim=True))
        r = call(aten.reciprocal.default, (s,), s.meta["val"].reciprocal())
        return call(aten.mul.Tensor, (e, r), e.meta["val"] * r.meta["val"])
