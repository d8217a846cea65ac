"""CodecTosaPartitioner: Arm's operator support, non-local codec placement, calibration."""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Sequence

import torch
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from torch.export import ExportedProgram
from torch.fx.passes.operator_support import OperatorSupportBase

from codec_tosa import arm_adapter
from codec_tosa.backend import CodecTosaBackend
from codec_tosa.codecs.base import Theta
from codec_tosa.codecs.calibration import learn_thetas, random_calibration
from codec_tosa.fold_batch_norm import fold_batch_norms
from codec_tosa.graph import PortGraph, has_empty_tensor
from codec_tosa.placement import Placement, place
from codec_tosa.placement.materialize import int8_unsupported
from codec_tosa.plan_meta import write_plan_meta
from codec_tosa.provenance import provenance_specs
from codec_tosa.spec import CodecSpec

BACKEND_ID = CodecTosaBackend.__name__  # ExecuTorch finds backends by class name


class CodecTosaPartitioner(Partitioner):
    """Use like Arm's TOSAPartitioner: ``to_edge_transform_and_lower(ep, partitioner=[...])``.

    `calibration` is a list of input tuples; without it, seeded random inputs
    shaped like the program's inputs are used (with a warning).
    """

    def __init__(self, spec: CodecSpec | None = None,
                 calibration: Sequence[Sequence[torch.Tensor]] | None = None) -> None:
        self.codec_spec = spec or CodecSpec()
        self.calibration = [tuple(c) for c in calibration] if calibration is not None else None
        self.arm_spec = arm_adapter.tosa_compile_spec(self.codec_spec.tosa_spec)
        self._arm = arm_adapter.stock_partitioner(self.arm_spec, additional_checks=[_NoEmptyTensors()])
        self.delegation_spec = DelegationSpec(BACKEND_ID, arm_adapter.arm_compile_spec_entries(self.arm_spec))
        self._real_state: dict[str, torch.Tensor] = {}
        self.last_placement: Placement | None = None
        self.last_placement_graph: PortGraph | None = None
        self.last_program: ExportedProgram | None = None  # the planned edge program, real weights
        self.last_thetas: dict[int, Theta] = {}

    # Arm's hooks, so that to_edge_transform_and_lower prepares the graph as for Arm.
    # They are also the only places that see the real weights: ExecuTorch hands
    # `partition` a program whose state dict is FakeTensors, so we keep the real
    # tensors (by their fully qualified names) for calibration.
    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        out = self._arm.transform_for_pre_decomposition(exported_program)
        fold_batch_norms(out)  # as the analysis does: conv+BN is one compressible operator
        self._real_state.update(out.state_dict)
        return out

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        self._real_state.update(ep.state_dict)
        return self._arm.ops_to_not_decompose(ep)

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        arm_result = self._arm.partition(exported_program)  # tags what TOSA can take
        ep = arm_result.tagged_exported_program
        self._real_state.update(_lifted_constants(ep))
        graph = PortGraph.from_program(ep)
        # operators left on the CPU run FP32, so partition boundaries are plain;
        # so do those Arm's lowering cannot take with encoded ports
        plain_ops = [op for op in range(graph.num_ops)
                     if "delegation_tag" not in graph.fx_op_node[op].meta  # type: ignore[union-attr]
                     or int8_unsupported(graph, op) is not None]
        table = self.codec_spec.commutation_table
        result = place(graph, table, self.codec_spec.policy, self.codec_spec.placement,
                       fused_transcode=self.codec_spec.fused_transcode, plain_ops=plain_ops)
        thetas = learn_thetas(ep, graph, result.plan, self._calibration(ep),
                              real_state=self._real_state) if result.plan.domains else {}
        write_plan_meta(graph, result.semantics, result.plan, thetas)
        self.last_placement, self.last_thetas = result, thetas
        self.last_placement_graph = graph
        self.last_program = _real_copy(ep, self._real_state)

        specs = list(self.delegation_spec.compile_specs) + provenance_specs(
            self.codec_spec, plan_json(graph, result, thetas))
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


def _real_copy(ep: ExportedProgram, real_state: dict[str, torch.Tensor]) -> ExportedProgram:
    """A copy of the planned program with real weights, for the PyTorch simulation."""
    gm = copy.deepcopy(ep.graph_module)
    state = {k: real_state.get(k, v) for k, v in ep.state_dict.items()}
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=copy.deepcopy(ep.graph_signature),
        state_dict=state, range_constraints=copy.deepcopy(ep.range_constraints),
        module_call_graph=copy.deepcopy(ep.module_call_graph), constants=dict(ep.constants),
        verifiers=[ep.verifier])


def simulate(program: ExportedProgram, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run the plan in PyTorch with the integer arithmetic of Arm's INT8 lowering
    (`codec_tosa.simulation`)."""
    from codec_tosa.simulation import simulate as simulate_plan

    return simulate_plan(program, inputs)


def plan_json(graph: PortGraph, result: Placement, thetas: dict[int, Theta]) -> dict[str, Any]:
    """A compact, deterministic description of the plan for the delegate's provenance."""
    plan = result.plan
    return {
        "domains": [
            {"id": d.id, "dominator": d.dominator,
             **({"scale": thetas[d.id].scale, "zero_point": thetas[d.id].zero_point}
                if d.id in thetas else {})}
            for d in plan.domains
        ],
        "codecs": [c.to_json() for c in plan.codecs],
    }


__all__ = ["BACKEND_ID", "CodecTosaPartitioner", "plan_json"]
