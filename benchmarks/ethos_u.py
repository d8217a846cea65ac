"""Ethos-U side by side: ours at policy I against Arm's stock Ethos-U flow, one process.

For each model and target, in this order:

* ``stock``: Arm's documented flow, `EthosUQuantizer` with
  `get_symmetric_quantization_config()`, calibrated on the same inputs, then
  `EthosUPartitioner` (Vela);
* ``ours (Arm's flow)``: the same flow with one line changed, `CodecQuantizer`
  in place of `EthosUQuantizer` (the README's Ethos-U recipe);
* ``ours (I)``: `codec-tosa compile MODEL --policy I --target TARGET` as a
  library call, which runs that flow itself: its figures equal the row above.

Reported per row, from Vela's own summary: cycles, SRAM used and off-chip
bytes, NPU and CPU operators; and delegates, CPU operators of the program,
TOSA operators (CONST and CONST_SHAPE not counted), RESCALEs and unfused and fused TOSA traffic
(`serialization/tosa_stats.py`) of the TOSA Vela was given, lowering seconds.
The JSON also keeps each row's TOSA operators and RESCALEs by producer.

Both flows get the same module, whose batch-norm statistics are first
re-estimated on seeded random batches (`examples/models/batch_norm.py`; with
PyTorch's defaults a random MobileNetV2's output is constant), and the same
calibration inputs. SQNR against FP32 eager is pooled over held-out seeded
inputs (not the calibration ones): ours through the simulation of the plan
(bit-exact with the TOSA), stock through its PT2E converted module (what its
TOSA computes).

Usage::

    python benchmarks/ethos_u.py [--models shufflenet_v2 mobilenet_v2 inception_v3 unet]
        [--targets ethos-u55-128 ethos-u85-256] [--unet-size 256] [--samples 4]
        [--json benchmarks/results/ethos_u.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from codec_tosa.units import MIB

DEFAULT_MODELS = ("shufflenet_v2", "mobilenet_v2", "inception_v3", "unet")
DEFAULT_TARGETS = ("ethos-u55-128", "ethos-u85-256")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "ethos_u.json"
HELD_OUT_SEED = 1234
CALIBRATION_SAMPLES = 4  # the example input and 3 seeded random ones (seed 0)


@dataclass
class Row:
    model: str
    target: str
    flow: str
    delegates: int
    program_cpu_ops: int
    tosa_ops: int
    rescales: int
    traffic_mib: float
    fused_traffic_mib: float
    cycles: int
    sram_bytes: int
    off_chip_bytes: int
    npu_ops: int
    vela_cpu_ops: int
    lowering_s: float
    sqnr_db: float
    # JSON only: TOSA operators by type, RESCALEs by the operator feeding them and by their readers
    detail: dict[str, Any] = field(default_factory=dict)
    # not written anywhere unless --tosa-dir: the TOSA flatbuffers Vela was given
    tosa: list[bytes] = field(default_factory=list, repr=False)


TABLE_COLUMNS = [name for name in Row.__dataclass_fields__ if name not in ("detail", "tosa")]


@dataclass
class Tosa:
    flatbuffers: list[bytes]
    operators: int
    rescales: int
    traffic_bytes: int
    fused_traffic_bytes: int
    detail: dict[str, Any]


def _tosa(flatbuffers: list[bytes]) -> Tosa:
    """Counts and traffic of the flatbuffers Vela was given, summed."""
    from codec_tosa.serialization.tosa_stats import rescale_neighbours, tosa_stats

    stats = [tosa_stats(b) for b in flatbuffers]
    by_type: Counter[str] = Counter()
    for s in stats:
        by_type.update(s.operators_by_type)
    fed_by: Counter[str] = Counter()
    read_by: Counter[str] = Counter()
    for buf in flatbuffers:
        fed, read = rescale_neighbours(buf)
        fed_by.update(fed)
        read_by.update(read)
    return Tosa(flatbuffers, sum(s.operators - s.const_ops - s.const_shape_ops for s in stats), by_type.get("RESCALE", 0),
                sum(s.traffic_bytes for s in stats), sum(s.fused_traffic_bytes for s in stats),
                {"operators_by_type": dict(sorted(by_type.items())),
                 "rescales_fed_by": dict(fed_by.most_common()),
                 "rescales_read_by": dict(read_by.most_common())})


def _vela(runs: list[Any], pte: bytes) -> dict[str, Any]:
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.targets.ethosu.vela_summary import read_vela_summary, vela_operator_counts, vela_report

    kept = [r if isinstance(r, dict) else {"tosa": r.tosa, "summary": read_vela_summary(r.directory),
                                           "operators": vela_operator_counts(r.log)} for r in runs]
    info = inspect_pte(pte)
    return vela_report(kept) | {"program_cpu_ops": len(info.operators), "delegates": len(info.delegate_ids)}


def _sqnr(eager: list[torch.Tensor], got: list[torch.Tensor]) -> float:
    """SQNR pooled over the held-out samples: total signal over total noise power."""
    from codec_tosa.validation.validate import sqnr_db

    def flat(ts: list[torch.Tensor]) -> Any:
        return torch.cat([t.detach().float().reshape(-1) for t in ts]).numpy()

    return sqnr_db(flat(eager), flat(got))


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (list, tuple)) else out


def _row(model: str, target: str, flow: str, vela: dict[str, Any], tosa: Tosa, vela_cpu_ops: int,
         lowering: float, sqnr: float) -> Row:
    return Row(model, target, flow, vela["delegates"], vela["program_cpu_ops"], tosa.operators, tosa.rescales,
               tosa.traffic_bytes / MIB, tosa.fused_traffic_bytes / MIB, vela["cycles_total"],
               vela["sram_bytes"], vela["off_chip_bytes"], vela["npu_ops"], vela_cpu_ops, lowering, sqnr,
               tosa.detail, tosa.flatbuffers)


def run_stock(model: str, target: str, module: torch.nn.Module, inputs: tuple, calib: list[tuple],
              tests: list[tuple], eager: list[torch.Tensor], codec_quantizer: bool = False) -> Row:
    """Arm's documented Ethos-U flow; `codec_quantizer`: with `CodecQuantizer` swapped in."""
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from codec_tosa import CodecQuantizer, CodecSpec
    from codec_tosa.arm import adapter as arm_adapter

    spec = arm_adapter.ethos_u_compile_spec(target)
    t = time.perf_counter()
    if codec_quantizer:
        quantizer = CodecQuantizer(CodecSpec(policy="I", target=target))
    else:
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
        tosa = _tosa([r.tosa for r in runs])
    lowering = time.perf_counter() - t
    with torch.no_grad():
        got = [_first(converted(*x)) for x in tests]
    return _row(model, target, "ours (Arm's flow)" if codec_quantizer else "stock", vela, tosa, vela["cpu_ops"],
                lowering, _sqnr(eager, got))


def run_ours(model: str, target: str, module: torch.nn.Module, inputs: tuple, calib: list[tuple],
             tests: list[tuple], eager: list[torch.Tensor], placement: str | None = None) -> Row:
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.validation.simulation import simulate
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import lower_program

    t = time.perf_counter()
    spec = CodecSpec(policy="I", target=target, placement=placement)
    low = lower_program(torch.export.export(module, inputs), spec, calib)
    lowering = time.perf_counter() - t
    vela = low.report["vela"]
    info = inspect_pte(low.pte)
    vela = vela | {"delegates": len(info.delegate_ids), "program_cpu_ops": len(info.operators)}
    got = [_first(simulate(low.planned, x)) for x in tests]
    flow = f"ours (I, {placement})" if placement else "ours (I)"
    return _row(model, target, flow, vela, _tosa(list(low.files.values())), vela["cpu_ops"], lowering,
                _sqnr(eager, got))


def load(model: str, unet_size: int) -> tuple[torch.nn.Module, tuple]:
    """The model, with its batch-norm statistics re-estimated (see the module docstring)."""
    from codec_tosa_examples.models import load_model
    from codec_tosa_examples.models.batch_norm import reestimate_batch_norms
    from codec_tosa_examples.models.vision import unet

    module, inputs = unet(size=unet_size) if model == "unet" else load_model(model)
    reestimate_batch_norms(module, tuple(inputs))
    return module, tuple(inputs)


def markdown(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for r in rows:
        values = [getattr(r, c) for c in TABLE_COLUMNS]
        lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in values) + " |")
    return "\n".join(lines)


def write_json(path: Path, argv: list[str], args: argparse.Namespace, rows: list[Row]) -> None:
    path.write_text(json.dumps({"command": shlex.join(["python", "benchmarks/ethos_u.py", *argv]),
                                "unet_size": args.unet_size, "held_out_seed": HELD_OUT_SEED,
                                "held_out_samples": args.samples,
                                "rows": [{k: v for k, v in asdict(r).items() if k != "tosa"} for r in rows]},
                               indent=1))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    p.add_argument("--targets", nargs="+", default=list(DEFAULT_TARGETS))
    p.add_argument("--unet-size", type=int, default=256, help="U-Net input height and width")
    p.add_argument("--samples", type=int, default=4, help="held-out inputs for SQNR")
    p.add_argument("--placements", nargs="+", default=[None], type=lambda s: None if s == "default" else s,
                   help="our placements, one row each (default: the spec's default at policy I, "
                        "nonlocal+share)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--tosa-dir", type=Path, help="also write each row's TOSA here, for running Vela "
                   "with --verbose-performance on it (per-layer cycles)")
    args = p.parse_args(argv)

    from codec_tosa.planning.calibration import random_calibration
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    rows: list[Row] = []
    for model in args.models:
        module, inputs = load(model, args.unet_size)
        calib = [inputs] + random_calibration(inputs, CALIBRATION_SAMPLES - 1)
        tests = random_calibration(inputs, args.samples, seed=HELD_OUT_SEED)
        with torch.no_grad():
            eager = [_first(module(*x)) for x in tests]
        for target in args.targets:
            # (file tag, run): ours once per placement asked for
            runs = [("stock", run_stock), ("ours_arm_flow", functools.partial(run_stock, codec_quantizer=True))]
            runs += [((f"ours_{pl}" if pl else "ours"), functools.partial(run_ours, placement=pl))
                     for pl in args.placements]
            for tag, run in runs:
                rows.append(run(model, target, module, inputs, calib, tests, eager))
                print(f"[{model} {target} {rows[-1].flow}] {rows[-1].cycles} cycles", file=sys.stderr, flush=True)
                if args.tosa_dir:
                    args.tosa_dir.mkdir(parents=True, exist_ok=True)
                    for k, buf in enumerate(rows[-1].tosa):
                        (args.tosa_dir / f"{model}_{target}_{tag}_{k}.tosa").write_bytes(buf)
                rows[-1].tosa = []  # weights: megabytes per row
                # after every row, so that a long run's finished rows are kept
                write_json(args.json, argv, args, rows)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
