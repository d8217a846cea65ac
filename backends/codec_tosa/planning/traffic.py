"""The traffic model: the only code that turns ports into bytes (docs/DESIGN.md, "Traffic model").

* storage: parameters, buffers and lifted constants as stored; a constant that
  reaches an offline-encoded weight port (possibly through folded layout
  operators such as the transpose of a linear weight) is stored at the code
  width, everything else at its own dtype. Codec parameters are reported
  separately (`codec_params_bytes`): one FP32 scale per output channel of each
  encoded weight, and an FP32 scale plus an INT32 zero point per domain.
* traffic: every runtime operator reads each input and writes each output at
  the width of the port's semantics; codec operators included. Folded
  constant operators, getitem, placeholders and outputs move nothing, and an
  output that nothing reads (max_pool2d's indices) is not written.
* codec items: elements processed by codec operators; an unfused transcode
  counts as a decode plus an encode, a fused one (int8 -> int8 RESCALE) once.
* lower bound: the same variants with zero codec traffic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from codec_tosa.graph import CONSTANT, PortGraph
from codec_tosa.placement.plan import DECODE, ENCODE, TRANSCODE, Plan
from codec_tosa.placement.semantics import PLAIN, WEIGHT, Semantics

CODE_BYTES = 1  # INT8 codes
SCALE_BYTES = 4  # FP32 scale
ZERO_POINT_BYTES = 4  # INT32 zero point


@dataclass
class OpTraffic:
    node: str
    target: str
    bytes_read: int
    bytes_written: int

    @property
    def total(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass
class Traffic:
    storage_bytes: int
    codec_params_bytes: int
    traffic_bytes: int
    codec_traffic_bytes: int
    codec_items: int
    per_op: list[OpTraffic] = field(default_factory=list)

    @property
    def lower_bound_bytes(self) -> int:
        return self.traffic_bytes - self.codec_traffic_bytes


def port_width(graph: PortGraph, sem: Semantics, port: int) -> int:
    """Bytes per element read through an in-port."""
    return graph.itemsize(graph.in_value[port]) if sem.in_sem[port] == PLAIN else CODE_BYTES


def value_width(graph: PortGraph, sem: Semantics, value: int) -> int:
    """Bytes per element written through an output port (and read by its decode)."""
    return CODE_BYTES if sem.out_code[value] else graph.itemsize(value)


def domain_code_elements(graph: PortGraph, sem: Semantics, plan: Plan) -> list[int]:
    """Per domain, the code elements its runtime operators read and write: the bytes
    each extra byte of code width costs it (an INT16 domain moves twice its INT8
    bytes; docs/DESIGN.md, "Precision per domain"). Codec operators count too."""
    out = [0] * len(plan.domains)
    for op in range(graph.num_ops):
        if graph.op_const[op]:
            continue
        for p in graph.op_in[op]:
            d = plan.in_domain[p]
            if d >= 0 and sem.in_sem[p] != PLAIN and sem.in_sem[p] != WEIGHT:
                out[d] += graph.numel(graph.in_value[p])
        for v in graph.op_out[op]:
            d = plan.value_domain[v]
            if d >= 0 and sem.out_code[v] and graph.val_uses[v]:
                out[d] += graph.numel(v)
    for c in plan.codecs:
        # an encode writes the domain's codes, a decode reads them, a transcode both
        for d in (c.domain, c.source):
            if d is not None and d >= 0:
                out[d] += c.elements
    return out


@dataclass(frozen=True)
class CodeBytes:
    """Bytes per inference the domains' codes move at given widths, where some
    transcodes are chain cuts (`precision.cut_sources`: cut domain -> source). A cut
    is an operator only where its two sides differ in width: then its RESCALE reads
    the source's codes and writes its own; a cut whose sides share a width is undone
    and moves nothing (docs/DESIGN.md, "Precision per domain")."""

    elements: list[int]  # per domain: domain_code_elements, less the cuts' transcodes
    cuts: list[tuple[int, int, int]]  # (cut domain, source domain, elements)

    @classmethod
    def of(cls, graph: PortGraph, sem: Semantics, plan: Plan, cuts: Mapping[int, int]) -> "CodeBytes":
        elements = domain_code_elements(graph, sem, plan)
        transcodes = []
        for c in plan.codecs:
            if c.kind == TRANSCODE and c.source is not None and cuts.get(c.domain) == c.source:
                elements[c.domain] -= c.elements
                elements[c.source] -= c.elements
                transcodes.append((c.domain, c.source, c.elements))
        return cls(elements, transcodes)

    def __call__(self, bits: Mapping[int, int]) -> int:
        """The bytes at `bits` (per domain, in bits per code)."""
        total = sum(e * bits[d] for d, e in enumerate(self.elements))
        total += sum(n * (bits[d] + bits[s]) for d, s, n in self.cuts if bits[d] != bits[s])
        return total // 8


def encoded_constants(graph: PortGraph, sem: Semantics) -> list[bool]:
    """Per value: a constant stored encoded (it reaches a weight port through folded ops)."""
    enc = [False] * graph.num_values
    for p in range(graph.num_in_ports):
        if sem.in_sem[p] == WEIGHT:
            enc[graph.in_value[p]] = True
    for op in reversed(range(graph.num_ops)):  # reverse topological: outputs before inputs
        if graph.op_const[op] and any(enc[v] for v in graph.op_out[op]):
            for p in graph.op_in[op]:
                enc[graph.in_value[p]] = True
    return enc


def measure(graph: PortGraph, sem: Semantics, plan: Plan, fused_transcode: bool = False,
            per_op: bool = True, widths: list[int] | None = None) -> Traffic:
    """`widths`: each domain's code bytes per element (None: INT8 everywhere)."""
    if widths is not None:
        # one extra byte per code element of each wider domain (domain_code_elements)
        base = measure(graph, sem, plan, fused_transcode, per_op)
        extra = sum((w - CODE_BYTES) * e for w, e in zip(widths, domain_code_elements(graph, sem, plan)))
        return Traffic(base.storage_bytes, base.codec_params_bytes, base.traffic_bytes + extra,
                       base.codec_traffic_bytes, base.codec_items, base.per_op)
    storage = params = 0
    enc_const = encoded_constants(graph, sem)
    for v in range(graph.num_values):
        if graph.val_op[v] >= 0 or graph.val_kind[v] != CONSTANT:
            continue
        if enc_const[v]:
            storage += graph.numel(v) * CODE_BYTES
            shape = graph.val_shape[v]
            params += (shape[0] if shape else 1) * SCALE_BYTES  # per output channel
        else:
            storage += graph.numel(v) * graph.itemsize(v)
    params += len(plan.domains) * (SCALE_BYTES + ZERO_POINT_BYTES)

    rows: list[OpTraffic] = []
    total = 0
    numel = [graph.numel(v) for v in range(graph.num_values)]
    for op in range(graph.num_ops):
        if graph.op_const[op]:
            continue
        r = 0
        for p in graph.op_in[op]:
            r += numel[graph.in_value[p]] * port_width(graph, sem, p)
        w = 0
        for v in graph.op_out[op]:
            if graph.val_uses[v]:  # an output nobody reads (max_pool2d's indices) is not written
                w += numel[v] * value_width(graph, sem, v)
        total += r + w
        if per_op:
            rows.append(OpTraffic(graph.op_name[op], graph.op_target[op], r, w))

    codec_total = items = 0
    for c in plan.codecs:
        n, plain = c.elements, graph.itemsize(c.value_id)
        if c.kind == ENCODE:
            r, w, k = n * plain, n * CODE_BYTES, n
        elif c.kind == DECODE:
            r, w, k = n * value_width(graph, sem, c.value_id), n * plain, n
        elif fused_transcode:
            r, w, k = n * CODE_BYTES, n * CODE_BYTES, n
        else:  # a decode followed by an encode
            r, w, k = n * (CODE_BYTES + plain), n * (plain + CODE_BYTES), 2 * n
        codec_total += r + w
        items += k
        if per_op:
            rows.append(OpTraffic(f"{c.kind}({c.value})->d{c.domain}", f"codec.{c.kind}", r, w))
    return Traffic(storage, params, total + codec_total, codec_total, items, rows)
