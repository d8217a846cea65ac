"""Side by side: codec_tosa at policy W vs Arm's stock TOSA flows, one process per run.

For each model (default: ShuffleNetV2, U-Net, InceptionV3) this lowers, in this order:

* ``stock-fp``: Arm's `TOSAPartitioner` with ``TOSA-1.0+FP`` (no quantization);
* ``stock-int8``: Arm's PT2E flow, `TOSAQuantizer` (INT8,
  `get_symmetric_quantization_config`) then `TOSAPartitioner` with ``TOSA-1.0+INT``;
* ours: `CodecTosaPartitioner` at policy W with each placement asked for
  (default ``nonlocal+coalesce``; ``TOSA-1.0+INT+FP``).

All use the same calibration (the example input plus 3 seeded random inputs).
Every configuration is lowered with the same timed code
(`to_edge_transform_and_lower`, then `.to_executorch()`, as
`codec_tosa.tools.compiler.lower_program` does). For each one the script reports,
read back from the delegate payload(s) with `tosa_stats`: TOSA operators,
non-constant operators, RESCALEs, unfused and fused TOSA traffic (README,
"Fused traffic"), payload bytes; lowering wall time and its ratio against
stock INT8; and, on a held-out seeded random input that no flow calibrated on:

* ours: max |TOSA reference model - `simulate()`| in units of each output's
  quantisation step;
* stock INT8: max |TOSA reference model - the PT2E converted module (its own
  quantized eager)| in units of the output's quantisation step (the scale of
  the output's dequantize);
* stock FP: max |TOSA reference model - eager| in units of range / 255;
* every flow: SQNR of the reference-model output against FP32 eager.

The "reference model" output is the whole edge program run in PyTorch with each
delegate call executed by the TOSA reference model (so CPU-side quantize /
dequantize of the stock flow are included, and a partially delegated program
still works).

Usage::

    python benchmarks/lowering.py [--models shufflenet_v2 unet inception_v3]
        [--placements nonlocal+coalesce] [--json benchmarks/results/lowering.json]
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.export import ExportedProgram

from codec_tosa.units import MIB

DEFAULT_MODELS = ("shufflenet_v2", "unet", "inception_v3")
DEFAULT_PLACEMENTS = ("nonlocal+coalesce",)
STOCK = "stock-int8"
STOCK_TOSA = "TOSA-1.0+INT"
STOCK_FP = "stock-fp"
STOCK_FP_TOSA = "TOSA-1.0+FP"
HELD_OUT_SEED = 1234  # the input errors and SQNR are measured on; calibration never sees it
POLICY = "W"
CALIBRATION_RANDOM = 3  # plus the example input
WARMUP_MODEL = "tiny_shufflenet"
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "lowering.json"

Inputs = tuple[torch.Tensor, ...]


@dataclass
class Row:
    """One configuration of one model."""

    model: str
    config: str
    tosa: str
    delegates: int
    operators: int
    rescales: int
    traffic_bytes: int
    payload_bytes: int
    nonconst_operators: int = 0  # operators other than CONST / CONST_SHAPE
    fused_traffic_bytes: int = 0
    quantize_s: float = 0.0  # stock: PT2E prepare + calibrate + convert + export; ours: 0 (in lowering)
    lowering_s: float = 0.0  # to_edge_transform_and_lower
    serialisation_s: float = 0.0  # .to_executorch()
    lowering_ratio: float = math.nan  # lowering_s / stock lowering_s
    total_ratio: float = math.nan  # (quantize + lowering) / stock's
    err_steps: float = math.nan  # max |reference model - expected| / step, over outputs
    err_abs: float = math.nan
    step: float = math.nan  # quantisation step of the worst output
    expected: str = ""  # what the reference model is compared against
    sqnr_db: float = math.nan  # reference model vs FP32 eager (worst output)
    modeled_traffic_bytes: int | None = None  # ours: the plan's traffic model
    operators_by_type: dict[str, int] = field(default_factory=dict)
    traffic_by_op: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- inputs


def calibration_set(inputs: Inputs, n_random: int = CALIBRATION_RANDOM) -> list[Inputs]:
    """The example input plus `n_random` seeded random inputs (as `codec-tosa compile`)."""
    from codec_tosa.planning.calibration import random_calibration

    return [tuple(inputs)] + random_calibration(inputs, n_random)


def load(model: str) -> tuple[torch.nn.Module, Inputs]:
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    from codec_tosa_examples.models import load_model

    module, inputs = load_model(model)
    return module, tuple(inputs)


def export(module: torch.nn.Module, inputs: Inputs) -> ExportedProgram:
    with torch.no_grad():
        return torch.export.export(module, inputs)


def as_list(out: Any) -> list[torch.Tensor]:
    from codec_tosa.pytrees import tensor_leaves

    return [t.detach() for t in tensor_leaves(out)]


# --------------------------------------------------------------------------- lowering


@dataclass
class Lowering:
    edge: Any  # EdgeProgramManager after to_edge_transform_and_lower
    pte: bytes
    lowering_s: float
    serialisation_s: float


def timed_lower(program: ExportedProgram, partitioner: Any) -> Lowering:
    """The timed lowering used for every configuration (as `compiler.lower_program`)."""
    from executorch.exir import to_edge_transform_and_lower

    t = time.perf_counter()
    edge = to_edge_transform_and_lower(program, partitioner=[partitioner])
    lowering = time.perf_counter() - t
    t = time.perf_counter()
    pte = edge.to_executorch().buffer
    return Lowering(edge, bytes(pte), lowering, time.perf_counter() - t)


def stock_quantize(module: torch.nn.Module, inputs: Inputs, calibration: Sequence[Inputs],
                   compile_spec: Any, quantizer_class: type | None = None
                   ) -> tuple[torch.nn.Module, ExportedProgram, float]:
    """Arm's PT2E INT8 flow (as `codec_tosa.arm.stock.stock_int8_program`), calibrated on `calibration`.

    `quantizer_class` defaults to `TOSAQuantizer` (`VgfQuantizer` for a VGF spec).
    Returns the converted module (the stock flow's quantized eager), its export,
    and the wall time of prepare + calibrate + convert + export.
    """
    from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    t = time.perf_counter()
    quantizer = (quantizer_class or TOSAQuantizer)(compile_spec)
    quantizer.set_global(get_symmetric_quantization_config())
    with torch.no_grad():
        graph = torch.export.export(module, inputs).module(check_guards=False)
        prepared = prepare_pt2e(graph, quantizer)
        for c in calibration:
            prepared(*c)
        converted = convert_pt2e(prepared)
        program = torch.export.export(converted, inputs)
    return converted, program, time.perf_counter() - t


# --------------------------------------------------------------------------- validation


class ReferenceModelInterpreter(torch.fx.Interpreter):
    """Runs an edge program with every delegate call executed by the TOSA reference model
    (`run_delegate`; benchmarks/vgf.py runs each VGF delegate instead)."""

    def run_node(self, n: torch.fx.Node) -> Any:
        from executorch.exir.delegate import executorch_call_delegate

        if n.op != "call_function" or n.target is not executorch_call_delegate:
            return super().run_node(n)
        lowered, *args = self.fetch_args_kwargs_from_env(n)[0]
        arrays = [a.detach().contiguous().numpy() for a in args]
        outs = self.run_delegate(lowered, arrays)
        vals = n.meta.get("val")
        vals = list(vals) if isinstance(vals, (list, tuple)) else [vals] * len(outs)
        return tuple(_tensor_like(o, v) for o, v in zip(outs, vals))

    def run_delegate(self, lowered: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
        from codec_tosa.validation.reference_model import run_reference_model

        return run_reference_model(bytes(lowered.processed_bytes), arrays, lowered.backend_id)


def _tensor_like(array: np.ndarray, like: Any) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(array))
    if isinstance(like, torch.Tensor):
        t = t.reshape(like.shape).to(like.dtype)
    return t


def run_on_reference_model(edge: Any, inputs: Inputs,
                           interpreter: type[ReferenceModelInterpreter] = ReferenceModelInterpreter,
                           **kwargs: Any) -> list[torch.Tensor]:
    """The edge program's outputs, each delegate call run by `interpreter(gm, **kwargs)`."""
    from codec_tosa.planning.calibration import lifted_args

    ep = edge.exported_program()
    with torch.no_grad():
        out = interpreter(ep.graph_module, **kwargs).run(*lifted_args(ep, inputs))
    return as_list(out)


def sqnr(signal: torch.Tensor, approx: torch.Tensor) -> float:
    from codec_tosa.validation.validate import sqnr_db

    return sqnr_db(signal.float().numpy(), approx.float().reshape(signal.shape).numpy())


@dataclass
class ErrorReport:
    err_steps: float
    err_abs: float
    step: float
    sqnr_db: float


def compare(got: list[torch.Tensor], expected: list[torch.Tensor], steps: list[float],
            eager: list[torch.Tensor]) -> ErrorReport:
    """Worst output: max |got - expected| in steps, and the lowest SQNR against FP32 eager."""
    worst = ErrorReport(-1.0, math.nan, math.nan, math.inf)
    for g, e, s, f in zip(got, expected, steps, eager):
        g = g.float().reshape(e.shape)
        err = float((g - e.float()).abs().max()) if g.numel() else 0.0
        units = err / s if s > 0 else (0.0 if err == 0 else math.inf)
        if units > worst.err_steps:
            worst.err_steps, worst.err_abs, worst.step = units, err, s
        worst.sqnr_db = min(worst.sqnr_db, sqnr(f, g))
    return worst


def dequantize_scales(gm: torch.fx.GraphModule) -> list[float | None]:
    """Scale of the dequantize feeding each graph output (None when not quantized)."""
    out = next(n for n in gm.graph.nodes if n.op == "output")
    flat = out.args[0] if isinstance(out.args[0], (list, tuple)) else [out.args[0]]
    scales: list[float | None] = []
    for node in flat:
        is_dq = isinstance(node, torch.fx.Node) and "dequantize" in str(node.target)
        scales.append(float(node.args[1]) if is_dq and isinstance(node.args[1], (int, float)) else None)
    return scales


def fallback_steps(eager: list[torch.Tensor], scales: Sequence[float | None]) -> list[float]:
    return [s if s is not None else float(e.max() - e.min()) / 255.0 for e, s in zip(eager, scales)]


# --------------------------------------------------------------------------- stats


def payload_row(model: str, config: str, tosa: str, edge: Any) -> Row:
    """TOSA counts of all delegate payloads of `edge` (summed), timings left at 0."""
    from codec_tosa.arm import stock
    from codec_tosa.serialization.tosa_stats import tosa_stats

    by_type: dict[str, int] = {}
    by_op: dict[str, int] = {}
    row = Row(model, config, tosa, 0, 0, 0, 0, 0)
    for lowered in stock.lowered_modules(edge):
        stats = tosa_stats(bytes(lowered.processed_bytes))
        row.delegates += 1
        row.operators += stats.operators
        row.traffic_bytes += stats.traffic_bytes
        row.fused_traffic_bytes += stats.fused_traffic_bytes
        row.nonconst_operators += stats.operators - stats.const_ops - stats.const_shape_ops
        row.payload_bytes += stats.payload_bytes
        for k, v in stats.operators_by_type.items():
            by_type[k] = by_type.get(k, 0) + v
        for k, v in stats.traffic_by_op.items():
            by_op[k] = by_op.get(k, 0) + v
    row.rescales = by_type.get("RESCALE", 0)
    row.operators_by_type, row.traffic_by_op = by_type, by_op
    return row


def modeled_traffic(part: Any) -> int | None:
    return part.planned.traffic().traffic_bytes if part.planned is not None else None


# --------------------------------------------------------------------------- configurations


def held_out(inputs: Inputs) -> Inputs:
    """A seeded random input shaped like the example, outside every calibration set."""
    from codec_tosa.planning.calibration import random_calibration

    return random_calibration(inputs, 1, seed=HELD_OUT_SEED)[0]


def model_case(model: str) -> tuple[torch.nn.Module, Inputs, list[Inputs], Inputs, list[torch.Tensor]]:
    """The model, its example input, calibration set, held-out input and FP32 eager output on it."""
    module, inputs = load(model)
    test = held_out(inputs)
    with torch.no_grad():
        eager = as_list(module(*test))
    return module, inputs, calibration_set(inputs), test, eager


def run_stock_fp(model: str, module: torch.nn.Module, inputs: Inputs, test: Inputs,
                 eager: list[torch.Tensor]) -> Row:
    from codec_tosa.arm import adapter as arm_adapter

    spec = arm_adapter.tosa_compile_spec(STOCK_FP_TOSA)
    low = timed_lower(export(module, inputs), arm_adapter.stock_partitioner(spec))
    row = payload_row(model, STOCK_FP, STOCK_FP_TOSA, low.edge)
    row.lowering_s, row.serialisation_s = low.lowering_s, low.serialisation_s
    steps = [float(e.max() - e.min()) / 255.0 for e in eager]
    err = compare(run_on_reference_model(low.edge, test), eager, steps, eager)
    _set_error(row, err, "FP32 eager")
    return row


def run_stock(model: str, module: torch.nn.Module, inputs: Inputs, calibration: Sequence[Inputs],
              eager: list[torch.Tensor], test: Inputs) -> Row:
    from codec_tosa.arm import adapter as arm_adapter

    spec = arm_adapter.tosa_compile_spec(STOCK_TOSA)
    converted, program, quantize_s = stock_quantize(module, inputs, calibration, spec)
    low = timed_lower(program, arm_adapter.stock_partitioner(spec))
    row = payload_row(model, STOCK, STOCK_TOSA, low.edge)
    row.quantize_s, row.lowering_s, row.serialisation_s = quantize_s, low.lowering_s, low.serialisation_s
    with torch.no_grad():
        quantized = as_list(converted(*test))
    steps = fallback_steps(quantized, dequantize_scales(converted))
    err = compare(run_on_reference_model(low.edge, test), quantized, steps, eager)
    _set_error(row, err, "PT2E converted module")
    return row


def run_ours(model: str, placement: str, module: torch.nn.Module, inputs: Inputs,
             calibration: Sequence[Inputs], eager: list[torch.Tensor], test: Inputs) -> Row:
    from codec_tosa.targets.tosa.partitioner import CodecTosaPartitioner
    from codec_tosa.validation.simulation import simulate
    from codec_tosa.spec import CodecSpec
    from codec_tosa.validation.reference_io import fp32_steps

    spec = CodecSpec(policy=POLICY, placement=placement)
    part = CodecTosaPartitioner(spec, calibration=calibration)
    low = timed_lower(export(module, inputs), part)
    row = payload_row(model, placement, spec.tosa_spec, low.edge)
    row.lowering_s, row.serialisation_s = low.lowering_s, low.serialisation_s
    row.modeled_traffic_bytes = modeled_traffic(part)
    simulated = as_list(simulate(part.planned, test))
    steps = part.planned.output_steps(fp32_steps(eager))
    err = compare(run_on_reference_model(low.edge, test), simulated, steps, eager)
    _set_error(row, err, "simulate()")
    return row


def _set_error(row: Row, err: ErrorReport, expected: str) -> None:
    row.err_steps, row.err_abs, row.step, row.sqnr_db = err.err_steps, err.err_abs, err.step, err.sqnr_db
    row.expected = expected


def set_ratios(rows: list[Row]) -> None:
    """Lowering-time ratios against the stock row of the same model (same process)."""
    stock = {r.model: r for r in rows if r.config == STOCK}
    for r in rows:
        s = stock.get(r.model)
        if s is None:
            continue
        r.lowering_ratio = r.lowering_s / s.lowering_s
        r.total_ratio = (r.quantize_s + r.lowering_s) / (s.quantize_s + s.lowering_s)


def bench_model(model: str, placements: Sequence[str] = DEFAULT_PLACEMENTS,
                log: Callable[[str], None] = print,
                on_row: Callable[[list[Row]], None] | None = None) -> list[Row]:
    """Stock FP, stock INT8, then ours at each placement, for one model.

    `on_row` is called with the rows so far after each configuration (partial results).
    """
    module, inputs, calibration, test, eager = model_case(model)
    rows: list[Row] = []
    for config in (STOCK_FP, STOCK, *placements):
        t = time.perf_counter()
        if config == STOCK_FP:
            row = run_stock_fp(model, module, inputs, test, eager)
        elif config == STOCK:
            row = run_stock(model, module, inputs, calibration, eager, test)
        else:
            row = run_ours(model, config, module, inputs, calibration, eager, test)
        rows.append(row)
        log(f"[{model} {config}] done in {time.perf_counter() - t:.1f} s: "
            f"lowering {row.lowering_s:.1f} s, traffic {row.traffic_bytes / MIB:.2f} MiB, "
            f"error {row.err_steps:.3g} steps")
        set_ratios(rows)
        if on_row is not None:
            on_row(rows)
    return rows


def warm_up(model: str) -> None:
    """Lower `model` once stock and once ours (results discarded)."""
    module, inputs = load(model)
    calibration = calibration_set(inputs)
    with torch.no_grad():
        eager = as_list(module(*inputs))
    run_stock_fp(model, module, inputs, inputs, eager)
    run_stock(model, module, inputs, calibration, eager, inputs)
    run_ours(model, DEFAULT_PLACEMENTS[-1], module, inputs, calibration, eager, inputs)


# --------------------------------------------------------------------------- output

HEADER = ("model", "config", "TOSA ops", "non-const ops", "RESCALE", "traffic MiB", "fused MiB",
          "payload KiB", "lowering s", "vs stock INT8", "quant+lower vs stock INT8", "error (steps)",
          "SQNR dB")


def table_lines(rows: Sequence[Row]) -> list[str]:
    """A Markdown table of the rows."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    for r in rows:
        cells = (r.model, r.config, str(r.operators), str(r.nonconst_operators), str(r.rescales),
                 f"{r.traffic_bytes / MIB:.2f}", f"{r.fused_traffic_bytes / MIB:.2f}",
                 f"{r.payload_bytes / 1024:.0f}", f"{r.lowering_s:.1f}", f"{r.lowering_ratio:.2f}x",
                 f"{r.total_ratio:.2f}x", f"{r.err_steps:.2f}", f"{r.sqnr_db:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def traffic_lines(rows: Sequence[Row], top: int = 8) -> list[str]:
    """Per model: TOSA traffic (MiB) and operator count by operator type, for each config."""
    lines: list[str] = []
    for model in dict.fromkeys(r.model for r in rows):
        mine = [r for r in rows if r.model == model]
        totals: dict[str, int] = {}
        for r in mine:
            for op, b in r.traffic_by_op.items():
                totals[op] = totals.get(op, 0) + b
        ops = sorted(totals, key=lambda op: -totals[op])[:top]
        lines += ["", f"{model}: TOSA traffic MiB (operators) by type, top {len(ops)}", "",
                  "| op | " + " | ".join(r.config for r in mine) + " |",
                  "|---|" + "|".join("---:" for _ in mine) + "|"]
        for op in ops:
            cells = [f"{r.traffic_by_op.get(op, 0) / MIB:.2f} ({r.operators_by_type.get(op, 0)})"
                     for r in mine]
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return lines


def load_rows(path: Path) -> list[Row]:
    return [Row(**r) for r in json.loads(path.read_text())["rows"]]


def write_json(rows: Sequence[Row], path: Path, argv: Sequence[str]) -> None:
    from importlib.metadata import version

    doc = {"command": shlex.join(argv), "policy": POLICY, "stock_tosa": STOCK_TOSA,
           "calibration": f"example input + {CALIBRATION_RANDOM} seeded random inputs",
           "measured_on": f"a held-out seeded random input (seed {HELD_OUT_SEED})",
           "versions": {p: version(p) for p in ("codec_tosa", "torch", "executorch", "torchao")},
           "rows": [asdict(r) for r in rows]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=float))


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                   help="built-in model names or path/to/file.py:function (default: %(default)s)")
    p.add_argument("--placements", nargs="+", default=list(DEFAULT_PLACEMENTS),
                   help="placements of ours at policy W (default: %(default)s)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="output JSON (default: %(default)s)")
    p.add_argument("--warmup", default=WARMUP_MODEL,
                   help="model lowered once (stock and ours, not reported) before timing, so "
                        "one-off import and tracing costs fall on no configuration; '' for none "
                        "(default: %(default)s)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.warmup:
        warm_up(args.warmup)
    rows: list[Row] = []
    command = ["python", "benchmarks/lowering.py", *argv]
    for model in args.models:
        done = list(rows)
        rows = done + bench_model(model, args.placements,
                                  log=lambda s: print(s, file=sys.stderr, flush=True),
                                  on_row=lambda partial: write_json(done + partial, args.json, command))
    print("\n".join(table_lines(rows) + traffic_lines(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
