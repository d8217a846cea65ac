"""16-bit activation codes: per-tensor symmetric INT16, as Arm's a16w8 quantizes activations.

TOSA lets only int8 (and uint16) operands carry a zero point, so an int16
domain is symmetric: ``code = clamp(round(x / s), -32767, 32767)`` with
``s = HEADROOM * max|x| / 32767``, the code range of Arm's `get_symmetric_a16w8_quantization_config`
(docs/DESIGN.md, "Precision per domain"). The weights such a domain meets stay
INT8: TOSA's CONV2D takes int16 inputs with int8 weights into an int48
accumulator.
"""

from __future__ import annotations

import math

import torch

from codec_tosa.codecs.base import Theta
from codec_tosa.codecs.int8 import TINY_SCALE, ZERO_RANGE_SCALE

QMIN16, QMAX16 = -32767, 32767
# An INT16 domain codes 4x the range it observed: 2 of its 16 bits buy headroom for
# inputs beyond the calibration data, at a step still 64x finer than INT8's. With the
# observed range alone, the digit models' noisy test images saturate (digits ResNet-8:
# 29.9 dB against FP32, stock a16w8 38.6; with 4x 38.6), where INT8's step is what
# limits it (docs/results/precision.md, "Precision per domain").
HEADROOM = 4.0


class Int16Symmetric:
    """Per-tensor symmetric INT16 activations (zero point 0)."""

    code_bytes = 2

    def learn(self, lo: float, hi: float) -> Theta:
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"observed range [{lo}, {hi}] is not finite")
        amax = max(abs(lo), abs(hi)) * HEADROOM
        scale = max(amax / QMAX16, TINY_SCALE) if amax > 0 else ZERO_RANGE_SCALE
        return Theta(float(scale), 0, QMIN16, QMAX16, torch.int16)


INT16_CODEC = Int16Symmetric()
