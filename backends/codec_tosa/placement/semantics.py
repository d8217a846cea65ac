"""Port semantics (plain / encoded / offline weight) and port blocks from the table and a policy."""

from __future__ import annotations

from dataclasses import dataclass, field

from codec_tosa.commutation.table import OUT, CommutationTable
from codec_tosa.graph import CONSTANT, PortGraph

PLAIN = 0
CODE = 1  # carries codes at run time
WEIGHT = 2  # constant operand encoded offline (per channel), no runtime codec


@dataclass
class Semantics:
    """What every port carries under one policy, and which ports share a block."""

    in_sem: list[int]  # per in-port: PLAIN, CODE or WEIGHT
    out_code: list[bool]  # per value: the producer port carries codes
    in_block: list[int]  # per in-port: block id, -1 when not in a block (plain, weight)
    out_block: list[int]  # per value: block id, -1 when plain
    block_op: list[int] = field(default_factory=list)
    block_inputs: list[int] = field(default_factory=list)  # in-ports per block
    block_outputs: list[int] = field(default_factory=list)  # out-ports per block
    int8_ops: list[bool] = field(default_factory=list)
    missing: set[str] = field(default_factory=set)  # targets not in the table

    @property
    def num_blocks(self) -> int:
        return len(self.block_op)


def resolve(graph: PortGraph, table: CommutationTable, policy: str) -> Semantics:
    """Choose each operator's variant (the most compressed one `policy` selects)."""
    order = table.order
    order.rank(policy)  # validates the letter
    sem = Semantics(
        in_sem=[PLAIN] * graph.num_in_ports,
        out_code=[False] * graph.num_values,
        in_block=[-1] * graph.num_in_ports,
        out_block=[-1] * graph.num_values,
        int8_ops=[False] * graph.num_ops,
    )
    for op in range(graph.num_ops):
        if graph.op_const[op]:
            continue  # folded offline
        row = table.lookup(graph.op_target[op])
        if row is None:
            sem.missing.add(graph.op_target[op])
            continue
        if not order.selects(policy, row.policy):
            continue
        _apply_int8(graph, sem, op, row.encoded, row.blocks, row.weights)
    return sem


def _out_names(slot: int) -> tuple[str, str]:
    return OUT, f"{OUT}.{slot}"


def _apply_int8(
    graph: PortGraph,
    sem: Semantics,
    op: int,
    encoded: tuple[str, ...],
    blocks: tuple[tuple[str, ...], ...],
    weights: tuple[str, ...],
) -> None:
    enc_in = [p for p in graph.op_in[op] if graph.in_arg[p] in encoded]
    enc_out = [v for v in graph.op_out[op] if set(_out_names(graph.val_slot[v])) & set(encoded)]
    # Only floating-point tensors are encoded: an operator moving int64 indices or
    # bool masks through an encodable port keeps its FP32 (plain) variant.
    if not all(graph.is_float(graph.in_value[p]) for p in enc_in):
        return
    if not all(graph.is_float(v) for v in enc_out):
        return
    sem.int8_ops[op] = True
    block_of: dict[str, int] = {}
    for names in blocks:
        b = _new_block(sem, op)
        for n in names:
            block_of[n] = b
    for p in enc_in:
        arg = graph.in_arg[p]
        if arg in weights and graph.val_kind[graph.in_value[p]] == CONSTANT:
            sem.in_sem[p] = WEIGHT
            continue
        sem.in_sem[p] = CODE
        b = block_of[arg] if arg in block_of else _new_block(sem, op)
        sem.in_block[p] = b
        sem.block_inputs[b] += 1
    for v in enc_out:
        sem.out_code[v] = True
        names = _out_names(graph.val_slot[v])
        b = next((block_of[n] for n in names if n in block_of), -1)
        if b < 0:
            b = _new_block(sem, op)
        sem.out_block[v] = b
        sem.block_outputs[b] += 1


def _new_block(sem: Semantics, op: int) -> int:
    sem.block_op.append(op)
    sem.block_inputs.append(0)
    sem.block_outputs.append(0)
    return len(sem.block_op) - 1
