"""`codec-tosa report`: what the TOSA delegates of a .pte hold.

Any TOSA delegate is described (docs/DESIGN.md, "Tools"): operators,
constants, unfused and fused traffic per delegate, their sum when there are
several, and codec_tosa's provenance, plan and pooling record where the
delegate is ours. A VgfBackend or EthosUBackend delegate is described by the
TOSA compile wrote beside the .pte. The operators left on the CPU are named.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

from tosa.TosaGraph import TosaGraph

from codec_tosa.arm.adapter import ETHOS_U_BACKEND_ID, VGF_BACKEND_ID
from codec_tosa.runtime import BACKEND_ID
from codec_tosa.commutation.policy import INTEGER_POLICY
from codec_tosa.runtime.pte import (Delegate, NamedData, delegates, inspect_pte, planned_buffers, read_pooling_stats,
                                    read_pte)
from codec_tosa.serialization import external
from codec_tosa.serialization.memory_plan import ActivationPlan, activation_plan
from codec_tosa.serialization.tosa_stats import TosaStats, tosa_stats
from codec_tosa.targets.ethosu.vela_figures import MISSING, delegate_tosa, ethos_u_delegates, vela_figures
from codec_tosa.targets.named_data import named_data_for
from codec_tosa.units import MIB

Table = Callable[[Sequence[object], Sequence[Sequence[object]]], str]

# Backends known to emit a bare TOSA flatbuffer as their payload; a payload of
# one of these that does not parse is an error, not "some other delegate".
KNOWN_TOSA_BACKENDS: dict[str, str] = {
    "CodecTosaBackend": "codec_tosa",
    "TOSABackend": "stock Arm TOSA",
}
# Backends whose payload was compiled from a TOSA flatbuffer that `compile` keeps
# beside the .pte (model.tosa, model_1.tosa, ...): what their payload is, in words
CONVERTED_FROM_TOSA: dict[str, str] = {
    VGF_BACKEND_ID: "VGF",
    ETHOS_U_BACKEND_ID: "Ethos-U",  # Vela's command stream
}
# The CPU kernels of an integer-only program's boundary: the input encodes and
# the output decodes (as in Arm's INT8 flow; per channel for an int32 accumulator
# output, docs/DESIGN.md "Accumulator outputs")
IO_KERNELS = frozenset({"quantized_decomposed::quantize_per_tensor",
                        "quantized_decomposed::dequantize_per_tensor",
                        "quantized_decomposed::dequantize_per_channel"})


@dataclass(frozen=True)
class TosaDelegate(Delegate):
    """One delegate of a program whose payload is a TOSA flatbuffer, with its statistics."""

    stats: TosaStats = field(default_factory=TosaStats)  # of the whole TOSA (external weights put back)
    external_bytes: int = 0  # constant bytes the payload leaves to the .ptd
    activation: ActivationPlan = field(default_factory=ActivationPlan)  # its non-constant tensors' plan

    @property
    def external(self) -> bool:
        return external.is_external(self.payload)

    @property
    def backend(self) -> str:
        """Who made it, in words."""
        return KNOWN_TOSA_BACKENDS.get(self.backend_id, "TOSA flatbuffer payload")

    @property
    def provenance(self) -> dict[str, Any]:
        """codec_tosa's provenance keys, and the TOSA spec any Arm-style delegate records."""
        return self.compile_specs

    def summary(self) -> dict[str, Any]:
        """The figures report.json records for this delegate."""
        s = self.stats
        out = {"method": self.method, "index": self.index, "backend_id": self.backend_id,
               "tosa_spec": self.provenance.get("tosa_spec"), "payload_bytes": s.payload_bytes,
               **_figures(s)}
        if self.external:  # payload_bytes is the whole TOSA's; the .pte holds this much of it
            out.update(pte_payload_bytes=len(self.payload), external_weight_bytes=self.external_bytes)
        out["activation"] = self.activation.to_json()
        return out


@dataclass(frozen=True)
class OtherDelegate:
    """A delegate whose payload is not TOSA (an Ethos-U command stream, a VGF file...)."""

    method: str
    index: int
    backend_id: str
    payload_bytes: int


@dataclass
class ProgramDelegates:
    tosa: list[TosaDelegate] = field(default_factory=list)
    other: list[OtherDelegate] = field(default_factory=list)

    def total(self) -> TosaStats:
        """The TOSA delegates' figures summed."""
        return sum_stats([d.stats for d in self.tosa])

    def summary(self) -> dict[str, Any]:
        """report.json's "tosa" entry: each delegate's figures and their sum."""
        return {"delegates": [d.summary() for d in self.tosa], "total": _figures(self.total()),
                "other_delegates": [d.backend_id for d in self.other]}


def _figures(s: TosaStats) -> dict[str, Any]:
    return {"operators": s.operators, "constant_bytes": s.constant_bytes,
            "traffic_bytes": s.traffic_bytes, "traffic_mib": s.traffic_bytes / MIB,
            "fused_groups": s.fused_groups, "fused_traffic_bytes": s.fused_traffic_bytes,
            "fused_traffic_mib": s.fused_traffic_bytes / MIB}


def is_tosa_flatbuffer(payload: bytes) -> bool:
    """Whether the payload carries the TOSA flatbuffer file identifier."""
    return len(payload) >= 8 and TosaGraph.TosaGraphBufferHasIdentifier(payload, 0)


def sum_stats(stats: list[TosaStats]) -> TosaStats:
    """Field-wise sum of several flatbuffers' statistics (dicts are summed by key)."""
    total = TosaStats()
    for f in fields(TosaStats):
        values = [getattr(s, f.name) for s in stats]
        if isinstance(getattr(total, f.name), dict):
            summed: Counter[str] = Counter()
            for v in values:
                summed.update(v)
            setattr(total, f.name, dict(sorted(summed.items())))
        else:
            setattr(total, f.name, sum(values))
    return total


def program_delegates(data: bytes, path: str | Path = "<bytes>", ptd: NamedData | None = None
                      ) -> ProgramDelegates:
    """Every delegate of a .pte; the TOSA ones with their statistics, of the whole
    TOSA where its weights are in `ptd` (the .ptd written with the .pte).

    Raises ValueError (naming `path`) when a known TOSA backend's payload is
    not a TOSA flatbuffer, or its weights are not in `ptd`."""
    found = ProgramDelegates()
    for d in delegates(data, path):
        ours = external.is_external(d.payload)
        if d.backend_id not in KNOWN_TOSA_BACKENDS and not ours and not is_tosa_flatbuffer(d.payload):
            found.other.append(OtherDelegate(d.method, d.index, d.backend_id, len(d.payload)))
            continue
        try:
            whole = external.complete(d.payload, ptd.get if ptd is not None else None)
        except external.ExternalWeightsError as e:
            where = ptd.name if ptd is not None else f"{path} (no .ptd given: it keeps its weights in one)"
            raise ValueError(f"{where}: not the named data of delegate {d.index} ({d.backend_id}): {e}") from None
        try:
            stats = tosa_stats(whole)
        except ValueError as e:
            raise ValueError(f"{path}: the {d.backend_id} delegate is unusable: {e}") from None
        found.tosa.append(TosaDelegate(d.method, d.index, d.backend_id, d.payload, d.compile_specs, d.arm_specs,
                                       stats, sum(external.needed(d.payload).values()), activation_plan(whole)))
    return found


def memory_summary(data: bytes, found: ProgramDelegates, converted: dict[int, tuple[str, bytes]] | None = None
                   ) -> dict[str, Any]:
    """report.json's ``memory``: ExecuTorch's planned buffers per method (what the
    runtime allocates for the program's non-constant tensors: the delegates' inputs
    and outputs and the CPU operators') and the activation plan of each TOSA
    delegate's non-constant tensors (`serialization.memory_plan`; a VGF or Ethos-U
    delegate's from the TOSA it was compiled from, `converted`: index -> (file, TOSA))."""
    plans = [{"index": d.index, "backend_id": d.backend_id, "tosa": "payload", **d.activation.to_json()}
             for d in found.tosa]
    for d in found.other:
        if converted and d.index in converted:
            name, tosa = converted[d.index]
            plans.append({"index": d.index, "backend_id": d.backend_id, "tosa": name,
                          **activation_plan(tosa).to_json()})
    buffers = planned_buffers(data)
    return {"executorch_planned_buffers": {m: list(b) for m, b in buffers.items()},
            "executorch_planned_bytes": sum(buffers.get("forward", ())),
            "delegates": plans,
            # the delegates run one after another: the largest of their plans
            "delegate_activation_bytes": max((p["planned_bytes"] for p in plans), default=0)}


def memory_lines(memory: dict[str, Any], table: Table) -> list[str]:
    """report.json's ``memory`` as `report` prints it."""
    lines = [f"activation memory: ExecuTorch's planned buffers {memory['executorch_planned_bytes']} bytes "
             "(forward: the delegates' inputs and outputs and the CPU operators' tensors); each TOSA delegate's "
             "non-constant tensors, planned by liveness as ExecuTorch plans (greedy, 16-byte aligned), and "
             "fused as for fused traffic:"]
    lines.append(table(["TOSA delegate", "graph", "peak live bytes", "planned bytes", "fused peak", "fused planned",
                        "tensors", "bytes without reuse", "peak at"],
                       [[p["index"], p["tosa"], p["peak_live_bytes"], p["planned_bytes"], p["fused_peak_live_bytes"],
                         p["fused_planned_bytes"], p["tensors"], p["tensor_bytes"], p["peak_operator"]]
                        for p in memory["delegates"]]))
    for p in memory["delegates"]:
        if p["peak_tensors"]:
            lines.append(f"alive at the peak of delegate {p['index']}: " + ", ".join(
                f"{name} {nbytes}" for name, nbytes in p["peak_tensors"]))
        if p["fused_peak_tensors"]:
            lines.append("alive at its fused peak (elementwise chains inside their producers): " + ", ".join(
                f"{name} {nbytes}" for name, nbytes in p["fused_peak_tensors"]))
    return lines


def report_lines(pte: str | Path, table: Table, ptd: str | Path | None = None) -> list[str]:
    """The report of the .pte at `pte` (with its named data: `ptd`, else the .ptd
    beside it); `table` formats a header and rows.

    Raises ValueError naming the file when it is not a readable program, holds no
    TOSA delegate, or its .ptd is missing, truncated or another program's."""
    data = read_pte(pte)
    ptd = named_data_for(pte, data, ptd)
    found = program_delegates(data, str(pte), ptd)
    every = delegates(data, str(pte))
    tosa = delegate_tosa(every, pte)
    converted = _converted_delegates(found, tosa)
    others = [f"{d.backend_id} (method {d.method}, {d.payload_bytes} bytes)" for d in found.other
              if d not in converted]
    if not found.tosa and not converted and not ethos_u_delegates(every):
        raise ValueError(f"{pte}: holds no TOSA delegate (delegates: {others or 'none'})")
    n = len(found.tosa)
    kinds = Counter(CONVERTED_FROM_TOSA[d.backend_id] for d in converted)
    lines = [f"{pte}: {len(data)} bytes; {n} TOSA delegate{'s' if n != 1 else ''}"
             + "".join(f", {k} {kind} delegate{'s' if k > 1 else ''}" for kind, k in kinds.items())]
    if ptd is not None:
        lines.append(f"named data: {ptd.name}, {ptd.nbytes} bytes, {len(ptd)} keys")
    if others:
        lines.append(f"other delegates (not TOSA, not described): {', '.join(others)}")
    lines += _cpu_lines(data)
    for d in found.tosa:
        lines += [""] + _delegate_lines(d, data, table)
    for d, (name, stats) in converted.items():
        # a VGF holds SPIR-V and Vela's output NPU commands, not TOSA: their
        # figures are those of the TOSA compile converted
        kind = CONVERTED_FROM_TOSA[d.backend_id]
        lines += ["", f"delegate {d.index} of method {d.method}: {d.backend_id} ({kind}), {kind} "
                      f"{d.payload_bytes} bytes, converted from {name} ({stats.payload_bytes} bytes)"]
        lines += _stats_lines(stats, table)
    lines += _vela_lines(every, tosa, Path(pte), data, table)
    lines += [""] + memory_lines(memory_summary(data, found, {d.index: tosa[d.index] for d in converted}), table)
    if n > 1:
        total = found.total()
        lines += ["", f"total over {n} TOSA delegates: {total.operators} operators, "
                      f"{total.constant_bytes} constant bytes"]
        lines.append(_traffic_line(total))
    rep = Path(pte).with_name("report.json")
    if rep.is_file():
        recorded = json.loads(rep.read_text())
        modeled = recorded.get("modeled")
        if modeled:
            lines.append(f"modeled traffic of the plan: {modeled['traffic_mib']:.4g} MiB "
                         f"(lower bound {modeled['lower_bound_mib']:.4g} MiB, {modeled['codecs']} codecs)")
        if recorded.get("precision"):
            lines += [""] + precision_lines(recorded["precision"], table)
    return lines


def precision_lines(precision: dict[str, Any], table: Table) -> list[str]:
    """report.json's ``precision``: the search's figures and each domain's and weight's
    width and why."""
    domains = precision.get("domains", [])
    weights = precision.get("weights", [])
    n16 = sum(1 for d in domains if d["bits"] == 16)
    lines = [f"activation precision ({precision.get('mode')}): {n16} of {len(domains)} domains int16"]
    if weights:
        n4 = sum(1 for w in weights if w["bits"] == 4)
        lines.append(f"weight precision ({precision.get('weights_mode')}): {n4} of {len(weights)} "
                     "int4-capable weights int4")
    if precision.get("weight_rounding", "nearest") != "nearest":
        skipped = precision.get("not_rounded", {})
        lines.append(f"weight rounding: {precision['weight_rounding']}"
                     + (f"; nearest for {len(skipped)} operators: " + "; ".join(
                         f"{k} ({v})" for k, v in sorted(skipped.items())) if skipped else ", every weight"))
    search = precision.get("search")
    if search:
        unit = " dB" if search["metric"] == "sqnr_db" else ""
        lines.append(f"search: budget {search['budget']:g}{unit} ({search['metric']}, calibration and search "
                     f"inputs): cheapest {search['floor_score']:.1f}{unit}, widest {search['ceiling_score']:.1f}"
                     f"{unit}, chosen {search['score']:.1f}{unit} for {search['extra_bytes']} more bytes of "
                     f"traffic (widest: {search['all_extra_bytes']}); {search['evaluations']} evaluations"
                     + ("" if search["met"] else "; the budget is NOT met"))
        if search.get("priced_in_bytes"):
            lines.append(search["priced_in_bytes"])
        if search.get("chains"):
            lines.append(f"chains of convolutions (split_chains) kept {search['chains']}")
        if search.get("cycles") is not None:
            lines.append(f"groups priced in Vela cycles on {search['vela_target']}: chosen widths "
                         f"{search['cycles']} cycles, all-int8 domains {search['int8_cycles']} "
                         f"({search['lowerings']} lowerings, {search['lowering_seconds']:g} s)")
    lines.append(table(["domain", "bits", "dominator", "why"],
                       [[d["domain"], d["bits"], d.get("dominator", ""), d["why"]] for d in domains]))
    if weights:
        lines.append(table(["weight of", "bits", "why"], [[w["operator"], w["bits"], w["why"]] for w in weights]))
    return lines


def _traffic_line(s: TosaStats) -> str:
    return (f"TOSA traffic (non-constant operators): {s.traffic_bytes / MIB:.4g} MiB unfused, "
            f"{s.fused_traffic_bytes / MIB:.4g} MiB fused ({s.fused_groups} groups: elementwise "
            "chains run inside their producer; fused MiB lists a group under its first operator)")


def _delegate_lines(d: TosaDelegate, data: bytes, table: Table) -> list[str]:
    s = d.stats
    prov = d.provenance
    lines = [f"delegate {d.index} of method {d.method}: {d.backend_id} ({d.backend}), "
             f"payload {s.payload_bytes} bytes, TOSA spec {prov.get('tosa_spec', 'not recorded')}"]
    if d.external:
        lines.append(f"external weights: {len(external.needed(d.payload))} constants, {d.external_bytes} bytes "
                     f"in the .ptd; the .pte holds {len(d.payload)} bytes of the payload")
    if d.backend_id == BACKEND_ID:
        lines.append(f"versions: {prov.get('versions')}")
        lines.append(f"spec: {prov.get('spec')}")
        plan = prov.get("plan", {})
        lines.append(f"plan: {len(plan.get('domains', []))} domains, {len(plan.get('codecs', []))} codecs")
    lines += _stats_lines(s, table)
    if d.backend_id == BACKEND_ID:
        pooling = read_pooling_stats(data, d.payload)
        if pooling is None:
            lines.append("constant pooling: off (no pooling record in the .pte)")
        else:
            lines.append(f"constant pooling: {pooling.operators_saved} operators saved "
                         f"({pooling.helper_consts_reused} helper constants reused, "
                         f"{pooling.const_shapes_deduplicated} CONST_SHAPE merged), "
                         f"{pooling.helper_bytes_saved} constant bytes saved")
    return lines


def _stats_lines(s: TosaStats, table: Table) -> list[str]:
    lines = []
    lines.append(f"TOSA operators: {s.operators} ({s.const_ops} CONST, {s.const_shape_ops} CONST_SHAPE, "
                 f"{s.constant_bytes} constant bytes)")
    lines.append(table(["operator", "count", "traffic MiB", "fused MiB"],
                       [(k, v, s.traffic_by_op.get(k, 0) / MIB, s.fused_traffic_by_op.get(k, 0) / MIB)
                        for k, v in sorted(s.operators_by_type.items(), key=lambda kv: -kv[1])]))
    lines.append(_traffic_line(s))
    return lines


def _cpu_lines(data: bytes) -> list[str]:
    """The operators the program runs on the CPU; at policy I, those that are not
    the boundary's quantize/dequantize (they had no integer lowering)."""
    operators = sorted(set(inspect_pte(data).operators))
    if not operators:
        return ["CPU operators: none"]
    lines = [f"CPU operators: {', '.join(operators)}"]
    policy = next((d.compile_specs["spec"].get("policy") for d in delegates(data)
                   if isinstance(d.compile_specs.get("spec"), dict)), None)
    if policy == INTEGER_POLICY:
        not_integer = [op for op in operators if op not in IO_KERNELS]
        lines.append(f"not integer at policy {policy} (left on the CPU in FP32): "
                     f"{', '.join(not_integer) or 'none'}")
    return lines


def _converted_delegates(found: ProgramDelegates, tosa: dict[int, tuple[str, bytes]]
                         ) -> dict[OtherDelegate, tuple[str, TosaStats]]:
    """The VgfBackend and EthosUBackend delegates whose TOSA was found (`vela_figures.delegate_tosa`:
    beside the .pte, or where Arm's intermediate dump put it), with that TOSA's figures."""
    out: dict[OtherDelegate, tuple[str, TosaStats]] = {}
    for d in found.other:
        if d.backend_id in CONVERTED_FROM_TOSA and d.index in tosa:
            name, data = tosa[d.index]
            try:
                out[d] = (name, tosa_stats(data))
            except ValueError as e:
                raise ValueError(f"{name}: not a TOSA flatbuffer: {e}") from None
    return out


def _vela_lines(every: list[Delegate], tosa: dict[int, tuple[str, bytes]], pte: Path, data: bytes,
                table: Table) -> list[str]:
    """Vela's figures for the Ethos-U delegates: as compile or save recorded them in
    report.json, else Vela re-run on each delegate's TOSA (`vela_figures`)."""
    if not ethos_u_delegates(every):
        return []
    rep = pte.with_name("report.json")
    recorded = json.loads(rep.read_text()).get("vela") if rep.is_file() else None
    source = "as report.json records them"
    if recorded is None or "per_delegate" not in recorded:
        recorded = vela_figures(every, tosa, sorted(set(inspect_pte(data).operators)))
        source = "Vela re-run on each delegate's TOSA with the compile flags the .pte records"
    if recorded is None:
        return ["", MISSING]
    return ["", f"Vela ({source}): {recorded['accelerator']}, {recorded['system_config']}, "
                f"{recorded['memory_mode']}"] + vela_figure_lines(recorded, table)


def vela_figure_lines(vela: dict[str, Any], table: Table) -> list[str]:
    """report.json's ``vela``: one row per Ethos-U delegate, and the total."""
    keys = ("cycles_total", "npu_ops", "cpu_ops", "sram_bytes", "off_chip_bytes", "encoded_weight_bytes")
    rows = [[k] + [entry.get(key) for key in keys] for k, entry in enumerate(vela.get("per_delegate", []))]
    if len(rows) != 1:
        rows.append(["total"] + [vela.get(key) for key in keys])
    lines = [table(["Ethos-U delegate", "cycles", "NPU ops", "CPU ops", "SRAM bytes", "off-chip bytes",
                    "encoded weight bytes"], rows)]
    flags = {entry.get("compile_flags") for entry in vela.get("per_delegate", [])} - {None}
    lines += [f"Vela flags: {f}" for f in sorted(flags)]
    return lines
