"""Integer convolutions the TOSA reference model runs as MATMUL, for validation's own runs.

Arm lowers every Linear to a 1x1 CONV2D, and a vision transformer's patch
embedding is a convolution whose kernel is its stride. The reference model's
CONV2D is a naive loop: on SigLIP at one layer it was 83% of a run (issue 51),
where its MATMUL of the same products is about seven times faster. Such a
convolution is a matrix product: its input cut into kernel-sized tiles (a
RESHAPE and a TRANSPOSE; none for 1x1), times the weights as [C_in*KH*KW, C_out],
plus the bias.

`faster` writes that copy of a graph. It is only ever *run*, by the reference
stage (`artefact_rounding.ArtefactRuns`) to learn which way the artefact rounds
its ambiguous codes; the artefact itself and every check validate makes of it
run the graph as written. Integer products and sums are exact, so the copy's
outputs are the original's bit for bit (tests/tools/test_matmul_convolutions.py,
on the reference model on held-out inputs); and a copy that differed could only
make validate fail against the real artefact, never pass it.

Only INT8 x INT8 -> INT32 convolutions are taken (an INT16 one accumulates in
INT48, which no MATMUL does), unpadded, undilated, with the kernel equal to the
stride and the input a whole number of tiles.
"""

from __future__ import annotations

from typing import Any

import tosa_serializer as ts

from codec_tosa.serialization.tosa_copy import BlockWriter, attribute, rewritten
from codec_tosa.serialization.tosa_stats import blocks


def _tiles(writer: BlockWriter, op: Any) -> tuple[list[int], list[int], int] | None:
    """(input NHWC, kernel [KH, KW], output channels) of a CONV2D this module
    rewrites, else None."""
    if op.op != ts.Op.CONV2D or len(op.inputs) != 5 or len(op.outputs) != 1:
        return None
    tensors = writer.source.tensors
    x, w, b = (tensors[n] for n in op.inputs[:3])
    y = tensors[op.outputs[0]]
    a = op.attributes
    if (x.dtype, w.dtype, b.dtype, y.dtype, a.acc_type) != (ts.DType.INT8,) * 2 + (ts.DType.INT32,) * 3:
        return None
    if not {op.inputs[1], op.inputs[2]} <= writer.constants or len(x.shape) != 4 or len(w.shape) != 4:
        return None  # a weight computed in the graph stays a convolution
    n, h, wd, c = x.shape
    oc, kh, kw, wc = w.shape
    if (list(a.pad) != [0, 0, 0, 0] or list(a.dilation) != [1, 1] or list(a.stride) != [kh, kw]
            or wc != c or h % kh or wd % kw or list(y.shape) != [n, h // kh, wd // kw, oc]
            or b.shape[0] not in (1, oc)):
        return None
    return [n, h, wd, c], [kh, kw], oc


def _as_matmul(writer: BlockWriter, op: Any) -> bool:
    """A `tosa_copy.Replacement`: a convolution `_tiles` takes, written as
    [tiles, KH*KW*C] x [KH*KW*C, OC] + bias, reshaped to its own output."""
    found = _tiles(writer, op)
    if found is None:
        return False
    (n, h, wd, c), (kh, kw), oc = found
    x_name, w_name, b_name, x_zp, w_zp = op.inputs
    rows, depth = n * (h // kh) * (wd // kw), kh * kw * c
    i8, i32 = ts.DType.INT8, ts.DType.INT32
    rows_in = x_name
    if (kh, kw) != (1, 1):  # [N, H/KH, KH, W/KW, KW, C] -> [N, H/KH, W/KW, KH, KW, C]
        split = [n, h // kh, kh, wd // kw, kw, c]
        cut = writer.tensor(x_name, split, i8)
        writer.operator(ts.Op.RESHAPE, [x_name, writer.shape("split", split)], [cut], attribute("ReshapeAttribute"))
        rows_in = writer.tensor(x_name, [n, h // kh, wd // kw, kh, kw, c], i8)
        writer.operator(ts.Op.TRANSPOSE, [cut], [rows_in], attribute("TransposeAttribute", [0, 1, 3, 2, 4, 5]))
    a = writer.tensor(x_name, [1, rows, depth], i8)
    writer.operator(ts.Op.RESHAPE, [rows_in, writer.shape("rows", [1, rows, depth])], [a],
                    attribute("ReshapeAttribute"))
    # OHWI weights flattened in the tiles' (KH, KW, C) order, transposed to [depth, OC]
    weights = writer.values(w_name)[:oc * depth].reshape(oc, depth).T
    b = writer.const(w_name, weights.reshape(1, depth, oc), i8)
    # per-tensor zero points: the reference model reads element 0 of each (Arm may store more)
    a_zp = writer.const(x_zp, writer.values(x_zp)[:1], i8)
    b_zp = writer.const(w_zp, writer.values(w_zp)[:1], i8)
    product = writer.tensor(op.outputs[0], [1, rows, oc], i32)
    writer.operator(ts.Op.MATMUL, [a, b, a_zp, b_zp], [product], attribute("MatMulAttribute"))
    bias = writer.values(b_name)
    bias = bias[:oc] if bias.size >= oc else bias[:1]
    biased = writer.tensor(op.outputs[0], [1, rows, oc], i32)
    writer.operator(ts.Op.ADD, [product, writer.const(b_name, bias.reshape(1, 1, -1), i32)], [biased],
                    attribute("AddAttribute"))
    writer.operator(ts.Op.RESHAPE, [biased, writer.shape("out", [n, h // kh, wd // kw, oc])], op.outputs,
                    attribute("ReshapeAttribute"))
    return True


# Below this many multiply-accumulates in a graph's INT8 convolutions, a
# reference-model run saves less than writing the copy costs (about 3.5 ns a MAC saved
# on SigLIP, against 0.1-0.3 s to write a small graph and its program again)
WORTH_MACS = 50_000_000


def candidate_macs(payload: bytes) -> int:
    """The multiply-accumulates of the INT8 CONV2Ds of a graph (a cheap look at shapes
    first, before `faster` writes the graph again)."""
    macs = 0
    for tensors, operators in blocks(payload):
        for o in operators:
            if o.op != "CONV2D" or len(o.inputs) < 2 or tensors[o.inputs[0]].dtype != "INT8":
                continue
            w, y = tensors[o.inputs[1]].shape, tensors[o.outputs[0]].shape
            if len(w) == 4 and len(y) == 4:
                macs += y[0] * y[1] * y[2] * w[0] * w[1] * w[2] * w[3]
    return macs


def faster(payload: bytes, outputs: tuple[str, ...] | list[str] = ()) -> bytes:
    """`payload` with each convolution `_tiles` takes run as a MATMUL, and `outputs`
    added to its main block's outputs (`tosa_copy.rewritten`). Raises
    `tosa_copy.NotCopyable` for a graph it cannot write again."""
    return rewritten(payload, _as_matmul if candidate_macs(payload) else None, outputs)


__all__ = ["WORTH_MACS", "candidate_macs", "faster"]
