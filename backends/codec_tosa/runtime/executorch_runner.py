"""Run a whole ``.pte`` in the ExecuTorch runtime with ``CodecTosaBackend`` registered.

The delegate payloads (TOSA flatbuffers) execute on the TOSA reference model
through the C++ runtime backend built by :mod:`codec_tosa.runtime.native`; the
rest of the program (for example quantize/dequantize at the delegate boundary)
runs on ExecuTorch's CPU kernels.

Loading the backend library and importing ``tosa_reference_model`` in the same
process is safe: the library links its own reference model with private
symbols (see ``native._command``), so both copies coexist.

``run_pte_recorded`` also returns what every delegate call really received and
produced, read back from the C++ backend's recorder, so that validation can run
each delegate on the reference model alone, including delegates fed by values
the CPU computed (docs/DESIGN.md, "Validation").

A program whose weights live in a .ptd (`pte.ProgramFiles`, external named
data) runs with it: the runtime hands it to every delegate's init, and a
recorded call's payload is its whole TOSA flatbuffer (`serialization.external`).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, Union

import numpy as np
import torch

from codec_tosa.runtime import BACKEND_ID
from codec_tosa.runtime import native
from codec_tosa.runtime.pte import (Delegate, NamedData, ProgramFiles, PteError, PteInfo, TensorSpec, delegates,
                                    inspect_pte)
from codec_tosa.serialization import external
from codec_tosa.serialization.tosa_stats import TensorInfo, entry_io_tensors

__all__ = ["DelegateCall", "NUMPY_DTYPES", "PteRunError", "run_pte", "run_pte_recorded"]

PteSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]", ProgramFiles]

class PteRunError(RuntimeError):
    """The .pte could not be loaded or run in the ExecuTorch runtime.

    `calls`: from `run_pte_recorded`, the delegate calls the run made before it
    failed, the failing one included (its inputs are recorded before it runs;
    a call that did not finish has no outputs)."""

    calls: "Sequence[DelegateCall]" = ()


def _read(pte: PteSource) -> ProgramFiles:
    if isinstance(pte, ProgramFiles):
        return pte
    if isinstance(pte, (bytes, bytearray, memoryview)):
        return ProgramFiles(bytes(pte))
    path = Path(pte)
    try:
        return ProgramFiles(path.read_bytes())
    except OSError as exc:
        raise PteRunError(f"cannot read {path}: {exc.strerror or exc}") from exc


def _registered_backends() -> list[str]:
    from executorch.extension.pybindings import portable_lib

    return list(portable_lib._get_registered_backend_names())


def run_pte(
    pte: PteSource,
    inputs: Sequence[torch.Tensor],
    method: str = "forward",
) -> list[torch.Tensor]:
    """Run ``method`` of a .pte (bytes, a path, or `ProgramFiles`: with its .ptd) on
    ``inputs``; return its outputs.

    Raises PteRunError with a one-line reason if the backend library cannot be
    built or loaded, or the program cannot be parsed, loaded (e.g. a backend it
    needs is not registered, a corrupt delegate, weights missing from the .ptd)
    or run (e.g. inputs of the wrong shape or dtype).
    """
    files = _read(pte)
    return _run(files, _inspect(files.pte), inputs, method)


def _inspect(data: bytes) -> PteInfo:
    try:
        return inspect_pte(data)
    except PteError as exc:
        raise PteRunError(str(exc)) from exc


def _load_native() -> None:
    try:
        native.load()
    except native.NativeBuildError as exc:
        # Keep the caller's error one line; the compiler output is one command away.
        first = str(exc).splitlines()[0]
        raise PteRunError(
            f"the CodecTosaBackend runtime library is unavailable: {first} "
            "(details: python -m codec_tosa.runtime.native build)"
        ) from exc


@functools.lru_cache(maxsize=2)  # validate runs one program on many input sets
def _needed_weights(pte: bytes) -> tuple[tuple[int, dict[str, int]], ...]:
    """(delegate index, key -> bytes) of each CodecTosaBackend delegate with external weights."""
    return tuple((d.index, external.needed(d.payload)) for d in delegates(pte)
                 if d.backend_id == BACKEND_ID and external.is_external(d.payload))


def _missing_weights(files: ProgramFiles) -> str | None:
    """Why a CodecTosaBackend delegate's external weights are not in the named data
    given with the program, or None. The C++ backend refuses the same at init; this
    names the file and the constant in one line."""
    try:
        needed = _needed_weights(files.pte)
    except (PteError, external.ExternalWeightsError) as exc:
        return str(exc)
    for index, keys in needed:
        for key, nbytes in keys.items():
            blob = files.ptd.get(key) if files.ptd is not None else None
            if files.ptd is None:
                return (f"delegate {index} keeps its weights in named data and no .ptd was given "
                        "(load the .ptd written with this .pte)")
            if blob is None or len(blob) != nbytes:
                found = "missing" if blob is None else f"{len(blob)} bytes, expected {nbytes}"
                return (f"{files.ptd.name}: not the named data of this program: delegate {index}'s "
                        f"weight {key} is {found}")
    return None


def _run(files: ProgramFiles, info: PteInfo, inputs: Sequence[torch.Tensor], method: str) -> list[torch.Tensor]:
    data = files.pte
    _load_native()
    if info.needs_quantized_kernels:
        import executorch.kernels.quantized  # noqa: F401  (registers the kernels)
    from executorch.extension.pybindings import portable_lib

    def context() -> str:
        return (
            f"delegates in program: {list(info.delegate_ids)}; "
            f"registered backends: {_registered_backends()}"
        )

    # The runtime would only say "error 0x20" at the first run; name the
    # missing backend up front instead.
    registered = set(_registered_backends())
    missing = sorted(set(info.delegate_ids) - registered)
    if missing:
        raise PteRunError(
            f"program delegates to backend(s) {missing} that are not registered "
            f"in this runtime (registered: {sorted(registered)})"
        )
    missing = _missing_weights(files)
    if missing is not None:
        raise PteRunError(missing)
    # the runtime reads both buffers in place (no copy) when the method initialises,
    # at its first run: they must outlive the module
    named = files.ptd.bytes() if files.ptd is not None else None
    try:
        module = portable_lib._load_for_executorch_from_buffer(data, named)
    except RuntimeError as exc:
        raise PteRunError(f"ExecuTorch could not load the program: {exc} ({context()})") from exc
    try:
        # Methods and their delegates are initialised lazily, so backend
        # init errors surface here as well as execution errors.
        outputs = module.run_method(method, tuple(_in_dim_order(x, spec) for x, spec in
                                                  zip(inputs, info.input_specs or [None] * len(inputs))))
    except RuntimeError as exc:
        raise PteRunError(f"ExecuTorch could not run method {method!r}: {exc} ({context()})") from exc
    # Outputs can alias runtime-owned planned memory that the next run
    # overwrites; hand the caller its own copies.
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in outputs]


def _in_dim_order(x: Any, spec: TensorSpec | None) -> Any:
    """`x` laid out in the dim order the program's input declares: the runtime
    reads a channels-last input's bytes as channels-last, whatever the strides
    it is handed (a contiguous tensor would be misread)."""
    order = spec.dim_order if spec is not None else ()
    if not isinstance(x, torch.Tensor) or len(order) != x.dim() or order == tuple(range(x.dim())):
        return x
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return x.permute(order).contiguous().permute(inverse)  # same values, memory in `order`


@dataclass(frozen=True)
class DelegateCall:
    """One CodecTosaBackend delegate call of a run, as the runtime backend saw it.

    ``inputs`` and ``outputs`` are in the TOSA graph's entry-block order, with
    its shapes and dtypes: what ``tools.reference_model.run_reference_model``
    takes and returns for ``payload``.
    """

    call: int  # order of the call within the run, from 0
    delegate_index: int  # position among the method's delegates (pte.Delegate.index)
    backend_id: str
    payload_hash: str  # FNV-1a 64, hex (native.payload_hash)
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    payload: bytes = field(repr=False, default=b"")  # the whole TOSA flatbuffer (external weights put back)


# TOSA dtype names at a delegate boundary (the C++ backend's ElementType set).
NUMPY_DTYPES = {"FP32": np.float32, "FP16": np.float16, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
                "BOOL": np.bool_}


def run_pte_recorded(
    pte: PteSource,
    inputs: Sequence[torch.Tensor],
    method: str = "forward",
) -> tuple[list[torch.Tensor], list[DelegateCall]]:
    """`run_pte`, plus every CodecTosaBackend delegate call it made, in call order.

    The C++ backend writes each call's tensors into a temporary directory
    (``native.record``), removed before returning. Each call is matched to its
    delegate by the hash of the payload; delegates with identical payloads are
    told apart by the order of the method's delegate-call instructions.
    """
    files = _read(pte)
    info = _inspect(files.pte)
    _load_native()
    with tempfile.TemporaryDirectory(prefix="codec_tosa_record-") as directory:
        native.record(directory)
        try:
            outputs = _run(files, info, inputs, method)
        except PteRunError as exc:
            try:
                exc.calls = _read_recording(Path(directory), files, info, method, finished=False)
            except PteRunError:
                pass  # the run's own error is the one to report
            raise
        finally:
            native.record(None)
        return outputs, _read_recording(Path(directory), files, info, method)


def _whole_tosa(payload: bytes, ptd: NamedData | None) -> bytes:
    """The delegate's TOSA flatbuffer, its external weights put back from `ptd`."""
    try:
        return external.complete(payload, None if ptd is None else ptd.get)
    except external.ExternalWeightsError as exc:
        raise PteRunError(f"{ptd.name if ptd is not None else 'no .ptd'}: {exc}") from None


def _read_recording(directory: Path, program: ProgramFiles, info: PteInfo, method: str,
                    finished: bool = True) -> list[DelegateCall]:
    """The recorded calls; `finished` False: the run failed, and a call without
    recorded outputs (the one that failed) gets none."""
    data = program.pte
    manifest = directory / "manifest.tsv"
    if not manifest.is_file():
        return []
    # call -> (hash, {(role, index): (dtype, shape, file)})
    calls: dict[int, tuple[str, dict[tuple[str, int], tuple[str, tuple[int, ...], str]]]] = {}
    for line in manifest.read_text().splitlines():
        call, digest, role, index, dtype, dims, name = line.split("\t")
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        calls.setdefault(int(call), (digest, {}))[1][(role, int(index))] = (dtype, shape, name)

    try:
        every = [d for d in delegates(data) if d.method == method and d.backend_id == BACKEND_ID]
    except PteError as exc:
        raise PteRunError(str(exc)) from exc
    by_hash: dict[str, list[Delegate]] = defaultdict(list)
    for d in every:
        by_hash[native.payload_hash(d.payload)].append(d)
    # the method's delegate calls in instruction order, to tell identical payloads apart
    order = ([c.delegate_index for c in info.delegate_calls if c.delegate_id == BACKEND_ID]
             if info.method == method else [])

    recorded: list[DelegateCall] = []
    whole: dict[int, bytes] = {}  # by delegate index
    for position, call in enumerate(sorted(calls)):
        digest, files = calls[call]
        candidates = by_hash.get(digest)
        if not candidates:
            raise PteRunError(f"recorded delegate call {call} names payload {digest}, "
                              f"which no {BACKEND_ID} delegate of method {method!r} has")
        expected = order[position % len(order)] if order else -1
        delegate = next((d for d in candidates if d.index == expected), candidates[0])
        if delegate.index not in whole:
            whole[delegate.index] = _whole_tosa(delegate.payload, program.ptd)
        specs_in, specs_out = entry_io_tensors(whole[delegate.index])
        ran = finished or all(("out", i) in files for i in range(len(specs_out)))
        arrays = {role: [_load_tensor(directory, call, role, i, spec, files.get((role, i)))
                         for i, spec in enumerate(specs)]
                  for role, specs in (("in", specs_in), ("out", specs_out if ran else []))}
        recorded.append(DelegateCall(call, delegate.index, delegate.backend_id, digest,
                                     arrays["in"], arrays["out"], whole[delegate.index]))
    return recorded


def _load_tensor(directory: Path, call: int, role: str, index: int, spec: TensorInfo,
                 entry: tuple[str, tuple[int, ...], str] | None) -> np.ndarray:
    """One recorded tensor at the graph's shape and dtype; the manifest must agree."""
    what = f"recorded delegate call {call}, {role}put {index}"
    if entry is None:
        raise PteRunError(f"{what}: missing from the recording")
    dtype, shape, name = entry
    if dtype != spec.dtype or shape != tuple(spec.shape) or dtype not in NUMPY_DTYPES:
        raise PteRunError(f"{what}: recorded as {dtype}{list(shape)}, "
                          f"the TOSA graph declares {spec.dtype}{spec.shape}")
    array = np.fromfile(directory / name, dtype=NUMPY_DTYPES[dtype])
    if array.size != int(np.prod(shape, dtype=np.int64)):
        raise PteRunError(f"{what}: {array.nbytes} bytes recorded, expected {spec.nbytes}")
    return array.reshape(shape)
