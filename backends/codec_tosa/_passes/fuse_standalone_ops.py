"""Pass: rewrite RMSNorm and rotary-embedding chains into codec_tosa's operators.

Matches the core-ATen chains (pow, mean, add, rsqrt, mul / slice, neg, cat,
mul, add) and replaces each with one call of `codec_tosa.ops.RMS_NORM` or
`ROPE`, which compute bit-identical outputs (docs/DESIGN.md, "Standalone
operators").
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, fx
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.pass_base import CodecPass

from codec_tosa.ops import RMS_NORM, ROPE

aten = torch.ops.aten


# ---------------------------------------------------------------------------
# Pattern matching
# ---------------------------------------------------------------------------

# Export leaves dtype assertions on intermediate values (from ``.to(dtype)``
# calls that were no-ops); they compute nothing and go with the subgraph.
_ASSERT = aten._assert_tensor_metadata.default


@dataclass
class FusionReport:
    """What `FuseStandaloneOpsPass` replaced: names of the new nodes."""

    rms_norm: list[str] = field(default_factory=list)
    rope: list[str] = field(default_factory=list)


def _is(node: object, target: object) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target == target


def _real_users(node: fx.Node) -> list[fx.Node]:
    return [u for u in node.users if not _is(u, _ASSERT)]


def _single_user(node: fx.Node) -> fx.Node | None:
    users = _real_users(node)
    return users[0] if len(users) == 1 else None


def _other_operand(mul: fx.Node, known: fx.Node) -> object | None:
    """For a binary ``mul(a, b)`` that reads ``known``, return the other operand."""
    if len(mul.args) != 2 or mul.kwargs:
        return None
    a, b = mul.args
    if a is known and b is not known:
        return b
    if b is known and a is not known:
        return a
    return None


def _rank(node: object) -> int | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val.dim() if isinstance(val, Tensor) else None


def _last_dim(dim: object, rank: int | None) -> bool:
    return isinstance(dim, int) and rank is not None and dim in (-1, rank - 1)


def _match_rms_norm(rsqrt: fx.Node) -> tuple[fx.Node, dict[str, object], list[fx.Node]] | None:
    """Match ``w * (x * rsqrt(mean(pow(x, 2), [-1], keepdim) + eps))`` at its rsqrt.

    Returns (node to replace, op arguments, interior nodes) or None.
    """
    add = rsqrt.args[0]
    if not _is(add, aten.add.Tensor) or not isinstance(add.args[1], float) or add.kwargs:
        return None
    mean = add.args[0]
    if not _is(mean, aten.mean.dim) or mean.kwargs.get("dtype") is not None:
        return None
    keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    if keepdim is not True:
        return None
    power = mean.args[0]
    if not _is(power, aten.pow.Tensor_Scalar) or power.args[1] != 2:
        return None
    x = power.args[0]
    dims = mean.args[1]
    if not (isinstance(dims, (list, tuple)) and len(dims) == 1 and _last_dim(dims[0], _rank(x))):
        return None
    norm = _single_user(rsqrt)
    if norm is None or not _is(norm, aten.mul.Tensor) or _other_operand(norm, rsqrt) is not x:
        return None
    scaled = _single_user(norm)
    if scaled is None or not _is(scaled, aten.mul.Tensor):
        return None
    weight = _other_operand(scaled, norm)
    if not isinstance(weight, fx.Node) or _rank(weight) != 1:
        return None
    interior = [power, mean, add, rsqrt, norm]
    if any(_single_user(n) is None for n in interior):
        return None
    return scaled, {"x": x, "weight": weight, "eps": add.args[1]}, interior


def _is_half_slice(node: object, x: fx.Node, first: bool) -> bool:
    """``x[..., :half]`` (first) or ``x[..., half:]`` on the last dimension."""
    if not _is(node, aten.slice.Tensor) or node.args[0] is not x:
        return False
    val = x.meta.get("val")
    if not isinstance(val, Tensor) or not _last_dim(node.args[1], val.dim()):
        return False
    size = val.shape[-1]
    if not isinstance(size, int) or size % 2:
        return False
    start = node.args[2] if len(node.args) > 2 else None
    end = node.args[3] if len(node.args) > 3 else None
    if len(node.args) > 4 and node.args[4] != 1:
        return False
    half = size // 2
    if first:
        return start in (None, 0) and end == half
    return start == half and (end is None or end >= size)


def _match_rope(cat: fx.Node) -> tuple[fx.Node, dict[str, object], list[fx.Node]] | None:
    """Match ``x * cos + cat((-x[..., h:], x[..., :h]), -1) * sin`` at its cat."""
    if len(cat.args) < 1 or not isinstance(cat.args[0], (list, tuple)) or len(cat.args[0]) != 2:
        return None
    neg, low = cat.args[0]
    if not _is(neg, aten.neg.default) or not isinstance(low, fx.Node):
        return None
    high = neg.args[0]
    x = low.args[0] if _is(low, aten.slice.Tensor) else None
    if not isinstance(x, fx.Node):
        return None
    if not (_is_half_slice(low, x, first=True) and _is_half_slice(high, x, first=False)):
        return None
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if not _last_dim(dim, _rank(x)):
        return None
    rotated = _single_user(cat)
    if rotated is None or not _is(rotated, aten.mul.Tensor):
        return None
    sin = _other_operand(rotated, cat)
    total = _single_user(rotated)
    if sin is None or total is None or not _is(total, aten.add.Tensor) or len(total.args) != 2:
        return None
    direct = _other_operand(total, rotated)
    if not _is(direct, aten.mul.Tensor):
        return None
    cos = _other_operand(direct, x)
    if cos is None or total.kwargs.get("alpha", 1) != 1:
        return None
    interior = [low, high, neg, cat, rotated, direct]
    if any(_single_user(n) is None for n in interior):
        return None
    return total, {"x": x, "cos": cos, "sin": sin}, interior


def _replace(
    graph: fx.Graph, old: fx.Node, target: object, args: tuple, interior: list[fx.Node]
) -> fx.Node:
    with graph.inserting_before(old):
        new = graph.call_function(target, args)
    new.meta = dict(old.meta)
    old.replace_all_uses_with(new)
    # Interior nodes go in reverse topological order, each with its asserts.
    for node in [old, *reversed(interior)]:
        for user in list(node.users):
            if _is(user, _ASSERT):
                graph.erase_node(user)
        graph.erase_node(node)
    return new


class FuseStandaloneOpsPass(CodecPass):
    """Replace RMSNorm and RoPE subgraphs of a core-ATen graph in place; `report`
    names the new nodes, `count` is how many.

    Works on a graph whose nodes carry ``meta["val"]``; made with the
    ExportedProgram that owns the graph (after ``run_decompositions()``), it
    also renames replaced outputs in its signature. The custom ops have no
    decomposition, so a later ``run_decompositions()`` keeps them.
    """

    def __init__(self, exported_program: torch.export.ExportedProgram | None = None) -> None:
        super().__init__()
        self.exported_program = exported_program
        self.report = FusionReport()

    def call(self, gm: fx.GraphModule) -> PassResult:
        graph = gm.graph
        report = self.report = FusionReport()
        renamed: list[tuple[str, str]] = []
        for node in list(graph.nodes):
            if node._erased:  # interior of an earlier replacement
                continue
            if _is(node, aten.rsqrt.default):
                match = _match_rms_norm(node)
                if match is not None:
                    old, a, interior = match
                    new = _replace(graph, old, RMS_NORM, (a["x"], a["weight"], a["eps"]), interior)
                    report.rms_norm.append(new.name)
                    renamed.append((old.name, new.name))
            elif _is(node, aten.cat.default):
                match = _match_rope(node)
                if match is not None:
                    old, a, interior = match
                    new = _replace(graph, old, ROPE, (a["x"], a["cos"], a["sin"]), interior)
                    report.rope.append(new.name)
                    renamed.append((old.name, new.name))
        if self.exported_program is not None:
            # The signature names output nodes; a replaced node may be an output.
            for old_name, new_name in renamed:
                self.exported_program.graph_signature.replace_all_uses(old_name, new_name)
        graph.lint()
        gm.recompile()  # always: the caller may rely on fresh code
        self.count = len(report.rms_norm) + len(report.rope)
        return PassResult(gm, self.count > 0)


def drop_dtype_asserts(program: torch.export.ExportedProgram | fx.GraphModule) -> int:
    """Erase unused ``aten._assert_tensor_metadata`` nodes; return how many.

    Export leaves them behind no-op ``.to(dtype)`` calls (transformers' norms
    and softmax); they compute and move nothing and have no tensor value.
    """
    gm = program.graph_module if isinstance(program, torch.export.ExportedProgram) else program
    dropped = 0
    for node in list(gm.graph.nodes):
        if _is(node, _ASSERT) and not node.users:
            gm.graph.erase_node(node)
            dropped += 1
    gm.recompile()
    return dropped


__all__ = ["FusionReport", "FuseStandaloneOpsPass", "drop_dtype_asserts"]
