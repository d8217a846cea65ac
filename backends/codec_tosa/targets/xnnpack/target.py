"""XNNPACK: ExecuTorch's XnnpackBackend on the CPU, lowering a CodecQuantizer
program with XNNPACK's own partitioner. XNNPACK requantizes in its own fixed
point, so the plan's simulation is not its oracle: its outputs are held to eager."""

from __future__ import annotations

from typing import Any

from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

from codec_tosa.targets.base import Int8Flow, Target
from codec_tosa.targets.xnnpack.int8_flow import XnnpackInt8Flow

XNNPACK_BACKEND_ID = "XnnpackBackend"  # the delegates XnnpackPartitioner makes


class XnnpackTarget(Target):
    name = "xnnpack"
    backend_id = XNNPACK_BACKEND_ID
    simulated = False
    payload_is_tosa = False
    partitioner_name = "XnnpackPartitioner"
    external_weights_refusal = "external_weights=True: not implemented for this target yet"
    run_note = (f"the {XNNPACK_BACKEND_ID} delegates ran in ExecuTorch's runtime; XNNPACK requantizes in its "
                "own fixed point, so the plan's simulation is not their oracle: outputs are held to FP32 "
                "eager by SQNR only")

    def int8_flow(self, spec: Any) -> Int8Flow:
        return XnnpackInt8Flow()

    def integer_partitioner(self, spec: Any) -> Any:
        return XnnpackPartitioner()


__all__ = ["XNNPACK_BACKEND_ID", "XnnpackTarget"]
