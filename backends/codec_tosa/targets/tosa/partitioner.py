"""CodecTosaPartitioner: Arm's operator support, non-local codec placement, calibration."""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Sequence

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.fx.passes.operator_support import OperatorSupportBase

from codec_tosa import progress
from codec_tosa._passes.fold_batch_norm import FoldBatchNormPass
from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.graph import has_empty_tensor, target_key, user_input_nodes
from codec_tosa.planning.calibration import random_calibration
from codec_tosa.planning.program import PlannedProgram, plan_program
from codec_tosa.planning.provenance import option_specs, provenance_specs
from codec_tosa.planning.safe_softmax import guards_never_fire
from codec_tosa.serialization import external
from codec_tosa.spec import XNNPACK_TARGET, CodecSpec
from codec_tosa.targets.tosa.backend import BACKEND_ID, lower_to_tosa
from codec_tosa.targets.tosa.tags import DELEGATION_TAG, codes_at_boundaries, drop_constant_only, split_cycles
from codec_tosa.targets.vgf.target import VgfTarget
from codec_tosa.targets.vgf.tools import model_converter


class CodecTosaPartitioner(Partitioner):
    """Use like Arm's TOSAPartitioner: ``to_edge_transform_and_lower(ep, partitioner=[...])``.

    At a mixed policy (Z, Y, X, W, V) it plans the codecs (placement and
    calibration) and delegates to `CodecTosaBackend` (`target="tosa"`) or to
    Arm's `VgfBackend` (`target="vgf"`, our TOSA lowering inside Arm's VGF
    conversion). `calibration` is a list of input tuples; without it, seeded
    random inputs shaped like the program's inputs are used (with a warning).

    An integer-only spec (policy I, an Ethos-U target) is served on a program
    that `CodecQuantizer` quantized (PT2E: prepare, calibrate, convert, export):
    Arm's INT partitioner for the target tags it, and the delegate is
    `CodecTosaBackend` (constant pooling) or Arm's `EthosUBackend` (Vela).
    Given an unquantized program it refuses in one line, naming the recipe:
    nothing may come out without the delegate the spec asks for.
    """

    def __init__(self, spec: CodecSpec | None = None,
                 calibration: Sequence[Sequence[torch.Tensor]] | None = None,
                 intermediates: str | None = None) -> None:
        """`intermediates`: a directory for the TOSA lowering's intermediate artefacts,
        as Arm's ``compile_spec.dump_intermediate_artifacts_to`` (the TOSA flatbuffer
        of each delegate, named as Arm names it)."""
        self.codec_spec = spec or CodecSpec()
        # a bare tensor stays as it is, for check_calibration to name the mistake
        # (tuple() would split it into slices and report a shape instead)
        self.calibration = ([c if isinstance(c, torch.Tensor) else tuple(c) for c in calibration]
                            if calibration is not None else None)
        checks = [_NoEmptyTensors()]
        spec_ = self.codec_spec
        if spec_.target == XNNPACK_TARGET:
            raise ValueError("CodecTosaPartitioner: target='xnnpack' is lowered by XNNPACK's own partitioner: "
                             "quantize with CodecQuantizer(spec), then to_edge_transform_and_lower(ep, "
                             "partitioner=[XnnpackPartitioner()])")
        if spec_.target == "vgf" and spec_.integer_only:
            raise ValueError("CodecTosaPartitioner: an integer VGF is Arm's: quantize with CodecQuantizer(spec), "
                             "then lower with VgfPartitioner(VgfCompileSpec()) (README, \"Python API\")")
        if spec_.ethos_u:
            # external weights: Vela's weight block to named data (Arm's external_block_placements)
            arm_spec = arm_adapter.ethos_u_compile_spec(spec_.target,
                                                        external.TAG if spec_.external_weights else None)
            arm_spec.dump_intermediate_artifacts_to(intermediates)
            self._arm = arm_adapter.ethos_u_partitioner(arm_spec, additional_checks=checks)
            self.delegation_spec = DelegationSpec(arm_adapter.ETHOS_U_BACKEND_ID,
                                                  arm_adapter.arm_compile_spec_entries(arm_spec))
        else:
            arm_spec = arm_adapter.tosa_compile_spec(spec_.tosa_spec)
            arm_spec.dump_intermediate_artifacts_to(intermediates)
            self._arm = arm_adapter.stock_partitioner(arm_spec, additional_checks=checks)
            self._arm_spec, self._intermediates = arm_spec, intermediates
            if spec_.target == "vgf":
                VgfTarget().check_spec(spec_)
                # ExecuTorch lowers a VgfBackend delegate with Arm's VgfBackend, whose
                # TOSA step then runs ours for a program that carries our plan
                arm_adapter.install_vgf_tosa_lowering(_lower_planned_tosa, str(_model_converter()))
            self.delegation_spec = self._mixed_delegation(without_safe_softmax_guards=False)
        arm_adapter.install_payload_journal()  # codec_tosa.save finds the TOSA behind a VGF/Ethos-U payload
        self._real_state: dict[str, torch.Tensor] = {}
        # what `partition` planned (the compiler and the simulation read it); None at
        # an integer-only spec, whose plan is CodecQuantizer's
        self.planned: PlannedProgram | None = None
        # whether the program's SDPA safe-softmax guards can never fire (set per program
        # by transform_for_pre_decomposition, which sees the attentions whole)
        self.safe_softmax_guards_removed = False

    def _mixed_delegation(self, without_safe_softmax_guards: bool) -> DelegationSpec:
        """The delegate at a mixed policy: ours (TOSA) or Arm's VgfBackend running our lowering."""
        spec = self.codec_spec
        if spec.target == "vgf":
            return DelegationSpec(arm_adapter.VGF_BACKEND_ID, arm_adapter.vgf_compile_spec_entries(
                spec.tosa_spec, self._intermediates, without_safe_softmax_guards))
        delegate_spec = self._arm_spec
        if without_safe_softmax_guards:
            delegate_spec = copy.copy(delegate_spec)  # Arm's partitioner keeps the original
            arm_adapter.remove_safe_softmax_guards(delegate_spec)
        return DelegationSpec(BACKEND_ID, arm_adapter.arm_compile_spec_entries(delegate_spec) + option_specs(spec))

    # Arm's hooks, so that to_edge_transform_and_lower prepares the graph as for Arm.
    # They are also the only places that see the real weights: ExecuTorch hands
    # `partition` a program whose state dict is FakeTensors, so we keep the real
    # tensors (by their fully qualified names) for calibration.
    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        if self.codec_spec.integer_only:
            return self._arm.transform_for_pre_decomposition(exported_program)
        out = self._arm.transform_for_pre_decomposition(exported_program)
        if not self.codec_spec.reference:
            # conv+BN must be one compressible operator for the plan (as the
            # analysis folds it); the reference policy has no plan, so Arm
            # lowers its batch norms itself and the bytes are stock
            FoldBatchNormPass(out)(out.graph_module)
        # the attentions are still whole here; the reference policy keeps stock's guards
        self.safe_softmax_guards_removed = not self.codec_spec.reference and guards_never_fire(out)
        self._real_state.update(out.state_dict)
        return out

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        self._real_state.update(ep.state_dict)
        return self._arm.ops_to_not_decompose(ep)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        if self.codec_spec.integer_only:
            return self._partition_quantized(exported_program)
        progress.stage(progress.PLACEMENT)
        ep, tags = _tagged(self._arm.partition(exported_program))  # tags what TOSA can take
        self._real_state.update(_lifted_constants(ep))
        # operators left on the CPU run FP32, so partition boundaries are plain
        delegated = {n.name for n in ep.graph.nodes if DELEGATION_TAG in n.meta}
        self.planned = plan_program(ep, self.codec_spec, self._calibration(ep), self._real_state, delegated)
        delegate = self._mixed_delegation(self.safe_softmax_guards_removed)
        specs = list(delegate.compile_specs) + provenance_specs(self.codec_spec, self.planned.to_json())
        delegation = DelegationSpec(delegate.backend_id, specs)
        return PartitionResult(tagged_exported_program=ep, partition_tags={tag: delegation for tag in tags})

    def _partition_quantized(self, exported_program: ExportedProgram) -> PartitionResult:
        """A CodecQuantizer program: Arm's INT partitioner for the target tags it
        (the plan is in its q/dq nodes; the graph input's encode and the output's
        decode stay on the CPU, as in Arm's flow)."""
        _require_quantized(exported_program, self.codec_spec)
        progress.stage(progress.PLACEMENT)
        ep, tags = _tagged(self._arm.partition(exported_program), integer=True)
        specs = list(self.delegation_spec.compile_specs) + provenance_specs(self.codec_spec, {})
        delegation = DelegationSpec(self.delegation_spec.backend_id, specs)
        return PartitionResult(tagged_exported_program=ep, partition_tags={tag: delegation for tag in tags})

    def _calibration(self, ep: ExportedProgram) -> list[tuple[torch.Tensor, ...]]:
        if self.calibration is not None:
            return self.calibration
        warnings.warn("CodecTosaPartitioner: no calibration inputs given; using seeded random "
                      "inputs shaped like the example inputs", stacklevel=3)
        examples = [n.meta["val"] for n in user_input_nodes(ep)]
        return random_calibration([torch.zeros(t.shape, dtype=t.dtype) for t in examples])


def _tagged(arm_result: PartitionResult, integer: bool = False) -> tuple[ExportedProgram, list[str]]:
    """Arm's tagging, without a delegate that only outputs constants and without a tag a
    CPU operator both reads from and feeds; `integer`: every delegate takes in and gives
    out codes (`tags`)."""
    ep = arm_result.tagged_exported_program
    tags = drop_constant_only(ep, arm_result.partition_tags)
    if integer:
        codes_at_boundaries(ep.graph_module, tags)
    return ep, split_cycles(ep.graph_module, tags)


INTEGER_RECIPE = ("quantize it with codec_tosa.CodecQuantizer first (prepare_pt2e, calibrate, convert_pt2e, "
                  "torch.export.export), then lower it with this partitioner or Arm's stock one "
                  "(docs/DESIGN.md, \"Integer targets\")")


def _is_float(val: Any) -> bool:
    vals = val if isinstance(val, (tuple, list)) else [val]
    return any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals)


class NotQuantizedError(ValueError):
    """An integer-only spec was given a program with no quantize/dequantize nodes."""


def _require_quantized(ep: ExportedProgram, spec: CodecSpec) -> None:
    """Refuses a program with floating-point compute and no quantize/dequantize
    node; one on integer and bool tensors only needs no quantization."""
    if any(n.op == "call_function" and target_key(n.target).startswith("quantized_decomposed.")
           for n in ep.graph.nodes):
        return
    if not any(n.op == "call_function" and _is_float(n.meta.get("val")) for n in ep.graph.nodes):
        return
    where = f"target {spec.target}" if spec.ethos_u else spec.tosa_spec
    raise NotQuantizedError(f"CodecTosaPartitioner: policy {spec.policy} ({where}) delegates integer "
                            f"operators only and the program is not quantized: {INTEGER_RECIPE}")


def _lower_planned_tosa(edge_program: ExportedProgram, arm_spec: Any) -> bytes:
    """Our TOSA lowering for a VgfBackend delegate (pooling on, as CodecTosaBackend's default)."""
    return lower_to_tosa(edge_program, arm_spec, pool_constants=True).payload


def _model_converter() -> Any:
    return model_converter()


class _NoEmptyTensors(OperatorSupportBase):
    """Operators on zero-size tensors stay on the CPU: the TOSA reference model
    rejects a graph with an empty tensor at run time (the .pte would compile but
    not run), and they move no data worth compressing."""

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        return not has_empty_tensor(node)


def _lifted_constants(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    """Real values of the constants to_edge lifts after our hooks ran (scalars made
    tensors, e.g. the 1 of ``y + 1``): the program holds them as FakeTensor buffers,
    but `lift_constant_tensor_pass` keeps the real tensor on the placeholder's
    FakeTensor as ``.constant``."""
    target_of = {s.arg.name: s.target for s in ep.graph_signature.input_specs
                 if s.target is not None and hasattr(s.arg, "name")}
    out: dict[str, torch.Tensor] = {}
    for n in ep.graph.nodes:
        if n.op != "placeholder" or n.name not in target_of:
            continue
        real = getattr(n.meta.get("val"), "constant", None)
        if isinstance(real, torch.Tensor) and not isinstance(real, FakeTensor):
            out[target_of[n.name]] = real
    return out


__all__ = ["CodecTosaPartitioner", "INTEGER_RECIPE", "NotQuantizedError"]
