"""Precision per domain (issue 25; docs/DESIGN.md, "Precision per domain"): INT16 activation
domains and INT4 weights in Arm's INT flow, bit-exact with the simulation on the reference
model, the rules that keep a domain INT8 (and a weight INT8), and the search under a budget."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

import small_models
from tosa_queries import operator_dtypes
from codec_tosa.codecs.int16 import HEADROOM
from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import PortGraph
from codec_tosa.quantizer.observers import DomainObserver
from codec_tosa.placement import place
from codec_tosa.quantizer import search as precision_search
from codec_tosa.quantizer.precision import BITS4, BITS8, BITS16, chain_cuts, cut_sources, int16_groups
from codec_tosa.validation.rescale import multiplier_and_shift, rescale
from codec_tosa.runtime.executorch_runner import run_pte_recorded
from codec_tosa.runtime.pte import delegate_payload
from codec_tosa.serialization.tosa_stats import iter_constants
from codec_tosa.validation.simulation import simulate
from codec_tosa.spec import CodecSpec
from codec_tosa.targets.ethosu import vela_cost
from codec_tosa.tools.cli import main
from codec_tosa.tools.compiler import compile_module
from codec_tosa.validation.validate import Verdict, validate
from codec_tosa.planning.traffic import CodeBytes, domain_code_elements, measure


def _compile(tmp_path: Path, name: str, samples: int = 6, **spec: object):
    m, x = getattr(small_models, name)()
    out = tmp_path / f"{name}-{'-'.join(f'{k}{v}' for k, v in spec.items())}"
    return compile_module(name, (m, x), CodecSpec(policy="I", **spec), out, progress=False, samples=samples)


@pytest.fixture(scope="module")
def int8_baseline(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Any, Any]]:
    """The all-INT8 compile of a small model and its validation, the baseline of
    several tests, compiled once per module (compiling is deterministic)."""
    cache: dict[str, tuple[Any, Any]] = {}

    def get(name: str) -> tuple[Any, Any]:
        if name not in cache:
            int8 = _compile(tmp_path_factory.mktemp("int8"), name)
            cache[name] = (int8, validate(int8.pte))
        return cache[name]

    return get


def _tosa_dtypes(pte: Path) -> set[str]:
    return {d for _, ins, outs in operator_dtypes(delegate_payload(pte.read_bytes())) for d in ins + outs}


# ---- INT16 everywhere Arm lowers it, exact on the reference model ---------------------

@pytest.mark.parametrize("name", ["int16_block", pytest.param("int16_sequence", marks=pytest.mark.slow),
                                  pytest.param("mobile_block", marks=pytest.mark.slow)])
def test_int16_domains_are_exact_on_the_reference_model(tmp_path, int8_baseline, name):
    """Every int16 row's operator at int16 (conv + int48 accumulator, the widened int32
    path of an add reading a convolution, int16 add/sub/mul shifts, pools, means,
    clamps, layout): the runtime equals the simulation bit for bit on the example and
    held-out inputs, and the SQNR against FP32 is no worse than at INT8."""
    (int8, v8), int16 = int8_baseline(name), _compile(tmp_path, name, precision="int16")
    domains = int16.report["precision"]["domains"]
    assert sum(d["bits"] == BITS16 for d in domains) >= len(domains) - 1, domains
    assert {"INT16", "INT48"} <= _tosa_dtypes(int16.pte)
    assert "INT16" not in _tosa_dtypes(int8.pte)
    v16 = validate(int16.pte)
    assert v16.verdict == Verdict.PASS and v16.ambiguous_codes == 0
    assert all(o.vs_expected_max_abs == 0.0 for o in v16.outputs), [o.vs_expected_max_abs for o in v16.outputs]
    for a, b in zip(v16.outputs, v8.outputs):
        assert a.sqnr_db >= b.sqnr_db - 0.5, (a.sqnr_db, b.sqnr_db)


def _constants(pte: Path) -> dict[str, tuple[str, int, int]]:
    """The delegate's constants: name -> (TOSA type, elements, bytes)."""
    return {c.name: (c.dtype, math.prod(c.shape), len(c.data or b""))
            for c in iter_constants(delegate_payload(pte.read_bytes()))}


@pytest.mark.parametrize("name", ["int16_block", pytest.param("int16_sequence", marks=pytest.mark.slow)])
def test_int4_weights_are_exact_on_the_reference_model(tmp_path, int8_baseline, name):
    """Every int4 row's weight (conv, depthwise, 1x1, conv1d, linear) as a TOSA INT4
    constant, two codes a byte; the runtime equals the simulation bit for bit, and the
    SQNR against FP32 is below INT8 weights' (the codes are coarser) but not lost."""
    (int8, v8), int4 = int8_baseline(name), _compile(tmp_path, name, weights="int4")
    weights = int4.report["precision"]["weights"]
    assert weights and all(w["bits"] == BITS4 for w in weights), weights
    c8, c4 = _constants(int8.pte), _constants(int4.pte)
    # each weight, an INT8 constant at INT8, is an INT4 one of half the bytes (a zero
    # point of one element may be INT4 too)
    packed = {k: v for k, v in c4.items() if v[0] == "INT4" and v[1] > 1}
    assert len(packed) == len(weights) and all(c8[k][0] == "INT8" for k in packed)
    assert all(b == (n + 1) // 2 and c8[k][2] == n for k, (_, n, b) in packed.items()), (packed, c8)
    v4 = validate(int4.pte)
    assert v4.verdict == Verdict.PASS and v4.ambiguous_codes == 0
    assert all(o.vs_expected_max_abs == 0.0 for o in v4.outputs), [o.vs_expected_max_abs for o in v4.outputs]
    for a, b in zip(v4.outputs, v8.outputs):
        assert 10.0 < a.sqnr_db < b.sqnr_db, (a.sqnr_db, b.sqnr_db)


def test_a_weight_read_by_an_int16_domain_stays_int8(tmp_path):
    """TOSA has no int16 x int4 convolution: with one domain at INT16 by hand and weights
    int4, the convolution reading that domain keeps INT8 weights and says why, the others
    are INT4; the mixed artefact is exact on the reference model."""
    m, x = small_models.int16_block()
    graph, placement, groups = _groups(m, x)
    wide = groups.groups[0][0]
    low = compile_module("int16_block", (m, x), CodecSpec(policy="I", int16_domains=(wide,), weights="int4"),
                         tmp_path / "mixed", progress=False, samples=4)
    report = low.report["precision"]
    int16 = {d["domain"] for d in report["domains"] if d["bits"] == BITS16}
    assert wide in int16
    kept = [w for w in report["weights"] if w["bits"] == BITS8]
    assert kept and all("is int16" in w["why"] for w in kept)
    assert any(w["bits"] == BITS4 for w in report["weights"])
    assert "INT16" in _tosa_dtypes(low.pte) and "INT4" in {t for t, _, _ in _constants(low.pte).values()}
    v = validate(low.pte)
    assert v.verdict == Verdict.PASS and all(o.vs_expected_max_abs == 0.0 for o in v.outputs)


def test_vela_encodes_int4_weights_in_fewer_bytes(tmp_path):
    """Ethos-U: Vela 5.2 takes the INT4 constants and encodes them in fewer bytes."""
    # Vela's figures only: no reference stage
    int8 = _compile(tmp_path, "int16_block", samples=0, target="ethos-u85-256")
    int4 = _compile(tmp_path, "int16_block", samples=0, target="ethos-u85-256", weights="int4")
    e8, e4 = int8.report["vela"]["encoded_weight_bytes"], int4.report["vela"]["encoded_weight_bytes"]
    assert 0 < e4 < e8, (e4, e8)
    assert int4.report["vela"]["cpu_ops"] == 0


class _ConvCat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return torch.cat([y, y[:, :2]], 1)


def test_int16_codes_saturate_at_the_type_minimum_inside_the_delegate(tmp_path):
    """Arm's RESCALEs saturate int16 codes at -32768, not at a16w8's quant_min -32767, and a
    cat then moves that code on: an input far beyond the calibrated range gives the
    artefact -32768 codes, and the simulation has them too."""
    torch.manual_seed(0)
    m, x = _ConvCat().eval(), (torch.randn(1, 3, 8, 8),)
    low = compile_module("conv_cat", (m, x), CodecSpec(policy="I", precision="int16"), tmp_path / "c",
                         progress=False, samples=0)
    big = [x[0] * 50]  # far beyond the calibrated range, headroom included
    (out,), _ = run_pte_recorded(low.pte, big)
    (sim,) = simulate(low.planned, big)
    (step,) = low.planned.output_steps([0.0])
    assert float(out.min()) == pytest.approx(-32768 * step, rel=1e-6)
    assert torch.equal(out.reshape(sim.shape), sim)


def test_arm_drops_a_relu_folded_into_an_int16_convolution(monkeypatch, tmp_path):
    """Upstream (executorch 1.5.1): annotated as Arm annotates an INT8 conv + relu (nothing
    quantized between them), Arm's int16 lowering loses the relu: negative outputs.
    CodecQuantizer therefore quantizes between them in an INT16 domain (as Arm's own
    a16w8 annotation does); when this test fails, the fold works upstream."""
    import codec_tosa.quantizer.codec_quantizer as quantizer_module

    class ConvRelu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv(x))

    torch.manual_seed(0)
    m, x = ConvRelu().eval(), (torch.randn(1, 3, 8, 8),)
    ours = compile_module("conv_relu", (m, x), CodecSpec(policy="I", precision="int16"), tmp_path / "ours",
                          progress=False, samples=0)
    assert float(run_pte_recorded(ours.pte, list(x))[0][0].min()) >= 0.0
    # the fold test compares widths with BITS8: pretend int16 is the folded width
    monkeypatch.setattr(quantizer_module, "BITS8", BITS16)
    folded = compile_module("conv_relu", (m, x), CodecSpec(policy="I", precision="int16"), tmp_path / "folded",
                            progress=False, samples=0)
    assert float(run_pte_recorded(folded.pte, list(x))[0][0].min()) < 0.0


# ---- what keeps a domain INT8 ------------------------------------------------------------

class _Branches(nn.Module):
    """Two convolutions added (their outputs share an add's inputs) and a sigmoid (a TABLE,
    no int16 lowering) after a third convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.c(self.a(x) + self.b(x)))


def _groups(module: nn.Module, x: tuple[torch.Tensor, ...]):
    graph = PortGraph.from_program(torch.export.export(module, x))
    table = CommutationTable.default()
    placement = place(graph, table, "I", "nonlocal+share")
    return graph, placement, int16_groups(graph, placement, table)


def test_chain_cuts_give_each_convolution_input_a_domain_behind_a_transcode():
    """The placement with `cuts`: each cut port is a domain of its own, written by one
    transcode from the domain of the value it reads, whose dominator the independent
    dominator check confirms; the chain's one group becomes one per convolution, and
    one for the average pool (whose output is as fine as its input)."""
    m, x = small_models.conv_chain()
    graph, placement, groups = _groups(m, x)
    table = CommutationTable.default()
    cuts = chain_cuts(graph, placement, table)
    readers = sorted(graph.op_target[graph.in_op[p]].split(".")[1] for p in cuts)
    # the chain and the head; 6 of 7 convolutions (the first reads the program input), the pool
    assert len(groups.groups) == 2 and readers == ["adaptive_avg_pool2d"] + ["conv2d"] * 6, readers
    cut = place(graph, table, "I", "nonlocal+share", verify=True, cuts=cuts)
    plan = cut.plan
    assert len(plan.domains) == len(placement.plan.domains) + len(cuts)
    for p in cuts:
        d, src = plan.in_domain[p], plan.value_domain[graph.in_value[p]]
        # a convolution's cut holds its input alone; the pool's, its output's readers too
        pooled = table.lookup(graph.op_target[graph.in_op[p]]).averages
        assert d != src and p in plan.domains[d].in_ports and (pooled or plan.domains[d].in_ports == [p])
        (writer,) = [c for c in plan.codecs if c.domain == d]
        assert writer.kind == "transcode" and writer.source == src and writer.uses == [p]
    assert len(int16_groups(graph, cut, table).groups) == len(cuts) + 2


def test_an_adds_operands_share_a_group_and_a_table_keeps_its_domains_int8():
    graph, placement, groups = _groups(_Branches().eval(), (torch.randn(1, 3, 4, 4),))
    plan = placement.plan
    add = next(op for op in range(graph.num_ops) if graph.op_target[op] == "aten.add.Tensor")
    a, b = (plan.in_domain[p] for p in graph.op_in[add])
    assert a != b and groups.group_of(a) == groups.group_of(b) is not None
    sigmoid = next(op for op in range(graph.num_ops) if graph.op_target[op] == "aten.sigmoid.default")
    (into,) = (plan.in_domain[p] for p in graph.op_in[sigmoid])
    assert "sigmoid" in groups.blocked[into]
    # the convolution feeding the TABLE is typed like its input: its input domain is tied
    # to the blocked one, the add's operands are not
    c = next(op for op in range(graph.num_ops) if graph.op_target[op].startswith("aten.conv")
             and any(plan.value_domain[v] == into for v in graph.op_out[op]))
    c_in = plan.in_domain[graph.op_in[c][0]]
    assert c_in in groups.blocked and f"domain {into}" in groups.blocked[c_in]
    assert a not in groups.blocked


@pytest.mark.parametrize("spec, message", [
    (dict(policy="W", precision="int16"), "policy='I'"),
    (dict(policy="I", precision="int16", target="xnnpack"), "target='tosa' or an Ethos-U"),
    (dict(policy="I", precision="auto"), "needs `budget`"),
    (dict(policy="I", budget=30.0), "needs precision='auto'"),
    (dict(policy="I", precision="int4"), "unknown precision"),
    (dict(policy="I", precision="int16", tosa="TOSA-1.0+INT"), "no int16 extension"),
    (dict(policy="I", precision="int16", int16_domains=(1,)), "by hand on an int8 plan"),
    (dict(policy="I", weights="int2"), "unknown weight precision"),
    (dict(policy="W", weights="int4"), "policy='I'"),
    (dict(policy="I", weights="int4", target="xnnpack"), "target='tosa' or an Ethos-U"),
    (dict(policy="I", weights="auto"), "weights='auto' needs `budget`"),
    (dict(policy="I", weights="int4", budget=30.0), "needs precision='auto' or weights='auto'"),
    (dict(policy="I", weights="int4", tosa="TOSA-1.0+INT"), "no int4 extension"),
    (dict(policy="I", split_chains=True), "split_chains=True .* needs precision='auto'"),
    (dict(policy="I", weights="auto", budget=30.0, split_chains=True), "split_chains=True .* needs precision='auto'"),
])
def test_precision_options_are_refused_in_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as e:
        CodecSpec(**spec)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("spec, python, cli", [
    (dict(policy="I", weights="auto"), "weights='auto' needs `budget`", "--weights auto needs --budget"),
    (dict(policy="I", split_chains=True), "split_chains=True lets", "--split-chains lets"),
    (dict(policy="I", precision="int16", tosa="TOSA-1.0+INT"), "(use tosa='TOSA-1.0+INT+int16'",
     "(use --tosa TOSA-1.0+INT+int16"),
    (dict(policy="W", target="ethos-u55-128"), "target='ethos-u55-128' needs policy='I' (got 'W')",
     "--target ethos-u55-128 needs --policy I (got 'W')"),
])
def test_spec_errors_name_python_arguments_and_the_cli_its_flags(spec, python, cli):
    from codec_tosa.tools.cli import as_flags

    with pytest.raises(ValueError) as e:
        CodecSpec(**spec)
    assert python in str(e.value)
    assert cli in as_flags(str(e.value))


def test_int16_domains_by_hand_name_what_they_cannot_take(tmp_path):
    m, x = _Branches().eval(), (torch.randn(1, 3, 4, 4),)
    _, placement, groups = _groups(m, x)
    blocked = min(groups.blocked)
    with pytest.raises(ValueError, match=f"domain {blocked} cannot be int16") as e:
        compile_module("branches", (m, x), CodecSpec(policy="I", int16_domains=(blocked,)), tmp_path / "x",
                       progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match="no domain 99"):
        compile_module("branches", (m, x), CodecSpec(policy="I", int16_domains=(99,)), tmp_path / "y",
                       progress=False)


def test_the_spec_asks_for_the_int16_extension():
    assert CodecSpec(policy="I").tosa_spec == "TOSA-1.0+INT"
    assert CodecSpec(policy="I", precision="int16").tosa_spec == "TOSA-1.0+INT+int16"
    assert CodecSpec(policy="I", precision="auto", budget=30).tosa_spec == "TOSA-1.0+INT+int16"
    assert CodecSpec(policy="I", weights="int4").tosa_spec == "TOSA-1.0+INT+int4"
    assert CodecSpec(policy="I", precision="auto", weights="auto", budget=30).tosa_spec == "TOSA-1.0+INT+int16+int4"


# ---- the search, in Arm's PT2E flow -------------------------------------------------------

def _prepared(name: str, **spec: object):
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from codec_tosa.quantizer.codec_quantizer import CodecQuantizer

    m, x = getattr(small_models, name)()
    quantizer = CodecQuantizer(CodecSpec(policy="I", **spec))
    prepared = prepare_pt2e(torch.export.export(m, x).module(check_guards=False), quantizer)
    calibration = small_models.calibration(x, 6)
    with torch.no_grad():
        for batch in calibration:
            prepared(*batch)
    return m, x, quantizer, prepared, calibration


def _search(quantizer, prepared, data, budget: float):
    """The search at `budget` on an already calibrated `prepared` (one calibration serves
    several budgets: the search only reads the observers' ranges)."""
    quantizer.spec = dataclasses.replace(quantizer.spec, budget=budget)
    quantizer.choose_precision(prepared, data)
    return quantizer.search_result


def test_the_search_spends_bytes_only_where_the_budget_needs_them():
    """Below all-INT8's score nothing is INT16; above all-INT16's everything is and the
    result says the budget is not met; in between, the budget is met for fewer bytes
    than all-INT16, and a higher budget never costs fewer bytes."""
    _, _, quantizer, prepared, data = _prepared("mobile_block", precision="auto", budget=0.0)
    probe = _search(quantizer, prepared, data, 0.0)
    floor, ceiling = probe.floor_score, probe.ceiling_score
    assert probe.extra_bytes == 0 and probe.met and floor < ceiling
    results = [probe]
    for budget in (floor + 0.25 * (ceiling - floor), floor + 0.75 * (ceiling - floor), ceiling + 10):
        r = _search(quantizer, prepared, data, budget)
        results.append(r)
        if budget > ceiling:
            assert r.extra_bytes == r.all_extra_bytes and not r.met
        else:
            assert r.met and r.score >= budget and 0 < r.extra_bytes < r.all_extra_bytes
        assert all(p.why for p in r.precisions)
        # the widths chosen are the observers' (what convert_pt2e writes)
        assert {p.domain for p in r.precisions if p.bits == BITS16} == \
            {d for d, key in quantizer.annotation.roots.items() if quantizer.observer(key).bits == BITS16}
    costs = [r.extra_bytes for r in results]
    assert costs == sorted(costs)


def test_the_search_chooses_each_weights_width_too():
    """weights auto: the cheapest assignment has every int4-capable weight INT4; a budget
    between it and all-INT8 weights is met with some weights INT4 and for fewer bytes than
    all-INT8; with activations searched too, a weight under an INT16 domain is INT8 and says
    why. The observers hold the widths (what convert_pt2e writes)."""
    _, _, quantizer, prepared, data = _prepared("mobile_block", weights="auto", budget=0.0)
    probe = _search(quantizer, prepared, data, 0.0)
    assert probe.extra_bytes == 0 and all(w.bits == BITS4 for w in probe.weights)
    floor, ceiling = probe.floor_score, probe.ceiling_score
    assert floor < ceiling
    r = _search(quantizer, prepared, data, (floor + ceiling) / 2)
    bits = {w.bits for w in r.weights}
    assert r.met and bits == {BITS4, BITS8} and 0 < r.extra_bytes < r.all_extra_bytes
    assert all(p.bits == BITS8 for p in r.precisions)  # activations are not searched
    a = quantizer.annotation
    assert {w.op: w.bits for w in r.weights} == {op: quantizer.observer(k).bits for op, k in a.weight_roots.items()}
    _, _, both, prepared, data = _prepared("mobile_block", precision="auto", weights="auto", budget=0.0)
    top = _search(both, prepared, data, 1e9)  # out of reach: every move
    assert not top.met and all(w.bits == BITS8 for w in top.weights)
    assert all("is int16" in w.why for w in top.weights
               if top.precisions[next(x.input_domain for x in both.annotation.int4 if x.op == w.op)].bits == BITS16)


def _worst_error(reference, outputs) -> float:
    """A user metric (higher is better): minus the largest absolute error."""
    return -max(float((r - o).abs().max()) for r, o in zip(reference, outputs))


def test_a_user_metric_is_the_budget_when_given():
    _, _, quantizer, prepared, data = _prepared("mobile_block", precision="auto", budget=0.0,
                                                metric=_worst_error)
    probe = _search(quantizer, prepared, data, -1e9)  # any error meets it: all-INT8
    assert probe.metric == "_worst_error" and probe.extra_bytes == 0 and probe.floor_score < probe.ceiling_score < 0
    r = _search(quantizer, prepared, data, (probe.floor_score + probe.ceiling_score) / 2)
    assert r.met and r.score >= r.budget and 0 < r.extra_bytes < r.all_extra_bytes
    assert all("dB" not in p.why for p in r.precisions if p.bits == BITS16)


def test_the_pt2e_flow_with_auto_lowers_with_arms_stock_partitioner_exactly():
    """The README's recipe: prepare, calibrate, choose_precision, convert_pt2e, export,
    Arm's own TOSAPartitioner at TOSA-1.0+INT+int16; the runtime equals the plan's
    simulation bit for bit on held-out inputs."""
    m, x, quantizer, prepared, data = _prepared("int16_block", precision="auto", budget=0.0)
    probe = _search(quantizer, prepared, data, 0.0)
    _search(quantizer, prepared, data, (probe.floor_score + probe.ceiling_score) / 2)
    chosen = quantizer.precisions
    assert {p.bits for p in chosen} == {BITS8, BITS16}
    _lowered_exactly(quantizer, prepared, x)


def _lowered_exactly(quantizer, prepared, x):
    """convert_pt2e, export and Arm's stock TOSAPartitioner at TOSA-1.0+INT+int16, as the
    README's recipe; asserts the runtime equals the plan's simulation bit for bit on
    held-out inputs. Returns the converted module and the planned program."""
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    from codec_tosa.runtime.pte import BACKEND_ID, delegates, with_delegates_replaced

    converted = convert_pt2e(prepared)
    program = torch.export.export(converted, x)
    partitioner = TOSAPartitioner(TosaCompileSpec("TOSA-1.0+INT+int16"))
    pte = bytes(to_edge_transform_and_lower(program, partitioner=[partitioner]).to_executorch().buffer)
    runnable = with_delegates_replaced(pte, {d.index: (BACKEND_ID, d.payload) for d in delegates(pte)})
    planned = quantizer.planned(program, partitioner)
    for seed in (11, 12):
        torch.manual_seed(seed)
        held_out = [torch.randn_like(x[0])]
        got, _ = run_pte_recorded(runnable, held_out)
        for g, s in zip(got, simulate(planned, held_out)):
            assert torch.equal(g.reshape(s.shape), s)
    return converted, planned


def _simulation_is_the_converted_module(converted, planned, x, seed: int, samples: int = 1) -> None:
    """Independent of the plan: the integer program (the plan's simulation, which the
    runtime equals) is the converted PT2E module's, up to rounding, on held-out inputs
    (an undone cut once left its convolution's bias at the cut's scale, and a pool's
    output at the cut's range)."""
    torch.manual_seed(seed)
    for _ in range(samples):
        held_out = (torch.randn_like(x[0]),)
        with torch.no_grad():
            eager = converted(*held_out)
        (simulated,) = simulate(planned, list(held_out))
        assert precision_search.sqnr_db([eager], [simulated.reshape(eager.shape)]) >= 35.0


def _tosa_partitioner(spec: str):
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    return TOSAPartitioner(TosaCompileSpec(spec))


def _quantizes(module: torch.fx.GraphModule) -> list[str]:
    """The dtypes of the quantize nodes of a converted module, in graph order."""
    return [str(n.args[-1]) for n in module.graph.nodes if "quantize_per_tensor" in str(n.target)
            and "dequantize" not in str(n.target)]


@pytest.mark.parametrize("name, fractions, directions", [
    # both directions of a cut, two budgets: slow (make test under 10 minutes); the
    # default run's conv_chain case takes the same path at one budget
    pytest.param("flat_conv_chain", (0.1, 0.8), {(BITS8, BITS16), (BITS16, BITS8)}, marks=pytest.mark.slow),
    ("conv_chain", (0.5,), {(BITS8, BITS16)}),
])
def test_split_chains_lets_a_chain_of_convolutions_change_width_where_it_pays(name, fractions, directions):
    """A plain chain of convolutions is one group; with split_chains each convolution's
    (and average pool's) input may take its own width behind a transcode. At a budget
    the chain's group is needed for, the split search meets it for fewer bytes; the
    transcodes stay only where the widths change (both ways: INT8 into INT16 and back),
    the program lowers with Arm's stock partitioner bit-exact with the plan's
    simulation, and is no worse than all-INT8 against eager on held-out inputs. Behind
    an average pool, the pool's input alone is cut: the classifier reads INT16 codes
    from a pool whose input stays INT8. At a budget all-INT8 meets, nothing is cut:
    the program is the unsplit one."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    m, x, whole, prepared, data = _prepared(name, precision="auto", budget=0.0)
    int8 = convert_pt2e(copy.deepcopy(prepared))  # every domain INT8 until the search runs
    _, _, split, split_prepared, _ = _prepared(name, precision="auto", budget=0.0, split_chains=True)
    assert len(split.int16_groups.groups) >= len(whole.int16_groups.groups) + 6  # one more per convolution
    nothing = _search(split, split_prepared, data, 0.0)
    assert nothing.extra_bytes == 0 and split.annotation.cut_ports == ()
    assert _quantizes(convert_pt2e(split_prepared)) == _quantizes(int8)
    probe = _search(whole, prepared, data, 0.0)
    head_only = _search(whole, prepared, data, (probe.floor_score + probe.ceiling_score) / 2).score
    assert probe.floor_score < head_only < probe.ceiling_score  # the unsplit search's cheapest step up
    torch.manual_seed(5)
    held_out = (torch.randn_like(x[0]),)
    with torch.no_grad():
        reference = m(*held_out)
        int8_sqnr = precision_search.sqnr_db([reference], [int8(*held_out)])
    found = set()
    for fraction in fractions:
        budget = head_only + fraction * (probe.ceiling_score - head_only)
        _, _, whole, prepared, _ = _prepared(name, precision="auto", budget=0.0)
        unsplit = _search(whole, prepared, data, budget)
        _, _, split, prepared, _ = _prepared(name, precision="auto", budget=0.0, split_chains=True)
        r = _search(split, prepared, data, budget)
        assert r.met and unsplit.met and r.extra_bytes < unsplit.extra_bytes, (r.extra_bytes, unsplit.extra_bytes)
        a = split.annotation
        plan = a.placement.plan
        assert a.cut_ports and [p.domain for p in r.precisions] == list(range(len(plan.domains)))
        bits = {p.domain: p.bits for p in r.precisions}
        for port in a.cut_ports:  # a kept cut joins two widths
            here, source = plan.in_domain[port], plan.value_domain[a.graph.in_value[port]]
            assert bits[here] != bits[source]
            found.add((bits[source], bits[here]))
        if name == "conv_chain":
            (port,) = a.cut_ports
            assert a.table.lookup(a.graph.op_target[a.graph.in_op[port]]).averages  # the pool
        converted, planned = _lowered_exactly(split, prepared, x)
        with torch.no_grad():
            assert precision_search.sqnr_db([reference], [converted(*held_out)]) >= int8_sqnr - 0.5
        _simulation_is_the_converted_module(converted, planned, x, seed=5)
    assert found == directions, found


def _vela_cycles(prepared, x, target: str) -> int:
    """Vela's cycles of `prepared` through the user's flow: convert_pt2e, export, Arm's
    EthosUPartitioner (read from Vela's own summary, as benchmarks/precision.py does)."""
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.targets.ethosu.vela_summary import read_vela_summary

    program = torch.export.export(convert_pt2e(prepared), x)
    partitioner = arm_adapter.ethos_u_partitioner(arm_adapter.ethos_u_compile_spec(target))
    with tempfile.TemporaryDirectory() as d, arm_adapter.vela_runs_kept(d) as runs:
        to_edge_transform_and_lower(program, partitioner=[partitioner])
        return sum(int(read_vela_summary(r.directory)["cycles_total"]) for r in runs)


@pytest.mark.slow  # six lowerings with Vela, about 12 s each here
def test_on_ethos_u_the_search_prices_each_group_in_vela_cycles(monkeypatch):
    """At an Ethos-U target the groups are ranked by noise cut per Vela cycle: each
    group's reason gives its cycles, and the cycles the result reports for the chosen
    widths and for all-INT8 domains are Vela's for the programs the user's flow lowers
    (a calibrated copy converted at those widths). Where pricing would take longer than
    the search allows, and at a TOSA target, the groups are priced in bytes, and the
    result says why."""
    target = "ethos-u85-256"
    m, x, quantizer, prepared, data = _prepared("mobile_block", precision="auto", budget=0.0, target=target)
    untouched = copy.deepcopy(prepared)  # calibrated, every domain INT8
    probe = _search(quantizer, prepared, data, 0.0)
    assert probe.lowerings == 0 and probe.cycles is None  # all-INT8 meets it: nothing to price
    r = _search(quantizer, prepared, data, (probe.floor_score + probe.ceiling_score) / 2)
    groups = quantizer.int16_groups.groups
    assert r.met and r.vela_target == target and len(groups) >= 2
    # all-INT8, each group alone, and the chosen widths unless they are one group alone
    assert len(groups) + 1 <= r.lowerings <= len(groups) + 2
    wide = [p for p in r.precisions if p.bits == BITS16]
    assert wide and all("per Vela cycle" in p.why and " cycles, +" in p.why for p in r.precisions
                        if quantizer.int16_groups.group_of(p.domain))
    assert r.int8_cycles == _vela_cycles(untouched, x, target)
    assert r.cycles == _vela_cycles(prepared, x, target) > r.int8_cycles
    assert r.priced_in_bytes == ""
    monkeypatch.setattr(precision_search, "PRICING_SECONDS", 1.0)  # less than one lowering
    _, _, quantizer, prepared, data = _prepared("mobile_block", precision="auto", budget=0.0, target=target)
    hurried = _search(quantizer, prepared, data, r.budget)
    assert hurried.lowerings == 1 and hurried.cycles is None and hurried.met
    assert f"{len(groups)} groups priced in bytes" in hurried.priced_in_bytes
    assert all("per byte" in p.why for p in hurried.precisions if p.bits == BITS16)
    _, _, on_tosa, prepared, data = _prepared("mobile_block", precision="auto", budget=0.0)
    t = _search(on_tosa, prepared, data, (probe.floor_score + probe.ceiling_score) / 2)
    assert t.lowerings == 0 and t.cycles is None and t.priced_in_bytes == ""
    assert all("per byte" in p.why for p in t.precisions if p.bits == BITS16)


def test_an_undone_cut_leaves_the_bias_at_its_inputs_scale():
    """A cut the search undoes (one width on both sides) gives its observer's place back
    to the domain it reads, and so must the convolution's bias, whose int32 codes are at
    input scale x weight scale: here the cut saw one half of a chunk, whose range is far
    narrower than the domain's. The integer program (the plan's simulation, which is
    the runtime's) is then the converted PT2E module's, up to rounding."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    m, x, split, prepared, data = _prepared("chunk_convs", precision="auto", budget=0.0, split_chains=True)
    assert len(split.annotation.cut_ports) >= 1
    r = _search(split, prepared, data, 0.0)  # all-INT8 meets it: every cut undone
    assert r.extra_bytes == 0 and split.annotation.cut_ports == ()
    converted = convert_pt2e(prepared)
    planned = split.planned(torch.export.export(converted, x), _tosa_partitioner("TOSA-1.0+INT"))
    _simulation_is_the_converted_module(converted, planned, x, seed=4, samples=3)


@pytest.mark.slow  # three searches and two exact lowerings; the default run's conv_chain split keeps a pool's cut
def test_an_undone_pool_cut_gives_the_pools_output_its_inputs_codes():
    """A pool's cut domain holds the pool's output too, which PT2E observes under a
    name of its own: undone, that port takes the codes of the domain the cut read
    (at the last pool of two, that is the first pool's cut, kept or undone in turn).
    Every width the search gives here lowers bit-exact with the plan's simulation,
    and the integer program is the converted PT2E module's, up to rounding."""
    _, x, quantizer, prepared, data = _prepared("mobile_block", precision="auto", budget=0.0, split_chains=True)
    a = quantizer.annotation
    pools = [p for p in a.cut_ports if a.table.lookup(a.graph.op_target[a.graph.in_op[p]]).averages]
    assert len(pools) == 2
    probe = _search(quantizer, prepared, data, 0.0)
    kept = set()
    for fraction in (0.8, 2.0):  # the first pool's cut kept, the second undone; every cut undone
        _, _, quantizer, prepared, _ = _prepared("mobile_block", precision="auto", budget=0.0, split_chains=True)
        r = _search(quantizer, prepared, data, probe.floor_score + fraction * (probe.ceiling_score - probe.floor_score))
        kept.add(len(quantizer.annotation.cut_ports))
        assert r.met or fraction > 1
        _simulation_is_the_converted_module(*_lowered_exactly(quantizer, prepared, x), x, seed=6)
    assert kept == {0, 1}, kept


@pytest.mark.slow  # about a dozen small lowerings with Vela
def test_split_chains_on_ethos_u_lowers_both_transcodes_and_keeps_the_cheaper_search():
    """Transcodes INT8 into INT16 and back, at alternate cuts of the chain, go through
    Arm's EthosUPartitioner and Vela. The search runs with chains split and whole and
    keeps the result with fewer Vela cycles, which are those of the program the
    user's flow lowers, and says so in `chains`."""
    from codec_tosa.targets.ethosu.vela_cost import VelaCycles

    target = "ethos-u85-256"
    _, x, split, prepared, data = _prepared("conv_chain", precision="auto", budget=0.0, split_chains=True,
                                            target=target)
    a = split.annotation
    plan = a.placement.plan
    wide = {d for k, port in enumerate(a.cut_ports) if k % 2 == 0  # alternate cuts open an INT16 stretch
            for d in split.int16_groups.group_of(plan.in_domain[port])}
    bits = {d: BITS16 if d in wide else BITS8 for d in range(len(plan.domains))}
    directions = {(bits[plan.value_domain[a.graph.in_value[p]]], bits[plan.in_domain[p]]) for p in a.cut_ports}
    assert directions == {(BITS8, BITS16), (BITS16, BITS8)}, directions
    vela = VelaCycles(split, prepared, x, target)
    int8_cycles = vela({d: BITS8 for d in bits}, {})
    assert vela(bits, {}) > int8_cycles
    probe = _search(split, prepared, data, 1e9)  # every move: the ceiling
    _, _, split, prepared, _ = _prepared("conv_chain", precision="auto", budget=0.0, split_chains=True,
                                         target=target)
    r = _search(split, prepared, data, (probe.floor_score + probe.ceiling_score) / 2)
    kept, other = r.chains.split(":")[0], "whole" if r.chains.startswith("split") else "split"
    assert r.met and kept in ("split", "whole") and f"cycles with chains {other}" in r.chains, r.chains
    assert int(r.chains.split(" against ")[1].split()[0]) >= r.cycles == _vela_cycles(prepared, x, target)
    assert bool(split.annotation.cut_ports) == (kept == "split")


def _vela_refusing(monkeypatch, calls: set[int]) -> None:
    """Arm's Vela call, refusing the given calls (1 = the first) as Vela does on U55-128
    with MobileNetV2's int16 convolutions (docs/results/precision.md); the others compile.
    The count is in shared memory: each candidate is lowered in a child process."""
    import multiprocessing

    from executorch.backends.arm.ethosu import backend as ethosu_backend

    real, made = ethosu_backend.vela_compile, multiprocessing.Value("i", 0)

    def vela_compile(*args, **kwargs):
        with made.get_lock():
            made.value += 1
            call = made.value
        if call in calls:
            raise RuntimeError("Non-passthrough operation (Conv2D) could not run on NPU")
        return real(*args, **kwargs)
    monkeypatch.setattr(ethosu_backend, "vela_compile", vela_compile)


@pytest.mark.slow  # four or five lowerings with Vela, about 12 s each here
def test_a_group_vela_refuses_at_int16_stays_int8_and_says_why(monkeypatch):
    """Where Vela refuses a group alone at INT16 (the second lowering: the first group's
    price), the search leaves that group INT8, names Vela's error in its domains'
    reasons, searches the rest (its ceiling no longer counts the group), and the
    chosen widths lower. Where Vela refuses all-INT8, the search says so in one line."""
    target = "ethos-u85-256"
    _, _, quantizer, prepared, data = _prepared("mobile_block", precision="auto", budget=0.0, target=target)
    probe = _search(quantizer, prepared, data, 0.0)
    groups = quantizer.int16_groups.groups
    assert len(groups) >= 2
    _vela_refusing(monkeypatch, {2})
    r = _search(quantizer, prepared, data, (probe.floor_score + probe.ceiling_score) / 2)
    assert r.refused_groups == 1 and r.cycles is not None and r.vela_target == target
    refused = {p.domain: p for p in r.precisions if p.domain in groups[0]}
    assert refused and all(p.bits == BITS8 for p in refused.values())
    assert all(f"Vela refuses this group at int16 on {target} (Non-passthrough operation (Conv2D)" in p.why
               for p in refused.values())
    assert r.ceiling_score < probe.ceiling_score  # every move but the refused group's
    assert all("Vela refuses" not in p.why for p in r.precisions if p.domain not in groups[0])
    monkeypatch.undo()  # Arm's own call again, counted afresh
    _vela_refusing(monkeypatch, {1})
    _, _, quantizer, prepared, data = _prepared("mobile_block", precision="auto", budget=0.0, target=target)
    with pytest.raises(ValueError, match=f"^precision search: Vela refuses the model with every domain INT8 on "
                                         f"{target}: Non-passthrough operation"):
        _search(quantizer, prepared, data, (probe.floor_score + probe.ceiling_score) / 2)


def test_compile_auto_through_the_cli_and_report(tmp_path, capsys):
    out = tmp_path / "auto"
    model = f"{Path(small_models.__file__)}:mobile_block"
    assert main(["compile", model, "--policy", "I", "--precision", "auto", "--budget", "41dB",
                 "--samples", "2", "-o", str(out)]) == 0
    assert main(["report", str(out / "model.pte")]) == 0
    text = capsys.readouterr().out
    assert "activation precision (auto)" in text and "search: budget 41 dB" in text
    assert main(["compile", model, "--policy", "W", "--precision", "int16", "-o", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--policy I" in err[0]
    assert main(["compile", model, "--policy", "I", "--split-chains", "-o", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs --precision auto" in err[0] and not (tmp_path / "s").exists()


@pytest.mark.slow  # two more compiles with a search; the default run has the activations' through the CLI
def test_compile_auto_weights_and_split_chains_through_the_cli_and_report(tmp_path, capsys):
    model = f"{Path(small_models.__file__)}:mobile_block"
    assert main(["compile", model, "--policy", "I", "--weights", "auto", "--budget", "30dB",
                 "--samples", "2", "-o", str(tmp_path / "w4")]) == 0
    assert main(["report", str(tmp_path / "w4" / "model.pte")]) == 0
    text = capsys.readouterr().out
    assert "weight precision (auto)" in text and "weight of" in text
    chain = f"{Path(small_models.__file__)}:conv_chain"
    assert main(["compile", chain, "--policy", "I", "--precision", "auto", "--split-chains", "--budget", "90dB",
                 "--samples", "2", "-o", str(tmp_path / "chain")]) == 0
    report = json.loads((tmp_path / "chain" / "report.json").read_text())
    assert report["spec"]["split_chains"] is True
    # out of reach: every domain INT16, so no cut joins two widths and none is kept
    assert all(d["bits"] == BITS16 for d in report["precision"]["domains"])
    assert main(["report", str(tmp_path / "chain" / "model.pte")]) == 0
    assert "chains of convolutions (split_chains) kept whole: " in capsys.readouterr().out


# ---- the pieces -----------------------------------------------------------------------------

def test_sixteen_bit_multipliers_match_arm():
    """An int48 accumulator's RESCALE takes 16-bit multipliers, as Arm serialises them."""
    import random

    from executorch.backends.arm.operators.op_tosa_rescale import _compute_multiplier_and_shift

    rng = random.Random(1)
    scales = [2.0 ** rng.uniform(-40, 0.9) for _ in range(2000)] + [1.0, 0.5, 1 - 2**-17, 2.0**-50]
    multipliers, shifts = _compute_multiplier_and_shift(scales, 16)
    assert [multiplier_and_shift(s, 16) for s in scales] == list(zip(multipliers, shifts))
    # (v * m + 2**(shift-1)) >> shift on values an int48 holds, saturated to int16
    v = torch.tensor([2**40, -(2**40), 3, -3])
    assert rescale(v, [2.0**-25], 0, 0, torch.int16, multiplier_bits=16).tolist() == [32767, -32768, 0, 0]


def test_a_sixteen_bit_observer_is_symmetric_over_the_observed_range_with_headroom():
    obs = DomainObserver(observer="histogram", bits=16)
    obs(torch.tensor([-0.5, 3.0, 1.0]))
    t = obs.theta()
    assert (t.zero_point, t.qmin, t.qmax, t.dtype) == (0, -32767, 32767, torch.int16)
    assert math.isclose(t.scale, HEADROOM * 3.0 / 32767)  # headroom for held-out inputs (codecs.int16)
    assert (obs.dtype, obs.quant_min, obs.qscheme) == (torch.int16, -32767, torch.per_tensor_symmetric)
    obs.fake = True
    x = torch.tensor([0.1234567, -4.0])
    assert torch.equal(obs(x), torch.clamp(torch.round(x / t.scale), -32767, 32767) * t.scale)
    obs.bits = 8
    assert obs.theta().dtype == torch.int8 and obs.quant_max == 127


def test_the_traffic_model_counts_each_domains_extra_byte():
    m, x = small_models.mobile_block()
    graph = PortGraph.from_program(torch.export.export(m, x))
    placement = place(graph, CommutationTable.default(), "I", "nonlocal+share")
    sem, plan = placement.semantics, placement.plan
    elements = domain_code_elements(graph, sem, plan)
    n = len(plan.domains)
    base = measure(graph, sem, plan)
    assert measure(graph, sem, plan, widths=[1] * n).traffic_bytes == base.traffic_bytes
    assert measure(graph, sem, plan, widths=[2] * n).traffic_bytes == base.traffic_bytes + sum(elements)
    assert all(e > 0 for e in elements)


def test_a_cut_moves_bytes_only_where_its_two_sides_differ_in_width():
    """At one width everywhere the split plan moves what the unsplit one does (every cut
    undone: no transcode); a cut between INT8 and INT16 adds its RESCALE's read of the
    source's codes and write of its own, beside its domain's wider codes."""
    m, x = small_models.conv_chain()
    graph, placement, _ = _groups(m, x)
    table = CommutationTable.default()
    ports = chain_cuts(graph, placement, table)
    cut = place(graph, table, "I", "nonlocal+share", cuts=ports)
    sem, plan = cut.semantics, cut.plan
    code_bytes = CodeBytes.of(graph, sem, plan, cut_sources(graph, cut, ports))
    unsplit = domain_code_elements(graph, placement.semantics, placement.plan)
    n = len(plan.domains)
    for bits in (BITS8, BITS16):
        assert code_bytes({d: bits for d in range(n)}) == sum(unsplit) * bits // 8
    int8 = {d: BITS8 for d in range(n)}
    for p in ports:
        d, src = plan.in_domain[p], plan.value_domain[graph.in_value[p]]
        moved = graph.numel(graph.in_value[p])
        # the cut's domain: its readers' codes at two bytes, and the transcode's read and write
        assert code_bytes({**int8, d: BITS16}) - code_bytes(int8) == code_bytes.elements[d] + 3 * moved
        assert code_bytes.elements[d] >= moved  # the reader of the cut reads every element


def test_gptq_rounds_on_the_rounding_data_when_given():
    """GPTQ fits the weights to the inputs it rounds on, so a search that scores on those
    inputs scores optimistically; `choose_precision(prepared, data, rounding_data)` rounds
    on `rounding_data` alone: the weights are those a call rounding on it gives, not those
    `data` gives."""
    from codec_tosa.quantizer.observers import WeightObserver

    def inputs(x, seed: int):
        g = torch.Generator().manual_seed(seed)
        return [(torch.randn(x[0].shape, generator=g),) for _ in range(6)]

    def rounded(data_seed: int, rounding_seed: int | None = None) -> list[torch.Tensor]:
        _, x, quantizer, prepared, _ = _prepared("mobile_block", precision="int8", weight_rounding="gptq")
        rounding = None if rounding_seed is None else inputs(x, rounding_seed)
        quantizer.choose_precision(prepared, inputs(x, data_seed), rounding)
        weights = [m.rounded[BITS8] for m in prepared.modules() if isinstance(m, WeightObserver)]
        assert weights
        return weights

    on_a, on_b, searched_a_rounded_b = rounded(1), rounded(2), rounded(1, 2)
    assert all(torch.equal(w, v) for w, v in zip(searched_a_rounded_b, on_b))
    assert not all(torch.equal(w, v) for w, v in zip(on_a, on_b))


@pytest.mark.skipif(not vela_cost._FORKS, reason="candidates are forked on Linux only (macOS's fork is unsafe "
                    "with threads, Windows has none); elsewhere they are lowered in process")
def test_a_candidate_runs_in_a_child_process_whose_changes_stay_there():
    """Each Vela candidate is lowered in a forked child (issue 50: what a lowering
    leaves behind goes with the child): its result comes back, its exception too, of
    its own type and with where it was raised, and what it changed stays in the child."""
    state = {"pid": os.getpid()}

    def work() -> int:
        state["pid"] = os.getpid()
        return state["pid"]

    assert vela_cost._in_child_process(work) != os.getpid() == state["pid"]

    def failing() -> None:
        raise KeyError("in the child")

    with pytest.raises(KeyError, match="in the child") as raised:
        vela_cost._in_child_process(failing)
    assert any("in failing" in note for note in raised.value.__notes__)
