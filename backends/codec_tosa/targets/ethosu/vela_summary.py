"""Vela's own per-inference summary, read from the output directory it wrote."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence


def read_vela_summary(directory: str | Path) -> dict[str, Any]:
    """All columns of Vela's summary CSV (``*_summary_*.csv``), numbers as numbers."""
    found = sorted(Path(directory).rglob("*summary*.csv"))
    if not found:
        return {}
    with found[0].open(newline="") as f:
        row = next(csv.DictReader(f), {})
    return {k.strip(): _number(v) for k, v in row.items()}


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text.strip()


def vela_operator_counts(log: str) -> dict[str, int]:
    """``{"npu_ops": N, "cpu_ops": M}`` from Vela's printed summary
    ("NPU operators = N (...)", "CPU operators = M (...)"); {} if it printed none."""
    counts: dict[str, int] = {}
    for line in log.splitlines():
        for label, key in (("NPU operators", "npu_ops"), ("CPU operators", "cpu_ops")):
            if line.strip().startswith(label) and "=" in line:
                value = line.split("=", 1)[1].split()[0]
                if value.isdigit():
                    counts[key] = int(value)
    return counts


def vela_report(runs: list[dict[str, Any]], program_cpu_ops: Sequence[str] = ()) -> dict[str, Any]:
    """report.json's ``vela`` object, summed over Ethos-U delegates, with each delegate's
    own figures under ``per_delegate``. `cpu_ops` is Vela's own count of the operators
    it left to the CPU inside the delegates (what ``vela --show-cpu-operations`` says);
    `program_cpu_ops` names the program's operators outside them (the input quantize,
    the output dequantize)."""
    per_delegate = []
    for r in runs:
        entry = {k: v for k, v in _figures([r]).items() if k not in ("delegates", "program_cpu_ops")}
        if r.get("compile_flags") is not None:  # the Vela configuration the delegate was compiled with
            entry["compile_flags"] = flags_shown(r["compile_flags"])
        per_delegate.append(entry)
    return {**_figures(runs, program_cpu_ops), "per_delegate": per_delegate}


def flags_shown(flags: str | Sequence[str]) -> str:
    """Vela's flags as one line, with the path of Arm's vela.ini shortened to its name and
    the per-run output directory and input left out."""
    words = flags.split() if isinstance(flags, str) else list(flags)
    kept = [f"--config={Path(w.split('=', 1)[1]).name}" if w.startswith("--config=") else w for w in words
            if not w.startswith("--output-dir=") and not w.endswith(".tosa")]
    return " ".join(kept)


def _figures(runs: list[dict[str, Any]], program_cpu_ops: Sequence[str] = ()) -> dict[str, Any]:
    def total(key: str) -> float:
        return sum(float(r["summary"].get(key, 0) or 0) for r in runs)

    return {
        "delegates": len(runs),
        "cycles_total": int(total("cycles_total")),
        "cycles_npu": int(total("cycles_npu")),
        # Vela reports SRAM use in KiB; the peak over delegates (they run one after another)
        "sram_bytes": int(max((float(r["summary"].get("sram_memory_used", 0) or 0) for r in runs),
                              default=0.0) * 1024),
        "sram_traffic_bytes": int(total("sram_total_bytes")),
        "off_chip_bytes": int(total("dram_total_bytes") + total("off_chip_flash_total_bytes")),
        # the weights (and biases) as Vela encoded them for the NPU: INT4 weights halve them
        "encoded_weight_bytes": int(total("total_npu_encoded_weights")),
        "npu_ops": sum(r["operators"].get("npu_ops", 0) for r in runs),
        "cpu_ops": sum(r["operators"].get("cpu_ops", 0) for r in runs),
        "program_cpu_ops": sorted(program_cpu_ops),
        "accelerator": runs[0]["summary"].get("accelerator_configuration") if runs else None,
        "system_config": runs[0]["summary"].get("system_config") if runs else None,
        "memory_mode": runs[0]["summary"].get("memory_mode") if runs else None,
    }
