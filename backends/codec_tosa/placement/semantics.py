"""Port semantics (plain / encoded / offline weight) and port blocks from the table and a policy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection

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


@dataclass(frozen=True)
class _Variant:
    """A table row compiled for fast per-operator application."""

    encoded_args: frozenset[str]
    all_outputs: bool
    out_slots: frozenset[int]
    weights: frozenset[str]
    blocks: tuple[tuple[frozenset[str], bool, frozenset[int]], ...]  # args, all outs, out slots

    @staticmethod
    def of(row_encoded: tuple[str, ...], blocks: tuple[tuple[str, ...], ...],
           weights: tuple[str, ...]) -> "_Variant":
        def split(names: tuple[str, ...]) -> tuple[frozenset[str], bool, frozenset[int]]:
            args = frozenset(n for n in names if n != OUT and not n.startswith(OUT + "."))
            slots = frozenset(int(n[len(OUT) + 1:]) for n in names if n.startswith(OUT + "."))
            return args, OUT in names, slots

        args, all_out, slots = split(row_encoded)
        return _Variant(args, all_out, slots, frozenset(weights), tuple(split(b) for b in blocks))

    def encodes_output(self, slot: int) -> bool:
        return self.all_outputs or slot in self.out_slots


def resolve(graph: PortGraph, table: CommutationTable, policy: str,
            plain_ops: Collection[int] = ()) -> Semantics:
    """Choose each operator's variant (the most compressed one `policy` selects).

    `plain_ops` are kept FP32 whatever the table says (operators left on the CPU).
    """
    order = table.order
    order.rank(policy)  # validates the letter
    sem = Semantics(
        in_sem=[PLAIN] * graph.num_in_ports,
        out_code=[False] * graph.num_values,
        in_block=[-1] * graph.num_in_ports,
        out_block=[-1] * graph.num_values,
        int8_ops=[False] * graph.num_ops,
    )
    variants: dict[str, _Variant | None] = {}
    plain = set(plain_ops)
    for op in range(graph.num_ops):
        if graph.op_const[op] or op in plain:
            continue  # folded offline, or not delegated
        target = graph.op_target[op]
        if target not in variants:
            row = table.lookup(target)
            if row is None:
                sem.missing.add(target)
            variants[target] = (_Variant.of(row.encoded, row.blocks, row.weights)
                                if row is not None and order.selects(policy, row.policy) else None)
        variant = variants[target]
        if variant is not None:
            _apply_int8(graph, sem, op, variant)
    return sem


def _apply_int8(graph: PortGraph, sem: Semantics, op: int, variant: _Variant) -> None:
    enc_in = [p for p in graph.op_in[op] if graph.in_arg[p] in variant.encoded_args]
    enc_out = [v for v in graph.op_out[op] if variant.encodes_output(graph.val_slot[v])]
    # Only floating-point tensors are encoded: an operator moving int64 indices or
    # bool masks through an encodable port keeps its FP32 (plain) variant.
    if not all(graph.is_float(graph.in_value[p]) for p in enc_in):
        return
    if not all(graph.is_float(v) for v in enc_out):
        return
    sem.int8_ops[op] = True
    blocks = [(_new_block(sem, op), args, all_out, slots) for args, all_out, slots in variant.blocks]
    for p in enc_in:
        arg = graph.in_arg[p]
        if arg in variant.weights and graph.val_kind[graph.in_value[p]] == CONSTANT:
            sem.in_sem[p] = WEIGHT
            continue
        sem.in_sem[p] = CODE
        b = next((b for b, args, _, _ in blocks if arg in args), -1)
        if b < 0:
            b = _new_block(sem, op)
        sem.in_block[p] = b
        sem.block_inputs[b] += 1
    for v in enc_out:
        sem.out_code[v] = True
        slot = graph.val_slot[v]
        b = next((b for b, _, all_out, slots in blocks if all_out or slot in slots), -1)
        if b < 0:
            b = _new_block(sem, op)
        sem.out_block[v] = b
        sem.block_outputs[b] += 1


def _new_block(sem: Semantics, op: int) -> int:
    sem.block_op.append(op)
    sem.block_inputs.append(0)
    sem.block_outputs.append(0)
    return len(sem.block_op) - 1
