"""CodecSpec: what the user asks of the backend (policy, placement, TOSA spec, options)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from codec_tosa.codecs.int8 import DEFAULT_CODEC, Int8Affine
from codec_tosa.commutation.policy import INTEGER_POLICY
from codec_tosa.commutation.table import CommutationTable
from codec_tosa.placement.domains import COALESCE, check_placement

INT_FP = "TOSA-1.0+INT+FP"
FP_ONLY = "TOSA-1.0+FP"
INT_ONLY = "TOSA-1.0+INT"


@dataclass(frozen=True)
class CodecSpec:
    """Options of `CodecTosaPartitioner`; `tosa=None` picks INT+FP (FP for policy Z,
    INT for policy I). `target` names an Ethos-U accelerator (``ethos-u55-128``):
    the delegate is then Arm's EthosUBackend (Vela), which takes policy I only."""

    policy: str = "W"
    placement: str = COALESCE
    tosa: str | None = None
    fused_transcode: bool = False
    pool_constants: bool = True
    table: CommutationTable | None = None
    target: str | None = None

    def __post_init__(self) -> None:
        self.commutation_table.order.rank(self.policy)
        check_placement(self.placement)
        if self.target is not None and self.policy != INTEGER_POLICY:
            raise ValueError(f"--target {self.target} needs --policy {INTEGER_POLICY} (got {self.policy}): "
                             "Ethos-U runs integer TOSA only")
        if self.target is not None and self.tosa not in (None, INT_ONLY):
            raise ValueError(f"--target {self.target}: the TOSA spec is Arm's for the target, not {self.tosa}")

    @property
    def commutation_table(self) -> CommutationTable:
        return self.table or _default_table()

    @property
    def reference(self) -> bool:
        """The least compressed policy: no codecs, no weight compression."""
        return self.policy == self.commutation_table.order.reference

    @property
    def activation_codec(self) -> Int8Affine:
        """The codec whose theta calibration learns for each domain."""
        return DEFAULT_CODEC

    @property
    def tosa_spec(self) -> str:
        if self.tosa:
            return self.tosa
        if self.policy == INTEGER_POLICY:
            return INT_ONLY
        return FP_ONLY if self.reference else INT_FP

    @property
    def integer_only(self) -> bool:
        """No FP32 in the delegate: the codecs are materialised before Arm's
        partitioner runs, so that it sees (and delegates) a quantized graph."""
        return self.target is not None or "+FP" not in self.tosa_spec

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "reference": self.reference, "placement": self.placement,
                "tosa": self.tosa_spec, "target": self.target,
                "fused_transcode": self.fused_transcode, "pool_constants": self.pool_constants,
                "custom_table": self.table is not None}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)


_DEFAULT_TABLE: CommutationTable | None = None


def _default_table() -> CommutationTable:
    global _DEFAULT_TABLE
    if _DEFAULT_TABLE is None:
        _DEFAULT_TABLE = CommutationTable.default()
    return _DEFAULT_TABLE
