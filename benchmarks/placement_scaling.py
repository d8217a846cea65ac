"""Placement scaling: time and peak memory of the placement + traffic model on
synthetic DAGs of 10^3 to 10^6 operators.

Each size runs in a fresh subprocess so that peak RSS is its own. Timed: the
four placement steps and the traffic model (`place` with port labels off, then
`measure`); not timed: building the synthetic graph.

    .venv/bin/python benchmarks/placement_scaling.py [--sizes 1000,10000,100000,1000000] [--json PATH]
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import GraphBuilder, PortGraph
from codec_tosa.placement import COALESCE, place
from codec_tosa.planning.traffic import measure

SHAPE = (1, 16, 8, 8)
CONV, CAT, VIEW, PERMUTE, RELU, ADD = (
    "aten.convolution.default", "aten.cat.default", "aten.view.default",
    "aten.permute.default", "aten.relu.default", "aten.add.Tensor")


def synthetic(n_ops: int) -> PortGraph:
    """Repeating motifs: conv chains, fan-out, a 3-way cat with a channel shuffle,
    a binary cat tree of 4 leaves, and a residual add."""
    b = GraphBuilder()
    x = b.placeholder("x", SHAPE)
    w = b.constant("w", (16, 16, 1, 1))
    i = 0

    def op(target: str, *inputs: tuple[str, int]) -> int:
        nonlocal i
        i += 1
        return b.op(f"n{i}", target, list(inputs), SHAPE)[0]

    while i < n_ops:
        c1 = op(CONV, ("input", x), ("weight", w))
        c2 = op(CONV, ("input", c1), ("weight", w))  # chain
        c3 = op(CONV, ("input", c1), ("weight", w))  # fan-out of c1
        r = op(RELU, ("self", c2))
        cat = op(CAT, ("tensors", c2), ("tensors", c3), ("tensors", r))  # fan-in
        s = op(CONV, ("input", op(VIEW, ("self", op(PERMUTE, ("self", op(VIEW, ("self", cat))))))),
               ("weight", w))
        leaves = [op(CONV, ("input", s), ("weight", w)) for _ in range(4)]
        t1 = op(CAT, ("tensors", leaves[0]), ("tensors", leaves[1]))
        t2 = op(CAT, ("tensors", leaves[2]), ("tensors", leaves[3]))
        tree = op(CAT, ("tensors", t1), ("tensors", t2))
        x = op(ADD, ("self", op(CONV, ("input", tree), ("weight", w))), ("other", s))
    b.graph_output([x])
    return b.finish()


def run_one(n_ops: int) -> dict[str, float]:
    table = CommutationTable.default()
    graph = synthetic(n_ops)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gc.collect()
    t0 = time.perf_counter()
    result = place(graph, table, "W", COALESCE, labels=False)
    traffic = measure(graph, result.semantics, result.plan, per_op=False)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "operators": graph.num_ops,
        "ports": graph.num_in_ports + graph.num_values,
        "seconds": seconds,
        "us_per_op": seconds / graph.num_ops * 1e6,
        "peak_rss_mib": peak / 1024,
        "placement_rss_mib": (peak - base_rss) / 1024,
        "domains": len(result.plan.domains),
        "codecs": len(result.plan.codecs),
        "traffic_mib": traffic.traffic_bytes / 2**20,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000,1000000")
    ap.add_argument("--json", default="benchmarks/results/placement_scaling.json")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child process mode
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one)))
        return 0
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(n)], check=True,
                             capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    first = rows[0]["us_per_op"]
    print(f"{'operators':>10} {'seconds':>9} {'us/op':>7} {'vs first':>8} {'peak RSS MiB':>13} "
          f"{'domains':>9} {'codecs':>9}")
    for r in rows:
        print(f"{r['operators']:>10} {r['seconds']:>9.2f} {r['us_per_op']:>7.2f} "
              f"{r['us_per_op'] / first:>8.2f} {r['peak_rss_mib']:>13.0f} {r['domains']:>9} {r['codecs']:>9}")
    Path(args.json).write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
