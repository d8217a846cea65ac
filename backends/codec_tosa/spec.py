"""CodecSpec: what the user asks of the backend (policy, placement, TOSA spec, options)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from codec_tosa.codecs.int8 import DEFAULT_CODEC, SYMMETRIC_CODEC, Int8Affine
from codec_tosa.commutation.table import CommutationTable
from codec_tosa.placement.domains import COALESCE, check_placement

# Where the delegate runs: a TOSA flatbuffer run by CodecTosaBackend, or a VGF
# file run by Arm's VgfBackend (ML SDK for Vulkan).
TARGETS = ("tosa", "vgf")

INT_FP = "TOSA-1.0+INT+FP"
FP_ONLY = "TOSA-1.0+FP"


@dataclass(frozen=True)
class CodecSpec:
    """Options of `CodecTosaPartitioner`; `tosa=None` picks INT+FP (FP for policy Z)."""

    policy: str = "W"
    placement: str = COALESCE
    tosa: str | None = None
    fused_transcode: bool = False
    pool_constants: bool = True
    table: CommutationTable | None = None
    # activation codecs with zero point 0 (2-operator encode/decode instead of 3)
    symmetric_activations: bool = False

    def __post_init__(self) -> None:
        self.commutation_table.order.rank(self.policy)
        check_placement(self.placement)

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
        return FP_ONLY if self.reference else INT_FP

    @property
    def activation_codec(self) -> Int8Affine:
        """The codec whose theta calibration learns for each domain."""
        return SYMMETRIC_CODEC if self.symmetric_activations else DEFAULT_CODEC

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "reference": self.reference, "placement": self.placement,
                "tosa": self.tosa_spec,
                "fused_transcode": self.fused_transcode, "pool_constants": self.pool_constants,
                "symmetric_activations": self.symmetric_activations,
                "custom_table": self.table is not None}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


_DEFAULT_TABLE: CommutationTable | None = None


def _default_table() -> CommutationTable:
    global _DEFAULT_TABLE
    if _DEFAULT_TABLE is None:
        _DEFAULT_TABLE = CommutationTable.default()
    return _DEFAULT_TABLE
