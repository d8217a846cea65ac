"""integer_products: exact integer convolutions and matmuls from float32 chunks.

The oracle is independent of the chunking: int64 matmuls, and float64
convolutions (exact: every partial sum is an integer far below 2**53). Ranges
are those of centred codes: int8 activations with a zero point (up to 255 in
magnitude), symmetric int8 weights, and int16 activations.
"""

from __future__ import annotations

import pytest
import torch

from codec_tosa.validation import integer_products

INT8_CENTRED = 255  # |code - zero_point| of an asymmetric int8 activation
INT16 = 32767
INT16_CENTRED = 65535  # |code - zero_point| of an asymmetric int16 activation


def _codes(generator: torch.Generator, shape: tuple[int, ...], bound: int) -> torch.Tensor:
    return torch.randint(-bound, bound + 1, shape, generator=generator).to(torch.float64)


def _conv64(x: torch.Tensor, w: torch.Tensor, stride: list[int], padding: list[int], dilation: list[int],
            groups: int) -> torch.Tensor:
    return torch.ops.aten.convolution.default(x, w, None, stride, padding, dilation, False, [0, 0], groups)


@pytest.mark.parametrize("cin, cout, k, stride, padding, dilation, groups, x_bound", [
    (300, 8, 3, [1, 1], [1, 1], [1, 1], 1, INT8_CENTRED),  # 2,700 taps: several float32 chunks
    (96, 16, 3, [2, 2], [2, 2], [2, 2], 1, INT8_CENTRED),
    (2100, 4, 1, [1, 1], [0, 0], [1, 1], 1, INT8_CENTRED),  # 1x1 over many channels
    (32, 32, 3, [1, 1], [1, 1], [1, 1], 32, INT8_CENTRED),  # depthwise
    (512, 8, 3, [1, 1], [1, 1], [1, 1], 4, INT8_CENTRED),  # grouped, too wide for one chunk
    (40, 8, 3, [1, 1], [1, 1], [1, 1], 1, INT16),  # int16 activations
    (300, 8, 3, [1, 1], [1, 1], [1, 1], 1, INT16_CENTRED),  # two digits, several chunks each
    (24, 24, 3, [1, 1], [1, 1], [1, 1], 24, INT16_CENTRED),  # depthwise, two digits
    (64, 8, 3, [1, 1], [1, 1], [1, 1], 4, INT16_CENTRED),  # grouped: two digits, one chunk
    (200, 4, 3, [1, 1], [1, 1], [1, 1], 1, 2 ** 20 - 1),  # three digits
])
def test_convolution_is_exact(cin: int, cout: int, k: int, stride: list[int], padding: list[int],
                              dilation: list[int], groups: int, x_bound: int) -> None:
    g = torch.Generator().manual_seed(cin * 31 + cout)
    x = _codes(g, (2, cin, 9, 11), x_bound)
    w = _codes(g, (cout, cin // groups, k, k), 127)
    got = integer_products.convolution(x, w, stride, padding, dilation, groups)
    assert got.dtype == torch.float64
    assert torch.equal(got, _conv64(x, w, stride, padding, dilation, groups))


def test_the_worst_case_sum_needs_the_chunks() -> None:
    # every product at its largest, so the plain float32 sum passes 2**24 and rounds;
    # the chunked one stays exact
    cin = 600
    x = torch.full((1, cin, 5, 5), float(INT8_CENTRED), dtype=torch.float64)
    w = torch.full((3, cin, 3, 3), 127.0, dtype=torch.float64)
    w[1] = -127.0
    exact = _conv64(x, w, [1, 1], [1, 1], [1, 1], 1)
    plain = _conv64(x.float(), w.float(), [1, 1], [1, 1], [1, 1], 1).to(torch.float64)
    assert not torch.equal(plain, exact)
    assert torch.equal(integer_products.convolution(x, w, [1, 1], [1, 1], [1, 1], 1), exact)


@pytest.mark.parametrize("shape, k, x_bound", [
    ((7, 5000), 5000, INT8_CENTRED),
    ((2, 6, 1200), 1200, INT8_CENTRED),
    ((3, 700), 700, INT16),
])
def test_linear_is_exact(shape: tuple[int, ...], k: int, x_bound: int) -> None:
    g = torch.Generator().manual_seed(k)
    x, w = _codes(g, shape, x_bound), _codes(g, (9, k), 127)
    expected = (x.to(torch.int64) @ w.to(torch.int64).T).to(torch.float64)
    assert torch.equal(integer_products.linear(x, w), expected)


def test_matmul_is_exact() -> None:
    g = torch.Generator().manual_seed(3)
    x, w = _codes(g, (4, 6, 3000), INT8_CENTRED), _codes(g, (4, 3000, 5), 255)
    expected = torch.matmul(x.to(torch.int64), w.to(torch.int64)).to(torch.float64)
    assert torch.equal(integer_products.matmul(x, w), expected)
    assert torch.equal(integer_products.matmul(x[0], w[0]), expected[0])


@pytest.mark.parametrize("x_bound, rows, taps, digits", [
    (INT8_CENTRED, 512, 9, 1),  # int8: chunks of 57 rows, no digit
    (INT16_CENTRED, 512, 9, 2),  # int16: no row fits one chunk; two 8-bit digits leave 57
    (2 ** 20 - 1, 512, 9, 3),
    (2 ** 30, 512, 9, None),  # beyond three digits: float64
])
def test_the_split_takes_the_fewest_digits(x_bound: int, rows: int, taps: int, digits: int | None) -> None:
    split = integer_products._plan(float(x_bound), 127.0, rows, taps, chunkable=True)
    assert (split.digits if split else None) == digits
    if split is not None:  # and it is exact: every partial sum of a chunk stays below 2**24
        largest = x_bound if split.digits == 1 else 2 ** split.bits
        assert split.rows * taps * largest * 127 < 2 ** 24


def test_digits_put_the_operand_back_together() -> None:
    g = torch.Generator().manual_seed(5)
    x = _codes(g, (1000,), INT16_CENTRED)
    split = integer_products._plan(float(INT16_CENTRED), 127.0, 512, 9, chunkable=True)
    digits = integer_products._digits(x, split)
    assert all(d.abs().max() <= 2 ** split.bits for d in digits)
    back = sum(d.to(torch.float64) * 2.0 ** (split.bits * j) for j, d in enumerate(digits))
    assert torch.equal(back, x)


# ---- int8 codes: one int8 GEMM (only where the CPU's int8 GEMM is exact) -----

@pytest.fixture
def int8_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's int8 GEMM where it is exact (VNNI, AMX: what the simulation uses);
    elsewhere an int64 one in its place, so that the im2col, padding and zero-point
    arithmetic around it is checked on every machine (the gate itself is tested below)."""
    if integer_products.int8_gemm_is_exact():
        return

    def exact(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        sums = (a.to(torch.int64) @ b.to(torch.int64)).to(torch.int32)
        return sums if out is None else out.copy_(sums)

    monkeypatch.setattr(torch, "_int_mm", exact)
    monkeypatch.setattr(integer_products, "int8_gemm_is_exact", lambda: True)


def _int8(generator: torch.Generator, shape: tuple[int, ...], low: int = -128, high: int = 127) -> torch.Tensor:
    return torch.randint(low, high + 1, shape, generator=generator).to(torch.int8)


@pytest.mark.usefixtures("int8_gemm")
@pytest.mark.parametrize("cin, cout, k, stride, padding, dilation, zero_point", [
    (64, 8, 3, [1, 1], [1, 1], [1, 1], -128),  # after a ReLU: centred codes up to 255
    (96, 16, 3, [2, 2], [2, 2], [2, 2], 5),
    (2100, 4, 1, [1, 1], [0, 0], [1, 1], -128),  # 1x1: the codes are the columns
    (24, 8, 1, [2, 2], [0, 0], [1, 1], 0),  # 1x1 strided
    (16, 8, 1, [1, 1], [1, 1], [1, 1], 17),  # 1x1 padded: the padding is the zero point
    (3, 8, 7, [2, 2], [3, 3], [1, 1], -3),  # a stem
    (32, 8, 3, [1, 1], [12, 12], [12, 12], 127),  # taps off the centre read only padding
    (3, 8, 3, [3, 3], [0], [1, 1], 4),  # padding="valid" exports one value (SigLIP's patch embedding)
    (3, 8, 3, [2], [1], [2], -5),  # one value each for both spatial dimensions
])
def test_int8_convolution_is_exact(cin: int, cout: int, k: int, stride: list[int], padding: list[int],
                                   dilation: list[int], zero_point: int) -> None:
    g = torch.Generator().manual_seed(cin * 31 + cout)
    x, w = _int8(g, (2, cin, 9, 11)), _int8(g, (cout, cin, k, k), -127)
    weight = integer_products.int8_weight(w)
    assert weight is not None
    got = integer_products.convolution_int8(x, zero_point, weight, stride, padding, dilation)
    assert got is not None and got.dtype == torch.int32
    expected = _conv64(x.to(torch.float64) - zero_point, w.to(torch.float64), stride, padding, dilation, 1)
    assert torch.equal(got.to(torch.float64), expected)


@pytest.mark.usefixtures("int8_gemm")
def test_int8_convolution_is_exact_at_the_extremes() -> None:
    # every product at its largest (centred 255 times -127, and -128 times 127): sums
    # far past 2**24, and past int16 for every pair of products
    x = torch.full((1, 600, 5, 5), 127, dtype=torch.int8)
    w = torch.full((3, 600, 3, 3), -127, dtype=torch.int8)
    w[1] = 127
    weight = integer_products.int8_weight(w)
    assert weight is not None
    for zero_point in (-128, 127):
        got = integer_products.convolution_int8(x, zero_point, weight, [1, 1], [1, 1], [1, 1])
        expected = _conv64(x.to(torch.float64) - zero_point, w.to(torch.float64), [1, 1], [1, 1], [1, 1], 1)
        assert got is not None and torch.equal(got.to(torch.float64), expected)


@pytest.mark.usefixtures("int8_gemm")
@pytest.mark.parametrize("shape, zero_point", [((7, 5000), -128), ((2, 6, 1200), 9), ((1, 40), 0)])
def test_int8_linear_is_exact(shape: tuple[int, ...], zero_point: int) -> None:
    g = torch.Generator().manual_seed(shape[-1])
    x, w = _int8(g, shape), _int8(g, (9, shape[-1]), -127)
    weight = integer_products.int8_weight(w)
    assert weight is not None
    got = integer_products.linear_int8(x, zero_point, weight)
    assert got is not None
    assert torch.equal(got.to(torch.int64), (x.to(torch.int64) - zero_point) @ w.to(torch.int64).T)


@pytest.mark.usefixtures("int8_gemm")
def test_int8_path_declines_what_it_cannot_sum_exactly() -> None:
    g = torch.Generator().manual_seed(1)
    grouped = integer_products.int8_weight(_int8(g, (8, 4, 3, 3)))
    assert grouped is not None  # the weight alone does not say; the activation's channels do
    assert integer_products.convolution_int8(_int8(g, (1, 8, 5, 5)), 0, grouped, [1, 1], [1, 1], [1, 1]) is None
    assert integer_products.convolution_int8(_int8(g, (1, 4, 5, 5)).to(torch.int16), 0, grouped,
                                             [1, 1], [1, 1], [1, 1]) is None  # int16 codes
    # a reduction past 2**16 could overflow the int32 sums
    assert integer_products.int8_weight(torch.zeros((2, 2 ** 16 + 1), dtype=torch.int8)) is None


def test_int8_gemm_is_off_where_onednn_may_lack_vnni(monkeypatch: pytest.MonkeyPatch) -> None:
    # without VNNI oneDNN sums pairs of int8 products in saturating int16
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    integer_products.int8_gemm_is_exact.cache_clear()
    try:
        assert not integer_products.int8_gemm_is_exact()
        assert integer_products.int8_weight(torch.ones((2, 3), dtype=torch.int8)) is None
    finally:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
        integer_products.int8_gemm_is_exact.cache_clear()
