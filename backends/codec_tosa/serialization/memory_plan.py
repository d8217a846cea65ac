"""Peak activation memory of a TOSA flatbuffer: a liveness-based plan of its
non-constant tensors, made the way ExecuTorch plans a program's own (issue 52).

Each non-constant tensor of a block (a block input, or an operator's output;
not a CONST or CONST_SHAPE output, not a shape-table entry) lives from the
operator that writes it (a block input from before the first operator) to the
last operator that reads it (a block output to after the last one). Two figures:

* `peak_live_bytes`: the most bytes alive at once, over the operators: what no
  plan of these tensors can go below;
* `planned_bytes`: the arena ExecuTorch's own greedy planner
  (`executorch.exir.memory_planning.greedy`, `pick_shared_obj`) would need for
  them, each size rounded up to its 16-byte alignment: tensors in decreasing
  size, each put in the first shared object whose tensors' lifetimes it does not
  meet, else above the overlapping ones in the first object it fits, else in a
  new object; the arena is the objects' sizes summed.

The same two figures *fused* (`fused_peak_live_bytes`, `fused_planned_bytes`):
with elementwise chains run inside the operator that feeds them, as
`tosa_stats`' fused traffic counts them (docs/DESIGN.md, "Fused traffic"), so that
only the tensors that cross a group boundary exist; what a compiler that fuses
epilogues (Vela, a GPU compiler) would keep, e.g. an encode's MUL and CAST run
inside the convolution whose output they encode.

A graph with control flow (other regions' blocks, run by COND_IF / WHILE_LOOP)
is planned per block; the delegate's figure is its main block's plus the largest
other block's, as if that block ran with all of the main block's tensors alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collections import defaultdict
from types import SimpleNamespace

from tosa.TosaGraph import TosaGraph

from codec_tosa.serialization.tosa_stats import CONST_OPS, TensorInfo, blocks, iter_fused_groups

ALIGNMENT = 16  # ExecuTorch's MemoryPlanningPass default


@dataclass(frozen=True)
class Lifetime:
    name: str
    nbytes: int
    first: int  # operator index that writes it (-1: a block input)
    last: int  # operator index that last reads it (len(operators): a block output)


@dataclass
class ActivationPlan:
    """Peak activation memory of one TOSA flatbuffer (the module docstring)."""

    peak_live_bytes: int = 0
    planned_bytes: int = 0
    tensors: int = 0  # non-constant tensors planned
    tensor_bytes: int = 0  # their bytes summed (what a plan without reuse needs)
    # the tensors alive at the peak, largest first: (name, bytes)
    peak_tensors: list[tuple[str, int]] = field(default_factory=list)
    peak_operator: str = ""  # the operator at the peak ("name of its first output")
    # with elementwise chains fused into their producers (module docstring)
    fused_peak_live_bytes: int = 0
    fused_planned_bytes: int = 0
    fused_peak_tensors: list[tuple[str, int]] = field(default_factory=list)

    def to_json(self, top: int = 8) -> dict[str, Any]:
        return {"peak_live_bytes": self.peak_live_bytes, "planned_bytes": self.planned_bytes,
                "tensors": self.tensors, "tensor_bytes": self.tensor_bytes,
                "peak_operator": self.peak_operator,
                "peak_tensors": [[n, b] for n, b in self.peak_tensors[:top]],
                "fused_peak_live_bytes": self.fused_peak_live_bytes,
                "fused_planned_bytes": self.fused_planned_bytes,
                "fused_peak_tensors": [[n, b] for n, b in self.fused_peak_tensors[:top]]}


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def lifetimes(tensors: dict[str, TensorInfo], operators: list[Any], inputs: list[str],
              outputs: list[str]) -> list[Lifetime]:
    """The lifetime of every non-constant tensor of one block, in order of definition."""
    ops = [o for o in operators if o.op not in CONST_OPS]
    constant = {n for o in operators if o.op in CONST_OPS for n in o.outputs}
    first: dict[str, int] = {name: -1 for name in inputs}
    last: dict[str, int] = {name: -1 for name in inputs}
    for i, o in enumerate(ops):
        for name in o.outputs:
            first.setdefault(name, i)
            last.setdefault(name, i)
        for name in o.inputs:
            if name in first:
                last[name] = max(last[name], i)
    for name in outputs:
        if name in last:
            last[name] = len(ops)
    out = []
    for name, start in first.items():
        info = tensors.get(name)
        if name in constant or info is None or info.nbytes is None:
            continue  # a constant, a shape operand, or a dynamic shape (not plannable)
        out.append(Lifetime(name, info.nbytes, start, last[name]))
    return out


def greedy_arena(lives: list[Lifetime]) -> int:
    """The arena ExecuTorch's greedy planner needs for these lifetimes (module docstring)."""
    objects: list[tuple[int, list[tuple[int, Lifetime]]]] = []  # (size, [(offset, lifetime)])

    def meets(a: Lifetime, b: Lifetime) -> bool:
        return not (a.last < b.first or a.first > b.last)

    for life in sorted(lives, key=lambda x: (-_aligned(x.nbytes), x.first, x.name)):
        size = _aligned(life.nbytes)
        if size == 0:
            continue
        placed = False
        for _, allocations in objects:
            if not any(meets(life, other) for _, other in allocations):
                allocations.append((0, life))
                placed = True
                break
        if not placed:
            for object_size, allocations in objects:
                top = max((offset + _aligned(other.nbytes) for offset, other in allocations if meets(life, other)),
                          default=0)
                if top > 0 and top + size <= object_size:
                    allocations.append((top, life))
                    placed = True
                    break
        if not placed:
            objects.append((size, [(0, life)]))
    return sum(size for size, _ in objects)


def _peak(lives: list[Lifetime], n_ops: int) -> tuple[int, int, list[tuple[str, int]]]:
    """(peak live bytes, the operator index at it, the tensors alive there)."""
    delta = [0] * (n_ops + 3)  # index i + 1 for operator i (0: before the first operator)
    for life in lives:
        delta[life.first + 1] += life.nbytes
        delta[life.last + 2] -= life.nbytes
    best, at, live = 0, -1, 0
    for i in range(-1, n_ops + 1):
        live += delta[i + 1]
        if live > best:
            best, at = live, i
    alive = sorted(((life.name, life.nbytes) for life in lives if life.first <= at <= life.last),
                   key=lambda t: (-t[1], t[0]))
    return best, at, alive


def _block_io(buf: bytes) -> list[tuple[list[str], list[str]]]:
    graph = TosaGraph.GetRootAs(bytearray(buf), 0)
    out = []
    for r in range(graph.RegionsLength()):
        region = graph.Regions(r)
        for b in range(region.BlocksLength()):
            block = region.Blocks(b)
            out.append(([block.Inputs(i).decode() for i in range(block.InputsLength())],
                         [block.Outputs(i).decode() for i in range(block.OutputsLength())]))
    return out


def activation_plan(buf: bytes) -> ActivationPlan:
    """The peak activation memory of a (whole) TOSA flatbuffer."""
    groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for g in iter_fused_groups(buf):
        groups[(g.region, g.block)].append(SimpleNamespace(op="GROUP", inputs=g.inputs, outputs=g.outputs))
    plans: list[ActivationPlan] = []
    for (tensors, operators), (inputs, outputs) in zip(blocks(buf), _block_io(buf)):
        lives = lifetimes(tensors, operators, inputs, outputs)
        ops = [o for o in operators if o.op not in CONST_OPS]
        peak, at, alive = _peak(lives, len(ops))
        where = ops[at] if 0 <= at < len(ops) else None
        consts = [o for o in operators if o.op in CONST_OPS]
        key = (operators[0].region, operators[0].block) if operators else ("", "")
        fused_ops = groups.get(key, [])
        fused = lifetimes(tensors, consts + fused_ops, inputs, outputs)
        fused_peak, _, fused_alive = _peak(fused, len(fused_ops))
        plans.append(ActivationPlan(peak, greedy_arena(lives), len(lives), sum(x.nbytes for x in lives), alive,
                                    f"{where.op} {where.outputs[0]}" if where is not None and where.outputs
                                    else ("inputs" if at < 0 else "outputs"),
                                    fused_peak, greedy_arena(fused), fused_alive))
    if not plans:
        return ActivationPlan()
    main, others = plans[0], plans[1:]

    def nested(attribute: str) -> int:
        return max((getattr(p, attribute) for p in others), default=0)

    return ActivationPlan(main.peak_live_bytes + nested("peak_live_bytes"),
                          main.planned_bytes + nested("planned_bytes"),
                          sum(p.tensors for p in plans), sum(p.tensor_bytes for p in plans),
                          main.peak_tensors, main.peak_operator,
                          main.fused_peak_live_bytes + nested("fused_peak_live_bytes"),
                          main.fused_planned_bytes + nested("fused_planned_bytes"), main.fused_peak_tensors)


__all__ = ["ALIGNMENT", "ActivationPlan", "Lifetime", "activation_plan", "greedy_arena", "lifetimes"]
