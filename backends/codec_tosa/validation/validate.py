"""Validate a .pte against independent references (docs/DESIGN.md, "Validation").

Each delegate call is run again on the TOSA reference model and must equal
the runtime's bit for bit (the runtime is ExecuTorch with our C++
CodecTosaBackend, or for a VgfBackend .pte the VGF on the ML SDK emulation
layer; an EthosUBackend .pte runs with the TOSA Vela was given standing in for
Vela's command stream, which nothing here executes). Each program output is held to its plan's criterion: policy Z within
1e-4 relative of FP32 eager; a compressed policy within one quantisation step
of the PyTorch simulation of its plan (the scale of the domain the output is
decoded from, as compile records it; else the output's range / 255) beyond
how far the codes the artefact may round the other way move it (compile's
allowance, `simulation.simulate_envelope`), with its SQNR against FP32 eager
reported and warned about below `SQNR_FLOOR_DB`.

Besides, the program as planned, in FP32 before any codec (`reference_io`,
``planned``), must equal FP32 eager to policy Z's tolerance: an oracle that
shares nothing with the codecs, so a structural error in the lowering (an
operator decomposed wrongly, a batch norm folded wrongly) fails even where the
simulation shares it.

Every check runs on the example input and on held-out samples and reports the
worst case. The verdict is PASS only when every delegate output and every
program output was compared against an independent reference; INCOMPLETE
when something could not be, FAIL when a comparison failed.

The stages, each a function: `detect_target` (which delegates, which runtime,
the TOSA each one ran from), `input_sets` (from reference_io.npz, a rebuilt
model, given inputs, or drawn from the program's input specs), a runner
(`_ExecuTorchRunner`, `_VgfRunner`), and `compare`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import torch

from codec_tosa.pytrees import leaves
from codec_tosa.runtime import BACKEND_ID
from codec_tosa.runtime.executorch_runner import PteRunError
from codec_tosa.runtime.executorch_runner import run_pte_recorded
from codec_tosa.runtime.pte import (NamedData, ProgramFiles, PteError, PteInfo, delegates, inspect_pte, read_pte,
                                    with_delegates_replaced)
from codec_tosa.serialization import external
from codec_tosa.serialization.tosa_stats import entry_io_counts
from codec_tosa.serialization.tosa_stats import tosa_stats
from codec_tosa.targets import target_in
from codec_tosa.targets.artefacts import REPORT, delegate_file
from codec_tosa.targets.base import RELABELLED, TOSA_STAND_IN, VGF_EMULATION, Target
from codec_tosa.targets.named_data import named_data_for
from codec_tosa.targets.vgf.run import run_vgf
from codec_tosa.validation.metrics import (SQNR_FLOOR_DB, Z_RTOL, differences, finite_span, max_difference, sqnr_db,
                                      sqnr_warning)
from codec_tosa.validation.reference_io import FILE as REFERENCE_IO, InputSet, ReferenceIO, program_outputs
from codec_tosa.validation.reference_model import ReferenceModelError, run_reference_model
from codec_tosa.validation.samples import DEFAULT_SAMPLES, held_out_inputs, inputs_for_specs
from codec_tosa.validation.simulation import MAX_FLIPS

if TYPE_CHECKING:
    from codec_tosa.serialization.tosa_stats import TosaStats


class Verdict(str, Enum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCOMPLETE = "INCOMPLETE"  # nothing failed, but something could not be compared


EXIT_STATUS = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.INCOMPLETE: 3}


class ValidationError(PteError):
    """The .pte or its inputs are unusable (one line, names the file and reason)."""


Case = InputSet  # one input set, with what the model and its plan make of it


@dataclass
class DelegateCall:
    """One delegate call as the runtime made it: the reference model must
    reproduce its outputs bit for bit from its inputs. Built today from the
    program's own inputs and outputs where the call reads and writes them
    directly (`delegate_wirings`); a runtime that records each call's real
    inputs and outputs hands them here unchanged."""

    delegate: int  # the delegate's index among the method's delegates
    tosa: bytes
    inputs: list[np.ndarray]
    outputs: list[np.ndarray | None]  # the runtime's output k of the call; None: not observed


def compare_call(call: DelegateCall, path: str | Path, fp32_rtol: float = 0.0) -> list[float | None]:
    """max |reference model - runtime| per output of the call (None: not observed),
    beyond `fp32_rtol` of the reference's span on a floating-point output (0: bit for
    bit). Raises ReferenceModelError when the reference model cannot run it."""
    ref = run_reference_model(call.tosa, call.inputs, path)
    out_diffs: list[float | None] = []
    for k, out in enumerate(call.outputs):
        if out is None:
            out_diffs.append(None)
            continue
        r = ref[k].reshape(out.shape)
        d = max_difference(r, out)
        if fp32_rtol and np.issubdtype(r.dtype, np.floating):
            d = max(0.0, d - fp32_rtol * finite_span(r))
        out_diffs.append(d)
    return out_diffs


@dataclass
class DelegateCheck:
    """Reference model vs runtime for one delegate, worst over the input sets."""

    delegate: int
    backend_id: str
    max_abs: list[float | None]  # per delegate output; None: never compared
    reason: str | None = None  # why it could not run on the reference model
    calls: int = 0  # calls the runtime recorded over the input sets
    fp32_rtol: float = 0.0  # max_abs of an FP32 output is what lies beyond this share of its span
    # outputs that are program outputs, judged there against the simulation with the
    # allowance of the ambiguous codes, not here (a VGF: a GPU's FP32 may round an
    # ambiguous code the other way, which moves its output by a step)
    deferred: tuple[int, ...] = ()

    @property
    def failed(self) -> bool:
        return any(m is not None and m != 0.0 for k, m in enumerate(self.max_abs) if k not in self.deferred)

    @property
    def complete(self) -> bool:
        return self.reason is None and all(m is not None for m in self.max_abs)

    def line(self, runtime: str) -> str:
        head = f"delegate {self.delegate} ({self.backend_id}): reference model vs {runtime}"
        if self.reason is not None:
            return f"{head}: not compared ({self.reason})"
        if not self.calls:
            # called by the plan (else validate notes it), so from a branch not taken
            return (f"{head}: not compared: it never ran on these input sets (a control-flow "
                    "branch none of them takes): incomplete")
        seen = [m for m in self.max_abs if m is not None]
        unseen = [k for k, m in enumerate(self.max_abs) if m is None]
        beyond = f" beyond {self.fp32_rtol:g} of the span on FP32 outputs" if self.fp32_rtol else ""
        worst = f"max |diff|{beyond} {max(seen):.3g}" if seen else "nothing compared"
        missing = (f"; outputs {unseen} feed the CPU and were not compared" if unseen else "")
        if self.deferred and any(self.max_abs[k] for k in self.deferred):
            missing += (f"; output{'s' if len(self.deferred) > 1 else ''} {', '.join(map(str, self.deferred))} "
                        "held to the simulation below instead (program outputs: the allowance of the "
                        "ambiguous codes covers a code the GPU's FP32 rounds the other way)")
        return f"{head}: {worst} on {len(seen)} of {len(self.max_abs)} outputs{missing}: " + \
            ("FAIL" if self.failed else "ok" if not unseen else "incomplete")


@dataclass
class OutputCheck:
    """One program output, worst over the input sets."""

    index: int
    # worst |reference model - runtime| of the delegate output this program output is (NaN: none)
    ref_vs_runtime_max_abs: float
    vs_expected_max_abs: float | None  # at the worst case relative to its tolerance
    tolerance: float | None
    sqnr_db: float | None  # worst (lowest) over the input sets
    sensitivity: float | None = None  # how far the simulation moves under one ulp of input (diagnostic)
    step: float | None = None  # one quantisation step of the output (compressed policies)
    worst_case: str | None = None  # the input set of the worst |out - expected|
    sqnr_case: str | None = None
    computed: bool = True  # False: the runner could not compute this output (a VGF beside CPU operators)
    # the worst |out - expected| beyond the allowance of the ambiguous codes, at the worst case
    beyond_allowance: float | None = None
    allowance: float = 0.0  # the largest allowance at the worst case
    needs_incomplete_envelope: bool = False  # within tolerance only thanks to a truncated envelope
    # beyond tolerance only on input sets whose envelope is truncated: the most steps
    # beyond the allowance there (the verdict cannot tell a codec error from rounding)
    undecided_steps: float = 0.0
    # the program as planned, FP32 and no codec, against eager (the structural oracle)
    planned_max_abs: float | None = None
    planned_tolerance: float | None = None
    planned_case: str | None = None

    @property
    def planned_failed(self) -> bool:
        return self.planned_max_abs is not None and self.planned_max_abs > (self.planned_tolerance or 0.0)

    @property
    def steps(self) -> float | None:
        """The worst |out - simulation| in quantisation steps."""
        if self.vs_expected_max_abs is None or not self.step:
            return None
        return self.vs_expected_max_abs / self.step

    @property
    def within_rounding_sensitivity(self) -> bool:
        """Beyond the tolerance, but no farther than the expected output moves itself
        under a one-ulp change of the inputs."""
        d = self.vs_expected_max_abs
        return (self.sensitivity is not None and d is not None
                and (self.tolerance or 0.0) < d <= self.sensitivity)

    @property
    def failed(self) -> bool:
        exact = self.ref_vs_runtime_max_abs == 0.0 or math.isnan(self.ref_vs_runtime_max_abs)
        d = self.vs_expected_max_abs if self.beyond_allowance is None else self.beyond_allowance
        within = d is None or d <= (self.tolerance or 0.0)
        return not (exact and within) or self.planned_failed

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass
class Validation:
    pte: str
    policy: str
    expected: str  # "eager", "simulation" or "none"
    reference_model_ran: bool
    outputs: list[OutputCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    delegates: list[DelegateCheck] = field(default_factory=list)
    cases: int = 0
    case_kinds: str = ""
    runtime: str = "runtime"
    warnings: list[str] = field(default_factory=list)
    ambiguous_codes: int = 0  # over the input sets (compile's `simulate_envelope`)
    # per input set whose ambiguous codes the artefact's rounding decided at compile,
    # how many it rounded the other way (tools/artefact_rounding)
    artefact_flipped: list[int] = field(default_factory=list)

    @property
    def not_compared(self) -> list[str]:
        """What could not be compared against an independent reference."""
        missing = [d.line(self.runtime) for d in self.delegates if not d.complete]
        missing += [f"output {o.index}: within tolerance only with an envelope that flipped the first "
                    "ambiguous codes alone, not all of them" for o in self.outputs if o.needs_incomplete_envelope]
        missing += [f"output {o.index}: {o.undecided_steps:.3g} steps beyond the allowance of the ambiguous "
                    f"codes flipped together, on an input set with more than {MAX_FLIPS} of them, too many "
                    "to flip each alone: a codec error cannot be told from ambiguous rounding there (see "
                    "the SQNR and the planned program against eager)" for o in self.outputs if o.undecided_steps]
        missing += [f"output {o.index}: not computed by the {self.runtime}" for o in self.outputs
                    if not o.computed]
        if self.expected == "none":
            missing.append("program outputs: no " + ("eager output" if self.policy == "Z" else
                                                     "simulation of the plan") + " to compare with")
        elif self.expected == "simulation":
            missing += [f"output {o.index}: the program as planned (FP32, no codec) against FP32 eager "
                        "(no FP32 model was given)" for o in self.outputs
                        if o.computed and o.planned_max_abs is None]
        return missing

    @property
    def verdict(self) -> Verdict:
        if any(d.failed for d in self.delegates) or any(o.failed for o in self.outputs):
            return Verdict.FAIL
        return Verdict.INCOMPLETE if self.not_compared else Verdict.PASS

    @property
    def exit_status(self) -> int:
        return EXIT_STATUS[self.verdict]

    def lines(self) -> list[str]:
        against = {"none": "nothing independent", "eager": "FP32 eager"}.get(self.expected, self.expected)
        out = [f"{self.pte}: policy {self.policy}, {self.cases} input set{'s' * (self.cases != 1)} "
               f"({self.case_kinds}), outputs compared against {against}"]
        out += [f"  {d.line(self.runtime)}" for d in self.delegates]
        for o in self.outputs:
            parts = []
            if not o.computed:
                parts.append(f"not computed by the {self.runtime}")
            if o.vs_expected_max_abs is not None:
                in_steps = "" if o.steps is None else f" = {o.steps:.3g} steps of {o.step:.3g}"
                beyond = ""
                if o.beyond_allowance is not None:
                    beyond = (f", {max(o.beyond_allowance, 0.0):.3g} beyond the ambiguous codes' allowance "
                              f"{o.allowance:.3g}")
                parts.append(f"worst |out - {self.expected}| {o.vs_expected_max_abs:.3g}{in_steps}{beyond} "
                             f"(tolerance {o.tolerance:.3g}, on {o.worst_case})")
            if o.sqnr_db is not None:
                parts.append(f"SQNR vs FP32 eager worst {o.sqnr_db:.1f} dB (on {o.sqnr_case})")
            if o.planned_max_abs is not None:
                parts.append(f"planned FP32 program vs eager {o.planned_max_abs:.3g} (tolerance "
                             f"{o.planned_tolerance:.3g}{', a structural error' if o.planned_failed else ''})")
            status = "FAIL" if o.failed else "ok" if o.computed and self.expected != "none" else "incomplete"
            out.append(f"  output {o.index}: {', '.join(parts) or 'nothing compared'}: {status}")
        out += [f"  note: output {o.index} is off by more than one step, but the {self.expected} itself "
                f"moves by up to {o.sensitivity:.3g} when the inputs move by one ulp: this model amplifies "
                "rounding beyond one step, so that criterion cannot tell a miscompilation here (see the SQNR)"
                for o in self.outputs if o.within_rounding_sensitivity]
        if self.expected == "simulation":
            how = "each re-simulated flipped"
            if self.artefact_flipped:
                how = (f"on {len(self.artefact_flipped)} input set{'s' * (len(self.artefact_flipped) != 1)} with "
                       f"more than {MAX_FLIPS}, each decided by the artefact's own rounding on the reference "
                       f"model at compile ({sum(self.artefact_flipped)} the other way), every other code the "
                       "simulation's; elsewhere each re-simulated flipped")
            out.append(f"  ambiguous codes: {self.ambiguous_codes} (encodes of FP32 values the artefact computes "
                       f"with other roundings, near a rounding boundary; {how})")
        out += [f"  warning: {w}" for w in self.warnings]
        out += [f"  note: {n}" for n in self.notes]
        if self.verdict is Verdict.INCOMPLETE:
            out += [f"  not compared: {m}" for m in self.not_compared]
        out.append(self.verdict.value)
        return out


def payload_stats(payload: bytes, path: str | Path, backend_id: str = BACKEND_ID) -> "TosaStats":
    """The payload's TOSA statistics; walking the flatbuffer in Python also refuses
    a corrupt payload before the reference model (which does not verify its
    input) can crash on it."""
    try:
        return tosa_stats(payload)
    except ValueError as e:
        raise ValidationError(f"{path}: the {backend_id} delegate is unusable: {e}") from None


@dataclass(frozen=True)
class DelegateWiring:
    """How the program's inputs and outputs meet one delegate call, read from the
    delegate call in the .pte (the reference model runs the delegate alone, so
    without recorded calls it can only be compared where the two coincide)."""

    delegate: int
    input_positions: tuple[int, ...] | None  # per delegate input its program input; None: CPU-fed
    outputs: int  # how many outputs the delegate has
    output_of: tuple[int | None, ...]  # for each program output: its delegate output, if any
    reason: str | None = None  # why input_positions is None


def delegate_wirings(info: PteInfo, backend_id: str, io_counts: dict[int, tuple[int, int]],
                     path: str | Path) -> list[DelegateWiring]:
    """One wiring per call of a `backend_id` delegate; `io_counts[d]` is delegate
    d's (inputs, outputs). Raises ValidationError when a call does not match its graph."""
    wirings = []
    for call in info.delegate_calls:
        if call.delegate_id != backend_id:
            continue
        n_in, n_out = io_counts[call.delegate_index]
        args = call.tensor_args
        if len(args) != n_in + n_out:
            raise ValidationError(f"{path}: the delegate call passes {len(args)} tensors to a TOSA graph "
                                  f"with {n_in} inputs and {n_out} outputs")
        ins, outs = args[:n_in], args[n_in:]
        output_of = tuple(outs.index(v) if v in outs else None for v in info.outputs)
        if any(a not in info.inputs for a in ins):
            reason = f"it reads values computed on the CPU (CPU operators {sorted(set(info.operators))})"
            wirings.append(DelegateWiring(call.delegate_index, None, n_out, output_of, reason))
        else:
            wirings.append(DelegateWiring(call.delegate_index, tuple(info.inputs.index(a) for a in ins),
                                          n_out, output_of))
    return wirings


# ------------------------------------------------------------------ input sets


def cases_from_module(module: Callable[..., object], example: Sequence[object],
                      samples: int, given: Sequence[Sequence[object]] = ()) -> list[InputSet]:
    """The rebuilt model's example and `samples` held-out inputs (or the `given` ones),
    with eager outputs (the example may be nested as the model takes it; the program
    takes its leaves)."""
    cases = []
    held_out = [tuple(x) for x in given] if given else held_out_inputs(example, samples)
    for label, x in [("example", tuple(example))] + [(f"sample {s}", x) for s, x in enumerate(held_out)]:
        eager = [t.detach().numpy() for t in program_outputs(module, x)]
        cases.append(InputSet(label, leaves(x), eager))
    return cases


def _describe(cases: list[Case]) -> str:
    kinds = [c.label.split(" ")[0] for c in cases]
    named = {"example": "the example", "sample": "held-out samples", "random": "random inputs",
             "given": "the given inputs"}
    counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
    return " and ".join(named.get(k, k) if n == 1 and k != "sample" else f"{n} {named.get(k, k)}"
                        for k, n in counts.items())


# ------------------------------------------------------------------ runners


@dataclass
class _Delegate:
    index: int
    backend_id: str
    payload: bytes  # what the runtime runs (TOSA, or a VGF file)
    tosa: bytes | None  # what the reference model runs; None: not available
    io: tuple[int, int]


class _Runner:
    """Runs the program on one input set; returns its outputs (None where it cannot
    compute one) and the delegate calls it observed."""

    name = "runtime"
    # whether it observes what each delegate call really read, a call fed by CPU
    # operators included (otherwise such a call cannot be compared)
    records_calls = True
    # how far a delegate's floating-point output may be from the reference model's,
    # relative to its span: 0, bit for bit, where the runtime runs the reference model
    fp32_rtol = 0.0

    def run(self, case: Case) -> tuple[list[np.ndarray | None], list[DelegateCall]]:
        raise NotImplementedError


class _ExecuTorchRunner(_Runner):
    """The whole program in ExecuTorch with our C++ backend, which records every
    delegate call's real inputs and outputs (`run_pte_recorded`): delegates fed
    by CPU operators, and each of several delegates, are compared too."""

    name = "runtime"

    def __init__(self, data: ProgramFiles, pte: str | Path, wirings: list[DelegateWiring],
                 by_index: dict[int, _Delegate]) -> None:
        self.data, self.pte, self.wirings, self.by_index = data, pte, wirings, by_index

    def run(self, case: Case) -> tuple[list[np.ndarray | None], list[DelegateCall]]:
        try:
            outputs, recorded = run_pte_recorded(self.data, case.inputs)
        except PteRunError as e:
            raise self._failure(case, e) from None
        calls = [DelegateCall(r.delegate_index, self.by_index[r.delegate_index].tosa or r.payload,
                              r.inputs, list(r.outputs))
                 for r in recorded if r.delegate_index in self.by_index]
        return [t.detach().numpy() for t in outputs], calls

    def _failure(self, case: Case, error: PteRunError) -> ValidationError:
        """The reference model's reason, where it has one, is the readable one: on the
        program inputs a delegate reads, and for a delegate fed by the CPU, on the
        inputs the runtime recorded for the last call it made (the failing one)."""
        attempts = [(self.by_index[w.delegate].tosa, [case.inputs[i].numpy() for i in w.input_positions])
                    for w in self.wirings if w.input_positions is not None]
        last = next((c for c in reversed(error.calls)
                     if c.delegate_index in self.by_index and self.by_index[c.delegate_index].tosa is not None), None)
        if last is not None:
            attempts.append((self.by_index[last.delegate_index].tosa, last.inputs))
        for tosa, inputs in attempts:
            if tosa is None:
                continue
            try:
                run_reference_model(tosa, inputs, self.pte)
            except ReferenceModelError as e:
                return ValidationError(f"{e} (the runtime fails too: {error})")
        return ValidationError(f"{self.pte}: {error}")


class _VgfRunner(_Runner):
    """Each VGF delegate on the ML SDK emulation layer (lavapipe), on the program
    inputs it reads; a program output is known where a delegate writes it.

    With `stand_in` (the program with each VGF delegate's TOSA in its place, where
    some delegate reads values the CPU computes): the program runs in ExecuTorch
    first, its delegates on the reference model, recording each call's inputs; each
    VGF then runs on the inputs its call recorded, and a program output no VGF
    writes is the stand-in's, which the CPU computed from the reference model's
    outputs (each held to its VGF's by the delegate check)."""

    name = "VGF on the emulation layer"
    # a GPU's FP32 (lavapipe's exp, its summation order) is not the reference model's:
    # FP32 outputs are held to the policy-Z criterion, integer ones bit for bit
    fp32_rtol = Z_RTOL

    def __init__(self, wirings: list[DelegateWiring], by_index: dict[int, _Delegate], n_outputs: int,
                 stand_in: ProgramFiles | None = None) -> None:
        self.wirings, self.by_index, self.n_outputs, self.stand_in = wirings, by_index, n_outputs, stand_in
        self.records_calls = stand_in is not None

    def run(self, case: Case) -> tuple[list[np.ndarray | None], list[DelegateCall]]:
        outs: list[np.ndarray | None] = [None] * self.n_outputs
        calls = []
        recorded: dict[int, list[list[np.ndarray]]] = {}  # per delegate, its calls' inputs in order
        cpu_outputs: list[np.ndarray] = []
        if self.stand_in is not None:
            ran, observed = run_pte_recorded(self.stand_in, case.inputs)
            cpu_outputs = [t.detach().numpy() for t in ran]
            for r in observed:
                recorded.setdefault(r.delegate_index, []).append([np.asarray(x) for x in r.inputs])
        for w in self.wirings:
            if w.input_positions is not None:
                ins = [case.inputs[i].numpy() for i in w.input_positions]
            elif recorded.get(w.delegate):
                ins = recorded[w.delegate].pop(0)
            else:
                continue
            d = self.by_index[w.delegate]
            got: list[np.ndarray | None] = list(run_vgf(d.payload, ins, f"delegate {w.delegate}"))
            for p, k in enumerate(w.output_of):
                if k is not None:
                    outs[p] = got[k]
            if d.tosa is not None:
                calls.append(DelegateCall(w.delegate, d.tosa, ins, got))
        for p, value in enumerate(cpu_outputs[:self.n_outputs]):
            if outs[p] is None:
                outs[p] = value
        return outs, calls


# ------------------------------------------------------------------ validate


@dataclass
class Checked:
    """Which delegates validate checks, of which target, and how (`detect_target`)."""

    target: Target
    delegates: dict[int, _Delegate]  # by index among the method's delegates
    policy: str
    reference: bool  # the reference policy: outputs are held to eager, not a simulation
    notes: list[str] = field(default_factory=list)

    @property
    def backend_id(self) -> str:
        return self.target.backend_id


def detect_target(data: bytes, info: PteInfo, pte: str | Path, ptd: NamedData | None = None) -> Checked:
    """The delegates of the forward method that validate checks (those of the target
    `targets.target_in` prefers), the TOSA each ran from (the payload itself, or
    where the target keeps it beside the .pte, model.tosa) and the policy they were
    planned at (their provenance, or for a stock delegate the report.json beside
    the .pte)."""
    every = [d for d in delegates(data, pte) if d.method == "forward"]
    ids = [d.backend_id for d in every]
    target = target_in(ids)
    if target is None:
        raise ValidationError(f"{pte}: holds no {BACKEND_ID} delegate (delegates: {ids or 'none'})")
    ours = [d for d in every if d.backend_id == target.backend_id]
    spec = ours[0].compile_specs.get("spec") or _report_spec(pte)
    notes: list[str] = []
    by_index: dict[int, _Delegate] = {}
    for k, d in enumerate(ours):
        stats_path: str | Path = pte
        if target.tosa_beside:
            # the payload holds only what the TOSA was compiled to (a VGF, Vela's command
            # stream); compile and codec_tosa.save write the TOSA beside it
            tosa_file = Path(pte).with_name(delegate_file(k, "tosa"))
            tosa = tosa_file.read_bytes() if tosa_file.is_file() else None
            stats_path = tosa_file
            if tosa is None and target.needs_tosa_beside:
                raise ValidationError(
                    f"{pte}: delegate {d.index} ({target.backend_id}) runs nowhere here, and there is no "
                    f"{tosa_file.name} beside the .pte (the TOSA it was compiled from, which compile and "
                    "codec_tosa.save keep): nothing to validate")
            if tosa is None:
                notes.append(f"no {tosa_file.name} beside the .pte: delegate {d.index} not run on the "
                             "reference model")
        else:  # a TOSA flatbuffer, or the target's own (XNNPACK's), which its own backend runs
            tosa = _whole(d.payload, ptd, pte) if target.payload_is_tosa else None
        if tosa is not None:
            payload_stats(tosa, stats_path, d.backend_id)
            io_counts = entry_io_counts(tosa)
        else:  # the delegate's own count of its inputs and outputs is not read here; use the call's
            call = next(c for c in info.delegate_calls if c.delegate_index == d.index)
            io_counts = (len(set(call.tensor_args) & set(info.inputs)), len(call.tensor_args)
                         - len(set(call.tensor_args) & set(info.inputs)))
        by_index[d.index] = _Delegate(d.index, d.backend_id, d.payload, tosa, io_counts)
    return Checked(target, by_index, spec.get("policy", "?"), bool(spec.get("reference")), notes)


def _whole(payload: bytes, ptd: NamedData | None, pte: str | Path) -> bytes:
    """A TOSA payload with its external weights put back from `ptd`."""
    try:
        return external.complete(payload, None if ptd is None else ptd.get)
    except external.ExternalWeightsError as e:
        raise ValidationError(f"{ptd.name if ptd is not None else pte}: {e}") from None


def _report_entry(pte: str | Path, key: str) -> dict[str, Any]:
    """An entry of the report.json beside the .pte ({} without one: a stock
    delegate carries no provenance of ours)."""
    path = Path(pte).with_name(REPORT)
    try:
        entry = json.loads(path.read_text()).get(key, {}) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return entry if isinstance(entry, dict) else {}


def _report_spec(pte: str | Path) -> dict[str, Any]:
    """The spec compile or codec_tosa.save recorded in report.json."""
    return _report_entry(pte, "spec")


def _budget_note(pte: str | Path) -> list[str]:
    """Why reference_io.npz holds fewer held-out samples than compile drew, if it does."""
    held = _report_entry(pte, "held_out")
    stored, asked = held.get("stored"), held.get("asked")
    if "budget_s" not in held or not isinstance(stored, int) or not isinstance(asked, int) or stored >= asked:
        return []
    return [f"compile stored {stored} of {asked} held-out samples, as many as its time budget allowed "
            f"({held['budget_s']:.0f} s, a quarter of the compile); compile --samples {asked} stores them all"]


def input_sets(pte: str | Path, info: PteInfo, reference_io: str | Path | None,
               inputs: Sequence[Sequence[Any]] | None,
               samples: int | None, module: Callable[..., object] | None, target: Checked
               ) -> tuple[list[InputSet], ReferenceIO | None, list[str]]:
    """The input sets to run, in order of preference: `module` (the rebuilt model,
    with `inputs` its example: eager outputs, no simulation), `inputs` alone (no
    reference), the reference_io.npz beside the .pte (or `reference_io`), or
    seeded random inputs drawn from the program's input specs (no reference). `inputs`
    are input tuples (with `module`: its example, then its held-out samples)."""
    notes: list[str] = []
    io_path = Path(reference_io) if reference_io else Path(pte).with_name(REFERENCE_IO)
    if module is not None:
        if not inputs:
            raise ValueError("validate: a rebuilt model needs its example inputs")
        cases = cases_from_module(module, inputs[0], DEFAULT_SAMPLES if samples is None else samples,
                                  inputs[1:])
        if not target.reference:
            notes.append("the simulation of the plan cannot be rebuilt from the .pte (it needs the "
                         "calibrated plan compile keeps in reference_io.npz): the outputs are compared "
                         "with FP32 eager by SQNR only")
        return cases, None, notes
    if inputs is not None:
        return [InputSet(f"given input {k}", leaves(tuple(x))) for k, x in enumerate(inputs)], None, notes
    if io_path.is_file():
        try:
            ref, more = ReferenceIO.load(io_path, samples)
        except (OSError, ValueError, KeyError) as e:
            raise ValidationError(f"{io_path}: not a reference_io.npz compile or codec_tosa.save wrote: {e}") \
                from None
        return ref.sets, ref, notes + more + (_budget_note(pte) if samples is None else [])
    try:
        drawn = inputs_for_specs(info.input_specs, DEFAULT_SAMPLES if samples is None else samples)
    except ValueError as e:
        raise ValidationError(f"{pte}: {e}") from None
    notes.append(f"no reference_io.npz beside the .pte, no --inputs, no --model: {len(drawn)} seeded "
                 "random inputs drawn from the program's input specs; only the reference model and the "
                 "runtime were compared")
    return [InputSet(f"random {s}", list(x)) for s, x in enumerate(drawn)], None, notes


def make_runner(checked: Checked, data: bytes, pte: str | Path, wirings: list[DelegateWiring],
                n_outputs: int, ptd: NamedData | None = None) -> tuple[_Runner, list[str]]:
    """What runs the program (with its named data, `ptd`), as its target says
    (`Target.runs_on`), and the notes that say what it is."""
    target, by_index = checked.target, checked.delegates
    notes = [target.run_note] if target.run_note else []
    if target.runs_on == VGF_EMULATION:
        stand_in = None
        if (any(w.input_positions is None for w in wirings)
                and all(d.tosa is not None for d in by_index.values())):
            stand_in = ProgramFiles(with_delegates_replaced(
                data, {i: (BACKEND_ID, d.tosa) for i, d in by_index.items()}, pte), ptd)
            notes = ["this ExecuTorch runtime has no VgfBackend, and a VGF reads values the CPU computes: "
                     "the program ran in ExecuTorch with each VGF's TOSA on the reference model in its place, "
                     "each VGF then ran on the ML SDK emulation layer (lavapipe) on the inputs its call "
                     "recorded, and the outputs the CPU computes are from that run"]
        return _VgfRunner(wirings, by_index, n_outputs, stand_in), notes
    if target.runs_on in (TOSA_STAND_IN, RELABELLED):
        # each delegate replaced by a CodecTosaBackend one on its TOSA (beside the .pte, or the payload)
        stand_in = with_delegates_replaced(data, {i: (BACKEND_ID, d.tosa) for i, d in by_index.items()
                                                  if d.tosa is not None}, pte)
        return _ExecuTorchRunner(ProgramFiles(stand_in, ptd), pte, wirings, by_index), notes
    return _ExecuTorchRunner(ProgramFiles(data, ptd), pte, wirings, by_index), notes


def validate(pte: str | Path, reference_io: str | Path | None = None,
             inputs: Sequence[Sequence[Any]] | None = None, samples: int | None = None,
             module: Callable[..., object] | None = None, ptd: str | Path | None = None) -> Validation:
    """Validate `pte` on the example and held-out samples (docs/DESIGN.md, "Validation").

    The input sets come from `input_sets`; `samples` caps the held-out samples
    (None: all stored, or `DEFAULT_SAMPLES` drawn). The program runs with its named
    data: `ptd`, else the .ptd beside it (model.ptd), which must hold every blob its
    delegates read (`targets.named_data`)."""
    data = read_pte(pte)
    info = inspect_pte(data)
    named = named_data_for(pte, data, ptd)
    target = detect_target(data, info, pte, named)
    wirings = delegate_wirings(info, target.backend_id, {i: d.io for i, d in target.delegates.items()}, pte)
    cases, ref, notes = input_sets(pte, info, reference_io, inputs, samples, module, target)
    runner, runner_notes = make_runner(target, data, pte, wirings, len(info.outputs), named)
    result = compare(str(pte), cases, ref, runner, wirings, target, len(info.outputs))
    data_notes = [] if named is None else [f"named data: {named.name} ({len(named)} keys, {named.nbytes} bytes), "
                                           "loaded with the .pte"]
    result.notes[:0] = target.notes + data_notes + notes + runner_notes
    called = {w.delegate for w in wirings}
    result.notes += [f"delegate {i} is never called by the forward plan" for i in target.delegates if i not in called]
    return result


def _delegate_checks(wirings: list[DelegateWiring], target: Checked, runner: _Runner) -> dict[int, DelegateCheck]:
    """One check per delegate, held to the reference model as `runner` can be, with the
    reason it cannot be (if any). A runner that records what each call really read
    compares a CPU-fed delegate too; otherwise it sees only what the program hands it."""
    return {w.delegate: DelegateCheck(w.delegate, target.backend_id, [None] * w.outputs,
                                      (None if runner.records_calls else w.reason) or (
                                          None if target.delegates[w.delegate].tosa is not None
                                          else "its TOSA is not available" if target.target.tosa_beside
                                          else f"a {target.backend_id} flatbuffer: no reference model runs it"),
                                      fp32_rtol=runner.fp32_rtol)
            for w in wirings}


def _check_calls(checks: dict[int, DelegateCheck], calls: list[DelegateCall], pte: str) -> bool:
    """Hold each recorded delegate call to the reference model (FP32 outputs within
    its check's `fp32_rtol` of their span); whether any ran."""
    ran = False
    for call in calls:
        check = checks[call.delegate]
        check.calls += 1
        if check.reason is not None:
            continue
        try:
            diffs = compare_call(call, pte, check.fp32_rtol)
        except ReferenceModelError as e:
            check.reason = str(e)
            continue
        ran = True
        check.max_abs = [d if m is None else m if d is None else max(m, d) for m, d in zip(check.max_abs, diffs)]
    return ran


def _against_eager(o: OutputCheck, p: int, out: np.ndarray, case: InputSet) -> None:
    """The output's SQNR against eager, and the planned FP32 program against eager."""
    if case.eager is None:
        return
    if np.issubdtype(out.dtype, np.floating):
        sq = sqnr_db(case.eager[p].reshape(out.shape), out)
        if o.sqnr_db is None or sq < o.sqnr_db:
            o.sqnr_db, o.sqnr_case = sq, case.label
    if case.planned is not None:
        e = case.eager[p].reshape(out.shape)
        planned = max_difference(e, case.planned[p].reshape(out.shape))
        if case.fp32_noise is not None and e.size:
            # beyond what FP32 rounding alone puts each of them from its float64
            # value (reference_io.fp32_noise): an output that cancels is noise in FP32
            beyond = differences(e, case.planned[p].reshape(out.shape)) - case.fp32_noise[p].reshape(out.shape)
            planned = max(float(beyond.max()), 0.0)
        tol = Z_RTOL * max(finite_span(e), 1e-12)
        if o.planned_max_abs is None or planned / tol > o.planned_max_abs / (o.planned_tolerance or 1.0):
            o.planned_max_abs, o.planned_tolerance, o.planned_case = planned, tol, case.label


def _against_expected(o: OutputCheck, p: int, out: np.ndarray, expected: np.ndarray, case: InputSet,
                      reference: bool, steps: list[float], worst_ratio: list[float]) -> None:
    """Hold output `p` to its criterion: eager to 1e-4 relative (reference), or the
    simulation to one step beyond what the case's ambiguous codes may move it."""
    e = expected.reshape(out.shape)
    diff = max_difference(e, out)
    allowance = None if reference or case.allowance is None else case.allowance[p].reshape(out.shape)
    # each element's distance beyond how far the ambiguous codes move it
    beyond = diff if allowance is None or not e.size else float(np.max(
        np.where(np.isfinite(e), np.abs(e.astype(np.float64) - out.astype(np.float64)), 0.0)
        - allowance))
    span = finite_span(e)
    if reference or not np.issubdtype(out.dtype, np.floating):
        tol = Z_RTOL * max(span, 1e-12)
    else:
        step = steps[p] if p < len(steps) else (float(e.max() - e.min()) / 255.0 if e.size else 0.0)
        o.step = step
        # the FP32 operators between codecs are held to the policy-Z
        # criterion (1e-4 relative), the codes to one step
        tol = step + Z_RTOL * span
    ratio = beyond / tol if tol > 0 else (0.0 if beyond <= 0 else math.inf)
    if diff > tol >= beyond and not case.envelope_complete:
        o.needs_incomplete_envelope = True
    if beyond > tol and not case.envelope_complete and allowance is not None:
        # the allowance is a lower bound here: not evidence of a wrong artefact
        o.undecided_steps = max(o.undecided_steps, beyond / (o.step or tol))
        return
    if ratio > worst_ratio[p]:
        worst_ratio[p] = ratio
        o.vs_expected_max_abs, o.tolerance, o.worst_case = diff, tol, case.label
        if allowance is not None:
            o.beyond_allowance = beyond
            o.allowance = float(allowance.max()) if allowance.size else 0.0


def compare(pte: str, cases: list[InputSet], ref: ReferenceIO | None, runner: _Runner,
            wirings: list[DelegateWiring], target: Checked, n_out: int) -> Validation:
    """Run every input set; hold each delegate call to the reference model, the
    planned FP32 program to eager, and each program output to its plan's criterion."""
    checks = _delegate_checks(wirings, target, runner)
    # program output p is delegate output k of wiring w
    source = {p: (w.delegate, k) for w in wirings for p, k in enumerate(w.output_of) if k is not None}
    # (`DelegateCheck.deferred`) only where there are ambiguous codes: without them a
    # VGF's program output is held to the reference model like any other
    if runner.fp32_rtol and any(c.ambiguous for c in cases):
        for d, k in source.values():
            checks[d].deferred = tuple(sorted({*checks[d].deferred, k}))
    reference = target.reference
    has_eager = all(c.eager is not None for c in cases)
    expected_of: Callable[[InputSet], list[np.ndarray] | None] = (
        (lambda c: c.eager) if reference else (lambda c: c.simulated))
    has_expected = all(expected_of(c) is not None for c in cases)
    steps = ref.steps if ref is not None else []

    worst_ratio = [-1.0] * n_out
    result_outputs = [OutputCheck(p, math.nan, None, None, None) for p in range(n_out)]
    ran = False
    for case in cases:
        outs, calls = runner.run(case)
        ran = _check_calls(checks, calls, pte) or ran
        expected = expected_of(case)
        for p, out in enumerate(outs):
            o = result_outputs[p]
            if out is None:
                o.computed = False
                continue
            _against_eager(o, p, out, case)
            if expected is not None:
                _against_expected(o, p, out, expected[p], case, reference, steps, worst_ratio)
    for p, o in enumerate(result_outputs):
        if p in source:
            check, k = checks[source[p][0]], source[p][1]
            m = check.max_abs[k]
            o.ref_vs_runtime_max_abs = math.nan if m is None or k in check.deferred else m
        if ref is not None and ref.sensitivity is not None and p < len(ref.sensitivity) and not reference:
            o.sensitivity = ref.sensitivity[p]

    expected_name = ("eager" if reference else "simulation") if has_expected else "none"
    notes = [] if has_eager else ["no FP32 eager output was available: no SQNR"]
    result = Validation(pte, target.policy, expected_name, ran, result_outputs, notes,
                        [checks[w.delegate] for w in wirings], len(cases), _describe(cases), runner.name,
                        ambiguous_codes=sum(c.ambiguous for c in cases),
                        artefact_flipped=[c.artefact_flipped for c in cases if c.artefact_flipped is not None])
    result.warnings += [w for o in result.outputs if o.sqnr_db is not None
                        for w in [sqnr_warning(o.index, o.sqnr_db, f"the {runner.name}'s output")] if w]
    return result
