"""The planning step: placement and calibration on an edge program, as one record.

`plan_program` is what `CodecTosaPartitioner.partition` does once Arm's
operator support has tagged the graph: place the codecs (docs/DESIGN.md,
"Placement"), learn each domain's theta at its absolute dominator
("Calibration"), and write the plan on the FX nodes for the backend
("How the plan travels"). It returns a `PlannedProgram`, the one record of
what was planned, which the compiler, the simulation and the reports read.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import torch
from torch.export import ExportedProgram

from codec_tosa._passes.materialize_codecs import DQ_TENSOR
from codec_tosa.codecs.base import Theta
from codec_tosa.graph import PortGraph
from codec_tosa.placement import Placement, place
from codec_tosa.placement.meta import write_plan_meta
from codec_tosa.planning.calibration import learn_thetas
from codec_tosa.planning.traffic import Traffic, measure
from codec_tosa.pytrees import returned_outputs
from codec_tosa.spec import CodecSpec


@dataclass
class PlannedProgram:
    """One program as the partitioner planned it."""

    spec: CodecSpec
    graph: PortGraph  # the port view the plan refers to
    placement: Placement
    thetas: dict[int, Theta]
    # the planned edge program with real weights, plan on node meta; None when the plan
    # was written as PT2E annotations (`CodecQuantizer`), whose converted program is
    # the materialised one
    program: ExportedProgram | None
    _materialized: ExportedProgram | None = field(default=None, repr=False)

    def materialized(self) -> ExportedProgram:
        """The program with the plan's codecs inserted (computed once, then shared)."""
        if self._materialized is None:
            assert self.program is not None
            from codec_tosa._passes.materialize_codecs import MaterializeCodecsPass

            program = real_copy(self.program, {})
            MaterializeCodecsPass(program)(program.graph_module)
            self._materialized = program
        return self._materialized

    def traffic(self) -> Traffic:
        """The modeled traffic of the plan as placed on the edge graph."""
        return measure(self.graph, self.placement.semantics, self.placement.plan,
                       self.spec.fused_transcode, per_op=False)

    def output_steps(self, fallback: Sequence[float]) -> list[float]:
        """One quantisation step of each program output: the scale of the decode the
        materialised program ends it with, else `fallback` (the caller's estimate
        for an FP32 output)."""
        steps = list(fallback)
        program = self.materialized()
        returned = returned_outputs(program.graph_signature, list(program.graph_module.graph.output_node().args[0]))
        for k, node in enumerate(returned[:len(steps)]):
            if isinstance(node, torch.fx.Node) and node.target == DQ_TENSOR:
                steps[k] = max(steps[k], float(node.args[1]))
        return steps

    def to_json(self) -> dict[str, Any]:
        """A compact, deterministic description of the plan for the delegate's provenance."""
        plan = self.placement.plan
        return {
            "domains": [
                {"id": d.id, "dominator": d.dominator,
                 **({"shared_with": [label for label, _ in d.shared]} if d.shared else {}),
                 **({"scale": self.thetas[d.id].scale, "zero_point": self.thetas[d.id].zero_point}
                    if d.id in self.thetas else {})}
                for d in plan.domains
            ],
            "codecs": [c.to_json() for c in plan.codecs],
        }


def plan_program(ep: ExportedProgram, spec: CodecSpec, calibration: Sequence[Sequence[torch.Tensor]],
                 real_state: Mapping[str, torch.Tensor], delegated: set[str]) -> PlannedProgram:
    """Place and calibrate the codecs of `ep`; write the plan on its nodes.

    `delegated` names the FX nodes the backend will lower; the others run on
    the CPU in FP32, so their ports are plain. So are the ports of operators
    whose table row says Arm's lowering cannot take them encoded.
    """
    graph = PortGraph.from_program(ep)
    table = spec.commutation_table
    plain_ops = [op for op in range(graph.num_ops) if _stays_fp32(graph, op, table, delegated)]
    placement = place(graph, table, spec.policy, spec.placement,
                      fused_transcode=spec.fused_transcode, plain_ops=plain_ops)
    thetas = (learn_thetas(ep, graph, placement.plan, calibration, codec=spec.activation_codec,
                           real_state=real_state, observer=spec.observer)
              if placement.plan.domains else {})
    write_plan_meta(graph, placement.semantics, placement.plan, thetas, table)
    return PlannedProgram(spec, graph, placement, thetas, real_copy(ep, real_state))


def _stays_fp32(graph: PortGraph, op: int, table: Any, delegated: set[str]) -> bool:
    node = graph.fx_op_node[op]
    if node is None or node.name not in delegated:
        return True
    row = table.lookup(graph.op_target[op])
    return row is not None and row.int8_refusal(lambda name: graph.op_argument(op, name)) is not None


def real_copy(ep: ExportedProgram, real_state: Mapping[str, torch.Tensor]) -> ExportedProgram:
    """A copy of `ep` whose state dict holds `real_state`'s tensors where given
    (the partitioner is handed FakeTensors; the simulation needs numbers)."""
    gm = copy.deepcopy(ep.graph_module)
    state = {k: real_state.get(k, v) for k, v in ep.state_dict.items()}
    return ExportedProgram(
        root=gm, graph=gm.graph, graph_signature=copy.deepcopy(ep.graph_signature),
        state_dict=state, range_constraints=copy.deepcopy(ep.range_constraints),
        module_call_graph=copy.deepcopy(ep.module_call_graph), constants=dict(ep.constants),
        verifiers=[ep.verifier])
