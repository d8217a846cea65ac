"""Integer targets: what `CodecQuantizer` asks of the back end that runs its program
(docs/DESIGN.md, "The plan as a PT2E quantizer" and "XNNPACK").

The plan is the same for every target (placement, domains, observers); what
the target's INT8 flow takes is not. `Int8Target` is that difference, in five
answers:

* `transform_for_annotation`: the graph as the target's flow decomposes it
  before annotation;
* `annotations`: the target's own quantizer's annotation of each operator it
  takes, where its operator set is read off that quantizer (Arm); ``{}`` where
  it is the table's data (XNNPACK);
* `plain_ops`: the operators whose ports are plain (the target runs them FP32);
* `fuses`: whether the target folds an activation into the operator that
  produces its input, when nothing is quantized between them;
* `bias_codes`: whether a convolution's or linear's bias is annotated as int32
  codes at ``s_in * s_w`` (Arm's INT8 convolution reads them) or left FP32;
* `fold_needs_lowest_zero_point`: whether a folded activation's domain must
  code 0.0 as the lowest code even with symmetric activations. Arm's
  FuseQuantizedActivationPass drops the relu and moves the quantize's qmin up
  to the zero point, but the producer's RESCALE saturates at the int8 range,
  not at qmin: with zero point 0 the relu is lost (a trained ResNet-8 at 10%
  top-1), with -128 the saturation is the relu.

Every target keeps the zero points the ranges ask for (`DomainObserver`).

`ArmTarget` asks Arm's quantizer (TOSA-1.0+INT, Ethos-U); `XnnpackTarget`
reads the commutation table's ``xnnpack`` kernels (`Row.int8_kernels`).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

import torch
import torch.fx
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpecBase,
    SharedQuantizationSpec,
)
from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

from codec_tosa import arm_adapter
from codec_tosa._passes.fully_masked_rows import ZeroFullyMaskedRowsPass
from codec_tosa._passes.mean_to_avg_pool import MeanToAvgPoolPass
from codec_tosa._passes.shape_reads_to_full import ShapeReadsToFullPass
from codec_tosa.commutation.table import XNNPACK, CommutationTable
from codec_tosa.graph import PortGraph

Annotations = Mapping[str, QuantizationAnnotation]  # by node name
XNNPACK_BACKEND_ID = "XnnpackBackend"  # the delegates XnnpackPartitioner makes


class Int8Target:
    """The answers every target gives (module docstring); the defaults are Arm's."""

    name = ""
    bias_codes = True
    fold_needs_lowest_zero_point = True

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        raise NotImplementedError

    def select(self, selection: Any) -> None:
        """Select modules on the target's own quantizer as `CodecQuantizer` selects them
        (`module_selection.ModuleSelection`), where its flow depends on it."""

    def annotations(self, model: torch.fx.GraphModule) -> dict[str, QuantizationAnnotation]:
        return {}

    def plain_ops(self, graph: PortGraph, table: CommutationTable, annotations: Annotations) -> list[int]:
        raise NotImplementedError

    def fuses(self, graph: PortGraph, producer: int, activation: int, table: CommutationTable) -> bool:
        raise NotImplementedError


class ArmTarget(Int8Target):
    """Arm's INT flow (TOSA-1.0+INT, Ethos-U): its quantizer names the operators it takes."""

    name = "arm"

    def __init__(self, tosa_spec: str, ethos_u_target: str | None) -> None:
        self._specs = (tosa_spec, ethos_u_target)
        self.quantizer = arm_adapter.arm_quantizer(tosa_spec, ethos_u_target)
        arm_adapter.install_payload_journal()  # codec_tosa.save finds the TOSA behind an Ethos-U payload

    def select(self, selection: Any) -> None:
        """Arm's quantizer with the same modules selected: its transforms then leave the
        operators of a module left out whole (Arm's `disallow_tfa`), as in Arm's own
        partial-quantization flow, and its annotation names only the selected ones."""
        self.quantizer = arm_adapter.arm_quantizer(*self._specs, selection=selection.arm_configs())

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        MeanToAvgPoolPass()(model)  # one AVG_POOL2D, not Arm's sum and product (the pass says why)
        ShapeReadsToFullPass()(model)  # no delegate input that Arm's constant folding leaves unread
        ZeroFullyMaskedRowsPass()(model)  # eager's zeros where Arm's softmax decomposition gives a mean
        return self.quantizer.transform_for_annotation(model)

    def annotations(self, model: torch.fx.GraphModule) -> dict[str, QuantizationAnnotation]:
        """How Arm's quantizer annotates each operator of `model` (on a copy, remapped
        onto `model`'s nodes): the operators Arm's INT flow takes, and their qspecs."""
        probe = copy.deepcopy(model)
        self.quantizer.annotate(probe)
        nodes = {n.name: n for n in model.graph.nodes}
        out: dict[str, QuantizationAnnotation] = {}
        for n in probe.graph.nodes:
            ann = n.meta.get(Q_ANNOTATION_KEY)
            if n.op != "call_function" or ann is None:
                continue
            out[n.name] = QuantizationAnnotation(
                input_qspec_map={nodes[a.name]: _remap(q, nodes) for a, q in ann.input_qspec_map.items()},
                output_qspec=_remap(ann.output_qspec, nodes), _annotated=True)
        return out

    def plain_ops(self, graph: PortGraph, table: CommutationTable, annotations: Annotations) -> list[int]:
        return [op for op in range(graph.num_ops) if self._stays_fp32(graph, op, table, annotations)]

    @staticmethod
    def _stays_fp32(graph: PortGraph, op: int, table: CommutationTable, annotations: Annotations) -> bool:
        """Arm's INT flow leaves it FP32 on the CPU (Arm's quantizer does not annotate
        it; an operator that only moves codes, such as `narrow`, which Arm's quantizer
        skips but its partitioner lowers on INT8 like any slice, excepted), or its row
        says Arm cannot take it encoded."""
        node = graph.fx_op_node[op]
        row = table.lookup(graph.op_target[op])
        if node is None or (node.name not in annotations and not (row is not None and row.moves_codes)):
            return True
        return row is not None and row.int8_refusal(lambda name: graph.op_argument(op, name)) is not None

    def fuses(self, graph: PortGraph, producer: int, activation: int, table: CommutationTable) -> bool:
        """A relu, or a hardtanh from 0 (relu6), after an operator whose row says Arm's
        FuseQuantizedActivationPass folds it (`fuses_activation`)."""
        row = table.lookup(graph.op_target[producer])
        if row is None or not row.fuses_activation:
            return False
        target = graph.op_target[activation]
        if target.startswith("aten.relu"):
            return True
        return target.startswith("aten.hardtanh") and float(graph.op_argument(activation, "min_val")) == 0.0


class XnnpackTarget(Int8Target):
    """XNNPACK's static INT8 flow (`XnnpackPartitioner`): the table's ``xnnpack``
    kernels name the operators it runs on codes. Its partitioner takes a GEMM only
    with a static FP32 bias, which its serializer quantizes at ``s_in * s_w``, so
    the bias is left FP32 (as XNNPACK's own quantizer leaves it)."""

    name = XNNPACK
    bias_codes = False
    fold_needs_lowest_zero_point = False  # XNNPACK clamps a fused activation at its bounds' codes

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer_utils import _convert_scalars_to_attrs

        from codec_tosa._passes.xnnpack_rewrites import XnnpackRewritesPass

        XnnpackRewritesPass()(model)
        return _convert_scalars_to_attrs(model)

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


def _makes_codes(graph: PortGraph, producer: int, plain: set[int]) -> bool:
    """The operator (earlier in the graph, so already decided) runs on codes."""
    return producer >= 0 and producer not in plain and not graph.op_const[producer]


def int8_target(spec: Any) -> Int8Target:
    """The target of an integer-only `CodecSpec`."""
    if spec.target == XNNPACK:
        return XnnpackTarget()
    return ArmTarget(spec.tosa_spec, spec.target if spec.ethos_u else None)


def _remap(qspec: QuantizationSpecBase | None, nodes: Mapping[str, torch.fx.Node]) -> Any:
    def edge(e: Any) -> Any:
        return (nodes[e[0].name], nodes[e[1].name]) if isinstance(e, tuple) else nodes[e.name]

    if isinstance(qspec, SharedQuantizationSpec):
        return SharedQuantizationSpec(edge(qspec.edge_or_node))
    if isinstance(qspec, DerivedQuantizationSpec):
        return DerivedQuantizationSpec(
            derived_from=[edge(e) for e in qspec.derived_from], derive_qparams_fn=qspec.derive_qparams_fn,
            dtype=qspec.dtype, quant_min=qspec.quant_min, quant_max=qspec.quant_max, qscheme=qspec.qscheme,
            ch_axis=qspec.ch_axis, is_dynamic=qspec.is_dynamic)
    return qspec


__all__ = ["ArmTarget", "Int8Target", "XNNPACK_BACKEND_ID", "XnnpackTarget", "int8_target"]
