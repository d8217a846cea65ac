"""Run a whole ``.pte`` in the ExecuTorch runtime with ``CodecTosaBackend`` registered.

The delegate payloads (TOSA flatbuffers) execute on the TOSA reference model
through the C++ runtime backend built by :mod:`codec_tosa.runtime.native`; the
rest of the program (for example quantize/dequantize at the delegate boundary)
runs on ExecuTorch's CPU kernels.

Loading the backend library and importing ``tosa_reference_model`` in the same
process is safe: the library links its own reference model with private
symbols (see ``native._command``), so both copies coexist.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import torch

from codec_tosa.runtime import native

__all__ = ["PteRunError", "PteInfo", "DelegateCallInfo", "inspect_pte", "run_pte"]

PteSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]

# Operators whose ExecuTorch kernels live in executorch.kernels.quantized, not
# in the portable kernels the Python bindings register by default.
_QUANTIZED_NAMESPACE = "quantized_decomposed::"


class PteRunError(RuntimeError):
    """The .pte could not be loaded or run in the ExecuTorch runtime."""


@dataclass(frozen=True)
class DelegateCallInfo:
    """One delegate call of the forward plan: the value indices of the tensors it
    is passed (its inputs, then its outputs, as the runtime hands them over)."""

    delegate_id: str
    tensor_args: tuple[int, ...]


@dataclass(frozen=True)
class PteInfo:
    """What the runner needs to know about a program before loading it."""

    operators: tuple[str, ...]  # "namespace::name" of the CPU operators
    delegate_ids: tuple[str, ...]
    # the first plan's input and output value indices and its delegate calls
    inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    delegate_calls: tuple[DelegateCallInfo, ...] = ()

    @property
    def needs_quantized_kernels(self) -> bool:
        return any(op.startswith(_QUANTIZED_NAMESPACE) for op in self.operators)


def _read(pte: PteSource) -> bytes:
    if isinstance(pte, (bytes, bytearray, memoryview)):
        return bytes(pte)
    path = Path(pte)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PteRunError(f"cannot read {path}: {exc.strerror or exc}") from exc


def inspect_pte(data: bytes) -> PteInfo:
    """Parse the program's flatbuffer header (not its segments)."""
    # Private but stable within the pinned executorch; the same parser
    # _extract_delegate_payload uses.
    from executorch.exir import schema
    from executorch.exir._serialize import _program

    try:
        header = _program._get_extended_header(data)
        size = header.program_size if header is not None and header.is_valid() else len(data)
        program = _program._flatbuffer_to_program(data[:size])
    except Exception as exc:  # the flatbuffer parser raises many kinds
        raise PteRunError(f"not a valid ExecuTorch program (.pte): {exc}") from exc
    operators = tuple(op.name for plan in program.execution_plan for op in plan.operators)
    delegates = tuple(d.id for plan in program.execution_plan for d in plan.delegates)
    if not program.execution_plan:
        return PteInfo(operators=operators, delegate_ids=delegates)
    plan = program.execution_plan[0]
    calls = tuple(
        DelegateCallInfo(
            plan.delegates[instr.instr_args.delegate_index].id,
            tuple(a for a in instr.instr_args.args if isinstance(plan.values[a].val, schema.Tensor)),
        )
        for chain in plan.chains
        for instr in chain.instructions
        if isinstance(instr.instr_args, schema.DelegateCall)
    )
    return PteInfo(operators=operators, delegate_ids=delegates, inputs=tuple(plan.inputs),
                   outputs=tuple(plan.outputs), delegate_calls=calls)


def _registered_backends() -> list[str]:
    from executorch.extension.pybindings import portable_lib

    return list(portable_lib._get_registered_backend_names())


def run_pte(
    pte: PteSource,
    inputs: Sequence[torch.Tensor],
    method: str = "forward",
) -> list[torch.Tensor]:
    """Run ``method`` of a .pte (bytes or path) on ``inputs``; return its outputs.

    Raises PteRunError with a one-line reason if the backend library cannot be
    built or loaded, or the program cannot be parsed, loaded (e.g. a backend it
    needs is not registered, a corrupt delegate) or run (e.g. inputs of the
    wrong shape or dtype).
    """
    data = _read(pte)
    info = inspect_pte(data)
    try:
        native.load()
    except native.NativeBuildError as exc:
        # Keep the caller's error one line; the compiler output is one command away.
        first = str(exc).splitlines()[0]
        raise PteRunError(
            f"the CodecTosaBackend runtime library is unavailable: {first} "
            "(details: python -m codec_tosa.runtime.native build)"
        ) from exc
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
    try:
        module = portable_lib._load_for_executorch_from_buffer(data)
    except RuntimeError as exc:
        raise PteRunError(f"ExecuTorch could not load the program: {exc} ({context()})") from exc
    try:
        # Methods and their delegates are initialised lazily, so backend
        # init errors surface here as well as execution errors.
        outputs = module.run_method(method, tuple(inputs))
    except RuntimeError as exc:
        raise PteRunError(f"ExecuTorch could not run method {method!r}: {exc} ({context()})") from exc
    # Outputs can alias runtime-owned planned memory that the next run
    # overwrites; hand the caller its own copies.
    return [t.clone() if isinstance(t, torch.Tensor) else t for t in outputs]
