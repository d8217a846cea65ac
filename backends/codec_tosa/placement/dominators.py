"""Independent check that every domain has an absolute dominator.

It does not trust the union-find: from the plan's domain membership and codecs
alone it rebuilds each domain's induced subgraph S(D) (ports, pass-through
block operators, the codecs writing into D), adds a virtual source before
every input edge and a virtual sink after every output edge, and computes
dominators. A node lies on every source-to-sink path exactly when it dominates
the sink; such a node post-dominates every input edge and dominates every
output edge. Those nodes form a chain (for `cat(x, x)` both the shared encode
of x and the cat); each of them sees all the data of the domain, so the check
is that the node the algorithm named is one of them.

A domain of shared coalescence (``nonlocal+share``) has no single such node:
there the check is that its named dominators together cut every
source-to-sink path, so that the union of their ranges covers all its data.
"""

from __future__ import annotations

from codec_tosa.graph import PortGraph
from codec_tosa.placement.plan import Plan
from codec_tosa.placement.semantics import Semantics


class DominatorError(AssertionError):
    """A domain has no absolute dominator, or not the one the algorithm named."""


_SRC, _SINK = 0, 1  # the virtual source and sink of every S(D)


def verify_dominators(graph: PortGraph, sem: Semantics, plan: Plan, local: bool = False) -> None:
    writers: dict[int, list[int]] = {}
    for i, c in enumerate(plan.codecs):
        if c.kind != "decode":
            writers.setdefault(c.domain, []).append(i)
    for d in plan.domains:
        if d.shared:
            _verify_shared(graph, sem, plan, d.id, writers.get(d.id, []))
            continue
        found = cut_nodes(graph, sem, plan, d.id, writers.get(d.id, []), local)
        if not found:
            raise DominatorError(f"domain {d.id} (ports {', '.join(d.ports[:6])}): no absolute dominator")
        if d.dominator not in found:
            raise DominatorError(
                f"domain {d.id}: the algorithm named {d.dominator} as absolute dominator, "
                f"but only {', '.join(found)} lie on every path through the domain")


def _verify_shared(graph: PortGraph, sem: Semantics, plan: Plan, dom_id: int,
                   writer_ids: list[int]) -> None:
    d = plan.domains[dom_id]
    succ, labels = _domain_graph(graph, sem, plan, dom_id, writer_ids, local=False)
    cut = {n for n, label in enumerate(labels) if label in d.dominators}
    missing = set(d.dominators) - {labels[n] for n in cut}
    if missing:
        raise DominatorError(f"domain {d.id}: its named dominators {', '.join(sorted(missing))} "
                             "are not in the domain")
    seen, stack = {_SRC}, [_SRC]
    while stack:
        for b in succ[stack.pop()]:
            if b not in seen and b not in cut:
                seen.add(b)
                stack.append(b)
    if _SINK in seen:
        raise DominatorError(f"domain {d.id}: a path through the domain avoids all of its "
                             f"dominators {' + '.join(d.dominators)}")


def cut_nodes(
    graph: PortGraph, sem: Semantics, plan: Plan, dom_id: int, writer_ids: list[int], local: bool
) -> list[str]:
    """Labels of the nodes of S(D) on every source-to-sink path, first to last."""
    succ, labels = _domain_graph(graph, sem, plan, dom_id, writer_ids, local)
    return _cut_chain(succ, _SRC, _SINK, labels)


def _domain_graph(
    graph: PortGraph, sem: Semantics, plan: Plan, dom_id: int, writer_ids: list[int], local: bool
) -> tuple[list[list[int]], list[str]]:
    """S(D) with a virtual source (node 0) and sink (node 1): successor lists and labels."""
    d = plan.domains[dom_id]
    labels: list[str] = []
    succ: list[list[int]] = []
    index: dict[tuple[str, int], int] = {}

    def node(key: tuple[str, int], label: str) -> int:
        n = index.get(key)
        if n is None:
            n = index[key] = len(labels)
            labels.append(label)
            succ.append([])
        return n

    SRC = node(("src", 0), "<source>")
    SINK = node(("sink", 0), "<sink>")
    has_pred: set[int] = set()

    def edge(a: int, b: int) -> None:
        succ[a].append(b)
        has_pred.add(b)

    in_set = set(d.in_ports)
    for x in d.values:
        vx = node(("val", x), f"o({graph.val_name[x]})")
        leaves = not graph.val_uses[x]
        for u in graph.val_uses[x]:
            if u in in_set and plan.in_domain[u] == dom_id and not local:
                edge(vx, node(("in", u), graph.in_port_label(u)))
            else:
                leaves = True
        if leaves or local:
            edge(vx, SINK)
    for i in writer_ids:
        c = plan.codecs[i]
        label = f"encode@{graph.in_port_label(c.uses[0])}" if local else f"{c.kind}({c.value})"
        cn = node(("codec", i), label)
        edge(SRC, cn)
        for u in c.uses:
            edge(cn, node(("in", u), graph.in_port_label(u)))
    for u in d.in_ports:
        un = node(("in", u), graph.in_port_label(u))
        b = sem.in_block[u]
        if sem.block_outputs[b] > 0:
            bn = node(("blk", b), graph.op_name[sem.block_op[b]])
            edge(un, bn)
            for x in graph.op_out[sem.block_op[b]]:
                if sem.out_block[x] == b:
                    edge(bn, node(("val", x), f"o({graph.val_name[x]})"))
        else:
            edge(un, SINK)
    for n in range(2, len(labels)):
        if n not in has_pred:
            edge(SRC, n)
    return succ, labels


def _cut_chain(succ: list[list[int]], src: int, sink: int, labels: list[str]) -> list[str]:
    """Nodes other than src/sink on every src->sink path (the dominators of the sink)."""
    order = _topological(succ, src)
    if len(order) != len(succ):
        return []  # a cycle, or a node unreachable from the source
    reaches = [False] * len(succ)
    for n in reversed(order):
        reaches[n] = n == sink or any(reaches[s] for s in succ[n])
    if not all(reaches):
        return []  # some node's data never leaves the domain
    pos = {n: i for i, n in enumerate(order)}
    preds: list[list[int]] = [[] for _ in succ]
    for a, ss in enumerate(succ):
        for b in ss:
            preds[b].append(a)
    idom = [-1] * len(succ)
    idom[src] = src
    for n in order[1:]:
        new = -1
        for p in preds[n]:
            if idom[p] < 0:
                continue
            new = p if new < 0 else _intersect(idom, pos, p, new)
        idom[n] = new
    chain: list[int] = []
    n = idom[sink]
    while n != src:
        chain.append(n)
        n = idom[n]
    return [labels[n] for n in reversed(chain)]


def _intersect(idom: list[int], pos: dict[int, int], a: int, b: int) -> int:
    while a != b:
        while pos[a] > pos[b]:
            a = idom[a]
        while pos[b] > pos[a]:
            b = idom[b]
    return a


def _topological(succ: list[list[int]], src: int) -> list[int]:
    indeg = [0] * len(succ)
    for ss in succ:
        for b in ss:
            indeg[b] += 1
    order, stack = [], [src]
    while stack:
        n = stack.pop()
        order.append(n)
        for b in succ[n]:
            indeg[b] -= 1
            if indeg[b] == 0:
                stack.append(b)
    return order
