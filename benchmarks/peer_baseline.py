"""Stock Arm verdicts on the peer suite (Arm's own operator tests, tests/peer).

For every case of `tests/peer/cases.py` this runs the two stock flows of
`tests/peer/stock.py` (TOSA-1.0+FP lowering; Arm's PT2E INT8 flow), each in a
forked child with a timeout, and writes `tests/peer/stock_baseline.json`:

    {"meta": {...versions, timeout, wall seconds...},
     "cases": {"test_add:Add:4d_randn": {"operator": "add", "fp": {...}, "int": {...},
                                         "seconds": 3.1, ...},
               "test_grid_sampler:<none>": {"operator": "grid_sampler", "skipped": "..."}}}

then prints a per-operator table (cases, stock FP delegated, stock INT8 delegated,
errors).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peer_baseline.py            # everything
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peer_baseline.py --only conv2d
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/peer_baseline.py --resume   # finish a cut-short run
    .venv/bin/python benchmarks/peer_baseline.py --summary                    # table of the existing JSON

`--only` runs a subset and merges it into the existing JSON (other entries are kept).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import re
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PEER = ROOT / "tests" / "peer"
sys.path.insert(0, str(PEER))

DEFAULT_OUT = PEER / "stock_baseline.json"
_CHECKPOINT_EVERY = 25  # cases between rewrites of the JSON during a run


def _load(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"meta": {}, "cases": {}}


def _save(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)  # never leave a half-written baseline behind


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("torch", "executorch", "torchao")}


def _verdict(rec: dict[str, Any]) -> str:
    if rec.get("delegated"):
        return "D" if rec.get("ok") else "d!"  # delegated, but to_executorch failed
    return "x" if rec.get("error") else "-"


def summarize(cases: dict[str, dict[str, Any]]) -> str:
    """Per-operator table: cases, stock FP delegated, stock INT8 delegated, and
    cases whose FP / INT8 flow raised, timed out or crashed."""
    rows: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for rec in cases.values():
        if "skipped" in rec:
            rows[rec["operator"]][5] += 1
            continue
        r = rows[rec["operator"]]
        r[0] += 1
        r[1] += bool(rec["fp"].get("delegated"))
        r[2] += bool(rec["int"].get("delegated"))
        r[3] += rec["fp"].get("error") is not None
        r[4] += rec["int"].get("error") is not None
    head = f"{'operator':24s} {'cases':>5s} {'FP del':>6s} {'INT8 del':>8s} {'FP err':>6s} {'INT8 err':>8s} {'skipped':>7s}"
    lines = [head, "-" * len(head)]
    total = [0] * 6
    for op in sorted(rows):
        r = rows[op]
        total = [a + b for a, b in zip(total, r)]
        lines.append(f"{op:24s} {r[0]:5d} {r[1]:6d} {r[2]:8d} {r[3]:6d} {r[4]:8d} {r[5]:7d}")
    lines.append("-" * len(head))
    lines.append(f"{'TOTAL':24s} {total[0]:5d} {total[1]:6d} {total[2]:8d} {total[3]:6d} {total[4]:8d} {total[5]:7d}")
    partial = [op for op in sorted(rows) if rows[op][0] and rows[op][2] < rows[op][0]]
    lines.append(f"\noperators where stock INT8 does not delegate every case ({len(partial)}): " + ", ".join(
        f"{op} {rows[op][2]}/{rows[op][0]}" for op in partial))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", metavar="PATTERN", help="regex searched in case ids; merges into the existing JSON")
    ap.add_argument("--jobs", type=int, choices=(1, 2), default=1, help="cases run at once (each flow is its own child)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per flow per case")
    ap.add_argument("--resume", action="store_true", help="keep entries already in the JSON, run only missing ids")
    ap.add_argument("--summary", action="store_true", help="only print the table of the existing JSON")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    if args.summary:
        print(summarize(_load(args.out)["cases"]))
        return 0

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # Export and quantization warn on every case; forked children inherit the filter.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    import stock
    from cases import collect_cases

    all_cases = collect_cases()
    selected = [c for c in all_cases if args.only is None or re.search(args.only, c.id)]
    partial_run = args.only is not None or args.resume
    data = _load(args.out) if partial_run else {"meta": {}, "cases": {}}
    results: dict[str, Any] = data["cases"]
    if not partial_run:
        results.clear()
    known = {c.id for c in all_cases}
    for stale in [k for k in results if k not in known]:  # ids Arm's tests no longer produce
        del results[stale]

    todo = []
    for c in selected:
        if c.skip is not None:
            results[c.id] = {"operator": c.operator, "file": c.file, "skipped": c.skip}
        elif not (args.resume and c.id in results and "fp" in results[c.id]):
            todo.append(c)
    print(f"{len(todo)} cases to run ({len(selected)} selected, {len(all_cases)} collected), jobs={args.jobs}", flush=True)

    stock.preload()  # import once here; forked children inherit it
    lock = threading.Lock()
    done = 0
    t0 = time.perf_counter()

    def one(case: Any) -> None:
        nonlocal done
        rec = stock.run_case(case, timeout=args.timeout)
        entry = {"operator": case.operator, "file": case.file, "fp": rec["fp"], "int": rec["int"], "seconds": rec["seconds"],
                 "arm_flows": list(case.flows), "arm_xfail": case.arm_xfail, "input_dtypes": list(case.input_dtypes)}
        with lock:
            results[case.id] = entry
            done += 1
            print(f"[{done}/{len(todo)} {time.perf_counter() - t0:7.0f}s] FP {_verdict(rec['fp']):2s} INT {_verdict(rec['int']):2s} "
                  f"{rec['seconds']:6.1f}s {case.id}", flush=True)
            if done % _CHECKPOINT_EVERY == 0:
                _save(args.out, data)

    if args.jobs == 1:
        for c in todo:
            one(c)
    else:
        with ThreadPoolExecutor(args.jobs) as pool:  # threads only wait on forked children
            list(pool.map(one, todo))

    wall = round(time.perf_counter() - t0, 1)
    meta = data.setdefault("meta", {})
    meta.update({
        "versions": _versions(),
        "timeout_s": args.timeout,
        "jobs": args.jobs,
        "updated": datetime.datetime.now().isoformat(timespec="seconds"),
        "last_run": {"only": args.only, "resume": args.resume, "cases_run": len(todo), "wall_seconds": wall},
    })
    if not partial_run:
        meta["full_run_wall_seconds"] = wall
    # Cases in collection order, so diffs between baselines stay readable.
    order = {c.id: i for i, c in enumerate(all_cases)}
    data["cases"] = dict(sorted(results.items(), key=lambda kv: order.get(kv[0], len(order))))
    _save(args.out, data)
    print(f"\nwrote {args.out} ({len(data['cases'])} entries) in {wall:.0f}s\n")
    print(summarize(data["cases"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
