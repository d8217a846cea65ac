"""A small editable view of a TOSA flatbuffer and the RESCALE rewrites of
`benchmarks/rescale_rewrites.py`.

`load` reads a flatbuffer with tosa-tools' serializer (`tosa_serializer`) into
`Graph` (tensors with their data, operators with their attributes as plain
fields); `Graph.emit` writes it back. A load/emit round trip without edits
gives Vela the same work (same cycles) as the original bytes; the benchmark
checks that.

Rewrites (each returns how many places it changed):

* `merge_sibling_convs` (A): 1x1 CONV2Ds reading the same tensor with the
  same attributes and zero points, each read only by a RESCALE with the same
  rounding and zero points, become one CONV2D + one per-channel RESCALE +
  one SLICE per sibling. Every output channel is computed exactly as before,
  so the result is bit-exact. `skip_concat_fed` (A2) leaves out the siblings
  whose RESCALE output a CONCAT reads.
* `fold_requantize` (B): CONV2D -> RESCALE(int32->int8) ->
  RESCALE(int8->int32) -> ADD becomes CONV2D -> RESCALE(int32->int32) -> ADD
  with the product of the two scales (drops the int8 rounding and clamp: not
  bit-exact).
* `cast_residual` (C): a RESCALE(int8->int32, zero point 0, scale 2^e) into an
  ADD becomes a CAST; the ADD's other input RESCALE gets shift + e and the
  RESCALE after the ADD shift - e (the ADD runs at a scale 2^e coarser: not
  bit-exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import tosa_serializer as ts

from codec_tosa.serialization.tosa_copy import attribute_fields as _attribute_fields
from codec_tosa.serialization.tosa_copy import loaded
from codec_tosa.validation.rescale import multiplier_and_shift

_NUMPY = {ts.DType.INT8: np.int8, ts.DType.INT16: np.int16, ts.DType.INT32: np.int32,
          ts.DType.BOOL: np.uint8, ts.DType.FP32: np.float32}


@dataclass
class Tensor:
    name: str
    shape: list[int]
    dtype: Any  # ts.DType
    data: np.ndarray | None = None  # constants only


@dataclass
class Op:
    op: Any  # ts.Op
    inputs: list[str]
    outputs: list[str]
    attr: tuple[str, dict[str, Any]]  # (TosaSerializerAttribute method, {field: value})


@dataclass
class Graph:
    tensors: dict[str, Tensor]
    ops: list[Op]
    inputs: list[str]
    outputs: list[str]
    _fresh: int = 0

    def producers(self) -> dict[str, Op]:
        return {t: op for op in self.ops for t in op.outputs}

    def readers(self) -> dict[str, list[Op]]:
        found: dict[str, list[Op]] = {}
        for op in self.ops:
            for t in op.inputs:
                found.setdefault(t, []).append(op)
        return found

    def data(self, name: str) -> np.ndarray:
        d = self.tensors[name].data
        assert d is not None, f"{name} is not a constant"
        return d.ravel()

    def tensor(self, base: str, shape: list[int], dtype: Any) -> str:
        self._fresh += 1
        name = f"{base}_{self._fresh}"
        self.tensors[name] = Tensor(name, list(shape), dtype)
        return name

    def const(self, base: str, data: np.ndarray, dtype: Any) -> str:
        """A new CONST (CONST_SHAPE for dtype SHAPE) holding `data`."""
        shape_op = dtype == ts.DType.SHAPE
        name = self.tensor(base, [len(data)] if shape_op else list(data.shape), dtype)
        self.tensors[name].data = np.asarray(data)
        self.ops.append(Op(ts.Op.CONST_SHAPE if shape_op else ts.Op.CONST, [], [name],
                           ("ConstShapeAttribute" if shape_op else "ConstAttribute", {})))
        return name

    def copy_const(self, name: str) -> str:
        return self.const(name, self.data(name).copy(), self.tensors[name].dtype)

    def prune(self) -> None:
        """Drop operators nobody reads, then tensors no operator uses."""
        while True:
            read = self.readers()
            keep = [op for op in self.ops if any(t in read or t in self.outputs for t in op.outputs)]
            if len(keep) == len(self.ops):
                break
            self.ops = keep
        used = {t for op in self.ops for t in op.inputs + op.outputs} | set(self.inputs)
        self.tensors = {k: v for k, v in self.tensors.items() if k in used}

    def count(self, op: Any) -> int:
        return sum(o.op == op for o in self.ops)

    def emit(self) -> bytes:
        """Serialize (operators topologically sorted, constants first where read)."""
        ser = ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)
        for name in self.inputs:
            t = self.tensors[name]
            ser.addInputTensor(ts.TosaSerializerTensor(name, t.shape, t.dtype, data=None))
        block = ser.currRegion.currBasicBlock
        for op in _toposort(self.ops, set(self.inputs)):
            if op.op in (ts.Op.CONST, ts.Op.CONST_SHAPE):
                t = self.tensors[op.outputs[0]]
                assert t.data is not None
                values = [int(v) for v in t.data] if t.dtype == ts.DType.SHAPE else t.data
                ser.addConst(t.shape, t.dtype, values, name=t.name)
                continue
            for name in op.outputs:
                block.addTensor(name, self.tensors[name].shape, self.tensors[name].dtype)
            attr = ts.TosaSerializerAttribute()
            method, fields = op.attr
            getattr(attr, method)(*[fields[f] for f in _attribute_fields(method)])
            ser.addOperator(op.op, op.inputs, op.outputs, attr)
        for name in self.outputs:
            ser.addOutputTensor(block.tensors[name])
        return bytes(ser.serialize())


def _toposort(ops: list[Op], available: set[str]) -> list[Op]:
    done, out, pending = set(available), [], list(ops)
    while pending:
        ready = [op for op in pending if all(t in done for t in op.inputs)]
        if not ready:
            raise ValueError(f"cycle or undefined input at {pending[0].op} {pending[0].inputs}")
        for op in ready:
            out.append(op)
            done.update(op.outputs)
        pending = [op for op in pending if op not in ready]
    return out


def _constant(t: Any) -> np.ndarray | None:
    if t.data is None or len(t.data) == 0:
        return None
    raw = bytes(np.asarray(t.data, dtype=np.uint8))
    count = int(np.prod(t.shape)) if len(t.shape) else 1
    return np.frombuffer(raw, dtype=_NUMPY[t.dtype])[:count].reshape(t.shape).copy()


def load(buf: bytes) -> Graph:
    """The single-block flatbuffer `buf` as an editable Graph."""
    with loaded(buf) as ser:
        pass  # the serializer holds the graph once loaded
    assert len(ser.regions) == 1 and len(ser.regions[0].basicBlocks) == 1
    block = ser.regions[0].basicBlocks[0]
    tensors = {}
    for name in list(block.tensors):
        t = block.tensors[name]
        tensors[name] = Tensor(name, list(t.shape), t.dtype, _constant(t))
    for name in list(block.shapes):  # CONST_SHAPE outputs: int64 values
        s = block.getShapeByName(name)
        tensors[name] = Tensor(name, [int(s.rank)], ts.DType.SHAPE,
                               np.frombuffer(bytes(np.asarray(s.data, dtype=np.uint8)), dtype=np.int64).copy())
    ops = []
    for o in block.operators:
        a = o.attributes
        fields = {f: getattr(a, f) for f in dir(a) if not f.startswith("_")}
        ops.append(Op(o.op, list(o.inputs), list(o.outputs), (type(a).__name__[len("Tosa"):], fields)))
    return Graph(tensors, ops, list(block.inputs), list(block.outputs))


# RESCALE operands: input, multiplier, shift, input zero point, output zero point.
# CONV2D operands: input, weights, bias, input zero point, weight zero point.

def merge_sibling_convs(g: Graph, skip_concat_fed: bool = False) -> int:
    """(A) / (A2), see the module docstring. Returns the number of groups merged."""
    read = g.readers()
    groups: dict[tuple, list[tuple[Op, Op]]] = {}
    for conv in g.ops:
        if conv.op != ts.Op.CONV2D or g.tensors[conv.inputs[1]].shape[1:3] != [1, 1]:
            continue
        rs = read.get(conv.outputs[0], [])
        if len(rs) != 1 or rs[0].op != ts.Op.RESCALE or conv.outputs[0] in g.outputs:
            continue
        rescale = rs[0]
        if skip_concat_fed and any(r.op == ts.Op.CONCAT for r in read.get(rescale.outputs[0], [])):
            continue
        c, r = conv.attr[1], rescale.attr[1]
        key = (conv.inputs[0], tuple(c["pad"]), tuple(c["stride"]), tuple(c["dilation"]), str(c["acc_type"]),
               tuple(g.data(conv.inputs[3])), tuple(g.data(conv.inputs[4])),
               str(r["rounding_mode"]), r["scale32"], r["input_unsigned"], r["output_unsigned"],
               tuple(g.data(rescale.inputs[3])), tuple(g.data(rescale.inputs[4])),
               str(g.tensors[rescale.outputs[0]].dtype))
        groups.setdefault(key, []).append((conv, rescale))
    merged = 0
    for group in groups.values():
        if len(group) < 2:
            continue
        merged += 1
        first, first_rescale = group[0]
        couts = [g.tensors[c.inputs[1]].shape[0] for c, _ in group]

        def cat(operand: int, ops: list[Op]) -> np.ndarray:  # per channel, broadcasting per-tensor values
            return np.concatenate([np.broadcast_to(g.data(o.inputs[operand]), (n,)) if g.data(o.inputs[operand]).size == 1
                                   else g.data(o.inputs[operand]) for o, n in zip(ops, couts)])

        convs, rescales = [c for c, _ in group], [r for _, r in group]
        weights = np.concatenate([g.tensors[c.inputs[1]].data for c in convs], axis=0)  # type: ignore[misc]
        shape = list(g.tensors[first.outputs[0]].shape[:-1]) + [sum(couts)]
        acc = g.tensor("merged_conv", shape, g.tensors[first.outputs[0]].dtype)
        g.ops.append(Op(ts.Op.CONV2D, [first.inputs[0], g.const("merged_w", weights, g.tensors[first.inputs[1]].dtype),
                                       g.const("merged_b", cat(2, convs), g.tensors[first.inputs[2]].dtype),
                                       g.copy_const(first.inputs[3]), g.copy_const(first.inputs[4])],
                        [acc], first.attr))
        q = g.tensor("merged_rescale", shape, g.tensors[first_rescale.outputs[0]].dtype)
        g.ops.append(Op(ts.Op.RESCALE, [acc, g.const("merged_mult", cat(1, rescales), g.tensors[first_rescale.inputs[1]].dtype),
                                        g.const("merged_shift", cat(2, rescales), g.tensors[first_rescale.inputs[2]].dtype),
                                        g.copy_const(first_rescale.inputs[3]), g.copy_const(first_rescale.inputs[4])],
                        [q], (first_rescale.attr[0], dict(first_rescale.attr[1], per_channel=True))))
        offset = 0
        for (conv, rescale), n in zip(group, couts):  # each sibling's old output is now a SLICE of the merged one
            start = g.const("slice_start", np.array([0] * (len(shape) - 1) + [offset], np.int64), ts.DType.SHAPE)
            size = g.const("slice_size", np.array(shape[:-1] + [n], np.int64), ts.DType.SHAPE)
            g.ops.append(Op(ts.Op.SLICE, [q, start, size], [rescale.outputs[0]], ("SliceAttribute", {})))
            g.ops.remove(conv)
            g.ops.remove(rescale)
            offset += n
    g.prune()
    return merged


def _scale(multiplier: int, shift: int) -> Fraction:
    return Fraction(int(multiplier), 1 << int(shift))


def fold_requantize(g: Graph) -> int:
    """(B), see the module docstring. Returns the number of ADD inputs rewritten."""
    made, read, n = g.producers(), g.readers(), 0
    for add in [o for o in g.ops if o.op == ts.Op.ADD]:
        for k, operand in enumerate(add.inputs):
            r2 = made.get(operand)
            if r2 is None or r2.op != ts.Op.RESCALE or g.tensors[r2.inputs[0]].dtype != ts.DType.INT8:
                continue
            r1 = made.get(r2.inputs[0])
            if r1 is None or r1.op != ts.Op.RESCALE or len(read[r1.outputs[0]]) != 1:
                continue
            conv = made.get(r1.inputs[0])
            if conv is None or conv.op != ts.Op.CONV2D or g.data(r2.inputs[1]).size != 1:
                continue
            # the int8 zero point cancels; the int32 ends have zero point 0
            assert g.data(r1.inputs[4])[0] == g.data(r2.inputs[3])[0]
            assert g.data(r1.inputs[3])[0] == 0 and g.data(r2.inputs[4])[0] == 0
            channels = g.tensors[conv.outputs[0]].shape[-1]
            second = _scale(g.data(r2.inputs[1])[0], g.data(r2.inputs[2])[0])
            ms = [multiplier_and_shift(float(_scale(m, s) * second)) for m, s in
                  zip(np.broadcast_to(g.data(r1.inputs[1]), (channels,)), np.broadcast_to(g.data(r1.inputs[2]), (channels,)))]
            out = g.tensor("B_rescale32", g.tensors[conv.outputs[0]].shape, ts.DType.INT32)
            zero = np.array([0], np.int32)
            g.ops.append(Op(ts.Op.RESCALE, [conv.outputs[0],
                                            g.const("B_mult", np.array([m for m, _ in ms], np.int32), g.tensors[r1.inputs[1]].dtype),
                                            g.const("B_shift", np.array([s for _, s in ms], np.int8), g.tensors[r1.inputs[2]].dtype),
                                            g.const("B_izp", zero, ts.DType.INT32), g.const("B_ozp", zero, ts.DType.INT32)],
                            [out], (r1.attr[0], dict(r1.attr[1], per_channel=True))))
            add.inputs[k] = out
            n += 1
    g.prune()
    return n


def cast_residual(g: Graph) -> int:
    """(C), see the module docstring. Returns the number of ADDs rewritten."""
    made, read, n = g.producers(), g.readers(), 0
    for add in [o for o in g.ops if o.op == ts.Op.ADD]:
        for k, operand in enumerate(add.inputs):
            r = made.get(operand)
            if (r is None or r.op != ts.Op.RESCALE or g.tensors[r.inputs[0]].dtype != ts.DType.INT8
                    or g.data(r.inputs[3])[0] != 0 or g.data(r.inputs[1]).size != 1):
                continue
            f = _scale(g.data(r.inputs[1])[0], g.data(r.inputs[2])[0])
            if f.denominator != 1 or f.numerator & (f.numerator - 1):
                continue  # only a power of two moves by shifts alone
            e = f.numerator.bit_length() - 1
            other, after = made[add.inputs[1 - k]], read[add.outputs[0]]
            if other.op != ts.Op.RESCALE or len(after) != 1 or after[0].op != ts.Op.RESCALE:
                continue
            for op, d in ((other, e), (after[0], -e)):
                shift = g.data(op.inputs[2]).astype(np.int64) + d
                assert 2 <= shift.min() and shift.max() <= 62
                op.inputs[2] = g.const("C_shift", shift.astype(g.data(op.inputs[2]).dtype), g.tensors[op.inputs[2]].dtype)
            out = g.tensor("C_cast", g.tensors[operand].shape, ts.DType.INT32)
            g.ops.append(Op(ts.Op.CAST, [r.inputs[0]], [out], ("CastAttribute", {})))
            add.inputs[k] = out
            n += 1
            break
    g.prune()
    return n
