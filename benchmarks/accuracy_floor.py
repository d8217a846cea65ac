"""The 10 dB SQNR warning floor (`tools/validate.SQNR_FLOOR_DB`) against trained models (issue 23).

`codec-tosa compile`, `codec_tosa.save` and `validate` warn when an output's
SQNR against FP32 eager, at its worst over the checked inputs, is below the
floor. Without `inputs=` they check the example and 16 held-out inputs drawn
by `tools.samples.inputs_for_specs` (standard normal, seed 1234): for a model
calibrated on real data those lie partly outside the calibrated input range.
For each model and flow this lowers the artefact as `benchmarks/accuracy.py`
does (same 64 calibration images), runs it in the ExecuTorch runtime on those
17 inputs, and reports the worst and median logit SQNR there and the share of
input elements outside the flow's input range, beside the per-image SQNR on
the real test sets from accuracy.json (minimum, 5th percentile: the worst of
17 real images is about the 6th percentile).

Usage::

    python benchmarks/accuracy_floor.py [--models ...] [--flows stock-int8 W-minmax I-histogram]
        [--accuracy-json benchmarks/results/accuracy.json] [--json benchmarks/results/accuracy_floor.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import (CALIBRATION_IMAGES, CALIBRATION_SEED, DEFAULT_JSON as ACCURACY_JSON, MODELS,  # noqa: E402
                      Flow, build, eager, parse_flow, run_artefact, sqnr_db)

DEFAULT_FLOWS = ("stock-int8", "W-minmax", "W-histogram", "I-histogram", "I-minmax")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "accuracy_floor.json"


def floor_row(model: str, flow: Flow) -> dict[str, Any]:
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.validation.samples import DEFAULT_SAMPLES, inputs_for_specs
    from codec_tosa.validation.validate import SQNR_FLOOR_DB
    from codec_tosa_examples.models import trained

    calibration = trained.calibration_images(CALIBRATION_IMAGES, CALIBRATION_SEED)
    module, example = trained.load(model)
    art = build(flow, module, example, calibration)
    cases = inputs_for_specs(inspect_pte(art.pte).input_specs, 1 + DEFAULT_SAMPLES)
    x = torch.cat([c[0] for c in cases])
    got, ref = run_artefact(art.pte, x), eager(module, x)
    per_case = [sqnr_db(ref[i], got[i]) for i in range(len(x))]
    cal = torch.cat([c[0] for c in calibration])
    lo, hi = float(cal.min()), float(cal.max())
    return {"cases": len(x), "worst_db": min(per_case), "median_db": float(np.median(per_case)),
            "below_floor": sum(v < SQNR_FLOOR_DB for v in per_case),
            "outside_calibration_range": float(((x < lo) | (x > hi)).float().mean())}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--flows", nargs="+", default=list(DEFAULT_FLOWS), type=parse_flow)
    p.add_argument("--accuracy-json", type=Path, default=ACCURACY_JSON)
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = p.parse_args(argv)
    flows = [f if isinstance(f, Flow) else parse_flow(f) for f in args.flows]
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.quiet import quiet
    from codec_tosa.validation.validate import SQNR_FLOOR_DB

    real = json.loads(args.accuracy_json.read_text())["models"] if args.accuracy_json.exists() else {}
    out: dict[str, Any] = {"command": shlex.join(["python", "benchmarks/accuracy_floor.py", *argv]),
                           "floor_db": SQNR_FLOOR_DB, "rows": []}
    head = ["model", "flow", "real clean min / p5 dB", "real noisy min / p5 dB",
            "random worst / median dB (17)", "random below floor", "random outside calib. range"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    with quiet():
        arm_adapter.install_payload_journal()
        for model in args.models:
            for flow in flows:
                row = {"model": model, "flow": flow.name, **floor_row(model, flow)}
                acc = real.get(model, {}).get("rows", {}).get(flow.name, {})
                row["real"] = {s: {k: acc[s][k] for k in ("sqnr_min_db", "sqnr_p5_db", "sqnr_median_db")}
                               for s in ("clean", "noisy") if s in acc}
                out["rows"].append(row)
                args.json.write_text(json.dumps(out, indent=1))
                realc = [f"{row['real'][s]['sqnr_min_db']:.1f} / {row['real'][s]['sqnr_p5_db']:.1f}"
                         if s in row["real"] else "-" for s in ("clean", "noisy")]
                lines.append(f"| {model} | {flow.name} | {realc[0]} | {realc[1]} | {row['worst_db']:.1f} / "
                             f"{row['median_db']:.1f} | {row['below_floor']}/{row['cases']} | "
                             f"{100 * row['outside_calibration_range']:.0f}% |")
                print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
