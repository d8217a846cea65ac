"""How far Arm's TOSA decompositions of FP32 operators land from PyTorch's own.

`simulate()` runs the FP32 operators between codecs in eager PyTorch; the
artefact runs Arm's decomposition of each on the TOSA reference model (LayerNorm
as REDUCE_SUM, RSQRT, MUL...; softmax as EXP, REDUCE_SUM, RECIPROCAL; GELU's
erf as a polynomial). Where such a value is encoded next, the two can round to
different codes. validate's ambiguity-aware criterion (docs/DESIGN.md,
"Validation") treats a code as ambiguous when its FP32 value lies within
``EPS * max|value|`` of a rounding boundary; this script measures that ratio.

For each operator, shaped as in the 2-layer ViT (`vit_tiny`), it lowers the
operator alone at policy Z (stock Arm TOSA-1.0+FP), runs the TOSA reference
model on held-out random inputs at several input scales, and reports per
operator the worst ``max|reference model - eager| / (kappa * max|eager|)`` over
the inputs (one figure per tensor: the form of the bound the criterion uses;
kappa is `rounding_ambiguity.layer_norm_condition` for a layer norm, whose
inputs here include means up to 10 times their spread, else 1), the worst
per-element relative error, and the same in float32 ulps (2**-23).

Usage::

    python benchmarks/fp32_error.py [--samples 64] [--json benchmarks/results/fp32_error.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

ULP = 2.0 ** -23


class _Op(nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _layer_norm() -> nn.Module:
    gen = torch.Generator().manual_seed(1)
    ln = nn.LayerNorm(64)
    with torch.no_grad():
        ln.weight.copy_(1 + 0.2 * torch.randn(64, generator=gen))
        ln.bias.copy_(0.2 * torch.randn(64, generator=gen))
    return ln


# name, module, input shape, input scales (the ViT's residual stream, attention
# logits and MLP activations span roughly these), input offset (in units of the spread)
OPERATORS: list[tuple[Any, ...]] = [
    ("layer_norm", _layer_norm, (1, 17, 64), (0.1, 1.0, 10.0)),
    ("layer_norm, mean 3x spread", _layer_norm, (1, 17, 64), (0.1, 1.0, 10.0), 3.0),
    ("layer_norm, mean 10x spread", _layer_norm, (1, 17, 64), (0.1, 1.0, 10.0), 10.0),
    ("softmax", lambda: _Op(lambda x: torch.softmax(x, dim=-1)), (1, 4, 17, 17), (0.05, 1.0, 5.0)),
    ("gelu (erf)", lambda: _Op(nn.functional.gelu), (1, 17, 128), (0.3, 1.0, 4.0)),
    ("sigmoid", lambda: _Op(torch.sigmoid), (1, 17, 128), (0.3, 1.0, 4.0)),
    ("tanh", lambda: _Op(torch.tanh), (1, 17, 128), (0.3, 1.0, 4.0)),
    ("exp", lambda: _Op(torch.exp), (1, 17, 128), (0.3, 1.0, 4.0)),
    ("hardswish", lambda: _Op(nn.functional.hardswish), (1, 17, 128), (0.3, 1.0, 4.0)),
    ("mean (dim -1)", lambda: _Op(lambda x: x.mean(dim=-1, keepdim=True)), (1, 17, 64), (0.3, 1.0, 4.0)),
]


def stock_fp_payload(module: nn.Module, example: torch.Tensor) -> bytes:
    """The operator lowered alone at policy Z (Arm's own FP32 TOSA)."""
    from executorch.exir import to_edge_transform_and_lower

    from codec_tosa import CodecSpec, CodecTosaPartitioner
    from codec_tosa.runtime.pte import delegate_payload

    ep = torch.export.export(module.eval(), (example,))
    part = CodecTosaPartitioner(CodecSpec(policy="Z"), calibration=[(example,)])
    edge = to_edge_transform_and_lower(ep, partitioner=[part])
    return delegate_payload(edge.to_executorch().buffer)


def measure(name: str, build: Callable[[], nn.Module], shape: tuple[int, ...], scales: tuple[float, ...],
            samples: int, offset: float = 0.0) -> dict[str, float | str | int]:
    from codec_tosa.validation.rounding_ambiguity import layer_norm_condition
    from codec_tosa.validation.reference_model import run_reference_model

    module = build().eval()
    gen = torch.Generator().manual_seed(7_919)
    payload = stock_fp_payload(module, torch.randn(shape, generator=gen))
    per_tensor = per_element = 0.0
    count = 0
    for s in range(samples):
        x = (torch.randn(shape, generator=gen) + offset) * scales[s % len(scales)]
        kappa = layer_norm_condition([(x, 0.0), (shape[-1], 0.0)]) if isinstance(module, nn.LayerNorm) else 1.0
        with torch.no_grad():
            want = module(x).numpy().astype(np.float64)
        got = run_reference_model(payload, [x.numpy()])[0].reshape(want.shape).astype(np.float64)
        err = np.abs(got - want)
        per_tensor = max(per_tensor, float(err.max() / max(kappa * np.abs(want).max(), 1e-30)))
        nz = np.abs(want) > 0
        per_element = max(per_element, float((err[nz] / np.abs(want[nz])).max()))
        count += want.size
    return {"operator": name, "elements": count, "max_err_over_max_abs": per_tensor,
            "ulps_of_max_abs": per_tensor / ULP, "max_err_over_abs": per_element,
            "ulps_of_abs": per_element / ULP}


def main(argv: list[str] | None = None) -> None:
    from codec_tosa.quiet import quiet

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "fp32_error.json")
    args = p.parse_args(argv)
    rows = []
    with quiet():
        for name, build, shape, scales, *offset in OPERATORS:
            rows.append(measure(name, build, shape, scales, args.samples, *offset))
    print(f"Arm's TOSA decomposition (reference model) vs eager PyTorch, {args.samples} held-out inputs "
          "per operator\n")
    print("| operator | elements | max err / (kappa max\\|eager\\|) | = ulps | max err / \\|eager\\| (per element) "
          "| = ulps |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['operator']} | {r['elements']} | {r['max_err_over_max_abs']:.3g} | "
              f"{r['ulps_of_max_abs']:.1f} | {r['max_err_over_abs']:.3g} | {r['ulps_of_abs']:.1f} |")
    args.json.write_text(json.dumps({"samples": args.samples, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
