"""Pass: attention rows a constant mask masks fully are zeroed explicitly (docs/DESIGN.md, "Integer targets").

PyTorch's ``scaled_dot_product_attention`` gives a query row whose every key is
masked the output 0 (its safe softmax). Arm's annotation pipeline decomposes
that softmax as a plain one and replaces the mask's -inf by a finite -256, so
such a row becomes the mean of the values instead: Arm's INT8 flow (stock's
too) then delegates an attention that is wrong on those rows, 0.77 off eager on
Arm's own masked SDPA tests, and warns that it is only right "when no row is
fully masked at runtime".

Where the mask is a constant, which rows it masks fully is known before
annotation: ``sdpa(q, k, v, mask)`` becomes ``sdpa(q, k, v, mask) * keep`` with
``keep`` a constant of 1 for rows with an unmasked key and 0 for the others.
That is eager's value exactly (x * 1.0 = x), and one integer MUL inside the
delegate, whose 0 and 1 are exact codes. A mask that is a graph input is left
alone: which rows it masks is only known at run time.
"""

from __future__ import annotations

import math

import torch
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.pass_base import CodecPass, calls

_SDPA = torch.ops.aten.scaled_dot_product_attention.default


class ZeroFullyMaskedRowsPass(CodecPass):
    """Every attention whose constant mask masks a row fully, times its rows kept, in place."""

    def call(self, gm: torch.fx.GraphModule) -> PassResult:
        graph = gm.graph
        count = 0
        for node in calls(graph, _SDPA):
            mask_node = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
            if not isinstance(mask_node, torch.fx.Node) or mask_node.op != "get_attr":
                continue
            mask = _attribute(gm, str(mask_node.target))
            out = node.meta.get("val")
            if not isinstance(mask, torch.Tensor) or not isinstance(out, torch.Tensor):
                continue
            keep = rows_attended(mask).to(out.dtype)
            if bool(keep.all()):
                continue
            name = _free_name(gm, f"{node.name}_rows_kept")
            gm.register_buffer(name, keep)
            with graph.inserting_after(node):
                keep_node = graph.get_attr(name)
            with graph.inserting_after(keep_node):
                product = graph.call_function(torch.ops.aten.mul.Tensor, (node, keep_node))
            keep_node.meta["val"] = keep
            product.meta = {**node.meta, "val": out * keep}
            node.replace_all_uses_with(product, delete_user_cb=lambda user: user is not product)
            count += 1
        return self.done(gm, count)


def rows_attended(mask: torch.Tensor) -> torch.Tensor:
    """True for each query row of an SDPA mask (bool: True attends; additive: -inf
    masks) that attends at least one key, keeping the key axis as 1."""
    attended = mask if mask.dtype == torch.bool else mask != -math.inf
    return attended.any(dim=-1, keepdim=True)


def _attribute(gm: torch.fx.GraphModule, target: str) -> object:
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part, None)
    return value


def _free_name(gm: torch.fx.GraphModule, base: str) -> str:
    name, k = base, 0
    while hasattr(gm, name):
        k += 1
        name = f"{base}_{k}"
    return name
