"""``precision="auto"`` and ``weights="auto"``: the least cost whose accuracy meets the
budget (docs/DESIGN.md, "Precision per domain"). The cost is traffic bytes, and on an
Ethos-U target Vela's cycles for the domains' widths.

The search runs on the calibrated PT2E module, before convert_pt2e: every
observer of it becomes the fake quantisation of its theta at its width
(`observers.DomainObserver.fake`, `observers.WeightObserver.fake`), so one forward
pass evaluates one width assignment, with no re-export and no lowering.

It starts from the cheapest assignment the spec allows: every searched domain
INT8, every searched weight INT4 where it may be (`precision.int4_weights`). A
*move* makes it wider: one int16 group (`precision.Groups`) at INT16, or one weight
at INT8. A move's cost is the bytes it adds per inference in the traffic model
(an INT16 domain moves each of its code elements in two bytes, not one, and a
split_chains cut between two widths is a transcode that reads one and writes the
other: `traffic.CodeBytes`; a weight at INT8 is half a byte more per element;
an INT16 group also takes the INT4 weights it feeds back to INT8, as TOSA has no
int16 x int4 convolution).

On an Ethos-U target a group is priced by what Vela says it costs instead: the
cycles of the model lowered with that group alone at INT16, less those of all-INT8
(`vela_cost`; one lowering per group, plus the base and the chosen widths). Bytes
break ties. Per byte, Ethos-U's price of a group varies several times over, since
int16 MACs run at half rate and an INT16 convolution no longer fuses its RESCALE.
Weights stay priced in bytes: INT4 weights cut Vela's encoded weights and leave
U85's cycles as they are (docs/results/precision.md, "INT4 weights"). A group Vela
refuses at INT16 (MobileNetV2 on U55-128) stays INT8 and is not searched.

The steps:

1. the domains, with every searched weight INT8: the score of all-INT8 domains
   (SQNR in dB of the worst output against the FP32 module on the calibration
   data, or the user's metric); if it meets the budget, no domain is INT16.
   Otherwise each int16 group alone at INT16: its noise reduction per byte (per
   cycle) it adds; groups in that order, best first, the shortest prefix that meets the
   budget (a binary search over prefix lengths, as a wider code never adds noise
   to first order), then each group of that prefix undone again, last first,
   while the budget still holds;
2. the weights, on top of those widths: each searched weight at INT4, the most
   bytes first, kept where the budget still holds. The domains come first because
   INT4 weights cost far more accuracy than INT8 domains do (ResNet-8 with every
   weight INT4: 20.7 dB against 38.3; docs/results/precision.md): measured from an
   all-INT4 floor, the domains' gains are lost in the weights' noise.

That is at most G + log2(G) + G + W forward passes for G groups and W weights (an
assignment scored once is not scored again). A budget that every move together
does not meet gives every move, and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch

from codec_tosa.placement.unionfind import UnionFind
from codec_tosa.planning.traffic import CodeBytes
from codec_tosa.pytrees import tensor_leaves
from codec_tosa.quantizer.annotation import Calibrated
from codec_tosa.quantizer.observers import FakeQuantising
from codec_tosa.quantizer.precision import (
    BITS4,
    BITS8,
    BITS16,
    DomainPrecision,
    WeightPrecision,
    assign,
    kept_int8,
    undone_cuts,
    weight_bits,
)
from codec_tosa.spec import AUTO, INT4
from codec_tosa.targets import target_of
from codec_tosa.targets.ethosu.vela_cost import VelaCycles

Metric = Callable[[list[torch.Tensor], list[torch.Tensor]], float]
# bytes a weight element adds at INT8 over INT4
WEIGHT_BYTES_PER_ELEMENT = (BITS8 - BITS4) / 8
# an Ethos-U search prices its groups in Vela cycles only if the lowerings that takes
# (timed on the first) fit in this; otherwise in bytes, and the result says so
PRICING_SECONDS = 480.0


@dataclass
class SearchResult:
    """What the search chose and measured (report.json's ``precision``)."""

    precisions: list[DomainPrecision]
    weights: list[WeightPrecision]
    budget: float
    metric: str  # "sqnr_db" or the user metric's name
    floor_score: float  # the cheapest assignment's (no move)
    ceiling_score: float  # every move's
    score: float  # of the chosen widths, on the calibration data (fake quantisation)
    extra_bytes: int  # traffic the chosen moves add over the cheapest assignment
    all_extra_bytes: int  # what every move would add
    evaluations: int  # forward passes of the calibrated module
    met: bool
    # on an Ethos-U target the groups are priced in Vela's cycles (`vela_cost`): the
    # target, Vela's cycles of the chosen widths and of all-INT8 domains (weights as
    # chosen), and the lowerings that took; None elsewhere, or where no group was priced
    vela_target: str | None = None
    cycles: int | None = None
    int8_cycles: int | None = None
    lowerings: int = 0
    lowering_seconds: float = 0.0
    priced_in_bytes: str = ""  # on Ethos-U: why the groups were priced in bytes after all
    refused_groups: int = 0  # on Ethos-U: groups left INT8 because Vela refuses them at INT16
    # at split_chains: which of the two searches gave the widths, and why (`search`)
    chains: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "metric": self.metric, "met": self.met,
                "floor_score": self.floor_score, "ceiling_score": self.ceiling_score, "score": self.score,
                "extra_bytes": self.extra_bytes, "all_extra_bytes": self.all_extra_bytes,
                "evaluations": self.evaluations, "vela_target": self.vela_target, "cycles": self.cycles,
                "int8_cycles": self.int8_cycles, "lowerings": self.lowerings,
                "lowering_seconds": round(self.lowering_seconds, 1), "priced_in_bytes": self.priced_in_bytes,
                "refused_groups": self.refused_groups, "chains": self.chains,
                "int16_domains": [p.domain for p in self.precisions if p.bits == BITS16],
                "int4_weights": [w.name for w in self.weights if w.bits == BITS4]}


def sqnr_db(reference: list[torch.Tensor], outputs: list[torch.Tensor]) -> float:
    """The worst output's SQNR in dB (each output's signal and noise summed over the data)."""
    worst = math.inf
    for r, o in zip(reference, outputs):
        r, o = r.double(), o.double()
        finite = torch.isfinite(r) & torch.isfinite(o)
        signal = float((r[finite] ** 2).sum())
        noise = float(((r[finite] - o[finite]) ** 2).sum())
        worst = min(worst, math.inf if noise == 0 else 10 * math.log10(max(signal, 1e-300) / noise))
    return worst


class _Space:
    """The widths one set of moves gives, and what they cost (module docstring). With
    `whole_chains`, the groups a split_chains cut separates are one again (each cut's
    domain with its source's), as without the cuts."""

    def __init__(self, quantizer: Calibrated, whole_chains: bool = False) -> None:
        spec, a = quantizer.spec, quantizer.annotation
        self.n = len(a.placement.plan.domains)
        self.groups = list(a.groups.groups) if spec.precision == AUTO else []
        self.stuck: dict[int, str] = {}  # with whole_chains: domains a blocked chain keeps INT8
        if whole_chains:
            self.groups = self._whole(self.groups, a.cuts, a.groups.blocked)
        self.fixed = (None if spec.precision == AUTO else
                      {p.domain: p.bits for p in assign(spec, a.groups, self.n)})
        self.weights = list(a.int4)
        self.weights_searched = spec.weights == AUTO
        self.weights_int4 = spec.weights == INT4
        # a move: ("group", g) or ("weight", k); weights only where INT4 may hold
        self.moves = [("group", g) for g in range(len(self.groups))]
        self.moves += [("weight", k) for k in range(len(self.weights)) if self.weights_searched]
        # a cut moves bytes only where a move gives its two sides two widths (never with whole_chains)
        self.code_bytes = CodeBytes.of(a.graph, a.placement.semantics, a.placement.plan, a.cuts)

    def _whole(self, groups: list[tuple[int, ...]], cuts: Mapping[int, int], blocked: Mapping[int, str]
               ) -> list[tuple[int, ...]]:
        index = {d: k for k, g in enumerate(groups) for d in g}
        uf = UnionFind(len(groups))
        stuck: dict[int, int] = {}  # group -> a blocked domain its chain holds
        for d, src in cuts.items():
            if d in index and src in index:
                uf.union(index[d], index[src])
            elif d in index or src in index:
                stuck[index[d] if d in index else index[src]] = src if d in index else d
        merged: dict[int, list[int]] = {}
        for k, g in enumerate(groups):
            merged.setdefault(uf.find(k), []).extend(g)
        why = {uf.find(k): x for k, x in stuck.items()}
        for root, x in why.items():
            for d in merged.pop(root):
                self.stuck[d] = f"int8: one precision across its chain with domain {x}, which {blocked[x]}"
        return [tuple(sorted(g)) for g in merged.values()]

    def domain_bits(self, moves: frozenset[int]) -> dict[int, int]:
        if self.fixed is not None:
            return dict(self.fixed)
        wide = {d for m in moves if self.moves[m][0] == "group" for d in self.groups[self.moves[m][1]]}
        return {d: BITS16 if d in wide else BITS8 for d in range(self.n)}

    def weight_bits(self, moves: frozenset[int], domains: dict[int, int]) -> dict[int, int]:
        wider = {self.moves[m][1] for m in moves if self.moves[m][0] == "weight"}
        int4 = self.weights_int4 or self.weights_searched
        return {w.op: weight_bits(w, int4 and k not in wider, domains) for k, w in enumerate(self.weights)}

    def cost(self, moves: frozenset[int]) -> int:
        """Bytes per inference over the cheapest assignment."""
        base_d, d = self.domain_bits(frozenset()), self.domain_bits(moves)
        base_w, w = self.weight_bits(frozenset(), base_d), self.weight_bits(moves, d)
        extra = self.code_bytes(d) - self.code_bytes(base_d)
        extra += sum(x.elements * WEIGHT_BYTES_PER_ELEMENT for x in self.weights if w[x.op] > base_w[x.op])
        return int(extra)


def search(quantizer: Calibrated, prepared: torch.fx.GraphModule, data: Sequence[Sequence[Any]]) -> SearchResult:
    """The widths for `quantizer`'s spec (precision or weights auto), on calibrated `prepared`.

    At split_chains the search runs twice: over the split groups, and over the same
    groups with every chain whole again. Per-group prices do not see that two INT16
    neighbours share no transcode, so the split search can spend more than the whole
    one (the trained MobileNet on U85-256: 59,380 cycles against 42,588). The cheaper
    result that meets the budget is kept (Vela's cycles of the chosen widths on
    Ethos-U, else bytes; a tie keeps the chains whole), and says so in `chains`."""
    a = quantizer.annotation
    shared = _Shared(quantizer, prepared, data)
    result = _search(quantizer, prepared, data, _Space(quantizer), shared)
    if a.cuts and quantizer.spec.precision == AUTO:
        split = result
        whole = _search(quantizer, prepared, data, _Space(quantizer, whole_chains=True), shared)
        result = _cheaper(split, whole, shared if shared.vela_cycles() is not None else None)
        other = whole if result is split else split
        result.chains = (f"{'split' if result is split else 'whole'}: {_cost_text(result)} against "
                         f"{_cost_text(other)} with chains {'whole' if result is split else 'split'}")
        result.evaluations = len(shared.scores)
        if shared.vela is not None:
            result.lowerings, result.lowering_seconds = shared.vela.lowerings, shared.vela.seconds
        shared.apply({p.domain: p.bits for p in result.precisions}, {w.op: w.bits for w in result.weights})
    return result


def _cheaper(split: SearchResult, whole: SearchResult, shared: _Shared | None) -> SearchResult:
    """The result that meets the budget, or if both do the cheaper: in Vela's cycles on
    Ethos-U (`shared`; a result priced in bytes is lowered once more for them), else in
    bytes. A tie keeps the chains whole (fewer transcodes)."""
    if split.met != whole.met:
        return split if split.met else whole
    widths = [{p.domain: p.bits for p in r.precisions} for r in (split, whole)]
    if widths[0] == widths[1]:
        return whole
    if shared is not None:
        assert shared.vela is not None
        for r, bits in zip((split, whole), widths):
            if r.cycles is None:
                r.cycles = shared.vela(bits, {w.op: w.bits for w in r.weights})
        if split.cycles is not None and whole.cycles is not None:
            return split if split.cycles < whole.cycles else whole
    return split if split.extra_bytes < whole.extra_bytes else whole


def _cost_text(r: SearchResult) -> str:
    met = "" if r.met else ", budget not met"
    return (f"{r.cycles} cycles" if r.cycles is not None else f"+{r.extra_bytes} bytes") + met


class _Shared:
    """What both searches of a split_chains spec share: the FP32 reference, the scores
    by widths (one forward pass each), Vela's prices by widths, and the observers."""

    def __init__(self, quantizer: Calibrated, prepared: torch.fx.GraphModule, data: Sequence[Sequence[Any]]) -> None:
        a = quantizer.annotation
        fp32 = quantizer.fp32_module()
        with torch.no_grad():
            self.reference = _batched([tensor_leaves(fp32(*x)) for x in data])
        self.observers = {d: quantizer.observer(key) for d, key in a.roots.items()}
        self.weight_observers = {op: quantizer.observer(key) for op, key in a.weight_roots.items()}
        self.cuts: Mapping[int, int] = a.cuts
        # by the widths the moves give (a weight move under an INT16 domain changes
        # nothing): each one forward pass
        self.scores: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
        # the target's own cycles (Vela's on Ethos-U), made at the first price asked
        self.vela: VelaCycles | None = None
        self.target = target_of(quantizer.spec.target)
        self.args = (quantizer, prepared, data[0])

    def vela_cycles(self) -> VelaCycles | None:
        """What prices widths in the target's cycles, or None where they are priced in bytes."""
        if self.vela is None:
            self.vela = self.target.cycle_model(*self.args)
        return self.vela

    def apply(self, domains: Mapping[int, int], weights: Mapping[int, int]) -> None:
        """Give the observers these widths; a cut with one width on both sides is no
        transcode: its ports carry the codes of the domain it reads."""
        for d, obs in self.observers.items():
            obs.bits = domains[d]
        undone = undone_cuts(self.cuts, domains)
        for d in self.cuts:
            self.observers[d].undone_into = self.observers[undone[d]] if d in undone else None
        for op, bits in weights.items():
            self.weight_observers[op].bits = bits


def _search(quantizer: Calibrated, prepared: torch.fx.GraphModule, data: Sequence[Sequence[Any]], space: _Space,
            shared: _Shared) -> SearchResult:
    """One search over `space`'s moves (module docstring)."""
    spec = quantizer.spec
    a = quantizer.annotation
    budget = float(spec.budget)
    metric: Metric = spec.metric or sqnr_db
    reference, scores = shared.reference, shared.scores

    def widths(moves: frozenset[int]) -> tuple[dict[int, int], dict[int, int]]:
        domains = space.domain_bits(moves)
        return domains, space.weight_bits(moves, domains)

    def apply(moves: frozenset[int]) -> None:
        shared.apply(*widths(moves))

    def score(moves: set[int]) -> float:
        domains, weights = widths(frozenset(moves))
        key = (tuple(domains[d] for d in sorted(domains)), tuple(weights[op] for op in sorted(weights)))
        if key not in scores:
            apply(frozenset(moves))
            with torch.no_grad():
                outs = _batched([tensor_leaves(prepared(*x)) for x in data])
            scores[key] = float(metric(reference, outs))
        return scores[key]

    everything = set(range(len(space.moves)))
    cost = [space.cost(frozenset({m})) for m in everything]  # bytes
    groups = [m for m in everything if space.moves[m][0] == "group"]
    weights_wide = {m for m in everything if space.moves[m][0] == "weight"}
    alone: dict[int, float] = {}  # a group move's score alone; a weight's score at INT4
    rank: dict[int, int] = {}
    fake = FakeQuantising(prepared)
    with fake:
        floor, ceiling = score(set()), score(everything)
        low = score(weights_wide)  # every searched weight INT8
    ranked = bool(groups) and low < budget <= ceiling  # step 1 has groups to choose among
    # what ranks a group: its bytes, or on Ethos-U Vela's cycles (lowered outside the
    # fake quantisation: `vela_cost` converts a copy of the calibrated module)
    vela = shared.vela_cycles() if ranked else None
    price = list(cost)
    priced_in_bytes = ""  # why an Ethos-U search fell back to bytes
    spent: tuple[int, float] = (0, 0.0)  # lowerings, and their seconds
    refused: dict[int, str] = {}  # group moves Vela refuses at INT16: why
    if vela is not None:
        int8_widths = widths(frozenset(weights_wide))
        base = vela(*int8_widths)
        if base is None:
            raise ValueError(f"precision search: Vela refuses the model with every domain INT8 on {spec.target}: "
                             f"{vela.refusal(*int8_widths)}")
        if vela.seconds * (len(groups) + 1) > PRICING_SECONDS:
            priced_in_bytes = (f"{len(groups)} groups priced in bytes: pricing them in Vela cycles would take "
                               f"{len(groups) + 1} more lowerings of {vela.seconds:.0f} s")
            spent, vela = (vela.lowerings, vela.seconds), None
        else:
            for m in groups:
                alone_widths = widths(frozenset(weights_wide | {m}))
                cycles_m = vela(*alone_widths)
                if cycles_m is None:
                    refused[m] = vela.refusal(*alone_widths)
                else:
                    price[m] = max(cycles_m - base, 0)
    if refused:  # those groups stay INT8: the rest is searched as if they were not there
        groups = [m for m in groups if m not in refused]
        everything -= set(refused)
        with fake:
            ceiling = score(everything)
    with fake:
        # 1. the domains, with every searched weight INT8
        if low >= budget or not groups:
            chosen = set(weights_wide)
        elif ceiling < budget:
            chosen = set(everything)
        else:
            chosen = weights_wide | _prefix_then_prune(groups, price, cost, low, budget,
                                                       lambda moves: score(moves | weights_wide), alone, rank)
        # 2. each weight at INT4 on top, the most bytes first, while the budget holds
        for m in sorted(weights_wide, key=lambda m: (-cost[m], m)):
            if score(chosen) < budget:
                break
            alone[m] = score(chosen - {m})
            if alone[m] >= budget:
                chosen.discard(m)
        final = score(chosen)
    cycles = int8_cycles = None
    if vela is not None:
        chosen_widths = widths(frozenset(chosen))
        cycles = vela(*chosen_widths)
        if cycles is None:  # each chosen group lowers alone, not all of them together
            raise ValueError(f"precision search: Vela refuses the chosen widths on {spec.target} "
                             f"({vela.refusal(*chosen_widths)}), though it lowers each of "
                             f"their int16 groups alone; try another budget or target")
        int8_cycles = vela(*widths(frozenset(chosen) - frozenset(groups)))
        spent = (vela.lowerings, vela.seconds)
    unit = "" if spec.metric else " dB"

    def why(m: int, wide: str, narrow: str) -> str:
        if space.moves[m][0] == "weight":
            if m not in alone:
                return f"{wide}: the domains' widths alone do not meet the budget"
            if m in chosen:
                return f"{wide}: at {narrow} the score falls to {alone[m]:.1f}{unit} < {budget:g}{unit}"
            return f"{narrow}: the budget holds with it ({alone[m]:.1f}{unit}; {cost[m]} bytes saved)"
        if low >= budget:
            return f"{narrow}: int8 domains meet the budget ({low:.1f}{unit} >= {budget:g}{unit})"
        if m in refused:
            return f"{narrow}: Vela refuses this group at {wide} on {spec.target} ({refused[m]})"
        if ceiling < budget:
            return f"{wide}: the budget is out of reach (every move {ceiling:.1f}{unit} < {budget:g}{unit})"
        verdict = wide if m in chosen else f"{narrow}: the budget holds without it"
        per, adds = ("Vela cycle", f"+{price[m]} cycles, +{cost[m]} bytes") if vela else ("byte", f"+{cost[m]} bytes")
        return (f"{verdict} (rank {rank[m] + 1} of {len(groups)} by noise cut per {per}: alone "
                f"{alone[m]:.1f}{unit}, {adds})")

    domains = space.domain_bits(frozenset(chosen))
    weights = space.weight_bits(frozenset(chosen), domains)
    domain_why: dict[int, str] = {}
    weight_why: dict[int, str] = {}
    for m, (kind, k) in enumerate(space.moves):
        if kind == "group":
            for d in space.groups[k]:
                domain_why[d] = why(m, "int16", "int8")
        else:
            weight_why[space.weights[k].op] = why(m, "int8", "int4")
    fixed = f"precision {spec.precision}"
    precisions = [DomainPrecision(d, domains[d], a.groups.blocked.get(d, space.stuck.get(d, domain_why.get(d, fixed))))
                  for d in range(space.n)]
    weight_precisions = []
    for w in space.weights:
        if domains[w.input_domain] == BITS16 and (space.weights_searched or space.weights_int4):
            text = kept_int8(w)
        else:
            text = weight_why.get(w.op, f"weights {spec.weights}")
        weight_precisions.append(WeightPrecision(w.op, w.name, weights[w.op], text))
    apply(frozenset(chosen))
    return SearchResult(precisions, weight_precisions, budget,
                        getattr(spec.metric, "__name__", "metric") if spec.metric else "sqnr_db",
                        floor, ceiling, final, space.cost(frozenset(chosen)), space.cost(frozenset(everything)),
                        len(scores), final >= budget, spec.target if vela else None, cycles, int8_cycles,
                        *spent, priced_in_bytes, len(refused))


def _prefix_then_prune(moves: list[int], price: list[int], tie: list[int], floor: float, budget: float,
                       score: Callable[[set[int]], float], alone: dict[int, float],
                       rank: dict[int, int]) -> set[int]:
    """Step 1 of the module docstring over `moves`; fills each move's score `alone`
    and its `rank` by noise cut per unit of `price` (bytes or Vela cycles; ties go
    to the cheaper, then the fewer `tie` bytes)."""
    noise_floor = _noise(floor)
    gain: dict[int, float] = {}
    for m in moves:
        alone[m] = score({m})
        gain[m] = max(noise_floor - _noise(alone[m]), 0.0) / max(price[m], 1)
    order = sorted(moves, key=lambda m: (-gain[m], price[m], tie[m], m))
    rank.update({m: k for k, m in enumerate(order)})
    lo, hi = 1, len(order)  # the full order meets the budget (checked by the caller)
    while lo < hi:
        mid = (lo + hi) // 2
        if score(set(order[:mid])) >= budget:
            hi = mid
        else:
            lo = mid + 1
    chosen = set(order[:lo])
    for m in reversed(order[:lo]):  # drop what the budget does not need
        if score(chosen - {m}) >= budget:
            chosen.discard(m)
    return chosen


def _noise(score_db: float) -> float:
    """Relative noise power of an SQNR (a metric that is not in dB orders the same way)."""
    return 10 ** (-score_db / 10) if math.isfinite(score_db) else 0.0


def _batched(runs: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Each output over all runs, as one tensor."""
    return [torch.cat([r[k].detach().reshape(1, -1).float() for r in runs], dim=1) for k in range(len(runs[0]))]


__all__ = ["SearchResult", "search", "sqnr_db"]
