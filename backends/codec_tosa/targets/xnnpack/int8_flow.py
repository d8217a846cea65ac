"""XNNPACK's static INT8 flow as `CodecQuantizer` asks it (`targets.base.Int8Flow`;
docs/DESIGN.md, "XNNPACK"): the commutation table's ``xnnpack`` kernels
(`Row.int8_kernels`) name the operators it runs on codes."""

from __future__ import annotations

import torch
import torch.fx
from torchao.quantization.pt2e.utils import get_new_attr_name_with_prefix

from codec_tosa._passes.xnnpack_rewrites import XnnpackRewritesPass
from codec_tosa.commutation.table import XNNPACK, CommutationTable
from codec_tosa.graph import PortGraph
from codec_tosa.targets.base import Annotations, Int8Flow


class XnnpackInt8Flow(Int8Flow):
    """XNNPACK's static INT8 flow (`XnnpackPartitioner`): the table's ``xnnpack``
    kernels name the operators it runs on codes. Its partitioner takes a GEMM only
    with a static FP32 bias, which its serializer quantizes at ``s_in * s_w``, so
    the bias is left FP32 (as XNNPACK's own quantizer leaves it)."""

    name = XNNPACK
    bias_codes = False
    fold_needs_lowest_zero_point = False  # XNNPACK clamps a fused activation at its bounds' codes

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        XnnpackRewritesPass()(model)
        return _scalars_to_attrs(model)

    def plain_ops(self, graph: PortGraph, table: CommutationTable, annotations: Annotations) -> list[int]:
        """An operator without an XNNPACK kernel, or called with arguments its kernel
        refuses; and an operator that only moves codes (layout, cat, max-pool, clamps)
        none of whose inputs an operator running on codes produced. XNNPACK runs such
        an operator on codes only between an encode and a decode of its own, which
        cost more than its FP32 form (a ViT's key transpose, between a select and a
        batched matmul that XNNPACK runs FP32): as XNNPACK's quantizer propagates
        shared parameters only from a quantized producer."""
        plain: set[int] = set()
        for op in range(graph.num_ops):
            node = graph.fx_op_node[op]
            row = table.lookup(graph.op_target[op])
            kernel = row.kernel(self.name) if row is not None else None
            if node is None or kernel is None or kernel.refusal(lambda name: graph.op_argument(op, name)):
                plain.add(op)
            elif row is not None and row.moves_codes and not any(
                    _makes_codes(graph, graph.val_op[graph.in_value[p]], plain) for p in graph.op_in[op]):
                plain.add(op)
        return sorted(plain)

    def fuses(self, graph: PortGraph, producer: int, activation: int, table: CommutationTable) -> bool:
        row = table.lookup(graph.op_target[producer])
        kernel = row.kernel(self.name) if row is not None else None
        return kernel is not None and graph.op_target[activation] in kernel.fuses


def _scalars_to_attrs(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A scalar operand of a floating-point ``add`` or ``mul`` as a 0-d FP32 buffer, so
    the annotation can give it a port (XNNPACK's ``_convert_scalars_to_attrs``, whose
    graph this is). Unlike it, an integer ``add`` or ``mul`` keeps its scalar: XNNPACK's
    turns ``arange(n) + 1`` into ``arange(n) + tensor(1.0)``, whose value is FP32 while
    its ``meta["val"]`` still says int64, and a mask's ``index`` then reads FP32
    indices (HF's causal mask: SmolLM2 at policy I)."""
    for n in model.graph.nodes:
        val = n.meta.get("val")
        if n.op != "call_function" or n.target not in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor) \
                or not isinstance(val, torch.Tensor) or not val.is_floating_point():
            continue
        args = []
        for a in n.args:
            if isinstance(a, torch.fx.Node):
                args.append(a)
                continue
            name = get_new_attr_name_with_prefix("_tensor_constant_")(model)
            constant = torch.tensor(float(a))
            model.register_buffer(name, constant)
            with model.graph.inserting_before(n):
                attr = model.graph.create_node("get_attr", name, (), {})
            attr.meta["val"] = val.fake_mode.from_tensor(constant, static_shapes=True)
            args.append(attr)
        n.args = tuple(args)
    model.recompile()
    return model


def _makes_codes(graph: PortGraph, producer: int, plain: set[int]) -> bool:
    """The operator (earlier in the graph, so already decided) runs on codes."""
    return producer >= 0 and producer not in plain and not graph.op_const[producer]


__all__ = ["XnnpackInt8Flow"]
