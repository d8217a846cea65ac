"""Partition tags after Arm's partitioner: no tag a CPU node reads and feeds, none of constants only.

Arm's INT partitioner groups the operators it supports and then leaves a group's boundary
quantize/dequantize untagged. A group can then feed a CPU operator that feeds it back
(a float KV cache's ``index_put`` between the dequantize of the new K/V and the quantize of
the updated cache); Arm splits such a group into connected components, which can still be
one component with the CPU detour beside it, and ExecuTorch refuses the partition ("found
dependency cycles"). `split_cycles` splits such groups until the tags, each contracted to one
node, form no cycle; for an INT-only delegate, `codes_at_boundaries` first makes every tag
take in and give out codes. `drop_constant_only` untags a group none of whose operators depends on a
program input: its delegate would only output constants (Arm's constant folding leaves one).
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from codec_tosa.commutation.operators import DEQUANTIZES, QUANTIZE
from codec_tosa.graph import target_key

DELEGATION_TAG = "delegation_tag"


def _tag(node: torch.fx.Node) -> str | None:
    return node.meta.get(DELEGATION_TAG)


def split_cycles(gm: torch.fx.GraphModule, tags: Iterable[str]) -> list[str]:
    """Re-tag `gm` so that contracting each tag to one node leaves a graph without
    cycles, which is what ExecuTorch's fusion of the partitions needs; tags already
    so are left alone. Returns the tags now in use.

    First, each tag a path leaves and re-enters is split by level (`_by_level`). If
    tags still reach each other both ways (a CPU operator between two parts of one
    tag reached through another tag), every tag is split by rank (`_by_rank`)."""
    tags = list(tags)
    if _contracted_acyclic(gm):
        return tags
    tags = [t for tag in tags for t in _by_level(gm, tag)]
    if _contracted_acyclic(gm):
        return tags
    tags = _by_rank(gm, tags)
    assert _contracted_acyclic(gm), "split_cycles: the ranks' tags still form a cycle"
    return tags


def _by_level(gm: torch.fx.GraphModule, tag: str) -> list[str]:
    """`tag`'s operators by level, the most times a path from the tag's operators to it
    passes through an operator outside the tag. A path out of the tag and back in
    raises the level and no path lowers it, so no level of a tag reaches itself
    through another operator. Level 0 keeps the tag's name; level k is ``{tag}_split{k}``."""
    level: dict[torch.fx.Node, int] = {}  # inside the tag: its level; outside: the exits behind it
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        inside = _tag(node) == tag
        here = -1  # no operator of the tag upstream
        for arg in node.all_input_nodes:
            if arg in level:
                here = max(here, level[arg] + 1 if _tag(arg) == tag and not inside else level[arg])
        if inside:
            level[node] = max(here, 0)
        elif here >= 0:
            level[node] = here
    parts = {n: k for n, k in level.items() if _tag(n) == tag}
    if len(set(parts.values())) > 1:
        _dequantizes_follow_users(gm, tag, parts)
    return _retag(gm, tag, parts, "split")


def _dequantizes_follow_users(gm: torch.fx.GraphModule, tag: str, parts: dict[torch.fx.Node, int]) -> None:
    """Each dequantize of `tag` goes to its readers' part, copied once per part it is read
    in, so that the parts exchange codes, not FP32 values (which an INT-only delegate
    cannot take in: Arm folds a dequantize into the operator that reads it). Its input,
    a quantize or a constant, is in a part no higher, so no level goes down an edge."""
    for node in list(gm.graph.nodes):
        if node not in parts or node.op != "call_function" or target_key(node.target) not in DEQUANTIZES:
            continue
        by_part: dict[int, list[torch.fx.Node]] = {}
        for user in node.users:
            if user in parts:
                by_part.setdefault(parts[user], []).append(user)
        if not by_part or len(node.users) != sum(map(len, by_part.values())):
            continue  # read outside the tag too: Arm's boundary, left as it is
        first, *others = sorted(by_part)
        parts[node] = first
        for k in others:
            with gm.graph.inserting_after(node):
                copy = gm.graph.node_copy(node)
            for user in by_part[k]:
                user.replace_input_with(node, copy)
            parts[copy] = k
    gm.recompile()


def _by_rank(gm: torch.fx.GraphModule, tags: list[str]) -> list[str]:
    """Every tag of `tags` by rank: the most changes of tag (an untagged operator is a tag
    of its own) on a path from the program's inputs. An edge between two ranks' tags
    goes up in rank, so the contracted graph has no cycle."""
    rank: dict[torch.fx.Node, int] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        t = _tag(node)
        rank[node] = max((rank[a] + (t is None or _tag(a) != t) for a in node.all_input_nodes if a in rank),
                         default=0)
    return [t for tag in tags
            for t in _retag(gm, tag, {n: k for n, k in rank.items() if _tag(n) == tag}, "part")]


def _retag(gm: torch.fx.GraphModule, tag: str, parts: dict[torch.fx.Node, int], word: str) -> list[str]:
    """Give each operator of `tag` its part's tag (the lowest part keeps `tag`)."""
    keys = sorted(set(parts.values()))
    if len(keys) <= 1:
        return [tag]
    name = {k: tag if i == 0 else f"{tag}_{word}{k}" for i, k in enumerate(keys)}
    for node, k in parts.items():
        node.meta[DELEGATION_TAG] = name[k]
    _constants_follow_users(gm, set(name.values()))
    return list(name.values())


def codes_at_boundaries(gm: torch.fx.GraphModule, tags: Iterable[str]) -> None:
    """For an INT-only delegate: untag every dequantize of `tags` that an operator outside
    its tag reads, and every quantize that reads one, so that the delegate takes in and
    gives out codes. Arm's partitioner does so as it tags, but looks at a dequantize
    before it untags the operators after it (a KV cache's ``index_put``, untagged for
    its FP32 cache input), and an unfolded dequantize is lowered as FP32 arithmetic
    (a MUL by its scale), which an INT-only TOSA profile refuses."""
    wanted = set(tags)
    changed = True
    while changed:
        changed = False
        for node in gm.graph.nodes:
            tag = _tag(node)
            if tag not in wanted or node.op != "call_function":
                continue
            key = target_key(node.target)
            outward = key in DEQUANTIZES and any(_tag(u) != tag for u in node.users)
            inward = key == QUANTIZE and any(
                a.op != "placeholder" and _tag(a) != tag for a in node.all_input_nodes)
            if outward or inward:
                del node.meta[DELEGATION_TAG]
                changed = True


def _contracted_acyclic(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph, each tag contracted to one node, has no cycle (Kahn's algorithm)."""
    def key(n: torch.fx.Node) -> object:
        return _tag(n) or n

    succ: dict[object, set[object]] = {}
    indegree: dict[object, int] = {}
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        indegree.setdefault(key(node), 0)
        for arg in node.all_input_nodes:
            a, b = key(arg), key(node)
            if arg.op != "placeholder" and a != b and b not in succ.setdefault(a, set()):
                succ[a].add(b)
                indegree[b] = indegree.get(b, 0) + 1
    ready = [k for k, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        k = ready.pop()
        seen += 1
        for b in succ.get(k, ()):
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    return seen == len(indegree)


def _constants_follow_users(gm: torch.fx.GraphModule, tags: set[str]) -> None:
    """A constant placeholder of a split tag goes with its readers' new tag, or to no tag
    when they are in several (ExecuTorch requires a tagged constant's users to share its tag)."""
    for node in gm.graph.nodes:
        if node.op != "placeholder" or _tag(node) not in tags:
            continue
        users = {_tag(u) for u in node.users}
        if len(users) == 1 and None not in users:
            node.meta[DELEGATION_TAG] = users.pop()
        else:
            del node.meta[DELEGATION_TAG]


def drop_constant_only(ep: ExportedProgram, tags: Iterable[str]) -> list[str]:
    """Untag every tag none of whose operators depends on a user input or a mutated buffer
    (its delegate would only output constants); returns the tags kept."""
    sig = ep.graph_signature
    mutated = set(sig.buffers_to_mutate.values())
    varying_names = {s.arg.name for s in sig.input_specs
                     if s.kind == InputKind.USER_INPUT or (s.kind == InputKind.BUFFER and s.target in mutated)}
    varying: set[torch.fx.Node] = set()
    for node in ep.graph_module.graph.nodes:
        if (node.op == "placeholder" and node.name in varying_names) or any(
                a in varying for a in node.all_input_nodes):
            varying.add(node)
    kept = []
    for tag in tags:
        members = [n for n in ep.graph_module.graph.nodes if _tag(n) == tag]
        if any(n in varying for n in members if n.op == "call_function"):
            kept.append(tag)
            continue
        for n in members:
            del n.meta[DELEGATION_TAG]
    return kept


__all__ = ["DELEGATION_TAG", "codes_at_boundaries", "drop_constant_only", "split_cycles"]
