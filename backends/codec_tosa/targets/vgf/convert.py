"""TOSA flatbuffer -> VGF through the ML SDK's model-converter (docs/DESIGN.md, "The VGF target")."""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import tosa_serializer as ts

from codec_tosa.targets.vgf.errors import ConversionError
from codec_tosa.targets.vgf.tools import model_converter

CONVERT_TIMEOUT_S = 600.0
# MLIR diagnostics name an operation as 'tosa.depthwise_conv2d' (TOSA dialect)
# or 'spirv.Tosa.DepthwiseConv2D' (after lowering to SPIR-V graphs)
_OP_IN_MESSAGE = re.compile(r"'(?:spirv\.)?tosa\.(\w+)'", re.IGNORECASE)


def convert(tosa_bytes: bytes, label: str = "TOSA payload") -> bytes:
    """The VGF that model-converter makes of `tosa_bytes`.

    On failure, ConversionError carries one line: `label`, the TOSA operator
    when the converter names one, and the converter's first error line, quoted.
    """
    converter = model_converter()
    with tempfile.TemporaryDirectory(prefix="codec-tosa-vgf-") as tmp:
        source, target = Path(tmp) / "model.tosa", Path(tmp) / "model.vgf"
        source.write_bytes(tosa_bytes)
        try:
            done = subprocess.run([str(converter), "-i", str(source), "-o", str(target)],
                                  capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise ConversionError(f"{label}: model-converter did not finish in {CONVERT_TIMEOUT_S:.0f} s") from None
        output = f"{done.stderr}\n{done.stdout}"
        if done.returncode != 0 or not target.exists():
            raise conversion_error(label, output, done.returncode)
        return target.read_bytes()


def conversion_error(label: str, output: str, returncode: int) -> ConversionError:
    """One line from the converter's output: its first `error:` line, with the operator it names."""
    line = first_error_line(output) or f"exit status {returncode}, no error message"
    op = operator_named(line)
    where = f" at TOSA operator {op}" if op else ""
    return ConversionError(f"{label}: model-converter failed{where}: \"{line}\"", op, output)


def first_error_line(output: str) -> str | None:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for ln in lines:
        if "error:" in ln:
            return ln[ln.index("error:"):]
    for ln in lines:  # e.g. "Failed to compile network" alone
        if not ln.startswith(("WARNING", "INFO", "VGF [debug]")):
            return ln
    return None


def operator_named(message: str) -> str | None:
    """The TOSA operator (as tosa_serializer spells it, e.g. DEPTHWISE_CONV2D) a message names."""
    match = _OP_IN_MESSAGE.search(message)
    if match is None:
        return None
    key = match.group(1).replace("_", "").upper()
    return _tosa_operators().get(key, match.group(1).upper())


@lru_cache(maxsize=1)
def _tosa_operators() -> dict[str, str]:
    names = [n for n in dir(ts.Op) if n.isupper()]
    return {n.replace("_", ""): n for n in names}


def converter_version() -> str:
    """The `version` of `model-converter --version` (a JSON document in 0.11.0), for reports."""
    done = subprocess.run([str(model_converter()), "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    try:
        return str(json.loads(done.stdout)["version"])
    except (ValueError, KeyError, TypeError):
        return (done.stdout or done.stderr).strip().split("\n")[0] or "unknown"


__all__ = ["convert", "conversion_error", "converter_version", "first_error_line", "operator_named"]
