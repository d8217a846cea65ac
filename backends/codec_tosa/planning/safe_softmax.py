"""Whether a program's SDPA safe-softmax guards can ever fire (docs/DESIGN.md, "Arm integration").

ExecuTorch's edge decomposition of ``scaled_dot_product_attention`` gives its
softmax torch's guard for query rows whose every score is -inf: an EQUAL
against -inf, two NOTs, an ANY and a SELECT of zeros, all on the whole score
tensor (12 x 1024 x 1024 per SigLIP layer). Arm lowers it as it is unless its
pass pipeline is told `SDPASafeSoftmaxGuardPolicy.REMOVE`, which it leaves to
whoever can prove that no row is fully masked.

A row's scores are all -inf only where the mask masks all of its keys (q.k is
finite for finite inputs). So the guard never fires when every attention has
no mask, a causal mask (each row attends its first key), or a mask that is a
constant, computed from nothing the user feeds, in which every row attends a
key. A mask computed from a graph input (a decode step's cache position) is
only known at run time: then the guards stay.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx.node import map_arg

from codec_tosa._passes.fully_masked_rows import rows_attended

_SDPA = torch.ops.aten.scaled_dot_product_attention.default
_SAFE_SOFTMAX = torch.ops.aten._safe_softmax.default


def guards_never_fire(ep: ExportedProgram) -> bool:
    """True when `ep` (before edge decomposition) has an attention and none of its
    safe-softmax guards can fire; False when there is none or one might."""
    attentions = [n for n in ep.graph.nodes if n.op == "call_function" and n.target == _SDPA]
    if not attentions or any(n.op == "call_function" and n.target == _SAFE_SOFTMAX for n in ep.graph.nodes):
        return False  # a _safe_softmax of the user's own: no mask to read its rows from
    return all(_no_row_fully_masked(ep, node) for node in attentions)


def _no_row_fully_masked(ep: ExportedProgram, sdpa: torch.fx.Node) -> bool:
    mask = sdpa.args[3] if len(sdpa.args) > 3 else sdpa.kwargs.get("attn_mask")
    if mask is None:
        return True  # no mask, or a causal one: every row attends a key
    value = constant_value(ep, mask) if isinstance(mask, torch.fx.Node) else None
    return isinstance(value, torch.Tensor) and bool(rows_attended(value).all())


def constant_value(ep: ExportedProgram, node: torch.fx.Node) -> Any:
    """`node`'s value when it depends on no user input (parameters, buffers, lifted
    constants and the operators on them, such as a mask built from `arange`),
    computed eagerly; None when it reads a user input or cannot be computed."""
    sig = ep.graph_signature
    held = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    needed: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n in needed:
            continue
        if n.op == "placeholder" and n.name not in held:
            return None  # a user input
        if n.op not in ("placeholder", "call_function"):
            return None
        needed.add(n)
        stack.extend(n.all_input_nodes)
    values: dict[torch.fx.Node, Any] = {}
    try:
        for n in ep.graph.nodes:  # in graph order: inputs before their users
            if n not in needed:
                continue
            if n.op == "placeholder":
                name = held[n.name]
                values[n] = ep.state_dict[name] if name in ep.state_dict else ep.constants[name]
            else:
                args, kwargs = map_arg((n.args, n.kwargs), values.__getitem__)
                values[n] = n.target(*args, **kwargs)
    except Exception:  # an operator that will not run eagerly here: not proven
        return None
    return values[node]
