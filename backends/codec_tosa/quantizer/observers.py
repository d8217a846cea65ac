"""PT2E observers that learn our codecs' parameters (docs/DESIGN.md, "The plan as a PT2E quantizer").

`CodecQuantizer` gives every domain one observer, shared by all of the
domain's ports (a `SharedQuantizationSpec` rooted at its absolute
dominator), and every offline-encoded weight one of its own. They compute
exactly what `calibration.learn_thetas` and the materialisation compute, so
the quantizer and the partitioner give the same codes:

* `DomainObserver`: the domain's range, as `minmax` or as torchao's
  `HistogramObserver` picks it (`calibration.HISTOGRAM`), then the codec's
  theta (`Int8Affine.learn`: range widened to contain 0, near-symmetric zero
  points). PT2E calls a shared observer at every port of its group, so a
  domain whose theta the plan learns after a clamp (`placement/plan.py`)
  clips what it sees to that clamp's bounds: every tensor of the domain
  reaches its readers through the clamp, so the clipped data is the data the
  plan observes.
  A domain at INT16 (`bits = 16`, docs/DESIGN.md, "Precision per domain") takes
  the symmetric INT16 codec on the observed range (with its headroom,
  `codecs.int16.HEADROOM`): at 16 bits the histogram's clipping would cut real
  values to save a step that is never what limits accuracy.
  `fake = True` turns the observer into the fake quantisation of its theta,
  which is how the precision search evaluates a width assignment
  (`precision_search`) on the calibrated module.
* `WeightObserver`: symmetric INT8 per output channel (`Int8Affine.learn_weight`), or
  INT4 (`bits = 4`, `codecs.int4`); with `fake`, the weight's fake quantisation.
* `bias_qparams`: an INT8 convolution's int32 bias codes at ``s_in * s_w[c]``.

Scales are returned as float64 tensors: torchao's convert writes
``float(scale)`` into the graph, so the double the codec computed survives.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torchao.quantization.pt2e import HistogramObserver
from torchao.quantization.pt2e.observer import ObserverBase

from codec_tosa.planning.calibration import HISTOGRAM, HISTOGRAM_EPS, MINMAX, NO_FINITE_RANGE, finite_values
from codec_tosa.codecs.base import Theta
from codec_tosa.codecs.int4 import INT4_WEIGHT_CODEC, QMAX4
from codec_tosa.codecs.int16 import INT16_CODEC, QMAX16, QMIN16
from codec_tosa.codecs.int8 import (
    DEFAULT_CODEC,
    EXACT_ZERO_POINT_CODEC,
    INT32_QMAX,
    INT32_QMIN,
    QMAX,
    QMIN,
    SYMMETRIC_CODEC,
)


class DomainObserver(ObserverBase):
    """One domain's range and theta. `clip` is the (lo, hi) of the clamps the plan
    learns the domain's theta after (None: no clamp).

    Zero points are as the range asks (no near-symmetric snap, `Int8Affine`):
    inside an integer delegate a zero point costs nothing (Arm's RESCALEs and
    XNNPACK's kernels take it), so the snap, which saves the mixed policies a
    RESCALE per codec, would only coarsen the step (the trained ViT at I: 0.5 dB
    below stock INT8 with it, equal to the digit without)."""

    def __init__(self, dtype: torch.dtype = torch.int8, observer: str = MINMAX, symmetric: bool = False,
                 clip: tuple[float, float] | None = None, label: str = "", bits: int = 8,
                 graph_input: str | None = None, **_: Any) -> None:
        super().__init__(dtype=dtype)
        # the program input this observer sits on: ExecuTorch's quantize kernel encodes
        # it on the CPU, and has no defined code for +inf or NaN (`_check_encodable`)
        self.graph_input = graph_input
        if observer not in (MINMAX, HISTOGRAM):
            raise ValueError(f"unknown observer {observer!r}")
        self.observer = observer
        self.symmetric = symmetric
        self.clip = clip
        self.label = label  # the domain and its dominator, for error messages
        self.only_nonfinite = False  # saw a tensor with no finite value
        self.fake = False  # forward fake-quantises at theta() instead of observing
        # with `fake`: the observer of the domain a chain cut reads, where the search gives
        # the cut's two sides one width. The cut is then undone: no transcode, and its
        # ports (an average pool's output too) carry that domain's codes
        # (`codec_tosa.quantizer.precision.chain_cuts`)
        self.undone_into: DomainObserver | None = None
        self._bits = 8
        self.bits = bits  # and with it the dtype, range and qscheme convert_pt2e writes
        self.register_buffer("min_val", torch.tensor(math.inf, dtype=torch.float64))
        self.register_buffer("max_val", torch.tensor(-math.inf, dtype=torch.float64))
        self.histogram = (HistogramObserver(dtype=torch.int8, quant_min=QMIN, quant_max=QMAX,
                                            qscheme=torch.per_tensor_affine, eps=HISTOGRAM_EPS)
                          if observer == HISTOGRAM else None)

    @property
    def bits(self) -> int:
        """The domain's code width: 8 (INT8, the default) or 16 (symmetric INT16)."""
        return self._bits

    @bits.setter
    def bits(self, bits: int) -> None:
        if bits not in (8, 16):
            raise ValueError(f"domain {self.label}: activation codes are 8 or 16 bits, not {bits}")
        self._bits = bits
        # what convert_pt2e writes into the quantize and dequantize nodes
        self.dtype = torch.int16 if bits == 16 else torch.int8
        self.quant_min, self.quant_max = (QMIN16, QMAX16) if bits == 16 else (QMIN, QMAX)
        self.qscheme = torch.per_tensor_symmetric if bits == 16 else torch.per_tensor_affine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fake:
            codes = self
            while codes.undone_into is not None:  # a cut reading an undone cut's domain
                codes = codes.undone_into
            t = codes.theta()
            return torch.fake_quantize_per_tensor_affine(x, t.scale, t.zero_point, t.qmin, t.qmax)
        if self.graph_input is not None:
            self._check_encodable(x)
        seen = finite_values(x)
        if seen is None:
            self.only_nonfinite |= x.numel() > 0
            return x  # an empty tensor, or one of infinities and NaNs only, has no range
        if self.clip is not None:
            seen = torch.clamp(seen, *self.clip)
        lo, hi = float(seen.min()), float(seen.max())
        self.min_val.fill_(min(lo, float(self.min_val)))
        self.max_val.fill_(max(hi, float(self.max_val)))
        if self.histogram is not None:
            self.histogram(seen)
        return x

    def _check_encodable(self, x: torch.Tensor) -> None:
        """Refuse +inf and NaN at a program input: ExecuTorch's quantize kernel casts
        ``round(x / scale)`` to int32 before clamping, which for them is undefined
        (x86 gives INT32_MIN, so +inf becomes the lowest code); -inf saturates there
        correctly."""
        if x.is_floating_point() and bool((torch.isnan(x) | (x == math.inf)).any()):
            raise ValueError(f"program input {self.graph_input}: the calibration data holds +inf or NaN, which "
                             "ExecuTorch's quantize kernel has no code for at an integer policy (it encodes "
                             "program inputs on the CPU); calibrate on finite inputs, or use a mixed policy "
                             "such as policy='W'")

    def theta(self) -> Theta:
        """The codec's parameters for what was observed."""
        lo, hi = float(self.min_val), float(self.max_val)
        if lo > hi:  # no finite value observed
            if self.only_nonfinite:
                raise ValueError(f"domain {self.label}: {NO_FINITE_RANGE}")
            lo = hi = 0.0  # empty tensors only: any scale codes it
        # a constant domain (all zeros) has no spread to clip; its codec picks the scale
        if self._bits == 16:
            return INT16_CODEC.learn(lo, hi)
        if self.histogram is not None and self.histogram.histogram.sum() > 0 and lo < hi:
            scale, zero_point = self.histogram.calculate_qparams()
            s, z = float(scale), int(zero_point)
            lo, hi = (QMIN - z) * s, (QMAX - z) * s
        return (SYMMETRIC_CODEC if self.symmetric else EXACT_ZERO_POINT_CODEC).learn(lo, hi)

    def calculate_qparams(self, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.theta()
        return (torch.tensor([t.scale], dtype=torch.float64), torch.tensor([t.zero_point], dtype=torch.int32))

    def extra_repr(self) -> str:
        return f"{self.label} {self.observer} clip={self.clip}"


class WeightObserver(ObserverBase):
    """Symmetric weight scales, one per channel along `ch_axis` (None: one per tensor):
    INT8 codes in [-127, 127], or at `bits = 4` Arm's a8w4 INT4 codes in [-7, 7]
    (`codecs.int4`), which convert_pt2e writes as the weight's quantize range and Arm
    then stores as a TOSA INT4 constant."""

    def __init__(self, dtype: torch.dtype = torch.int8, ch_axis: int | None = 0, bits: int = 8,
                 label: str = "", **_: Any) -> None:
        super().__init__(dtype=dtype)
        self.ch_axis = ch_axis
        self.qscheme = torch.per_channel_symmetric if ch_axis is not None else torch.per_tensor_symmetric
        self.label = label  # the operator whose weight it is, for error messages
        self._bits = 8
        self.bits = bits
        self.weight: torch.Tensor | None = None
        self.fake = False  # forward fake-quantises the weight (the precision search)
        # width -> the weight as `weight_rounding.round_weights` rounded it (scale x code);
        # empty: nearest rounding
        self.rounded: dict[int, torch.Tensor] = {}

    @property
    def bits(self) -> int:
        """The weight's code width: 8 (INT8, the default) or 4 (INT4)."""
        return self._bits

    @bits.setter
    def bits(self, bits: int) -> None:
        if bits not in (8, 4):
            raise ValueError(f"weight of {self.label or 'an operator'}: weight codes are 8 or 4 bits, not {bits}")
        self._bits = bits
        self.quant_min, self.quant_max = weight_range(bits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fake and self._bits in self.rounded:
            return self.rounded[self._bits]
        if self.fake:
            scales = self.scales().double()
            zeros = torch.zeros(len(scales), dtype=torch.int32)
            if self.ch_axis is None:
                return torch.fake_quantize_per_tensor_affine(x, float(scales[0]), 0, self.quant_min, self.quant_max)
            return torch.fake_quantize_per_channel_affine(x, scales.float(), zeros, self.ch_axis % x.dim(),
                                                          self.quant_min, self.quant_max)
        if not self.rounded:  # rounded: `x` may be a rounded weight, not the one the scales are of
            self.weight = x.detach()  # a constant: the last one seen is the one
        return x

    def scales(self, bits: int | None = None) -> torch.Tensor:
        """The per-channel scales at `bits` (default: the observer's width)."""
        if self.weight is None:
            raise ValueError("weight observer: the weight was never observed (run calibration first)")
        codec = INT4_WEIGHT_CODEC if (bits or self._bits) == 4 else DEFAULT_CODEC
        if self.ch_axis is None:
            return codec.learn_weight(self.weight.reshape(1, -1), axis=0).scales
        return codec.learn_weight(self.weight, axis=self.ch_axis).scales

    def calculate_qparams(self, **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        scales = self.scales()
        zero_points = torch.zeros(len(scales), dtype=torch.int32)
        if self.ch_axis is None:
            return scales[:1].double(), zero_points[:1]
        return scales, zero_points


class FakeQuantising:
    """Every observer of `prepared` fake-quantises at its width for the duration of a
    `with` block (one forward pass then runs the quantized module), then does what it
    did before; reusable."""

    def __init__(self, prepared: torch.nn.Module) -> None:
        self.observers = [m for m in prepared.modules() if isinstance(m, (DomainObserver, WeightObserver))]
        self._was: list[bool] = []

    def __enter__(self) -> None:
        self._was = [m.fake for m in self.observers]
        for m in self.observers:
            m.fake = True

    def __exit__(self, *_: Any) -> None:
        for m, fake in zip(self.observers, self._was):
            m.fake = fake


def weight_range(bits: int) -> tuple[int, int]:
    """The code range of a weight at `bits` (what its quantize node says)."""
    qmax = QMAX4 if bits == 4 else QMAX
    return -qmax, qmax


def bias_qparams(observers: list[ObserverBase]) -> tuple[torch.Tensor, torch.Tensor]:
    """``derive_qparams_fn`` of a bias: int32 codes at s_in * s_w[c] (zero point 0),
    computed as the materialisation computes them (a float32 product)."""
    activation, weight = observers
    s_in = activation.theta().scale if isinstance(activation, DomainObserver) \
        else float(activation.calculate_qparams()[0])
    w = weight.scales() if isinstance(weight, WeightObserver) else weight.calculate_qparams()[0].float()
    scales = (s_in * w).float()
    return scales, torch.zeros(len(scales), dtype=torch.int32)


__all__ = ["DomainObserver", "FakeQuantising", "INT32_QMAX", "INT32_QMIN", "WeightObserver", "bias_qparams", "weight_range"]
