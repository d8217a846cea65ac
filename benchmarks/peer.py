"""Ours against stock on the peer suite (Arm's own operator tests, tests/peer).

For a sample of the cases of `tests/peer/cases.py` (``--per-operator N`` cases
of every operator file, drawn with ``--seed``; ``--all`` for every case) this
runs `codec-tosa compile` + `validate` at policies W and I (`tests/peer/ours.py`,
each in a forked child with a timeout) and sets the verdicts beside the stock
ones already recorded in `tests/peer/stock_baseline.json`
(`benchmarks/peer_baseline.py`). It writes `benchmarks/results/peer.json` and prints:

* the goals of issue 22: of the cases stock FP delegates, the share that PASS
  at W; of the cases stock INT8 delegates, the share that PASS at I;
* per operator: cases run, stock FP / INT8 delegated, our W and I verdicts;
* every case that is neither PASS nor a one-line refusal, with its line.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peer.py                  # 1 case per operator
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peer.py --per-operator 3
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peer.py --all            # make peer (hours)
    .venv/bin/python benchmarks/peer.py --summary                          # table of the JSON
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import random
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / "tests" / "peer"
sys.path.insert(0, str(PEER))

BASELINE = PEER / "stock_baseline.json"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "peer.json"
PASS = "PASS"
REFUSED = "refused"  # one of our one-line refusals
_CHECKPOINT_EVERY = 10


def sample_cases(cases: list[Any], per_operator: int | None, seed: int, only: str | None) -> list[Any]:
    """Runnable cases, `per_operator` of each operator file (None: all), seeded."""
    runnable = [c for c in cases if c.skip is None and (only is None or re.search(only, c.id))]
    if per_operator is None:
        return runnable
    by_op: dict[str, list[Any]] = collections.defaultdict(list)
    for c in runnable:
        by_op[c.operator].append(c)
    rng = random.Random(seed)
    picked = []
    for op in sorted(by_op):
        group = by_op[op]
        picked.extend(rng.sample(group, min(per_operator, len(group))))
    return picked


def goals(results: dict[str, Any], stock: dict[str, Any]) -> dict[str, Any]:
    """The issue's two shares, over the cases run: stock FP delegated -> PASS at W,
    stock INT8 delegated -> PASS at I."""
    out: dict[str, Any] = {}
    for policy, flow in (("W", "fp"), ("I", "int")):
        eligible = [i for i in results if stock.get(i, {}).get(flow, {}).get("delegated")]
        passed = [i for i in eligible if results[i][policy].get("verdict") == PASS]
        out[policy] = {"stock_delegated": len(eligible), "pass": len(passed),
                       "share": round(len(passed) / len(eligible), 4) if eligible else None}
    return out


def _per_operator(results: dict[str, Any], stock: dict[str, Any],
                  verdict: Callable[[str], str]) -> dict[str, collections.Counter[str]]:
    """Per operator: cases, stock's delegated counts (fp, int) and `P:verdict(v)` counts."""
    rows: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for i, rec in results.items():
        r = rows[rec["operator"]]
        r["cases"] += 1
        r["fp"] += bool(stock.get(i, {}).get("fp", {}).get("delegated"))
        r["int"] += bool(stock.get(i, {}).get("int", {}).get("delegated"))
        for p in ("W", "I"):
            r[f"{p}:{verdict(rec[p].get('verdict'))}"] += 1
    return rows


def summarize(results: dict[str, Any], stock: dict[str, Any]) -> str:
    rows = _per_operator(results, stock, str)
    head = (f"{'operator':22s} {'cases':>5s} {'FP del':>6s} {'W PASS':>6s} {'W ref':>5s} {'W other':>7s} "
            f"{'INT del':>7s} {'I PASS':>6s} {'I ref':>5s} {'I other':>7s}")
    lines = [head, "-" * len(head)]
    total: collections.Counter[str] = collections.Counter()
    for op in sorted(rows):
        r = rows[op]
        total.update(r)
        lines.append(_row(op, r))
    lines += ["-" * len(head), _row("TOTAL", total)]
    g = goals(results, stock)
    for p, flow in (("W", "FP"), ("I", "INT8")):
        s = g[p]
        share = f"{100 * s['share']:.1f}%" if s["share"] is not None else "-"
        lines.append(f"{p}: {s['pass']}/{s['stock_delegated']} of the cases stock {flow} delegates PASS ({share}; goal 95%)")
    others = [(i, p, rec[p]) for i, rec in results.items() for p in ("W", "I")
              if rec[p].get("verdict") not in (PASS, REFUSED)]
    if others:
        lines.append(f"\nneither PASS nor a refusal ({len(others)}):")
        lines += [f"  {p} {i}: {r.get('verdict')}: {r.get('line', '')[:200]}" for i, p, r in others]
    return "\n".join(lines)


def markdown(results: dict[str, Any], stock: dict[str, Any]) -> str:
    """The per-operator table of docs/results/peer.md: refusals split into ours and a library's."""
    rows = _per_operator(results, stock, lambda v: v if v in (PASS, REFUSED, "library") else "other")
    lines = ["| operator | cases | stock FP delegates | W PASS | W refused (ours / library) | W other "
             "| stock INT8 delegates | I PASS | I refused (ours / library) | I other |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for op in sorted(rows):
        r = rows[op]
        lines.append(f"| {op} | {r['cases']} | {r['fp']} | {r['W:PASS']} | {r['W:refused']} / {r['W:library']} "
                     f"| {r['W:other']} | {r['int']} | {r['I:PASS']} | {r['I:refused']} / {r['I:library']} "
                     f"| {r['I:other']} |")
    return "\n".join(lines)


def _row(name: str, r: collections.Counter[str]) -> str:
    def other(p: str) -> int:
        return sum(v for k, v in r.items() if k.startswith(f"{p}:") and k not in (f"{p}:{PASS}", f"{p}:{REFUSED}"))

    return (f"{name:22s} {r['cases']:5d} {r['fp']:6d} {r['W:PASS']:6d} {r['W:refused']:5d} {other('W'):7d} "
            f"{r['int']:7d} {r['I:PASS']:6d} {r['I:refused']:5d} {other('I'):7d}")


def _commit() -> str:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent)
    return done.stdout.strip() or "unknown"


def _save(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)  # never a half-written JSON


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-operator", type=int, default=1, help="cases per operator file (default 1)")
    ap.add_argument("--all", action="store_true", help="every runnable case (hours)")
    ap.add_argument("--seed", type=int, default=0, help="which cases the sample draws")
    ap.add_argument("--only", metavar="PATTERN", help="regex searched in case ids")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per policy per case")
    ap.add_argument("--resume", action="store_true", help="keep the JSON's results, run only missing ids")
    ap.add_argument("--rerun", action="store_true",
                    help="keep the JSON's results but run again every case not PASS or refused at W and I")
    ap.add_argument("--policies", nargs="+", choices=("W", "I"), default=["W", "I"],
                    help="run these policies only, keeping the JSON's results for the other")
    ap.add_argument("--summary", action="store_true", help="only print the table of the existing JSON")
    ap.add_argument("--markdown", action="store_true", help="with --summary: the per-operator table as Markdown")
    ap.add_argument("--json", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    stock = json.loads(BASELINE.read_text())["cases"]
    partial = tuple(args.policies) != ("W", "I")
    keep = args.summary or args.resume or args.rerun or partial
    data: dict[str, Any] = (json.loads(args.json.read_text()) if keep and args.json.exists()
                            else {"meta": {}, "cases": {}})
    if args.summary:
        print(markdown(data["cases"], stock) if args.markdown else summarize(data["cases"], stock))
        return 0

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore", category=FutureWarning)  # forked children inherit the filter
    warnings.filterwarnings("ignore", category=UserWarning)
    import ours
    from cases import collect_cases

    picked = sample_cases(collect_cases(), None if args.all else args.per_operator, args.seed, args.only)
    results: dict[str, Any] = data["cases"]
    if args.rerun:
        for i in [i for i, r in results.items() if any(r[p].get("verdict") not in (PASS, REFUSED) for p in ("W", "I"))]:
            del results[i]
    todo = [c for c in picked if partial or c.id not in results]
    print(f"{len(todo)} cases to run ({len(picked)} picked)", flush=True)
    t0 = time.perf_counter()
    for n, case in enumerate(todo, 1):
        rec = {**results.get(case.id, {}), **ours.run_case(case, tuple(args.policies), timeout=args.timeout)}
        rec.update({p: rec.get(p, {"verdict": "not run"}) for p in ("W", "I")})
        results[case.id] = rec
        print(f"[{n}/{len(todo)} {time.perf_counter() - t0:6.0f}s] W {rec['W'].get('verdict'):10s} "
              f"I {rec['I'].get('verdict'):10s} {case.id}", flush=True)
        if n % _CHECKPOINT_EVERY == 0:
            _save(args.json, data)
    command = "python benchmarks/peer.py " + " ".join(sys.argv[1:])
    runs = [*data.get("meta", {}).get("runs", []), {"commit": _commit(), "command": command, "cases": len(todo),
                                                     "wall_seconds": round(time.perf_counter() - t0)}]
    data["meta"] = {"command": command, "runs": runs,
                    "per_operator": None if args.all else args.per_operator, "seed": args.seed,
                    "updated": datetime.datetime.now().isoformat(timespec="seconds"),
                    "wall_seconds": round(time.perf_counter() - t0, 1), "goals": goals(results, stock)}
    _save(args.json, data)
    print(f"\nwrote {args.json} ({len(results)} cases)\n")
    print(summarize(results, stock))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
