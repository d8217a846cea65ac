"""Which way the artefact rounded each ambiguous code (docs/DESIGN.md, "Validation").

An encode of an FP32 value Arm computes in its own order (an exp, an erf, a
reduce_sum) is ambiguous where that value lies within its rounding bound of a
code boundary: a correct artefact may round it either way. With a few such
codes per input set, `simulation.simulate_envelope` flips each alone. A
transformer at policy W has thousands (DeiT-tiny: about 3,500 per set), too many
to flip one at a time, and flipping all together gives only a lower bound.

There the artefact is asked instead. Every encode's rounding (the CAST f32 ->
int8/int16 of our codec lowering, `_passes.lower_codecs`) is made an output of
a copy of each delegate's TOSA graph; the copy runs on the TOSA reference model
on the inputs the ExecuTorch runtime recorded for that call (or, for a program
that is one delegate call on its own inputs, on those inputs directly:
`ArtefactRuns`); and the simulation runs once more, taking the artefact's code at each *ambiguous*
element (`IntegerSimulator(resolve=...)`), in graph order, so that what a code
rounded the other way changes downstream is simulated too. Every other code
stays the simulation's own: a wrong scale, a wrong zero point or a wrong
operator still shows at the outputs, and validate still holds the runtime to
this simulation at 0 steps. An ambiguous encode that matches no exposed
rounding (an encode Arm lowers itself, a layout not recognised) is counted as
unresolved and the input set keeps its incomplete envelope.

Those runs take the graph with its INT8 convolutions as MATMUL (`faster_program`,
`matmul_convolutions`): the same outputs bit for bit, a fifth of the time on a
transformer, whose Linears Arm lowers to 1x1 convolutions.

Only a TOSA delegate is asked: it is what the runtime runs (the C++ backend
runs the same reference model). A VGF runs on another implementation, which
may round an ambiguous code the other way, so it keeps the envelope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from codec_tosa.runtime import BACKEND_ID
from codec_tosa.runtime.executorch_runner import NUMPY_DTYPES, PteRunError, run_pte_recorded
from codec_tosa.runtime.pte import (PteError, ProgramFiles, delegates, input_derived_values, inspect_pte,
                                    with_delegates_replaced)
from codec_tosa.serialization import external
from codec_tosa.serialization.tosa_copy import NotCopyable, loaded
from codec_tosa.serialization.tosa_stats import blocks, entry_io_tensors
from codec_tosa.validation import matmul_convolutions
from codec_tosa.validation.matmul_convolutions import candidate_macs, faster
from codec_tosa.targets.base import Target
from codec_tosa.validation.reference_model import ReferenceModelError, run_reference_model
from codec_tosa.validation.rounding_ambiguity import AmbiguousCode

# the CASTs that round: FP32 in, codes out
_ROUNDING_IN = ("FP32",)
_ROUNDING_OUT = ("INT8", "INT16")


@dataclass(frozen=True)
class _Rounding:
    """One rounding CAST's output in one delegate call, as the reference model computed it."""

    name: str
    values: np.ndarray  # round(x / s), saturated to its dtype: the code minus the zero point


def askable(program: ProgramFiles, target: Target) -> ProgramFiles | None:
    """`program` (the .pte and its .ptd), when its target's artefact can decide
    ambiguous codes (a TOSA delegate, which the runtime runs on the reference model:
    module docstring); else None."""
    return program if target.decides_rounding else None


def rounding_names(payload: bytes) -> list[str]:
    """The outputs of the CASTs in a TOSA graph's main block that round FP32
    values to codes (a control-flow branch's block cannot output to it)."""
    tensors, operators = next(iter(blocks(payload)))
    return [op.outputs[0] for op in operators
            if op.op == "CAST" and len(op.inputs) == 1 and len(op.outputs) == 1
            and tensors[op.inputs[0]].dtype in _ROUNDING_IN and tensors[op.outputs[0]].dtype in _ROUNDING_OUT]


def exposing(payload: bytes, names: Sequence[str]) -> bytes:
    """A copy of a TOSA graph whose main block also outputs the tensors `names`
    (the reference model returns them after the graph's own outputs), its integer
    convolutions run as MATMUL (`matmul_convolutions`: the same outputs, faster)."""
    try:
        return faster(payload, names)
    except NotCopyable:  # several blocks: the outputs added to the graph as loaded
        pass
    with loaded(payload) as serializer:
        block = serializer.regions[0].basicBlocks[0]
        for name in names:
            block.addOutput(name)
        return bytes(serializer.serialize())


def faster_program(program: ProgramFiles) -> ProgramFiles:
    """`program` with each CodecTosaBackend delegate of its first method whose graph
    holds at least `matmul_convolutions.WORTH_MACS` of INT8 convolutions replaced by
    its `faster` copy, weights inline (the reference stage runs it; validate runs
    `program` itself). `program` itself where there is nothing to replace or a
    delegate cannot be read (its own run reports that)."""
    try:
        first = inspect_pte(program.pte).method
        replaced: dict[int, tuple[str, bytes]] = {}
        for d in delegates(program.pte):
            if d.method != first or d.backend_id != BACKEND_ID:
                continue
            whole = external.complete(d.payload, None if program.ptd is None else program.ptd.get)
            if candidate_macs(whole) >= matmul_convolutions.WORTH_MACS:
                replaced[d.index] = (BACKEND_ID, faster(whole))
        if not replaced:
            return program
        return ProgramFiles(with_delegates_replaced(program.pte, replaced), program.ptd)
    except (PteError, external.ExternalWeightsError, NotCopyable):
        return program


def artefact_roundings(pte: ProgramFiles | bytes | ArtefactRuns, inputs: Sequence[torch.Tensor]) -> list[_Rounding]:
    """Every rounding CAST's output in every TOSA delegate call the runtime makes
    on `inputs` (the program's flat inputs)."""
    runs = pte if isinstance(pte, ArtefactRuns) else ArtefactRuns(pte)
    return runs.roundings(inputs)


# Issue 51: recording the delegate's inputs ran the whole program on the reference
# model, a second reference-model run per input set beside the exposed graph's.
# Where the program is one CodecTosaBackend delegate call whose tensor inputs are
# program inputs or values no instruction derives from a program input (a causal
# mask, positions: shapes only), the call's inputs are known without running it:
# the program inputs themselves (contiguous, at the graph's shapes and dtypes), and
# the other values as the first recorded run of the same program computed them
# (each run loads the program afresh, so a buffer it reads starts where it did).


@dataclass
class _Direct:
    """How the one delegate call's inputs follow from the program's inputs."""

    payload: bytes
    delegate_index: int
    specs: list[Any]  # the TOSA graph's inputs (tosa_stats.TensorInfo)
    # per TOSA graph input: ("input", k) program input k, or ("fixed", array) as recorded
    sources: list[tuple[str, Any]]


class ArtefactRuns:
    """One program (.pte and .ptd) asked about input set after input set (the reference stage): each
    delegate's exposed copy is made once, and where the program is one delegate call
    on its own inputs the call's inputs are taken without running the program
    (after the first run), so one reference-model run per input set is left."""

    def __init__(self, program: ProgramFiles | bytes) -> None:
        self.program = program if isinstance(program, ProgramFiles) else ProgramFiles(bytes(program))
        # what is run: the same program, its convolutions as MATMUL (`faster_program`)
        self._run = faster_program(self.program)
        # each delegate's exposed copy, its rounding names and its output count, by payload
        self._exposed: dict[bytes, tuple[bytes, list[str], int]] = {}
        self._direct: _Direct | None = None
        self._looked = False  # whether a recorded run has said whether `_direct` applies
        self.recorded_runs = 0  # runs of the whole program (for tests)

    def roundings(self, inputs: Sequence[torch.Tensor]) -> list[_Rounding]:
        """Every rounding CAST's output in every TOSA delegate call the runtime makes
        on `inputs` (the program's flat inputs)."""
        calls = self._direct_calls(inputs)
        if calls is None:
            _, recorded = run_pte_recorded(self._run, list(inputs))
            self.recorded_runs += 1
            calls = [(c.payload, c.inputs, c.delegate_index) for c in recorded]
            if not self._looked:
                self._looked = True
                self._direct = _direct_of(self._run.pte, recorded)
        out: list[_Rounding] = []
        for call_payload, call_inputs, index in calls:
            if call_payload not in self._exposed:
                names = rounding_names(call_payload)
                self._exposed[call_payload] = (exposing(call_payload, names), names,
                                               len(entry_io_tensors(call_payload)[1]))
            payload, names, n_out = self._exposed[call_payload]
            if not names:
                continue
            values = run_reference_model(payload, call_inputs, f"delegate {index}")
            out += [_Rounding(name, np.asarray(v)) for name, v in zip(names, values[n_out:])]
        return out

    def _direct_calls(self, inputs: Sequence[torch.Tensor]) -> list[tuple[bytes, list[np.ndarray], int]] | None:
        """The delegate call's inputs without running the program, where `_direct_of` found how."""
        d = self._direct
        if d is None:
            return None
        flat = list(inputs)
        arrays: list[np.ndarray] = []
        for (kind, source), spec in zip(d.sources, d.specs):
            if kind == "fixed":
                arrays.append(source)
                continue
            x = flat[source] if source < len(flat) else None
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(spec.shape):
                return None
            array = x.detach().contiguous().numpy()
            if array.dtype != NUMPY_DTYPES[spec.dtype]:
                return None
            arrays.append(array)
        return [(d.payload, arrays, d.delegate_index)]


def _direct_of(pte: bytes, recorded: Sequence[Any]) -> _Direct | None:
    """After a recorded run of `pte`: how later runs can skip the recording, or None
    (not one CodecTosaBackend call, or one reading a value derived from an input
    other than as the input itself)."""
    if len(recorded) != 1:
        return None
    try:
        info = inspect_pte(pte)
        if len(info.delegate_calls) != 1 or info.delegate_calls[0].delegate_id != BACKEND_ID:
            return None
        call = info.delegate_calls[0]
        payload = next((d.payload for d in delegates(pte)
                        if d.method == info.method and d.index == call.delegate_index), None)
        if payload is None:
            return None
        if external.is_external(payload):
            # weights in named data: the recorded call carries the whole flatbuffer
            payload = recorded[0].payload
        specs, outs = entry_io_tensors(payload)
        derived = input_derived_values(pte)
    except (PteError, ValueError):
        return None
    if (derived is None or len(call.tensor_args) != len(specs) + len(outs)
            or len(recorded[0].inputs) != len(specs) or recorded[0].payload != payload or recorded[0].delegate_index != call.delegate_index):
        return None
    sources: list[tuple[str, Any]] = []
    for value, spec, array in zip(call.tensor_args[:len(specs)], specs, recorded[0].inputs):
        if value in info.inputs:
            k = info.inputs.index(value)
            tensor_spec = info.input_specs[k] if k < len(info.input_specs) else None
            if (tensor_spec is None or spec.dtype not in NUMPY_DTYPES
                    or tensor_spec.dim_order not in ((), tuple(range(len(tensor_spec.shape))))
                    or tuple(tensor_spec.shape) != tuple(spec.shape)):
                return None
            sources.append(("input", k))
        elif value in derived:
            return None
        else:
            sources.append(("fixed", array))
    return _Direct(payload, call.delegate_index, specs, sources)


class ArtefactRounding:
    """A `simulation.Resolver`: at an encode with ambiguous codes, the artefact's
    code at each of them where its rounding is found, else the simulation's."""

    def __init__(self, roundings: Sequence[_Rounding]) -> None:
        self.by_size: dict[int, list[_Rounding]] = {}
        for r in roundings:
            self.by_size.setdefault(int(r.values.size), []).append(r)
        self.resolved = 0  # ambiguous codes the artefact's rounding decided
        self.flipped = 0  # of those, rounded the other way from the simulation
        self.unresolved: list[str] = []  # encodes no exposed rounding matches

    @property
    def complete(self) -> bool:
        return not self.unresolved

    @classmethod
    def of(cls, pte: ProgramFiles | bytes | ArtefactRuns, inputs: Sequence[torch.Tensor]) -> "ArtefactRounding":
        """The artefact's roundings on `inputs` (the program's flat inputs; `pte` an
        `ArtefactRuns` to ask one program about many input sets); none
        (every encode then unresolved) where the runtime or the reference model
        cannot run it: validate reports that failure itself."""
        try:
            return cls(artefact_roundings(pte, inputs))
        except (PteRunError, ReferenceModelError, ValueError):
            return cls([])

    def __call__(self, node: str, codes: torch.Tensor, ambiguous: Sequence[AmbiguousCode],
                 zero_point: int, qmin: int, qmax: int) -> torch.Tensor:
        index = torch.tensor([a.index for a in ambiguous], dtype=torch.long)
        alternative = torch.tensor([a.alternative for a in ambiguous], dtype=torch.int64)
        flat = codes.reshape(-1).to(torch.int64)
        taken: torch.Tensor | None = None
        for r in self.by_size.get(codes.numel(), ()):
            art = _codes_like(r.values, codes.shape, zero_point, qmin, qmax)
            if art is None:
                continue
            differ = art != flat
            differ[index] = False
            if bool(differ.any()):
                continue  # another encode's rounding, or a layout not recognised
            at = art[index]
            if not bool(((at == flat[index]) | (at == alternative)).all()):
                continue
            if taken is not None and not torch.equal(taken, at):
                taken = None  # two roundings match and disagree: neither decides
                break
            taken = at
        if taken is None:
            self.unresolved.append(node)
            return codes
        self.resolved += len(ambiguous)
        self.flipped += int((taken != flat[index]).sum())
        out = flat.clone()
        out[index] = taken
        return out.to(codes.dtype).reshape(codes.shape)


def _codes_like(values: np.ndarray, shape: torch.Size, zero_point: int, qmin: int,
                qmax: int) -> torch.Tensor | None:
    """The artefact's codes in the simulation's (flat, row-major) order: its
    rounding plus the zero point, saturated as the codec's RESCALE does. A
    rank-4 rounding Arm computes channels-last is put back channels-first."""
    v = torch.from_numpy(values.astype(np.int64))
    if tuple(v.shape) != tuple(shape) and len(shape) == 4 and tuple(v.shape) == (
            shape[0], shape[2], shape[3], shape[1]):
        v = v.permute(0, 3, 1, 2)
    if values.dtype == np.int8 and zero_point != 0:
        return None  # an int8 CAST belongs to an encode with zero point 0 (lower_codecs)
    return torch.clamp(v.reshape(-1) + zero_point, qmin, qmax)


__all__ = ["ArtefactRounding", "ArtefactRuns", "artefact_roundings", "askable", "exposing", "faster_program",
           "rounding_names"]
