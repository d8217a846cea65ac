"""Operator names, grouped by the fact each family states.

The table's rows (`table.py`) say what each operator's INT8 variant encodes;
the families here are what the other stages test an operator against: the
simulation's dispatch (`validation/simulation`), the FP32 rounding bounds
(`validation/rounding_ambiguity`) and the paper's traffic accounting
(`planning/accounting`). Every name is spelled as `graph.target_key` gives it
(``namespace.name.overload``), and only here.
"""

from __future__ import annotations

# ---- codecs: the plan's encodes and decodes, as `_passes/materialize_codecs` writes them
QUANTIZE = "quantized_decomposed.quantize_per_tensor.default"
DEQUANTIZE = "quantized_decomposed.dequantize_per_tensor.default"
DEQUANTIZE_PER_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"  # a weight's
DEQUANTIZES: tuple[str, ...] = (DEQUANTIZE, DEQUANTIZE_PER_CHANNEL)

# ---- integer compute: products of codes summed into an int32 accumulator, then one RESCALE
CONVOLUTION = "aten.convolution.default"
LINEAR = "aten.linear.default"  # Arm lowers it as a 1x1 CONV2D
MATMULS: tuple[str, ...] = ("aten.mm.default", "aten.bmm.default")  # Arm's MATMUL
INTEGER_COMPUTE: tuple[str, ...] = (CONVOLUTION, LINEAR, *MATMULS)

# ---- int32 arithmetic: Arm's InsertRescaleInt32Pass RESCALEs int8 codes to int32,
# runs the int32 operator, and RESCALEs the result back once
ADD = "aten.add.Tensor"
SUB = "aten.sub.Tensor"
MUL = "aten.mul.Tensor"
SUM = "aten.sum.dim_IntList"
MAXIMUM = "aten.maximum.default"
MINIMUM = "aten.minimum.default"
INT32_ARITHMETIC: tuple[str, ...] = (ADD, SUB, MUL, SUM, MAXIMUM, MINIMUM)

# ---- fused activations: Arm's FuseQuantizedActivationPass folds them into the
# output RESCALE of the compute operator they read (relu6 is hardtanh(0, 6))
RELU = "aten.relu.default"
HARDTANH = "aten.hardtanh.default"
FUSED_ACTIVATIONS: tuple[str, ...] = (RELU, HARDTANH)

# ---- averages: Arm's DecomposeMeanDimPass re-quantises a mean's sum; AVG_POOL2D
# and a bilinear RESIZE compute on the codes themselves
MEANS: tuple[str, ...] = ("aten.mean.dim", "aten.mean.default")
AVG_POOL = "aten.avg_pool2d.default"
BILINEAR = "aten.upsample_bilinear2d.vec"

# ---- normalisations: Arm decomposes them, subtracting a rounded mean
LAYER_NORM = "aten.native_layer_norm.default"
LAYER_NORMS: frozenset[str] = frozenset({LAYER_NORM, "aten.layer_norm.default"})
GROUP_NORM = "aten.native_group_norm.default"

# ---- FP32 operators the artefact computes exactly as eager PyTorch, given the same
# inputs: each output element is an input element or a constant (layout, copies,
# selections, cat, pad, max pool, nearest upsampling, clamps, sign, casts, fills)
SELECTIONS: frozenset[str] = frozenset({
    "aten.view_copy.default", "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default",
    "aten.permute_copy.default", "aten.permute.default", "aten.transpose.int", "aten.t_copy.default",
    "aten.clone.default", "dim_order_ops._clone_dim_order.default", "aten.alias_copy.default",
    "aten.expand_copy.default", "aten.expand.default", "aten.slice_copy.Tensor", "aten.slice.Tensor",
    "aten.select_copy.int", "aten.select.int", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
    "aten.squeeze.dim", "aten.unsqueeze_copy.default", "aten.unsqueeze.default", "aten.cat.default",
    "aten.constant_pad_nd.default", "aten.max_pool2d.default", "aten.max_pool2d_with_indices.default",
    "aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default", "aten.split_with_sizes_copy.default",
    "aten.split_copy.Tensor", "aten.split.Tensor", "aten.split_with_sizes.default", "getitem",
    RELU, HARDTANH, "aten.clamp.default", "aten.clamp.Tensor",
    MAXIMUM, MINIMUM, "aten.neg.default", "aten.abs.default",
    "aten.where.self", "aten._to_copy.default", "dim_order_ops._to_dim_order_copy.default",
    "aten.repeat.default", "aten.index_select.default", "aten.flip.default", "aten.full_like.default",
    "aten.scalar_tensor.default", "aten.full.default", "aten.zeros_like.default", "aten.ones_like.default",
})
# exact too, but carrying their operands' bounds by sum and product rules
SUMS: frozenset[str] = frozenset({ADD, SUB, "aten.add.Scalar", "aten.sub.Scalar", "aten.rsub.Scalar"})
PRODUCTS: frozenset[str] = frozenset({MUL, "aten.mul.Scalar"})

# ---- FP32 operators Arm's passes rewrite into others (executorch 1.5.1), whose
# result differs from PyTorch's by more than rounding (rounding_ambiguity.FP32_DECOMPOSITIONS)
ASINH = "aten.asinh.default"
ACOSH = "aten.acosh.default"
SINH = "aten.sinh.default"
COSH = "aten.cosh.default"
ATAN = "aten.atan.default"

# ---- views: operators that reinterpret a tensor's shape or strides without copying it
PURE_VIEWS: frozenset[str] = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.expand.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default",
    "aten.unsqueeze.default", "aten.slice.Tensor", "aten.select.int", "aten.flatten.using_ints",
    "aten.alias.default", "aten.to.dtype",
})
# views that change strides: free when an operator can read strided memory
STRIDED_VIEWS: frozenset[str] = frozenset({"aten.permute.default", "aten.transpose.int", "aten.t.default"})

__all__ = [
    "ACOSH", "ADD", "ASINH", "ATAN", "AVG_POOL", "BILINEAR", "CONVOLUTION", "COSH", "DEQUANTIZE",
    "DEQUANTIZES", "DEQUANTIZE_PER_CHANNEL", "FUSED_ACTIVATIONS", "GROUP_NORM", "HARDTANH", "INT32_ARITHMETIC",
    "INTEGER_COMPUTE", "LAYER_NORM", "LAYER_NORMS", "LINEAR", "MATMULS", "MAXIMUM", "MEANS", "MINIMUM", "MUL",
    "PRODUCTS", "PURE_VIEWS", "QUANTIZE", "RELU", "SELECTIONS", "SINH", "STRIDED_VIEWS", "SUB", "SUM", "SUMS",
]
