"""Codec placement: semantics, domains, dominators, coalescence, and the codec plan."""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Collection

from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import PortGraph
from codec_tosa.placement.domains import (
    COALESCE, LOCAL, NONLOCAL, PLACEMENTS, SHARE, build_domains, check_placement,
)
from codec_tosa.placement.dominators import DominatorError, verify_dominators
from codec_tosa.placement.plan import Codec, Domain, Plan, make_plan
from codec_tosa.placement.semantics import Semantics, resolve

__all__ = [
    "COALESCE", "LOCAL", "NONLOCAL", "PLACEMENTS", "SHARE", "Codec", "Domain", "DominatorError",
    "Placement", "Plan", "Semantics", "place",
]


@dataclass
class Placement:
    semantics: Semantics
    plan: Plan
    placement: str


def place(
    graph: PortGraph,
    table: CommutationTable,
    policy: str,
    placement: str = COALESCE,
    verify: bool = False,
    labels: bool = True,
    fused_transcode: bool = False,
    plain_ops: Collection[int] = (),
    cuts: Collection[int] = (),
) -> Placement:
    """Run the placement algorithm; `verify` also runs the independent dominator check.
    `cuts` are in-ports that get a domain of their own behind a transcode (`build_domains`)."""
    check_placement(placement)
    # The passes allocate millions of small lists on big graphs; the cyclic GC
    # would rescan them over and over (time per node grew 3x from 10^3 to 10^6).
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        sem = resolve(graph, table, policy, plain_ops)
        sets = build_domains(graph, sem, placement, cuts)
        plan = make_plan(graph, sem, sets, labels=labels, fused_transcode=fused_transcode)
    finally:
        if gc_was_on:
            gc.enable()
    if verify:
        verify_dominators(graph, sem, plan, local=placement == LOCAL)
    return Placement(sem, plan, placement)
