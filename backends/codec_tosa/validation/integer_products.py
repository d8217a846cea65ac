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

Where the CPU multiplies int8 in int32 (VNNI, AMX), int8 activation codes and
symmetric int8 weight codes skip the float32 path altogether: one int8 GEMM
(`torch._int_mm`) of the codes themselves, the activation's zero point taken
out of the int32 sums afterwards (`convolution_int8`, `linear_int8`). It is
3-7 times faster than float32 on DeepLabV3's convolutions, and exact by
construction: no rounding anywhere, and the sums stay below 2**31.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

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


# ---- int8 codes: one int8 GEMM ---------------------------------------------

# an int8 GEMM's int32 sums stay exact, even with oneDNN's +128 shift of its first
# operand (sum of (a + 128) * b), while the reduction is at most 2**16 long:
# 2**16 * 255 * 128 < 2**31
_MAX_INT8_REDUCTION = 1 << 16
_ONEDNN_ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


@functools.cache
def int8_gemm_is_exact() -> bool:
    """Whether `torch._int_mm` sums int8 products exactly here. Only with int8 dot
    products that accumulate in int32 (x86 VNNI, AMX): without them oneDNN adds pairs
    of products in saturating int16 (vpmaddubsw), wrong on some shapes by thousands
    (measured with ONEDNN_MAX_CPU_ISA=AVX512_CORE or AVX2). Off too where oneDNN is
    capped at an ISA that may lack them, and unless a check against int64 passes on
    operands that saturate int16 pairs."""
    capabilities = getattr(torch.cpu, "get_capabilities", lambda: {})()
    if not hasattr(torch, "_int_mm") or not any(capabilities.get(k) for k in ("avx512_vnni", "avx_vnni", "amx_int8")):
        return False
    capped = [os.environ[k].upper() for k in _ONEDNN_ISA_ENV if k in os.environ]
    if any(c != "ALL" and "VNNI" not in c and "AMX" not in c for c in capped):
        return False
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-128, 128, (33, 1000), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (1000, 47), generator=g, dtype=torch.int8)
    a[:2], b[:, :2] = 127, 127  # each product 127 * 127: pairs of them saturate int16
    a[2:4], b[:, 2:4] = -128, -128
    try:
        got = torch._int_mm(a, b)
    except RuntimeError:  # no int8 GEMM in this build
        return False
    return torch.equal(got.to(torch.int64), a.to(torch.int64) @ b.to(torch.int64))


@dataclass(frozen=True)
class Int8Weight:
    """Weight codes with zero point 0 as the int8 GEMM reads them (`int8_weight`)."""

    matrix: torch.Tensor  # (output channels, reduction): int8, contiguous
    kernel: tuple[int, ...]  # a convolution's kernel size; () for a linear
    sums: torch.Tensor  # (output channels,) int32: each row's sum, for the activation's zero point


def int8_weight(w: torch.Tensor) -> Int8Weight | None:
    """`w`, int8 codes of zero point 0 ((out, in, *kernel) or (out, in)), for
    `convolution_int8` and `linear_int8`; None where their int8 GEMM is not exact."""
    if w.dtype != torch.int8 or w.dim() < 2 or not int8_gemm_is_exact():
        return None
    matrix = w.reshape(w.shape[0], -1).contiguous()
    if matrix.shape[1] > _MAX_INT8_REDUCTION:
        return None
    # int32: |sum| <= 2**16 * 128 (and an int64 sum of int8 is 20 times slower)
    return Int8Weight(matrix, tuple(w.shape[2:]), matrix.sum(dim=1, dtype=torch.int32))


def convolution_int8(x: torch.Tensor, zero_point: int, weight: Int8Weight, stride: Sequence[int],
                     padding: Sequence[int], dilation: Sequence[int]) -> torch.Tensor | None:
    """``aten.convolution`` (2-d, not transposed, one group, no bias) of ``x -
    zero_point`` (int8 codes) with `weight`, exactly, as int32: the int8 GEMM of
    the codes' columns (im2col) and the weight, minus ``zero_point * sum(w)``
    (below 2**16 * 255 * 128 < 2**31 in magnitude). None where it does not apply."""
    if x.dtype != torch.int8 or x.dim() != 4 or len(weight.kernel) != 2 or not x.numel():
        return None
    # aten.convolution takes one value for both spatial dimensions too
    # (Conv2d(padding="valid") exports padding [0]: SigLIP's patch embedding, issue 51)
    stride, padding, dilation = (tuple(v) * 2 if len(v) == 1 else tuple(v) for v in (stride, padding, dilation))
    n, c = x.shape[:2]
    kh, kw = weight.kernel
    if c * kh * kw != weight.matrix.shape[1]:
        return None  # a grouped convolution
    if kh == kw == 1 and not any(padding):
        cols = x[:, :, ::stride[0], ::stride[1]]  # the codes are the columns
    else:
        # padded with the zero point: a centred 0, as the float32 path pads
        x = F.pad(x, (padding[1], padding[1], padding[0], padding[0]), value=zero_point)
        ho = (x.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
        wo = (x.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
        sn, sc, sh, sw = x.stride()
        cols = x.as_strided((n, c, kh, kw, ho, wo),
                            (sn, sc, sh * dilation[0], sw * dilation[1], sh * stride[0], sw * stride[1]))
    ho, wo = cols.shape[-2:]
    cols = cols.reshape(n, c * kh * kw, ho * wo)
    sums = torch.empty((n, weight.matrix.shape[0], ho * wo), dtype=torch.int32)
    for i in range(n):
        torch._int_mm(weight.matrix, cols[i], out=sums[i])
    if zero_point:
        sums -= (zero_point * weight.sums).reshape(1, -1, 1)
    return sums.reshape(n, -1, ho, wo)


def linear_int8(x: torch.Tensor, zero_point: int, weight: Int8Weight) -> torch.Tensor | None:
    """``(x - zero_point) @ w.T`` of int8 codes `x`, exactly, as int32 (the int8
    GEMM, minus ``zero_point * sum(w)``); None where it does not apply."""
    if x.dtype != torch.int8 or weight.kernel or not x.numel() or x.shape[-1] != weight.matrix.shape[1]:
        return None
    sums = torch._int_mm(x.reshape(-1, x.shape[-1]), weight.matrix.t())
    if zero_point:
        sums -= zero_point * weight.sums
    return sums.reshape(*x.shape[:-1], -1)


__all__ = ["Int8Weight", "convolution", "convolution_int8", "int8_gemm_is_exact", "int8_weight", "linear",
           "linear_int8", "matmul"]
