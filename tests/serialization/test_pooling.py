"""PooledTosaSerializer and the CONST_SHAPE dedup pass (issue 5)."""

from __future__ import annotations

import copy
import gc
import operator
import weakref

import pytest
import torch
import tosa_serializer as ts

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa._passes.const_shape_dedup import DedupConstShapesPass
from codec_tosa.serialization.pooled import PooledTosaSerializer, PoolingStats
from codec_tosa.validation.reference_model import bit_identical, reference_inputs
from codec_tosa.serialization.tosa_stats import iter_constants, iter_operators
from pooling_support import (
    ATTENTION_INPUTS,
    BRANCH_INPUTS,
    CONV_INPUTS,
    Attention,
    Branches,
    ConvNet,
    Lowered,
    lower_both,
    lower_pooled,
)


def _serializer() -> PooledTosaSerializer:
    return PooledTosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)


def _const_outputs(serializer: ts.TosaSerializer) -> list[str]:
    block = serializer.currRegion.currBasicBlock
    return [
        out
        for op in block.operators
        if op.op in (ts.Op.CONST, ts.Op.CONST_SHAPE)
        for out in op.outputs
    ]


# -- the serializer on its own ---------------------------------------------


def test_identical_helper_constants_are_emitted_once() -> None:
    s = _serializer()
    first = s.addConst([1], ts.DType.INT8, [0], name="a_zp")
    second = s.addConst([1], ts.DType.INT8, [0], name="b_zp")
    assert first.name == second.name == "a_zp"
    assert _const_outputs(s) == ["a_zp"]
    assert s.stats.helper_requests == 2
    assert s.stats.helper_consts_emitted == 1
    assert s.stats.helper_consts_reused == 1
    assert s.stats.helper_bytes_saved == 1
    assert s.stats.reused_by_dtype == {"INT8": 1}


def test_shape_constants_are_pooled_as_shapes() -> None:
    s = _serializer()
    a = s.addConst([3], ts.DType.SHAPE, [2, 4, 16], name="r1_shape")
    b = s.addConst([3], ts.DType.SHAPE, [2, 4, 16], name="r2_shape")
    assert isinstance(b, ts.TosaSerializerShape)
    assert a.name == b.name == "r1_shape"
    assert s.stats.helper_bytes_saved == 24  # three int64


@pytest.mark.parametrize(
    "first, second",
    [
        (([1], ts.DType.FP32, [0.0]), ([1], ts.DType.FP32, [-0.0])),
        (([1], ts.DType.INT8, [0]), ([1], ts.DType.INT32, [0])),
        (([1], ts.DType.INT8, [0]), ([1, 1], ts.DType.INT8, [0])),
        (([2], ts.DType.INT16, [1, 2]), ([2], ts.DType.INT16, [2, 1])),
        (([2], ts.DType.SHAPE, [1, 2]), ([2], ts.DType.INT32, [1, 2])),
    ],
    ids=["signed-zero", "int8-vs-int32", "rank", "values", "shape-vs-tensor"],
)
def test_different_keys_stay_apart(first: tuple, second: tuple) -> None:
    s = _serializer()
    a = s.addConst(*first, name="first")
    b = s.addConst(*second, name="second")
    assert (a.name, b.name) == ("first", "second")
    assert _const_outputs(s) == ["first", "second"]
    assert s.stats.helper_consts_reused == 0


def test_graph_owned_constants_are_never_pooled_nor_reused() -> None:
    s = _serializer()
    with s.graph_owned_constants():
        s.addConst([1], ts.DType.FP32, [1.0], name="p_weight")
        s.addConst([1], ts.DType.FP32, [1.0], name="p_other")
    s.addUnpooledConst([1], ts.DType.FP32, [1.0], name="b_buffer")
    helper = s.addConst([1], ts.DType.FP32, [1.0], name="helper")
    assert helper.name == "helper"  # not mapped onto a graph-owned tensor
    assert _const_outputs(s) == ["p_weight", "p_other", "b_buffer", "helper"]
    assert s.stats.graph_owned_consts == 3
    assert s.stats.helper_consts_reused == 0


def test_operator_inputs_asked_by_name_are_remapped_to_the_pooled_constant() -> None:
    s = _serializer()
    s.addInputTensor(ts.TosaSerializerTensor("x", [1], ts.DType.FP32))
    s.addIntermediate([1], ts.DType.FP32)
    # Arm's MUL visitor ignores addConst's result and uses the name it asked for.
    s.addConst([1], ts.DType.INT8, 0, name="mul0_shift")
    s.addConst([1], ts.DType.INT8, 0, name="mul1_shift")
    s.currRegion.currBasicBlock.addTensor("y", [1], ts.DType.FP32)
    attr = ts.TosaSerializerAttribute()
    attr.MulAttribute()
    s.addOperator(ts.Op.MUL, ["x", "x", "mul1_shift"], ["y"], attr)
    mul = [op for op in s.currRegion.currBasicBlock.operators if op.op == ts.Op.MUL][0]
    assert list(mul.inputs) == ["x", "x", "mul0_shift"]
    assert s.stats.remapped_operator_inputs == 1


def test_each_basic_block_has_its_own_pool() -> None:
    s = _serializer()
    s.addConst([1], ts.DType.INT8, [0], name="main_zp")
    s.startRegion("branch")
    s.currRegion.addBasicBlock("branch")
    in_branch = s.addConst([1], ts.DType.INT8, [0], name="branch_zp")
    assert in_branch.name == "branch_zp"
    assert s.stats.helper_consts_emitted == 2


def test_the_serializer_is_freed_after_use() -> None:
    s = _serializer()
    s.addConst([1], ts.DType.INT8, [0], name="a")
    returned = s.addConst([1], ts.DType.INT8, [0], name="b")
    s.addConst([2], ts.DType.SHAPE, [1, 2], name="c")
    s.serialize()
    ref = weakref.ref(s)
    del s, returned
    gc.collect()
    assert ref() is None


def test_pooling_stats_round_trip_through_json() -> None:
    stats = PoolingStats(helper_requests=5, helper_consts_reused=3, const_shapes_deduplicated=2,
                         reused_by_dtype={"INT8": 3})
    again = PoolingStats.from_json(stats.to_json())
    assert again == stats
    assert again.operators_saved == 5


# -- the FX pass on a hand-built graph -------------------------------------


def _const_shape(shape: list[int]) -> list[int]:  # stands in for tosa.CONST_SHAPE
    return shape


def test_const_shape_dedup_merges_identical_static_shapes_only() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    nodes = []
    for value in ([1, 2], [1, 2], [3], [1, 2]):
        node = graph.call_function(_const_shape, (value,))
        node.meta["val"] = list(value)
        nodes.append(node)
    symbolic = graph.call_function(_const_shape, ([1, x],))
    symbolic.meta["val"] = [1, 2]  # same value but not all-int args: kept
    uses = [graph.call_function(operator.add, (x, n)) for n in nodes + [symbolic]]
    graph.output(tuple(uses))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)

    dedup = DedupConstShapesPass(_const_shape)
    assert dedup(gm).modified and dedup.count == 2
    remaining = [n for n in gm.graph.nodes if n.target is _const_shape]
    assert remaining == [nodes[0], nodes[2], symbolic]
    assert [u.args[1] for u in uses] == [nodes[0], nodes[0], nodes[2], nodes[0], symbolic]
    assert not dedup(gm).modified and dedup.count == 0


# -- real lowerings: small models, stock vs pooled -------------------------


@pytest.fixture(scope="module")
def conv_fp() -> Lowered:
    return lower_both(ConvNet(), CONV_INPUTS, "TOSA-1.0+FP")


@pytest.fixture(scope="module")
def conv_int8() -> Lowered:
    return lower_both(ConvNet(), CONV_INPUTS, "TOSA-1.0+INT", int8=True)


@pytest.fixture(scope="module")
def attention_int8() -> Lowered:
    return lower_both(Attention(), ATTENTION_INPUTS, "TOSA-1.0+INT", int8=True)


@pytest.fixture(scope="module")
def attention_fp() -> Lowered:
    return lower_both(Attention(), ATTENTION_INPUTS, "TOSA-1.0+FP")


@pytest.fixture(scope="module")
def branches() -> Lowered:
    return lower_both(Branches(), BRANCH_INPUTS, "TOSA-1.0+FP+cf")


ALL = ["conv_fp", "conv_int8", "attention_fp", "attention_int8", "branches"]


@pytest.mark.parametrize("name", ALL)
def test_pooled_outputs_are_bit_identical_to_stock(name: str, request: pytest.FixtureRequest) -> None:
    lowered: Lowered = request.getfixturevalue(name)
    for seed in (0, 1):
        assert bit_identical(lowered.stock, lowered.pooled, reference_inputs(lowered.program, seed))


@pytest.mark.parametrize("name", ALL)
def test_only_constants_disappear(name: str, request: pytest.FixtureRequest) -> None:
    lowered: Lowered = request.getfixturevalue(name)
    before, after = lowered.before, lowered.after
    for op, count in before.operators_by_type.items():
        if op not in ("CONST", "CONST_SHAPE"):
            assert after.operators_by_type[op] == count
    saved = before.operators - after.operators
    assert saved == lowered.stats.operators_saved > 0
    removed_bytes = before.constant_bytes - after.constant_bytes
    if lowered.stats.const_shapes_deduplicated == 0:
        assert removed_bytes == lowered.stats.helper_bytes_saved
    else:  # CONST_SHAPE nodes removed by the FX pass add their bytes
        assert removed_bytes > lowered.stats.helper_bytes_saved
    assert after.traffic_bytes == before.traffic_bytes


def test_expected_savings_on_the_small_models(
    conv_fp: Lowered, conv_int8: Lowered, attention_fp: Lowered, attention_int8: Lowered
) -> None:
    # Exact figures: any change in Arm's lowering or in the pool shows here.
    assert (conv_fp.before.operators, conv_fp.after.operators) == (30, 23)
    assert (conv_int8.before.operators, conv_int8.after.operators) == (89, 61)
    assert (attention_fp.before.operators, attention_fp.after.operators) == (33, 27)
    assert (attention_int8.before.operators, attention_int8.after.operators) == (105, 68)
    # The attention model reshapes twice to [16, 16]: one CONST_SHAPE goes.
    assert attention_fp.stats.const_shapes_deduplicated == 1
    assert attention_fp.before.const_shape_ops - attention_fp.after.const_shape_ops == 1
    # Conv, depthwise and matmul zero points are asked for by name.
    assert conv_int8.stats.remapped_operator_inputs > 0
    assert attention_int8.stats.remapped_operator_inputs > 0


def test_helpers_are_pooled_per_block_in_control_flow(branches: Lowered) -> None:
    # Each of the three blocks (main and two branches) has two MULs sharing one shift.
    shifts: dict[str, set[str]] = {}
    blocks = set()
    for op in iter_operators(branches.pooled):
        blocks.add(op.block)
        if op.op == "MUL":
            shifts.setdefault(op.block, set()).add(op.inputs[2])
    assert len(blocks) == 3
    assert {b: len(names) for b, names in shifts.items()} == {b: 1 for b in blocks}
    assert branches.stats.helper_consts_emitted == 3
    assert branches.stats.helper_consts_reused == 3


@pytest.mark.parametrize("name", ALL)
def test_only_duplicate_helpers_are_dropped_and_the_rest_is_untouched(
    name: str, request: pytest.FixtureRequest
) -> None:
    lowered: Lowered = request.getfixturevalue(name)
    stock = {(c.block, c.name): c for c in iter_constants(lowered.stock)}
    pooled = {(c.block, c.name): c for c in iter_constants(lowered.pooled)}
    # Every constant left keeps its name, dtype, shape and bytes.
    assert set(pooled) <= set(stock)
    for key, const in pooled.items():
        assert (const.dtype, const.shape, const.data) == (
            stock[key].dtype, stock[key].shape, stock[key].data)
    # Every constant dropped has an identical twin kept in the same block.
    kept = {(c.block, c.op, c.dtype, tuple(c.shape), c.data) for c in pooled.values()}
    for key in set(stock) - set(pooled):
        c = stock[key]
        assert (c.block, c.op, c.dtype, tuple(c.shape), c.data) in kept, key
    # What is left is the graph-owned constants plus one of each distinct helper.
    stats = lowered.stats
    assert len(pooled) == stats.graph_owned_consts + stats.helper_consts_emitted


def test_pooled_lowering_is_deterministic(conv_int8: Lowered) -> None:
    again, _ = lower_pooled(conv_int8.program, "TOSA-1.0+INT")
    assert again == conv_int8.pooled


def test_plain_serializer_through_the_adapter_still_gives_stock_bytes(conv_int8: Lowered) -> None:
    spec = arm_adapter.tosa_compile_spec("TOSA-1.0+INT")
    plain = arm_adapter.lower_into(copy.deepcopy(conv_int8.program), spec, arm_adapter.new_serializer(spec))
    assert plain == conv_int8.stock


def test_a_lowered_serializer_is_freed(conv_fp: Lowered) -> None:
    spec = arm_adapter.tosa_compile_spec("TOSA-1.0+FP")
    serializer = arm_adapter.new_serializer(spec, PooledTosaSerializer)
    arm_adapter.lower_into(copy.deepcopy(conv_fp.program), spec, serializer)
    stats = serializer.stats
    ref = weakref.ref(serializer)
    del serializer
    gc.collect()
    assert ref() is None
    assert stats.helper_consts_reused == conv_fp.stats.helper_consts_reused


# -- a benchmark model, for CI ---------------------------------------------


@pytest.mark.slow
def test_unet_fp_loses_over_a_third_of_its_operators() -> None:
    # U-Net at 64x64 (the paper model's weights and graph, 1/64 of the pixels,
    # for the two reference-model runs): 291 -> 184 operators, as
    # InceptionV3 550 -> 344 (docs/results/constant_pooling.md)
    from codec_tosa_examples.models.vision import unet

    model, inputs = unet(size=64)
    lowered = lower_both(model, inputs, "TOSA-1.0+FP")
    before, after = lowered.before, lowered.after
    assert after.operators <= 0.65 * before.operators
    assert bit_identical(lowered.stock, lowered.pooled, reference_inputs(lowered.program))


# -- the record a backend stores in the .pte ----------------------------------


def test_pooling_stats_travel_in_the_pte(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend returning `pooling_record` as data_store_output gets it into the .pte."""
    from executorch.backends.arm.tosa.backend import TOSABackend
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend.backend_details import PreprocessResult

    from codec_tosa.runtime.pte import read_pooling_stats
    from codec_tosa.serialization.pooling_record import pooling_record

    stats = PoolingStats(helper_requests=4, helper_consts_reused=3, reused_by_dtype={"INT8": 3})
    payloads: list[bytes] = []
    stock = TOSABackend.__dict__["preprocess"].__func__

    def with_record(program, compile_specs):  # type: ignore[no-untyped-def]
        payload = bytes(stock(program, compile_specs).processed_bytes)
        payloads.append(payload)
        return PreprocessResult(processed_bytes=payload, data_store_output=pooling_record(stats, payload))

    monkeypatch.setattr(TOSABackend, "preprocess", staticmethod(with_record))
    spec = arm_adapter.tosa_compile_spec("TOSA-1.0+FP")
    model = torch.nn.Conv2d(3, 4, 3).eval()
    program = torch.export.export(model, (torch.randn(1, 3, 8, 8),))
    pte = to_edge_transform_and_lower(
        program, partitioner=[arm_adapter.stock_partitioner(spec)]
    ).to_executorch().buffer

    (payload,) = payloads
    assert read_pooling_stats(pte, payload) == stats
    assert read_pooling_stats(pte, payload + b"other delegate") is None
