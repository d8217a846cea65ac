"""Collect the figures of `codec-tosa tables`: each model built, exported and
prepared once (RMSNorm / RoPE chains fused into standalone operators), turned
into one port graph, and analysed at every policy and placement."""
from __future__ import annotations

import gc
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from tqdm import tqdm

from codec_tosa.placement.domains import COALESCE
from codec_tosa.planning.accounting import ACCOUNTINGS, account
from codec_tosa.planning.analysis import analyze as _analyze
from codec_tosa.planning.analysis import port_graph
from codec_tosa.planning.analysis import prepare_program
from codec_tosa.tools.tables.published import PAPER_PLACEMENTS, PAPER_POLICIES, PUBLISHED_STORAGE
from codec_tosa.units import MIB

POLICIES: tuple[str, ...] = PAPER_POLICIES
# the paper's placements (nonlocal+share, ours for policy I, is not in its tables)
PLACEMENTS: tuple[str, ...] = PAPER_PLACEMENTS
DEFAULT_PLACEMENT = COALESCE
FUSED = COALESCE + "+fused"


DISPLAY_NAMES: dict[str, str] = {
    "shufflenet_v2": "ShuffleNetV2",
    "unet": "U-Net",
    "siglip": "SigLIP",
    "smollm2": "SmolLM2",
    "inception_v3": "InceptionV3",
    "tiny_shufflenet": "TinyShuffleNet",
}



def display_name(spec: str) -> str:
    return DISPLAY_NAMES.get(spec, spec)


# ---------------------------------------------------------------------------
# Collection
# ---------------------------------------------------------------------------


def _figures(a: Any) -> dict[str, Any]:
    """The numbers of one analysis that the tables use."""
    return {
        "storage_mib": a.storage_mib,
        "codec_params_mib": a.codec_params_mib,
        "traffic_mib": a.traffic_mib,
        "codec_items_m": a.codec_items_m,
        "lower_bound_mib": a.lower_bound_mib,
        "domains": len(a.domains),
        "codecs": a.codec_counts(),
    }


def _by_target(a: Any, n: int) -> list[dict[str, Any]]:
    """Traffic summed per operator target (codec kinds included), largest first."""
    sums: dict[str, list[int]] = {}
    for r in a.per_op:
        entry = sums.setdefault(r.target, [0, 0])
        entry[0] += 1
        entry[1] += r.total
    total = a.traffic.traffic_bytes
    rows = sorted(sums.items(), key=lambda kv: (-kv[1][1], kv[0]))[:n]
    return [{"target": t, "count": c, "total_mib": b / MIB,
             "share_pct": 100.0 * b / total if total else 0.0} for t, (c, b) in rows]


def _top_ops(a: Any, n: int) -> list[dict[str, Any]]:
    total = a.traffic.traffic_bytes
    rows = a.top_ops(n)
    return [
        {
            "node": r.node,
            "target": r.target,
            "read_mib": r.bytes_read / MIB,
            "written_mib": r.bytes_written / MIB,
            "total_mib": r.total / MIB,
            "share_pct": 100.0 * r.total / total if total else 0.0,
        }
        for r in rows
    ]


@dataclass
class ModelTables:
    """All figures of one model."""

    spec: str
    parameters: int
    fused: dict[str, int]
    policies: dict[str, dict[str, Any]] = field(default_factory=dict)
    placements: dict[str, dict[str, Any]] = field(default_factory=dict)
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    by_target: list[dict[str, Any]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": display_name(self.spec),
            "parameters": self.parameters,
            "fused_standalone_ops": self.fused,
            "published_storage_mib": PUBLISHED_STORAGE.get(self.spec),
            "storage_matches_published": storage_matches(self),
            "policies": self.policies,
            "placements_at_W": self.placements,
            "top_ops_at_W": self.top_ops,
            "traffic_by_target_at_W": self.by_target,
            "seconds": self.seconds,
        }


def export_for_analysis(model: torch.nn.Module, inputs: tuple) -> tuple[Any, dict[str, int]]:
    """Export and prepare for analysis (core ATen, BN folded, RMSNorm/RoPE fused)."""
    with torch.no_grad():
        ep = torch.export.export(model, inputs)
    return prepare_program(ep)


def port_graph_of(ep: torch.export.ExportedProgram) -> Any:
    """The port graph of a program `export_for_analysis` prepared."""
    return port_graph(ep, prepared=True)


def analyse_model(spec: str, graph: Any, parameters: int, fused: dict[str, int],
                  top: int = 10, accounting: str = "ours") -> ModelTables:
    """Analyse one port graph at every policy and placement, under `accounting`
    (accounting.py: `ours` is the backend's traffic model, `paper` the reproduction)."""
    rules = ACCOUNTINGS[accounting]

    def analyze(*args: Any, **kwargs: Any) -> Any:
        return account(_analyze(*args, **kwargs), rules)

    result = ModelTables(spec, parameters, fused)
    # Eight analyses of one graph would repeat each warning (operators missing
    # from the commutation table) eight times: collect and show each once.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for policy in POLICIES:
            result.policies[policy] = _figures(analyze(graph, policy=policy, placement=DEFAULT_PLACEMENT))
        for placement in PLACEMENTS:
            a = analyze(graph, policy="W", placement=placement)
            result.placements[placement] = _figures(a)
            if placement == DEFAULT_PLACEMENT:
                result.top_ops = _top_ops(a, top)
                result.by_target = _by_target(a, top)
        fused_a = analyze(graph, policy="W", placement=DEFAULT_PLACEMENT, fused_transcode=True)
        result.placements[FUSED] = _figures(fused_a)
    for message in dict.fromkeys(f"{display_name(spec)}: {w.message}" for w in caught):
        warnings.warn(message, stacklevel=2)
    return result


def collect(specs: Sequence[str], top: int = 10, progress: bool = True,
            accounting: str = "ours") -> list[ModelTables]:
    """Build, export and analyse each model once, with a progress bar over the steps."""
    from codec_tosa_examples.models import load_model, resolve_builder

    for spec in specs:  # fail on a bad spec before building anything
        resolve_builder(spec)
    results: list[ModelTables] = []
    with tqdm(total=3 * len(specs), disable=not progress, unit="step", file=sys.stderr) as bar:
        for spec in specs:
            name = display_name(spec)
            bar.set_description(f"{name}: build")
            t0 = time.perf_counter()
            model, inputs = load_model(spec)
            parameters = sum(p.numel() for p in model.parameters())
            bar.update()
            bar.set_description(f"{name}: export")
            t1 = time.perf_counter()
            ep, fused = export_for_analysis(model, inputs)
            graph = port_graph_of(ep)
            del model, ep  # the port graph is all the analysis needs
            gc.collect()
            bar.update()
            bar.set_description(f"{name}: analysis")
            t2 = time.perf_counter()
            tables = analyse_model(spec, graph, parameters, fused, top, accounting)
            t3 = time.perf_counter()
            tables.seconds = {"build": t1 - t0, "export": t2 - t1, "analysis": t3 - t2}
            results.append(tables)
            del graph
            gc.collect()
            bar.update()
    return results


# ---------------------------------------------------------------------------


def storage_matches(m: ModelTables) -> bool | None:
    """Whether storage rounds to the published figures (None: none published)."""
    published = PUBLISHED_STORAGE.get(m.spec)
    if published is None:
        return None
    z, compressed = published
    return round(m.policies["Z"]["storage_mib"], 1) == z and all(
        round(m.policies[p]["storage_mib"], 1) == compressed for p in ("Y", "X", "W")
    )
