"""Counting a TOSA flatbuffer: operators, constants, tensors, traffic, payload."""

from __future__ import annotations

import pytest
import tosa_serializer as ts
from tosa.DType import DType

from codec_tosa.serialization.tosa_stats import (
    TosaStats,
    iter_constants,
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
