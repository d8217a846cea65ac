"""Pass: ``zeros_like(x)``, ``ones_like(x)``, ``full_like(x, v)`` as ``full(shape, v)`` (docs/DESIGN.md, "Integer targets").

These operators read only the static shape of ``x``. Left as they are, the plan
sees a use of ``x`` and quantizes it for them: where ``x`` has another use in
another domain (``where(x > zeros_like(x), x, y)``, ``masked_fill``'s
decomposition), ``x`` reaches the delegate as one more input. Arm's pipeline
then folds the operator to a constant and drops that placeholder from the
TOSA graph, while the delegate call still passes it: the graph has fewer
inputs than the call and the runtime refuses the program (0x12). As ``full``
the constant has no input at all, which is what Arm's lowering makes of it.
"""

from __future__ import annotations

import torch
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.pass_base import CodecPass, calls

_LIKE = {
    torch.ops.aten.zeros_like.default: 0.0,
    torch.ops.aten.ones_like.default: 1.0,
    torch.ops.aten.full_like.default: None,  # the fill value is the second argument
}


class ShapeReadsToFullPass(CodecPass):
    """Every such operator of a statically shaped, contiguous tensor as a `full`, in place."""

    def call(self, gm: torch.fx.GraphModule) -> PassResult:
        graph = gm.graph
        count = 0
        for node in calls(graph, *_LIKE):
            out = node.meta.get("val")
            if not isinstance(out, torch.Tensor) or not _static_contiguous(out):
                continue
            fill = _LIKE[node.target]
            if fill is None:
                fill = node.args[1] if len(node.args) > 1 else node.kwargs["fill_value"]
            if not isinstance(fill, (int, float, bool)):
                continue
            with graph.inserting_before(node):
                full = graph.call_function(torch.ops.aten.full.default, (list(out.shape), fill),
                                           {"dtype": out.dtype, "device": out.device, "pin_memory": False})
            full.meta = dict(node.meta)
            node.replace_all_uses_with(full)
            graph.erase_node(node)
            count += 1
        return self.done(gm, count)


def _static_contiguous(value: torch.Tensor) -> bool:
    return all(isinstance(d, int) for d in value.shape) and value.is_contiguous()
