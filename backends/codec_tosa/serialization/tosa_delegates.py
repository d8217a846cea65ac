"""Every TOSA delegate of a .pte, whichever backend made it.

`codec-tosa report` describes any TOSA delegate (docs/DESIGN.md, "report"):
ours (CodecTosaBackend), stock Arm ones (TOSABackend, from TOSAPartitioner),
and any other delegate whose payload is a TOSA flatbuffer. A program may hold
several, in one or more methods; each is read on its own and their figures
are also summed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any

from tosa.TosaGraph import TosaGraph

from codec_tosa.serialization.tosa_stats import TosaStats, tosa_stats

# Backends known to emit a bare TOSA flatbuffer as their payload; a payload of
# one of these that does not parse is an error, not "some other delegate".
KNOWN_TOSA_BACKENDS: dict[str, str] = {
    "CodecTosaBackend": "codec_tosa",
    "TOSABackend": "stock Arm TOSA",
}


@dataclass(frozen=True)
class TosaDelegate:
    """One delegate of a program whose payload is a TOSA flatbuffer."""

    method: str  # the execution plan (method) that calls it
    index: int  # its position among that method's delegates
    backend_id: str
    payload: bytes
    compile_specs: tuple[Any, ...]  # the .pte's CompileSpec entries (key, value)
    stats: TosaStats

    @property
    def backend(self) -> str:
        """Who made it, in words."""
        return KNOWN_TOSA_BACKENDS.get(self.backend_id, "TOSA flatbuffer payload")

    @property
    def provenance(self) -> dict[str, Any]:
        """codec_tosa's provenance keys, and the TOSA spec any Arm-style delegate records."""
        from codec_tosa.provenance import read_provenance

        return read_provenance(self.compile_specs)

    def summary(self) -> dict[str, Any]:
        """The figures report.json records for this delegate."""
        s = self.stats
        return {"method": self.method, "index": self.index, "backend_id": self.backend_id,
                "tosa_spec": self.provenance.get("tosa_spec"), "payload_bytes": s.payload_bytes,
                **_figures(s)}


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
            "traffic_bytes": s.traffic_bytes, "traffic_mib": s.traffic_bytes / 2**20,
            "fused_groups": s.fused_groups, "fused_traffic_bytes": s.fused_traffic_bytes,
            "fused_traffic_mib": s.fused_traffic_bytes / 2**20}


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


def read_program_delegates(pte: bytes, path: str = "<bytes>") -> ProgramDelegates:
    """Every delegate of every method of a .pte, TOSA ones with their statistics.

    Raises ValueError (naming `path`) when the program cannot be parsed or a
    known TOSA backend's payload is not a TOSA flatbuffer."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        program = deserialize_pte_binary(pte)
    except Exception as e:  # noqa: BLE001 (the parser raises many kinds)
        raise ValueError(f"{path}: not a valid ExecuTorch program (.pte), truncated or corrupt: {e}") from None
    program = getattr(program, "program", program)
    found = ProgramDelegates()
    for plan in program.execution_plan:
        for i, d in enumerate(plan.delegates):
            # deserialize_pte_binary moved segment payloads inline
            payload = bytes(program.backend_delegate_data[d.processed.index].data)
            if d.id not in KNOWN_TOSA_BACKENDS and not is_tosa_flatbuffer(payload):
                found.other.append(OtherDelegate(plan.name, i, d.id, len(payload)))
                continue
            try:
                stats = tosa_stats(payload)
            except ValueError as e:
                raise ValueError(f"{path}: the {d.id} delegate is unusable: {e}") from None
            found.tosa.append(TosaDelegate(plan.name, i, d.id, payload, tuple(d.compile_specs), stats))
    return found
