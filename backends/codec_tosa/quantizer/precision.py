"""Precision per domain: which domains may take INT16 codes, and which do (docs/DESIGN.md,
"Precision per domain").

A domain is the unit of precision: one codec per domain, so a domain's codes are
INT8 or INT16 throughout, and a transcode (one RESCALE) sits wherever domains of
two precisions meet, as between any two domains. Two facts bound the choice:

* a domain can be INT16 only if every operator that reads or writes its codes has
  an int16 row in the table (`Row.int16`: Arm lowers it at int16, and the
  simulation reproduces it); the others keep it INT8;
* the coded activation inputs of one operator share a precision: Arm's int16
  lowering of add, sub and mul refuses operands of two widths, and TOSA's
  MATMUL takes two operands of one type;
* a convolution's input and output share a precision unless only the program
  output reads it (`_typed_like_input`).

Domains tied so form one *group*, and a group is INT16 or INT8 as a whole.

A chain of convolutions is therefore one group. With ``split_chains`` the search
may cut it: each convolution's or average pool's coded input that is the only
reader of a value another operator wrote (`chain_cuts`) gets a domain of its own
behind a transcode, tied only to that operator's output. A pool's output has its
input's scale, so a classifier can read INT16 codes from a pool whose input stays
INT8: the pool averages the input's rounding away, not its own output's. Where the
search leaves both sides of a cut one width, the cut is undone
(`CodecQuantizer.choose_precision`), so a transcode stays only where the widths
change.

Weights have a width of their own: INT8, or INT4 (Arm's a8w4) where the row says
Arm lowers it (`Row.int4`: convolutions and linears) and the input domain is
INT8, as TOSA has no int16 x int4 convolution (`int4_weights`, `weight_bits`).

`assign` gives each domain its width for a spec's fixed precision (``int8``,
``int16``, or ``int16_domains`` by hand), `assign_weights` each weight's for a
fixed ``weights``; ``auto`` is `precision_search`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import PortGraph
from codec_tosa.placement import Placement
from codec_tosa.placement.semantics import CODE, WEIGHT
from codec_tosa.placement.unionfind import UnionFind
from codec_tosa.spec import AUTO, INT4, INT8, INT16, CodecSpec

BITS4, BITS8, BITS16 = 4, 8, 16


@dataclass(frozen=True)
class DomainPrecision:
    """One domain's activation width and why it has it (report.json, `codec-tosa report`)."""

    domain: int
    bits: int
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"domain": self.domain, "bits": self.bits, "why": self.why}


@dataclass(frozen=True)
class WeightPrecision:
    """One weight's width and why (report.json, `codec-tosa report`)."""

    op: int  # the operator reading it, in the port graph
    name: str  # that operator's node
    bits: int
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"operator": self.name, "bits": self.bits, "why": self.why}


@dataclass(frozen=True)
class Int4Weight:
    """A weight that may be INT4: its operator, the domain of that operator's coded
    input (INT16 there keeps the weight INT8) and its element count."""

    op: int
    name: str
    input_domain: int
    elements: int


@dataclass(frozen=True)
class Groups:
    """The domains that can be INT16, as groups sharing one precision, and why each
    other domain cannot (the first operator in its way)."""

    groups: tuple[tuple[int, ...], ...]
    blocked: Mapping[int, str]  # domain -> the operator that keeps it INT8

    def group_of(self, domain: int) -> tuple[int, ...] | None:
        return next((g for g in self.groups if domain in g), None)


def int16_groups(graph: PortGraph, placement: Placement, table: CommutationTable) -> Groups:
    """`Groups` of a placed graph (module docstring)."""
    plan, sem = placement.plan, placement.semantics
    n = len(plan.domains)
    blocked: dict[int, str] = {}

    def touch(d: int, op: int) -> None:
        row = table.lookup(graph.op_target[op])
        if (row is None or not row.int16) and d not in blocked:
            blocked[d] = f"{graph.op_name[op]} ({graph.op_target[op]}) has no int16 lowering"

    uf = UnionFind(n)
    for op in range(graph.num_ops):
        coded = []
        for p in graph.op_in[op]:
            d = plan.in_domain[p]
            if d >= 0 and sem.in_sem[p] == CODE:
                touch(d, op)
                coded.append(d)
        for v in graph.op_out[op]:
            d = plan.value_domain[v]
            if d >= 0:
                touch(d, op)
        for d in coded[1:]:
            uf.union(coded[0], d)
        for a, b in _typed_like_input(graph, placement, table, op):
            uf.union(a, b)
    members: dict[int, list[int]] = {}
    for d in range(n):
        members.setdefault(uf.find(d), []).append(d)
    groups: list[tuple[int, ...]] = []
    for ds in members.values():
        stuck = next((d for d in ds if d in blocked), None)
        if stuck is None:
            groups.append(tuple(ds))
            continue
        for d in ds:  # a group is INT16 as a whole or not at all
            blocked.setdefault(d, f"has one precision with domain {stuck}, which {blocked[stuck]}")
    return Groups(tuple(sorted(groups)), blocked)


def _typed_like_input(graph: PortGraph, placement: Placement, table: CommutationTable, op: int
                      ) -> list[tuple[int, int]]:
    """(output domain, input domain) pairs of a convolution that must share a precision.

    Arm's lowering types a convolution's output like its input, whatever the
    output's quantize says, and that type flows on through the convolutions, pools,
    clamps and layout operators after it. An operator that checks or uses it then
    fails: an AVG_POOL2D's zero point of the other width ("requires input
    zero-point dtype"), a TABLE of the wrong size, an int16 convolution after a
    relu's CLAMP accumulating in int32 (an invalid graph the reference model
    rejects), and even the int32 RESCALE in front of an add, when an int16-input
    convolution's INT8 output has a zero point ("TOSA requires input_zp to be zero
    when the input dtype is torch.int16"). So a convolution's input and output
    share one precision unless only the program output reads it (the output
    RESCALE's codes, typed by its quantize). Measured on the reference model
    (tests/test_precision.py); widths then change at the outputs of add, sub and
    mul, which RESCALE from int32."""
    row = table.lookup(graph.op_target[op])
    if row is None or not row.accumulates:
        return []
    plan, sem = placement.plan, placement.semantics
    ins = [plan.in_domain[p] for p in graph.op_in[op] if plan.in_domain[p] >= 0 and sem.in_sem[p] == CODE]
    out: list[tuple[int, int]] = []
    for v in graph.op_out[op]:
        d = plan.value_domain[v]
        if d >= 0 and any(graph.in_op[p] >= 0 for p in graph.val_uses[v]):
            out += [(d, i) for i in ins]
    return out


def chain_cuts(graph: PortGraph, placement: Placement, table: CommutationTable) -> tuple[int, ...]:
    """The in-ports where a chain of convolutions may change width (module docstring):
    the coded input of an accumulating operator with one coded input, whose output
    another operator reads (else its input and output are not tied), or of an
    averaging one (a pool's output is as fine as its input), reading the one use of
    a value an operator wrote, in that value's domain."""
    plan, sem = placement.plan, placement.semantics
    out: list[int] = []
    for op in range(graph.num_ops):
        row = table.lookup(graph.op_target[op])
        if not (row is not None and row.averages) and not _typed_like_input(graph, placement, table, op):
            continue
        coded = [p for p in graph.op_in[op] if sem.in_sem[p] == CODE and plan.in_domain[p] >= 0]
        if len(coded) != 1:
            continue
        p = coded[0]
        x = graph.in_value[p]
        if graph.val_op[x] >= 0 and graph.val_uses[x] == [p] and sem.block_inputs[sem.in_block[p]] == 1 \
                and plan.value_domain[x] == plan.in_domain[p]:
            out.append(p)
    return tuple(out)


def cut_sources(graph: PortGraph, placement: Placement, cuts: tuple[int, ...]) -> dict[int, int]:
    """Each cut port's domain -> the domain of the value it reads (its transcode's source)."""
    plan = placement.plan
    return {plan.in_domain[p]: plan.value_domain[graph.in_value[p]] for p in cuts}


def undone_cuts(cuts: Mapping[int, int], bits: Mapping[int, int]) -> dict[int, int]:
    """The cuts (cut domain -> source domain, `cut_sources`) whose two sides `bits`
    gives one width: no transcode, so the cut is undone into its source's domain."""
    return {d: s for d, s in cuts.items() if bits.get(d, BITS8) == bits.get(s, BITS8)}


def int4_weights(graph: PortGraph, placement: Placement, table: CommutationTable) -> list[Int4Weight]:
    """The weights that may be INT4: those of operators whose row has `int4`, with one
    coded activation input (module docstring)."""
    plan, sem = placement.plan, placement.semantics
    out: list[Int4Weight] = []
    for op in range(graph.num_ops):
        row = table.lookup(graph.op_target[op])
        if row is None or not row.int4:
            continue
        weights = [p for p in graph.op_in[op] if sem.in_sem[p] == WEIGHT]
        coded = [plan.in_domain[p] for p in graph.op_in[op] if sem.in_sem[p] == CODE and plan.in_domain[p] >= 0]
        if len(weights) != 1 or len(coded) != 1:
            continue
        out.append(Int4Weight(op, graph.op_name[op], coded[0], graph.numel(graph.in_value[weights[0]])))
    return out


def weight_bits(weight: Int4Weight, int4: bool, domain_bits: Mapping[int, int]) -> int:
    """A weight's width: INT4 if asked and its input domain is INT8, else INT8."""
    return BITS4 if int4 and domain_bits.get(weight.input_domain, BITS8) == BITS8 else BITS8


def kept_int8(weight: Int4Weight) -> str:
    """Why a weight that may be INT4 is INT8 under an INT16 input domain."""
    return f"int8: its input domain {weight.input_domain} is int16 (TOSA has no int16 x int4 convolution)"


def assign_weights(spec: CodecSpec, weights: list[Int4Weight], domain_bits: Mapping[int, int],
                   asked: Mapping[int, str] | None = None) -> list[WeightPrecision]:
    """Each weight's width for the spec's fixed weight precision (not ``auto``), or, given
    `asked` (operator -> the weights its module selection asks, `module_selection`), each
    operator's own."""
    if spec.weights == AUTO:
        raise ValueError("weights auto: the widths are the search's (precision_search.search)")
    out = []
    for w in weights:
        wanted = spec.weights if asked is None else asked.get(w.op, INT8)
        bits = weight_bits(w, wanted == INT4, domain_bits)
        why = f"weights {wanted}" if bits == BITS4 or wanted != INT4 else kept_int8(w)
        out.append(WeightPrecision(w.op, w.name, bits, why))
    return out


def assign(spec: CodecSpec, groups: Groups, num_domains: int,
           asked: Mapping[int, str] | None = None) -> list[DomainPrecision]:
    """Each domain's width for the spec's fixed precision (not ``auto``: the search's), or,
    given `asked` (domain -> why: the module selections asking it INT16,
    `module_selection`), INT16 exactly where asked, as `int16_domains` asks."""
    if spec.precision == AUTO:
        raise ValueError("precision auto: the widths are the search's (precision_search.search)")
    wanted = set(spec.int16_domains)
    unknown = sorted(d for d in wanted if not 0 <= d < num_domains)
    if unknown:
        raise ValueError(f"int16_domains: no domain {unknown[0]} (the plan has {num_domains}: 0..{num_domains - 1})")
    by_module = {d: why for d, why in (asked or {}).items() if d not in groups.blocked}
    needed = {d for g in groups.groups if (wanted | set(by_module)) & set(g) for d in g}
    out: list[DomainPrecision] = []
    for d in range(num_domains):
        if d in groups.blocked:
            if d in wanted:
                raise ValueError(f"int16_domains: domain {d} cannot be int16: {groups.blocked[d]}")
            out.append(DomainPrecision(d, BITS8, groups.blocked[d]))
        elif spec.precision == INT16 and asked is None:
            out.append(DomainPrecision(d, BITS16, "precision int16"))
        elif d in wanted or d in by_module or d in needed:
            why = "int16_domains" if d in wanted else by_module.get(d)
            shared = "an int16_domains domain" if asked is None else "a domain asked int16"
            out.append(DomainPrecision(d, BITS16, why or f"has one precision with {shared}"))
        else:
            out.append(DomainPrecision(d, BITS8, "precision int8"))
    return out


__all__ = ["BITS16", "BITS4", "BITS8", "DomainPrecision", "Groups", "Int4Weight", "WeightPrecision", "assign",
           "assign_weights", "chain_cuts", "cut_sources", "int16_groups", "int4_weights", "kept_int8", "undone_cuts",
           "weight_bits"]
