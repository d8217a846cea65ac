"""Where the artefact may legitimately encode a different code than the simulation.

`simulate()` reproduces the artefact's integer arithmetic exactly, but runs the
FP32 operators between codecs in eager PyTorch, while the artefact runs Arm's
TOSA decomposition of each (LayerNorm, softmax, erf/GELU, sigmoid, means...).
Those land up to a few float32 ulps away from PyTorch's result, so an encode
reading such a value can round the other way when the value lies that close to
a rounding boundary (docs/DESIGN.md, "Validation").

This module holds the facts the simulation needs to find those codes:

* which operators the artefact computes bit-identically in IEEE float32
  (`EXACT_OPERATORS`: elementwise add/sub/mul, selections, layout, casts):
  everything else is a source of disagreement;
* `FP32_EPS`, the bound on that disagreement: ``|artefact - eager| <=
  FP32_EPS * kappa * max|eager|`` over the operator's output tensor, where
  kappa is 1 except for a layer norm, whose decomposition subtracts a rounded
  mean: there kappa = max|x| / max|x - mean(x)| (the cancellation it suffers).
  `benchmarks/fp32_error.py` measured at most 4.2 ulps (2**-23) of
  ``kappa * max|eager|`` over LayerNorm (inputs with means up to 10 times
  their spread), softmax, GELU (erf), sigmoid, tanh, exp, hardswish and a
  mean; the margin, 16 ulps, is about 4 times that;
* `error_bound`, how an operator carries its inputs' bounds to its output
  (first order: add/sub add them, mul scales them by the other operand's
  magnitude, a selection keeps the largest, an inexact operator adds its own
  to its inputs' relative error);
* `ambiguous_codes`, the elements of an encode within that bound of a rounding
  boundary, with the code the artefact would give on the other side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from codec_tosa.commutation.operators import (
    ACOSH, ASINH, ATAN, COSH, GROUP_NORM, LAYER_NORMS, PRODUCTS, SELECTIONS, SINH, SUMS,
)

ULP = 2.0 ** -23
# about 4x the worst disagreement benchmarks/fp32_error.py measured (4.2 ulps of kappa * max|eager|)
FP32_EPS = 16 * ULP

# computed by the artefact exactly as by eager PyTorch, given the same inputs
EXACT_OPERATORS = SELECTIONS | SUMS | PRODUCTS


def _asinh(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # DecomposeAsinhPass: log(x + sqrt(x * x + 1)), the sqrt a pow by DecomposeSqrtPass;
    # the pow's rounding moves the log's argument (none where x * x + 1 rounds to 1)
    t1 = x * x + 1.0
    t2 = torch.pow(t1, 0.5)
    t3 = x + t2
    return torch.log(t3), torch.where(t1 == 1.0, 0.0, t2 / t3)


def _acosh(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # DecomposeAcoshPass: log(x + sqrt((x - 1) * (x + 1)))
    t2 = torch.pow((x - 1.0) * (x + 1.0), 0.5)
    t3 = x + t2
    return torch.log(t3), t2 / t3


def _sinh(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # DecomposeSinhPass: (exp(x) - exp(-x)) * 0.5, which cancels near 0: the exps'
    # rounding is relative to cosh(x), not to the output
    e1, e2 = torch.exp(x), torch.exp(-x)
    return (e1 - e2) * 0.5, (e1 + e2) * 0.5


def _cosh(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # DecomposeCoshPass: (exp(x) + exp(-x)) * 0.5
    out = (torch.exp(x) + torch.exp(-x)) * 0.5
    return out, torch.zeros_like(out)


def _atan(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # DecomposeAtanPass: a (2,1) Pade approximation on [0, 1], 1e-4 from torch's atan
    # (about 1,400 ulps at x = 1), with atan(x) = pi/2 - atan(1/x) above 1, odd
    abs_x = x.abs()
    above = abs_x > 1.0
    z = torch.where(above, torch.reciprocal(abs_x), abs_x)
    z2 = z * z
    z4 = z2 * z2
    num = (z2 * _f32(0.3529666667) + 1.0) + z4 * _f32(-0.0287666667)
    den = z2 * _f32(0.6863) + 1.0
    atan_z = z * (num * torch.reciprocal(den))
    half_pi = x * 0.0 + _f32(math.pi / 2)
    atan_abs = torch.where(above, half_pi - atan_z, atan_z)
    out = torch.where(x > 0.0, atan_abs, -atan_abs)
    return out, torch.zeros_like(out)


def _f32(value: float) -> torch.Tensor:
    """A Python float as Arm passes it to the TOSA graph: a float32 constant."""
    return torch.tensor(value, dtype=torch.float32)


# FP32 operators Arm's passes rewrite into others (executorch 1.5.1), where the
# artefact's result differs from PyTorch's by more than FP32_EPS of the output:
# each gives the output computed step by step in float32 as Arm's pass builds it
# (the simulation's value; torch's asinh of 1e-6 is 7 steps of its codes away)
# and, per element, what the steps' rounding is relative to besides |output|
FP32_DECOMPOSITIONS: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]] = {
    ASINH: _asinh, ACOSH: _acosh, SINH: _sinh, COSH: _cosh, ATAN: _atan,
}


def _max_abs(value: Any) -> float:
    t = first_float_tensor(value)
    return float(t.detach().abs().max()) if t is not None and t.numel() else 0.0


def first_float_tensor(value: Any) -> torch.Tensor | None:
    """The value itself, or the first floating-point tensor of a tuple output."""
    if isinstance(value, torch.Tensor):
        return value if value.is_floating_point() else None
    if isinstance(value, (list, tuple)):
        return next((t for t in (first_float_tensor(v) for v in value) if t is not None), None)
    return None


def error_bound(key: str, out: Any, operands: Sequence[tuple[Any, float]],
                magnitude: float | None = None) -> float:
    """Bound on |artefact - eager| over `out`, the value of operator `key`, whose
    operands are (value, its bound) pairs (non-tensor operands with bound 0).
    `magnitude`: what an inexact operator's own rounding is relative to (None:
    max|out|; an FP32_DECOMPOSITIONS operator's, from its steps)."""
    if first_float_tensor(out) is None:
        return 0.0  # masks, indices: not encoded
    bounds = [b for _, b in operands]
    if key in SELECTIONS:
        return max(bounds, default=0.0)
    if key in SUMS:
        return sum(bounds)
    if key in PRODUCTS:
        if not any(bounds):
            return 0.0
        mags = [_max_abs(v) if isinstance(v, torch.Tensor) else abs(float(v)) if isinstance(v, (int, float))
                else 0.0 for v, _ in operands]
        # |a b - a' b'| <= |b| da + |a| db + da db, for two operands
        if len(operands) == 2:
            (da, db), (ma, mb) = bounds, mags
            return mb * da + ma * db + da * db
        return sum(bounds) * max(mags, default=1.0)
    # an operator Arm decomposes: its own disagreement plus its inputs', carried
    # as relative error (first order; no Lipschitz constant is known in general)
    rel_in = sum(b / m for (v, b) in operands if b for m in [_max_abs(v)] if m > 0)
    kappa = layer_norm_condition(operands) if key in LAYER_NORMS else 1.0
    own = _max_abs(out) if magnitude is None else magnitude
    if key == GROUP_NORM and magnitude is None:
        own = max(own, group_norm_magnitude(operands, out))
    return FP32_EPS * kappa * own + rel_in * _max_abs(out)


def layer_norm_condition(operands: Sequence[tuple[Any, float]]) -> float:
    """max|x| / max|x - mean(x)| over the normalised dimensions: how much the
    rounding of the mean costs a layer norm's output (1 for a centred input)."""
    x, shape = operands[0][0], [v for v, _ in operands[1:] if isinstance(v, int) and not isinstance(v, bool)]
    if not isinstance(x, torch.Tensor) or not x.numel():
        return 1.0
    dims = tuple(range(x.dim() - max(len(shape), 1), x.dim()))
    x = x.detach().to(torch.float64)
    spread = float((x - x.mean(dim=dims, keepdim=True)).abs().max())
    return max(1.0, float(x.abs().max()) / spread) if spread > 0 else 1.0


def group_norm_magnitude(operands: Sequence[tuple[Any, float]], out: Any) -> float:
    """max|x| * max rstd * max(1, |weight|): what the rounding of a group norm's
    mean is relative to before (x - mean) cancels. Unlike a layer norm's kappa it
    stays finite where a group is constant (x - mean is 0, the output pure FP32
    noise: Arm's GroupNorm(6, 6) on [4, 6] cases); the weight is the first tensor
    operand after x, or 1 (a bias taken for it only widens the bound)."""
    if not isinstance(out, (tuple, list)) or len(out) < 3 or not operands:
        return 0.0
    x, rstd = operands[0][0], out[2]
    if not isinstance(x, torch.Tensor) or not isinstance(rstd, torch.Tensor) or not x.numel():
        return 0.0
    w = next((v for v, _ in operands[1:3] if isinstance(v, torch.Tensor)), None)
    return _max_abs(x) * _max_abs(rstd) * max(1.0, _max_abs(w) if w is not None else 1.0)


@dataclass(frozen=True)
class AmbiguousCode:
    """One element of an encode that the artefact may round the other way."""

    node: str  # the quantize node of the materialised program
    index: int  # flat index into its output
    code: int  # the simulation's code
    alternative: int  # the code on the other side of the boundary
    distance: float  # from the boundary, in quantisation steps
    margin: float  # the bound on the disagreement, in quantisation steps


def ambiguous_codes(node: str, x: torch.Tensor, codes: torch.Tensor, bound: float, scale: float,
                    zero_point: int, qmin: int, qmax: int) -> list[AmbiguousCode]:
    """The elements of `codes` = quantize(x) whose x lies within `bound` of a
    rounding boundary, so that an x' with |x' - x| <= bound may encode differently."""
    if bound <= 0 or not x.numel():
        return []
    inv_scale = 1.0 / scale
    # x * inv_scale in float32 as quantized_decomposed computes it, then exactly in float64
    t = (x.detach().to(torch.float32) * inv_scale).to(torch.float64).reshape(-1)
    nearest = torch.round(t)
    distance = 0.5 - (t - nearest).abs()
    # the margin in steps, plus the ulp of t the product rounds to
    margin = bound * inv_scale * (1 + 2 ** -20) + t.abs() * ULP
    near = torch.nonzero(distance <= margin).reshape(-1)
    code = codes.reshape(-1)[near].to(torch.int64)
    step = torch.where(t[near] >= nearest[near], 1, -1)
    alternative = torch.clamp(code + step, qmin, qmax)
    moves = alternative != code  # a code at a bound has no other side
    rows = zip(near[moves].tolist(), code[moves].tolist(), alternative[moves].tolist(),
               distance[near][moves].tolist(), margin[near][moves].tolist())
    return [AmbiguousCode(node, i, c, a, d, m) for i, c, a, d, m in rows]


__all__ = ["AmbiguousCode", "EXACT_OPERATORS", "FP32_DECOMPOSITIONS", "FP32_EPS", "ambiguous_codes", "error_bound",
           "group_norm_magnitude",
           "first_float_tensor"]
