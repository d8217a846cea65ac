"""How outputs are compared: SQNR, its warning floor, and distances that treat
inf and NaN as values (an output of log or 1/x may hold them, and two
implementations that agree on them agree)."""

from __future__ import annotations

import math

import numpy as np

# Below this SQNR against FP32 eager an output is more noise than model: 0 dB
# is an all-zero output (noise power = signal power), 10 dB an error whose RMS
# is a third of the signal's. One INT8 quantisation of a well-ranged tensor is
# about 40-50 dB, and whole INT8 networks land at 20-40 dB; below 10 dB a range
# or a calibration is broken, whatever the bit-exact checks say.
SQNR_FLOOR_DB = 10.0


def differences(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a - b| per element in float64, where equal infinities and two NaNs are 0
    apart and a NaN or infinity against anything else is infinitely far; booleans
    and integers compare as numbers."""
    x, y = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64).reshape(np.shape(a))
    with np.errstate(invalid="ignore"):
        d = np.abs(x - y)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    return np.where(same, 0.0, np.where(np.isnan(d), math.inf, d))


# FP32 against FP32 in another order (policy Z, the planned program against eager):
# relative to the output's largest finite magnitude
Z_RTOL = 1e-4


def max_difference(a: np.ndarray, b: np.ndarray) -> float:
    """The largest of `differences` (0 for empty tensors)."""
    return float(differences(a, b).max()) if np.size(a) else 0.0


def finite_span(a: np.ndarray) -> float:
    """max |a| over its finite elements (0 when there are none)."""
    x = np.asarray(a).astype(np.float64)
    finite = x[np.isfinite(x)]
    return float(np.max(np.abs(finite))) if finite.size else 0.0


def sqnr_db(signal: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-quantisation-noise ratio over the finite elements; inf and NaN
    agree with themselves (`differences`), elsewhere they make the noise infinite."""
    x = np.asarray(signal).astype(np.float64)
    noise = float(np.sum(differences(x, approx) ** 2))
    power = float(np.sum(np.where(np.isfinite(x), x, 0.0) ** 2))
    if noise == 0:
        return math.inf
    if math.isinf(noise):
        return -math.inf  # an infinity or NaN that the approximation does not reproduce
    return 10 * math.log10(max(power, 1e-30) / noise)


def sqnr_warning(index: int, db: float, what: str) -> str | None:
    """The warning for output `index` when its SQNR is below the floor, else None."""
    if db >= SQNR_FLOOR_DB:
        return None
    if db == -math.inf:
        return (f"output {index}: FP32 eager has infinities or NaNs that {what} does not reproduce: "
                "an INT8 code cannot hold them (quantize saturates an infinity at a code bound)")
    return (f"output {index}: SQNR of {what} vs FP32 eager is {db:.1f} dB, below the {SQNR_FLOOR_DB:.0f} dB "
            "floor: the output is mostly quantisation noise (a degenerate range or calibration?)")


__all__ = ["SQNR_FLOOR_DB", "Z_RTOL", "differences", "finite_span", "max_difference", "sqnr_db", "sqnr_warning"]
