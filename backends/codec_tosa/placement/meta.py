"""How a codec plan travels from the partitioner to the backend: FX node meta.

ExecuTorch hands `preprocess` a copy of each partition with node meta intact,
so the partitioner writes, on every operator node, what each of its ports
carries, and for an operator with offline-encoded weights the table's facts
the lowering needs. The codecs themselves follow from the ports
(docs/DESIGN.md, "Materialisation"): the backend re-derives them per
partition, which also makes partition boundaries plain.

``node.meta[KEY] = {"in": {"input[0]": PortCodec, ...}, "out": {0: PortCodec},
"facts": OpFacts | None}``
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx

from codec_tosa.codecs.base import Theta
from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import OUTPUT_OP, PortGraph
from codec_tosa.placement.plan import Plan
from codec_tosa.placement.semantics import CODE, WEIGHT, Semantics

KEY = "codec_tosa"


@dataclass(frozen=True)
class PortCodec:
    """An encoded port: its domain and theta, or an offline-encoded weight."""

    domain: int = -1
    theta: Theta | None = None
    weight: bool = False


@dataclass(frozen=True)
class OpFacts:
    """From the operator's table row: what its INT8 lowering needs to know."""

    axis: int | None  # per-channel weight scales along this axis; None: one scale per tensor
    bias: str | None  # argument stored as int32 codes at scale s(bias_scale_of) * s(weight)
    bias_scale_of: str | None
    refusal: str | None  # why Arm's lowering cannot take it encoded (None: it can)
    out_channel_axis: int | None = None  # the output axis the weight's channels are


def in_key(graph: PortGraph, port: int) -> str:
    return f"{graph.in_arg[port]}[{graph.in_item[port]}]"


def write_plan_meta(graph: PortGraph, sem: Semantics, plan: Plan, thetas: dict[int, Theta],
                    table: CommutationTable) -> None:
    """Record each encoded port on its FX operator node (graph built by `PortGraph.from_fx`)."""
    for op in range(graph.num_ops):
        node = graph.fx_op_node[op]
        if node is None:
            continue
        ins: dict[str, PortCodec] = {}
        for p in graph.op_in[op]:
            if sem.in_sem[p] == WEIGHT:
                ins[in_key(graph, p)] = PortCodec(weight=True)
            elif sem.in_sem[p] == CODE:
                d = plan.in_domain[p]
                ins[in_key(graph, p)] = PortCodec(d, thetas[d])
        outs = {graph.val_slot[v]: _out_codec(plan, thetas, v) for v in graph.op_out[op] if sem.out_code[v]}
        facts = None
        row = table.lookup(graph.op_target[op])
        if (ins or outs) and row is not None:
            facts = OpFacts(row.weight_axis, row.bias, row.bias_scale_of,
                            row.int8_refusal(lambda name: graph.op_argument(op, name)), row.out_channel_axis)
        if ins or outs:
            node.meta[KEY] = {"in": ins, "out": outs, "facts": facts}
        else:
            node.meta.pop(KEY, None)


def _out_codec(plan: Plan, thetas: dict[int, Theta], v: int) -> PortCodec:
    d = plan.value_domain[v]
    return PortCodec(d, thetas[d])


def read_port_codecs(graph: PortGraph) -> tuple[list[PortCodec | None], list[PortCodec | None]]:
    """Per in-port and per value of `graph` (a partition), what the plan says it carries."""
    ins: list[PortCodec | None] = [None] * graph.num_in_ports
    outs: list[PortCodec | None] = [None] * graph.num_values
    for p in range(graph.num_in_ports):
        op = graph.in_op[p]
        if op == OUTPUT_OP:
            continue
        node = graph.fx_op_node[op]
        meta = node.meta.get(KEY) if node is not None else None
        if meta:
            ins[p] = meta["in"].get(in_key(graph, p))
    for v in range(graph.num_values):
        op = graph.val_op[v]
        node = graph.fx_op_node[op] if op >= 0 else None
        meta = node.meta.get(KEY) if node is not None else None
        if meta:
            outs[v] = meta["out"].get(graph.val_slot[v])
    return ins, outs


def read_op_facts(graph: PortGraph, op: int) -> OpFacts | None:
    node = graph.fx_op_node[op]
    meta = node.meta.get(KEY) if node is not None else None
    return meta.get("facts") if meta else None


def has_plan(gm: torch.fx.GraphModule) -> bool:
    return any(KEY in n.meta for n in gm.graph.nodes)


def clear_plan(gm: torch.fx.GraphModule) -> None:
    """Drop the plan from a program it has been materialised in, so that the
    backend does not materialise it a second time (the integer-only flow)."""
    for n in gm.graph.nodes:
        n.meta.pop(KEY, None)
