"""Exact sums of integer products (convolution, linear, matmul) at float32 speed.

The simulation accumulates ``sum((x - zp_x) * (w - zp_w))`` exactly, as the
artefact's int32 (or int48) accumulator does. float64 holds every partial sum
exactly (integers below 2**53), but PyTorch's float64 convolution takes a slow
path on the CPU, and it dominated the reference stage of big models
(DeepLabV3: 3.6 s per input set).

float32 is exact too, as long as every partial sum stays an integer below
2**24: each product is then exact, and so is every sum of them, in any order
and with or without fused multiply-adds. With ``P = max|x| * max|w|``, a sum
of ``k`` products stays below ``k * P``. So the reduction (input channels, or
the inner dimension) is cut into chunks of ``k`` terms with ``k * P < 2**24``,
each chunk is evaluated in float32, and the chunks are added in float64
(exact again). That bound leaves about 500 products per chunk for int8
activations; for int16 activations it leaves a handful, too few to gain
anything, and the float64 evaluation is kept.

This needs the float32 kernels to compute the sum of products directly (as
PyTorch's direct and im2col convolutions and its GEMMs do), not through a
transform that rounds (Winograd, FFT); tests/tools/test_integer_products.py
checks the result against float64 on held-out shapes and ranges.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

_EXACT_FLOAT32 = 2.0 ** 24
# below this many products per output and chunk, float64 is as fast (measured
# here on ResNet-50 shapes: 27-36 products per chunk break even, 513 are 5x faster)
_MIN_PRODUCTS_PER_CHUNK = 128


def _terms_per_chunk(x: torch.Tensor, w: torch.Tensor, taps: int) -> int:
    """How many reduction rows (each `taps` products) one float32 evaluation may sum exactly."""
    bound = _max_abs(x) * _max_abs(w)
    if bound == 0.0:
        return 1 << 62
    return int((_EXACT_FLOAT32 - 1) // (bound * taps))


def _max_abs(t: torch.Tensor) -> float:
    if not t.numel():
        return 0.0
    low, high = torch.aminmax(t)  # no |t| temporary
    return max(-float(low), float(high))


def _chunked(x: torch.Tensor, w: torch.Tensor, rows: int, x_dim: int, w_dim: int, taps: int,
             op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
             float64: Callable[[], torch.Tensor]) -> torch.Tensor:
    per_chunk = _terms_per_chunk(x, w, taps)
    if per_chunk < rows and per_chunk * taps < _MIN_PRODUCTS_PER_CHUNK:
        return float64()
    x32, w32 = x.to(torch.float32), w.to(torch.float32)
    if per_chunk >= rows:
        return op(x32, w32).to(torch.float64)
    total: torch.Tensor | None = None
    for start in range(0, rows, per_chunk):
        part = op(x32.narrow(x_dim, start, min(per_chunk, rows - start)),
                  w32.narrow(w_dim, start, min(per_chunk, rows - start))).to(torch.float64)
        total = part if total is None else total + part
    assert total is not None
    return total


def convolution(x: torch.Tensor, w: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], groups: int) -> torch.Tensor:
    """``aten.convolution`` (not transposed, no bias) of integer-valued float64
    tensors, exactly, as float64."""
    def op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.convolution.default(a, b, None, stride, padding, dilation, False,
                                                  [0] * len(stride), groups)

    def float64() -> torch.Tensor:
        return op(x, w)

    taps = w[0, 0].numel()
    if groups == 1:
        return _chunked(x, w, w.shape[1], 1, 1, taps, op, float64)
    # chunks would have to cut every group alike: only the one-chunk case
    if _terms_per_chunk(x, w, taps) >= w.shape[1]:
        return op(x.to(torch.float32), w.to(torch.float32)).to(torch.float64)
    return float64()


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` of integer-valued float64 tensors, exactly, as float64."""
    return _chunked(x, w, w.shape[1], x.dim() - 1, 1, 1, torch.nn.functional.linear,
                    lambda: torch.nn.functional.linear(x, w))


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` (mm, bmm) of integer-valued float64 tensors, exactly, as float64."""
    return _chunked(x, w, w.shape[-2], x.dim() - 1, w.dim() - 2, 1, torch.matmul,
                    lambda: torch.matmul(x, w))


__all__ = ["convolution", "linear", "matmul"]
