"""The paper's Table 2 and Table 4 read back from built artefacts (issue 51, item 4).

For each of the paper's four models (ShuffleNetV2, U-Net, SigLIP, SmolLM2) and each
cell of its traffic tables (Table 2: policies Z, Y, X, W at nonlocal+coalesce;
Table 4: W at local, nonlocal, nonlocal+coalesce) this builds the artefact as
`CodecTosaPartitioner` lowers it (`tools.compiler.lower_program`, the example and 3
seeded random inputs as calibration, no reference stage: only the TOSA is read) and
reads its traffic back from the delegates' TOSA with `tosa_stats`, unfused and fused,
as ``codec-tosa report`` does. Beside it, for the same cell:

* ``published``: the paper's figure;
* ``paper`` and ``ours``: the modeled traffic of `codec-tosa tables` (the exported
  graph, SDPA / SiLU / RMSNorm / RoPE whole) under its two accountings;
* ``planned``: the traffic model of the graph the partitioner lowered (the edge
  graph: SDPA, SiLU, norms decomposed), what report.json calls ``modeled``.

Each cell is built in a child process of its own (this file with ``--child``), so a
failure or a timeout is a row with a one-line error and memory does not pile up.

The transformers are stacks of identical layers, so every figure is ``a + b * L`` in
the layer count L. They are built at one and two layers and extrapolated to the
paper's depth (SigLIP 12, SmolLM2 30); building them whole would take this 2-core
machine hours per table. Two checks hold the extrapolation to account: the modeled
figures are also computed at full depth (a child that only analyses) and must equal
their own extrapolation, and ``--check-depth 3`` also builds every transformer cell
at three layers and reports the artefact's deviation from the line.

Per model at W (nonlocal+coalesce) and Z the JSON also keeps the artefact's traffic
per TOSA operator (unfused and fused) and each model's traffic per ATen target, so a
difference can be put on the operators that carry it (docs/results/paper_tables.md).

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/paper_artefacts.py [--models shufflenet_v2,unet,siglip,smollm2]
        [--check-depth 3] [--timeout 1800] [--json benchmarks/results/paper_artefacts.json]
    python benchmarks/paper_artefacts.py --markdown     # the JSON's tables as Markdown
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

BENCHMARKS = Path(__file__).resolve().parent
import memory  # noqa: E402  (a script's folder is first on sys.path: the sibling benchmark: model builders, VmHWM, child environment)

DEFAULT_JSON = BENCHMARKS / "results" / "paper_artefacts.json"
DEFAULT_MODELS = ("shufflenet_v2", "unet", "siglip", "smollm2")
COALESCE = "nonlocal+coalesce"
# (policy, placement) of every cell of Tables 2 and 4, in the tables' order
CELLS: tuple[tuple[str, str], ...] = (("Z", COALESCE), ("Y", COALESCE), ("X", COALESCE),
                                      ("W", "local"), ("W", "nonlocal"), ("W", COALESCE))
TABLE2 = (("Z", COALESCE), ("Y", COALESCE), ("X", COALESCE), ("W", COALESCE))
TABLE4 = (("W", "local"), ("W", "nonlocal"), ("W", COALESCE))
# the paper's depth of each layered model (built at 1 and 2 layers and extrapolated)
DEPTH = {"siglip": 12, "smollm2": 30}
CALIBRATION = 4  # the example and 3 seeded random inputs, as compile calibrates
BREAKDOWN_CELLS = (("W", COALESCE), ("Z", COALESCE))  # cells whose per-operator traffic is kept
MIB = 2**20


def cell_name(policy: str, placement: str) -> str:
    return policy if placement == COALESCE else f"{policy} {placement}"


# ---------------------------------------------------------------- one cell, in a child


def _by_target(rows: Any) -> dict[str, int]:
    """Traffic bytes summed per ATen target (codec kinds included)."""
    sums: Counter[str] = Counter()
    for r in rows:
        sums[str(r.target)] += r.total
    return dict(sums.most_common())


def modeled(module: Any, example: tuple, cells: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """`codec-tosa tables`' figures of `module` at each cell, under both accountings."""
    from codec_tosa.planning.accounting import ACCOUNTINGS, account
    from codec_tosa.planning.analysis import analyze
    from codec_tosa.tools.tables.collect import export_for_analysis, port_graph_of

    ep, _ = export_for_analysis(module, example)
    graph = port_graph_of(ep)
    out: dict[str, Any] = {}
    for policy, placement in cells:
        figures: dict[str, Any] = {}
        for accounting in ("paper", "ours"):
            a = account(analyze(graph, policy=policy, placement=placement), ACCOUNTINGS[accounting])
            figures[f"{accounting}_traffic_bytes"] = a.traffic.traffic_bytes
            figures[f"{accounting}_codec_items"] = a.traffic.codec_items
            if (policy, placement) in BREAKDOWN_CELLS:
                figures[f"{accounting}_by_target"] = _by_target(a.per_op)
        out[cell_name(policy, placement)] = figures
    return out


def artefact(program: Any, calibration: list, policy: str, placement: str) -> dict[str, Any]:
    """Lower at (policy, placement) and read the delegates' TOSA back."""
    from transformer_flows import delegate_tosa

    from codec_tosa.planning.traffic import measure
    from codec_tosa.serialization.tosa_stats import tosa_stats
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import lower_program
    from codec_tosa.tools.report import sum_stats

    t = time.perf_counter()
    lowered = lower_program(program, CodecSpec(policy=policy, placement=placement), calibration)
    row: dict[str, Any] = {"lowering_s": time.perf_counter() - t}
    tosa = delegate_tosa(lowered.pte)
    s = sum_stats([tosa_stats(b) for b in tosa])
    row.update({"delegates": len(tosa), "tosa_ops": s.operators - s.const_ops - s.const_shape_ops,
                "artefact_traffic_bytes": s.traffic_bytes, "artefact_fused_bytes": s.fused_traffic_bytes,
                "weight_bytes": s.constant_bytes})
    per_operator = (policy, placement) in BREAKDOWN_CELLS
    planned = lowered.planned
    if planned is not None:  # `planned.traffic()`, with its per-operator rows
        tr = measure(planned.graph, planned.placement.semantics, planned.placement.plan, planned.spec.fused_transcode)
        row["planned_traffic_bytes"] = tr.traffic_bytes
        row["planned_codec_items"] = tr.codec_items
        if per_operator:
            row["planned_by_target"] = _by_target(tr.per_op)
    if per_operator:
        row["artefact_by_op"] = dict(Counter(s.traffic_by_op).most_common())
        row["artefact_fused_by_op"] = dict(Counter(s.fused_traffic_by_op).most_common())
    return row


def child(spec: str, cell: str) -> dict[str, Any]:
    """Build `spec`; ``cell`` is ``POLICY/PLACEMENT``, or ``modeled`` for every cell's
    modeled figures only (no lowering: cheap at full depth)."""
    import torch

    from codec_tosa.planning.calibration import random_calibration
    from codec_tosa.tools.loading import export_module
    from codec_tosa.tools.model_libs import prepare

    torch.set_num_threads(1)
    prepare()
    torch.manual_seed(0)
    built, example = memory._builder(spec)()
    loaded = export_module(spec, built.eval(), example)
    module, example = loaded.module, tuple(loaded.inputs)
    if cell == "modeled":
        return {"modeled": modeled(module, example, CELLS)}
    policy, _, placement = cell.partition("/")
    calibration = [example] + random_calibration(example, CALIBRATION - 1)
    row = artefact(loaded.program, calibration, policy, placement)
    row.update(modeled(module, example, [(policy, placement)])[cell_name(policy, placement)])
    row["peak_rss_bytes"] = memory._status()["VmHWM"]
    return row


def run_child(spec: str, cell: str, timeout: float) -> dict[str, Any]:
    """`child` in a fresh interpreter, with a time limit (its process group killed after)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--child", spec, cell, "--out", out.name]
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=memory._env(), start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            return {"error": f"timeout after {timeout:.0f} s"}
        text = Path(out.name).read_text()
        if proc.returncode != 0 or not text:
            last = (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            return {"error": f"child died: {last}"[:300]}
        row = json.loads(text)
        row["child_s"] = time.perf_counter() - started
        return row


# ---------------------------------------------------------------- extrapolation in depth


def _line(one: Any, two: Any, depth: int) -> Any:
    """``one + (depth - 1) * (two - one)`` on every number (dicts key by key)."""
    if isinstance(one, dict) and isinstance(two, dict):
        return {k: _line(one.get(k, 0), two.get(k, 0), depth) for k in dict.fromkeys([*one, *two])}
    if isinstance(one, (int, float)) and isinstance(two, (int, float)):
        return one + (depth - 1) * (two - one)
    return one


EXTENSIVE = ("artefact_traffic_bytes", "artefact_fused_bytes", "planned_traffic_bytes", "planned_codec_items",
             "paper_traffic_bytes", "ours_traffic_bytes", "paper_codec_items", "ours_codec_items", "tosa_ops",
             "weight_bytes", "artefact_by_op", "artefact_fused_by_op", "planned_by_target", "paper_by_target",
             "ours_by_target")


def extrapolate(one: dict[str, Any], two: dict[str, Any], depth: int) -> dict[str, Any]:
    """A cell at `depth` layers from its cells at one and two (errors carried over)."""
    if "error" in one or "error" in two:
        return {"error": one.get("error") or two.get("error")}
    return {k: _line(one[k], two.get(k, one[k]), depth) for k in EXTENSIVE if k in one}


def model_cells(model: str, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """Every cell of `model` (built whole, or at 1 and 2 layers and extrapolated)."""
    out: dict[str, Any] = {"model": model, "cells": {}}
    depth = DEPTH.get(model)
    specs = [model] if depth is None else [f"{model}@1", f"{model}@2"] + (
        [f"{model}@{args.check_depth}"] if args.check_depth else [])
    built: dict[str, dict[str, Any]] = {s: {} for s in specs}
    for policy, placement in CELLS:
        name = cell_name(policy, placement)
        for s in specs:
            built[s][name] = run_child(s, f"{policy}/{placement}", args.timeout)
            r = built[s][name]
            log(f"{s} {name}: " + (r["error"] if "error" in r else
                f"artefact {r['artefact_traffic_bytes'] / MIB:.1f} / fused {r['artefact_fused_bytes'] / MIB:.1f} MiB, "
                f"modeled paper {r['paper_traffic_bytes'] / MIB:.1f}, lowering {r['lowering_s']:.0f} s"))
        out["cells"][name] = (built[model][name] if depth is None
                              else extrapolate(built[specs[0]][name], built[specs[1]][name], depth))
    if depth is not None:
        out["depth"] = depth
        out["built"] = built
        # the line's check on the model: the modeled figures at full depth, computed directly
        full = run_child(model, "modeled", args.timeout)
        out["modeled_full_depth"] = full.get("modeled", full)
        if args.check_depth:
            check = f"{model}@{args.check_depth}"
            out["check_depth"] = {name: _deviation(extrapolate(built[specs[0]][name], built[specs[1]][name],
                                                               args.check_depth), built[check][name])
                                  for name in out["cells"]}
    return out


def _deviation(line: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """Each extensive number's difference, built minus extrapolated (0: on the line)."""
    if "error" in line or "error" in got:
        return {"error": line.get("error") or got.get("error")}
    return {k: got[k] - line[k] for k in EXTENSIVE if isinstance(line.get(k), (int, float)) and k in got}


def modeled_check(result: dict[str, Any]) -> dict[str, float]:
    """Largest |extrapolated - full depth| of the modeled figures, per accounting (bytes)."""
    full = result.get("modeled_full_depth", {})
    worst: dict[str, float] = {}
    for name, cell in result["cells"].items():
        for key in ("paper_traffic_bytes", "ours_traffic_bytes"):
            if key in cell and key in full.get(name, {}):
                worst[key] = max(worst.get(key, 0.0), abs(cell[key] - full[name][key]))
    return worst


# ---------------------------------------------------------------- tables


def _published(model: str, policy: str, placement: str) -> float | None:
    from codec_tosa.tools.tables.published import PUBLISHED_PLACEMENT, PUBLISHED_TRAFFIC

    if placement == COALESCE and model in PUBLISHED_TRAFFIC:
        return PUBLISHED_TRAFFIC[model]["ZYXW".index(policy)]
    if policy == "W" and model in PUBLISHED_PLACEMENT:
        return PUBLISHED_PLACEMENT[model][("local", "nonlocal", COALESCE).index(placement)]
    return None


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / MIB:,.1f}"


HEADER = ["model", "cell", "published", "modeled paper", "modeled ours", "planned (edge graph)",
          "artefact unfused", "artefact fused", "fused / published", "TOSA ops"]


def table(results: list[dict[str, Any]], cells: Sequence[tuple[str, str]]) -> str:
    from codec_tosa.tools.tables.collect import display_name

    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for result in results:
        for policy, placement in cells:
            name = cell_name(policy, placement)
            c = result["cells"].get(name, {"error": "not built"})
            pub = _published(result["model"], policy, placement)
            label = display_name(result["model"]) + (f" (x{result['depth']} from 1, 2)" if "depth" in result else "")
            if "error" in c:
                lines.append(f"| {label} | {name} | {pub} | error: {c['error']} |" + " |" * (len(HEADER) - 4))
                continue
            ratio = f"{c['artefact_fused_bytes'] / MIB / pub:.2f}" if pub else "-"
            lines.append("| " + " | ".join([
                label, name, "-" if pub is None else f"{pub:,.1f}", _mib(c.get("paper_traffic_bytes")),
                _mib(c.get("ours_traffic_bytes")), _mib(c.get("planned_traffic_bytes")),
                _mib(c["artefact_traffic_bytes"]), _mib(c["artefact_fused_bytes"]), ratio,
                f"{c['tosa_ops']:,.0f}"]) + " |")
    return "\n".join(lines)


def breakdown(result: dict[str, Any], name: str = "W", top: int = 8) -> str:
    """The artefact's traffic per TOSA operator beside the models' per ATen target."""
    c = result["cells"].get(name, {})
    if "error" in c or "artefact_by_op" not in c:
        return ""
    columns = [("artefact unfused, per TOSA op", c["artefact_by_op"]),
               ("artefact fused, per group's first op", c["artefact_fused_by_op"]),
               ("planned, per ATen target", c.get("planned_by_target", {})),
               ("modeled paper, per ATen target", c.get("paper_by_target", {}))]
    tops = [sorted(d.items(), key=lambda kv: -kv[1])[:top] for _, d in columns]
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for i in range(top):
        lines.append("| " + " | ".join(f"{t[i][0]} {t[i][1] / MIB:,.1f}" if i < len(t) else "" for t in tops) + " |")
    return "\n".join(lines)


def markdown(data: dict[str, Any]) -> str:
    results = data["models"]
    parts = ["Table 2, traffic (MiB) per policy (nonlocal+coalesce):", "", table(results, TABLE2), "",
             "Table 4, traffic (MiB) at W per placement:", "", table(results, TABLE4)]
    for r in results:
        if "modeled_full_depth" in r:
            worst = modeled_check(r)
            parts += ["", f"{r['model']}: modeled figures extrapolated from 1 and 2 layers vs computed at "
                      f"{r['depth']} layers, largest difference: "
                      + ", ".join(f"{k.split('_')[0]} {v:,.0f} bytes" for k, v in worst.items())]
        if "check_depth" in r:
            dev = [abs(d.get("artefact_fused_bytes", 0)) for d in r["check_depth"].values() if "error" not in d]
            parts += [f"{r['model']}: artefact fused traffic built at 3 layers minus its line, largest: "
                      f"{max(dev, default=0):,.0f} bytes"]
    for r in results:
        text = breakdown(r)
        if text:
            parts += ["", f"{r['model']} at W, traffic (MiB) per operator:", "", text]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--check-depth", type=int, default=0,
                   help="also build each transformer cell at this many layers and report its distance from the line")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per cell")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--markdown", action="store_true", help="only print the JSON's tables as Markdown")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.json.read_text())))
        return 0
    if args.child:
        Path(args.out).write_text(json.dumps(child(*args.child), default=float))
        return 0
    if args.check_depth and args.check_depth < 3:
        p.error("--check-depth: at least 3 (1 and 2 are the line's own points)")
    command = shlex.join(["python", "benchmarks/paper_artefacts.py", *argv])
    data: dict[str, Any] = {"command": command, "models": []}
    for model in [m for m in args.models.split(",") if m]:
        data["models"].append(model_cells(model, args, lambda s: print(s, file=sys.stderr, flush=True)))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1, default=float))  # after every model
    print(markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
