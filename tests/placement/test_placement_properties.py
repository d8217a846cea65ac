"""Property tests on random DAGs (docs/DESIGN.md, "Placement": every domain has an absolute dominator,
or a set of dominators cutting it under shared coalescence; traffic ordered by placement)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from codec_tosa import analyze
from codec_tosa.placement import COALESCE, LOCAL, NONLOCAL, SHARE
from codec_tosa.placement.semantics import CODE

from random_graphs import random_dag

graphs = st.builds(
    lambda seed, n, fanin: random_dag(random.Random(seed), n, fanin=fanin),
    st.integers(0, 2**32 - 1), st.integers(1, 60), st.integers(2, 4),
)


@settings(max_examples=60, deadline=None)
@given(graphs, st.sampled_from("ZYXWVI"))
def test_every_domain_has_an_absolute_dominator(g, policy):
    for placement in (LOCAL, NONLOCAL, COALESCE, SHARE):
        analyze(g, policy, placement, verify=True)  # raises DominatorError otherwise


@settings(max_examples=60, deadline=None)
@given(graphs, st.sampled_from("YXW"), st.booleans())
def test_traffic_order(g, policy, fused):
    t = {pl: analyze(g, policy, pl, fused).traffic for pl in (LOCAL, NONLOCAL, COALESCE, SHARE)}
    assert t[SHARE].traffic_bytes <= t[COALESCE].traffic_bytes <= t[NONLOCAL].traffic_bytes \
        <= t[LOCAL].traffic_bytes
    # the placements differ only in codecs
    assert t[SHARE].lower_bound_bytes == t[COALESCE].lower_bound_bytes \
        == t[NONLOCAL].lower_bound_bytes == t[LOCAL].lower_bound_bytes


@settings(max_examples=40, deadline=None)
@given(graphs)
def test_policy_z_has_no_codecs(g):
    for placement in (LOCAL, NONLOCAL, COALESCE, SHARE):
        a = analyze(g, "Z", placement)
        assert a.codecs == [] and a.domains == []
        assert a.traffic.traffic_bytes == a.traffic.lower_bound_bytes


@settings(max_examples=60, deadline=None)
@given(graphs, st.sampled_from("YXWI"), st.sampled_from([NONLOCAL, COALESCE, SHARE]))
def test_every_encoded_use_has_exactly_one_code_path(g, policy, placement):
    a = analyze(g, policy, placement)
    sem, plan = a.result.semantics, a.result.plan
    feeds: dict[int, int] = {}
    for c in a.codecs:
        if c.kind != "decode":
            for u in c.uses:
                feeds[u] = feeds.get(u, 0) + 1
    for u in range(g.num_in_ports):
        if sem.in_sem[u] != CODE:
            continue
        x = g.in_value[u]
        direct = plan.value_domain[x] == plan.in_domain[u]
        # either codes flow straight from the producer, or exactly one codec writes them
        assert direct + feeds.get(u, 0) == 1, g.in_port_label(u)
        if direct:
            assert feeds.get(u, 0) == 0
    # no value is decoded and re-encoded into its own domain
    for c in a.codecs:
        if c.kind == "transcode":
            assert c.source != c.domain
