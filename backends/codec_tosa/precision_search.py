"""``precision="auto"``: the least traffic whose accuracy meets the budget (docs/DESIGN.md,
"Precision per domain").

The search runs on the calibrated PT2E module, before convert_pt2e: every
observer of it becomes the fake quantisation of its theta at its domain's width
(`observers.DomainObserver.fake`), so one forward pass evaluates one width
assignment, with no re-export and no lowering. The steps:

1. the score of all-INT8 (the floor: SQNR in dB of the worst output against
   the FP32 module on the calibration data, or the user's metric); if it meets
   the budget, every domain stays INT8;
2. each int16 group (`precision.Groups`) alone at INT16: its noise reduction
   over all-INT8, per byte it adds (`traffic.domain_code_elements`);
3. groups in order of that ratio, best first: the shortest prefix that meets
   the budget (a binary search over prefix lengths, as adding a group never
   adds noise to first order), then each group of that prefix removed again,
   last first, while the budget still holds.

That is at most G + log2(G) + G forward passes for G groups (an assignment
scored once is not scored again). A budget that all-INT16
does not meet gives all-INT16 and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from codec_tosa.observers import DomainObserver, WeightObserver
from codec_tosa.precision import BITS8, BITS16, DomainPrecision
from codec_tosa.pytrees import tensor_leaves
from codec_tosa.traffic import domain_code_elements

Metric = Callable[[list[torch.Tensor], list[torch.Tensor]], float]


@dataclass
class SearchResult:
    """What the search chose and measured (report.json's ``precision``)."""

    precisions: list[DomainPrecision]
    budget: float
    metric: str  # "sqnr_db" or the user metric's name
    int8_score: float
    int16_score: float
    score: float  # of the chosen widths, on the calibration data (fake quantisation)
    extra_bytes: int  # traffic the INT16 domains add over all-INT8
    int16_extra_bytes: int  # what all-INT16 would add
    evaluations: int  # forward passes of the calibrated module
    met: bool

    def to_json(self) -> dict[str, Any]:
        return {"budget": self.budget, "metric": self.metric, "met": self.met,
                "int8_score": self.int8_score, "int16_score": self.int16_score, "score": self.score,
                "extra_bytes": self.extra_bytes, "int16_extra_bytes": self.int16_extra_bytes,
                "evaluations": self.evaluations,
                "int16_domains": [p.domain for p in self.precisions if p.bits == BITS16]}


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


def search(quantizer: Any, prepared: torch.fx.GraphModule, data: Sequence[Sequence[Any]]) -> SearchResult:
    """The widths for `quantizer`'s spec (precision auto), on calibrated `prepared`."""
    spec = quantizer.spec
    a = quantizer._require()
    groups = list(a.groups.groups)
    n = len(a.placement.plan.domains)
    budget = float(spec.budget)
    metric: Metric = spec.metric or sqnr_db
    fp32 = quantizer.fp32_module()
    with torch.no_grad():
        reference = _batched([tensor_leaves(fp32(*x)) for x in data])
    elements = domain_code_elements(a.graph, a.placement.semantics, a.placement.plan)
    cost = [sum(elements[d] for d in g) for g in groups]
    observers = {d: quantizer._observers[key] for d, key in a.roots.items()}
    scores: dict[frozenset[int], float] = {}  # by the set of INT16 groups: each one pass

    def score(int16: set[int]) -> float:
        key = frozenset(int16)
        if key not in scores:
            wide = {d for g in int16 for d in groups[g]}
            for d, obs in observers.items():
                obs.bits = BITS16 if d in wide else BITS8
            with torch.no_grad():
                outs = _batched([tensor_leaves(prepared(*x)) for x in data])
            scores[key] = float(metric(reference, outs))
        return scores[key]

    with _fake(prepared):
        everything = set(range(len(groups)))
        floor, ceiling = score(set()), score(everything)
        alone: dict[int, float] = {}
        rank: dict[int, int] = {}
        if floor >= budget:
            chosen: set[int] = set()
        elif ceiling < budget or not groups:
            chosen = everything
        else:
            chosen = _prefix_then_prune(groups, cost, floor, budget, score, alone, rank)
        final = score(chosen)
    unit = "" if spec.metric else " dB"
    why: dict[int, str] = {}
    for g, members in enumerate(groups):
        if floor >= budget:
            text = f"int8: all-int8 meets the budget ({floor:.1f}{unit} >= {budget:g}{unit})"
        elif ceiling < budget:
            text = f"int16: the budget is out of reach (all-int16 {ceiling:.1f}{unit} < {budget:g}{unit})"
        else:
            verdict = "int16" if g in chosen else "int8: the budget holds without it"
            text = (f"{verdict} (rank {rank[g] + 1} of {len(groups)} by noise cut per byte: alone at int16 "
                    f"{alone[g]:.1f}{unit}, +{cost[g]} bytes)")
        for d in members:
            why[d] = text
    int16 = {d for g in chosen for d in groups[g]}
    precisions = [DomainPrecision(d, BITS16 if d in int16 else BITS8, a.groups.blocked.get(d, why.get(d, "")))
                  for d in range(n)]
    for d, obs in observers.items():
        obs.bits = BITS16 if d in int16 else BITS8
    return SearchResult(precisions, budget, getattr(spec.metric, "__name__", "metric") if spec.metric else "sqnr_db",
                        floor, ceiling, final, sum(cost[g] for g in chosen), sum(cost), len(scores),
                        final >= budget)


def _prefix_then_prune(groups: list[tuple[int, ...]], cost: list[int], floor: float, budget: float,
                       score: Callable[[set[int]], float], alone: dict[int, float],
                       rank: dict[int, int]) -> set[int]:
    """Steps 2 and 3 of the module docstring; fills each group's score `alone` at
    INT16 and its `rank` by noise cut per byte."""
    noise_floor = _noise(floor)
    gain = []
    for g in range(len(groups)):
        alone[g] = score({g})
        gain.append(max(noise_floor - _noise(alone[g]), 0.0) / max(cost[g], 1))
    order = sorted(range(len(groups)), key=lambda g: (-gain[g], cost[g], g))
    rank.update({g: k for k, g in enumerate(order)})
    lo, hi = 1, len(order)  # the full order meets the budget (checked by the caller)
    while lo < hi:
        mid = (lo + hi) // 2
        if score(set(order[:mid])) >= budget:
            hi = mid
        else:
            lo = mid + 1
    chosen = set(order[:lo])
    for g in reversed(order[:lo]):  # drop what the budget does not need
        if score(chosen - {g}) >= budget:
            chosen.discard(g)
    return chosen


def _noise(score_db: float) -> float:
    """Relative noise power of an SQNR (a metric that is not in dB orders the same way)."""
    return 10 ** (-score_db / 10) if math.isfinite(score_db) else 0.0


def _batched(runs: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Each output over all runs, as one tensor."""
    return [torch.cat([r[k].detach().reshape(1, -1).float() for r in runs], dim=1) for k in range(len(runs[0]))]


class _fake:
    """Every observer of `prepared` fake-quantises for the duration (then observes again)."""

    def __init__(self, prepared: torch.fx.GraphModule) -> None:
        self.observers = [m for m in prepared.modules() if isinstance(m, (DomainObserver, WeightObserver))]

    def __enter__(self) -> None:
        for m in self.observers:
            m.fake = True

    def __exit__(self, *_: Any) -> None:
        for m in self.observers:
            m.fake = False


__all__ = ["SearchResult", "search", "sqnr_db"]
