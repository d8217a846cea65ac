"""Read a TOSA flatbuffer and count what is in it.

The one place that turns TOSA flatbuffer bytes into numbers (operators,
constants, tensors, traffic). It reads the flatbuffer with the generated
`tosa` Python package shipped in tosa-tools, so it needs no serializer and
works on any delegate payload, stock or ours.

Traffic is the sum, over every operator that is not CONST or CONST_SHAPE, of
the bytes of its input and output *tensors* at their TOSA dtypes (weights
read by a CONV2D count; shape operands, which live in the block's shape table
and are metadata, do not). Tensors with a dynamic dimension (-1) contribute
nothing and are counted in `dynamic_tensors` instead.

Fused traffic (`fused_traffic_bytes`) counts the same bytes as if chains of
elementwise operators ran inside the operator that feeds them (docs/DESIGN.md,
"Fused traffic"): an elementwise operator (RESCALE, CAST, CLAMP, IDENTITY and
the unary, binary and SELECT operators) whose inputs are all constants but
one, and which is the only reader of that one input (a block output counts as
a reader), joins the group of the operator producing it. Each group reads its
external input tensors once (constants included, as weights are above) and
writes the tensors it produces that another group reads or that are block
outputs; bytes inside a group never reach memory and do not count.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterator

import numpy as np
from tosa.DType import DType
from tosa.Op import Op
from tosa.TosaGraph import TosaGraph

CONST_OPS = ("CONST", "CONST_SHAPE")

# Storage bits per element of each TOSA dtype (SHAPE elements are int64).
_DTYPE_BITS: dict[int, int] = {
    DType.BOOL: 8,
    DType.INT4: 4,
    DType.INT8: 8,
    DType.INT16: 16,
    DType.INT32: 32,
    DType.INT48: 48,
    DType.INT64: 64,
    DType.FP32: 32,
    DType.FP16: 16,
    DType.BF16: 16,
    DType.SHAPE: 64,
    DType.FP8E4M3: 8,
    DType.FP8E5M2: 8,
    DType.FP8UE8M0: 8,
    DType.FP6E2M3: 6,
    DType.FP6E3M2: 6,
    DType.FP4E2M1: 4,
    DType.MXINT8: 8,
}

_OP_NAMES: dict[int, str] = {
    value: name for name, value in vars(Op).items() if not name.startswith("_")
}
_DTYPE_NAMES: dict[int, str] = {
    value: name for name, value in vars(DType).items() if not name.startswith("_")
}


def op_name(code: int) -> str:
    """TOSA operator name for an opcode (``UNKNOWN_<n>`` if the schema lacks it)."""
    return _OP_NAMES.get(code, f"UNKNOWN_{code}")


def dtype_name(code: int) -> str:
    return _DTYPE_NAMES.get(code, f"UNKNOWN_{code}")


def tensor_nbytes(shape: list[int], dtype: int) -> int | None:
    """Bytes of a tensor at its TOSA dtype; None when a dimension is dynamic."""
    elements = 1
    for dim in shape:
        if dim < 0:
            return None
        elements *= dim
    return (elements * _DTYPE_BITS.get(dtype, 8) + 7) // 8


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: list[int]
    dtype: str
    nbytes: int | None  # None: dynamic shape
    data_bytes: int  # serialized payload (constants only)


@dataclass(frozen=True)
class OperatorInfo:
    region: str
    block: str
    op: str
    inputs: list[str]
    outputs: list[str]
    traffic_bytes: int  # 0 for CONST / CONST_SHAPE


@dataclass
class TosaStats:
    """Counts for one TOSA flatbuffer."""

    payload_bytes: int = 0
    regions: int = 0
    blocks: int = 0
    operators: int = 0
    operators_by_type: dict[str, int] = field(default_factory=dict)
    const_ops: int = 0
    const_bytes: int = 0  # serialized data of CONST outputs
    const_shape_ops: int = 0
    const_shape_bytes: int = 0  # serialized data of CONST_SHAPE outputs
    tensors: int = 0
    shapes: int = 0
    dynamic_tensors: int = 0
    traffic_bytes: int = 0
    traffic_by_op: dict[str, int] = field(default_factory=dict)
    # elementwise chains fused into their producers (see the module docstring);
    # a group's bytes are filed under its first operator
    fused_groups: int = 0
    fused_traffic_bytes: int = 0
    fused_traffic_by_op: dict[str, int] = field(default_factory=dict)

    @property
    def constant_bytes(self) -> int:
        """CONST plus CONST_SHAPE data bytes."""
        return self.const_bytes + self.const_shape_bytes

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TosaStats":
        return cls(**json.loads(text))


def _graph(buf: bytes) -> TosaGraph:
    data = bytearray(buf)
    try:
        return TosaGraph.GetRootAs(data, 0)
    except Exception as exc:  # flatbuffers raises assorted errors on garbage
        raise ValueError(f"not a TOSA flatbuffer ({len(buf)} bytes): {exc}") from exc


def _decode(name: bytes | None) -> str:
    return name.decode() if name is not None else ""


def _block_tensors(block) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        shape = [int(d) for d in (t.ShapeAsNumpy() if t.ShapeLength() else [])]
        name = _decode(t.Name())
        tensors[name] = TensorInfo(
            name=name,
            shape=shape,
            dtype=dtype_name(t.Type()),
            nbytes=tensor_nbytes(shape, t.Type()),
            data_bytes=t.DataLength(),
        )
    return tensors


def _block_shapes(block) -> dict[str, int]:
    """Shape-table entries of a block: name -> serialized data bytes."""
    shapes: dict[str, int] = {}
    for i in range(block.ShapesLength()):
        s = block.Shapes(i)
        shapes[_decode(s.Name())] = s.DataLength()
    return shapes


def _traffic(op: str, names: list[str], tensors: dict[str, TensorInfo]) -> int:
    """Bytes an operator moves: its input and output tensors (0 for constants)."""
    if op in CONST_OPS:
        return 0
    total = 0
    for name in names:
        info = tensors.get(name)
        if info is not None and info.nbytes is not None:
            total += info.nbytes
    return total


def _walk(graph: TosaGraph) -> Iterator[tuple[str, str, object]]:
    for r in range(graph.RegionsLength()):
        region = graph.Regions(r)
        for b in range(region.BlocksLength()):
            block = region.Blocks(b)
            yield _decode(region.Name()), _decode(block.Name()), block


def _operators(region: str, block_name: str, block, tensors) -> Iterator[OperatorInfo]:
    for o in range(block.OperatorsLength()):
        op = block.Operators(o)
        name = op_name(op.Op())
        inputs = [_decode(op.Inputs(i)) for i in range(op.InputsLength())]
        outputs = [_decode(op.Outputs(i)) for i in range(op.OutputsLength())]
        yield OperatorInfo(
            region=region,
            block=block_name,
            op=name,
            inputs=inputs,
            outputs=outputs,
            traffic_bytes=_traffic(name, inputs + outputs, tensors),
        )


@dataclass(frozen=True)
class ConstantInfo:
    region: str
    block: str
    op: str  # CONST or CONST_SHAPE
    name: str
    dtype: str
    shape: list[int]
    data: bytes


def iter_constants(buf: bytes) -> Iterator[ConstantInfo]:
    """Every CONST / CONST_SHAPE output with its serialized data, in order."""
    for region, block_name, block in _walk(_graph(buf)):
        tensors = {}
        for i in range(block.TensorsLength()):
            t = block.Tensors(i)
            tensors[_decode(t.Name())] = t
        shapes = {}
        for i in range(block.ShapesLength()):
            sh = block.Shapes(i)
            shapes[_decode(sh.Name())] = sh
        for o in range(block.OperatorsLength()):
            op = block.Operators(o)
            name = op_name(op.Op())
            if name not in CONST_OPS:
                continue
            for j in range(op.OutputsLength()):
                out = _decode(op.Outputs(j))
                if out in tensors:
                    t = tensors[out]
                    shape = [int(d) for d in t.ShapeAsNumpy()] if t.ShapeLength() else []
                    data = t.DataAsNumpy().tobytes() if t.DataLength() else b""
                    yield ConstantInfo(
                        region, block_name, name, out, dtype_name(t.Type()), shape, data
                    )
                else:  # a CONST_SHAPE output lives in the shape table: [rank]
                    sh = shapes[out]
                    data = sh.DataAsNumpy().tobytes() if sh.DataLength() else b""
                    yield ConstantInfo(region, block_name, name, out, "SHAPE", [sh.Rank()], data)


def tosa_version(buf: bytes) -> tuple[int, int, int, bool]:
    """The TOSA specification version a flatbuffer declares: (major, minor, patch, draft)."""
    v = _graph(buf).Version()
    if v is None:
        raise ValueError("TOSA flatbuffer declares no version")
    return int(v._Major()), int(v._Minor()), int(v._Patch()), bool(v._Draft())


def entry_io_counts(buf: bytes) -> tuple[int, int]:
    """(inputs, outputs) of the block a runner executes: the main (first)
    region's first block, as the reference model's serialization handler picks it."""
    graph = _graph(buf)
    if not graph.RegionsLength() or not graph.Regions(0).BlocksLength():
        raise ValueError("TOSA flatbuffer has no main block")
    block = graph.Regions(0).Blocks(0)
    return block.InputsLength(), block.OutputsLength()


def entry_io_tensors(buf: bytes) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The inputs and outputs of the block a runner executes (as `entry_io_counts`
    picks it), in the block's declared order: the order in which the reference
    model takes and returns them and the C++ runtime backend records them."""
    graph = _graph(buf)
    if not graph.RegionsLength() or not graph.Regions(0).BlocksLength():
        raise ValueError("TOSA flatbuffer has no main block")
    block = graph.Regions(0).Blocks(0)
    tensors = _block_tensors(block)
    inputs = [tensors[_decode(block.Inputs(i))] for i in range(block.InputsLength())]
    outputs = [tensors[_decode(block.Outputs(i))] for i in range(block.OutputsLength())]
    return inputs, outputs


def blocks(buf: bytes) -> Iterator[tuple[dict[str, TensorInfo], list[OperatorInfo]]]:
    """Each block's tensors by name and its operators, in flatbuffer order."""
    for region, block_name, block in _walk(_graph(buf)):
        block_tensors = _block_tensors(block)
        yield block_tensors, list(_operators(region, block_name, block, block_tensors))


def stored_bytes(buf: bytes) -> dict[str, np.ndarray]:
    """The bytes each tensor of the first block stores (uint8, read in place: the
    serializer's own reader copies them into a Python list at every read)."""
    _, _, block = next(_walk(_graph(buf)))
    out: dict[str, np.ndarray] = {}
    for i in range(block.TensorsLength()):
        t = block.Tensors(i)
        if t.DataLength():
            out[_decode(t.Name())] = t.DataAsNumpy()
    return out


def tensors(buf: bytes) -> dict[str, TensorInfo]:
    """Every tensor of every block, by name."""
    return {name: t for block_tensors, _ in blocks(buf) for name, t in block_tensors.items()}


def iter_operators(buf: bytes) -> Iterator[OperatorInfo]:
    """Every operator of every block, in flatbuffer order, with its traffic."""
    for region, block_name, block in _walk(_graph(buf)):
        yield from _operators(region, block_name, block, _block_tensors(block))


def rescale_neighbours(buf: bytes) -> tuple[Counter[str], Counter[str]]:
    """RESCALEs counted by the operator feeding them and by their readers
    (``input``/``output`` for graph inputs and outputs; several readers joined by ``+``)."""
    fed_by: Counter[str] = Counter()
    read_by: Counter[str] = Counter()
    ops = list(iter_operators(buf))
    producer = {t: o.op for o in ops for t in o.outputs}
    readers: dict[str, list[str]] = {}
    for o in ops:
        for t in o.inputs:
            readers.setdefault(t, []).append(o.op)
    for o in ops:
        if o.op == "RESCALE":
            fed_by[producer.get(o.inputs[0], "input")] += 1
            read_by["+".join(sorted(readers.get(o.outputs[0], ["output"])))] += 1
    return fed_by, read_by


# Operators that compute each output element from the same element of their
# inputs, so a chain of them can run inside the operator that feeds it.
ELEMENTWISE_OPS = frozenset({
    "RESCALE", "CAST", "CLAMP", "IDENTITY", "TABLE",
    # unary
    "ABS", "BITWISE_NOT", "CEIL", "CLZ", "COS", "ERF", "EXP", "FLOOR", "LOG",
    "LOGICAL_NOT", "NEGATE", "RECIPROCAL", "RSQRT", "SIGMOID", "SIN", "TANH",
    # binary
    "ADD", "ARITHMETIC_RIGHT_SHIFT", "BITWISE_AND", "BITWISE_OR", "BITWISE_XOR",
    "EQUAL", "GREATER", "GREATER_EQUAL", "INTDIV", "LOGICAL_AND",
    "LOGICAL_LEFT_SHIFT", "LOGICAL_OR", "LOGICAL_RIGHT_SHIFT", "LOGICAL_XOR",
    "MAXIMUM", "MINIMUM", "MUL", "POW", "SUB",
    # ternary, fused only when two of its inputs are constants like the others
    "SELECT",
})


@dataclass(frozen=True)
class FusedGroup:
    """Operators that run as one: a producer and the elementwise chain it feeds."""

    region: str
    block: str
    ops: list[str]  # operator names, in flatbuffer order
    inputs: list[str]  # tensors read from outside the group (constants too)
    outputs: list[str]  # tensors written: read by another group, or block outputs
    traffic_bytes: int


def _fused_groups(region: str, block_name: str, block, tensors: dict[str, TensorInfo],
                  shapes: dict[str, int]) -> list[FusedGroup]:
    every = list(_operators(region, block_name, block, tensors))
    ops = [o for o in every if o.op not in CONST_OPS]
    constant = set(shapes) | {name for o in every if o.op in CONST_OPS for name in o.outputs}
    block_outputs = {_decode(block.Outputs(i)) for i in range(block.OutputsLength())}
    producer = {name: i for i, o in enumerate(ops) for name in o.outputs}
    readers: dict[str, set[int]] = {}
    for i, o in enumerate(ops):
        for name in o.inputs:
            readers.setdefault(name, set()).add(i)

    group_of: list[int] = []
    members: list[list[int]] = []
    for i, o in enumerate(ops):
        variable = [name for name in o.inputs if name not in constant]
        joins = (o.op in ELEMENTWISE_OPS and len(variable) == 1 and variable[0] in producer
                 and readers[variable[0]] == {i} and variable[0] not in block_outputs)
        if joins:
            g = group_of[producer[variable[0]]]
        else:
            g = len(members)
            members.append([])
        group_of.append(g)
        members[g].append(i)

    def nbytes(name: str) -> int:
        info = tensors.get(name)  # shape-table operands are metadata: not in `tensors`
        return (info.nbytes or 0) if info is not None else 0

    groups = []
    for g, idx in enumerate(members):
        inside = {name for i in idx for name in ops[i].outputs}
        inputs = list(dict.fromkeys(name for i in idx for name in ops[i].inputs
                                    if name not in inside and name in tensors))
        outputs = [name for i in idx for name in ops[i].outputs
                   if name in block_outputs or any(group_of[r] != g for r in readers.get(name, ()))]
        groups.append(FusedGroup(region, block_name, [ops[i].op for i in idx], inputs, outputs,
                                 sum(map(nbytes, inputs)) + sum(map(nbytes, outputs))))
    return groups


def iter_fused_groups(buf: bytes) -> Iterator[FusedGroup]:
    """Every fused group of every block (the unit of `fused_traffic_bytes`)."""
    for region, block_name, block in _walk(_graph(buf)):
        yield from _fused_groups(region, block_name, block, _block_tensors(block), _block_shapes(block))
def tosa_stats(buf: bytes) -> TosaStats:
    """Count operators, constants, tensors and traffic of a TOSA flatbuffer.

    Raises ValueError on a payload that is not a (complete) TOSA flatbuffer."""
    try:
        return _tosa_stats(buf)
    except ValueError:
        raise
    except Exception as exc:  # flatbuffers reads garbage with struct/index/decode errors
        raise ValueError(f"not a TOSA flatbuffer ({len(buf)} bytes): {type(exc).__name__}: {exc}") from None


def _tosa_stats(buf: bytes) -> TosaStats:
    graph = _graph(buf)
    stats = TosaStats(payload_bytes=len(buf), regions=graph.RegionsLength())
    by_type: Counter[str] = Counter()
    traffic_by_op: Counter[str] = Counter()
    fused_by_op: Counter[str] = Counter()
    for region, block_name, block in _walk(graph):
        stats.blocks += 1
        tensors = _block_tensors(block)
        shapes = _block_shapes(block)
        stats.tensors += len(tensors)
        stats.shapes += len(shapes)
        stats.dynamic_tensors += sum(1 for t in tensors.values() if t.nbytes is None)
        for info in _operators(region, block_name, block, tensors):
            by_type[info.op] += 1
            if info.op == "CONST":
                stats.const_ops += 1
                stats.const_bytes += sum(
                    tensors[n].data_bytes for n in info.outputs if n in tensors
                )
            elif info.op == "CONST_SHAPE":
                stats.const_shape_ops += 1
                stats.const_shape_bytes += sum(shapes.get(n, 0) for n in info.outputs)
            else:
                traffic_by_op[info.op] += info.traffic_bytes
                stats.traffic_bytes += info.traffic_bytes
        for group in _fused_groups(region, block_name, block, tensors, shapes):
            stats.fused_groups += 1
            stats.fused_traffic_bytes += group.traffic_bytes
            fused_by_op[group.ops[0]] += group.traffic_bytes
    stats.operators = sum(by_type.values())
    stats.operators_by_type = dict(sorted(by_type.items()))
    stats.traffic_by_op = dict(sorted(traffic_by_op.items()))
    stats.fused_traffic_by_op = dict(sorted(fused_by_op.items()))
    return stats
