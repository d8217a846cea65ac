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

import numpy as np
import torch
from torch.export import ExportedProgram
from tqdm import tqdm

from codec_tosa import progress as lowering_progress  # compile_model has a `progress` flag
from codec_tosa.backend import BACKEND_ID
from codec_tosa.calibration import random_calibration
from codec_tosa.planning import PlannedProgram
from codec_tosa.simulation import Envelope, simulate, simulate_envelope
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.artefacts import PTE, REFERENCE_IO, REPORT, delegate_file
from codec_tosa.tools.loading import load_and_export
from codec_tosa.tools.report import program_delegates
from codec_tosa.tools.samples import DEFAULT_SAMPLES, held_out_inputs
from codec_tosa.units import MIB

# the bar's steps; a lowering reports its delegates as "TOSA lowering: delegate k"
STAGES = ("export", lowering_progress.PLACEMENT, "TOSA lowering", lowering_progress.SERIALISATION, "reference outputs")


@dataclass
class CompileResult:
    out_dir: Path
    report: dict[str, Any]
    files: tuple[str, ...] = ()  # written beside the .pte besides report.json and reference_io.npz
    warnings: list[str] = field(default_factory=list)  # e.g. an output's SQNR below the floor

    @property
    def pte(self) -> Path:
        return self.out_dir / PTE


@dataclass
class Lowered:
    pte: bytes
    planned: PlannedProgram | None  # None when nothing was planned (no partition)
    lowering_s: float
    serialisation_s: float
    files: dict[str, bytes] = field(default_factory=dict)  # written beside the .pte (model.vgf, ...)
    report: dict[str, Any] = field(default_factory=dict)  # target-specific figures for report.json
    edge: Any = None  # the EdgeProgramManager (VGF target), to run the program with its delegates elsewhere


def lower_program(program: ExportedProgram, spec: CodecSpec,
                  calibration: Sequence[Sequence[torch.Tensor]] | None,
                  on_stage: lowering_progress.Callback | None = None) -> Lowered:
    """The README's Python recipe for `spec`, then `.to_executorch()`.

    A mixed policy: `to_edge_transform_and_lower` with a CodecTosaPartitioner
    (target "vgf": the delegate is Arm's VgfBackend, and each delegate's VGF
    and TOSA are kept). An integer-only spec (policy I, an Ethos-U target):
    Arm's PT2E flow with CodecQuantizer, then CodecTosaPartitioner (which tags
    with Arm's INT partitioner for the target). `on_stage` is called with each
    stage as it starts: placement + calibration, the TOSA lowering of each
    delegate, serialisation (`codec_tosa.progress`)."""
    with lowering_progress.reporting(on_stage):
        if spec.integer_only:
            return _lower_quantized(program, spec, calibration)
        return _lower_planned(program, spec, calibration)


def _lower_planned(program: ExportedProgram, spec: CodecSpec,
                   calibration: Sequence[Sequence[torch.Tensor]] | None) -> Lowered:
    from executorch.exir import to_edge_transform_and_lower

    from codec_tosa.partitioner import CodecTosaPartitioner

    part = CodecTosaPartitioner(spec, calibration=calibration)
    t = time.perf_counter()
    try:
        edge = to_edge_transform_and_lower(program, partitioner=[part])
    except RuntimeError as e:  # Arm's vgf_compile: "Vgf compiler failed.\n...Stderr:\n..."
        if spec.target == "vgf" and str(e).startswith("Vgf compiler failed"):
            from codec_tosa.vgf.convert import conversion_error

            raise conversion_error("VgfBackend delegate", str(e).split("Stderr:", 1)[-1], 1) from None
        raise
    lowering = time.perf_counter() - t
    t = time.perf_counter()
    lowering_progress.stage(lowering_progress.SERIALISATION)
    pte = bytes(edge.to_executorch().buffer)
    files, report = (_vgf_files(pte) if spec.target == "vgf" else ({}, {}))
    return Lowered(pte, part.planned, lowering, time.perf_counter() - t, files, report, edge)


def _vgf_files(pte: bytes) -> tuple[dict[str, bytes], dict[str, Any]]:
    """model.vgf and model.tosa of each VgfBackend delegate, and report.json's account of them."""
    from codec_tosa import arm_adapter
    from codec_tosa.runtime.pte import delegates
    from codec_tosa.serialization.tosa_stats import tosa_stats

    files: dict[str, bytes] = {}
    report = []
    vgfs = [d.payload for d in delegates(pte) if d.backend_id == arm_adapter.VGF_BACKEND_ID]
    for i, vgf in enumerate(vgfs):
        tosa = arm_adapter.tosa_of_payload(vgf)
        if tosa is None:
            raise RuntimeError(f"VgfBackend delegate {i}: the TOSA it was converted from was not journaled")
        files[delegate_file(i, "vgf")], files[delegate_file(i, "tosa")] = vgf, tosa
        report.append({"delegate": i, "tosa_bytes": len(tosa), "vgf_bytes": len(vgf),
                       "tosa": tosa_stats(tosa).to_dict()})
    return files, {"vgf": report}


class VelaError(RuntimeError):
    """Vela is missing or refused the TOSA it was given (one line, Vela's message quoted)."""


class NothingDelegated(ValueError):
    """Arm's INT partitioner took no operator of the quantized program."""


def _lower_quantized(program: ExportedProgram, spec: CodecSpec,
                     calibration: Sequence[Sequence[torch.Tensor]] | None) -> Lowered:
    """Arm's PT2E flow with CodecQuantizer (docs/DESIGN.md, "Integer targets")."""
    import executorch.kernels.quantized  # noqa: F401  (out variants of the I/O quantize/dequantize)
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from codec_tosa import arm_adapter
    from codec_tosa.partitioner import CodecTosaPartitioner
    from codec_tosa.quantizer import CodecQuantizer

    if spec.ethos_u:
        arm_adapter.ethos_u_compile_spec(spec.target)  # an unknown target fails before any work
        if not arm_adapter.vela_available():
            raise VelaError(f"--target {spec.target} needs Vela: pip install ethos-u-vela==5.2.0")
    if not calibration:
        raise ValueError("calibration: no input tuples given")
    t = time.perf_counter()
    lowering_progress.stage(lowering_progress.PLACEMENT)
    quantizer = CodecQuantizer(spec)
    prepared = prepare_pt2e(program.module(check_guards=False), quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    example = tuple(calibration[0])
    quantized = torch.export.export(convert_pt2e(prepared), example)
    part = CodecTosaPartitioner(spec)
    with tempfile.TemporaryDirectory(prefix="codec-tosa-vela-") as vela_dir:
        with arm_adapter.vela_runs_kept(vela_dir) as runs:
            try:
                edge = to_edge_transform_and_lower(copy.deepcopy(quantized), partitioner=[part])
            except (SystemExit, Exception) as e:  # Vela reports some refusals by exiting
                if runs or isinstance(e, SystemExit):  # the failure is Vela's
                    said = _vela_error_line(runs[-1].log if runs else "") or f"{type(e).__name__}: {e}"
                    raise VelaError(f"Vela failed on the TOSA for {spec.target}: {said}".splitlines()[0]) from None
                raise
        runs = [_kept_run(r) for r in runs]
    lowering = time.perf_counter() - t
    t = time.perf_counter()
    lowering_progress.stage(lowering_progress.SERIALISATION)
    pte = bytes(edge.to_executorch().buffer)
    serialisation = time.perf_counter() - t
    from codec_tosa.runtime.pte import inspect_pte

    info = inspect_pte(pte)
    if not info.delegate_ids:
        left = ", ".join(sorted(set(info.operators))) or "none"
        raise NothingDelegated(f"policy {spec.policy}: Arm's INT partitioner delegated nothing of this "
                               f"model (operators on the CPU: {left}); lower it at a mixed policy "
                               "such as --policy W instead")
    planned = quantizer.planned(quantized, part)
    # Vela's input, kept for `validate` (the .pte holds only its command stream)
    files = {delegate_file(k, "tosa"): run["tosa"] for k, run in enumerate(runs)}
    report: dict[str, Any] = {}
    if runs:
        from codec_tosa.tools.vela_summary import vela_report

        report["vela"] = vela_report(runs, info.operators)
    return Lowered(pte, planned, lowering, serialisation, files, report)


def _kept_run(run: Any) -> dict[str, Any]:
    """What compile keeps of one Vela run before its directory goes: the TOSA and
    Vela's summary (tools/vela_summary)."""
    from codec_tosa.tools.vela_summary import read_vela_summary, vela_operator_counts

    return {"tosa": run.tosa, "summary": read_vela_summary(run.directory),
            "operators": vela_operator_counts(run.log)}


def _vela_error_line(log: str) -> str:
    """Vela's own error message, from what it printed."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if "error" in ln.lower():
            return " ".join(lines[i:i + 2])
    return lines[-1] if lines else ""


def compile_model(model: str, spec: CodecSpec, out_dir: str | Path, calibration_size: int = 4,
                  progress: bool = True, samples: int = DEFAULT_SAMPLES,
                  on_stage: Callable[[str], None] | None = None) -> CompileResult:
    """Export, partition (placement + calibration), lower and serialise; write the artefacts.

    reference_io.npz holds the example input and `samples` seeded held-out
    inputs (`tools.samples`) with their eager and simulated outputs, for
    `validate` (docs/DESIGN.md, "Validation"). `on_stage` is called with each
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
        loaded = load_and_export(model)
        times["export_s"] = time.perf_counter() - t

        calib = [loaded.inputs] + random_calibration(loaded.inputs, calibration_size - 1)
        lowered = lower_program(loaded.program, spec, calib, on_stage=stage)
        pte, planned = lowered.pte, lowered.planned
        times["lowering_s"], times["serialisation_s"] = lowered.lowering_s, lowered.serialisation_s

        stage("reference outputs")
        held_out = held_out_inputs(loaded.inputs, samples)
        t = time.perf_counter()
        ref = reference_stage(planned, loaded.module, loaded.inputs, held_out, spec)
        times["reference_s"] = time.perf_counter() - t
        bar.n = len(STAGES)
        bar.refresh()
    finally:
        bar.close()

    report = build_report(model, spec, pte, planned, times, lowered.report, ref)
    write_artefacts(out, pte, ref.arrays, report, lowered.files)
    return CompileResult(out, report, tuple(lowered.files), ref.warnings)


@dataclass
class Reference:
    """What the reference stage computed: reference_io.npz's arrays, report.json's
    account of the ambiguous codes, and the SQNR warnings."""

    arrays: dict[str, np.ndarray]
    ambiguous: dict[str, Any] | None
    warnings: list[str]


def reference_stage(planned: PlannedProgram | None, module: Callable[..., Any],
                    inputs: Sequence[torch.Tensor], held_out: Sequence[Sequence[torch.Tensor]],
                    spec: CodecSpec) -> Reference:
    """Eager and simulated outputs of the example and the held-out inputs, with the
    allowance of the ambiguous codes (docs/DESIGN.md, "Validation")."""
    with torch.no_grad():
        eager = _as_list(module(*inputs))
        sample_eager = [_as_list(module(*x)) for x in held_out]
    envelopes = ([simulate_envelope(planned, x) for x in [inputs, *held_out]]
                 if planned is not None and not spec.reference else [])
    if envelopes:
        simulated, sample_simulated = envelopes[0].outputs, [e.outputs for e in envelopes[1:]]
    else:
        simulated = simulate(planned, inputs) if planned is not None else eager
        sample_simulated = [simulate(planned, x) for x in held_out] if planned is not None else sample_eager
    sensitivity = (rounding_sensitivity(planned, inputs, simulated)
                   if planned is not None and not spec.reference else None)
    fallback = fp32_steps(eager)
    steps = planned.output_steps(fallback) if planned is not None else fallback
    arrays = {**reference_io(inputs, eager, simulated, steps, sensitivity, held_out, sample_eager,
                             sample_simulated), **envelope_arrays(envelopes)}
    # the simulation is bit-exact with the artefact (validate checks it), so its
    # SQNR is the artefact's
    warnings = sqnr_warnings([eager, *sample_eager], [simulated, *sample_simulated])
    return Reference(arrays, envelope_summary(envelopes) if envelopes else None, warnings)


def build_report(model: str, spec: CodecSpec, pte: bytes, planned: PlannedProgram | None,
                 times: dict[str, float], target_report: dict[str, Any], ref: Reference) -> dict[str, Any]:
    """report.json: the spec, the delegates as serialised, the modeled traffic."""
    report: dict[str, Any] = {
        "model": model,
        "spec": spec.to_json(),
        "target": spec.target,
        "backend_id": backend_id(spec),
        "pte_bytes": len(pte),
        "times": times,
    }
    # operators, constants, unfused and fused traffic of the delegates as serialised
    report["tosa"] = program_delegates(pte).summary()
    report.update(target_report)
    if planned is not None:
        tr = planned.traffic()
        report["modeled"] = {"traffic_mib": tr.traffic_bytes / MIB,
                             "lower_bound_mib": tr.lower_bound_bytes / MIB,
                             "storage_mib": tr.storage_bytes / MIB,
                             "codec_items_m": tr.codec_items / 1e6,
                             "domains": len(planned.placement.plan.domains),
                             "codecs": len(planned.placement.plan.codecs)}
    if ref.ambiguous is not None:
        report["ambiguous_codes"] = ref.ambiguous
    return report


def write_artefacts(out_dir: str | Path, pte: bytes, arrays: dict[str, np.ndarray], report: dict[str, Any],
                    files: dict[str, bytes]) -> None:
    """model.pte, reference_io.npz, report.json and `files` into `out_dir`: written to
    a temporary directory first and moved in only when complete, so a failure
    leaves no partial artefact."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".codec-tosa-", dir=out.parent))
    try:
        (tmp / PTE).write_bytes(pte)
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        np.savez(tmp / REFERENCE_IO, **arrays)
        (tmp / REPORT).write_text(json.dumps(report, indent=1))
        out.mkdir(parents=True, exist_ok=True)
        for name in (PTE, REFERENCE_IO, REPORT, *files):
            (tmp / name).replace(out / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)




def backend_id(spec: CodecSpec) -> str:
    """The id of the delegates `spec` makes."""
    from codec_tosa import arm_adapter

    if spec.target == "vgf":
        return arm_adapter.VGF_BACKEND_ID
    return arm_adapter.ETHOS_U_BACKEND_ID if spec.ethos_u else BACKEND_ID


def reference_io(inputs: Sequence[torch.Tensor], eager: Sequence[torch.Tensor],
                 simulated: Sequence[torch.Tensor], steps: Sequence[float],
                 sensitivity: Sequence[float] | None = None,
                 sample_inputs: Sequence[Sequence[torch.Tensor]] = (),
                 sample_eager: Sequence[Sequence[torch.Tensor]] = (),
                 sample_simulated: Sequence[Sequence[torch.Tensor]] = ()) -> dict[str, np.ndarray]:
    """The arrays of reference_io.npz, as `validate` reads them: the example's
    input_i, eager_i, simulated_i; the held-out samples stacked on a leading
    sample axis as sample_input_i, sample_eager_i, sample_simulated_i; per
    output its step_i and sensitivity_i."""
    arrays = {**{f"input_{i}": x.detach().numpy() for i, x in enumerate(inputs)},
              **{f"eager_{i}": y.detach().numpy() for i, y in enumerate(eager)},
              **{f"simulated_{i}": y.detach().numpy() for i, y in enumerate(simulated)},
              **{f"step_{i}": np.float64(st) for i, st in enumerate(steps)},
              **{f"sensitivity_{i}": np.float64(s) for i, s in enumerate(sensitivity or ())}}
    for name, cases in (("input", sample_inputs), ("eager", sample_eager), ("simulated", sample_simulated)):
        if cases:
            for i in range(len(cases[0])):
                arrays[f"sample_{name}_{i}"] = np.stack([c[i].detach().numpy() for c in cases])
    return arrays


def envelope_arrays(envelopes: Sequence[Envelope]) -> dict[str, np.ndarray]:
    """The envelopes in reference_io.npz, per input set (the example, then the
    samples): ambiguous_codes and envelope_complete; per output, when some code
    is ambiguous, allowance_i (the example's) and sample_allowance_i."""
    if not envelopes:
        return {}
    arrays = {"ambiguous_codes": np.array([len(e.ambiguous) for e in envelopes], dtype=np.int64),
              "envelope_complete": np.array([e.complete for e in envelopes])}
    if any(e.ambiguous for e in envelopes):
        for i in range(len(envelopes[0].allowance)):
            arrays[f"allowance_{i}"] = envelopes[0].allowance[i].numpy()
            if len(envelopes) > 1:
                arrays[f"sample_allowance_{i}"] = np.stack([e.allowance[i].numpy() for e in envelopes[1:]])
    return arrays


def envelope_summary(envelopes: Sequence[Envelope]) -> dict[str, Any]:
    """report.json's account of the ambiguous codes, per input set (the example first)."""
    from codec_tosa.rounding_ambiguity import FP32_EPS

    return {"per_input_set": [len(e.ambiguous) for e in envelopes],
            "total": sum(len(e.ambiguous) for e in envelopes),
            "encodes": sorted({a.node for e in envelopes for a in e.ambiguous}),
            "resimulations": sum(e.resimulations for e in envelopes),
            "complete": all(e.complete for e in envelopes),
            "fp32_eps": FP32_EPS}


def sqnr_warnings(eager: Sequence[Sequence[torch.Tensor]], approx: Sequence[Sequence[torch.Tensor]]
                  ) -> list[str]:
    """A warning per output whose worst SQNR against FP32 eager, over the given
    cases, is below `SQNR_FLOOR_DB`."""
    from codec_tosa.tools.validate import sqnr_warning, sqnr_db

    out = []
    for i in range(len(eager[0]) if eager else 0):
        worst = min(sqnr_db(e[i].detach().numpy(), a[i].detach().numpy().reshape(e[i].shape))
                    for e, a in zip(eager, approx))
        w = sqnr_warning(i, worst, "the simulation of the plan")
        if w:
            out.append(w)
    return out


def one_ulp_away(inputs: Sequence[torch.Tensor], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Every floating-point input element moved one ulp up or down (at random)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if x.is_floating_point():
            up = torch.rand(x.shape, generator=gen) < 0.5
            x = torch.nextafter(x, torch.where(up, torch.inf, -torch.inf).to(x.dtype))
        out.append(x)
    return tuple(out)


def rounding_sensitivity(planned: PlannedProgram, inputs: Sequence[torch.Tensor],
                         simulated: Sequence[torch.Tensor]) -> list[float]:
    """max |simulation(inputs one ulp away) - simulation(inputs)| per output.

    A lower bound on how far two correct implementations of the plan can differ
    when they round differently: a deep model can amplify one flipped code into
    many quantisation steps at its outputs (validate reports it beside the
    one-step criterion)."""
    moved = simulate(planned, one_ulp_away(inputs))
    return [float((m.reshape(s.shape) - s).abs().max()) if s.numel() else 0.0
            for m, s in zip(moved, simulated)]


def fp32_steps(outputs: Sequence[torch.Tensor]) -> list[float]:
    """One "step" of an output computed in FP32: its range / 255."""
    return [float(e.max() - e.min()) / 255.0 if e.numel() else 0.0 for e in outputs]


def _as_list(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    if hasattr(out, "values"):  # ModelOutput-like
        return [t for t in out.values() if isinstance(t, torch.Tensor)]
    raise TypeError(f"model output of type {type(out).__name__} is not a tensor or a tuple of tensors")
