"""Placement steps 2-4 (docs/DESIGN.md, "Placement"): domains by union-find, dominators, coalescence.

Node space of the union-find: in-ports ``[0, P)``, output ports (values)
``[P, P+V)`` and one shared encode per plain value ``[P+V, P+2V)``. Every pass
is one sweep over ports, so the whole placement is O(|V| + |E|).

``nonlocal+share`` coalesces further: a concatenation's input domain that is
also read elsewhere joins the concatenation's domain too, which is then
observed at both dominators (the union of their ranges), as PT2E's shared
quantization spec observes a cat's inputs and output together. That removes
the transcode into the cat at the price of a coarser scale for the narrower
domain (docs/DESIGN.md, "Shared observation").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection

from codec_tosa.graph import PortGraph
from codec_tosa.placement.semantics import CODE, Semantics
from codec_tosa.placement.unionfind import UnionFind

LOCAL = "local"
NONLOCAL = "nonlocal"
COALESCE = "nonlocal+coalesce"
SHARE = "nonlocal+share"
PLACEMENTS = (LOCAL, NONLOCAL, COALESCE, SHARE)

Dominator = tuple[str, int]  # (label, value observed there)


def check_placement(placement: str) -> None:
    if placement not in PLACEMENTS:
        raise ValueError(
            f"unknown placement {placement!r}: expected one of {', '.join(PLACEMENTS)}"
        )


@dataclass
class DomainSets:
    """The union-find after placement, plus each root's dominator label."""

    uf: UnionFind
    num_in_ports: int
    num_values: int
    dominator: dict[int, Dominator]  # root -> (label, value observed there)
    local: bool
    # root -> the dominators of the domains merged into it by shared coalescence
    shared: dict[int, list[Dominator]] = field(default_factory=dict)


def build_domains(graph: PortGraph, sem: Semantics, placement: str,
                  cuts: Collection[int] = ()) -> DomainSets:
    """`cuts`: in-ports of single-input blocks that get a domain of their own, written by
    a transcode from the domain of the value they read, instead of joining it (where the
    precision search lets a chain of convolutions change width: `codec_tosa.quantizer.precision`)."""
    check_placement(placement)
    P, V = graph.num_in_ports, graph.num_values
    uf = UnionFind(P + 2 * V)
    block_rep = _unite_blocks(graph, sem, uf)
    if placement == LOCAL:
        return DomainSets(uf, P, V, _local_dominators(graph, sem, uf, block_rep), local=True)
    cut = frozenset(cuts)
    boundaries = _unite_flows(graph, sem, uf, cut)
    dominator = _dominators(graph, sem, uf, block_rep)
    for u in sorted(cut):  # each cut port's domain starts at its transcode
        dominator[uf.find(u)] = (f"transcode({graph.val_name[graph.in_value[u]]})", graph.in_value[u])
    shared: dict[int, list[Dominator]] = {}
    if placement in (COALESCE, SHARE):
        _coalesce(graph, sem, uf, boundaries, dominator, shared if placement == SHARE else None)
    return DomainSets(uf, P, V, dominator, local=False, shared=shared)


def _unite_blocks(graph: PortGraph, sem: Semantics, uf: UnionFind) -> list[int]:
    """Rule 1: all ports of one port block share a domain. Returns a node per block."""
    P = graph.num_in_ports
    rep = [-1] * sem.num_blocks
    for p, b in enumerate(sem.in_block):
        if b >= 0:
            rep[b] = p if rep[b] < 0 else uf.union(rep[b], p)
    for v, b in enumerate(sem.out_block):
        if b >= 0:
            rep[b] = P + v if rep[b] < 0 else uf.union(rep[b], P + v)
    return rep


def _unite_flows(graph: PortGraph, sem: Semantics, uf: UnionFind, cut: frozenset[int] = frozenset()) -> list[int]:
    """Rules 2-4: codes flow forward into single-input blocks; a plain value gets
    one shared encode for its single-input encoded uses; uses in multi-input
    blocks are fan-in boundaries (returned, in topological order)."""
    P, V = graph.num_in_ports, graph.num_values
    in_sem, in_block, block_inputs = sem.in_sem, sem.in_block, sem.block_inputs
    boundaries: list[int] = []
    for x in range(V):
        code = sem.out_code[x]
        for u in graph.val_uses[x]:
            if in_sem[u] != CODE or u in cut:
                continue
            if block_inputs[in_block[u]] == 1:
                uf.union(u, P + x if code else P + V + x)
            else:
                boundaries.append(u)
    boundaries.sort()  # in-port ids follow the consumers' topological order
    return boundaries


def _block_output(graph: PortGraph, sem: Semantics, b: int) -> int:
    """The tensor a block operator dominator is observed at: its (first) output in the block."""
    outs = [x for x in graph.op_out[sem.block_op[b]] if sem.out_block[x] == b]
    return outs[0] if outs else -1


def _dominators(graph: PortGraph, sem: Semantics, uf: UnionFind,
                block_rep: list[int]) -> dict[int, tuple[str, int]]:
    """Step 3: after step 2 every domain is a funnel with one entry, which is its
    absolute dominator: a multi-input block operator, the output marker of a
    producer port whose block does not pass codes through, or a shared encode."""
    P, V = graph.num_in_ports, graph.num_values
    dominator: dict[int, tuple[str, int]] = {}
    for x in range(V):
        b = sem.out_block[x]
        if b >= 0 and sem.block_inputs[b] == 0:
            dominator[uf.find(P + x)] = (f"o({graph.val_name[x]})", x)
    for x in range(V):
        r = uf.find(P + V + x)
        if r != P + V + x or uf.rank[r] > 0:  # the encode node joined some use
            dominator[r] = (f"encode({graph.val_name[x]})", x)
    for b, rep in enumerate(block_rep):
        if rep >= 0 and sem.block_inputs[b] > 1:
            dominator[uf.find(rep)] = (graph.op_name[sem.block_op[b]], _block_output(graph, sem, b))
    return dominator


def exit_counts(graph: PortGraph, sem: Semantics, uf: UnionFind) -> dict[int, int]:
    """Edges leaving each domain's induced subgraph: encoded in-ports consumed by an
    operator whose block does not pass codes through, and uses of the domain's
    values by ports outside it (decodes, transcodes, graph outputs), and values
    nobody reads."""
    P = graph.num_in_ports
    exits: dict[int, int] = {}
    for p in range(P):
        if sem.in_sem[p] == CODE and sem.block_outputs[sem.in_block[p]] == 0:
            r = uf.find(p)
            exits[r] = exits.get(r, 0) + 1
    for x in range(graph.num_values):
        if not sem.out_code[x]:
            continue
        r = uf.find(P + x)
        uses = graph.val_uses[x]
        if not uses:  # a dead end: its data leaves the domain without passing the block
            exits[r] = exits.get(r, 0) + 1
        for u in uses:
            if sem.in_sem[u] != CODE or uf.find(u) != r:
                exits[r] = exits.get(r, 0) + 1
    return exits


def _coalesce(
    graph: PortGraph,
    sem: Semantics,
    uf: UnionFind,
    boundaries: list[int],
    dominator: dict[int, Dominator],
    shared: dict[int, list[Dominator]] | None,
) -> None:
    """Step 4: merge a boundary value's domain into the block's domain when every
    edge leaving it goes into that block (so the block still post-dominates it).

    With `shared` (placement ``nonlocal+share``) a domain with other exits is
    merged too; its dominators then join the block domain's observation points
    in `shared`, so that calibration still sees every value of the union."""
    P = graph.num_in_ports
    exits = exit_counts(graph, sem, uf)
    i = 0
    while i < len(boundaries):
        # all boundary ports of one block, visited in topological order
        block = sem.in_block[boundaries[i]]
        j = i
        reads: dict[int, int] = {}
        while j < len(boundaries) and sem.in_block[boundaries[j]] == block:
            x = graph.in_value[boundaries[j]]
            if sem.out_code[x]:
                rx = uf.find(P + x)
                reads[rx] = reads.get(rx, 0) + 1
            j += 1
        for rx, n in reads.items():
            rc = uf.find(boundaries[i])
            contained = exits.get(rx, 0) == n
            if rx == rc or (not contained and shared is None):
                continue
            merged_exits = exits.get(rc, 0) + exits.get(rx, 0) - n
            dom_c, dom_x = dominator[rc], dominator[rx]
            r = uf.union(rc, rx)
            exits[r] = merged_exits
            dominator[r] = dom_c
            if shared is not None:
                seen_c, seen_x = shared.pop(rc, []), shared.pop(rx, [])
                # a contained domain's data all enters the block, whose dominator sees it
                more = seen_c + ([] if contained else [dom_x] + seen_x)
                if more:
                    shared[r] = more
        i = j


def _local_dominators(graph: PortGraph, sem: Semantics, uf: UnionFind,
                      block_rep: list[int]) -> dict[int, tuple[str, int]]:
    """Local placement: each block is a domain of its own; its encodes sit at the
    block's inputs and its decode at its output."""
    dominator: dict[int, tuple[str, int]] = {}
    for b, rep in enumerate(block_rep):
        if rep < 0:
            continue
        op = graph.op_name[sem.block_op[b]]
        if sem.block_inputs[b] > 1:
            dominator[uf.find(rep)] = (op, _block_output(graph, sem, b))
        elif sem.block_inputs[b] == 1:
            # the block's single input port is the union's first member
            port = next(p for p in graph.op_in[sem.block_op[b]] if sem.in_block[p] == b)
            dominator[uf.find(rep)] = (f"encode@{graph.in_port_label(port)}", graph.in_value[port])
        else:
            x = rep - graph.num_in_ports
            dominator[uf.find(rep)] = (f"o({graph.val_name[x]})", x)
    return dominator
