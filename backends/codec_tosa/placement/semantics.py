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
    num_blocks: int
    block_of_arg: dict[str, int]  # argument name -> index of its block in the row
    block_of_all_outputs: int  # index of the block holding `out`, or -1
    block_of_slot: dict[int, int]  # output slot -> index of its block (`out.K`)

    @staticmethod
    def of(encoded: tuple[str, ...], blocks: tuple[tuple[str, ...], ...],
           weights: tuple[str, ...]) -> "_Variant":
        prefix = OUT + "."
        of_arg: dict[str, int] = {}
        of_slot: dict[int, int] = {}
        all_out = -1
        for i, names in enumerate(blocks):
            for n in names:
                if n == OUT:
                    all_out = i
                elif n.startswith(prefix):
                    of_slot[int(n[len(prefix):])] = i
                else:
                    of_arg[n] = i
        return _Variant(
            encoded_args=frozenset(n for n in encoded if n != OUT and not n.startswith(prefix)),
            all_outputs=OUT in encoded,
            out_slots=frozenset(int(n[len(prefix):]) for n in encoded if n.startswith(prefix)),
            weights=frozenset(weights), num_blocks=len(blocks), block_of_arg=of_arg,
            block_of_all_outputs=all_out, block_of_slot=of_slot)


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
    in_arg, in_value, val_dtype, val_slot = graph.in_arg, graph.in_value, graph.val_dtype, graph.val_slot
    enc_in = [p for p in graph.op_in[op] if in_arg[p] in variant.encoded_args]
    enc_out = [v for v in graph.op_out[op] if variant.all_outputs or val_slot[v] in variant.out_slots]
    # Only floating-point tensors are encoded: an operator moving int64 indices or
    # bool masks through an encodable port keeps its FP32 (plain) variant.
    for p in enc_in:
        if not val_dtype[in_value[p]].is_floating_point:
            return
    for v in enc_out:
        if not val_dtype[v].is_floating_point:
            return
    sem.int8_ops[op] = True
    base = sem.num_blocks  # the row's blocks, then one trivial block per other port
    for _ in range(variant.num_blocks):
        _new_block(sem, op)
    for p in enc_in:
        arg = in_arg[p]
        if arg in variant.weights and graph.val_kind[in_value[p]] == CONSTANT:
            sem.in_sem[p] = WEIGHT
            continue
        sem.in_sem[p] = CODE
        k = variant.block_of_arg.get(arg)
        b = base + k if k is not None else _new_block(sem, op)
        sem.in_block[p] = b
        sem.block_inputs[b] += 1
    for v in enc_out:
        sem.out_code[v] = True
        k = variant.block_of_slot.get(val_slot[v], variant.block_of_all_outputs)
        b = base + k if k >= 0 else _new_block(sem, op)
        sem.out_block[v] = b
        sem.block_outputs[b] += 1


def _new_block(sem: Semantics, op: int) -> int:
    sem.block_op.append(op)
    sem.block_inputs.append(0)
    sem.block_outputs.append(0)
    return len(sem.block_op) - 1
