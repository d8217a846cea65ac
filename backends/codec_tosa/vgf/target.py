"""A .pte for the stock ExecuTorch VGF runtime, from our codec plan and TOSA lowering.

Design (docs/DESIGN.md, "The VGF target"): `CodecVgfPartitioner` places and
calibrates exactly like `CodecTosaPartitioner` but delegates to Arm's
"VgfBackend" with VGF compile specs (plus our provenance). ExecuTorch then
runs Arm's `VgfBackend.preprocess`, inside
`arm_adapter.tosa_lowering_inside_vgf`, so its TOSA step is ours
(materialised plan, pooled constants) and its model-converter step is Arm's.
The delegate is byte-for-byte what the stock runtime expects: the payload is
the VGF file itself, and the runtime reads no compile spec.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, ContextManager, Sequence

import torch
from executorch.exir.backend.partitioner import DelegationSpec, PartitionResult
from torch.export import ExportedProgram

from codec_tosa import arm_adapter, progress
from codec_tosa.backend import lower_to_tosa
from codec_tosa.partitioner import CodecTosaPartitioner
from codec_tosa.runtime.pte import delegates
from codec_tosa.spec import CodecSpec
from codec_tosa.vgf.convert import conversion_error
from codec_tosa.vgf.errors import ConversionError
from codec_tosa.vgf.tools import model_converter

VGF_BACKEND_ID = arm_adapter.VGF_BACKEND_ID


class CodecVgfPartitioner(CodecTosaPartitioner):
    """`CodecTosaPartitioner` whose delegates are Arm's VgfBackend (lower inside `codec_vgf_lowering`)."""

    def __init__(self, spec: CodecSpec | None = None,
                 calibration: Sequence[Sequence[torch.Tensor]] | None = None) -> None:
        super().__init__(spec, calibration)
        # the parent's partition() appends the provenance to these entries
        self.delegation_spec = DelegationSpec(
            VGF_BACKEND_ID, arm_adapter.vgf_compile_spec_entries(self.codec_spec.tosa_spec))

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        result = super().partition(exported_program)
        tags = {tag: DelegationSpec(VGF_BACKEND_ID, list(spec.compile_specs))
                for tag, spec in result.partition_tags.items()}
        return PartitionResult(tagged_exported_program=result.tagged_exported_program, partition_tags=tags)


@dataclass
class DelegateRecord:
    """What our TOSA step made for one delegate (VgfBackend keeps only the VGF)."""

    tag: str
    tosa: bytes
    lowering_s: float
    pooling: dict[str, Any] | None
    conversion_s: float = 0.0  # model-converter's wall time, inside Arm's VgfBackend


@dataclass
class VgfLowering:
    """Collects a `DelegateRecord` per delegate while `codec_vgf_lowering` is active."""

    pool_constants: bool = True
    delegates: list[DelegateRecord] = field(default_factory=list)

    def lower(self, edge_program: ExportedProgram, tosa_spec: Any) -> bytes:
        """Our TOSA lowering, exactly as `CodecTosaBackend.preprocess` does it."""
        started = time.perf_counter()
        tag = _delegation_tag(edge_program)
        payload, stats = lower_to_tosa(edge_program, tosa_spec, self.pool_constants)
        self.delegates.append(DelegateRecord(
            tag=tag, tosa=payload, lowering_s=time.perf_counter() - started,
            pooling=json.loads(stats.to_json(indent=None)) if stats is not None else None))
        return payload


def codec_vgf_lowering(spec: CodecSpec) -> tuple[VgfLowering, ContextManager[None]]:
    """A recorder and the context to lower `CodecVgfPartitioner` delegates in."""
    recorder = VgfLowering(pool_constants=spec.pool_constants)
    return recorder, arm_adapter.tosa_lowering_inside_vgf(recorder.lower, str(model_converter()))


@dataclass
class VgfLowered:
    pte: bytes
    vgf: list[bytes]  # per delegate, as in the .pte
    delegates: list[DelegateRecord]
    partitioner: CodecVgfPartitioner
    lowering_s: float  # to_edge_transform_and_lower: placement, calibration, TOSA, conversion
    serialisation_s: float
    edge: Any = None  # the EdgeProgramManager, for running the program with its delegates elsewhere


def lower_program_to_vgf(program: ExportedProgram, spec: CodecSpec,
                         calibration: Sequence[Sequence[torch.Tensor]] | None) -> VgfLowered:
    """`to_edge_transform_and_lower` + `to_executorch` with VgfBackend delegates."""
    from executorch.exir import to_edge_transform_and_lower

    part = CodecVgfPartitioner(spec, calibration=calibration)
    recorder, context = codec_vgf_lowering(spec)
    started = time.perf_counter()
    try:
        with context, arm_adapter.vgf_conversions_kept() as conversions:
            edge = to_edge_transform_and_lower(program, partitioner=[part])
    except RuntimeError as e:  # Arm's vgf_compile: "Vgf compiler failed.\n...Stderr:\n..."
        if str(e).startswith("Vgf compiler failed"):
            raise _one_line(e, recorder) from None
        raise
    lowering = time.perf_counter() - started
    # VgfBackend converts each delegate right after our TOSA step lowered it
    for record, conversion in zip(recorder.delegates, conversions):
        record.conversion_s = conversion.seconds
    started = time.perf_counter()
    progress.stage(progress.SERIALISATION)
    pte = bytes(edge.to_executorch().buffer)
    return VgfLowered(pte, vgf_payloads(pte), recorder.delegates, part, lowering,
                      time.perf_counter() - started, edge)


def _one_line(error: RuntimeError, recorder: VgfLowering) -> ConversionError:
    # the delegate being converted is the last one our TOSA step lowered
    tag = recorder.delegates[-1].tag if recorder.delegates else ""
    label = f"VgfBackend delegate {tag}".rstrip()
    return conversion_error(label, str(error).split("Stderr:", 1)[-1], 1)


def vgf_payloads(pte: bytes) -> list[bytes]:
    """Every VgfBackend payload of a .pte, in delegate order."""
    return [d.payload for d in delegates(pte) if d.backend_id == VGF_BACKEND_ID]


def _delegation_tag(edge_program: ExportedProgram) -> str:
    for node in edge_program.graph_module.graph.nodes:
        tag = node.meta.get("delegation_tag")
        if tag:
            return str(tag)
    return ""


__all__ = ["CodecVgfPartitioner", "VGF_BACKEND_ID", "VgfLowered", "VgfLowering", "codec_vgf_lowering",
           "lower_program_to_vgf", "vgf_payloads"]
