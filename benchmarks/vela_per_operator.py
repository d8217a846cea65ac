"""Vela's cycles per operator type for TOSA files side by side (where one flow loses).

Runs Vela with `--verbose-performance` on each file (the flags Arm's
`EthosUCompileSpec` gives it for the target) and sums its per-layer CSV by
original operator: layers, cycles and the share of the network. The files are
the TOSA Vela was given, e.g. `model.tosa` beside a `codec-tosa compile
--target` .pte or what `benchmarks/ethos_u.py --tosa-dir` writes.

Usage::

    python benchmarks/vela_per_operator.py --target ethos-u55-128 stock.tosa ours.tosa
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Sequence


def per_operator(tosa: Path, flags: list[str]) -> dict[str, tuple[int, int]]:
    """{original operator: (layers, cycles)} from Vela's per-layer CSV."""
    from ethosu.vela.vela import main as vela_main

    with tempfile.TemporaryDirectory() as out:
        vela_main([*flags, "--verbose-performance", f"--output-dir={out}", str(tosa)])
        return per_operator_in(out, str(tosa))


def per_operator_in(out: str | Path, what: str = "Vela") -> dict[str, tuple[int, int]]:
    """`per_operator` of a Vela run already made with `--verbose-performance`
    and `--output-dir=out`."""
    found = sorted(Path(out).rglob("*per-layer.csv"))
    if not found:
        raise SystemExit(f"{what}: Vela wrote no per-layer CSV")
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    with found[0].open(newline="") as f:
        for row in csv.DictReader(f):
            t = totals[row["Original Operator"]]
            t[0] += 1
            t[1] += int(float(row["Op Cycles"]))
    return {k: (v[0], v[1]) for k, v in totals.items()}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, help="e.g. ethos-u55-128, ethos-u85-256")
    p.add_argument("tosa", nargs="+", type=Path)
    args = p.parse_args(argv)

    from codec_tosa.arm import adapter as arm_adapter

    flags = list(arm_adapter.ethos_u_compile_spec(args.target).compiler_flags)
    tables = [per_operator(t, flags) for t in args.tosa]
    ops = sorted({op for t in tables for op in t}, key=lambda op: -max(t.get(op, (0, 0))[1] for t in tables))
    head = ["operator"] + [f"{t.stem}: layers, cycles" for t in args.tosa]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in ops + ["total"]:
        cells = []
        for t in tables:
            layers, cycles = (sum(v[0] for v in t.values()), sum(v[1] for v in t.values())) if op == "total" \
                else t.get(op, (0, 0))
            cells.append(f"{layers}, {cycles}")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
