"""How far XNNPACK's runtime output is from the plan's simulation, in output steps.

`codec_tosa.validation.simulation` computes what Arm's INT8 lowering computes (TOSA
RESCALE rounding, int32 adds, Arm's fused activations). XNNPACK requantizes
with its own fixed-point arithmetic and quantizes an FP32 bias itself, so its
codes may differ; this measures by how much, on held-out inputs, to decide how
`codec-tosa validate` must treat an XNNPACK .pte (docs/DESIGN.md, "XNNPACK").

For each model: CodecQuantizer(CodecSpec(policy="I", target="xnnpack")), calibrated on the
harness's seeded calibration inputs (benchmarks/xnnpack.py), lowered with XnnpackPartitioner
and run in ExecuTorch's runtime on the held-out inputs; the simulation is
`simulate(quantizer.planned(quantized, XnnpackPartitioner()), x)`. A step is the scale of the
output's decode (the plan's last domain). Per model: the largest and mean |runtime - simulation|
in steps over every output element of every held-out input, the share of elements equal, and
the same for the runtime against FP32 eager (what quantization itself costs, for scale).

Usage: python benchmarks/xnnpack_simulation.py [--models resnet8,ds_cnn] [--held-out 16]
       [--json benchmarks/results/xnnpack_simulation.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

DEFAULT = ("resnet8", "ds_cnn", "mobilenet_v1_025", "deep_autoencoder", "digits_resnet8", "digits_ds_cnn",
           "digits_mobilenet", "digits_vit")


def output_steps(planned) -> list[float]:
    """The scale of each program output's decode in the plan's materialised program."""
    gm = planned.materialized().graph_module
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    steps = []
    for arg in out.args[0]:
        scale = float("nan")
        if "dequantize_per_tensor" in str(getattr(arg, "target", "")):
            scale = float(arg.args[1])
        steps.append(scale)
    return steps


def measure(name: str, n_held: int) -> dict:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    import xnnpack as harness
    from codec_tosa import CodecQuantizer, CodecSpec
    from codec_tosa.validation.simulation import simulate_with_stats

    work = harness.build_workload(name, 8, n_held)
    quantizer = CodecQuantizer(CodecSpec(policy="I", target="xnnpack"))
    quantized = harness.pt2e_quantize(work.module, work.example, work.calibration, quantizer)
    pte = harness.lower_to_xnnpack(quantized)
    planned = quantizer.planned(quantized, XnnpackPartitioner())
    steps = output_steps(planned)
    module = harness.runtime()._load_for_executorch_from_buffer(pte)
    worst, total, equal, count, eager_worst, eager_total = 0.0, 0.0, 0, 0, 0.0, 0.0
    stats = None
    for x in work.held_out:
        sim, stats = simulate_with_stats(planned, list(x))
        got = harness.leaves(module.forward(list(x)))
        with torch.no_grad():
            ref = harness.leaves(work.module(*x))
        for s, g, r, step in zip(sim, got, ref, steps):
            d = (g.double().flatten() - s.double().flatten()).abs() / step
            e = (g.double().flatten() - r.double().flatten()).abs() / step
            worst, total = max(worst, float(d.max())), total + float(d.sum())
            eager_worst, eager_total = max(eager_worst, float(e.max())), eager_total + float(e.sum())
            equal += int((d < 1e-6).sum())
            count += d.numel()
    return {"model": name, "held_out": len(work.held_out), "output_steps": steps,
            "max_steps_vs_simulation": worst, "mean_steps_vs_simulation": total / count,
            "equal_to_simulation": equal / count,
            "max_steps_vs_eager": eager_worst, "mean_steps_vs_eager": eager_total / count,
            "simulated_on_codes": len(stats.integer_ops) if stats else 0,
            "simulated_in_float": len(stats.float_fallbacks) if stats else 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT))
    ap.add_argument("--held-out", type=int, default=16)
    ap.add_argument("--json", type=Path, default=HERE / "results" / "xnnpack_simulation.json")
    args = ap.parse_args()
    results = []
    for name in [m for m in args.models.split(",") if m]:
        try:
            r = measure(name, args.held_out)
        except Exception as exc:  # one model's failure is one line
            r = {"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        results.append(r)
        if "error" in r:
            print(f"{name:<18} FAILED {r['error']}", flush=True)
        else:
            print(f"{name:<18} vs simulation: max {r['max_steps_vs_simulation']:.2f} mean "
                  f"{r['mean_steps_vs_simulation']:.3f} steps, {r['equal_to_simulation']:.1%} equal; "
                  f"vs eager: max {r['max_steps_vs_eager']:.2f} mean {r['mean_steps_vs_eager']:.3f} steps "
                  f"(on codes {r['simulated_on_codes']}, float {r['simulated_in_float']})", flush=True)
    args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "models": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
