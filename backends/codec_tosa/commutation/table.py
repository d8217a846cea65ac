"""The commutation table: for each operator, what its INT8 variant encodes.

One row per operator target. Port names are the operator schema's tensor
argument names (`input`, `tensors`, `self`, ...) and `out` (every output) or
`out.K` (output K). A row lists:

* `policy`: the first policy that selects the INT8 variant (None: FP32 only);
* `encoded`: the ports that carry codes in the INT8 variant;
* `blocks`: groups of encoded ports that must share one codec parameter set
  (every encoded port not in a block is a trivial block of its own);
* `weights`: encoded input ports whose constant operands (parameters) are
  encoded offline, per channel, with no runtime codec.

and the operator's facts for the INT8 lowering, beside the variant they
serve (docs/DESIGN.md, "Operator facts"):

* `weight_axis`: the axis of the per-channel weight scales (None: one scale
  per tensor, as Arm's MATMUL rescale needs);
* `out_channel_axis`: the axis of the output that those channels are (a
  convolution's 1, a linear's last), which the weight's channel count must match;
* `bias`, `bias_scale_of`: the argument stored as int32 codes at scale
  ``s(bias_scale_of) * s(weight)``, and the activation argument that is;
* `int8_lowering`: why Arm's TOSA lowering cannot take the operator with
  encoded ports (None: it can); the compiler keeps such operators FP32;
* `int8_refused_if`: boolean arguments that, when true, keep it FP32 too;
* `accumulates`: the INT8 kernel sums products into an int32 accumulator at
  scale ``s(bias_scale_of) * s(weight)`` and requantises it with a RESCALE;
  at an integer target, an output of it that only the program output reads
  leaves the delegate as that accumulator instead (docs/DESIGN.md,
  "Accumulator outputs");
* `averages`: the INT8 kernel averages its input over a window into an output
  of the input's theta (TOSA's AVG_POOL2D has no scale), so the output's
  precision is the input's: at ``split_chains`` a transcode may sit in front of
  it, leaving its input narrower than its output (docs/DESIGN.md, "Precision
  per domain");
* `fuses_activation`: Arm's INT8 lowering folds a following relu (or
  relu6-style hardtanh) into the operator's output RESCALE
  (`FuseQuantizedActivationPass`) when nothing quantizes the value between
  them, which is how Arm's quantizer annotates such a pair; `CodecQuantizer`
  annotates it the same way;
* `int16`: Arm's INT lowering (TOSA-1.0+INT+int16, Ethos-U) takes the operator
  with INT16 codes on its activation ports, and the simulation reproduces it
  bit for bit (tests/test_precision.py lowers each family of such rows at
  int16 on the reference model); a domain any other operator reads or writes stays INT8
  (docs/DESIGN.md, "Precision per domain");
* `int4`: Arm's INT lowering (TOSA-1.0+INT+int4, Ethos-U) stores the operator's
  weight as a TOSA INT4 constant when its quantize has Arm's a8w4 range [-7, 7]
  and its activation input is INT8 (TOSA has no int16 x int4 convolution), and
  Vela encodes it at 4 bits (tests/test_precision.py lowers each such row with
  INT4 weights on the reference model);
* `int8_kernels`: the integer back ends other than Arm's (whose own
  quantizer says which operators its INT flow takes) that run this operator
  on codes with the row's encoded ports, each a `Kernel`: ``xnnpack`` for
  XNNPACK's static INT8 kernels (`CodecQuantizer` for XNNPACK). A kernel
  names the activations it folds into its output when nothing is quantized
  between them (`fuses`) and the arguments it takes only at some values
  (`requires`); an operator without a kernel for the target stays FP32 there.

A user table's row inherits the facts of the built-in row for its operator
unless it states them.

Operators missing from the table are FP32, with one warning listing them.
Edge-dialect `*_copy` spellings are listed beside their core-ATen names.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from codec_tosa.commutation.policy import PolicyOrder

OUT = "out"


_FACT_KEYS = ("weight_axis", "out_channel_axis", "bias", "bias_scale_of", "int8_lowering", "int8_refused_if",
              "accumulates", "averages", "fuses_activation", "int16", "int4", "int8_kernels")


@dataclass(frozen=True)
class Kernel:
    """An INT8 kernel of an integer back end (`Row.int8_kernels`): `backend` runs the
    operator on codes when each argument named in `requires` has one of its listed
    values (an omitted argument: its schema default), and folds an activation named
    in `fuses` (an operator target) that only it reads into its output range when
    nothing is quantized between them."""

    backend: str
    fuses: tuple[str, ...] = ()
    requires: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def refusal(self, argument: Callable[[str], Any]) -> str | None:
        """Why the kernel does not take the operator called with `argument(name)`."""
        for name, allowed in self.requires:
            value = argument(name)
            value = list(value) if isinstance(value, (list, tuple)) else value
            if not any(value == (list(a) if isinstance(a, (list, tuple)) else a) for a in allowed):
                return f"{self.backend}'s INT8 kernel takes {name} in {list(allowed)} only (got {value!r})"
        return None

    def to_json(self) -> dict[str, Any]:
        return {"fuses": list(self.fuses),
                "requires": {name: [list(a) if isinstance(a, tuple) else a for a in allowed]
                             for name, allowed in self.requires}}

    @staticmethod
    def from_json(backend: str, d: Mapping[str, Any]) -> "Kernel":
        unknown = set(d) - {"fuses", "requires"}
        if unknown:
            raise ValueError(f"int8_kernels {backend!r}: unknown keys {sorted(unknown)}")
        requires = d.get("requires", {})
        if not isinstance(requires, Mapping):
            raise ValueError(f"int8_kernels {backend!r}: requires must map arguments to lists of values")
        return Kernel(backend, tuple(d.get("fuses", ())),
                      tuple((str(k), tuple(tuple(a) if isinstance(a, list) else a for a in v))
                            for k, v in requires.items()))


@dataclass(frozen=True)
class Row:
    target: str
    policy: str | None = None
    encoded: tuple[str, ...] = ()
    blocks: tuple[tuple[str, ...], ...] = ()
    weights: tuple[str, ...] = ()
    # operator facts (see the module docstring)
    weight_axis: int | None = None
    out_channel_axis: int | None = None
    bias: str | None = None
    bias_scale_of: str | None = None
    int8_lowering: str | None = None
    int8_refused_if: tuple[str, ...] = ()
    accumulates: bool = False
    averages: bool = False
    fuses_activation: bool = False
    int16: bool = False
    int4: bool = False
    int8_kernels: tuple[Kernel, ...] = ()

    def kernel(self, backend: str) -> Kernel | None:
        """The INT8 kernel `backend` runs this operator with (None: it keeps it FP32)."""
        return next((k for k in self.int8_kernels if k.backend == backend), None)

    def int8_refusal(self, argument: Callable[[str], Any]) -> str | None:
        """Why this operator, called with `argument(name)`, stays FP32 in the lowering."""
        if self.int8_lowering is not None:
            return self.int8_lowering
        for name in self.int8_refused_if:
            if argument(name):
                return f"Arm's TOSA lowering cannot take it with encoded ports when {name} is true"
        return None

    @property
    def moves_codes(self) -> bool:
        """Its INT8 variant only moves codes (layout operators, cat): every encoded
        port in one block, no weight, no arithmetic on the codes."""
        return (bool(self.encoded) and not self.weights and len(self.blocks) == 1
                and set(self.blocks[0]) == set(self.encoded))

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "policy": self.policy,
            "encoded": list(self.encoded),
            "blocks": [list(b) for b in self.blocks],
            "weights": list(self.weights),
            "weight_axis": self.weight_axis,
            "out_channel_axis": self.out_channel_axis,
            "bias": self.bias,
            "bias_scale_of": self.bias_scale_of,
            "int8_lowering": self.int8_lowering,
            "int8_refused_if": list(self.int8_refused_if),
            "accumulates": self.accumulates,
            "averages": self.averages,
            "fuses_activation": self.fuses_activation,
            "int16": self.int16,
            "int4": self.int4,
            "int8_kernels": {k.backend: k.to_json() for k in self.int8_kernels},
        }

    @staticmethod
    def from_json(d: Mapping[str, Any], facts: "Row | None" = None) -> "Row":
        """A row from JSON; fact keys it omits come from `facts` (the built-in row)."""
        unknown = set(d) - {"target", "policy", "encoded", "blocks", "weights", *_FACT_KEYS}
        if unknown:
            raise ValueError(f"table row {d.get('target')!r}: unknown keys {sorted(unknown)}")
        base = facts or Row(str(d["target"]))
        return Row(
            target=str(d["target"]),
            policy=d.get("policy"),
            encoded=tuple(d.get("encoded", ())),
            blocks=tuple(tuple(b) for b in d.get("blocks", ())),
            weights=tuple(d.get("weights", ())),
            weight_axis=d.get("weight_axis", base.weight_axis),
            out_channel_axis=d.get("out_channel_axis", base.out_channel_axis),
            bias=d.get("bias", base.bias),
            bias_scale_of=d.get("bias_scale_of", base.bias_scale_of),
            int8_lowering=d.get("int8_lowering", base.int8_lowering),
            int8_refused_if=tuple(d.get("int8_refused_if", base.int8_refused_if)),
            accumulates=bool(d.get("accumulates", base.accumulates)),
            averages=bool(d.get("averages", base.averages)),
            fuses_activation=bool(d.get("fuses_activation", base.fuses_activation)),
            int16=bool(d.get("int16", base.int16)),
            int4=bool(d.get("int4", base.int4)),
            int8_kernels=(tuple(Kernel.from_json(b, k) for b, k in d["int8_kernels"].items())
                          if "int8_kernels" in d else base.int8_kernels),
        )


def _compute(target: str, operands: tuple[str, ...], weights: tuple[str, ...], **facts: Any) -> Row:
    # The INT8 kernel requantises internally: input and output codes are independent
    # (all blocks trivial); the bias stays 32-bit.
    return Row(target, "Y", operands + (OUT,), (), weights, **facts)


# Arm's DecomposeAddmmPass (after q/dq folding) hands addmm's input qparams,
# indexed (bias, mat1, mat2), to the mm it creates, which RewriteMatmulPass
# reads as (mat1, mat2): a quantized addmm cannot be lowered. Arm's own flow
# never has one (its partitioner keeps aten.linear whole), and neither does ours.
_ADDMM_INT8 = ("Arm's TOSA lowering cannot take an encoded addmm; keep aten.linear "
               "undecomposed (ops_to_not_decompose) or leave addmm FP32 in the table")


def _routing(target: str, variadic: str) -> Row:
    return Row(target, "X", (variadic, OUT), ((variadic, OUT),))


def _layout(target: str, src: str = "self", out: str = OUT) -> Row:
    # Moves codes without looking at them: input and output share one theta.
    return Row(target, "W", (src, out), ((src, out),))


# The monotone rows (see _monotone). Placement reads them too: a domain whose
# dominator is read only by one of them learns its theta after it.
CLAMPING_TARGETS: tuple[str, ...] = (
    "aten.relu.default", "aten.hardtanh.default", "aten.clamp.default",  # relu6 is hardtanh(0, 6)
    # the spellings torch.export keeps in the graph a PT2E quantizer annotates (F.relu6
    # stays relu6 there; edge decomposes it to hardtanh)
    "aten.relu_.default", "aten.hardtanh_.default", "aten.relu6.default", "aten.relu6_.default",
)


def _monotone(target: str, src: str = "self") -> Row:
    # Commutes exactly with an affine codec of positive scale: a monotone map
    # that sends grid points to grid points (relu: max(q, zp); clamp(a, b):
    # CLAMP between the codes of a and b, and quantising is monotone, so
    # q(clamp(x, a, b)) == clamp(q(x), q(a), q(b))). One theta, like a layout op.
    return Row(target, "V", (src, OUT), ((src, OUT),))


def _integer(target: str, operands: tuple[str, ...], out: str = OUT) -> Row:
    # Has an INT8 lowering in Arm's TOSA flow (int32 RESCALEs or a TABLE) that
    # changes the scale: each input is encoded in whatever domain reaches it
    # and the output starts its own domain (trivial blocks, like convolution).
    return Row(target, "I", operands + (out,), ())


def _averaging(target: str, src: str = "self") -> Row:
    # TOSA's INT8 AVG_POOL2D (and Arm's mean/adaptive-pool rewrites onto it or
    # onto a REDUCE_SUM + rescale) take an input and an output zero point but no
    # scale: input and output share one theta, as in Arm's own annotator. An
    # average stays within its inputs' range, so the shared theta loses nothing.
    return Row(target, "I", (src, OUT), ((src, OUT),), averages=True)


def _fp32(*targets: str) -> list[Row]:
    return [Row(t) for t in targets]


_LAYOUT_OPS = [
    "view.default", "_unsafe_view.default", "reshape.default", "permute.default",
    "transpose.int", "t.default", "clone.default", "alias.default", "slice.Tensor",
    "select.int", "squeeze.dim", "squeeze.dims", "squeeze.default", "unsqueeze.default",
    "expand.default", "split_with_sizes.default", "split.Tensor", "chunk.default",
    "unbind.int", "flatten.using_ints", "contiguous.default", "narrow.default",
]
_EDGE_COPY = {
    "view.default": "view_copy.default",
    "permute.default": "permute_copy.default",
    "transpose.int": "transpose_copy.int",
    "t.default": "t_copy.default",
    "alias.default": "alias_copy.default",
    "slice.Tensor": "slice_copy.Tensor",
    "select.int": "select_copy.int",
    "squeeze.dim": "squeeze_copy.dim",
    "squeeze.dims": "squeeze_copy.dims",
    "squeeze.default": "squeeze_copy.default",
    "unsqueeze.default": "unsqueeze_copy.default",
    "expand.default": "expand_copy.default",
    "split_with_sizes.default": "split_with_sizes_copy.default",
    "split.Tensor": "split_copy.Tensor",
    "unbind.int": "unbind_copy.int",
}


# XNNPACK's static INT8 kernels (executorch 1.5.1: the configs in
# backends/xnnpack/partition/config whose supported_precision_types list
# STATIC_QUANT, and their check_constraints; docs/XNNPACK_NOTES.md), by
# the operator spellings of the graph a PT2E quantizer annotates. XNNPACK runs
# everything else FP32 (softmax, sigmoid, tanh, gelu, hardswish, avg-pool, bmm,
# clone, pad on its own, ...) or not at all (split, select, expand, layer norm,
# squeeze, unsqueeze off the trailing axis).
XNNPACK = "xnnpack"
_RELU = ("aten.relu.default", "aten.relu_.default")
_HARDTANH = ("aten.hardtanh.default", "aten.hardtanh_.default")


def _xnnpack_kernels() -> dict[str, Kernel]:
    # GEMMs fold a relu or any hardtanh (an output min/max); add folds a relu only
    # (AddConfig's fused_act); alpha must be 1 (AddConfig, SubConfig)
    gemm = Kernel(XNNPACK, fuses=_RELU + _HARDTANH)
    binary = Kernel(XNNPACK, requires=(("alpha", (1,)),))
    plain = Kernel(XNNPACK)
    kernels = {
        "aten.conv1d.default": gemm, "aten.conv2d.default": gemm, "aten.linear.default": gemm,
        "aten.convolution.default": Kernel(XNNPACK, fuses=_RELU + _HARDTANH,
                                           requires=(("transposed", (False,)),)),
        "aten.add.Tensor": Kernel(XNNPACK, fuses=_RELU, requires=(("alpha", (1,)),)),
        "aten.add_.Tensor": Kernel(XNNPACK, fuses=_RELU, requires=(("alpha", (1,)),)),
        "aten.sub.Tensor": binary, "aten.sub_.Tensor": binary,
        "aten.mul.Tensor": plain, "aten.mul_.Tensor": plain,  # MulConfig folds nothing
        "aten.cat.default": plain,
        # stride <= kernel and no ceil mode are XNNPACK's too; a pool it refuses runs on the CPU
        "aten.max_pool2d.default": plain,
        # global average pooling only: a 4-D mean over H, W keeping them
        "aten.mean.dim": Kernel(XNNPACK, requires=(("dim", ((2, 3), (3, 2))), ("keepdim", (True,)),
                                                   ("dtype", (None,)))),
        "aten.adaptive_avg_pool2d.default": Kernel(XNNPACK, requires=(("output_size", ((1, 1),)),)),
        **{t: plain for t in (*_RELU, *_HARDTANH, "aten.clamp.default")},
        # reshapes (view_copy), permutes (permute_copy) and unit-step slices move codes
        **{f"aten.{t}": plain for t in ("view.default", "_unsafe_view.default", "reshape.default",
                                         "flatten.using_ints", "permute.default", "transpose.int",
                                         "t.default", "permute_copy.default")},
        "aten.slice.Tensor": Kernel(XNNPACK, requires=(("step", (1,)),)),
    }
    return kernels


# Operators without a row that Arm's quantizer annotates as sharing their input's
# codes, and that the lowering removes: the int16 fact of the row CodecQuantizer
# derives for them at policy I (quantizer._derived_row)
INT16_DERIVED_TARGETS = ("aten.dropout.default",)


def _int16_targets(rows: list[Row]) -> set[str]:
    """The operators Arm's INT lowering takes at int16 that the simulation reproduces
    (`Row.int16`; tests/test_precision.py checks each on the reference model). Not
    the TABLE operators: TOSA's int16 TABLE interpolates a 513-entry table, which
    the simulation does not model."""
    computes = {"aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default", "aten.linear.default",
                *(f"aten.{op}.Tensor" for op in ("add", "sub", "mul", "add_", "sub_", "mul_"))}
    averaging = {r.target for r in rows if r.averages}
    # rows that only move or clamp codes: layout, cat, pad, max pool, nearest upsampling, relu/clamp
    moving = {r.target for r in rows if r.moves_codes and r.policy is not None}
    return computes | averaging | moving | set(CLAMPING_TARGETS)


# The weighted operators Arm's INT lowering takes with INT4 weights (`Row.int4`): its
# a8w4 annotates convolutions and linears, which it lowers to CONV2D and DEPTHWISE_CONV2D
# (a linear as a 1x1 CONV2D), both with an int8 x int4 form in TOSA's int4 extension
INT4_TARGETS = ("aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default", "aten.linear.default")


def _default_rows() -> list[Row]:
    rows = _operator_rows()
    xnnpack = _xnnpack_kernels()
    unknown = set(xnnpack) - {r.target for r in rows}
    assert not unknown, f"XNNPACK kernels for operators without a row: {sorted(unknown)}"
    int16 = _int16_targets(rows)
    return [dataclasses.replace(r, int8_kernels=(xnnpack[r.target],) if r.target in xnnpack else r.int8_kernels,
                                int16=r.target in int16, int4=r.target in INT4_TARGETS)
            for r in rows]


def _operator_rows() -> list[Row]:
    rows = [
        # conv and linear weights: per output channel (axis 0), which Arm's
        # RewriteConvPass / DecomposeLinearPass turn into per-channel RESCALEs;
        # a transposed convolution keeps its output channels on axis 1
        _compute("aten.convolution.default", ("input", "weight"), ("weight",), weight_axis=0, out_channel_axis=1,
                 bias="bias", bias_scale_of="input", int8_refused_if=("transposed",), accumulates=True,
                 fuses_activation=True),
        # the spellings of the graph a PT2E quantizer annotates (before decomposition)
        *(_compute(f"aten.{conv}.default", ("input", "weight"), ("weight",), weight_axis=0, out_channel_axis=1,
                   bias="bias", bias_scale_of="input", accumulates=True, fuses_activation=True)
          for conv in ("conv1d", "conv2d")),
        _compute("aten.linear.default", ("input", "weight"), ("weight",), weight_axis=0, out_channel_axis=-1,
                 bias="bias", bias_scale_of="input", accumulates=True, fuses_activation=True),
        # matmul operands: one scale per tensor (Arm's MATMUL rescale reads no more)
        _compute("aten.addmm.default", ("mat1", "mat2"), ("mat1", "mat2"), int8_lowering=_ADDMM_INT8),
        _compute("aten.mm.default", ("self", "mat2"), ("self", "mat2")),
        _compute("aten.bmm.default", ("self", "mat2"), ("self", "mat2")),
        # Attention as one operator (kept whole by the analysis export): an INT8
        # kernel reads query, key and value as codes and requantises its output,
        # like a matmul; the mask (if any) stays plain.
        _compute("aten.scaled_dot_product_attention.default", ("query", "key", "value"), ()),
        _routing("aten.cat.default", "tensors"),
        _layout("aten.constant_pad_nd.default"),
        Row("aten.max_pool2d_with_indices.default", "W", ("self", "out.0"), (("self", "out.0"),)),
        _layout("aten.max_pool2d.default"),
        # nearest upsampling copies values: it moves codes without looking at them
        _layout("aten.upsample_nearest2d.vec", "input"),
        _layout("aten.upsample_nearest2d.default"),
    ]
    rows += [
        # V: monotone, grid to grid (see _monotone)
        *(_monotone(t) for t in CLAMPING_TARGETS),
        # I: Arm's INT8 lowering, new scale at the output (see _integer)
        _integer("aten.add.Tensor", ("self", "other")),  # RESCALE both to int32, ADD, RESCALE
        _integer("aten.sub.Tensor", ("self", "other")),
        _integer("aten.mul.Tensor", ("self", "other")),  # int32 MUL, one output RESCALE
        *(_integer(f"aten.{op}_.Tensor", ("self", "other")) for op in ("add", "sub", "mul")),
        # TABLE: a 256-entry lookup from input codes to output codes
        _integer("aten.sigmoid.default", ("self",)),
        _integer("aten.tanh.default", ("self",)),
        _integer("aten.hardswish.default", ("self",)),
        _integer("aten.hardswish_.default", ("self",)),
        _integer("aten.hardsigmoid.default", ("self",)),
        _integer("aten.silu.default", ("self",)),
        _integer("aten.gelu.default", ("self",)),
        # softmax, decomposed at integer policies as Arm's INT8 flow does
        # (Arm's DecomposeSoftmaxPass, before annotation): exp and reciprocal are TABLEs, the sum an
        # int32 REDUCE_SUM with RESCALEs; amax picks one of its inputs, so it
        # keeps their theta (an INT8 REDUCE_MAX on codes)
        _integer("aten.exp.default", ("self",)),
        _integer("aten.reciprocal.default", ("self",)),
        _integer("aten.sum.dim_IntList", ("self",)),
        Row("aten.amax.default", "I", ("self", OUT), (("self", OUT),)),
        _averaging("aten.avg_pool2d.default"),
        _averaging("aten.mean.dim"),
        _averaging("aten.mean.default"),
        _averaging("aten._adaptive_avg_pool2d.default"),
        _averaging("aten.adaptive_avg_pool2d.default"),
    ]
    # ExecuTorch's edge spelling of clone/contiguous (dim-order aware)
    rows.append(_layout("dim_order_ops._clone_dim_order.default"))
    for name in _LAYOUT_OPS:
        rows.append(_layout(f"aten.{name}"))
        if name in _EDGE_COPY:
            rows.append(_layout(f"aten.{_EDGE_COPY[name]}"))
    rows += _fp32(
        # elementwise arithmetic and activations
        "aten.add.Scalar", "aten.sub.Scalar",
        "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar",
        "aten.div.Tensor_mode", "aten.rsub.Scalar", "aten.neg.default", "aten.abs.default",
        "aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.sqrt.default",
        "aten.rsqrt.default", "aten.log.default",
        "aten.sin.default", "aten.cos.default", "aten.leaky_relu.default",
        "aten.elu.default", "aten.erf.default", "aten.clamp.Tensor",
        "aten.minimum.default", "aten.maximum.default", "aten.where.self",
        "aten.lt.Scalar", "aten.lt.Tensor", "aten.gt.Scalar", "aten.gt.Tensor",
        "aten.le.Scalar", "aten.ge.Scalar", "aten.eq.Scalar", "aten.eq.Tensor",
        "aten.ne.Scalar", "aten.logical_not.default", "aten.logical_and.default",
        "aten.bitwise_not.default", "aten.bitwise_and.Tensor",
        # normalisation, reductions, softmax, pooling that computes
        "aten._native_batch_norm_legit_no_training.default",
        "aten.native_batch_norm.default", "aten.native_layer_norm.default",
        "aten.native_group_norm.default", "aten._softmax.default",
        "aten._log_softmax.default", "aten._safe_softmax.default",
        "aten.amin.default", "aten.var.correction",
        "aten.upsample_bilinear2d.vec",
        # type conversion, indexing, constants
        "aten._to_copy.default", "aten.embedding.default", "aten.index.Tensor",
        "aten.index_select.default", "aten.gather.default", "aten.arange.start_step",
        "aten.arange.default", "aten.full.default", "aten.full_like.default",
        "aten.scalar_tensor.default", "aten.zeros.default", "aten.ones.default",
        "aten.empty.memory_format", "aten.copy.default", "aten.lift_fresh_copy.default",
        "aten._assert_tensor_metadata.default", "dim_order_ops._to_dim_order_copy.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        # codec_tosa's standalone operators (standalone_ops.py)
        "codec_tosa.rms_norm.default", "codec_tosa.rope.default",
    )
    return rows


@dataclass
class CommutationTable:
    """Rows by target; `lookup` warns once per analysis about missing operators."""

    rows: dict[str, Row]
    order: PolicyOrder = field(default_factory=PolicyOrder)

    @classmethod
    def default(cls) -> "CommutationTable":
        return cls.from_rows(_default_rows())

    @classmethod
    def from_rows(
        cls, rows: Iterable[Row], order: PolicyOrder | None = None, validate: bool = True
    ) -> "CommutationTable":
        table = cls({}, order or PolicyOrder())
        for row in rows:
            if row.target in table.rows:
                raise ValueError(f"commutation table: operator {row.target} listed twice")
            table.rows[row.target] = row
        if validate:
            table.validate()
        return table

    @classmethod
    def from_json(cls, path: str | Path) -> "CommutationTable":
        """Load a user table: ``{"policies": ["Z", ...], "rows": [{"target": ...}, ...]}``."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"commutation table {path}: {e}") from None
        # every message names the file: a user table is the user's input
        try:
            if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
                raise ValueError('expected {"policies": [...], "rows": [{"target": ...}, ...]}')
            if any(not isinstance(r, dict) or "target" not in r for r in data["rows"]):
                raise ValueError('every row needs a "target"')
            order = PolicyOrder(tuple(data["policies"])) if "policies" in data else None
            built_in = _built_in_rows()
            table = cls.from_rows((Row.from_json(r, built_in.get(r["target"])) for r in data["rows"]),
                                  order)
        except ValueError as e:
            raise ValueError(f"commutation table {path}: {str(e).removeprefix('commutation table: ')}") from None
        for row in table.rows.values():
            refusal = row.int8_lowering
            if refusal is not None and row.encoded and row.policy is not None:
                # the analysis counts it encoded; the compiler cannot lower it so
                warnings.warn(f"commutation table {path}: {row.target} is encoded from policy "
                              f"{row.policy}, but the compiler keeps it FP32: {refusal}", stacklevel=2)
        return table

    def to_json(self) -> dict[str, Any]:
        return {
            "policies": list(self.order.letters),
            "rows": [r.to_json() for r in self.rows.values()],
        }

    def validate(self) -> None:
        """Every row names a real operator, real ports and known policies."""
        for row in self.rows.values():
            if row.policy is not None:
                self.order.rank(row.policy)
            ports = operator_ports(row.target)
            if ports is None:
                raise ValueError(f"commutation table: operator {row.target} does not exist")
            inputs, n_out = ports
            names = set(row.encoded) | set(row.weights) | {p for b in row.blocks for p in b}
            for name in names:
                if not _port_exists(name, inputs, n_out):
                    raise ValueError(
                        f"commutation table: operator {row.target} has no port {name!r} "
                        f"(tensor inputs: {', '.join(inputs) or 'none'}; outputs: {n_out})"
                    )
            for b in row.blocks:
                if not set(b) <= set(row.encoded):
                    raise ValueError(f"commutation table: {row.target} block {b} has unencoded ports")
            if not set(row.weights) <= set(row.encoded):
                raise ValueError(f"commutation table: {row.target} weight ports must be encoded")
            self._validate_facts(row, inputs)

    def _validate_facts(self, row: Row, inputs: list[str]) -> None:
        """The facts name real arguments of the operator."""
        for key in ("bias", "bias_scale_of"):
            name = getattr(row, key)
            if name is not None and name not in inputs:
                raise ValueError(f"commutation table: operator {row.target} has no tensor argument "
                                 f"{name!r} ({key}; tensor inputs: {', '.join(inputs) or 'none'})")
        if row.bias is not None and row.bias_scale_of is None:
            raise ValueError(f"commutation table: {row.target} names a bias but not bias_scale_of")
        arguments = operator_arguments(row.target)
        for name in row.int8_refused_if:
            if name not in arguments:
                raise ValueError(f"commutation table: operator {row.target} has no argument {name!r} "
                                 "(int8_refused_if)")
        for kernel in row.int8_kernels:
            for name, _ in kernel.requires:
                if name not in arguments:
                    raise ValueError(f"commutation table: operator {row.target} has no argument {name!r} "
                                     f"(int8_kernels {kernel.backend} requires)")
            for act in kernel.fuses:
                if operator_ports(act) is None:
                    raise ValueError(f"commutation table: {row.target}'s {kernel.backend} kernel fuses "
                                     f"{act}, which is not an operator")

    def lookup(self, target: str) -> Row | None:
        return self.rows.get(target)


def _port_exists(name: str, inputs: list[str], n_out: int) -> bool:
    if name == OUT:
        return n_out > 0
    if name.startswith(OUT + "."):
        idx = name[len(OUT) + 1:]
        return idx.isdigit() and int(idx) < n_out
    return name in inputs


def operator_ports(target: str) -> tuple[list[str], int] | None:
    """Tensor input names and output count of an operator named like ``aten.cat.default``."""
    op = _operator(target)
    if op is None:
        return None
    schema = op._schema
    inputs = [a.name for a in schema.arguments if "Tensor" in str(a.type)]
    return inputs, len(schema.returns)


def operator_arguments(target: str) -> list[str]:
    """Every argument name of an operator (tensors and others)."""
    op = _operator(target)
    return [a.name for a in op._schema.arguments] if op is not None else []


def _operator(target: str) -> Any:
    parts = target.split(".")
    if len(parts) != 3:
        return None
    ns, name, overload = parts
    if ns == "dim_order_ops":
        import executorch.exir.passes.dim_order_ops_registry  # noqa: F401  (defines the namespace)
    elif ns == "codec_tosa":
        import codec_tosa.ops  # noqa: F401  (defines the namespace)
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError):
        return None


_BUILT_IN: dict[str, Row] | None = None


def _built_in_rows() -> dict[str, Row]:
    global _BUILT_IN
    if _BUILT_IN is None:
        _BUILT_IN = {r.target: r for r in _default_rows()}
    return _BUILT_IN


def warn_missing(targets: Iterable[str]) -> None:
    missing = sorted(set(targets))
    if missing:
        warnings.warn(
            "codec_tosa: operators not in the commutation table are FP32: " + ", ".join(missing),
            stacklevel=3,
        )
