"""Ethos-U: Arm's EthosUBackend, Vela's command stream. Nothing here runs that
stream: validate runs the TOSA Vela was given (model.tosa beside the .pte) in its
place, and report shows Vela's own figures (`vela_summary`, `vela_figures`).

External weights are Arm's own mechanism: `external_block_placements` puts Vela's
weight block in named data under the tag codec_tosa uses (model.ptd); Arm's
Ethos-U runtime (`vela_bin_read`) fetches it at init through the delegate's named
data map and keeps only its address, so the .ptd must stay where the loader put it
(a `BufferDataLoader` over flash or DRAM on a board, docs/DESIGN.md, "External weights")."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.targets.arm_int8_flow import ArmInt8Flow
from codec_tosa.targets.base import TOSA_STAND_IN, Int8Flow, Target
from codec_tosa.targets.ethosu.vela_cost import VelaCycles
from codec_tosa.targets.tosa.partitioner import CodecTosaPartitioner


class VelaError(RuntimeError):
    """Vela is missing or refused the TOSA it was given (one line, Vela's message quoted)."""


class EthosUTarget(Target):
    backend_id = arm_adapter.ETHOS_U_BACKEND_ID
    tosa_beside = True
    payload_is_tosa = False
    needs_tosa_beside = True
    runs_on = TOSA_STAND_IN
    run_note = ("Vela's command stream itself is not executed here (this runtime has no "
                f"{arm_adapter.ETHOS_U_BACKEND_ID}): the program ran in ExecuTorch with each Ethos-U delegate "
                "replaced by the TOSA Vela was given, on the TOSA reference model, and its CPU operators "
                "(the input quantize, the output dequantize) on ExecuTorch's kernels")

    def __init__(self, name: str = "ethos-u") -> None:
        self.name = name  # the accelerator, as Arm's EthosUCompileSpec names it

    def check_ready(self) -> None:
        arm_adapter.ethos_u_compile_spec(self.name)  # an unknown accelerator fails before any work
        if not arm_adapter.vela_available():
            raise VelaError(f"target={self.name!r} needs Vela: pip install ethos-u-vela==5.2.0")

    def int8_flow(self, spec: Any) -> Int8Flow:
        return ArmInt8Flow(spec.tosa_spec, self.name)

    def integer_partitioner(self, spec: Any) -> Any:
        return CodecTosaPartitioner(spec)

    def named_data_keys(self, payload: bytes) -> dict[str, int | None]:
        """Vela's external blocks (the weight block, with external weights): the key each
        one's data holds. Their size is not in the stream (the runtime takes the blob)."""
        try:
            blocks = arm_adapter.vela_blocks(payload)
        except ValueError:
            return {}  # not Vela's stream: nothing this target reads from named data
        return {data.decode("ascii", errors="replace"): None for _, ext, data in blocks if ext}

    def cycle_model(self, quantizer: Any, prepared: torch.fx.GraphModule, example: Sequence[Any]) -> Any:
        return VelaCycles(quantizer, prepared, example, self.name)


__all__ = ["EthosUTarget", "VelaError"]
