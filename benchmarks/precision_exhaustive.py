"""Every width assignment of a model's int16 groups, against what the search chose
(issue 25; docs/DESIGN.md, "Precision per domain").

For a model with few groups, every subset of its groups at INT16 (the rest INT8):
Vela's cycles (the program lowered with Arm's `EthosUPartitioner`, as
`codec_tosa.targets.ethosu.vela_cost` prices it), and the SQNR against FP32 eager of the converted
PT2E module (its quantize/dequantize arithmetic, which the artefact equals to within
rounding) on held-out inputs the search never saw. The frontier of that table is the best any
search over these groups can do; the search's own choices at the budgets of
`benchmarks/precision.py` are marked on it. Stock a16w8's SQNR on the same held-out
inputs is read from `benchmarks/results/precision_vela.json` when present.

Usage::

    python benchmarks/precision_exhaustive.py --model resnet8 --target ethos-u85-256 [--json F]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import precision  # noqa: E402  (the same models, calibration and held-out inputs)

DEFAULT_JSON = HERE / "results" / "precision_exhaustive.json"
MAX_GROUPS = 6  # 64 lowerings


def run(model: str, target: str, budgets: Sequence[float]) -> dict[str, Any]:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from codec_tosa import CodecQuantizer, CodecSpec
    from codec_tosa.targets.ethosu.vela_cost import VelaCycles

    module, example, calib, tests, _ = precision.load(model)
    reference = precision._eager(module, tests)
    quantizer = CodecQuantizer(CodecSpec(policy="I", target=target, precision="auto", budget=0.0))
    with torch.no_grad():
        prepared = prepare_pt2e(torch.export.export(module, example).module(check_guards=False), quantizer)
        for batch in calib:
            prepared(*batch)
    groups = quantizer.int16_groups.groups
    if len(groups) > MAX_GROUPS:
        raise SystemExit(f"{model}: {len(groups)} groups, more than {MAX_GROUPS} to enumerate")
    n = len(quantizer.precisions)
    cycles = VelaCycles(quantizer, prepared, example, target)
    rows = []
    for k in range(len(groups) + 1):
        for subset in itertools.combinations(range(len(groups)), k):
            bits = {d: 16 if any(d in groups[g] for g in subset) else 8 for d in range(n)}
            start = time.perf_counter()
            c = cycles(bits, {})
            converted = convert_pt2e(quantizer.with_widths(prepared, bits, {}))
            sqnr = precision._sqnr(reference, precision._eager(converted, tests))
            rows.append({"int16_groups": list(subset), "int16_domains": sum(len(groups[g]) for g in subset),
                         "cycles": c, "sqnr_db": sqnr, "seconds": time.perf_counter() - start})
            print(f"[{model} {target}] {subset}: {c} cycles, {sqnr:.2f} dB", file=sys.stderr, flush=True)
    chosen = []
    for budget in budgets:
        q = CodecQuantizer(CodecSpec(policy="I", target=target, precision="auto", budget=budget))
        with torch.no_grad():
            p = prepare_pt2e(torch.export.export(module, example).module(check_guards=False), q)
            for batch in calib:
                p(*batch)
        q.choose_precision(p, calib[:precision.SEARCH_INPUTS])
        wide = {d.domain for d in q.precisions if d.bits == 16}
        subset = [g for g, members in enumerate(groups) if set(members) <= wide]
        chosen.append({"budget_db": budget, "int16_groups": subset, "search_score_db": q.search_result.score})
    return {"model": model, "target": target, "groups": [list(g) for g in groups], "rows": rows,
            "search": chosen}


def markdown(result: dict[str, Any], a16w8: dict[str, Any] | None) -> str:
    rows = sorted(result["rows"], key=lambda r: r["cycles"])
    best = -float("inf")
    lines = [f"**{result['model']}, {result['target']}** (groups: "
             + ", ".join(f"G{k} = domains {g}" for k, g in enumerate(result["groups"])) + ")", "",
             "| INT16 groups | cycles | x a16w8 | SQNR dB (held-out, converted module) | frontier | search chose at |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        frontier = r["sqnr_db"] > best
        best = max(best, r["sqnr_db"])
        by = [f"{s['budget_db']:g} dB" for s in result["search"] if s["int16_groups"] == r["int16_groups"]]
        ratio = f"{r['cycles'] / a16w8['cycles_total']:.3f}" if a16w8 else ""
        lines.append(f"| {' '.join(f'G{g}' for g in r['int16_groups']) or 'none'} | {r['cycles']} | {ratio} | "
                     f"{r['sqnr_db']:.2f} | {'yes' if frontier else ''} | {', '.join(by)} |")
    if a16w8:
        lines.append("")
        lines.append(f"Stock a16w8: {a16w8['cycles_total']} cycles, {a16w8['sqnr_db']:.2f} dB (artefact, "
                     "same held-out inputs, `benchmarks/results/precision_vela.json`).")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet8")
    p.add_argument("--target", default="ethos-u85-256")
    p.add_argument("--budgets", nargs="*", type=float, default=[],
                   help="mark the search's choice at these budgets (dB)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = p.parse_args(argv)
    from codec_tosa.quiet import quiet

    with quiet():
        result = run(args.model, args.target, args.budgets)
    data = json.loads(args.json.read_text()) if args.json.exists() else {}
    data[f"{args.model} {args.target}"] = result
    args.json.write_text(json.dumps(data, indent=1))
    stock = HERE / "results" / "precision_vela.json"
    a16w8 = None
    if stock.exists():
        rows = json.loads(stock.read_text())["models"].get(args.model, {}).get(args.target, [])
        a16w8 = next((r for r in rows if r.get("flow") == "stock-a16w8"), None)
    print(markdown(result, a16w8))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
