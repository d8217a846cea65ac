"""Codec materialisation as a plan: domains, encodes, decodes and transcodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from codec_tosa.commutation.table import CLAMPING_TARGETS
from codec_tosa.graph import PortGraph
from codec_tosa.placement.domains import DomainSets
from codec_tosa.placement.semantics import CODE, PLAIN, Semantics

ENCODE = "encode"
DECODE = "decode"
TRANSCODE = "transcode"


@dataclass
class Domain:
    """Encoded ports sharing one codec parameter set, learned at `dominator`
    (and, after shared coalescence, at the dominators in `shared` too)."""

    id: int
    dominator: str
    observe: int  # value id of the tensor seen at the dominator (where theta is learned)
    in_ports: list[int] = field(default_factory=list)
    values: list[int] = field(default_factory=list)
    ports: list[str] = field(default_factory=list)  # labels, filled by `label_ports`
    shared: list[tuple[str, int]] = field(default_factory=list)  # more (label, value observed)

    @property
    def observed(self) -> list[int]:
        """Every tensor theta is learned from: its range is the union of theirs."""
        return [self.observe] + [x for _, x in self.shared]

    @property
    def dominators(self) -> list[str]:
        return [self.dominator] + [label for label, _ in self.shared]


@dataclass
class Codec:
    """One codec operator. `domain` is the domain written (encode, transcode) or
    read (decode); `source` is the domain a transcode reads."""

    kind: str
    value: str
    value_id: int
    domain: int
    elements: int
    uses: list[int]
    source: int | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "value": self.value, "domain": self.domain,
                             "elements": self.elements}
        if self.source is not None:
            d["source"] = self.source
        return d


@dataclass
class Plan:
    domains: list[Domain]
    codecs: list[Codec]
    in_domain: list[int]  # per in-port: domain id or -1
    value_domain: list[int]  # per value: domain id of its producer port or -1


def make_plan(graph: PortGraph, sem: Semantics, sets: DomainSets, labels: bool = True,
              fused_transcode: bool = False) -> Plan:
    P = graph.num_in_ports
    find = sets.uf.find
    ids = [-1] * len(sets.uf.parent)  # union-find root -> domain id
    domains: list[Domain] = []

    def domain_of(node: int) -> Domain:
        root = find(node)
        if ids[root] < 0:
            ids[root] = len(domains)
            domains.append(Domain(len(domains), *sets.dominator[root],
                                  shared=list(sets.shared.get(root, []))))
        return domains[ids[root]]

    in_domain = [-1] * P
    value_domain = [-1] * graph.num_values
    # domains are numbered in topological order of their first port
    for op in range(graph.num_ops):
        for p in graph.op_in[op]:
            if sem.in_sem[p] == CODE:
                d = domain_of(p)
                in_domain[p] = d.id
                d.in_ports.append(p)
        for x in graph.op_out[op]:
            if sem.out_code[x]:
                d = domain_of(P + x)
                value_domain[x] = d.id
                d.values.append(x)

    for d in domains:
        d.observe = _observed_after_clamps(graph, d.id, d.observe, in_domain, value_domain)
        d.shared = [(label, _observed_after_clamps(graph, d.id, x, in_domain, value_domain))
                    for label, x in d.shared]
    codecs = _local_codecs(graph, sem, in_domain, value_domain) if sets.local else \
        _nonlocal_codecs(graph, sem, in_domain, value_domain, fused_transcode)
    plan = Plan(domains, codecs, in_domain, value_domain)
    if labels:
        label_ports(graph, plan)
    return plan


def _observed_after_clamps(graph: PortGraph, d: int, x: int, in_domain: list[int],
                           value_domain: list[int]) -> int:
    """Where domain `d` learns its theta from the tensor `x` at a dominator: past
    relu/relu6/clamp operators that are its only reader, on codes in `d` or
    on `x` decoded (a policy below V runs the clamp in floating point).

    Every tensor of `d` reaches its readers through that clamp, and a
    saturating encode is monotone, so it commutes with the clamp: encoding at
    the clamp's output range gives the same codes after the clamp as before
    (or, decoded, the same floats once clamped), and does not spend half the
    code range on the negative values a relu drops (which is where Arm's
    quantizer puts a conv+relu's scale too)."""
    while len(graph.val_uses[x]) == 1:
        u = graph.val_uses[x][0]
        op = graph.in_op[u]
        if op < 0 or graph.op_target[op] not in CLAMPING_TARGETS:
            break
        outs = graph.op_out[op]
        on_codes = in_domain[u] == d and value_domain[outs[0]] == d
        decoded = in_domain[u] == -1 and value_domain[x] == d
        if len(outs) != 1 or not (on_codes or decoded):
            break
        x = outs[0]
    return x


def label_ports(graph: PortGraph, plan: Plan) -> None:
    for d in plan.domains:
        d.ports = [graph.in_port_label(p) for p in d.in_ports] + \
            [graph.out_port_label(x) for x in d.values]


def _nonlocal_codecs(graph: PortGraph, sem: Semantics, in_domain: list[int],
                     value_domain: list[int], fused_transcode: bool) -> list[Codec]:
    codecs: list[Codec] = []
    for x in range(graph.num_values):
        src = value_domain[x]
        # An encoded value read in k other domains: k unfused transcodes cost
        # 10 bytes/element each, one decode plus k encodes 5 + 5k. So the value is
        # decoded once and re-encoded when it is decoded anyway (plain uses) or
        # k >= 2; fused transcodes (codes in, codes out, 2 bytes) always win.
        decode: Codec | None = None
        if src >= 0:
            uses = graph.val_uses[x]
            plain_use = any(sem.in_sem[u] == PLAIN for u in uses)
            k = len({in_domain[u] for u in uses if sem.in_sem[u] == CODE} - {src})
            if plain_use or (k >= 2 and not fused_transcode):
                decode = Codec(DECODE, graph.val_name[x], x, src, graph.numel(x), [])
                codecs.append(decode)
        from_plain = src < 0 or (decode is not None and not fused_transcode)
        into: dict[int, Codec] = {}  # shared per (value, domain)
        for u in graph.val_uses[x]:
            s = sem.in_sem[u]
            if s == CODE:
                d = in_domain[u]
                if d == src:
                    continue
                c = into.get(d)
                if c is None:
                    kind = ENCODE if from_plain else TRANSCODE
                    c = into[d] = Codec(kind, graph.val_name[x], x, d, graph.numel(x), [],
                                        None if from_plain else src)
                    codecs.append(c)
                c.uses.append(u)
            elif s == PLAIN and decode is not None:
                decode.uses.append(u)
    return codecs


def _local_codecs(graph: PortGraph, sem: Semantics, in_domain: list[int], value_domain: list[int]) -> list[Codec]:
    """Per operator: a decode on each encoded output (shared by its uses), an encode
    on each encoded input (one per use), so neighbours see a decode/encode pair."""
    codecs: list[Codec] = []
    for x in range(graph.num_values):
        src = value_domain[x]
        if src >= 0 and graph.val_uses[x]:
            codecs.append(Codec(DECODE, graph.val_name[x], x, src, graph.numel(x),
                                list(graph.val_uses[x])))
        for u in graph.val_uses[x]:
            if sem.in_sem[u] == CODE:
                codecs.append(Codec(ENCODE, graph.val_name[x], x, in_domain[u], graph.numel(x), [u]))
    return codecs
