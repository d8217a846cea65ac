"""FX pass: one CONST_SHAPE node per distinct static shape value per graph.

Arm's passes create a CONST_SHAPE node for every reshape/slice/tile/... shape
they need; identical shapes recur (every RESHAPE to the same shape). The
CONST_SHAPE visitor emits each node under its FX name, and later visitors
refer to that name, so the serializer cannot pool these; deduplicating the FX
nodes before visiting does the same job safely.

Only static values are merged (every element a plain int, in both the node's
argument and its ``meta["val"]``, which is what the visitor serializes). A
CONST_SHAPE node has no tensor inputs, so the first occurrence in graph
order dominates every use of a later duplicate. Each graph is handled on its
own: a control-flow submodule becomes its own TOSA block and cannot see its
parent's tensors.

The op overload is a parameter so this module does not import Arm's dialect;
`codec_tosa.arm.pipeline` supplies it.
"""

from __future__ import annotations

from typing import Any

import torch.fx
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.pass_base import CodecPass, calls


def _static_value(node: torch.fx.Node) -> tuple[int, ...] | None:
    if len(node.args) != 1 or node.kwargs:
        return None
    arg, val = node.args[0], node.meta.get("val")
    if not isinstance(arg, (list, tuple)) or not isinstance(val, (list, tuple)):
        return None
    # bool is an int subclass, but a SymInt or Node is not: those stay.
    if not all(type(x) is int for x in arg) or not all(type(x) is int for x in val):
        return None
    if tuple(arg) != tuple(val):
        return None
    return tuple(val)


class DedupConstShapesPass(CodecPass):
    """Merge identical static CONST_SHAPE nodes of a graph module's own graph;
    `count` is the number of nodes removed.

    Submodules are not visited (Arm lowers each control-flow submodule
    separately; arm_pipeline runs this on each).
    """

    def __init__(self, const_shape_target: Any) -> None:
        super().__init__()
        self.const_shape_target = const_shape_target

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        first: dict[tuple[int, ...], torch.fx.Node] = {}
        removed = 0
        graph = graph_module.graph
        for node in calls(graph, self.const_shape_target):
            value = _static_value(node)
            if value is None:
                continue
            kept = first.setdefault(value, node)
            if kept is node:
                continue
            node.replace_all_uses_with(kept)
            graph.erase_node(node)
            removed += 1
        return self.done(graph_module, removed)
