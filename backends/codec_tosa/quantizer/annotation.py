"""What `CodecQuantizer` decided at annotation, and the typed interface through which
the precision search (`search`) reads a calibrated quantizer: `Calibrated`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol

import torch
import torch.fx
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation

from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import PortGraph
from codec_tosa.placement import Placement
from codec_tosa.quantizer.precision import DomainPrecision, Groups, Int4Weight, WeightPrecision, cut_sources
from codec_tosa.spec import CodecSpec

Key = Any  # an annotated edge or node by node names, stable across copies of the graph


@dataclass
class Annotation:
    """What `annotate` decided, kept to read thetas after calibration."""

    graph: PortGraph
    placement: Placement
    roots: dict[int, Key]  # domain -> the port holding its QuantizationSpec (its observer)
    fp32: torch.fx.GraphModule  # the graph as annotated, before observers (for `converted`)
    derived: tuple[str, ...]  # targets whose rows come from Arm's annotation
    groups: Groups  # the domains that can be INT16 (codec_tosa.quantizer.precision)
    precisions: list[DomainPrecision]  # each domain's width, and why
    fused: dict[int, list[tuple[str, str]]]  # domain -> (producer, activation) pairs annotated folded
    int4: list[Int4Weight]  # the weights that may be INT4
    weight_precisions: list[WeightPrecision]  # each of their widths, and why
    weight_roots: dict[int, Key]  # operator -> the edge holding its weight's observer
    table: CommutationTable  # the spec's, with the rows derived from Arm's annotation
    arm: Mapping[str, QuantizationAnnotation]  # Arm's quantizer's annotation of the graph
    plain: tuple[int, ...]  # operators the target keeps in FP32
    cut_ports: tuple[int, ...] = ()  # at split_chains: the in-ports cut (`precision.chain_cuts`)

    @property
    def cuts(self) -> dict[int, int]:
        """Each cut's domain -> the domain its transcode reads."""
        return cut_sources(self.graph, self.placement, self.cut_ports)


class Calibrated(Protocol):
    """A calibrated `CodecQuantizer`, as the precision search reads it."""

    spec: CodecSpec

    @property
    def annotation(self) -> Annotation: ...

    def observer(self, key: Key) -> Any: ...

    def fp32_module(self) -> torch.fx.GraphModule: ...

    def with_widths(self, prepared: torch.fx.GraphModule, bits: Mapping[int, int],
                    weight_bits: Mapping[int, int]) -> torch.fx.GraphModule: ...


__all__ = ["Annotation", "Calibrated", "Key"]
