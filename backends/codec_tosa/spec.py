"""What the user asks of the backend, split as Arm splits it: what to place
(`PlacementOptions`), what to target (`TargetOptions`), how to quantize
(`QuantizationOptions`), with `CodecSpec` the friendly front that takes them all.
Errors name the Python arguments; the CLI maps them to its flags."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from codec_tosa.planning.calibration import HISTOGRAM, OBSERVERS
from codec_tosa.codecs.int8 import DEFAULT_CODEC, SYMMETRIC_CODEC, Int8Affine
from codec_tosa.commutation.policy import INTEGER_POLICY
from codec_tosa.commutation.table import XNNPACK, CommutationTable
from codec_tosa.placement.domains import COALESCE, SHARE, check_placement

# Where the delegate runs: a TOSA flatbuffer run by CodecTosaBackend, a VGF file
# run by Arm's VgfBackend (ML SDK for Vulkan), Vela's command stream run by
# Arm's EthosUBackend ("ethos-u55-128", "ethos-u85-256", ... any target Arm's
# EthosUCompileSpec accepts), or XNNPACK's static INT8 kernels on a CPU
# (XnnpackPartitioner, on a CodecQuantizer program).
XNNPACK_TARGET = XNNPACK
TARGETS = ("tosa", "vgf", XNNPACK_TARGET)
ETHOS_U_PREFIX = "ethos-u"

INT_FP = "TOSA-1.0+INT+FP"
FP_ONLY = "TOSA-1.0+FP"
INT_ONLY = "TOSA-1.0+INT"
INT16_EXTENSION = "+int16"
INT4_EXTENSION = "+int4"

# Activation precision per domain at the integer policy (docs/DESIGN.md, "Precision
# per domain"): every domain INT8, every domain Arm lowers at int16 INT16 (Arm's
# a16w8), or the least traffic that meets `budget` (the search, `codec_tosa.quantizer.precision`)
INT8, INT16, AUTO = "int8", "int16", "auto"
PRECISIONS = (INT8, INT16, AUTO)
# Weight precision of the convolutions and linears that read INT8 codes: INT8, INT4
# (Arm's a8w4), or what the search chooses under `budget`
INT4 = "int4"
WEIGHT_PRECISIONS = (INT8, INT4, AUTO)
# How a weight's codes are picked at its codec's scales (`codec_tosa.quantizer.weight_rounding`):
# each element to the nearest code, or GPTQ's error-compensating order on the data
# `CodecQuantizer.choose_precision` is given
NEAREST, GPTQ = "nearest", "gptq"
WEIGHT_ROUNDINGS = (NEAREST, GPTQ)


def _arg(name: str, value: Any) -> str:
    """How an error names an argument: as Python spells it (the CLI maps it to its flag,
    `tools.cli.as_flags`)."""
    return f"{name}={value!r}"


@dataclass(frozen=True)
class PlacementOptions:
    """What to place: the policy, the placement, how codecs are calibrated and lowered."""

    policy: str = "W"
    placement: str | None = None  # None: nonlocal+share at policy I, else nonlocal+coalesce
    fused_transcode: bool = False
    pool_constants: bool | None = None  # None: pooled except at the reference policy
    table: CommutationTable | None = None
    # activation codecs with zero point 0 (2-operator encode/decode instead of 3)
    symmetric_activations: bool = False
    observer: str | None = None  # None: histogram

    def __post_init__(self) -> None:
        table = self.table or _default_table()
        table.order.rank(self.policy)
        if self.placement is None:
            # frozen: the default depends on the policy, so it is filled in here
            object.__setattr__(self, "placement", SHARE if self.policy == INTEGER_POLICY else COALESCE)
        check_placement(self.placement)
        if self.observer is None:
            object.__setattr__(self, "observer", HISTOGRAM)
        if self.observer not in OBSERVERS:
            raise ValueError(f"unknown observer {self.observer!r}: expected one of {', '.join(OBSERVERS)}")
        if self.pool_constants is None:
            # the reference policy's bytes are stock Arm's unless asked otherwise
            object.__setattr__(self, "pool_constants", self.policy != table.order.reference)


@dataclass(frozen=True)
class TargetOptions:
    """What to target: the target and its TOSA spec (None: the policy's), and whether
    the delegates' weights go to a .ptd beside the .pte (ExecuTorch named data,
    each target through its own mechanism; a target without one refuses it:
    `targets.base.Target.external_weights_refusal`)."""

    target: str = "tosa"
    tosa: str | None = None
    external_weights: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.external_weights, bool):
            raise ValueError(f"{_arg('external_weights', self.external_weights)}: expected True or False")
        if self.target not in TARGETS and not self.ethos_u:
            raise ValueError(f"unknown target {self.target!r}: expected {', '.join(TARGETS)} or an Ethos-U "
                             "accelerator such as ethos-u55-128 or ethos-u85-256")
        if self.ethos_u and self.tosa not in (None, INT_ONLY):
            raise ValueError(f"{_arg('target', self.target)}: the TOSA spec is Arm's for the target, "
                             f"not {self.tosa}")

    @property
    def ethos_u(self) -> bool:
        """The target is an Ethos-U accelerator (the delegate is Arm's EthosUBackend)."""
        return self.target.startswith(ETHOS_U_PREFIX)


@dataclass(frozen=True)
class QuantizationOptions:
    """How to quantize at the integer policy: activation and weight widths, the
    precision search's budget, weight rounding."""

    # activation precision (PRECISIONS); `int16_domains` puts these domain ids at int16
    # on top of an int8 plan (by hand, or as a search chose them); `budget` is the
    # search's floor: the SQNR in dB of every output against FP32 on the calibration
    # data, or, with `metric`, the least value of metric(fp32_outputs, outputs)
    precision: str = INT8
    int16_domains: tuple[int, ...] = ()
    # weight precision (WEIGHT_PRECISIONS): int4 where Arm lowers it (`Row.int4`)
    weights: str = INT8
    budget: float | None = None
    # WEIGHT_ROUNDINGS: gptq needs `choose_precision` between calibration and convert
    weight_rounding: str = NEAREST
    # at precision auto: a chain of convolutions may change width at a convolution's
    # input, through a transcode (`codec_tosa.quantizer.precision.chain_cuts`)
    split_chains: bool = False
    metric: Callable[[list[torch.Tensor], list[torch.Tensor]], float] | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")
        if self.weights not in WEIGHT_PRECISIONS:
            raise ValueError(f"unknown weight precision {self.weights!r}: expected one of "
                             f"{', '.join(WEIGHT_PRECISIONS)}")
        if self.weight_rounding not in WEIGHT_ROUNDINGS:
            raise ValueError(f"unknown weight_rounding {self.weight_rounding!r}: expected one of "
                             f"{', '.join(WEIGHT_ROUNDINGS)}")
        object.__setattr__(self, "int16_domains", tuple(sorted({int(d) for d in self.int16_domains})))
        if self.split_chains and self.precision != AUTO:
            raise ValueError(f"{_arg('split_chains', True)} lets the precision search cut chains of "
                             f"convolutions: it needs {_arg('precision', AUTO)} (got {self.precision!r})")
        if self.int16_domains and self.precision != INT8:
            raise ValueError(f"`int16_domains` picks domains by hand on an int8 plan, not with "
                             f"{_arg('precision', self.precision)}")
        searched = AUTO in (self.precision, self.weights)
        if searched and self.budget is None:
            asked = _arg("precision" if self.precision == AUTO else "weights", AUTO)
            raise ValueError(f"{asked} needs `budget`: the SQNR floor in dB against FP32 (or the metric's "
                             "threshold)")
        if not searched and (self.budget is not None or self.metric is not None):
            raise ValueError(f"`budget` is the precision search's floor: it needs {_arg('precision', AUTO)} "
                             f"or {_arg('weights', AUTO)}")


@dataclass(frozen=True)
class CodecSpec(QuantizationOptions, TargetOptions, PlacementOptions):
    """Everything `CodecTosaPartitioner` and `CodecQuantizer` take, in one friendly
    front: it is a `PlacementOptions` (what to place), a `TargetOptions` (what to
    target) and a `QuantizationOptions` (how to quantize), each validated where it
    is defined, and checks how they combine.

    `tosa=None` picks INT+FP (FP for policy Z, INT for policy I). `target` is
    ``tosa``, ``vgf``, an Ethos-U accelerator (``ethos-u55-128``: the delegate is
    then Arm's EthosUBackend, Vela, which takes policy I only) or ``xnnpack``
    (policy I: `CodecQuantizer` annotates for XNNPACK's static INT8 kernels and
    `XnnpackPartitioner` lowers). `placement=None` picks ``nonlocal+share`` at
    policy I (concatenations observed with their inputs, as Arm's INT8 quantizer
    does) and ``nonlocal+coalesce`` otherwise; `observer=None` picks
    ``histogram`` (the range Arm's INT8 quantizer's HistogramObserver picks).
    `pool_constants=None` pools helper constants except at the reference policy,
    whose payload is then stock Arm's byte for byte.

    An integer-only spec (policy I) is `CodecQuantizer`'s: the partitioner then
    serves the program that quantizer made."""

    def __post_init__(self) -> None:
        PlacementOptions.__post_init__(self)
        TargetOptions.__post_init__(self)
        QuantizationOptions.__post_init__(self)
        self._check_combined()

    def _check_combined(self) -> None:
        """What no one of the three option objects can check alone."""
        integer = _arg("policy", INTEGER_POLICY)
        if self.weight_rounding == GPTQ and self.policy != INTEGER_POLICY:
            raise ValueError(f"{_arg('weight_rounding', GPTQ)}: the weights are integer codes at {integer} "
                             f"only (got policy {self.policy!r})")
        if self.target == XNNPACK_TARGET and (self.policy != INTEGER_POLICY or self.tosa is not None):
            raise ValueError(f"{_arg('target', self.target)} needs {integer} and no TOSA spec "
                             f"(got policy {self.policy!r}, tosa {self.tosa!r}): XNNPACK's static INT8 flow "
                             "is CodecQuantizer's, lowered with XnnpackPartitioner")
        if self.ethos_u and self.policy != INTEGER_POLICY:
            raise ValueError(f"{_arg('target', self.target)} needs {integer} (got {self.policy!r}): "
                             "Ethos-U runs integer TOSA only")
        if not self.mixed_precision and self.weights == INT8:
            return
        asked = (_arg("precision", self.precision) if self.mixed_precision
                 else _arg("weights", self.weights))
        if self.policy != INTEGER_POLICY or self.target in (XNNPACK_TARGET, "vgf"):
            raise ValueError(f"{asked}: int16 activations and int4 weights are Arm's INT flow's, at "
                             f"{integer} with {_arg('target', 'tosa')} or an Ethos-U target "
                             f"(got policy {self.policy!r}, target {self.target!r})")
        if self.tosa is not None and self.mixed_precision and INT16_EXTENSION not in self.tosa:
            raise ValueError(f"{asked}: TOSA spec {self.tosa} has no int16 extension "
                             f"(use {_arg('tosa', INT_ONLY + INT16_EXTENSION)}, or none)")
        if self.tosa is not None and self.weights != INT8 and INT4_EXTENSION not in self.tosa:
            raise ValueError(f"{_arg('weights', self.weights)}: TOSA spec {self.tosa} has no int4 extension "
                             f"(use {_arg('tosa', INT_ONLY + INT4_EXTENSION)}, or none)")

    @property
    def mixed_precision(self) -> bool:
        """Some domain may be INT16 (the delegate needs TOSA's int16 extension)."""
        return self.precision != INT8 or bool(self.int16_domains)

    @property
    def after_calibration(self) -> bool:
        """`CodecQuantizer.choose_precision` must run between calibration and convert:
        a width is searched, or the weights are GPTQ-rounded."""
        return self.searched or self.weight_rounding == GPTQ

    @property
    def searched(self) -> bool:
        """Some width is the precision search's (`precision_search`)."""
        return AUTO in (self.precision, self.weights)

    @property
    def commutation_table(self) -> CommutationTable:
        return self.table or _default_table()

    @property
    def reference(self) -> bool:
        """The least compressed policy: no codecs, no weight compression."""
        return self.policy == self.commutation_table.order.reference

    @property
    def tosa_spec(self) -> str:
        if self.tosa:
            return self.tosa
        if self.policy == INTEGER_POLICY:
            return (INT_ONLY + (INT16_EXTENSION if self.mixed_precision else "")
                    + (INT4_EXTENSION if self.weights != INT8 else ""))
        return FP_ONLY if self.reference else INT_FP

    @property
    def activation_codec(self) -> Int8Affine:
        """The codec whose theta calibration learns for each domain."""
        return SYMMETRIC_CODEC if self.symmetric_activations else DEFAULT_CODEC


    @property
    def integer_only(self) -> bool:
        """No FP32 in the delegate: the codecs are materialised before Arm's
        partitioner runs, so that it sees (and delegates) a quantized graph."""
        return self.ethos_u or "+FP" not in self.tosa_spec

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "reference": self.reference, "placement": self.placement,
                "tosa": self.tosa_spec, "target": self.target,
                "fused_transcode": self.fused_transcode, "pool_constants": self.pool_constants,
                "symmetric_activations": self.symmetric_activations, "observer": self.observer,
                "custom_table": self.table is not None, "precision": self.precision,
                "int16_domains": list(self.int16_domains), "weights": self.weights, "budget": self.budget,
                "split_chains": self.split_chains,
                "metric": getattr(self.metric, "__name__", None) if self.metric else None,
                # only when asked: a program with inline weights keeps its bytes
                **({"external_weights": True} if self.external_weights else {})}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


_DEFAULT_TABLE: CommutationTable | None = None


def _default_table() -> CommutationTable:
    global _DEFAULT_TABLE
    if _DEFAULT_TABLE is None:
        _DEFAULT_TABLE = CommutationTable.default()
    return _DEFAULT_TABLE
