"""TOSA RESCALE in integer arithmetic, with the multiplier and shift Arm's lowering picks.

Every INT8 result of Arm's lowering leaves its operator through a RESCALE:
the int32 accumulator of CONV2D / DEPTHWISE_CONV2D / MATMUL, and the int8
codes of a transcode (a ``dq_s -> q_d`` pair). To reproduce the artefact bit
for bit, the simulation (`codec_tosa.validation.simulation`) applies RESCALE as TOSA 1.0
defines it, with the constants Arm serialises (see docs/DESIGN.md, "Validation"):

* the real scale is decomposed as ``scale = multiplier * 2**-shift`` with a
  31-bit multiplier: the mantissa of ``frexp(scale)`` times 2**31, rounded
  half to even (Python's ``round``), renormalised when it rounds up to 2**31,
  and the shift capped at 62 (the multiplier loses low bits instead);
* Arm always asks for ``SINGLE_ROUND``, with 32-bit multipliers for int8, int16
  and int32 inputs and 16-bit ones for the int48 accumulator of an int16
  convolution: ``(v * multiplier + 2**(shift-1)) >> shift`` (an arithmetic
  shift, so ties round half up, towards +inf);
* the input zero point is subtracted before scaling, the output zero point is
  added after it, and the sum saturates to the output type's range.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import torch

_MULTIPLIER_BITS = 31  # scale32: the multiplier is a non-negative int32
_MAX_SHIFT = 62


def multiplier_and_shift(scale: float, multiplier_bits: int = 32) -> tuple[int, int]:
    """(multiplier, shift) with ``multiplier * 2**-shift ~= scale``, as Arm serialises them:
    a 32-bit multiplier (scale32), or a 16-bit one for an int48 input (int16 activations).

    tests/test_simulation.py pins this against Arm's own function.
    """
    if not scale > 0.0 or not math.isfinite(scale):
        raise ValueError(f"RESCALE needs a positive finite scale, got {scale}")
    if multiplier_bits not in (16, 32):
        raise ValueError(f"RESCALE multipliers are 16 or 32 bits, not {multiplier_bits}")
    bits = multiplier_bits - 1  # the multiplier is non-negative
    mantissa, exponent = math.frexp(scale)  # scale = mantissa * 2**exponent, mantissa in [0.5, 1)
    one = 1 << bits
    multiplier = round(mantissa * one)  # exact product; ties to even, like Arm
    if multiplier == one:  # the mantissa rounded up to 1.0
        multiplier //= 2
        exponent += 1
    shift = bits - exponent
    if shift > _MAX_SHIFT:  # a tiny scale: keep the shift legal, drop multiplier bits
        multiplier >>= min(_MULTIPLIER_BITS, shift - _MAX_SHIFT)
        shift = _MAX_SHIFT
    if shift < 2:
        raise ValueError(f"RESCALE scale {scale} is too large for a {multiplier_bits}-bit multiplier")
    return multiplier, shift


def rescale(values: torch.Tensor, scales: Sequence[float], input_zp: int, output_zp: int,
            out_dtype: torch.dtype, channel_axis: int | None = None, multiplier_bits: int = 32) -> torch.Tensor:
    """TOSA RESCALE (SINGLE_ROUND) of integer `values` into `out_dtype` codes, with
    32-bit multipliers (scale32) or, for an int48 accumulator, 16-bit ones.

    `scales` has one entry (per tensor) or one per index of `channel_axis`.
    Works in int64: |value| < 2**32 with multiplier < 2**31, and |value| < 2**48
    with multiplier < 2**15, cannot overflow it.
    """
    v = values.to(torch.int64)
    if input_zp:
        v = v - int(input_zp)
    mult, shift, rounding = _constants(tuple(float(s) for s in scales), multiplier_bits)
    if len(scales) > 1:
        if channel_axis is None:
            raise ValueError("per-channel RESCALE needs the channel axis")
        shape = [1] * v.dim()
        shape[channel_axis] = len(scales)
        mult, shift, rounding = mult.reshape(shape), shift.reshape(shape), rounding.reshape(shape)
    # in place on the one product tensor: these run over every activation of a model
    scaled = v * mult
    scaled += rounding
    scaled.bitwise_right_shift_(shift)  # floor: ties go up
    if output_zp:
        scaled += int(output_zp)
    info = torch.iinfo(out_dtype)
    return scaled.clamp_(info.min, info.max).to(out_dtype)


@functools.lru_cache(maxsize=1024)
def _constants(scales: tuple[float, ...], multiplier_bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per scale, as int64: the multiplier, the shift and the rounding ``2**(shift-1)``.
    Kept (read only): a convolution's per-channel scales come back on every input
    set and every re-simulation, thousands of `multiplier_and_shift` each."""
    pairs = [multiplier_and_shift(s, multiplier_bits) for s in scales]
    mult = torch.tensor([m for m, _ in pairs], dtype=torch.int64)
    shift = torch.tensor([s for _, s in pairs], dtype=torch.int64)
    return mult, shift, torch.bitwise_left_shift(torch.ones_like(shift), shift - 1)


def average(sums: torch.Tensor, counts: torch.Tensor, output_zp: int, out_dtype: torch.dtype) -> torch.Tensor:
    """TOSA's integer AVG_POOL2D division: each window's sum of ``code - input_zp``
    times the reciprocal of its count of in-bounds elements, as the spec's
    ``reciprocal_scale`` gives it (``k = ceil(log2(count))``, multiplier
    ``((2**30 + 1) << k) // count``, shift ``30 + k``), rounded half up by
    ``apply_scale_32``, plus the output zero point, saturated."""
    counts = counts.to(torch.int64)
    k = torch.ceil(torch.log2(counts.to(torch.float64))).to(torch.int64)  # exact: counts are small
    multiplier = torch.div(((1 << 30) + 1) << k, counts, rounding_mode="floor")
    shift = 30 + k
    v = sums.to(torch.int64)
    scaled = torch.bitwise_right_shift(v * multiplier + torch.bitwise_left_shift(torch.ones_like(shift), shift - 1),
                                       shift)
    info = torch.iinfo(out_dtype)
    return torch.clamp(scaled + int(output_zp), info.min, info.max).to(out_dtype)


__all__ = ["average", "multiplier_and_shift", "rescale"]
