"""Compile time per stage, ours against stock Arm INT8 in the same process (issues 22 and 27).

For each model (`arm_models.py`'s builders: executorch's Arm model tests that
need no download, random weights), one spawned process times

* stock: Arm's documented INT8 flow (`arm_models.stock_int8`): quantize (export,
  `TOSAQuantizer`, 4 calibration inputs, convert, export) and lower
  (`to_edge_transform_and_lower` with `TOSAPartitioner`, `to_executorch`);
* ours: `codec-tosa compile` at each policy as the CLI runs it (default held-out
  samples: as many of 16 as keep the reference stage within a quarter of the
  compile, at least 4), in the stages `report.json` times: export, lowering
  (split below), serialisation, reference outputs. The lowering is split where
  the first delegate's TOSA lowering starts (`on_stage`): before it, edge
  conversion, placement and calibration (at I: PT2E prepare, calibration,
  convert, and the plan's record); from it to serialisation, Arm's TOSA
  lowering of every delegate.

Nothing is validated or run here (`arm_models.py` does that, in about an hour).
The goals: ours at most 2x stock, the reference stage at most 25% of compile.
It prints a table and writes `benchmarks/results/compile_time.json` (a run replaces
the rows of the models it ran).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compile_time.py                 # the small models
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compile_time.py --models mobilenet_v2 inception_v3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import arm_models  # noqa: E402 - the same model builders and stock flow

DEFAULT_JSON = arm_models.ROOT / "benchmarks" / "results" / "compile_time.json"
# small enough for a run of a few minutes; --models names any of arm_models'
DEFAULT_MODELS = ("ds_cnn", "resnet8", "mobilenet_v1_025", "deep_autoencoder", "mobile_block", "lstm")
STAGE_KEYS = ("export", "edge + placement", "TOSA lowering", "serialisation", "reference outputs")


def ours(name: str, module: torch.nn.Module, example: tuple[Any, ...], policy: str) -> dict[str, Any]:
    """`codec-tosa compile` timed per stage (report.json's times; `on_stage` marks
    where the TOSA lowering starts and ends)."""
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.cli import error_line
    from codec_tosa.tools.compiler import compile_module

    marks: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="codec-tosa-compile-time-") as d:
        t0 = time.perf_counter()
        try:
            result = compile_module(name, (module, example), CodecSpec(policy), d, progress=False,
                                    on_stage=lambda s: marks.append((s.split(":")[0], time.perf_counter())))
        except Exception as e:  # noqa: BLE001 - a refusal is a row
            return {"error": error_line(e), "total_s": time.perf_counter() - t0}
        end = time.perf_counter()
    times = result.report["times"]
    starts = [t for kind, t in marks if kind == "TOSA lowering"]
    stops = [t for kind, t in marks if kind == "serialisation"]
    tosa = stops[0] - starts[0] if starts and stops else 0.0
    stages = {"export": times["export_s"], "edge + placement": times["lowering_s"] - tosa, "TOSA lowering": tosa,
              "serialisation": times["serialisation_s"], "reference outputs": times["reference_s"]}
    return {"total_s": end - t0, "stages_s": stages, "held_out": result.report.get("held_out"),
            "ambiguous_codes": result.report.get("ambiguous_codes", {}).get("total")}


def run_model(name: str, policies: tuple[str, ...]) -> dict[str, Any]:
    return arm_models.model_row(name, policies, lambda module, example, policy, _: ours(name, module, example, policy),
                                held_out=False)


def table(rows: list[dict[str, Any]], policies: tuple[str, ...]) -> str:
    def cells(o: dict[str, Any]) -> str:
        s, held = o["stages_s"], o.get("held_out") or {}
        return (" ".join(f"{s[k]:{w}.1f}" for k, w in zip(STAGE_KEYS, (6, 7, 6, 5, 6)))
                + f" {100 * s['reference outputs'] / o['total_s']:5.0f} "
                f"{held.get('stored', '-')!s:>3}/{held.get('asked', '-')!s:<4}")

    return arm_models.time_table(rows, policies, f"{'export':>6} {'edge+pl':>7} {'lower':>6} {'ser':>5} "
                                 f"{'ref':>6} {'ref %':>5} {'held out':>8}", cells)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(arm_models.all_models()))
    p.add_argument("--policies", nargs="+", default=list(arm_models.POLICIES), choices=arm_models.POLICIES)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per model")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = p.parse_args()
    policies = tuple(args.policies)
    rows = arm_models.run_models(run_model, args.models, policies, args.timeout, args.json,
                                 "python benchmarks/compile_time.py " + " ".join(sys.argv[1:]),
                                 lambda row: print("\n".join(table([row], policies).splitlines()[2:]), flush=True))
    print()
    print(table(rows, policies))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
