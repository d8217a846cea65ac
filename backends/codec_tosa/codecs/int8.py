"""The default codec: per-tensor asymmetric INT8 for activations, per-channel
symmetric INT8 for weights."""

from __future__ import annotations

import math

import torch

from codec_tosa.codecs.base import ChannelTheta, Theta

QMIN, QMAX = -128, 127
# an INT8 convolution's int32 bias codes (symmetric, as PT2E's bias qspec)
INT32_QMIN, INT32_QMAX = -(2**31) + 1, 2**31 - 1
# Floor of the scale of a tiny, non-zero range: float32's epsilon, as PT2E's
# observers use. A smaller floor lets an INT8 convolution's int32 bias codes
# (bias / (s_in * s_w)) overflow: InceptionV3 with random weights reaches its
# head with activations of about 1e-6, and a 1e-8 scale there clamped the
# head's bias and overflowed its int32 accumulator (44 steps off).
TINY_SCALE = float(torch.finfo(torch.float32).eps)
# An all-zero tensor (observed range [0, 0]) is coded exactly by any scale. It gets
# 1.0, not the floor: an INT8 conv/linear stores its bias as int32 codes at scale
# s_in * s_w, and s_in = 1e-8 would overflow int32 (the bias clamped, silently wrong).
ZERO_RANGE_SCALE = 1.0
# An asymmetric range that is nearly symmetric gets zero point 0 when that
# coarsens the step by at most this factor: SQNR drops by at most
# 20*log10(1 + 1/32) = 0.27 dB there, and its encode and decode each lose a
# RESCALE and 4 bytes per element (docs/DESIGN.md, "Codec lowering").
NEAR_SYMMETRIC = 1 + 1 / 32


class Int8Affine:
    """Per-tensor INT8 activations; `symmetric` pins the zero point to 0, and
    an asymmetric range within `NEAR_SYMMETRIC` of symmetric gets it too unless
    `near_symmetric` is off (inside an integer delegate, where a zero point
    costs nothing, the snap would only lose the step's 1/32).

    Symmetric thetas use scale max|x| / 127 and keep the full code range
    [-128, 127]: the z = 0 encode is MUL -> CAST f32->int8, and that CAST
    saturates to exactly [-128, 127], so the extra code -128 costs nothing,
    whereas a [-127, 127] range would need a CLAMP after every encode to stay
    bit-exact with `quantize_per_tensor` (docs/DESIGN.md, "Codec lowering").
    """

    code_bytes = 1

    def __init__(self, symmetric: bool = False, near_symmetric: bool = True) -> None:
        self.symmetric = symmetric
        self.near_symmetric = near_symmetric

    def learn(self, lo: float, hi: float) -> Theta:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"observed range [{lo}, {hi}] is not finite")
        if self.symmetric:
            return self._learn_symmetric(max(abs(lo), abs(hi)))
        # the range must contain 0 so that zero (padding, ReLU floor) is exact
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        span = hi - lo
        scale = max(span / (QMAX - QMIN), TINY_SCALE) if span > 0 else ZERO_RANGE_SCALE
        if self.near_symmetric and span > 0 and lo < 0 < hi:
            centred = max(lo / QMIN, hi / QMAX, TINY_SCALE)  # z = 0 and the full code range
            if centred <= NEAR_SYMMETRIC * scale:
                return Theta(float(centred), 0, QMIN, QMAX, torch.int8)
        zero_point = int(round(QMIN - lo / scale))
        zero_point = max(QMIN, min(QMAX, zero_point))
        return Theta(float(scale), zero_point, QMIN, QMAX, torch.int8)

    def _learn_symmetric(self, amax: float) -> Theta:
        scale = max(amax / QMAX, TINY_SCALE) if amax > 0 else ZERO_RANGE_SCALE
        return Theta(float(scale), 0, QMIN, QMAX, torch.int8)

    def learn_weight(self, weight: torch.Tensor, axis: int = 0) -> ChannelTheta:
        return learn_symmetric_weight(weight, axis, QMAX)


def learn_symmetric_weight(weight: torch.Tensor, axis: int, qmax: int) -> ChannelTheta:
    """Per-channel symmetric codes in [-qmax, qmax] along `axis`: s[c] = max|w[c]| / qmax."""
    dims = [d for d in range(weight.dim()) if d != axis]
    amax = weight.detach().abs().amax(dim=dims) if dims else weight.detach().abs()
    scales = torch.clamp(amax.float() / qmax, min=TINY_SCALE)
    scales = torch.where(amax == 0, ZERO_RANGE_SCALE, scales)  # an all-zero channel
    return ChannelTheta(scales, axis, -qmax, qmax, torch.int8)


DEFAULT_CODEC = Int8Affine()
SYMMETRIC_CODEC = Int8Affine(symmetric=True)
# every zero point as the range asks (no near-symmetric snap): the integer targets'
EXACT_ZERO_POINT_CODEC = Int8Affine(near_symmetric=False)
