"""The one reader of ExecuTorch program files (.pte, and the .ptd beside it): executorch's `_serialize` is
private, so every look inside a .pte goes through here (docs/DESIGN.md, "Tools").

It reads the program header (CPU operators, delegates, how each delegate call
is wired), extracts delegate payloads and their compile specs (our options and
provenance), and the pooling records `CodecTosaBackend` stores as named data.
`with_delegates_replaced` writes the one kind of .pte validation needs: the same
program with some delegates swapped for stand-ins the runtime here can run.

The .ptd beside a .pte (its external named data, ExecuTorch's flat_tensor
format) is read here too (`read_ptd`, `NamedData`: memory-mapped, each blob a
zero-copy view), and `program_files` takes both files from a program manager.
"""

from __future__ import annotations

import dataclasses
import mmap
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from executorch.exir import schema
from executorch.exir._serialize import _deserialize_pte_binary, _program
from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary
from executorch.extension.flat_tensor.serialize.serialize import FlatTensorHeader, _deserialize_to_flat_tensor

from codec_tosa.planning.provenance import foreign_specs, read_provenance
from codec_tosa.runtime import BACKEND_ID
from codec_tosa.serialization.pooled import PoolingStats
from codec_tosa.serialization.pooling_record import record_key


class PteError(ValueError):
    """The file is not a usable .pte (one line, names the file and the reason)."""


# Operators whose ExecuTorch kernels live in executorch.kernels.quantized, not
# in the portable kernels the Python bindings register by default.
_QUANTIZED_NAMESPACE = "quantized_decomposed::"


@dataclass(frozen=True)
class DelegateCallInfo:
    """One delegate call of the forward plan: the value indices of the tensors it
    is passed (its inputs, then its outputs, as the runtime hands them over)."""

    delegate_id: str
    tensor_args: tuple[int, ...]
    delegate_index: int = -1  # position among the plan's delegates (Delegate.index)


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one program input, as the execution plan declares it."""

    shape: tuple[int, ...]
    dtype: str  # torch dtype name ("float32", "int64", ...), so this module needs no torch
    dim_order: tuple[int, ...] = ()  # the memory order of its dimensions; () or 0, 1, ...: contiguous

    @property
    def channels_last(self) -> bool:
        return self.dim_order == (0, 2, 3, 1)


# executorch ScalarType names -> torch dtype names (the types a program input can have)
_SCALAR_TYPES = {"BYTE": "uint8", "CHAR": "int8", "SHORT": "int16", "INT": "int32", "LONG": "int64",
                 "HALF": "float16", "FLOAT": "float32", "DOUBLE": "float64", "BOOL": "bool",
                 "BFLOAT16": "bfloat16", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64"}


@dataclass(frozen=True)
class PteInfo:
    """What the runner needs to know about a program before loading it."""

    operators: tuple[str, ...]  # "namespace::name" of the CPU operators
    delegate_ids: tuple[str, ...]
    # the first plan's input and output value indices and its delegate calls
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    delegate_calls: tuple[DelegateCallInfo, ...] = ()
    method: str = ""  # the name of that first plan
    # per program input: its tensor spec, or None (a scalar or other non-tensor input)
    input_specs: tuple[TensorSpec | None, ...] = ()

    @property
    def needs_quantized_kernels(self) -> bool:
        return any(op.startswith(_QUANTIZED_NAMESPACE) for op in self.operators)


def _program_header(data: bytes) -> Any:
    """The program flatbuffer (not its segments)."""
    # Private but stable within the pinned executorch; the same parser
    # _extract_delegate_payload uses.

    try:
        header = _program._get_extended_header(data)
        size = header.program_size if header is not None and header.is_valid() else len(data)
        return _program._flatbuffer_to_program(data[:size])
    except Exception as exc:  # the flatbuffer parser raises many kinds
        raise PteError(f"not a valid ExecuTorch program (.pte): {exc}") from exc


def inspect_pte(data: bytes) -> PteInfo:
    """Parse the program's flatbuffer header (not its segments)."""
    program = _program_header(data)
    operators = tuple(op.name for plan in program.execution_plan for op in plan.operators)
    delegates = tuple(d.id for plan in program.execution_plan for d in plan.delegates)
    if not program.execution_plan:
        return PteInfo(operators=operators, delegate_ids=delegates)
    plan = program.execution_plan[0]
    calls = tuple(
        DelegateCallInfo(
            plan.delegates[instr.instr_args.delegate_index].id,
            tuple(a for a in instr.instr_args.args if isinstance(plan.values[a].val, schema.Tensor)),
            instr.instr_args.delegate_index,
        )
        for chain in plan.chains
        for instr in chain.instructions
        if isinstance(instr.instr_args, schema.DelegateCall)
    )
    return PteInfo(operators=operators, delegate_ids=delegates, inputs=tuple(plan.inputs),
                   outputs=tuple(plan.outputs), delegate_calls=calls, method=plan.name,
                   input_specs=tuple(_tensor_spec(plan.values[i].val) for i in plan.inputs))


def input_derived_values(data: bytes) -> frozenset[int] | None:
    """The value indices of the first plan that may depend on a program input: the
    inputs, and every value an instruction touches together with one of them (a
    fixed point; an instruction's outputs are not told from its inputs, and a list
    value touches its items, so it over-approximates). A delegate call's outputs are
    left out, which is sound for a program with one delegate call (within a run its
    outputs feed nothing it reads), the case it is for (validation's
    `artefact_rounding`). None where the plan has control flow (a jump: what runs
    depends on the values)."""
    program = _program_header(data)
    if not program.execution_plan:
        return None
    plan = program.execution_plan[0]

    def touched(args: Any) -> set[int]:
        out = set(args)
        for a in args:
            items = getattr(plan.values[a].val, "items", None)
            if isinstance(items, list) and all(isinstance(i, int) for i in items):
                out.update(i for i in items if 0 <= i < len(plan.values))
        return out

    steps: list[set[int]] = []
    for chain in plan.chains:
        for instr in chain.instructions:
            args = instr.instr_args
            if isinstance(args, (schema.DelegateCall, schema.FreeCall)):
                continue
            if isinstance(args, schema.KernelCall):
                steps.append(touched(args.args))
            elif isinstance(args, schema.MoveCall):
                steps.append({args.move_from, args.move_to})
            else:
                return None
    derived = set(plan.inputs)
    changed = True
    while changed:
        changed = False
        for values in steps:
            if values & derived and not values <= derived:
                derived |= values
                changed = True
    return frozenset(derived)


def planned_buffers(data: bytes) -> dict[str, tuple[int, ...]]:
    """ExecuTorch's own memory plan of each method: the bytes of each planned buffer
    (`non_const_buffer_sizes`, its reserved entry 0 left out), which the runtime
    allocates for the method's non-constant tensors (delegate inputs and outputs
    and the CPU operators' tensors; not what a delegate allocates inside)."""
    return {plan.name: tuple(int(n) for n in list(plan.non_const_buffer_sizes or [])[1:])
            for plan in _program_header(data).execution_plan}


def call_counts(data: bytes, method: str = "forward") -> tuple[Counter[str], Counter[str]]:
    """What `method` runs: delegate calls by backend id, and CPU kernel calls by
    operator (``name.overload`` where the program names an overload)."""
    program = _program_header(data)
    plan = next(p for p in program.execution_plan if p.name == method)
    delegates: Counter[str] = Counter()
    kernels: Counter[str] = Counter()
    for chain in plan.chains:
        for instr in chain.instructions:
            args = instr.instr_args
            if isinstance(args, schema.DelegateCall):
                delegates[plan.delegates[args.delegate_index].id] += 1
            elif isinstance(args, schema.KernelCall):
                op = plan.operators[args.op_index]
                kernels[f"{op.name}.{op.overload}" if op.overload else op.name] += 1
    return delegates, kernels


def _tensor_spec(val: Any) -> TensorSpec | None:
    if not isinstance(val, schema.Tensor):
        return None
    name = getattr(val.scalar_type, "name", str(val.scalar_type))
    return TensorSpec(tuple(int(d) for d in val.sizes), _SCALAR_TYPES.get(name, name.lower()),
                      tuple(int(d) for d in (val.dim_order or ())))


def read_pte(path: str | Path) -> bytes:
    """The bytes of a whole, parseable .pte file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise PteError(f"{p}: cannot read ({e.strerror or e})") from None
    try:
        inspect_pte(data)
    except PteError as e:
        raise PteError(f"{p}: {e}") from None
    # inspect_pte reads the program header only; a truncated file still has one
    # but loses segments (and delegate payloads would come back silently short)

    try:
        deserialize_pte_binary(data)
    except Exception as e:  # noqa: BLE001 (the parser raises many kinds)
        raise PteError(f"{p}: not a valid ExecuTorch program (.pte), truncated or corrupt: {e}") from None
    return data


def delegate_payload(data: bytes, backend_id: str = BACKEND_ID, path: str | Path = "<bytes>") -> bytes:
    """The payload of the first delegate whose id is exactly `backend_id`."""
    every = delegates(data, path)
    found = [d for d in every if d.backend_id == backend_id]
    if not found:
        raise PteError(f"{path}: holds no {backend_id} delegate "
                       f"(delegates: {[d.backend_id for d in every] or 'none'})")
    return found[0].payload


@dataclass(frozen=True)
class Delegate:
    """One delegate of a program: where it is called, its backend, payload and compile specs."""

    method: str  # the execution plan (method) that calls it
    index: int  # its position among that method's delegates
    backend_id: str
    payload: bytes
    compile_specs: dict[str, Any]  # read_provenance's view: our options and provenance, Arm's tosa_spec
    # every compile spec that is not ours, as text (Arm's compile_flags, debug_artifact_path, ...)
    arm_specs: dict[str, str] = field(default_factory=dict)


def delegates(data: bytes, path: str | Path = "<bytes>") -> list[Delegate]:
    """Every delegate of every method, in order, with its payload and compile specs."""
    try:
        program = deserialize_pte_binary(data)
    except Exception as e:  # noqa: BLE001 (the parser raises many kinds)
        raise PteError(f"{path}: not a valid ExecuTorch program (.pte), truncated or corrupt: {e}") from None
    program = getattr(program, "program", program)
    # deserialize_pte_binary moves segment payloads inline
    return [Delegate(plan.name, i, d.id, bytes(program.backend_delegate_data[d.processed.index].data),
                     read_provenance(d.compile_specs), foreign_specs(d.compile_specs))
            for plan in program.execution_plan for i, d in enumerate(plan.delegates)]


def with_delegates_replaced(data: bytes, replacements: dict[int, tuple[str, bytes]],
                            path: str | Path = "<bytes>") -> bytes:
    """The same program with delegate i of its first method given backend id and
    payload `replacements[i]` (compile specs, wiring and CPU operators unchanged)."""
    try:
        pte_file = deserialize_pte_binary(data)
    except Exception as e:  # noqa: BLE001 (the parser raises many kinds)
        raise PteError(f"{path}: not a valid ExecuTorch program (.pte), truncated or corrupt: {e}") from None
    program = pte_file.program
    plan = program.execution_plan[0]
    for i, (backend_id, payload) in replacements.items():
        d = plan.delegates[i]
        # deserialize_pte_binary moved every payload inline, indexed by processed.index
        program.backend_delegate_data[d.processed.index] = dataclasses.replace(
            program.backend_delegate_data[d.processed.index], data=payload)
        plan.delegates[i] = dataclasses.replace(d, id=backend_id)
    return bytes(serialize_pte_binary(pte_file))


def delegate_provenance(data: bytes, backend_id: str = BACKEND_ID) -> dict[str, Any]:
    """The options and provenance in the compile specs of the first `backend_id` delegate."""
    return next((d.compile_specs for d in delegates(data) if d.backend_id == backend_id), {})


def named_data_in_pte(data: bytes) -> dict[str, int]:
    """The named data the .pte holds itself: key -> bytes (pooling records, XNNPACK's
    inline constants, ...)."""
    named = _deserialize_pte_binary(data).named_data
    if named is None:
        return {}
    return {key: len(named.buffers[entry.buffer_index]) for key, entry in named.pte_data.items()}


def read_pooling_stats(pte_bytes: bytes, payload: bytes) -> PoolingStats | None:
    """The pooling record of one delegate of a .pte, or None (pooling off, stock .pte)."""
    named = _deserialize_pte_binary(pte_bytes).named_data
    if named is None:
        return None
    entry = named.pte_data.get(record_key(payload))
    if entry is None:
        return None
    return PoolingStats.from_json(bytes(named.buffers[entry.buffer_index]).decode())


# ------------------------------------------------------------------ .ptd (named data)

PTD_SUFFIX = ".ptd"
_PTD_IDENTIFIER = b"FT01"  # flat_tensor's flatbuffer file identifier, bytes 4-8


class NamedData:
    """The named data of a .ptd (ExecuTorch's flat_tensor format): key -> bytes,
    each a zero-copy view of the memory-mapped file (or of the bytes given).

    Opening checks what a loader would trip on later, each a one-line PteError
    naming the file: not a .ptd, a header or flatbuffer that does not parse, a
    segment that ends beyond the end of the file (truncated)."""

    def __init__(self, data: bytes | mmap.mmap, name: str | Path = "<bytes>") -> None:
        self.name = str(name)
        self._data = data
        self.nbytes = len(data)
        view = memoryview(data)
        if len(data) < 8 + FlatTensorHeader.EXPECTED_LENGTH or bytes(view[4:8]) != _PTD_IDENTIFIER:
            raise PteError(f"{self.name}: not an ExecuTorch named-data file (.ptd)")
        header = FlatTensorHeader.from_bytes(bytes(view[8:8 + FlatTensorHeader.EXPECTED_LENGTH]))
        end = header.flatbuffer_offset + header.flatbuffer_size
        if not header.is_valid() or end > len(data):
            raise PteError(f"{self.name}: not a valid .ptd, truncated or corrupt (its header promises "
                           f"{end} bytes of flatbuffer, the file has {len(data)})")
        try:
            flat = _deserialize_to_flat_tensor(bytes(view[:end]))
        except Exception as e:  # noqa: BLE001 (flatc reports many ways)
            raise PteError(f"{self.name}: not a valid .ptd, truncated or corrupt: {e}".splitlines()[0]) from None
        base = header.segment_base_offset
        if flat.segments and base + header.segment_data_size > len(data):
            raise PteError(f"{self.name}: truncated: its segments need {base + header.segment_data_size} bytes, "
                           f"the file has {len(data)}")
        self._blobs: dict[str, memoryview] = {}
        for entry in flat.named_data:
            if not 0 <= entry.segment_index < len(flat.segments):
                raise PteError(f"{self.name}: corrupt: key {entry.key} names segment {entry.segment_index} "
                               f"of {len(flat.segments)}")
            segment = flat.segments[entry.segment_index]
            if base + segment.offset + segment.size > len(data):
                raise PteError(f"{self.name}: truncated: key {entry.key} ends at byte "
                               f"{base + segment.offset + segment.size}, the file has {len(data)}")
            self._blobs[entry.key] = view[base + segment.offset:base + segment.offset + segment.size]

    def get(self, key: str) -> memoryview | None:
        return self._blobs.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._blobs

    def __iter__(self) -> Iterator[str]:
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)

    def bytes(self) -> bytes:
        """The whole file's bytes (what `_load_for_executorch_from_buffer` takes)."""
        return bytes(self._data)


def read_ptd(path: str | Path) -> NamedData:
    """The .ptd at `path`, memory-mapped. Raises PteError (one line, naming the file)
    when it is missing, empty or not a whole .ptd."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            if p.stat().st_size == 0:
                raise PteError(f"{p}: empty, not a .ptd")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # stays valid after close
    except OSError as e:
        raise PteError(f"{p}: cannot read ({e.strerror or e})") from None
    return NamedData(mapped, p)


def ptd_beside(pte: str | Path) -> Path:
    """Where the .ptd of a .pte is looked for: its name with the .ptd suffix (model.ptd)."""
    return Path(pte).with_suffix(PTD_SUFFIX)


@dataclass(frozen=True)
class ProgramFiles:
    """A .pte's bytes and the named data it was written with (None: none, all inline)."""

    pte: bytes
    ptd: NamedData | None = None


def program_files(manager: Any) -> ProgramFiles:
    """The .pte and .ptd an ExecuTorch program manager (`to_executorch()`) writes.
    The Python runtime loads one .ptd with a program: named data under more than one
    external tag is refused (one line)."""
    pte = bytes(manager.buffer)
    with tempfile.TemporaryDirectory(prefix="codec_tosa_ptd-") as directory:
        manager.write_tensor_data_to_file(directory)
        written = sorted(Path(directory).glob("*" + PTD_SUFFIX))
        if len(written) > 1:
            raise PteError(f"the program's named data is split over {len(written)} files "
                           f"({', '.join(p.name for p in written)}); ExecuTorch's Python runtime loads one .ptd "
                           "with a program: put every external tag in one")
        if not written:
            return ProgramFiles(pte)
        data = written[0].read_bytes()
    return ProgramFiles(pte, NamedData(data, written[0].name))


__all__ = ["Delegate", "DelegateCallInfo", "NamedData", "PTD_SUFFIX", "ProgramFiles", "PteError", "PteInfo",
           "TensorSpec", "delegate_payload", "delegate_provenance", "delegates", "input_derived_values", "inspect_pte", "named_data_in_pte", "planned_buffers", "program_files",
           "ptd_beside", "read_pooling_stats", "read_ptd", "read_pte", "with_delegates_replaced"]
