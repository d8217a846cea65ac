"""Accumulator outputs on hand-built graphs (docs/DESIGN.md, "Accumulator outputs"):
which domains placement marks, and what the traffic model counts for them."""

from __future__ import annotations

from codec_tosa.commutation.table import CommutationTable
from codec_tosa.placement import place
from codec_tosa.traffic import measure

from graphs import G

N = 128  # elements of graphs.SHAPE


def _accumulators(graph, on: bool = True) -> list[str]:
    result = place(graph, CommutationTable.default(), "I", accumulator_outputs=on)
    return sorted(d.dominator for d in result.plan.domains if d.accumulator)


def test_a_convolution_read_only_by_the_output_hands_over_its_accumulator():
    g = G()
    graph = g.output(g.conv("c2", g.relu("r", g.conv("c1", g.input()))))
    assert _accumulators(graph) == ["o(c2)"]
    assert _accumulators(graph, on=False) == []


def test_an_output_read_elsewhere_too_or_through_a_layout_operator_stays_int8():
    g = G()
    y = g.conv("c1", g.input())
    assert _accumulators(g.output(y, g.relu("r", y))) == []  # the relu reads its codes
    g = G()
    assert _accumulators(g.output(g.view("v", g.conv("c1", g.input())))) == []  # the view's domain
    g = G()
    assert _accumulators(g.output(g.relu("r", g.input()))) == []  # nothing accumulates


def test_traffic_counts_the_accumulator_at_four_bytes():
    """The conv writes its output, and the decode reads it, at 4 bytes instead of 1."""
    g = G()
    graph = g.output(g.conv("c2", g.conv("c1", g.input())))
    table = CommutationTable.default()
    wide, narrow = (place(graph, table, "I", accumulator_outputs=on) for on in (True, False))
    t_wide = measure(graph, wide.semantics, wide.plan)
    t_narrow = measure(graph, narrow.semantics, narrow.plan)
    assert t_wide.traffic_bytes - t_narrow.traffic_bytes == 2 * N * (4 - 1)
    assert t_wide.codec_traffic_bytes - t_narrow.codec_traffic_bytes == N * (4 - 1)
    assert t_wide.codec_items == t_narrow.codec_items
