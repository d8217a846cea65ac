"""4-bit weight codes: per-output-channel symmetric INT4, as Arm's a8w4 quantizes weights.

``code = clamp(round(w / s[c]), -7, 7)`` with ``s[c] = max|w[c]| / 7``: the code
range of Arm's `get_symmetric_a8w4_quantization_config`. Arm's lowering stores a
weight whose quantize has exactly that range as a TOSA INT4 constant
(`FoldAndAnnotateQParamsPass` marks it `TosaSpecialDtype.INT4`, two codes a byte),
and Vela encodes it at 4 bits (docs/DESIGN.md, "Precision per domain"). TOSA's
CONV2D, DEPTHWISE_CONV2D and the linear Arm lowers to it take INT4 weights with
INT8 inputs only (no int16 x int4 form), so a weight read by an INT16 domain
stays INT8.
"""

from __future__ import annotations

import torch

from codec_tosa.codecs.base import ChannelTheta
from codec_tosa.codecs.int8 import learn_symmetric_weight

QMIN4, QMAX4 = -7, 7


class Int4Weight:
    """Per-channel symmetric INT4 weights, held in int8 storage until Arm packs them."""

    code_bits = 4

    def learn_weight(self, weight: torch.Tensor, axis: int = 0) -> ChannelTheta:
        return learn_symmetric_weight(weight, axis, QMAX4)


INT4_WEIGHT_CODEC = Int4Weight()
