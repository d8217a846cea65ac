"""reference_io.npz: the plan's reference inputs and outputs (docs/DESIGN.md, "Validation").

`codec-tosa compile` and `codec_tosa.save` write it beside the .pte, `validate`
reads it; this module is the one place that knows its format and the one place
that computes it (the *reference stage*). Per input set (the example, then the
held-out samples), as the program takes and returns them (pytree leaves,
`codec_tosa.pytrees`):

* the inputs;
* ``eager``: the FP32 model's outputs (the user's module, not a graph of ours);
* ``planned``: the program as planned, in FP32, before any codec (batch norms
  folded, the decompositions Arm's and ours applied): an oracle independent of
  the codecs, which must equal eager to FP32 precision, so that a structural
  error in the lowering fails even where the simulation shares it;
* ``simulated``: the plan's simulation (bit-exact with the artefact), with the
  allowance its ambiguous codes give each element (`simulation.simulate_envelope`);

and per output its quantisation step and its rounding sensitivity.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.export.graph_signature import OutputKind

from codec_tosa.planning.program import PlannedProgram
from codec_tosa.pytrees import leaves, map_tensors, tensor_leaves
from codec_tosa.runtime.pte import ProgramFiles
from codec_tosa.spec import CodecSpec
from codec_tosa.validation.artefact_rounding import ArtefactRounding, ArtefactRuns
from codec_tosa.validation.metrics import Z_RTOL, finite_span, max_difference, sqnr_db, sqnr_warning
from codec_tosa.validation.rounding_ambiguity import FP32_EPS
from codec_tosa.validation.samples import MIN_SAMPLES
from codec_tosa.validation.simulation import Envelope, run_planned, simulate, simulate_envelope

FILE = "reference_io.npz"
_ROLES = ("eager", "simulated", "planned", "allowance", "fp32_noise")


@dataclass
class InputSet:
    """One set of program inputs, with what the model and its plan make of it."""

    label: str  # "example", "sample 3", "random 0", "given inputs"
    inputs: list[torch.Tensor]  # the program's inputs, flat
    eager: list[np.ndarray] | None = None
    simulated: list[np.ndarray] | None = None
    planned: list[np.ndarray] | None = None  # the program as planned, FP32, no codec
    # per output element, how far the ambiguous codes may move it (None: not one)
    allowance: list[np.ndarray] | None = None
    ambiguous: int = 0  # codes the artefact may legitimately round the other way
    envelope_complete: bool = True  # each of them was flipped alone, or decided by the artefact
    # of the ambiguous codes, how many the artefact rounded the other way, where its
    # own rounding decided every one (`tools.artefact_rounding`; None: not asked)
    artefact_flipped: int | None = None
    # per output element, how far FP32 rounding alone puts eager and the planned
    # program from their float64 values (None: not measured; see `fp32_noise`)
    fp32_noise: list[np.ndarray] | None = None


@dataclass
class ReferenceIO:
    sets: list[InputSet]  # the example first
    steps: list[float]  # one quantisation step per output (an FP32 output's range / 255)
    sensitivity: list[float] | None = None  # how far the simulation moves under one ulp of input

    def save(self, path: str | Path) -> None:
        np.savez(path, **self.arrays())

    def arrays(self) -> dict[str, np.ndarray]:
        """The npz's arrays: input_i, eager_i, ... of the example; the held-out
        samples stacked on a leading axis as sample_input_i, ...; step_i,
        sensitivity_i; ambiguous_codes and envelope_complete per input set."""
        example, samples = self.sets[0], self.sets[1:]
        out: dict[str, np.ndarray] = {f"input_{i}": _numpy(x) for i, x in enumerate(example.inputs)}
        out.update({f"step_{i}": np.float64(s) for i, s in enumerate(self.steps)})
        out.update({f"sensitivity_{i}": np.float64(s) for i, s in enumerate(self.sensitivity or ())})
        for role in _ROLES:
            for i, a in enumerate(getattr(example, role) or ()):
                out[f"{role}_{i}"] = a
        if samples:
            for i in range(len(example.inputs)):
                out[f"sample_input_{i}"] = np.stack([_numpy(s.inputs[i]) for s in samples])
            for role in _ROLES:
                if all(getattr(s, role) is not None for s in samples):
                    for i in range(len(getattr(samples[0], role))):
                        out[f"sample_{role}_{i}"] = np.stack([getattr(s, role)[i] for s in samples])
        out["ambiguous_codes"] = np.array([s.ambiguous for s in self.sets], dtype=np.int64)
        out["envelope_complete"] = np.array([s.envelope_complete for s in self.sets])
        out["artefact_flipped"] = np.array([-1 if s.artefact_flipped is None else s.artefact_flipped
                                            for s in self.sets], dtype=np.int64)
        return out

    @classmethod
    def load(cls, path: str | Path, samples: int | None = None) -> tuple["ReferenceIO", list[str]]:
        """The example and up to `samples` held-out sets (None: all) of an npz
        `save` wrote, and notes on what was asked for but is not there."""
        with np.load(path) as data:
            io = dict(data)
        notes: list[str] = []
        n_in = _count(io, "input")

        def sample(key: str, s: int | None) -> np.ndarray:
            # an array even for a rank-0 tensor (indexing a stack of them gives a NumPy scalar)
            return io[key] if s is None else np.asarray(io[f"sample_{key}"][s])

        def role(name: str, s: int | None) -> list[np.ndarray] | None:
            n = _count(io, name if s is None else f"sample_{name}")
            return [sample(f"{name}_{i}", s) for i in range(n)] if n else None

        ambiguous = io.get("ambiguous_codes")
        complete = io.get("envelope_complete")
        flipped = io.get("artefact_flipped")

        def input_set(label: str, case: int, s: int | None) -> InputSet:
            inputs = [torch.from_numpy(sample(f"input_{i}", s)) for i in range(n_in)]
            return InputSet(label, inputs, role("eager", s), role("simulated", s), role("planned", s),
                            role("allowance", s),
                            int(ambiguous[case]) if ambiguous is not None else 0,
                            bool(complete[case]) if complete is not None else True,
                            int(flipped[case]) if flipped is not None and flipped[case] >= 0 else None,
                            role("fp32_noise", s))

        stored = int(io["sample_input_0"].shape[0]) if "sample_input_0" in io else 0
        n = stored if samples is None else min(samples, stored)
        if samples is not None and samples > stored:
            notes.append(f"{samples} samples asked for, reference_io.npz holds {stored} "
                         "(compile --samples N stores more)")
        sets = [input_set("example", 0, None)] + [input_set(f"sample {s}", s + 1, s) for s in range(n)]
        steps = [float(io[f"step_{i}"]) for i in range(_count(io, "step"))]
        sensitivity = [float(io[f"sensitivity_{i}"]) for i in range(_count(io, "sensitivity"))] or None
        return cls(sets, steps, sensitivity), notes


def _count(io: dict[str, np.ndarray], prefix: str) -> int:
    n = 0
    while f"{prefix}_{n}" in io:
        n += 1
    return n


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


# ------------------------------------------------------------------ the reference stage


@dataclass
class Reference:
    """What the reference stage computed: the record, report.json's account of the
    ambiguous codes, and the SQNR warnings."""

    io: ReferenceIO
    ambiguous: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)
    # report.json's account of the held-out inputs: asked for, stored, and the budget
    held_out: dict[str, Any] = field(default_factory=dict)


def program_outputs(module: Callable[..., Any], inputs: Sequence[Any], signature: Any = None) -> list[torch.Tensor]:
    """`module`'s outputs on `inputs` as the exported program returns them: the
    tensor leaves of what it returns, and, where `signature` (an ExportGraphSignature)
    says the program mutates an input in place, that input's value after the call,
    in the signature's output order."""
    cloned = tuple(_cloned(x) for x in inputs)
    with torch.no_grad():
        returned = iter(tensor_leaves(module(*cloned)))
    if signature is None:
        return list(returned)
    flat_inputs = leaves(cloned)
    users = list(signature.user_inputs)
    out: list[torch.Tensor] = []
    for spec in signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            t = next(returned, None)
            if t is not None:
                out.append(t)
        elif spec.kind == OutputKind.USER_INPUT_MUTATION and spec.target in users:
            out.append(flat_inputs[users.index(spec.target)])
    return out


def _cloned(x: Any) -> Any:
    return map_tensors(x, lambda t: t.clone())


def reference_outputs(planned: PlannedProgram | None, module: Callable[..., Any], inputs: Sequence[Any],
                      held_out: Sequence[Sequence[Any]], spec: CodecSpec, signature: Any = None,
                      simulated: bool = True, budget_s: float | None = None,
                      artefact: ProgramFiles | None = None) -> Reference:
    """The reference stage: eager, planned and simulated outputs of the example and
    the held-out inputs, with the allowance of the ambiguous codes. `planned` None:
    nothing was planned (the program is the model). `simulated` False skips the
    plan's outputs altogether (`compile --samples 0`): validate can then compare
    the artefact with eager by SQNR only, and says so.

    `budget_s`: the stage's time budget. The held-out inputs are taken in order,
    at least `MIN_SAMPLES` of them, and the next one only while the time per input
    set so far says it ends within the budget (None: all of them).

    `artefact`: the .pte (with its .ptd), when its delegates are TOSA graphs the runtime runs on
    the reference model: on an input set with too many ambiguous codes to flip
    each alone, its own rounding decides them (`tools.artefact_rounding`). That is a
    reference-model run of the whole program (a minute per SigLIP layer at 1,024
    tokens), so within `budget_s` it is asked on the example and the first held-out
    set always, and on a later one only while one more such run ends within the
    budget: the first set it would have to decide past that ends the stage, below
    `MIN_SAMPLES` if need be, so that every stored set is decided and validate can
    hold the artefact to it exactly."""
    cases = [tuple(inputs), *(tuple(x) for x in held_out)]
    plan = simulated and planned is not None
    # asked set after set: its exposed copies made once, its inputs taken directly where it can
    asked = ArtefactRuns(artefact) if artefact is not None else None
    sets: list[InputSet] = []
    envelopes: list[Envelope] = []
    start = time.perf_counter()
    asking_s: list[float] = []  # each artefact run's seconds

    def resolver(inputs: list[torch.Tensor]) -> ArtefactRounding:
        t = time.perf_counter()
        assert asked is not None
        try:
            return ArtefactRounding.of(asked, inputs)
        finally:
            asking_s.append(time.perf_counter() - t)

    def ask(k: int) -> bool:
        if asked is None:
            return False
        if k <= 1 or budget_s is None or not asking_s:
            return True
        return time.perf_counter() - start + sum(asking_s) / len(asking_s) <= budget_s

    for k, x in enumerate(cases):
        elapsed = time.perf_counter() - start
        # k sets done so far; one more takes about elapsed / k, the sensitivity run a set's third
        if budget_s is not None and k > MIN_SAMPLES and elapsed * (k + 4 / 3) / k > budget_s:
            break
        eager = program_outputs(module, x, signature)
        if k == 0:
            example_eager = eager  # the fallback output steps are the example's
        s = InputSet("example" if k == 0 else f"sample {k - 1}", leaves(x), [_numpy(t) for t in eager])
        if plan:
            assert planned is not None
            s.planned = [_numpy(t) for t in run_planned(planned, x)]
            if spec.reference:
                s.simulated = [_numpy(t) for t in simulate(planned, s.inputs)]
            else:
                asking = ask(k)
                e = simulate_envelope(planned, x, artefact=(lambda: resolver(s.inputs)) if asking else None)
                if not e.complete and asked is not None and not asking:
                    break  # the artefact would have to decide it, past the budget
                envelopes.append(e)
                s.simulated = [_numpy(t) for t in e.outputs]
                s.ambiguous, s.envelope_complete = len(e.ambiguous), e.complete
                s.artefact_flipped = e.artefact_flipped
        elif simulated:
            s.simulated = s.eager
        sets.append(s)
    if plan and any(_planned_off(s) for s in sets):
        assert planned is not None
        noise = fp32_noise(planned, module, sets, cases, signature)
        for s, n in zip(sets, noise or ()):
            s.fp32_noise = n
    if any(env.ambiguous for env in envelopes):
        for s, e in zip(sets, envelopes):
            s.allowance = [_numpy(a) for a in e.allowance]
    # an FP32 output is determined only to the bound its FP32 operators carry to it:
    # where it cancels (noise about 0), that bound exceeds its range / 255
    fallback = [max([f, *(e.output_bounds[k] for e in envelopes if k < len(e.output_bounds))])
                for k, f in enumerate(fp32_steps(example_eager))]
    steps = planned.output_steps(fallback) if planned is not None else fallback
    sensitivity = (rounding_sensitivity(planned, cases[0], sets[0].simulated)
                   if plan and planned is not None and not spec.reference else None)
    io = ReferenceIO(sets, steps, sensitivity)
    held = {"asked": len(held_out), "stored": len(sets) - 1,
            **({"artefact_runs": len(asking_s), "artefact_s": round(sum(asking_s), 3)} if asking_s else {}),
            **({"budget_s": round(budget_s, 3)} if budget_s is not None else {})}
    return Reference(io, envelope_summary(envelopes) if envelopes else None, sqnr_warnings(sets), held)


def _planned_off(s: InputSet) -> bool:
    """Whether the planned FP32 program is beyond validate's Z_RTOL of eager on a
    floating-point output of `s` (only then is its FP32 noise measured)."""
    return any(np.issubdtype(e.dtype, np.floating) and max_difference(e, p) > Z_RTOL * max(finite_span(e), 1e-12)
               for e, p in zip(s.eager or (), s.planned or ()))


def fp32_noise(planned: PlannedProgram, module: Callable[..., Any], sets: Sequence[InputSet],
               cases: Sequence[Sequence[Any]], signature: Any) -> list[list[np.ndarray]] | None:
    """Per input set and output element, |eager - eager in float64| + |planned -
    planned in float64|.

    Where an output cancels (a group norm over one-element groups is FP32 noise
    about 0), two correct FP32 orders differ by far more than Z_RTOL of it, but
    each stays within its own rounding of its float64 value, and the float64
    values agree. validate holds the planned program to eager beyond this sum, so
    a structural error still fails. None where the module or the program does not
    run in float64 (a module that fixes its dtypes)."""
    def wide(t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.float64) if t.dtype == torch.float32 else t

    try:
        module64 = copy.deepcopy(module).to(torch.float64)
        widened = [map_tensors(tuple(x), wide) for x in cases[:len(sets)]]
        runs = [(program_outputs(module64, x, signature), run_planned(planned, x, torch.float64)) for x in widened]
    except Exception:  # noqa: BLE001 - no yardstick; validate keeps Z_RTOL alone
        return None
    return [[_noise(e, p, a, b) for e, p, a, b in zip(s.eager or (), s.planned or (), e64, p64)]
            for s, (e64, p64) in zip(sets, runs)]


def _noise(eager: np.ndarray, planned: np.ndarray, eager64: torch.Tensor, planned64: torch.Tensor) -> np.ndarray:
    if not np.issubdtype(eager.dtype, np.floating):
        return np.zeros(eager.shape)
    d = (np.abs(eager.astype(np.float64) - _numpy(eager64).reshape(eager.shape))
         + np.abs(planned.astype(np.float64).reshape(eager.shape) - _numpy(planned64).reshape(eager.shape)))
    return np.nan_to_num(d, nan=0.0, posinf=0.0)  # inf and NaN are compared as values


def envelope_summary(envelopes: Sequence[Envelope]) -> dict[str, Any]:
    """report.json's account of the ambiguous codes, per input set (the example first)."""
    return {"per_input_set": [len(e.ambiguous) for e in envelopes],
            "total": sum(len(e.ambiguous) for e in envelopes),
            "encodes": sorted({a.node for e in envelopes for a in e.ambiguous}),
            "resimulations": sum(e.resimulations for e in envelopes),
            "complete": all(e.complete for e in envelopes),
            # input sets whose ambiguous codes the artefact's own rounding decided
            "decided_by_artefact": sum(e.artefact_flipped is not None for e in envelopes),
            "artefact_flipped": sum(e.artefact_flipped or 0 for e in envelopes),
            "fp32_eps": FP32_EPS}


def sqnr_warnings(sets: Sequence[InputSet]) -> list[str]:
    """A warning per floating-point output whose worst SQNR (simulation against FP32
    eager, over the input sets) is below the floor."""
    out = []
    for i, e in enumerate(sets[0].eager or ()):
        if not np.issubdtype(e.dtype, np.floating):
            continue
        pairs = [(s.eager[i], s.simulated[i]) for s in sets if s.eager and s.simulated and i < len(s.simulated)]
        if not pairs:
            continue
        w = sqnr_warning(i, min(sqnr_db(e_, a) for e_, a in pairs), "the simulation of the plan")
        if w:
            out.append(w)
    return out


def one_ulp_away(inputs: Sequence[torch.Tensor], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Every floating-point input element moved one ulp up or down (at random)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for x in leaves(tuple(inputs)):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            up = torch.rand(x.shape, generator=gen) < 0.5
            x = torch.nextafter(x, torch.where(up, torch.inf, -torch.inf).to(x.dtype))
        out.append(x)
    return tuple(out)


def rounding_sensitivity(planned: PlannedProgram, inputs: Sequence[Any],
                         simulated: Sequence[np.ndarray]) -> list[float]:
    """max |simulation(inputs one ulp away) - simulation(inputs)| per floating-point
    output (0 for others).

    A lower bound on how far two correct implementations of the plan can differ
    when they round differently: a deep model can amplify one flipped code into
    many quantisation steps at its outputs (validate reports it beside the
    one-step criterion)."""
    moved = simulate(planned, one_ulp_away(inputs))
    return [max_difference(_numpy(m).reshape(s.shape), s) if np.issubdtype(s.dtype, np.floating) else 0.0
            for m, s in zip(moved, simulated)]


def fp32_steps(outputs: Sequence[torch.Tensor]) -> list[float]:
    """One "step" of an output computed in FP32: its finite range / 255 (0 for a
    non-float output, which is compared exactly)."""
    steps = []
    for e in outputs:
        if not e.is_floating_point():  # an index or a bool, rank 0 included (argmax of a vector)
            steps.append(0.0)
            continue
        finite = torch.isfinite(e)
        finite = e if bool(finite.all()) else e[finite]  # masking a whole output costs more than the range
        steps.append(float(finite.max() - finite.min()) / 255.0 if finite.numel() else 0.0)
    return steps


__all__ = ["FILE", "InputSet", "Reference", "ReferenceIO", "envelope_summary", "fp32_noise", "fp32_steps", "one_ulp_away",
           "program_outputs", "reference_outputs", "rounding_sensitivity", "sqnr_warnings"]
