"""Summarise a long fuzz run (issue 6): what the compiled examples covered.

    make fuzz                                   # writes fuzz-results.jsonl, then runs this
    .venv/bin/python benchmarks/fuzz_summary.py fuzz-results.jsonl --json benchmarks/results/fuzz.json

`tests/test_fuzz.py` appends one JSON line per compiled example that passed
(CODEC_TOSA_FUZZ_RECORD); a failing example stops its policy/placement, so the
per-combination counts show how far each got. Prints a Markdown table per
policy/placement and writes the same figures as JSON.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def summarise(lines: list[dict[str, Any]]) -> dict[str, Any]:
    combos: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        combos[f"{line['policy']}/{line['placement']}"].append(line)
    rows = {}
    for name, examples in sorted(combos.items()):
        rows[name] = {
            "examples": len(examples),
            "delegated": sum(e["delegates"] > 0 for e in examples),
            "several_delegates": sum(e["delegates"] > 1 for e in examples),
            "with_cpu_operators": sum(bool(e["cpu_operators"]) for e in examples),
            "reference_model_ran": sum(e["reference_model_ran"] for e in examples),
            "outputs_compared_on_reference_model": sum(
                e["outputs_compared_on_reference_model"] for e in examples),
            "worst_fraction_of_tolerance": max(e["max_fraction_of_tolerance"] for e in examples),
            # validate's verdict (older records have none) and the worst |out - simulation| in steps
            "incomplete": sum(e.get("verdict") == "INCOMPLETE" for e in examples),
            "worst_steps": max(e.get("max_steps", 0.0) for e in examples),
        }
    kinds = Counter(k for line in lines for k in line["steps"])
    cpu_ops = Counter(op for line in lines for op in line["cpu_operators"])
    return {"examples": len(lines), "combinations": rows,
            "operators_in_recipes": dict(sorted(kinds.items())),
            "cpu_operators_seen": dict(sorted(cpu_ops.items()))}


def markdown(summary: dict[str, Any]) -> str:
    head = ("| policy/placement | examples | delegated | >1 delegate | CPU ops | reference model ran "
            "| outputs compared on it | worst deviation / tolerance | INCOMPLETE | worst steps |")
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in summary["combinations"].items():
        out.append(f"| {name} | {r['examples']} | {r['delegated']} | {r['several_delegates']} | "
                   f"{r['with_cpu_operators']} | {r['reference_model_ran']} | "
                   f"{r['outputs_compared_on_reference_model']} | {r['worst_fraction_of_tolerance']:.2g} | "
                   f"{r['incomplete']} | {r['worst_steps']:.2g} |")
    out.append(f"\n{summary['examples']} compiled examples recorded (only passing ones are). "
               "Operators in the recipes: "
               + ", ".join(f"{k} {v}" for k, v in summary["operators_in_recipes"].items()) + ".")
    if summary["cpu_operators_seen"]:
        out.append("CPU operators seen: " + ", ".join(
            f"{k} ({v})" for k, v in summary["cpu_operators_seen"].items()) + ".")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("record", type=Path, help="the JSON-lines file test_fuzz.py wrote")
    ap.add_argument("--json", type=Path, help="also write the summary here")
    args = ap.parse_args(argv)
    try:
        lines = [json.loads(t) for t in args.record.read_text().splitlines() if t.strip()]
    except (OSError, json.JSONDecodeError) as e:
        ap.error(f"{args.record}: {e}")
    if not lines:
        ap.error(f"{args.record}: no examples recorded")
    summary = summarise(lines)
    print(markdown(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
