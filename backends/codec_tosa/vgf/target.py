"""A .pte for the stock ExecuTorch VGF runtime, from our codec plan and TOSA lowering.

Design (docs/DESIGN.md, VGF target): `CodecVgfPartitioner` places and
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
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager, Sequence

import torch
import tosa_serializer as ts
from executorch.exir.backend.partitioner import DelegationSpec, PartitionResult
from torch.export import ExportedProgram

from codec_tosa import arm_adapter
from codec_tosa.partitioner import CodecTosaPartitioner
from codec_tosa.spec import CodecSpec
from codec_tosa.vgf.convert import conversion_error
from codec_tosa.vgf.errors import ConversionError
from codec_tosa.vgf.tools import model_converter

VGF_BACKEND_ID = arm_adapter.VGF_BACKEND_ID
PTE, VGF, TOSA, REPORT = "model.pte", "model.vgf", "model.tosa", "report.json"


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


@dataclass
class VgfLowering:
    """Collects a `DelegateRecord` per delegate while `codec_vgf_lowering` is active."""

    pool_constants: bool = True
    delegates: list[DelegateRecord] = field(default_factory=list)

    def lower(self, edge_program: ExportedProgram, tosa_spec: Any) -> bytes:
        """Our TOSA lowering, as `CodecTosaBackend.preprocess` does it (plan, Arm's visitors, pooling)."""
        from codec_tosa.placement.materialize import materialize
        from codec_tosa.plan_meta import has_plan
        from codec_tosa.serialization.pooled import PooledTosaSerializer

        started = time.perf_counter()
        if has_plan(edge_program.graph_module):
            edge_program = materialize(edge_program)
        serializer = arm_adapter.new_serializer(
            tosa_spec, PooledTosaSerializer if self.pool_constants else ts.TosaSerializer)
        payload = arm_adapter.lower_into(edge_program, tosa_spec, serializer)
        stats = getattr(serializer, "stats", None)
        self.delegates.append(DelegateRecord(
            tag=_delegation_tag(edge_program), tosa=payload, lowering_s=time.perf_counter() - started,
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


def lower_program_to_vgf(program: ExportedProgram, spec: CodecSpec,
                         calibration: Sequence[Sequence[torch.Tensor]] | None) -> VgfLowered:
    """`to_edge_transform_and_lower` + `to_executorch` with VgfBackend delegates."""
    from executorch.exir import to_edge_transform_and_lower

    part = CodecVgfPartitioner(spec, calibration=calibration)
    recorder, context = codec_vgf_lowering(spec)
    started = time.perf_counter()
    try:
        with context:
            edge = to_edge_transform_and_lower(program, partitioner=[part])
    except RuntimeError as e:  # Arm's vgf_compile: "Vgf compiler failed.\n...Stderr:\n..."
        if str(e).startswith("Vgf compiler failed"):
            raise _one_line(e, recorder) from None
        raise
    lowering = time.perf_counter() - started
    started = time.perf_counter()
    pte = bytes(edge.to_executorch().buffer)
    return VgfLowered(pte, vgf_payloads(pte), recorder.delegates, part, lowering,
                      time.perf_counter() - started)


def _one_line(error: RuntimeError, recorder: VgfLowering) -> ConversionError:
    # the delegate being converted is the last one our TOSA step lowered
    tag = recorder.delegates[-1].tag if recorder.delegates else ""
    label = f"VgfBackend delegate {tag}".rstrip()
    return conversion_error(label, str(error).split("Stderr:", 1)[-1], 1)


def vgf_payloads(pte: bytes) -> list[bytes]:
    """Every VgfBackend payload of a .pte, in delegate order."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary(pte).program
    out = []
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            if delegate.id != VGF_BACKEND_ID:
                continue
            processed = delegate.processed
            if processed.location.name == "INLINE":
                out.append(bytes(program.backend_delegate_data[processed.index].data))
            else:
                out.append(bytes(program.segments[processed.index].data))  # filled by the deserializer
    return out


def compile_model_vgf(model: str, spec: CodecSpec, out_dir: str | Path,
                      calibration_size: int = 4) -> dict[str, Any]:
    """Export, lower to VgfBackend and write model.pte, model.vgf, model.tosa and report.json.

    With several delegates the VGF and TOSA files are numbered (model_1.vgf, ...).
    """
    from codec_tosa.codecs.calibration import random_calibration
    from codec_tosa.loading import load_and_export

    loaded = load_and_export(model)
    calibration = [loaded.inputs] + random_calibration(loaded.inputs, calibration_size - 1)
    lowered = lower_program_to_vgf(loaded.program, spec, calibration)
    files = {PTE: lowered.pte}
    for i, (vgf, record) in enumerate(zip(lowered.vgf, lowered.delegates)):
        suffix = "" if i == 0 else f"_{i}"
        files[VGF.replace(".", f"{suffix}.")] = vgf
        files[TOSA.replace(".", f"{suffix}.")] = record.tosa
    report = {
        "model": model, "spec": spec.to_json(), "backend_id": VGF_BACKEND_ID,
        "pte_bytes": len(lowered.pte),
        "delegates": [{"tag": r.tag, "tosa_bytes": len(r.tosa), "vgf_bytes": len(v),
                       "tosa_lowering_s": r.lowering_s, "pooling": r.pooling}
                      for r, v in zip(lowered.delegates, lowered.vgf)],
        "times": {"lowering_s": lowered.lowering_s, "serialisation_s": lowered.serialisation_s},
    }
    files[REPORT] = json.dumps(report, indent=1).encode()
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".codec-tosa-", dir=out.parent))
    try:  # complete artefacts or none, as `codec-tosa compile` does
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        out.mkdir(parents=True, exist_ok=True)
        for name in files:
            (tmp / name).replace(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report


def _delegation_tag(edge_program: ExportedProgram) -> str:
    for node in edge_program.graph_module.graph.nodes:
        tag = node.meta.get("delegation_tag")
        if tag:
            return str(tag)
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m codec_tosa.vgf.target MODEL --policy W -o DIR` (until `compile --target vgf` exists)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m codec_tosa.vgf.target")
    parser.add_argument("model")
    parser.add_argument("--policy", default="W")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args(argv)
    report = compile_model_vgf(args.model, CodecSpec(policy=args.policy), args.out)
    print(json.dumps({k: report[k] for k in ("pte_bytes", "delegates", "times")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["CodecVgfPartitioner", "VGF_BACKEND_ID", "VgfLowered", "VgfLowering", "codec_vgf_lowering",
           "compile_model_vgf", "lower_program_to_vgf", "vgf_payloads"]
