"""Accumulator outputs: program outputs that leave an integer delegate unrequantised
(docs/DESIGN.md, "Accumulator outputs").

An INT8 convolution or linear sums products into an int32 accumulator at scale
``s_in * s_w`` and requantises it to INT8 codes with a RESCALE. When the only
reader of its result is the program output, the CPU decodes those codes to
FP32 straight away, so the RESCALE only rounds the result to 256 levels before
the decode. Decoding the accumulator itself drops that operator and that
rounding; the output crosses the delegate boundary at 4 bytes per element (as
wide as the FP32 tensor the decode writes) instead of 1.
"""

from __future__ import annotations

from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import OUTPUT_OP, PortGraph
from codec_tosa.placement.plan import Plan
from codec_tosa.placement.semantics import WEIGHT, Semantics


def mark_accumulator_outputs(graph: PortGraph, sem: Semantics, plan: Plan, table: CommutationTable) -> None:
    """Mark the domains whose one tensor is an accumulating operator's result read only by
    the program output (`Domain.accumulator`)."""
    for d in plan.domains:
        if d.in_ports or d.shared or len(d.values) != 1:
            continue
        v = d.values[0]
        op = graph.val_op[v]
        row = table.lookup(graph.op_target[op]) if op >= 0 else None
        if row is None or not row.accumulates or len(graph.op_out[op]) != 1:
            continue
        uses = graph.val_uses[v]
        if not uses or any(graph.in_op[u] != OUTPUT_OP for u in uses):
            continue
        # the accumulator's scale is s_in * s_w: the weight must be encoded
        if not any(sem.in_sem[p] == WEIGHT for p in graph.op_in[op]):
            continue
        d.accumulator = True


__all__ = ["mark_accumulator_outputs"]
