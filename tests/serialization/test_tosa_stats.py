"""Counting a TOSA flatbuffer: operators, constants, tensors, traffic, payload."""

from __future__ import annotations

import pytest
import tosa_serializer as ts
from tosa.DType import DType

from codec_tosa.serialization.tosa_stats import (
    TosaStats,
    iter_constants,
    iter_fused_groups,
    iter_operators,
    op_name,
    tensor_nbytes,
    tosa_stats,
)


def _hand_built() -> bytes:
    """x + c, then reshape to [4, 1] through a CONST_SHAPE."""
    s = ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)
    s.addInputTensor(ts.TosaSerializerTensor("x", [1, 4], ts.DType.FP32))
    s.addConst([1, 4], ts.DType.FP32, [1.0, 2.0, 3.0, 4.0], name="c")
    block = s.currRegion.currBasicBlock
    block.addTensor("y", [1, 4], ts.DType.FP32)
    attr = ts.TosaSerializerAttribute()
    attr.AddAttribute()
    s.addOperator(ts.Op.ADD, ["x", "c"], ["y"], attr)
    s.addConst([2], ts.DType.SHAPE, [4, 1], name="s")
    block.addTensor("z", [4, 1], ts.DType.FP32)
    attr = ts.TosaSerializerAttribute()
    attr.ReshapeAttribute()
    s.addOperator(ts.Op.RESHAPE, ["y", "s"], ["z"], attr)
    s.addOutputTensor(block.tensors["z"])
    return bytes(s.serialize())


def test_counts_of_a_hand_built_graph() -> None:
    buf = _hand_built()
    stats = tosa_stats(buf)
    assert stats.payload_bytes == len(buf)
    assert (stats.regions, stats.blocks) == (1, 1)
    assert stats.operators == 4
    assert stats.operators_by_type == {"ADD": 1, "CONST": 1, "CONST_SHAPE": 1, "RESHAPE": 1}
    assert (stats.const_ops, stats.const_bytes) == (1, 16)
    assert (stats.const_shape_ops, stats.const_shape_bytes) == (1, 16)
    assert stats.constant_bytes == 32
    assert (stats.tensors, stats.shapes, stats.dynamic_tensors) == (4, 1, 0)
    # ADD reads x and c and writes y (3 x 16 bytes); RESHAPE reads y, writes z;
    # its shape operand is metadata, not traffic.
    assert stats.traffic_by_op == {"ADD": 48, "RESHAPE": 32}
    assert stats.traffic_bytes == 80


def test_operators_in_order_with_their_traffic() -> None:
    ops = list(iter_operators(_hand_built()))
    assert [(o.op, o.inputs, o.outputs, o.traffic_bytes) for o in ops] == [
        ("CONST", [], ["c"], 0),
        ("ADD", ["x", "c"], ["y"], 48),
        ("CONST_SHAPE", [], ["s"], 0),
        ("RESHAPE", ["y", "s"], ["z"], 32),
    ]
    assert {(o.region, o.block) for o in ops} == {("main", "main")}


def test_constants_with_their_data() -> None:
    import struct

    consts = list(iter_constants(_hand_built()))
    assert [(c.op, c.name, c.dtype, c.shape) for c in consts] == [
        ("CONST", "c", "FP32", [1, 4]),
        ("CONST_SHAPE", "s", "SHAPE", [2]),
    ]
    assert consts[0].data == struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    assert consts[1].data == struct.pack("<2q", 4, 1)


@pytest.mark.parametrize(
    "shape, dtype, expected",
    [
        ([2, 3], DType.FP32, 24),
        ([3], DType.INT4, 2),  # 12 bits round up to 2 bytes
        ([5], DType.INT48, 30),
        ([2, 2], DType.BOOL, 4),
        ([], DType.INT8, 1),  # a scalar
        ([-1, 4], DType.FP16, None),  # dynamic
    ],
)
def test_tensor_bytes_at_tosa_dtypes(shape: list[int], dtype: int, expected: int | None) -> None:
    assert tensor_nbytes(shape, dtype) == expected


def test_json_round_trip_and_names() -> None:
    stats = tosa_stats(_hand_built())
    assert TosaStats.from_json(stats.to_json()) == stats
    assert op_name(3) == "CONV2D"
    assert op_name(9999) == "UNKNOWN_9999"


def test_garbage_is_rejected_with_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a TOSA flatbuffer"):
        tosa_stats(b"\x01\x02")


def test_a_lowered_model_adds_up() -> None:
    """On a real lowering the per-operator walk and the totals agree."""
    from pooling_support import CONV_INPUTS, ConvNet, lower_both

    lowered = lower_both(ConvNet(), CONV_INPUTS, "TOSA-1.0+FP")
    stats = tosa_stats(lowered.stock)
    ops = list(iter_operators(lowered.stock))
    assert len(ops) == stats.operators
    assert sum(o.traffic_bytes for o in ops) == stats.traffic_bytes
    assert stats.operators_by_type["CONV2D"] == 3  # two convs and the linear head
    assert stats.operators_by_type["DEPTHWISE_CONV2D"] == 1
    # Weights dominate the constant bytes: 3*8*9 + 8*8*9 + 8*9 + 8*4 floats plus biases.
    weights = (3 * 8 * 9 + 8 * 8 * 9 + 8 * 9 + 8 * 4) * 4
    assert weights < stats.const_bytes < weights + 1024


# --- fused traffic -----------------------------------------------------------


class _Graph:
    """A one-block TOSA graph built operator by operator (the stats read only
    names, shapes and dtypes, so attribute values are arbitrary)."""

    def __init__(self) -> None:
        self.s = ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)
        self.block = self.s.currRegion.currBasicBlock

    def input(self, name: str, shape: list[int], dtype=ts.DType.INT8) -> None:
        self.s.addInputTensor(ts.TosaSerializerTensor(name, shape, dtype))

    def const(self, name: str, shape: list[int], dtype=ts.DType.INT8) -> None:
        count = 1
        for d in shape:
            count *= d
        self.s.addConst(shape, dtype, [0] * count, name=name)

    def op(self, op, inputs: list[str], out: str, shape: list[int], dtype=ts.DType.INT8, attr=None) -> None:
        self.block.addTensor(out, shape, dtype)
        if attr is None:  # an attribute-free operator: ABS -> AbsAttribute()
            attr = ts.TosaSerializerAttribute()
            getattr(attr, "".join(w.capitalize() for w in op.name.split("_")) + "Attribute")()
        self.s.addOperator(op, inputs, [out], attr)

    def output(self, name: str) -> None:
        self.s.addOutputTensor(self.block.tensors[name])

    def bytes(self) -> bytes:
        return bytes(self.s.serialize())


def _conv_rescale_clamp() -> bytes:
    """CONV2D -> RESCALE -> CLAMP, the INT8 convolution-plus-ReLU pattern."""
    g = _Graph()
    g.input("x", [1, 8, 8, 4])  # 256 bytes
    g.const("w", [8, 3, 3, 4])  # 288
    g.const("b", [8], ts.DType.INT32)  # 32
    g.const("xzp", [1])  # 1
    g.const("wzp", [1])  # 1
    conv = ts.TosaSerializerAttribute()
    conv.Conv2dAttribute([1, 1, 1, 1], [1, 1], [1, 1], False, ts.DType.INT32)
    g.op(ts.Op.CONV2D, ["x", "w", "b", "xzp", "wzp"], "acc", [1, 8, 8, 8], ts.DType.INT32, conv)  # 2048
    g.const("mult", [8], ts.DType.INT32)  # 32
    g.const("shift", [8])  # 8
    g.const("izp", [1], ts.DType.INT32)  # 4
    g.const("ozp", [1])  # 1
    rescale = ts.TosaSerializerAttribute()
    rescale.RescaleAttribute(True, ts.RoundingMode.SINGLE_ROUND, True, False, False)
    g.op(ts.Op.RESCALE, ["acc", "mult", "shift", "izp", "ozp"], "r", [1, 8, 8, 8], attr=rescale)  # 512
    clamp = ts.TosaSerializerAttribute()
    clamp.ClampAttribute([0], [127], ts.NanPropagationMode.PROPAGATE)
    g.op(ts.Op.CLAMP, ["r"], "y", [1, 8, 8, 8], attr=clamp)  # 512
    g.output("y")
    return g.bytes()


def test_conv_rescale_clamp_is_one_group() -> None:
    buf = _conv_rescale_clamp()
    (group,) = iter_fused_groups(buf)
    assert group.ops == ["CONV2D", "RESCALE", "CLAMP"]
    assert group.inputs == ["x", "w", "b", "xzp", "wzp", "mult", "shift", "izp", "ozp"]
    assert group.outputs == ["y"]
    # reads x, the weights and every constant once; writes y; the INT32
    # accumulator and the unclamped r never leave the group
    assert group.traffic_bytes == (256 + 288 + 32 + 1 + 1 + 32 + 8 + 4 + 1) + 512
    stats = tosa_stats(buf)
    assert (stats.fused_groups, stats.fused_traffic_bytes) == (1, 1135)
    assert stats.fused_traffic_by_op == {"CONV2D": 1135}
    # unfused: every operator reads and writes its own tensors
    assert stats.traffic_bytes == (256 + 288 + 32 + 1 + 1 + 2048) + (2048 + 32 + 8 + 4 + 1 + 512) + (512 + 512)


def _abs_then(negations: int, abs_is_output: bool = False, add_input: bool = False) -> bytes:
    """x -> ABS -> a -> NEGATE (x `negations`), optionally ADD(n0, x); INT32 [1, 4] (16 bytes each)."""
    g = _Graph()
    g.input("x", [1, 4], ts.DType.INT32)
    g.op(ts.Op.ABS, ["x"], "a", [1, 4], ts.DType.INT32)
    g.const("zp", [1], ts.DType.INT32)  # 4 bytes, shared by the negations
    for k in range(negations):
        g.op(ts.Op.NEGATE, ["a", "zp", "zp"], f"n{k}", [1, 4], ts.DType.INT32)
    if add_input:
        g.op(ts.Op.ADD, ["n0", "x"], "s", [1, 4], ts.DType.INT32)
        g.output("s")
    else:
        for k in range(negations):
            g.output(f"n{k}")
    if abs_is_output:
        g.output("a")
    return g.bytes()


def _groups(buf: bytes) -> list[tuple[list[str], int]]:
    return [(g.ops, g.traffic_bytes) for g in iter_fused_groups(buf)]


def test_an_elementwise_operator_joins_only_as_the_only_reader() -> None:
    # the only reader: ABS and NEGATE run as one, reading x and zp, writing n0
    assert _groups(_abs_then(1)) == [(["ABS", "NEGATE"], 16 + 4 + 16)]
    # two readers of a: a is written once and read by each NEGATE
    assert _groups(_abs_then(2)) == [(["ABS"], 32), (["NEGATE"], 36), (["NEGATE"], 36)]
    # a block output is a reader too: a must reach memory
    assert _groups(_abs_then(1, abs_is_output=True)) == [(["ABS"], 32), (["NEGATE"], 36)]


def test_an_operator_with_two_variable_inputs_starts_a_group() -> None:
    # ADD reads n0 and x: not elementwise-with-constants, so it does not join;
    # x is read by both groups and counted by each
    buf = _abs_then(1, add_input=True)
    assert _groups(buf) == [(["ABS", "NEGATE"], 16 + 4 + 16), (["ADD"], 48)]
    stats = tosa_stats(buf)
    assert stats.fused_traffic_bytes == 36 + 48
    # unfused, NEGATE reads zp twice (input and output zero points)
    assert stats.traffic_bytes == 32 + 40 + 48


def test_an_elementwise_operator_on_a_block_input_starts_a_group() -> None:
    g = _Graph()
    g.input("x", [2, 2])
    clamp = ts.TosaSerializerAttribute()
    clamp.ClampAttribute([0], [1], ts.NanPropagationMode.PROPAGATE)
    g.op(ts.Op.CLAMP, ["x"], "y", [2, 2], attr=clamp)
    g.output("y")
    buf = g.bytes()
    assert _groups(buf) == [(["CLAMP"], 8)]
    assert tosa_stats(buf).fused_traffic_bytes == tosa_stats(buf).traffic_bytes == 8


def test_shape_operands_are_not_fused_traffic() -> None:
    # ADD(x, c) then RESHAPE: RESHAPE is not elementwise, so two groups;
    # its shape operand lives in the shape table and costs nothing
    assert _groups(_hand_built()) == [(["ADD"], 48), (["RESHAPE"], 32)]
    stats = tosa_stats(_hand_built())
    assert (stats.fused_groups, stats.fused_traffic_bytes) == (2, 80)


def test_a_lowered_int8_model_fuses_its_rescales() -> None:
    """Arm's INT8 lowering of a convolution + ReLU: every RESCALE and CLAMP joins a
    group, and the figures add up."""
    from pooling_support import CONV_INPUTS, ConvNet, lower_both

    buf = lower_both(ConvNet(), CONV_INPUTS, "TOSA-1.0+INT", int8=True).stock
    stats = tosa_stats(buf)
    groups = list(iter_fused_groups(buf))
    assert sum(g.traffic_bytes for g in groups) == stats.fused_traffic_bytes
    assert len(groups) == stats.fused_groups
    assert sum(len(g.ops) for g in groups) == stats.operators - stats.const_ops - stats.const_shape_ops
    convs = [g for g in groups if g.ops[0] == "CONV2D"]
    assert convs and all(g.ops[1] == "RESCALE" for g in convs)
    assert stats.fused_traffic_bytes < stats.traffic_bytes
