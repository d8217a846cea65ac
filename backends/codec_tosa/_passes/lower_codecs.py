"""Lower the plan's encodes and decodes as minimal, bit-exact TOSA sequences.

`MaterializeCodecsPass` writes every codec as PT2E ``quantize_per_tensor`` /
``dequantize_per_tensor`` nodes. Arm folds the ones around INT8 operators into
the operators; the leftovers are the codecs between FP32 and INT8 code, which
Arm would otherwise decompose into a 10-operator round-half-away-from-zero
chain (encode) and a 4-operator chain (decode) that disagree with
``torch.round``. This pass runs just before that decomposition and rewrites
them (docs/DESIGN.md, "Codec lowering"):

* encode (s, z):  MUL(1/s) -> CAST f32->i16 -> RESCALE i16->i8 (scale 1, output zp z)
* encode (s, 0):  MUL(1/s) -> CAST f32->i8
* decode (s, z):  RESCALE i8->i16 (scale 1, input zp z) -> CAST i16->f32 -> MUL(s)
* decode (s, 0):  CAST i8->f32 -> MUL(s)

In a float16 program an encode starts with CAST f16->f32 and a decode ends
with CAST f32->f16 (the dequantize's ``out_dtype``), as eager computes them.

Why these are exact against ``torch.ops.quantized_decomposed``:
quantize computes ``clamp(round(x * fp32(1/s)) + z, qmin, qmax)``; TOSA CAST
f32->int rounds to nearest-even and saturates, which is ``torch.round`` then
clamp; the int16 intermediate keeps ``round(x/s) + z`` from wrapping, and the
RESCALE with multiplier 2^30, shift 30 is the identity on integers, adding z
before it saturates to int8. Adding z in FP32 before the CAST is not exact
(``x/s + z`` rounds), so z is added in integers. Dequantize computes
``(fp32(c) - z) * fp32(s)``; ``c - z`` is an exact integer either way, so
taking it in int16 (RESCALE) before the CAST gives the same FP32 value and
moves 2 bytes per element less than CAST i8->f32 -> SUB in FP32.

A transcode (``dq -> q`` with every user a ``q``) is left for Arm's
``InsertRescalePass`` (one int8->int8 RESCALE). A ``dq`` read by both ``q``
nodes and FP32 operators is split first, so the transcodes still become
RESCALEs and only the FP32 readers get a decode.

Only codecs whose code range is the whole of int8 are rewritten: the CAST and
RESCALE saturate to [-128, 127] and there is no CLAMP in these sequences.
Others are left to Arm and counted in `LowerCodecsResult.left_to_arm`.

This module does not import Arm: the operator targets come in as `CodecOps`
(built by `codec_tosa.arm.adapter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.pass_base import CodecPass

# Set on every node this pass creates (value: "encode" / "decode"), so later
# passes and tests can tell our codec operators from Arm's.
CODEC_META_KEY = "codec_tosa_codec"

_I8_MIN, _I8_MAX = -128, 127


@dataclass(frozen=True)
class CodecOps:
    """The operator targets the pass reads and writes (edge and TOSA-dialect overloads)."""

    quantize: Any  # quantize_per_tensor.default
    dequantize: Any  # dequantize_per_tensor.default
    mul: Any  # aten.mul.Tensor
    full: Any  # aten.full.default (scalar operands as rank-matched constants)
    cast: Any  # a dtype conversion lowered to TOSA CAST (dim_order_ops._to_dim_order_copy)
    rescale: Any  # tosa.RESCALE(input, dtype, scales, in_zp, out_zp)


@dataclass
class LowerCodecsResult:
    encodes: int = 0
    decodes: int = 0
    split_transcodes: int = 0
    left_to_arm: int = 0


class LowerCodecsPass(CodecPass):
    """Rewrite leftover per-tensor q/dq nodes into the sequences above.

    `last` keeps what the last call did (for tests and reports).
    """

    def __init__(self, ops: CodecOps) -> None:
        super().__init__()
        self.ops = ops
        self.last = LowerCodecsResult()

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        result = LowerCodecsResult()
        graph = graph_module.graph
        for node in list(graph.nodes):
            if node.op != "call_function":
                continue
            if node.target == self.ops.dequantize:
                self._split_transcodes(graph, node, result)
                if node.users and not self._feeds_quantize_only(node):
                    self._lower(graph, node, result, encode=False)
            elif node.target == self.ops.quantize:
                source = node.args[0]
                is_transcode = isinstance(source, torch.fx.Node) and source.target == self.ops.dequantize
                if not is_transcode:
                    self._lower(graph, node, result, encode=True)
        self.last = result
        count = result.encodes + result.decodes + result.split_transcodes
        if count:
            graph.eliminate_dead_code()
        return self.done(graph_module, count)

    # ---- transcodes -------------------------------------------------------
    def _feeds_quantize_only(self, dq: torch.fx.Node) -> bool:
        return all(u.target == self.ops.quantize for u in dq.users)

    def _split_transcodes(self, graph: torch.fx.Graph, dq: torch.fx.Node,
                          result: LowerCodecsResult) -> None:
        """Give the q readers of a dq that FP32 operators also read their own dq."""
        q_users = [u for u in dq.users if u.target == self.ops.quantize]
        if not q_users or len(q_users) == len(dq.users):
            return
        with graph.inserting_after(dq):
            twin = graph.call_function(dq.target, dq.args, dict(dq.kwargs))
        twin.meta = dict(dq.meta)
        for q in q_users:
            q.replace_input_with(dq, twin)
        result.split_transcodes += 1

    # ---- encode / decode --------------------------------------------------
    def _lower(self, graph: torch.fx.Graph, node: torch.fx.Node, result: LowerCodecsResult,
               encode: bool) -> None:
        x, scale, zero_point, qmin, qmax, dtype = _qparams(node)
        if dtype != torch.int8 or (qmin, qmax) != (_I8_MIN, _I8_MAX):
            result.left_to_arm += 1
            return
        with graph.inserting_before(node):
            if encode:
                out = self._encode(graph, node, x, scale, zero_point)
                result.encodes += 1
            else:
                out = self._decode(graph, node, x, scale, zero_point)
                result.decodes += 1
        node.replace_all_uses_with(out)
        graph.erase_node(node)

    def _encode(self, graph: torch.fx.Graph, q: torch.fx.Node, x: torch.fx.Node,
                scale: float, zero_point: int) -> torch.fx.Node:
        val = _val(x)
        if val.dtype != torch.float32:
            # quantize_per_tensor takes a float16 input to FP32 first (exact), then as below
            val = val.to(torch.float32)
            x = self._new(graph, q, "encode", self.ops.cast, (x,), {"dtype": torch.float32}, val)
        # quantize_per_tensor multiplies by 1/s (a double rounded to fp32), it does not divide
        scaled = self._new(graph, q, "encode", self.ops.mul, (x, self._full(graph, q, val, 1.0 / scale)),
                           {}, val)
        if zero_point == 0:
            return self._new(graph, q, "encode", self.ops.cast, (scaled,), {"dtype": torch.int8},
                             val.to(torch.int8))
        wide = self._new(graph, q, "encode", self.ops.cast, (scaled,), {"dtype": torch.int16},
                         val.to(torch.int16))
        return self._new(graph, q, "encode", self.ops.rescale,
                         (wide, torch.int8, [1.0], 0, int(zero_point)), {}, val.to(torch.int8))

    def _decode(self, graph: torch.fx.Graph, dq: torch.fx.Node, c: torch.fx.Node,
                scale: float, zero_point: int) -> torch.fx.Node:
        val = _val(c).to(torch.float32)
        if zero_point != 0:
            # c - z in integers (exact, |c - z| <= 255 fits int16): 2 bytes per element
            # less than CAST -> SUB in FP32, same result
            c = self._new(graph, dq, "decode", self.ops.rescale, (c, torch.int16, [1.0], int(zero_point), 0),
                          {}, val.to(torch.int16))
        out = self._new(graph, dq, "decode", self.ops.cast, (c,), {"dtype": torch.float32}, val)
        out = self._new(graph, dq, "decode", self.ops.mul, (out, self._full(graph, dq, val, scale)),
                        {}, val)
        dtype = _val(dq).dtype  # the dequantize's out_dtype (float16 in a float16 program)
        if dtype != torch.float32:
            # eager multiplies a float16 (c - z) by s in FP32 and rounds once to
            # float16: the same FP32 product, then CAST (round to nearest even)
            out = self._new(graph, dq, "decode", self.ops.cast, (out,), {"dtype": dtype}, val.to(dtype))
        return out

    # ---- FX helpers -------------------------------------------------------
    def _full(self, graph: torch.fx.Graph, origin: torch.fx.Node, like: torch.Tensor,
              value: float) -> torch.fx.Node:
        shape = (1,) * like.dim()
        fake = like.new_full(shape, value, dtype=torch.float32)
        return self._new(graph, origin, None, self.ops.full, (shape, value), {"dtype": torch.float32},
                         fake)

    @staticmethod
    def _new(graph: torch.fx.Graph, origin: torch.fx.Node, role: str | None, target: Any,
             args: tuple[Any, ...], kwargs: dict[str, Any], val: torch.Tensor) -> torch.fx.Node:
        node = graph.call_function(target, args, kwargs)
        # debug locations follow the codec's q/dq; qparams must not (these run unquantised)
        node.meta = {k: v for k, v in origin.meta.items()
                     if k in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node")}
        node.meta["val"] = val
        if role is not None:
            node.meta[CODEC_META_KEY] = role
        return node


def _qparams(node: torch.fx.Node) -> tuple[torch.fx.Node, float, int, int, int, torch.dtype]:
    x, scale, zero_point, qmin, qmax, dtype = node.args[:6]
    return x, float(scale), int(zero_point), int(qmin), int(qmax), dtype


def _val(node: torch.fx.Node) -> torch.Tensor:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise ValueError(f"node {node.name}: no meta['val'] tensor to derive codec shapes from")
    return val
