"""FX pass: drop int32 -> int32 RESCALEs that multiply by exactly 1.

An accumulator output (docs/DESIGN.md, "Accumulator outputs") is a quantize
to int32 at ``s_in`` after a convolution whose weight is read at scale 1;
Arm's RewriteConvPass still follows the convolution with a RESCALE by
``(s_in * 1) / s_in``, exactly 1.0, with both zero points 0. That RESCALE is the identity (TOSA's multiplier 2**30,
shift 30 gives back every int32 value), and Vela turns an int32 -> int32
RESCALE into a separate NPU operator (Arm's FuseConsecutiveRescalesPass notes
it computes zeros), so it goes: its readers read the accumulator.

Runs on the output of Arm's backend pass pipeline, as `const_shape_dedup`.
The op overload is a parameter so this module does not import Arm's dialect;
`codec_tosa.arm_adapter` supplies it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx


def _is_identity(node: torch.fx.Node) -> bool:
    if len(node.args) < 5 or node.kwargs:
        return False
    source, dtype, scales, input_zp, output_zp = node.args[:5]
    if not isinstance(source, torch.fx.Node) or dtype != torch.int32:
        return False
    val = source.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.int32:
        return False
    return input_zp == 0 and output_zp == 0 and all(float(s) == 1.0 for s in scales)


def remove_identity_rescales(graph_module: torch.fx.GraphModule, rescale: Any) -> int:
    """Remove the identity int32 RESCALEs (target `rescale`) of `graph_module` and
    of its control-flow submodules; return how many."""
    removed = 0
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        graph = module.graph
        found = [n for n in graph.nodes if n.op == "call_function" and n.target == rescale and _is_identity(n)]
        for node in found:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
        if found:
            module.recompile()
            removed += len(found)
    return removed


__all__ = ["remove_identity_rescales"]
