"""Our flows on one peer case: `codec-tosa compile` then `validate`, at policies W and I.

Each (case, policy) runs in a forked child with a timeout, as `stock.py` runs Arm's
flows, and becomes a JSON-able record:

* ``verdict``: validate's PASS / FAIL / INCOMPLETE, or ``refused`` when compile
  stopped with one of our one-line errors, ``library`` when a library (Arm's
  backend, torch.export) failed and we said so in one line, ``internal`` for an
  error of ours that is a bug, ``timeout`` / ``crash``;
* ``line``: that one line (the CLI's own wording, `cli.error_line`), or validate's
  failing lines;
* ``delegates``, ``cpu_ops`` (compute operators the .pte leaves on the CPU).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, TypedDict

from cases import PeerCase
from isolation import isolated

POLICIES = ("W", "I")
SAMPLES = 4  # held-out samples compile stores and validate checks
DEFAULT_TIMEOUT_S = 300.0
_IO_KERNELS = {"quantized_decomposed::quantize_per_tensor", "quantized_decomposed::dequantize_per_tensor"}


class OursRecord(TypedDict, total=False):
    verdict: str
    line: str
    delegates: int
    cpu_ops: list[str]
    seconds: float


def run_policy(case: PeerCase, policy: str) -> OursRecord:
    """compile (in a temporary directory) and validate one case at `policy`."""
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.cli import error_kind, error_line
    from codec_tosa.tools.compiler import compile_module
    from codec_tosa.validation.validate import validate

    module, inputs = case.build()
    stage: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="codec-tosa-peer-") as d:
        try:
            compile_module(case.id, (module, tuple(inputs)), CodecSpec(policy), d, progress=False,
                           samples=SAMPLES, on_stage=lambda s: stage.__setitem__("at", s))
        except Exception as e:  # noqa: BLE001 - every error is a record
            return {"verdict": error_kind(e), "line": error_line(e, stage.get("at"))}
        pte = Path(d) / "model.pte"
        info = inspect_pte(pte.read_bytes())
        record: OursRecord = {"delegates": len(info.delegate_ids),
                              "cpu_ops": sorted(op for op in info.operators if op not in _IO_KERNELS)}
        try:
            v = validate(pte)
        except Exception as e:  # noqa: BLE001
            return {**record, "verdict": "validate " + error_kind(e), "line": error_line(e)}
        lines = v.lines()
        record["verdict"] = v.verdict.value
        record["line"] = " | ".join(ln.strip() for ln in lines if "FAIL" in ln or "not compared" in ln)[:600]
        return record


def failed_record(kind: str, line: str) -> dict[str, Any]:
    return {"verdict": kind, "line": line}


def run_case(case: PeerCase, policies: tuple[str, ...] = POLICIES,
             timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """Every policy on one case, each in its own child."""
    return {"operator": case.operator, **{p: isolated(run_policy, (case, p), timeout, failed_record) for p in policies}}
