"""Exact sums of integer products (convolution, linear, matmul) at float32 speed.

The simulation accumulates ``sum((x - zp_x) * (w - zp_w))`` exactly, as the
artefact's int32 (or int48) accumulator does. float64 holds every partial sum
exactly (integers below 2**53), but PyTorch's float64 convolution takes a slow
path on the CPU, and it dominated the reference stage of big models
(DeepLabV3: 3.6 s per input set).

float32 is exact too, as long as every partial sum stays an integer below
2**24: each product is then exact, and so is every sum of them, in any order
and with or without fused multiply-adds. With ``P`` the largest product, a sum
of ``k`` products stays below ``k * P``. Two ways keep it there, and both are
linear in the larger operand:

* chunks: the reduction (input channels, or the inner dimension) is cut into
  pieces of ``k`` terms with ``k * P < 2**24``, each evaluated in float32;
* digits: the larger operand is written in base ``2**b``,
  ``x = sum_j d_j * 2**(b*j)``, each digit at most ``2**b`` in magnitude, so
  each digit's products are ``2**b / max|x|`` times smaller and its chunks
  that much longer (int16 codes, up to 65535 from the zero point: a 3x3
  convolution's chunk holds no row at all; two 8-bit digits leave 57 rows).

Chunks cost little (the same products, in smaller pieces); each digit is one
more pass over all of them. So `_plan` takes the fewest digits whose chunks
still hold enough products to beat float64: one for int8 activations, two for
int16 ones (which were evaluated in float64 before), float64 past three. The
partial results are added in float64 (exact again: integers far below 2**53).

This needs the float32 kernels to compute the sum of products directly (as
PyTorch's direct and im2col convolutions and its GEMMs do), not through a
transform that rounds (Winograd, FFT); tests/test_integer_products.py checks
the result against float64 and int64 on held-out shapes and ranges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

_EXACT_FLOAT32 = 2.0 ** 24
# below this many products per output and chunk, float64 is as fast (measured
# here on ResNet-50 shapes: 27-36 products per chunk break even, 513 are 5x faster)
_MIN_PRODUCTS_PER_CHUNK = 128
# int16 activations need three digits for chunks as long as int8's two; more gain nothing
_MAX_DIGITS = 3


@dataclass(frozen=True)
class _Split:
    """How one exact product is evaluated: `digits` digits of `bits` bits of the
    split operand, each over the reduction in chunks of `rows` rows."""

    digits: int
    bits: int
    rows: int


def _plan(big: float, small: float, total_rows: int, taps: int, chunkable: bool) -> _Split | None:
    """The split for operands bounded by `big` (the one split) and `small`: the
    fewest digits (each digit is one more pass over the products) whose chunks
    still hold enough products to beat float64, or every row when the reduction
    cannot be cut (`chunkable` False); None: evaluate in float64."""
    if big == 0.0 or small == 0.0:
        return _Split(1, 0, total_rows)
    magnitude_bits = max(1, math.ceil(math.log2(big + 1)))  # big < 2**magnitude_bits
    for digits in range(1, _MAX_DIGITS + 1):
        bits = math.ceil(magnitude_bits / digits)
        largest = big if digits == 1 else float(1 << bits)  # |each digit| <= 2**bits
        rows = min(int((_EXACT_FLOAT32 - 1) // (largest * small * taps)), total_rows)
        if rows == total_rows or (chunkable and rows * taps >= _MIN_PRODUCTS_PER_CHUNK):
            return _Split(digits, bits, rows)
    return None


def _digits(x: torch.Tensor, split: _Split) -> list[torch.Tensor]:
    """`x` (integer-valued) as `split.digits` float32 tensors with
    ``x = sum_j d_j * 2**(bits*j)``: the low digits in [0, 2**bits), the top one signed."""
    if split.digits == 1:
        return [x.to(torch.float32)]
    base = float(1 << split.bits)
    out, rest = [], x.to(torch.float64)
    for _ in range(split.digits - 1):
        high = torch.floor(rest / base)  # exact: a division by a power of two
        out.append((rest - high * base).to(torch.float32))
        rest = high
    out.append(rest.to(torch.float32))
    return out


def _max_abs(t: torch.Tensor) -> float:
    if not t.numel():
        return 0.0
    low, high = torch.aminmax(t)  # no |t| temporary
    return max(-float(low), float(high))


def _exact(x: torch.Tensor, w: torch.Tensor, rows: int, x_dim: int, w_dim: int, taps: int,
           op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], chunkable: bool = True) -> torch.Tensor:
    """``op(x, w)`` of integer-valued tensors, exactly, as float64; `rows` is the
    length of the reduction, on dimension `x_dim` of x and `w_dim` of w, each row
    `taps` products. `chunkable` False: only a split whose chunk holds every row."""
    mx, mw = _max_abs(x), _max_abs(w)
    swap = mw > mx
    split = _plan(max(mx, mw), min(mx, mw), rows, taps, chunkable)
    if split is None:
        return op(x.to(torch.float64), w.to(torch.float64))
    big, small = (w, x) if swap else (x, w)
    small32 = small.to(torch.float32)
    total: torch.Tensor | None = None
    for j, digit in enumerate(_digits(big, split)):
        weight = float(1 << (split.bits * j))
        for start in range(0, rows, split.rows):
            n = min(split.rows, rows - start)
            # one chunk reads whole operands (a grouped convolution's x holds every group's rows)
            a = digit if n == rows else digit.narrow(w_dim if swap else x_dim, start, n)
            b = small32 if n == rows else small32.narrow(x_dim if swap else w_dim, start, n)
            part = (op(b, a) if swap else op(a, b)).to(torch.float64)
            if weight != 1.0:
                part.mul_(weight)  # exact: a power of two
            total = part if total is None else total.add_(part)
    assert total is not None
    return total


def convolution(x: torch.Tensor, w: torch.Tensor, stride: Sequence[int], padding: Sequence[int],
                dilation: Sequence[int], groups: int) -> torch.Tensor:
    """``aten.convolution`` (not transposed, no bias) of integer-valued tensors,
    exactly, as float64."""
    def op(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.convolution.default(a, b, None, stride, padding, dilation, False,
                                                  [0] * len(stride), groups)

    # chunks would have to cut every group alike: grouped convolutions take digits only
    return _exact(x, w, w.shape[1], 1, 1, w[0, 0].numel(), op, chunkable=groups == 1)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` of integer-valued tensors, exactly, as float64."""
    return _exact(x, w, w.shape[1], x.dim() - 1, 1, 1, torch.nn.functional.linear)


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w`` (mm, bmm) of integer-valued tensors, exactly, as float64."""
    return _exact(x, w, w.shape[-2], x.dim() - 1, w.dim() - 2, 1, torch.matmul)


__all__ = ["convolution", "linear", "matmul"]
