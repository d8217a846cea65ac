"""The `Target` interface: what one target says about itself, so that the compiler,
`save`, `report`, `validate` and the quantizer ask it and never branch on its name
(docs/DESIGN.md, "Targets"). A target is a folder under `targets/` with one
`Target`; `targets.target_of` finds it by the name `CodecSpec(target=...)` gives.

`Int8Flow` is what `CodecQuantizer` asks of the integer flow a target lowers
(Arm's INT flow, or XNNPACK's): the answers are in `arm_int8_flow` and
`xnnpack/int8_flow`."""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Mapping, Sequence

import torch
import torch.fx
from torchao.quantization.pt2e.quantizer import QuantizationAnnotation

from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import PortGraph
from codec_tosa.runtime.pte import ProgramFiles
from codec_tosa.serialization import external
from codec_tosa.targets.artefacts import PTD

Annotations = Mapping[str, QuantizationAnnotation]  # by node name

# how `validate` runs a program whose delegates are the target's
EXECUTORCH = "executorch"  # as it is, in ExecuTorch's runtime (ours has CodecTosaBackend)
TOSA_STAND_IN = "tosa stand-in"  # each delegate replaced by the TOSA it was compiled from
RELABELLED = "relabelled"  # a stock TOSA delegate run by our runtime backend
VGF_EMULATION = "vgf emulation"  # each VGF on the ML SDK's emulation layer


class Int8Flow:
    """What differs between the integer flows `CodecQuantizer` annotates for.

    * `transform_for_annotation`: the graph as the flow decomposes it before annotation;
    * `annotations`: the flow's own quantizer's annotation of each operator it takes
      (Arm), or ``{}`` where that is the commutation table's data (XNNPACK);
    * `plain_ops`: the operators whose ports are plain (run FP32);
    * `fuses`: whether the flow folds an activation into its producer;
    * `bias_codes`: a convolution's or linear's bias as int32 codes at ``s_in * s_w``
      (Arm's INT8 convolution reads them), or left FP32;
    * `fold_needs_lowest_zero_point`: whether a folded activation's domain must code
      0.0 as its lowest code even with symmetric activations (Arm's
      FuseQuantizedActivationPass moves the quantize's qmin up to the zero point, but
      the producer's RESCALE saturates at the int8 range: with zero point 0 the relu
      is lost, with -128 the saturation is the relu).
    """

    name = ""
    bias_codes = True
    fold_needs_lowest_zero_point = True

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        raise NotImplementedError

    def select(self, selection: Any) -> None:
        """Select modules on the flow's own quantizer as `CodecQuantizer` selects them
        (`quantizer.module_selection`), where the flow depends on it."""

    def annotations(self, model: torch.fx.GraphModule) -> dict[str, QuantizationAnnotation]:
        return {}

    def plain_ops(self, graph: PortGraph, table: CommutationTable, annotations: Annotations) -> list[int]:
        raise NotImplementedError

    def fuses(self, graph: PortGraph, producer: int, activation: int, table: CommutationTable) -> bool:
        raise NotImplementedError


class Target:
    """One target: its delegate, its integer flow, its artefacts, how it runs and
    validates. The defaults are those of a TOSA delegate of ours."""

    name = ""  # as `CodecSpec(target=...)` names it
    backend_id = ""  # the delegates it makes, as the .pte names them
    # the delegate's payload is a TOSA flatbuffer (ours, or Arm's stock TOSA delegate)
    payload_is_tosa = True
    # the delegate's payload is what its TOSA was compiled to (a VGF, Vela's command
    # stream): compile and `save` write that TOSA beside the .pte (`artefacts.delegate_file`)
    tosa_beside = False
    # `validate` has nothing to run without that TOSA (the payload runs nowhere here)
    needs_tosa_beside = False
    # the plan's integer simulation is its outputs' oracle (else eager, by SQNR)
    simulated = True
    # its artefact runs on the reference model, so it can decide ambiguous codes
    decides_rounding = False
    runs_on = EXECUTORCH  # how `validate` runs it
    run_note = ""  # what `validate` says of how it ran
    partitioner_name = "Arm's INT partitioner"  # what lowers a CodecQuantizer program
    # why the target cannot keep its weights in a .ptd (`CodecSpec(external_weights=True)`),
    # in one line; "": it can, through its own mechanism
    external_weights_refusal = ""

    def check_ready(self) -> None:
        """Refuses, in one line, a target whose tools are missing, before any work."""

    def check_spec(self, spec: Any) -> None:
        """Refuses, in one line, what the spec asks and the target cannot do."""
        if getattr(spec, "external_weights", False) and self.external_weights_refusal:
            raise ValueError(self.external_weights_refusal)

    def tag_external_weights(self, program: Any) -> int:
        """Marks a quantized program's constants for external weights where the target's
        mechanism reads marks on the program (XNNPACK's external constants); returns how
        many it marked. Ours and Arm's take it from the compile spec instead: 0."""
        return 0

    def named_data_keys(self, payload: bytes) -> dict[str, int | None]:
        """The named data a delegate payload of this target reads at init: key -> bytes
        (None: size not known here). Ours: the external weights of its payload."""
        return dict(external.needed(payload))

    def int8_flow(self, spec: Any) -> Int8Flow:
        raise NotImplementedError

    def integer_partitioner(self, spec: Any) -> Any:
        """The partitioner that lowers the program `CodecQuantizer(spec)` made."""
        raise NotImplementedError

    def lowering(self) -> ContextManager[Any]:
        """Around the lowering of a quantized program: what it keeps of it."""
        return contextlib.nullcontext()

    def lowering_error(self, error: BaseException) -> BaseException | None:
        """The one-line error of a failure in the target's own lowering, or None."""
        return None

    def files(self, program: ProgramFiles) -> tuple[dict[str, bytes], dict[str, Any]]:
        """The files compile writes beside the .pte for the target's delegates (model.vgf,
        ...), and report.json's account of them."""
        return {}, {}

    def data_files(self, program: ProgramFiles) -> tuple[dict[str, bytes], dict[str, Any]]:
        """The program's named data beside the .pte, model.ptd, when its weights are
        external (compile and `save` write it), and report.json's account of it."""
        if program.ptd is None:
            return {}, {}
        return {PTD: program.ptd.bytes()}, {"ptd": {"file": PTD, "bytes": program.ptd.nbytes,
                                                    "keys": len(program.ptd)}}

    def cycle_model(self, quantizer: Any, prepared: torch.fx.GraphModule, example: Sequence[Any]) -> Any:
        """What prices widths in the target's own cycles for the precision search
        (called with those widths), or None: widths are priced in bytes."""
        return None


__all__ = ["Annotations", "EXECUTORCH", "Int8Flow", "RELABELLED", "TOSA_STAND_IN", "Target", "VGF_EMULATION"]
