"""The VGF target side by side: ours at policies Z and W against Arm's stock VGF flows, one process.

For each model, in this order, every flow delegating to Arm's `VgfBackend`
(Arm's TOSA step or ours, then Arm's call of the ML SDK's model-converter):

* ``stock-fp``: Arm's `VgfPartitioner` with a `VgfCompileSpec` at ``TOSA-1.0+FP``;
* ``stock-int8``: Arm's PT2E flow, `VgfQuantizer` with
  `get_symmetric_quantization_config()`, then `VgfPartitioner` at ``TOSA-1.0+INT``;
* ``ours Z``, ``ours W``: `codec-tosa compile MODEL --policy Z|W --target vgf`
  as the library call it makes (`tools.compiler.lower_program`).

All flows calibrate on the same inputs (the example plus 3 seeded random
inputs). Per row: VGF bytes, TOSA operators of what the converter was given,
lowering seconds (`to_edge_transform_and_lower`, conversion included),
model-converter seconds, and, on a held-out seeded input no flow calibrated
on, the whole program run in PyTorch with each delegate executed by
scenario_runner on the ML emulation layer over lavapipe (its seconds are a
functional check, not a speed claim: lavapipe compiles every shader on the
CPU), max |VGF output - TOSA reference model output| over the delegate
calls (the reference model runs the TOSA the converter was given, on the same
delegate inputs), and the SQNR of the program's output against FP32 eager.
A flow that fails records its one-line reason in the row.

Usage::

    python benchmarks/vgf.py [--models vit_tiny shufflenet_v2 unet_256] [--json benchmarks/results/vgf.json]
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from lowering import (HELD_OUT_SEED, Inputs, ReferenceModelInterpreter, calibration_set, export, load,
                      model_case, run_on_reference_model, sqnr, stock_quantize, timed_lower)

DEFAULT_MODELS = ("vit_tiny", "shufflenet_v2", "unet_256")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "vgf.json"
STOCK_FP, STOCK_INT8 = "stock-fp", "stock-int8"
OURS = {"ours Z": "Z", "ours W": "W"}
FLOWS = (STOCK_FP, STOCK_INT8, *OURS)
WARMUP_MODEL = "tiny_shufflenet"


@dataclass
class Row:
    model: str
    flow: str
    tosa: str = ""
    delegates: int = 0
    program_cpu_ops: int = 0
    tosa_ops: int = 0
    vgf_bytes: int = 0
    quantize_s: float = 0.0  # stock INT8: PT2E prepare + calibrate + convert + export
    lowering_s: float = math.nan  # to_edge_transform_and_lower, conversion included
    conversion_s: float = math.nan  # model-converter, summed over delegates
    scenario_s: float = math.nan  # scenario_runner on lavapipe, summed over delegate calls
    max_abs_vs_reference: float = math.nan  # over every output of every delegate call
    bit_exact: bool | None = None  # every VGF output equal to the reference model's, bit for bit
    sqnr_db: float = math.nan  # the program's output (VGF delegates) vs FP32 eager, worst output
    error: str = ""  # a failed flow: where and why, one line


class VgfInterpreter(ReferenceModelInterpreter):
    """Runs each delegate call as its VGF on the emulation layer, and its TOSA on the reference model.

    The program continues with the VGF's outputs; the two are compared per call.
    """

    def __init__(self, gm: torch.fx.GraphModule, tosa_of: dict[bytes, bytes], row: Row) -> None:
        super().__init__(gm)
        self.tosa_of, self.row = tosa_of, row
        row.scenario_s, row.max_abs_vs_reference, row.bit_exact = 0.0, 0.0, True

    def run_delegate(self, lowered: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
        from codec_tosa.validation.reference_model import run_reference_model
        from codec_tosa.targets.vgf import run_vgf

        vgf = bytes(lowered.processed_bytes)
        label = f"{self.row.model} {self.row.flow}"
        started = time.perf_counter()
        outs = run_vgf(vgf, arrays, label)
        self.row.scenario_s += time.perf_counter() - started
        reference = run_reference_model(self.tosa_of[vgf], arrays, label)
        for got, ref in zip(outs, reference):
            ref = np.asarray(ref).reshape(got.shape)
            if got.size:
                diff = float(np.max(np.abs(got.astype(np.float64) - ref.astype(np.float64))))
                self.row.max_abs_vs_reference = max(self.row.max_abs_vs_reference, diff)
            self.row.bit_exact = bool(self.row.bit_exact and got.dtype == ref.dtype
                                      and got.tobytes() == ref.tobytes())
        return outs


@dataclass
class Lowered:
    edge: Any
    pte: bytes
    conversions: list[Any]  # arm_adapter.VgfConversion, one per delegate
    lowering_s: float
    quantize_s: float = 0.0


def lower_stock(program: Any, tosa_spec: str) -> Lowered:
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.arm import stock
    from codec_tosa.targets.vgf import tools

    spec = stock.vgf_compile_spec(tosa_spec)
    with arm_adapter.vgf_conversions_kept(str(tools.model_converter())) as conversions:
        low = timed_lower(program, stock.vgf_partitioner(spec))
    return Lowered(low.edge, low.pte, conversions, low.lowering_s)


def lower_ours(program: Any, policy: str, calibration: Sequence[Inputs]) -> Lowered:
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import lower_program

    with arm_adapter.vgf_conversions_kept() as conversions:
        low = lower_program(program, CodecSpec(policy=policy, target="vgf"), calibration)
    return Lowered(low.edge, low.pte, conversions, low.lowering_s)


def lower_flow(flow: str, module: torch.nn.Module, inputs: Inputs, calibration: Sequence[Inputs]
               ) -> tuple[str, Lowered]:
    """The TOSA spec string and the lowering of `flow`."""
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.arm import stock

    if flow == STOCK_FP:
        return "TOSA-1.0+FP", lower_stock(export(module, inputs), "TOSA-1.0+FP")
    if flow == STOCK_INT8:
        from executorch.backends.arm.quantizer import VgfQuantizer

        spec = stock.vgf_compile_spec("TOSA-1.0+INT")
        _, program, quantize_s = stock_quantize(module, inputs, calibration, spec, VgfQuantizer)
        low = lower_stock(program, "TOSA-1.0+INT")
        low.quantize_s = quantize_s
        return "TOSA-1.0+INT", low
    from codec_tosa.spec import CodecSpec

    return CodecSpec(policy=OURS[flow]).tosa_spec, lower_ours(export(module, inputs), OURS[flow], calibration)


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def bench_flow(model: str, flow: str, module: torch.nn.Module, inputs: Inputs,
               calibration: Sequence[Inputs], test: Inputs, eager: list[torch.Tensor]) -> Row:
    """One row; a failure in lowering or in running is recorded, not raised."""
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.serialization.tosa_stats import tosa_stats

    row = Row(model, flow)
    try:
        row.tosa, low = lower_flow(flow, module, inputs, calibration)
    except Exception as e:  # noqa: BLE001 (the row says why)
        row.error = f"lowering: {one_line(e)}"
        return row
    info = inspect_pte(low.pte)
    row.delegates, row.program_cpu_ops = len(info.delegate_ids), len(info.operators)
    row.tosa_ops = sum(tosa_stats(c.tosa).operators for c in low.conversions)
    row.vgf_bytes = sum(len(c.vgf) for c in low.conversions)
    row.quantize_s, row.lowering_s = low.quantize_s, low.lowering_s
    row.conversion_s = sum(c.seconds for c in low.conversions)
    try:
        got = run_on_reference_model(low.edge, test, VgfInterpreter,
                                     tosa_of={c.vgf: c.tosa for c in low.conversions}, row=row)
    except Exception as e:  # noqa: BLE001
        row.error = f"running: {one_line(e)}"
        return row
    row.sqnr_db = min(sqnr(e, g) for e, g in zip(eager, got))
    return row


def bench_model(model: str, flows: Sequence[str], log: Callable[[str], None],
                on_row: Callable[[list[Row]], None]) -> list[Row]:
    module, inputs, calibration, test, eager = model_case(model)
    rows: list[Row] = []
    for flow in flows:
        t = time.perf_counter()
        rows.append(bench_flow(model, flow, module, inputs, calibration, test, eager))
        r = rows[-1]
        log(f"[{model} {flow}] {time.perf_counter() - t:.1f} s: VGF {r.vgf_bytes} B, scenario "
            f"{r.scenario_s:.1f} s, max |VGF - ref| {r.max_abs_vs_reference:.3g}, SQNR {r.sqnr_db:.1f} dB"
            + (f", {r.error}" if r.error else ""))
        on_row(rows)
    return rows


def warm_up(model: str) -> None:
    """Lower `model` stock and ours once (not reported), so that one-off import and
    tracing costs fall on no measured row."""
    module, inputs = load(model)
    calibration = calibration_set(inputs)
    lower_flow(STOCK_FP, module, inputs, calibration)
    lower_flow("ours W", module, inputs, calibration)


HEADER = ("model", "flow", "TOSA", "delegates", "CPU ops", "TOSA ops", "VGF KiB", "lowering s",
          "conversion s", "scenario s", "max abs vs ref", "bit-exact", "SQNR dB")


def table_lines(rows: Sequence[Row]) -> list[str]:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    for r in rows:
        exact = "-" if r.bit_exact is None else ("yes" if r.bit_exact else "no")
        cells = [r.model, r.flow, r.tosa, str(r.delegates), str(r.program_cpu_ops), str(r.tosa_ops),
                 f"{r.vgf_bytes / 1024:.1f}", f"{r.lowering_s:.1f}", f"{r.conversion_s:.2f}",
                 f"{r.scenario_s:.1f}", f"{r.max_abs_vs_reference:.3g}", exact, f"{r.sqnr_db:.1f}"]
        if r.error:
            cells[-1] += f" (failed, {r.error})"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def write_json(rows: Sequence[Row], path: Path, argv: Sequence[str]) -> None:
    from importlib.metadata import version

    from codec_tosa.targets.vgf import converter_version

    doc = {"command": shlex.join(argv),
           "calibration": "example input + 3 seeded random inputs",
           "measured_on": f"a held-out seeded random input (seed {HELD_OUT_SEED})",
           "versions": {**{p: version(p) for p in ("codec_tosa", "torch", "executorch", "torchao")},
                        "model-converter": converter_version()},
           "rows": [asdict(r) for r in rows]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=float))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS),
                   help="built-in model names or path/to/file.py:function (default: %(default)s)")
    p.add_argument("--flows", nargs="+", default=list(FLOWS), choices=FLOWS)
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help="output JSON (default: %(default)s)")
    p.add_argument("--warmup", default=WARMUP_MODEL, help="model lowered once before timing; '' for none")
    args = p.parse_args(argv)
    if args.warmup:
        warm_up(args.warmup)
    command = ["python", "benchmarks/vgf.py", *argv]
    rows: list[Row] = []
    for model in args.models:
        done = list(rows)
        rows = done + bench_model(model, args.flows, log=lambda s: print(s, file=sys.stderr, flush=True),
                                  on_row=lambda partial: write_json(done + partial, args.json, command))
    print("\n".join(table_lines(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
