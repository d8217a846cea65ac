"""What the delegate's compile specs carry besides Arm's: the options the backend
acts on, and the provenance (versions, spec, plan) that ends up in the .pte."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Sequence

from executorch.exir.backend.compile_spec_schema import CompileSpec

PREFIX = "codec_tosa."


def _version(pkg: str) -> str:
    try:
        return version(pkg)
    except PackageNotFoundError:
        return "unknown"


OPTIONS = PREFIX + "options"


def option_specs(spec: Any) -> list[CompileSpec]:
    """The options `CodecTosaBackend.preprocess` acts on (a channel of their own);
    ``external_weights`` only when asked, so that an inline program keeps its bytes."""
    options: dict[str, Any] = {"pool_constants": spec.pool_constants}
    if spec.external_weights:
        options["external_weights"] = True
    return [CompileSpec(OPTIONS, json.dumps(options, sort_keys=True).encode())]


def read_options(specs: Sequence[Any]) -> dict[str, Any]:
    return read_provenance(specs).get("options", {})


def provenance_specs(spec: Any, plan: dict[str, Any]) -> list[CompileSpec]:
    """Versions, options and the plan; Arm's compile-spec parser ignores these keys."""
    fields = {
        "versions": json.dumps({p: _version(p) for p in
                                ("codec_tosa", "executorch", "torch", "tosa-tools")}, sort_keys=True),
        "spec": spec.dumps(),
        "plan": json.dumps(plan, sort_keys=True, separators=(",", ":")),
    }
    return [CompileSpec(PREFIX + k, v.encode()) for k, v in fields.items()]


def read_provenance(specs: Sequence[Any]) -> dict[str, Any]:
    """Inverse of `provenance_specs` for compile specs read back from a .pte."""
    out: dict[str, Any] = {}
    for s in specs:
        key = s.key if isinstance(s.key, str) else s.key.decode()
        if key.startswith(PREFIX):
            raw = s.value if isinstance(s.value, (bytes, bytearray)) else bytes(s.value)
            out[key[len(PREFIX):]] = json.loads(raw.decode())
        elif key == "tosa_spec":
            raw = s.value if isinstance(s.value, (bytes, bytearray)) else bytes(s.value)
            out["tosa_spec"] = raw.decode()
    return out


def foreign_specs(specs: Sequence[Any]) -> dict[str, str]:
    """The compile specs that are not codec_tosa's, as text (Arm's ``compile_flags``,
    ``debug_artifact_path``, ...): what `codec-tosa report` needs to re-run Vela."""
    out: dict[str, str] = {}
    for s in specs:
        key = s.key if isinstance(s.key, str) else s.key.decode()
        if not key.startswith(PREFIX):
            raw = s.value if isinstance(s.value, (bytes, bytearray)) else bytes(s.value)
            out[key] = raw.decode(errors="replace")
    return out
