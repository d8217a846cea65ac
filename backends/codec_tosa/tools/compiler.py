"""`codec-tosa compile`: model -> model.pte, report.json and reference_io.npz."""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import executorch.kernels.quantized  # noqa: F401  (out variants of the I/O quantize/dequantize)
import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from tqdm import tqdm

from codec_tosa import progress as lowering_progress  # compile_model has a `progress` flag
from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.graph import target_key
from codec_tosa.planning.calibration import random_calibration
from codec_tosa.planning.program import PlannedProgram
from codec_tosa.quantizer.codec_quantizer import CodecQuantizer, decomposed_for
from codec_tosa.quantizer.precision import BITS4, BITS16
from codec_tosa.runtime.pte import NamedData, ProgramFiles, inspect_pte, program_files
from codec_tosa.serialization import external
from codec_tosa.spec import INT8, NEAREST, CodecSpec
from codec_tosa.targets import target_of
from codec_tosa.targets.artefacts import PTD, PTE, REFERENCE_IO, REPORT, delegate_file
from codec_tosa.targets.base import Target
from codec_tosa.targets.ethosu.target import VelaError
from codec_tosa.targets.ethosu.vela_summary import read_vela_summary, vela_operator_counts, vela_report
from codec_tosa.targets.tosa.partitioner import CodecTosaPartitioner, NotQuantizedError
from codec_tosa.tools.input_files import load_input_tuples
from codec_tosa.tools.loading import export_module, load_and_export
from codec_tosa.tools.report import memory_summary, program_delegates
from codec_tosa.units import MIB
from codec_tosa.validation.artefact_rounding import askable
from codec_tosa.validation.reference_io import Reference, ReferenceIO, reference_outputs
from codec_tosa.validation.samples import (DEFAULT_SAMPLES, SEARCH_SAMPLES, SEARCH_SEED, held_out_inputs,
                                           reference_budget)

# the bar's steps; a lowering reports its delegates as "TOSA lowering: delegate k"
STAGES = ("export", lowering_progress.PLACEMENT, "TOSA lowering", lowering_progress.SERIALISATION, "reference outputs")


@dataclass
class CompileResult:
    out_dir: Path
    report: dict[str, Any]
    files: tuple[str, ...] = ()  # written beside the .pte besides report.json and reference_io.npz
    warnings: list[str] = field(default_factory=list)  # e.g. an output's SQNR below the floor
    planned: PlannedProgram | None = None  # the plan the artefact was lowered from (None: none)

    @property
    def pte(self) -> Path:
        return self.out_dir / PTE


@dataclass
class Lowered:
    target: Target  # what the program was lowered for
    pte: bytes
    planned: PlannedProgram | None  # None when nothing was planned (no partition)
    lowering_s: float
    serialisation_s: float
    files: dict[str, bytes] = field(default_factory=dict)  # written beside the .pte (model.vgf, ...)
    report: dict[str, Any] = field(default_factory=dict)  # target-specific figures for report.json
    edge: Any = None  # the EdgeProgramManager (VGF target), to run the program with its delegates elsewhere
    ptd: NamedData | None = None  # the program's external named data (model.ptd), if any

    @property
    def program(self) -> ProgramFiles:
        """The .pte with its .ptd: what runs."""
        return ProgramFiles(self.pte, self.ptd)


def _executorch_config(edge: Any, spec: CodecSpec) -> ExecutorchBackendConfig | None:
    """`to_executorch`'s configuration, None where the default serves:
      - the state of every buffer the program mutates (a KV cache a prompt filled)
        serialised with it, as export_llama does for its k_cache/v_cache on Arm's
        backends; by default ExecuTorch keeps only such a buffer's shape and dtype,
        and the runtime would start from zeros where eager, the simulation and the
        reference outputs start from its state (issue 51);
      - with external weights, the CPU operators' constants (SmolLM2's embedding
        table) in the same .ptd as the delegates' (ExecuTorch's external constants,
        under codec_tosa's tag), so that the .pte holds no large tensor."""
    sig = edge.exported_program().graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    names = [s.arg.name for s in sig.input_specs if s.kind == InputKind.BUFFER and s.target in mutated]
    config: dict[str, Any] = {}
    if names:
        config["passes"] = [InitializedMutableBufferPass(names)]
    if spec.external_weights:
        config["external_constants"] = external.cpu_constant_tag
    return ExecutorchBackendConfig(**config) if config else None


def lower_program(program: ExportedProgram, spec: CodecSpec,
                  calibration: Sequence[Sequence[torch.Tensor]] | None,
                  on_stage: lowering_progress.Callback | None = None,
                  on_step: lowering_progress.Callback | None = None) -> Lowered:
    """The README's Python recipe for `spec`, then `.to_executorch()`.

    A mixed policy: `to_edge_transform_and_lower` with a CodecTosaPartitioner
    (for VGF the delegate is Arm's VgfBackend, and each delegate's VGF
    and TOSA are kept). An integer-only spec (policy I, an Ethos-U target):
    Arm's PT2E flow with CodecQuantizer, then CodecTosaPartitioner (which tags
    with Arm's INT partitioner for the target). `on_stage` is called with each
    stage as it starts: placement + calibration, the TOSA lowering of each
    delegate, serialisation (`codec_tosa.progress`); `on_step` with each of Arm's
    passes inside a delegate's TOSA lowering as it starts."""
    target = target_of(spec.target)
    with lowering_progress.reporting(on_stage, steps=on_step):
        if spec.integer_only:
            return _lower_quantized(program, spec, target, calibration)
        return _lower_planned(program, spec, target, calibration)


def _lower_planned(program: ExportedProgram, spec: CodecSpec, target: Target,
                   calibration: Sequence[Sequence[torch.Tensor]] | None) -> Lowered:


    part = CodecTosaPartitioner(spec, calibration=calibration)
    t = time.perf_counter()
    try:
        edge = to_edge_transform_and_lower(program, partitioner=[part])
    except RuntimeError as e:
        said = target.lowering_error(e)  # the target's own tool's failure, in one line
        if said is not None:
            raise said from None
        raise
    lowering = time.perf_counter() - t
    t = time.perf_counter()
    lowering_progress.stage(lowering_progress.SERIALISATION)
    program = program_files(edge.to_executorch(_executorch_config(edge, spec)))
    require_delegate(program.pte, spec, "CodecTosaPartitioner")
    files, report = target.files(program)
    data_files, data_report = target.data_files(program)
    files.update(data_files)
    report.update(data_report)
    return Lowered(target, program.pte, part.planned, lowering, time.perf_counter() - t, files, report, edge,
                   program.ptd)


class NothingDelegated(ValueError):
    """The partitioner took no operator of the program: the .pte would run it all on the CPU."""


class UnsupportedDtype(ValueError):
    """A program input or output of a dtype no delegate of ours exchanges."""


# bfloat16 and the float8s: no TOSA-1.0 profile the targets here run takes them at
# a delegate's boundary (stock Arm delegates none of Arm's own bf16/fp8 test cases)
_UNSUPPORTED_DTYPES = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)


def check_boundary_dtypes(program: ExportedProgram) -> None:
    """Refuses, in one line, a program that takes or returns bfloat16 or float8."""
    sig = program.graph_signature
    nodes = {n.name: n for n in program.graph.nodes}
    outputs = list(program.graph.output_node().args[0])
    named = [(f"input {name}", nodes.get(name)) for name in sig.user_inputs if isinstance(name, str)]
    named += [(f"output {i}", o) for i, o in enumerate(outputs)]
    for what, node in named:
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.dtype in _UNSUPPORTED_DTYPES:
            raise UnsupportedDtype(f"{what} is {str(val.dtype).removeprefix('torch.')}: codec_tosa lowers "
                                   "float32, float16, integer and bool programs; cast the model and "
                                   "its inputs to float32 or float16")


def require_delegate(pte: bytes, spec: CodecSpec, who: str) -> Any:
    """The program's `PteInfo`; refuses a program without a delegate, in one line
    naming what stays on the CPU."""
    info = inspect_pte(pte)
    if info.delegate_ids:
        return info
    left = ", ".join(sorted(set(info.operators))) or "none"
    other = "a mixed policy such as policy='W'" if spec.policy == "I" else "another policy or target"
    raise NothingDelegated(f"policy {spec.policy}: {who} delegated nothing of this model (operators on "
                           f"the CPU: {left}); no artefact written; try {other}")


def _lower_quantized(program: ExportedProgram, spec: CodecSpec, target: Target,
                     calibration: Sequence[Sequence[torch.Tensor]] | None) -> Lowered:
    """Arm's PT2E flow with CodecQuantizer (docs/DESIGN.md, "Integer targets")."""

    target.check_ready()
    if not calibration:
        raise ValueError("calibration: no input tuples given")
    t = time.perf_counter()
    lowering_progress.stage(lowering_progress.PLACEMENT)
    quantizer = CodecQuantizer(spec)
    prepared = prepare_pt2e(program.module(check_guards=False), quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    if spec.after_calibration:  # widths under the budget, GPTQ-rounded weights: before convert
        search_data = list(calibration) + held_out_inputs(calibration[0], SEARCH_SAMPLES, SEARCH_SEED)
        quantizer.choose_precision(prepared, search_data)
    example = tuple(calibration[0])
    quantized = quantizer.tag_external_weights(torch.export.export(convert_pt2e(prepared), example))
    part = target.integer_partitioner(spec)
    with tempfile.TemporaryDirectory(prefix="codec-tosa-vela-") as vela_dir, target.lowering():
        with arm_adapter.vela_runs_kept(vela_dir) as runs:
            try:
                # decomposed once: kept as the plan's materialised program, then lowered
                edge = decomposed_for(quantized, part)
                materialized = copy.deepcopy(edge.exported_program())
                edge = edge.to_backend(part)
            except NotQuantizedError:
                # the quantizer annotated nothing: say so, not how to quantize
                raise NothingDelegated(
                    f"policy {spec.policy}: CodecQuantizer quantized nothing of this model (operators: "
                    f"{', '.join(_compute_operators(materialized))}); no artefact written; try a mixed "
                    "policy such as policy='W'") from None
            except (SystemExit, Exception) as e:  # Vela reports some refusals by exiting
                if runs or isinstance(e, SystemExit):  # the failure is Vela's
                    said = _vela_error_line(runs[-1].log if runs else "") or f"{type(e).__name__}: {e}"
                    raise VelaError(f"Vela failed on the TOSA for {spec.target}: {said}".splitlines()[0]) from None
                raise
        runs = [_kept_run(r) for r in runs]
    lowering = time.perf_counter() - t
    t = time.perf_counter()
    lowering_progress.stage(lowering_progress.SERIALISATION)
    program = program_files(edge.to_executorch(_executorch_config(edge, spec)))
    pte = program.pte
    serialisation = time.perf_counter() - t
    info = require_delegate(pte, spec, target.partitioner_name)
    t = time.perf_counter()
    planned = quantizer.planned(quantized, part, materialized)
    lowering += time.perf_counter() - t  # the plan's record is part of planning it
    # Vela's input, kept for `validate` (the .pte holds only its command stream)
    files = {delegate_file(k, "tosa"): run["tosa"] for k, run in enumerate(runs)}
    target_files, report = target.files(program)
    files.update(target_files)
    data_files, data_report = target.data_files(program)
    files.update(data_files)
    report.update(data_report)
    if spec.mixed_precision or spec.weights != INT8 or spec.weight_rounding != NEAREST:
        report["precision"] = precision_report(quantizer)
    if runs:

        report["vela"] = vela_report(runs, info.operators)
    return Lowered(target, pte, planned, lowering, serialisation, files, report, ptd=program.ptd)


def precision_report(quantizer: Any) -> dict[str, Any]:
    """report.json's ``precision``: each domain's and weight's width and why, and the
    search's figures."""
    a = quantizer.annotation
    plan = a.placement.plan
    domains = [{**p.to_json(), "dominator": " + ".join(plan.domains[p.domain].dominators)}
               for p in quantizer.precisions]
    out: dict[str, Any] = {"mode": quantizer.spec.precision,
                           "int16_domains": sum(1 for p in quantizer.precisions if p.bits == BITS16),
                           "domains": domains, "weights_mode": quantizer.spec.weights,
                           "int4_weights": sum(1 for w in quantizer.weight_precisions if w.bits == BITS4),
                           "weights": [w.to_json() for w in quantizer.weight_precisions],
                           "weight_rounding": quantizer.spec.weight_rounding,
                           "not_rounded": dict(quantizer.rounding_skipped)}
    result = getattr(quantizer, "search_result", None)
    if result is not None:
        out["search"] = result.to_json()
    return out


def _compute_operators(program: ExportedProgram) -> list[str]:

    return sorted({target_key(n.target) for n in program.graph.nodes
                   if n.op == "call_function" and target_key(n.target) != "getitem"})


def _kept_run(run: Any) -> dict[str, Any]:
    """What compile keeps of one Vela run before its directory goes: the TOSA and
    Vela's summary (vela_summary)."""
    return {"tosa": run.tosa, "summary": read_vela_summary(run.directory),
            "operators": vela_operator_counts(run.log), "compile_flags": run.flags}


def _vela_error_line(log: str) -> str:
    """Vela's own error message, from what it printed."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if "error" in ln.lower():
            return " ".join(lines[i:i + 2])
    return lines[-1] if lines else ""


def compile_model(model: str, spec: CodecSpec, out_dir: str | Path, calibration_size: int = 4,
                  progress: bool = True, samples: int | None = None,
                  on_stage: Callable[[str], None] | None = None, calibration: str | None = None,
                  inputs: str | None = None) -> CompileResult:
    """`compile_module` of a built-in model name or ``path/to/file.py:function``;
    `calibration` and `inputs` name files of input tuples (`tools.input_files`)."""
    return compile_module(model, None, spec, out_dir, calibration_size, progress, samples, on_stage,
                          calibration, inputs)


def compile_module(model: str, module: tuple[torch.nn.Module, tuple[Any, ...]] | None, spec: CodecSpec,
                   out_dir: str | Path, calibration_size: int = 4, progress: bool = True,
                   samples: int | None = None,
                   on_stage: Callable[[str], None] | None = None, calibration: str | None = None,
                   inputs: str | None = None) -> CompileResult:
    """Export `module` (model, example inputs; None: build `model`), partition
    (placement + calibration), lower and serialise; write the artefacts.

    Calibration is on the example and `calibration_size - 1` seeded random inputs, or on
    the tuples of the file `calibration` names; the held-out inputs stored for validate
    are seeded random ones, or the tuples of the file `inputs` names (both files:
    `tools.input_files`, read right after export, before any lowering).

    reference_io.npz holds the example input and `samples` seeded held-out
    inputs (`tools.samples`) with their eager and simulated outputs, for
    `validate` (docs/DESIGN.md, "Validation"); `samples` None: up to
    DEFAULT_SAMPLES, as many as keep the reference stage within REFERENCE_SHARE
    of the compile (at least MIN_SAMPLES). `on_stage` is called with each
    stage as it starts (export, the lowering's stages, reference outputs);
    `progress` shows them on a bar.

    Everything is written to a temporary directory first and moved into
    `out_dir` only when complete, so a failure leaves no partial artefact.
    """
    out = Path(out_dir)
    bar = tqdm(total=len(STAGES), desc="export", disable=not progress, leave=False)
    done: set[str] = set()

    def stage(name: str) -> None:
        # a delegate's lowering is one step of the bar however many delegates there are
        kind = name.split(":")[0]
        if kind not in done and kind in STAGES:
            done.add(kind)
            bar.n = STAGES.index(kind)
            bar.refresh()
        bar.set_description(name)
        if on_stage is not None:
            on_stage(name)

    # closed on failure too: a bar left open would share the error's line
    try:
        times: dict[str, float] = {}
        t = time.perf_counter()
        stage("export")
        loaded = load_and_export(model) if module is None else export_module(model, *module)
        times["export_s"] = time.perf_counter() - t
        check_boundary_dtypes(loaded.program)
        given = load_input_tuples(inputs, loaded.inputs, "--inputs") if inputs else None
        calib = (load_input_tuples(calibration, loaded.inputs, "--calibration") if calibration
                 else [loaded.inputs] + random_calibration(loaded.inputs, calibration_size - 1))
        # the bar also names the pass a long TOSA lowering is in (not an on_stage stage)
        lowered = lower_program(loaded.program, spec, calib, on_stage=stage,
                                on_step=bar.set_description if progress else None)
        pte, planned = lowered.pte, lowered.planned
        times["lowering_s"], times["serialisation_s"] = lowered.lowering_s, lowered.serialisation_s

        stage("reference outputs")
        held_out = given if given is not None else held_out_inputs(
            loaded.inputs, DEFAULT_SAMPLES if samples is None else samples)
        budget = (reference_budget(times["export_s"] + times["lowering_s"] + times["serialisation_s"])
                  if samples is None and given is None else None)
        t = time.perf_counter()
        # the outputs as the lowered program returns them (Arm's hooks may add an
        # input the model mutates in place to them)
        program = planned.program if planned is not None and planned.program is not None else loaded.program
        # XNNPACK requantizes in its own fixed point: the plan's simulation is not its
        # oracle, so its artefact is held to eager by SQNR (docs/DESIGN.md, "XNNPACK")
        ref = reference_outputs(planned, loaded.module, loaded.inputs, held_out, spec,
                                program.graph_signature, simulated=samples != 0 and lowered.target.simulated,
                                budget_s=budget, artefact=askable(lowered.program, lowered.target))
        times["reference_s"] = time.perf_counter() - t
        bar.n = len(STAGES)
        bar.refresh()
    finally:
        bar.close()

    report = build_report(model, spec, lowered.target, lowered.program, planned, times, lowered.report, ref,
                          lowered.files)
    write_artefacts(out, pte, ref.io, report, lowered.files)
    return CompileResult(out, report, tuple(lowered.files), ref.warnings, planned)


def build_report(model: str, spec: CodecSpec, target: Target, program: ProgramFiles,
                 planned: PlannedProgram | None, times: dict[str, float], target_report: dict[str, Any],
                 ref: Reference, tosa_files: dict[str, bytes] | None = None) -> dict[str, Any]:
    """report.json: the spec, the delegates as serialised, the modeled traffic."""
    pte = program.pte
    report: dict[str, Any] = {
        "model": model,
        "spec": spec.to_json(),
        "target": spec.target,
        "backend_id": target.backend_id,
        "pte_bytes": len(pte),
        "times": times,
    }
    # operators, constants, unfused and fused traffic of the delegates as serialised
    found = program_delegates(pte, ptd=program.ptd)
    report["tosa"] = found.summary()
    # the TOSA a VGF or Ethos-U delegate was compiled from, as compile and save keep it
    converted = {d.index: (delegate_file(k, "tosa"), tosa) for k, d in enumerate(found.other)
                 if (tosa := (tosa_files or {}).get(delegate_file(k, "tosa"))) is not None}
    report["memory"] = memory_summary(pte, found, converted)
    report.update(target_report)
    if planned is not None:
        tr = planned.traffic()
        report["modeled"] = {"traffic_mib": tr.traffic_bytes / MIB,
                             "lower_bound_mib": tr.lower_bound_bytes / MIB,
                             "storage_mib": tr.storage_bytes / MIB,
                             "codec_items_m": tr.codec_items / 1e6,
                             "domains": len(planned.placement.plan.domains),
                             "codecs": len(planned.placement.plan.codecs)}
    if ref.held_out:
        report["held_out"] = ref.held_out
    if ref.ambiguous is not None:
        report["ambiguous_codes"] = ref.ambiguous
    return report


def write_artefacts(out_dir: str | Path, pte: bytes, reference: ReferenceIO, report: dict[str, Any],
                    files: dict[str, bytes]) -> None:
    """model.pte, reference_io.npz, report.json and `files` (model.ptd, ...) into
    `out_dir`: written to a temporary directory first and moved in only when
    complete, so a failure leaves no partial artefact."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".codec-tosa-", dir=out.parent))
    try:
        (tmp / PTE).write_bytes(pte)
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        reference.save(tmp / REFERENCE_IO)
        (tmp / REPORT).write_text(json.dumps(report, indent=1))
        out.mkdir(parents=True, exist_ok=True)
        if PTD not in files:  # a .ptd an earlier compile left there is not this program's
            (out / PTD).unlink(missing_ok=True)
        for name in (PTE, REFERENCE_IO, REPORT, *files):
            (tmp / name).replace(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
