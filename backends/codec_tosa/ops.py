"""codec_tosa's own operators: RMSNorm and rotary embedding as single operators.

Exported transformer graphs spell RMSNorm and RoPE as chains of elementwise
core-ATen operators; the analysis treats each as one FP32 operator that reads
its inputs once and writes its output once (docs/DESIGN.md, "Standalone
operators"). `_passes/fuse_standalone_ops.py` rewrites the chains into calls
of these operators:

* ``codec_tosa::rms_norm(x, weight, eps)`` = ``weight * (x * rsqrt(mean(x**2, -1) + eps))``
* ``codec_tosa::rope(x, cos, sin)`` = ``x * cos + cat(-x2, x1) * sin`` where
  ``x1, x2`` are the two halves of ``x``'s last dimension.

The eager kernels perform the same operations in the same order as the
subgraphs they replace, so a rewritten graph computes bit-identical outputs.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("codec_tosa::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


@rms_norm.register_fake
def _rms_norm_fake(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x.new_empty(torch.broadcast_shapes(x.shape, weight.shape))


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@torch.library.custom_op("codec_tosa::rope", mutates_args=())
def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + _rotate_half(x) * sin


@rope.register_fake
def _rope_fake(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x.new_empty(torch.broadcast_shapes(x.shape, cos.shape, sin.shape))


RMS_NORM = torch.ops.codec_tosa.rms_norm.default
ROPE = torch.ops.codec_tosa.rope.default

__all__ = ["RMS_NORM", "ROPE", "rms_norm", "rope"]
