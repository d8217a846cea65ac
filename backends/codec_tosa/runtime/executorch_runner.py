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
from pathlib import Path
from typing import Sequence, Union

import torch

from codec_tosa.runtime import native
from codec_tosa.runtime.pte import PteError, inspect_pte

__all__ = ["PteRunError", "run_pte"]

PteSource = Union[bytes, bytearray, memoryview, str, "os.PathLike[str]"]

class PteRunError(RuntimeError):
    """The .pte could not be loaded or run in the ExecuTorch runtime."""


def _read(pte: PteSource) -> bytes:
    if isinstance(pte, (bytes, bytearray, memoryview)):
        return bytes(pte)
    path = Path(pte)
    try:
        return path.read_bytes()
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
    """Run ``method`` of a .pte (bytes or path) on ``inputs``; return its outputs.

    Raises PteRunError with a one-line reason if the backend library cannot be
    built or loaded, or the program cannot be parsed, loaded (e.g. a backend it
    needs is not registered, a corrupt delegate) or run (e.g. inputs of the
    wrong shape or dtype).
    """
    data = _read(pte)
    try:
        info = inspect_pte(data)
    except PteError as exc:
        raise PteRunError(str(exc)) from exc
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
