"""TOSA: our own delegate (`CodecTosaPartitioner`, `CodecTosaBackend`), run by our
runtime backend on the TOSA reference model; and Arm's stock TOSABackend
delegate, which validate runs the same way."""

from __future__ import annotations

from typing import Any

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.runtime import BACKEND_ID
from codec_tosa.targets.arm_int8_flow import ArmInt8Flow
from codec_tosa.targets.base import RELABELLED, Int8Flow, Target
from codec_tosa.targets.tosa.partitioner import CodecTosaPartitioner


class TosaTarget(Target):
    name = "tosa"
    backend_id = BACKEND_ID
    decides_rounding = True

    def int8_flow(self, spec: Any) -> Int8Flow:
        return ArmInt8Flow(spec.tosa_spec, None)

    def integer_partitioner(self, spec: Any) -> Any:
        return CodecTosaPartitioner(spec)


class StockTosaTarget(TosaTarget):
    """Arm's TOSABackend (a CodecQuantizer program lowered with TOSAPartitioner): a
    TOSA flatbuffer too, which validate runs on our runtime backend."""

    backend_id = arm_adapter.TOSA_BACKEND_ID
    decides_rounding = False
    runs_on = RELABELLED
    run_note = (f"the {arm_adapter.TOSA_BACKEND_ID} delegates ran on codec_tosa's runtime backend (the TOSA "
                "reference model), which this ExecuTorch runtime has in place of Arm's")


__all__ = ["StockTosaTarget", "TosaTarget"]
