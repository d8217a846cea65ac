"""`codec-tosa report`: what the TOSA delegates of a .pte hold.

Any TOSA delegate is described (docs/DESIGN.md, "report"): operators,
constants, unfused and fused traffic per delegate, their sum when there are
several, and codec_tosa's provenance, plan and pooling record where the
delegate is ours.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Sequence

from codec_tosa.serialization.tosa_delegates import TosaDelegate, read_program_delegates
from codec_tosa.serialization.tosa_stats import TosaStats

MIB = 2**20
Table = Callable[[Sequence[object], Sequence[Sequence[object]]], str]


def report_lines(pte: str | Path, table: Table) -> list[str]:
    """The report of the .pte at `pte`; `table` formats a header and rows.

    Raises ValueError naming the file when it is not a readable program or
    holds no TOSA delegate."""
    from codec_tosa.runtime.validate import read_pte

    data = read_pte(pte, backend=None)
    found = read_program_delegates(data, str(pte))
    others = [f"{d.backend_id} (method {d.method}, {d.payload_bytes} bytes)" for d in found.other]
    if not found.tosa:
        raise ValueError(f"{pte}: holds no TOSA delegate (delegates: {others or 'none'})")
    n = len(found.tosa)
    lines = [f"{pte}: {len(data)} bytes; {n} TOSA delegate{'s' if n > 1 else ''}"]
    if others:
        lines.append(f"other delegates (not TOSA, not described): {', '.join(others)}")
    for d in found.tosa:
        lines += [""] + _delegate_lines(d, data, table)
    if n > 1:
        total = found.total()
        lines += ["", f"total over {n} TOSA delegates: {total.operators} operators, "
                      f"{total.constant_bytes} constant bytes"]
        lines.append(_traffic_line(total))
    rep = Path(pte).with_name("report.json")
    if rep.is_file():
        modeled = json.loads(rep.read_text()).get("modeled")
        if modeled:
            lines.append(f"modeled traffic of the plan: {modeled['traffic_mib']:.4g} MiB "
                         f"(lower bound {modeled['lower_bound_mib']:.4g} MiB, {modeled['codecs']} codecs)")
    return lines


def _traffic_line(s: TosaStats) -> str:
    return (f"TOSA traffic (non-constant operators): {s.traffic_bytes / MIB:.4g} MiB unfused, "
            f"{s.fused_traffic_bytes / MIB:.4g} MiB fused ({s.fused_groups} groups: elementwise "
            "chains run inside their producer; fused MiB lists a group under its first operator)")


def _delegate_lines(d: TosaDelegate, data: bytes, table: Table) -> list[str]:
    from codec_tosa.partitioner import BACKEND_ID

    s = d.stats
    prov = d.provenance
    lines = [f"delegate {d.index} of method {d.method}: {d.backend_id} ({d.backend}), "
             f"payload {s.payload_bytes} bytes, TOSA spec {prov.get('tosa_spec', 'not recorded')}"]
    if d.backend_id == BACKEND_ID:
        lines.append(f"versions: {prov.get('versions')}")
        lines.append(f"spec: {prov.get('spec')}")
        plan = prov.get("plan", {})
        lines.append(f"plan: {len(plan.get('domains', []))} domains, {len(plan.get('codecs', []))} codecs")
    lines.append(f"TOSA operators: {s.operators} ({s.const_ops} CONST, {s.const_shape_ops} CONST_SHAPE, "
                 f"{s.constant_bytes} constant bytes)")
    lines.append(table(["operator", "count", "traffic MiB", "fused MiB"],
                       [(k, v, s.traffic_by_op.get(k, 0) / MIB, s.fused_traffic_by_op.get(k, 0) / MIB)
                        for k, v in sorted(s.operators_by_type.items(), key=lambda kv: -kv[1])]))
    lines.append(_traffic_line(s))
    if d.backend_id == BACKEND_ID:
        from codec_tosa.serialization.pooling_record import read_pooling_stats

        pooling = read_pooling_stats(data, d.payload)
        if pooling is None:
            lines.append("constant pooling: off (no pooling record in the .pte)")
        else:
            lines.append(f"constant pooling: {pooling.operators_saved} operators saved "
                         f"({pooling.helper_consts_reused} helper constants reused, "
                         f"{pooling.const_shapes_deduplicated} CONST_SHAPE merged), "
                         f"{pooling.helper_bytes_saved} constant bytes saved")
    return lines
