"""VGF (ML SDK for Vulkan): Arm's VgfBackend. A mixed policy's delegate is our TOSA
lowering inside Arm's VGF step (`CodecTosaPartitioner`); an integer program is Arm's
own VGF flow (its VgfPartitioner and model converter). Each delegate's VGF and the
TOSA it was converted from are written beside the .pte; validate runs each VGF on
the ML SDK's emulation layer."""

from __future__ import annotations

from typing import Any, ContextManager

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.runtime.pte import ProgramFiles, delegates
from codec_tosa.serialization.tosa_stats import tosa_stats
from codec_tosa.targets.arm_int8_flow import ArmInt8Flow
from codec_tosa.targets.artefacts import delegate_file
from codec_tosa.targets.base import VGF_EMULATION, Int8Flow, Target
from codec_tosa.targets.vgf.convert import conversion_error
from codec_tosa.targets.vgf.tools import model_converter


class VgfTarget(Target):
    name = "vgf"
    backend_id = arm_adapter.VGF_BACKEND_ID
    tosa_beside = True
    payload_is_tosa = False
    runs_on = VGF_EMULATION
    run_note = ("this ExecuTorch runtime has no VgfBackend: each VGF ran on the ML SDK emulation "
                "layer (lavapipe) instead, and the CPU part of the program did not run")
    external_weights_refusal = ("external_weights=True: target='vgf' keeps its weights in the VGF file: Arm's "
                                "VgfBackend has no named-data support in executorch 1.5.1")

    def int8_flow(self, spec: Any) -> Int8Flow:
        return ArmInt8Flow(spec.tosa_spec, None)

    def integer_partitioner(self, spec: Any) -> Any:
        return arm_adapter.vgf_partitioner()

    def lowering(self) -> ContextManager[Any]:
        # Arm's integer VGF flow: its converter, with each conversion's TOSA kept
        return arm_adapter.vgf_conversions_kept(str(model_converter()))

    def lowering_error(self, error: BaseException) -> BaseException | None:
        # Arm's vgf_compile: "Vgf compiler failed.\n...Stderr:\n..."
        if isinstance(error, RuntimeError) and str(error).startswith("Vgf compiler failed"):
            return conversion_error("VgfBackend delegate", str(error).split("Stderr:", 1)[-1], 1)
        return None

    def files(self, program: ProgramFiles) -> tuple[dict[str, bytes], dict[str, Any]]:
        """model.vgf and model.tosa of each VgfBackend delegate, and report.json's account of them."""
        files: dict[str, bytes] = {}
        report = []
        vgfs = [d.payload for d in delegates(program.pte) if d.backend_id == self.backend_id]
        for i, vgf in enumerate(vgfs):
            tosa = arm_adapter.tosa_of_payload(vgf)
            if tosa is None:
                raise RuntimeError(f"VgfBackend delegate {i}: the TOSA it was converted from was not journaled")
            files[delegate_file(i, "vgf")], files[delegate_file(i, "tosa")] = vgf, tosa
            report.append({"delegate": i, "tosa_bytes": len(tosa), "vgf_bytes": len(vgf),
                           "tosa": tosa_stats(tosa).to_dict()})
        return files, {"vgf": report}


__all__ = ["VgfTarget"]
