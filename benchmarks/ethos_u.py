"""Ethos-U side by side: ours at policy I against Arm's stock Ethos-U flow, one process.

For each model and target, in this order:

* ``stock``: Arm's documented flow, `EthosUQuantizer` with
  `get_symmetric_quantization_config()`, calibrated on the same inputs, then
  `EthosUPartitioner` (Vela);
* ``ours``: `codec-tosa compile MODEL --policy I --target TARGET` as a library call.

Reported per row, from Vela's own summary: cycles, SRAM used and off-chip
bytes, NPU and CPU operators; and delegates, CPU operators of the program,
TOSA operators and RESCALEs of the TOSA Vela was given, lowering seconds.
SQNR against FP32 eager is on a held-out seeded input: ours through the
simulation of the plan (bit-exact with the TOSA), stock through its PT2E
converted module (what its TOSA computes).

Usage::

    python benchmarks/ethos_u.py [--models tiny_shufflenet] [--targets ethos-u55-128 ethos-u85-256]
        [--json benchmarks/ethos_u.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

DEFAULT_MODELS = ("tiny_shufflenet",)
DEFAULT_TARGETS = ("ethos-u55-128", "ethos-u85-256")
DEFAULT_JSON = Path(__file__).resolve().parent / "ethos_u.json"
HELD_OUT_SEED = 1234


@dataclass
class Row:
    model: str
    target: str
    flow: str
    delegates: int
    program_cpu_ops: int
    tosa_ops: int
    rescales: int
    cycles: int
    sram_bytes: int
    off_chip_bytes: int
    npu_ops: int
    vela_cpu_ops: int
    lowering_s: float
    sqnr_db: float


def _tosa_counts(flatbuffers: list[bytes]) -> tuple[int, int]:
    """TOSA operators and RESCALEs of the flatbuffers Vela was given."""
    from codec_tosa.serialization.tosa_stats import tosa_stats

    stats = [tosa_stats(b) for b in flatbuffers]
    return sum(s.operators for s in stats), sum(s.operators_by_type.get("RESCALE", 0) for s in stats)


def _vela(runs: list[Any], pte: bytes) -> dict[str, Any]:
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.tools.vela_summary import read_vela_summary, vela_operator_counts, vela_report

    kept = [r if isinstance(r, dict) else {"tosa": r.tosa, "summary": read_vela_summary(r.directory),
                                           "operators": vela_operator_counts(r.log)} for r in runs]
    return vela_report(kept, 0) | {"program_cpu_ops": len(inspect_pte(pte).operators),
                                   "delegates": len(inspect_pte(pte).delegate_ids)}


def _sqnr(eager: torch.Tensor, got: torch.Tensor) -> float:
    from codec_tosa.tools.validate import sqnr_db

    return sqnr_db(eager.detach().float().numpy(), got.detach().float().reshape(eager.shape).numpy())


def run_stock(model: str, target: str, module: torch.nn.Module, inputs: tuple, calib: list[tuple],
              test: tuple, eager: torch.Tensor) -> Row:
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from codec_tosa import arm_adapter

    spec = arm_adapter.ethos_u_compile_spec(target)
    t = time.perf_counter()
    quantizer = EthosUQuantizer(spec)
    quantizer.set_global(get_symmetric_quantization_config())
    with torch.no_grad():
        prepared = prepare_pt2e(torch.export.export(module, inputs).module(check_guards=False), quantizer)
        for c in calib:
            prepared(*c)
        converted = convert_pt2e(prepared)
        program = torch.export.export(converted, inputs)
    with tempfile.TemporaryDirectory() as d, arm_adapter.vela_runs_kept(d) as runs:
        edge = to_edge_transform_and_lower(program, partitioner=[arm_adapter.ethos_u_partitioner(spec)])
        pte = bytes(edge.to_executorch().buffer)
        vela = _vela(runs, pte)
        tosa_ops, rescales = _tosa_counts([r.tosa for r in runs])
    lowering = time.perf_counter() - t
    with torch.no_grad():
        out = converted(*test)
    out = out[0] if isinstance(out, (list, tuple)) else out
    return Row(model, target, "stock", vela["delegates"], vela["program_cpu_ops"], tosa_ops, rescales,
               vela["cycles_total"], vela["sram_bytes"], vela["off_chip_bytes"], vela["npu_ops"],
               vela["cpu_ops"], lowering, _sqnr(eager, out))


def run_ours(model: str, target: str, module: torch.nn.Module, inputs: tuple, calib: list[tuple],
             test: tuple, eager: torch.Tensor) -> Row:
    from codec_tosa.simulation import simulate
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import lower_program

    t = time.perf_counter()
    low = lower_program(torch.export.export(module, inputs), CodecSpec(policy="I", target=target), calib)
    lowering = time.perf_counter() - t
    vela = low.report["vela"]
    from codec_tosa.runtime.pte import inspect_pte

    info = inspect_pte(low.pte)
    tosa_ops, rescales = _tosa_counts(list(low.files.values()))
    out = simulate(low.planned, test)[0]
    return Row(model, target, "ours (I)", len(info.delegate_ids), len(info.operators), tosa_ops, rescales,
               vela["cycles_total"], vela["sram_bytes"], vela["off_chip_bytes"], vela["npu_ops"],
               vela["cpu_ops"] - len(info.operators), lowering, _sqnr(eager, out))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    p.add_argument("--targets", nargs="+", default=list(DEFAULT_TARGETS))
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = p.parse_args(argv)

    from codec_tosa.calibration import random_calibration
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    from codec_tosa_examples.models import load_model

    rows: list[Row] = []
    for model in args.models:
        module, inputs = load_model(model)
        inputs = tuple(inputs)
        calib = [inputs] + random_calibration(inputs, 3)
        test = random_calibration(inputs, 1, seed=HELD_OUT_SEED)[0]
        with torch.no_grad():
            eager = module(*test)
        eager = eager[0] if isinstance(eager, (list, tuple)) else eager
        for target in args.targets:
            for run in (run_stock, run_ours):
                rows.append(run(model, target, module, inputs, calib, test, eager))
                print(f"[{model} {target} {rows[-1].flow}] {rows[-1].cycles} cycles", file=sys.stderr)
    header = list(asdict(rows[0]))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in asdict(r).values()) + " |"
              for r in rows]
    print("\n".join(lines))
    args.json.write_text(json.dumps({"command": shlex.join(["python", "benchmarks/ethos_u.py", *argv]),
                                     "held_out_seed": HELD_OUT_SEED, "rows": [asdict(r) for r in rows]},
                                    indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
