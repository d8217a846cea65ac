"""Arm's INT flow (TOSA-1.0+INT, Ethos-U, VGF) as `CodecQuantizer` asks it (`base.Int8Flow`;
docs/DESIGN.md, "The plan as a PT2E quantizer"): Arm's own quantizer names the
operators the flow takes. Every flow keeps the zero points the ranges ask for
(`quantizer.observers.DomainObserver`)."""

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

from codec_tosa._passes.fully_masked_rows import ZeroFullyMaskedRowsPass
from codec_tosa._passes.mean_to_avg_pool import MeanToAvgPoolPass
from codec_tosa._passes.shape_reads_to_full import ShapeReadsToFullPass
from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import PortGraph
from codec_tosa.targets.base import Annotations, Int8Flow


class ArmInt8Flow(Int8Flow):
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


__all__ = ["ArmInt8Flow"]
