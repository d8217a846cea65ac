"""CodecTosaPartitioner: Arm's operator support, non-local codec placement, calibration."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch.export import ExportedProgram
from torch.fx.passes.operator_support import OperatorSupportBase

from codec_tosa import arm_adapter, progress
from codec_tosa._passes.fold_batch_norm import fold_batch_norms
from codec_tosa._passes.decompose_softmax import decompose_softmax
from codec_tosa._passes.mean_to_avg_pool import spatial_means_to_avg_pool
from codec_tosa.backend import BACKEND_ID
from codec_tosa.calibration import random_calibration
from codec_tosa.graph import has_empty_tensor
from codec_tosa.planning import PlannedProgram, plan_program
from codec_tosa.provenance import option_specs, provenance_specs
from codec_tosa.spec import INT_FP, CodecSpec


# Operators Arm keeps whole that an integer lowering needs decomposed. silu: Arm's
# INT+FP support (which plans) rejects a whole silu, so the plan does not mark it
# quantized and Arm's Ethos-U partitioner leaves it on the CPU; decomposed it is
# sigmoid (a TABLE) times x, both integer rows. pad: the table encodes its
# decomposition (constant_pad_nd), not aten.pad. Either left on the CPU has no
# portable kernel (aten::silu.out, aten::pad.out).
_DECOMPOSED_WHEN_INTEGER = frozenset({torch.ops.aten.silu.default, torch.ops.aten.pad.default})


class CodecTosaPartitioner(Partitioner):
    """Use like Arm's TOSAPartitioner: ``to_edge_transform_and_lower(ep, partitioner=[...])``.

    `calibration` is a list of input tuples; without it, seeded random inputs
    shaped like the program's inputs are used (with a warning).
    """

    def __init__(self, spec: CodecSpec | None = None,
                 calibration: Sequence[Sequence[torch.Tensor]] | None = None) -> None:
        self.codec_spec = spec or CodecSpec()
        # a bare tensor stays as it is, for check_calibration to name the mistake
        # (tuple() would split it into slices and report a shape instead)
        self.calibration = ([c if isinstance(c, torch.Tensor) else tuple(c) for c in calibration]
                            if calibration is not None else None)
        self.arm_spec = arm_adapter.tosa_compile_spec(self.codec_spec.tosa_spec)
        # An integer-only spec plans here and delegates in a second step
        # (`IntegerPartitioner`): Arm's INT operator support takes only a graph
        # that is already quantized, so planning asks which operators Arm can
        # lower once quantized, i.e. its INT+FP support.
        support_spec = (arm_adapter.tosa_compile_spec(INT_FP) if self.codec_spec.integer_only
                        else self.arm_spec)
        self._arm = arm_adapter.stock_partitioner(support_spec, additional_checks=[_NoEmptyTensors()])
        self.delegation_spec = DelegationSpec(BACKEND_ID, arm_adapter.arm_compile_spec_entries(self.arm_spec))
        self._real_state: dict[str, torch.Tensor] = {}
        # what `partition` planned (the compiler and the simulation read it)
        self.planned: PlannedProgram | None = None

    # Arm's hooks, so that to_edge_transform_and_lower prepares the graph as for Arm.
    # They are also the only places that see the real weights: ExecuTorch hands
    # `partition` a program whose state dict is FakeTensors, so we keep the real
    # tensors (by their fully qualified names) for calibration.
    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        out = self._arm.transform_for_pre_decomposition(exported_program)
        if not self.codec_spec.reference:
            # conv+BN must be one compressible operator for the plan (as the
            # analysis folds it); the reference policy has no plan, so Arm
            # lowers its batch norms itself and the bytes are stock
            fold_batch_norms(out)
        if self.codec_spec.integer_only:
            spatial_means_to_avg_pool(out)  # Arm's INT8 mean.dim needs it (the pass says why)
            decompose_softmax(out)  # as Arm's INT8 flow, so that each piece is integer
        self._real_state.update(out.state_dict)
        return out

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        self._real_state.update(ep.state_dict)
        ops, arm_keeps = self._arm.ops_to_not_decompose(ep)
        if not self.codec_spec.integer_only:
            return ops, arm_keeps
        # Arm keeps an activation such as hardswish whole (one INT8 TABLE) only when
        # q/dq nodes already surround it; here they are written after planning, so
        # keep whole what the plan encodes (decomposed, hardswish's division by 6
        # stays FP32 on the CPU and splits the delegate)
        table, policy = self.codec_spec.commutation_table, self.codec_spec.policy
        encoded = {op for op in ops if (row := table.lookup(str(op))) is not None and row.encoded
                   and table.order.selects(policy, row.policy) and op not in _DECOMPOSED_WHEN_INTEGER}

        def keeps(node: torch.fx.Node) -> bool:
            if node.target in _DECOMPOSED_WHEN_INTEGER:
                return False
            return node.target in encoded or (arm_keeps is not None and arm_keeps(node))

        return ops, keeps

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        progress.stage(progress.PLACEMENT)
        arm_result = self._arm.partition(exported_program)  # tags what TOSA can take
        ep = arm_result.tagged_exported_program
        self._real_state.update(_lifted_constants(ep))
        # operators left on the CPU run FP32, so partition boundaries are plain
        delegated = {n.name for n in ep.graph.nodes if "delegation_tag" in n.meta}
        self.planned = plan_program(ep, self.codec_spec, self._calibration(ep), self._real_state, delegated)
        if self.codec_spec.integer_only:
            # a partitioner may not change the graph (ExecuTorch checks), and
            # the codecs must be in it before Arm's INT partitioner runs
            return PartitionResult(tagged_exported_program=ep, partition_tags={})
        specs = (list(self.delegation_spec.compile_specs) + option_specs(self.codec_spec)
                 + provenance_specs(self.codec_spec, self.planned.to_json()))
        delegation = DelegationSpec(BACKEND_ID, specs)
        tags = {tag: delegation for tag in arm_result.partition_tags}
        return PartitionResult(tagged_exported_program=ep, partition_tags=tags)

    def _calibration(self, ep: ExportedProgram) -> list[tuple[torch.Tensor, ...]]:
        if self.calibration is not None:
            return self.calibration
        warnings.warn("CodecTosaPartitioner: no calibration inputs given; using seeded random "
                      "inputs shaped like the example inputs", stacklevel=3)
        examples = [n.meta["val"] for n in ep.graph.nodes
                    if n.op == "placeholder" and n.name in ep.graph_signature.user_inputs]
        return random_calibration([torch.zeros(t.shape, dtype=t.dtype) for t in examples])


class IntegerPartitioner(Partitioner):
    """The second step of an integer-only lowering (docs/DESIGN.md, "Integer targets").

    It runs on `planned.materialized()`, the edge program with the plan written
    as PT2E q/dq nodes, which is what Arm's INT flow sees after `convert_pt2e`.
    Arm's stock partitioner for the spec (TOSA-1.0+INT, or Ethos-U for a
    `target`) tags what it can lower; the graph's input encodes and output
    decodes stay on the CPU as quantize/dequantize kernels, as in Arm's flow.
    The delegate is CodecTosaBackend for TOSA, Arm's EthosUBackend (Vela) for
    an Ethos-U target; either way the plan's provenance travels with it.
    """

    def __init__(self, planned: PlannedProgram) -> None:
        spec = planned.spec
        provenance = provenance_specs(spec, planned.to_json())
        if spec.ethos_u:
            arm_spec = arm_adapter.ethos_u_compile_spec(spec.target)
            self._arm = arm_adapter.ethos_u_partitioner(arm_spec, additional_checks=[_NoEmptyTensors()])
            backend_id = arm_adapter.ETHOS_U_BACKEND_ID
            specs = arm_adapter.arm_compile_spec_entries(arm_spec) + provenance
        else:
            arm_spec = arm_adapter.tosa_compile_spec(spec.tosa_spec)
            self._arm = arm_adapter.stock_partitioner(arm_spec, additional_checks=[_NoEmptyTensors()])
            backend_id = BACKEND_ID
            specs = arm_adapter.arm_compile_spec_entries(arm_spec) + option_specs(spec) + provenance
        self.delegation_spec = DelegationSpec(backend_id, specs)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        # the planning step's partition (Arm's INT+FP support) tagged these nodes
        # too, and Arm's partitioner only adds tags: a stale one would put an FP32
        # operator (an unfolded batch norm) into the integer delegate
        for node in exported_program.graph.nodes:
            node.meta.pop("delegation_tag", None)
        arm_result = self._arm.partition(exported_program)
        tags = {tag: self.delegation_spec for tag in arm_result.partition_tags}
        return PartitionResult(tagged_exported_program=arm_result.tagged_exported_program,
                               partition_tags=tags)


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
    from torch._subclasses.fake_tensor import FakeTensor

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


__all__ = ["CodecTosaPartitioner", "IntegerPartitioner"]
