"""Materialising a codec plan: graph structure, Arm TOSA lowering, reference model.

The plan is made by the placement algorithm on an edge program and written to
node meta with `write_plan_meta`; thetas come from a test-local calibration
(one FP run, min/max over every tensor of a domain). The materialised program
is run two ways: eagerly in PyTorch (the simulation of the plan, fake-quantised
by its own q/dq nodes) and lowered by Arm (TOSA-1.0+INT+FP) on the TOSA
reference model. They must agree to within one quantisation step of the
output's domain.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from executorch.backends.transforms.utils import get_param_tensor
from executorch.exir import to_edge
from executorch.exir.capture._config import EdgeCompileConfig
from torch.export import ExportedProgram

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.planning.calibration import lifted_args
from codec_tosa.codecs import Int8Affine, Theta
from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import PortGraph, program_constants as constant_names
from codec_tosa.placement import COALESCE, LOCAL, NONLOCAL, Placement, place
from codec_tosa._passes.materialize_codecs import (
    DQ_CHANNEL,
    DQ_TENSOR,
    Q_TENSOR,
    MaterializeError,
    MaterializeCodecsPass,
    MaterializeStats,
)
from codec_tosa.placement.meta import KEY, write_plan_meta
from codec_tosa.validation.simulation import IntegerSimulator
from codec_tosa.validation.reference_model import run_reference_model as run_reference
from codec_tosa.serialization.tosa_stats import iter_operators, tensors, tosa_stats

TOSA_SPEC = "TOSA-1.0+INT+FP"


class ShuffleNetLike(torch.nn.Module):
    """conv -> cat(conv, conv) -> view/permute/view channel shuffle -> conv -> relu -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c0 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c1 = torch.nn.Conv2d(8, 4, 1)
        self.c2 = torch.nn.Conv2d(8, 4, 1)
        self.c3 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c0(x)
        y = torch.cat([self.c1(y), self.c2(y)], 1)
        n, c, h, w = y.shape
        y = y.view(n, 2, c // 2, h, w).permute(0, 2, 1, 3, 4).reshape(n, c, h, w)
        y = torch.relu(self.c3(y))
        return self.fc(y.flatten(1))


class ConvConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.b = torch.nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class MatmulLinear(torch.nn.Module):
    """A constant mm operand (per-tensor codes) and a linear without bias (per-channel)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 8))
        self.fc = torch.nn.Linear(8, 4, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.mm(x, self.w))


MODELS = {
    "shuffle": (ShuffleNetLike, (1, 3, 8, 8)),
    "convconv": (ConvConv, (1, 3, 8, 8)),
    "matmul": (MatmulLinear, (4, 16)),
}


def _table() -> CommutationTable:
    # the default table has the edge spelling of clone (dim_order_ops._clone_dim_order)
    return CommutationTable.default()


def _edge(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], keep_linear: bool = True) -> ExportedProgram:
    # Arm's partitioner keeps aten.linear for TOSA-1.0+INT+FP (ops_to_not_decompose);
    # a partition handed to the backend has it too.
    preserve = [torch.ops.aten.linear.default] if keep_linear else []
    config = EdgeCompileConfig(preserve_ops=preserve)
    return to_edge(torch.export.export(model, inputs), compile_config=config).exported_program()


def _placeholder_args(ep: ExportedProgram, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    user = iter(inputs)
    consts = set(constant_names(ep))
    return [get_param_tensor(ep, n) if n.name in consts else next(user)
            for n in ep.graph.nodes if n.op == "placeholder"]


def _calibrate(ep: ExportedProgram, graph: PortGraph, placement: Placement,
               inputs: tuple[torch.Tensor, ...]) -> dict[int, Theta]:
    """theta per domain from the min/max of every tensor the domain carries (one FP run)."""
    seen: dict[str, torch.Tensor] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> object:
            result = super().run_node(n)
            seen[n.name] = result
            return result

    with torch.no_grad():
        Recorder(ep.graph_module).run(*_placeholder_args(ep, inputs))
    thetas = {}
    for d in placement.plan.domains:
        names = [graph.val_name[v] for v in d.values] + \
            [graph.val_name[graph.in_value[p]] for p in d.in_ports]
        lo = min(float(seen[n].min()) for n in names)
        hi = max(float(seen[n].max()) for n in names)
        thetas[d.id] = Int8Affine().learn(lo, hi)
    return thetas


@dataclass
class Case:
    model: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    program: ExportedProgram  # materialised
    stats: MaterializeStats
    placement: Placement
    graph: PortGraph  # of the edge program before materialisation
    thetas: dict[int, Theta]

    def output_theta(self) -> Theta:
        """theta of the domain of the value the graph returns (its last encoded producer)."""
        out_port = next(p for p in range(self.graph.num_in_ports) if self.graph.in_op[p] < 0)
        return self.thetas[self.placement.plan.value_domain[self.graph.in_value[out_port]]]


def _case(name: str, placement: str, policy: str = "W", keep_linear: bool = True) -> Case:
    cls, shape = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    inputs = (torch.randn(*shape),)
    ep = _edge(model, inputs, keep_linear)
    graph = PortGraph.from_fx(ep.graph_module, constant_names(ep))
    pl = place(graph, _table(), policy, placement, verify=True)
    thetas = _calibrate(ep, graph, pl, inputs)
    write_plan_meta(graph, pl.semantics, pl.plan, thetas, _table())
    materialize = MaterializeCodecsPass(ep)
    materialize(ep.graph_module)
    return Case(model, inputs, ep, materialize.stats, pl, graph, thetas)


@functools.lru_cache(maxsize=None)
def _cached(name: str, placement: str, policy: str = "W") -> Case:
    return _case(name, placement, policy)


@functools.lru_cache(maxsize=None)
def _lowered(name: str, placement: str, policy: str = "W") -> bytes:
    spec = arm_adapter.tosa_compile_spec(TOSA_SPEC)
    program = copy.deepcopy(_cached(name, placement, policy).program)  # Arm's passes mutate it
    return arm_adapter.lower_into(program, spec, arm_adapter.new_serializer(spec))


def _tosa_ops(buf: bytes) -> list[tuple[str, list[str], list[str], list[str], list[str]]]:
    """(op, input dtypes, output dtypes, input names, output names) of every non-constant operator."""
    ops = []
    by_name = tensors(buf)
    for o in iter_operators(buf):
        if o.op in ("CONST", "CONST_SHAPE"):
            continue
        ops.append((o.op, [by_name[n].dtype for n in o.inputs if n in by_name],
                    [by_name[n].dtype for n in o.outputs if n in by_name], o.inputs, o.outputs))
    return ops


def _sqnr_db(ref: torch.Tensor, test: torch.Tensor) -> float:
    noise = (ref - test).pow(2).mean()
    return float(10 * torch.log10(ref.pow(2).mean() / noise.clamp_min(1e-30)))


def _calls(ep: ExportedProgram, target: object) -> list[torch.fx.Node]:
    return [n for n in ep.graph.nodes if n.op == "call_function" and n.target == target]


# ---- graph structure (no Arm lowering) ---------------------------------------


def test_policy_z_leaves_the_program_untouched() -> None:
    case = _case("shuffle", COALESCE, policy="Z")
    assert not _calls(case.program, Q_TENSOR) and not _calls(case.program, DQ_CHANNEL)
    assert case.stats == MaterializeStats()
    torch.testing.assert_close(case.program.module()(*case.inputs), case.model(*case.inputs))


def test_coalesced_shuffle_has_one_q_dq_pair_per_encoded_value_and_no_codec_between_domains() -> None:
    case = _cached("shuffle", COALESCE)
    s = case.stats
    # 11 encoded producer ports: 5 convs/linear, cat, view, permute, clone, view, flatten-view
    assert (s.value_codes, s.encodes, s.transcodes, s.decodes) == (11, 2, 0, 2)
    assert len(_calls(case.program, Q_TENSOR)) == s.value_codes + s.encodes + s.transcodes
    # every q is immediately read by one dq of the same theta: the PT2E representation
    for q in _calls(case.program, Q_TENSOR):
        (dq,) = q.users
        assert dq.target == DQ_TENSOR and dq.args[1:] == q.args[1:]
    # the cat reads both convs through dqs of its own domain: coalesced, no transcode
    (cat,) = [n for n in case.program.graph.nodes if "cat" in str(n.target)]
    thetas = {a.args[1:] for a in cat.args[0]}
    assert len(thetas) == 1 and all(a.target == DQ_TENSOR for a in cat.args[0])


def test_weights_are_int8_constants_per_output_channel_and_biases_int32() -> None:
    case = _cached("shuffle", COALESCE)
    ep = case.program
    sig = ep.graph_signature
    # the FP32 parameters are gone from the program: storage is the codes
    assert not sig.inputs_to_parameters and not ep.state_dict
    assert len(case.stats.removed_constants) == 10
    weight_dqs = [n for n in _calls(ep, DQ_CHANNEL) if n.args[6] == torch.int8]
    bias_dqs = [n for n in _calls(ep, DQ_CHANNEL) if n.args[6] == torch.int32]
    assert len(weight_dqs) == len(bias_dqs) == 5
    model = case.model
    fps = {"c0": model.c0, "c1": model.c1, "c2": model.c2, "c3": model.c3, "fc": model.fc}
    for dq in weight_dqs:
        codes = get_param_tensor(ep, dq.args[0])
        scales = get_param_tensor(ep, dq.args[1])
        assert codes.dtype == torch.int8 and dq.args[3] == 0 and scales.shape == (codes.shape[0],)
        assert int(codes.abs().max()) == 127  # symmetric: each channel's max reaches the end
        decoded = codes.float() * scales.reshape([-1] + [1] * (codes.dim() - 1))
        # within half a step of one of the FP weights (c1 and c2 share a shape)
        errors = [float((m.weight - decoded).abs().max()) for m in fps.values()
                  if m.weight.shape == codes.shape]
        assert min(errors) <= float(scales.max()) / 2 + 1e-7
    for dq in bias_dqs:
        assert get_param_tensor(ep, dq.args[0]).dtype == torch.int32


def test_only_int8_operators_are_annotated_for_arm() -> None:
    ep = _cached("shuffle", COALESCE).program
    annotated = {n.name for n in ep.graph.nodes if "_arm_annotation_info" in n.meta.get("custom", {})}
    planned = {n.name for n in ep.graph.nodes if KEY in n.meta}
    assert annotated == planned
    assert not any("relu" in n for n in annotated)  # FP32 under the default table


def test_the_materialised_program_is_a_consistent_exported_program() -> None:
    case = _cached("shuffle", COALESCE)
    ep = case.program
    outputs = [a.name for a in ep.graph.output_node().args[0]]
    assert [s.arg.name for s in ep.graph_signature.output_specs] == outputs
    with torch.no_grad():
        sim = ep.module()(*case.inputs)
        fp = case.model(*case.inputs)
    # the plan's own fake quantisation stays close to FP32
    assert _sqnr_db(fp, sim) > 25.0


def test_local_placement_transcodes_between_neighbours() -> None:
    case = _cached("shuffle", LOCAL)
    s = case.stats
    assert s.transcodes == 10 and s.encodes == 2
    # a transcode is dq(theta_s) -> q(theta_d) -> dq(theta_d)
    transcodes = [q for q in _calls(case.program, Q_TENSOR) if q.args[0].target == DQ_TENSOR]
    assert len(transcodes) == 10


def test_an_encoded_addmm_is_refused_with_the_node_named() -> None:
    with pytest.raises(MaterializeError, match=r"aten_addmm_default .*aten\.linear"):
        _case("shuffle", COALESCE, keep_linear=False)


def test_a_domain_without_theta_is_refused_with_the_port_named() -> None:
    torch.manual_seed(0)
    model, inputs = ConvConv().eval(), (torch.randn(1, 3, 8, 8),)
    ep = _edge(model, inputs)
    graph = PortGraph.from_fx(ep.graph_module, constant_names(ep))
    pl = place(graph, _table(), "W", COALESCE)
    write_plan_meta(graph, pl.semantics, pl.plan, {d.id: None for d in pl.plan.domains}, _table())
    with pytest.raises(MaterializeError, match="missing calibration"):
        MaterializeCodecsPass(ep)(ep.graph_module)


# ---- Arm lowering and the TOSA reference model --------------------------------


# W at every placement (lowered once for the traffic test below); Y and X at one
# placement each, the other two in tests/tools/test_lowering.py (the fuzz grid
# has every pair)
@pytest.mark.parametrize("placement,policy", [(LOCAL, "W"), (NONLOCAL, "W"), (COALESCE, "W"),
                                              (LOCAL, "Y"), (COALESCE, "X")])
def test_reference_model_matches_the_simulation_within_one_step(placement: str, policy: str) -> None:
    case = _cached("shuffle", placement, policy)
    buf = _lowered("shuffle", placement, policy)
    (ref,) = run_reference(buf, [x.numpy() for x in case.inputs])
    with torch.no_grad():
        sim = case.program.module()(*case.inputs)
        fp = case.model(*case.inputs)
    # tolerance: one quantisation step of the output's domain (the linear's)
    step = case.output_theta().scale
    err = float(np.abs(ref - sim.numpy()).max())
    assert err <= step + 1e-7, f"{policy} {placement}: max |ref - sim| = {err} > one step {step}"
    assert _sqnr_db(fp, torch.from_numpy(ref)) > 25.0


@pytest.mark.slow
def test_tiny_shufflenet_lowers_and_matches_the_simulation() -> None:
    """split_with_sizes/getitem, max_pool2d_with_indices, batch norm, depthwise convs."""
    from codec_tosa_examples.models import load_model

    model, inputs = load_model("tiny_shufflenet")
    inputs = tuple(inputs)
    ep = _edge(model, inputs)
    graph = PortGraph.from_fx(ep.graph_module, constant_names(ep))
    pl = place(graph, _table(), "W", COALESCE, verify=True)
    thetas = _calibrate(ep, graph, pl, inputs)
    write_plan_meta(graph, pl.semantics, pl.plan, thetas, _table())
    MaterializeCodecsPass(ep)(ep.graph_module)
    program = ep
    spec = arm_adapter.tosa_compile_spec(TOSA_SPEC)
    buf = arm_adapter.lower_into(copy.deepcopy(program), spec, arm_adapter.new_serializer(spec),
                                 lower_codecs=True)
    # the example and two held-out inputs, bit for bit against the integer simulation
    g = torch.Generator().manual_seed(99)
    for x in (inputs[0], torch.randn(inputs[0].shape, generator=g), torch.randn(inputs[0].shape, generator=g)):
        (ref,) = run_reference(buf, [x.numpy()])
        with torch.no_grad():
            sim = IntegerSimulator(program.graph_module).run(*lifted_args(program, (x,)))
        sim = sim[0] if isinstance(sim, (list, tuple)) else sim
        np.testing.assert_array_equal(ref.reshape(sim.shape), sim.numpy())
    ops = _tosa_ops(buf)
    assert all(o[1][0] == "INT8" for o in ops if o[0] in ("CONCAT", "SLICE", "MAX_POOL2D"))


def test_encoded_convs_are_int8_conv2d_with_rescale_and_codes_flow_inside_a_domain() -> None:
    ops = _tosa_ops(_lowered("shuffle", COALESCE))
    convs = [o for o in ops if o[0] == "CONV2D"]
    assert len(convs) == 5
    for _, ins, outs, _, out_names in convs:
        assert ins[:3] == ["INT8", "INT8", "INT32"] and outs == ["INT32"]
        (rescale,) = [o for o in ops if out_names[0] in o[3]]
        assert rescale[0] == "RESCALE" and rescale[2] == ["INT8"]
    # between producer and consumer convs of one domain only layout/routing operators on INT8
    producer = {name: o for o in ops for name in o[4]}
    fed_by_codes = 0
    for conv in convs:
        o, path = producer.get(conv[3][0]), []
        while o is not None and o[0] in ("CONCAT", "RESHAPE", "TRANSPOSE"):
            path.append(o)
            o = producer.get(o[3][0])
        if o is not None and o[0] == "RESCALE" and o[1][0] == "INT32":  # another conv's output
            assert all(p[1][0] == "INT8" and p[2] == ["INT8"] for p in path)
            fed_by_codes += 1
    assert fed_by_codes == 3  # c1, c2 from c0; c3 from cat(c1, c2) through the shuffle
    # no int8 -> int8 RESCALE: no transcode anywhere
    assert not [o for o in ops if o[0] == "RESCALE" and o[1][0] == "INT8"]


def test_conv_conv_is_one_domain_without_codec_and_local_adds_a_transcode() -> None:
    for placement, transcodes in ((COALESCE, 0), (LOCAL, 1)):
        ops = _tosa_ops(_lowered("convconv", placement))
        rescales = [o for o in ops if o[0] == "RESCALE"]
        assert len([o for o in rescales if o[1][0] == "INT32"]) == 2  # one per conv
        assert len([o for o in rescales if o[1][0] == "INT8"]) == transcodes
        case = _cached("convconv", placement)
        (ref,) = run_reference(_lowered("convconv", placement), [x.numpy() for x in case.inputs])
        with torch.no_grad():
            sim = case.program.module()(*case.inputs)
        assert float(np.abs(ref - sim.numpy()).max()) <= case.output_theta().scale + 1e-7


def test_tosa_traffic_coalesce_below_nonlocal_below_local() -> None:
    stats = {p: tosa_stats(_lowered("shuffle", p)) for p in (LOCAL, NONLOCAL, COALESCE)}
    traffic = {p: s.traffic_bytes for p, s in stats.items()}
    rescales = {p: s.operators_by_type.get("RESCALE", 0) for p, s in stats.items()}
    assert traffic[COALESCE] < traffic[NONLOCAL] < traffic[LOCAL], traffic
    assert rescales[COALESCE] < rescales[NONLOCAL] < rescales[LOCAL], rescales


def test_a_constant_matmul_operand_is_encoded_per_tensor_and_lowers_to_int8_matmul() -> None:
    case = _cached("matmul", COALESCE)
    (mm_weight,) = [n for n in _calls(case.program, DQ_TENSOR) if n.args[0].op == "placeholder"
                    and get_param_tensor(case.program, n.args[0]).dtype == torch.int8]
    assert mm_weight.args[2:] == (0, -127, 127, torch.int8)  # symmetric, one scale
    assert len([n for n in _calls(case.program, DQ_CHANNEL)]) == 1  # the linear weight
    buf = _lowered("matmul", COALESCE)
    ops = _tosa_ops(buf)
    (matmul,) = [o for o in ops if o[0] == "MATMUL"]
    assert matmul[1][:2] == ["INT8", "INT8"] and matmul[2] == ["INT32"]
    (ref,) = run_reference(buf, [x.numpy() for x in case.inputs])
    with torch.no_grad():
        sim = case.program.module()(*case.inputs)
    assert float(np.abs(ref - sim.numpy()).max()) <= case.output_theta().scale + 1e-7
