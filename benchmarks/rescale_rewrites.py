"""Can an INT8 TOSA for Ethos-U have fewer RESCALEs than Arm's stock one, and does Vela reward it?

Arm's stock INT8 flow puts one RESCALE after every convolution (and more
around an ADD), and no INT8 lowering can drop the one that requantises a
convolution's int32 accumulator. This benchmark takes the TOSA the stock flow
gives Vela for two small blocks, rewrites it to carry fewer RESCALEs in the
only ways left, and measures what Vela makes of each:

* Inception-A (torchvision `InceptionA(192, pool_features=32)`, 35x35, NCHW):
  (A) the sibling 1x1 convolutions reading the block input merged into one
  CONV2D + one per-channel RESCALE + SLICEs; (A2) the same without the
  sibling whose output goes straight into the CONCAT. Both bit-exact.
* ResNet basic block (`BasicBlock(64, 64)`, 64x64, channels_last input, so
  no TRANSPOSEs): (B) conv -> RESCALE(int32->int8) -> RESCALE(int8->int32) ->
  ADD folded into conv -> RESCALE(int32->int32) -> ADD; (C) the residual's
  RESCALE(int8->int32) into the ADD replaced by a CAST, its power-of-two scale
  moved to the ADD's other input and output RESCALEs; (B+C) both. Not
  bit-exact by construction; the deviation from stock is reported in LSB.

The rewrites are `benchmarks/_tosa_edit.py`'s. Per target (ethos-u55-128,
ethos-u85-256) and variant: RESCALE and CAST count of the TOSA
(`serialization/tosa_stats.py`); Vela's cycles, off-chip bytes, SRAM and NPU
operators (the flags of Arm's `EthosUCompileSpec`, Vela's summary) and its
per-layer cycles by operator (JSON only); the largest output difference from
stock on the TOSA reference model over held-out random int8 inputs, and
whether every output is bit-identical. Weights are random (seed 0) with
batch-norm statistics drawn uniformly, so that no batch norm is the
identity; the stock flow is calibrated on the example input and 3 seeded
random ones (`benchmarks/ethos_u.py`'s `run_stock`).

Usage::

    python benchmarks/rescale_rewrites.py [--samples 4] [--json benchmarks/results/rescale_rewrites.json]
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import sys
import tempfile
import time
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

import _tosa_edit as edit

TARGETS = ("ethos-u55-128", "ethos-u85-256")
HELD_OUT_SEED = 1234
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "rescale_rewrites.json"


@dataclass
class Row:
    target: str
    block: str
    variant: str
    rescales: int
    casts: int
    cycles: int
    cycles_vs_stock_pct: float
    off_chip_bytes: int
    sram_bytes: int
    npu_ops: int
    max_dev_lsb: int
    bit_exact: bool
    # JSON only
    places_rewritten: int = 0
    frac_outputs_differing: float = 0.0
    cycles_by_operator: dict[str, tuple[int, int]] = field(default_factory=dict)


TABLE = ["target", "block", "variant", "rescales", "casts", "cycles", "cycles_vs_stock_pct", "off_chip_bytes",
         "sram_bytes", "npu_ops", "max_dev_lsb", "bit_exact"]


def blocks() -> dict[str, tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """Both blocks, seeded; batch-norm statistics and affine drawn so none is the identity."""
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    from torchvision.models.inception import InceptionA
    from torchvision.models.resnet import BasicBlock

    torch.manual_seed(0)
    inception, resblock = InceptionA(192, pool_features=32).eval(), BasicBlock(64, 64).eval()
    for m in (inception, resblock):
        for bn in m.modules():
            if isinstance(bn, torch.nn.BatchNorm2d):
                bn.running_mean.uniform_(-0.2, 0.2)
                bn.running_var.uniform_(0.5, 1.5)
                bn.weight.data.uniform_(0.5, 1.5)
                bn.bias.data.uniform_(-0.2, 0.2)
    x_inception, x_resblock = torch.randn(1, 192, 35, 35), torch.randn(1, 64, 64, 64)
    return {"inception_a": (inception, (x_inception,)),
            "basic_block_cl": (resblock.to(memory_format=torch.channels_last),
                               (x_resblock.to(memory_format=torch.channels_last),))}


# variant -> (block, rewrite of a loaded graph returning the places changed)
VARIANTS: dict[str, tuple[str, Callable[[edit.Graph], int]]] = {
    "round trip": ("", lambda g: 0),
    "A": ("inception_a", edit.merge_sibling_convs),
    "A2": ("inception_a", lambda g: edit.merge_sibling_convs(g, skip_concat_fed=True)),
    "B": ("basic_block_cl", edit.fold_requantize),
    "C": ("basic_block_cl", edit.cast_residual),
    "B+C": ("basic_block_cl", lambda g: edit.fold_requantize(g) + edit.cast_residual(g)),
}


def vela(buf: bytes, flags: list[str]) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """Vela on a TOSA flatbuffer: (vela_report of its summary, per-layer cycles by operator)."""
    from ethosu.vela.vela import main as vela_main
    from vela_per_operator import per_operator_in

    from codec_tosa.targets.ethosu.vela_summary import read_vela_summary, vela_operator_counts, vela_report

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "net.tosa"
        path.write_bytes(buf)
        log = io.StringIO()
        with redirect_stdout(log):
            rc = vela_main([*flags, "--verbose-performance", f"--output-dir={d}/out", str(path)])
        if rc:
            raise RuntimeError(f"Vela exit code {rc}: {log.getvalue()[-500:]}")
        run = {"summary": read_vela_summary(f"{d}/out"), "operators": vela_operator_counts(log.getvalue())}
        return vela_report([run]), per_operator_in(f"{d}/out")


def count(buf: bytes, op: str) -> int:
    from codec_tosa.serialization.tosa_stats import tosa_stats

    return tosa_stats(buf).operators_by_type.get(op, 0)


def held_out_inputs(buf: bytes, samples: int) -> list[list[np.ndarray]]:
    """Random int8 inputs over the full range, seeded, for the block's inputs."""
    from codec_tosa.serialization.tosa_stats import entry_io_tensors

    rng = np.random.default_rng(HELD_OUT_SEED)
    inputs, _ = entry_io_tensors(buf)
    assert all(t.dtype == "INT8" for t in inputs), [t.dtype for t in inputs]
    return [[rng.integers(-128, 128, size=t.shape, dtype=np.int8) for t in inputs] for _ in range(samples)]


def measure(target: str, block: str, stock: bytes, samples: int) -> list[Row]:
    """Stock and every variant of `block` for `target`."""
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.validation.reference_model import run_reference_model

    flags = list(arm_adapter.ethos_u_compile_spec(target).compiler_flags)
    xs = held_out_inputs(stock, samples)
    reference = [run_reference_model(stock, x, "stock") for x in xs]
    rows: list[Row] = []
    for variant, (only, rewrite) in [("stock", ("", lambda g: 0)), *VARIANTS.items()]:
        if only and only != block:
            continue
        buf = stock
        places = 0
        if variant != "stock":
            g = edit.load(stock)
            places = rewrite(g)
            buf = g.emit()
        diffs = np.concatenate([np.abs(o.astype(np.int64) - r.astype(np.int64)).ravel()
                                for x, ref in zip(xs, reference)
                                for o, r in zip(run_reference_model(buf, x, variant), ref)])
        report, by_op = vela(buf, flags)
        base = rows[0].cycles if rows else report["cycles_total"]
        rows.append(Row(target, block, variant, count(buf, "RESCALE"), count(buf, "CAST"), report["cycles_total"],
                        100.0 * (report["cycles_total"] - base) / base, report["off_chip_bytes"],
                        report["sram_bytes"], report["npu_ops"], int(diffs.max()), bool((diffs == 0).all()),
                        places, float((diffs != 0).mean()), by_op))
        print(f"[{target} {block} {variant}] {rows[-1].cycles} cycles, {rows[-1].rescales} RESCALEs",
              file=sys.stderr, flush=True)
    return rows


def markdown(rows: list[Row]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, bool):
            return "yes" if v else "no"
        return f"{v:+.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(TABLE) + " |", "|" + "---|" * len(TABLE)]
    lines += ["| " + " | ".join(cell(getattr(r, c)) for c in TABLE) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=4, help="held-out random int8 inputs for the reference model")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = p.parse_args(argv)

    from ethos_u import run_stock

    from codec_tosa.planning.calibration import random_calibration
    from codec_tosa.quiet import quiet

    t0 = time.perf_counter()
    rows: list[Row] = []
    stock_flow_cycles: dict[str, int] = {}
    with quiet():  # the serializer's version notes and torch's deprecations
        for block, (module, inputs) in blocks().items():
            calib = [inputs] + random_calibration(inputs, 3)
            with torch.no_grad():
                eager = [module(*inputs)]
            for target in TARGETS:
                flow = run_stock(block, target, module, inputs, calib, [inputs], eager)
                assert len(flow.tosa) == 1, f"{block}: {len(flow.tosa)} delegates"
                new = measure(target, block, flow.tosa[0], args.samples)
                # Vela run here on the stock TOSA must be the stock flow's own Vela run
                assert new[0].cycles == flow.cycles, (new[0].cycles, flow.cycles)
                # and a load/emit round trip without edits must not change Vela's work
                assert new[1].variant == "round trip" and new[1].cycles == flow.cycles, (new[1].cycles, flow.cycles)
                stock_flow_cycles[f"{block} {target}"] = flow.cycles
                rows += new
    rows = [r for r in rows if r.variant != "round trip"]
    rows.sort(key=lambda r: r.target)  # stable: Inception-A, then the basic block
    seconds = time.perf_counter() - t0
    args.json.write_text(json.dumps({
        "command": shlex.join(["python", "benchmarks/rescale_rewrites.py", *argv]),
        "held_out_seed": HELD_OUT_SEED, "samples": args.samples, "seconds": round(seconds, 1),
        "stock_flow_cycles": stock_flow_cycles, "rows": [asdict(r) for r in rows]}, indent=1))
    print(markdown(rows))
    print(f"\n{seconds:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
