"""`analyze`: placement plus traffic model on an exported program or FX graph."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram

from codec_tosa.commutation.table import CommutationTable, warn_missing
from codec_tosa.graph import PortGraph
from codec_tosa.placement import COALESCE, Codec, Domain, Placement, place
from codec_tosa.planning.traffic import OpTraffic, Traffic, measure
from codec_tosa.units import MIB


@dataclass
class Analysis:
    """Figures for one model, policy and placement (MiB and millions of elements)."""

    policy: str
    placement: str
    fused_transcode: bool
    graph: PortGraph
    result: Placement
    traffic: Traffic

    @property
    def storage_mib(self) -> float:
        return self.traffic.storage_bytes / MIB

    @property
    def codec_params_mib(self) -> float:
        return self.traffic.codec_params_bytes / MIB

    @property
    def traffic_mib(self) -> float:
        return self.traffic.traffic_bytes / MIB

    @property
    def lower_bound_mib(self) -> float:
        return self.traffic.lower_bound_bytes / MIB

    @property
    def codec_items_m(self) -> float:
        return self.traffic.codec_items / 1e6

    @property
    def domains(self) -> list[Domain]:
        return self.result.plan.domains

    @property
    def codecs(self) -> list[Codec]:
        return self.result.plan.codecs

    @property
    def per_op(self) -> list[OpTraffic]:
        return self.traffic.per_op

    def codec_counts(self) -> dict[str, int]:
        counts = {"encode": 0, "decode": 0, "transcode": 0}
        for c in self.codecs:
            counts[c.kind] += 1
        return counts

    def top_ops(self, n: int = 10) -> list[OpTraffic]:
        return sorted(self.per_op, key=lambda r: (-r.total, r.node))[:n]

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "placement": self.placement,
            "fused_transcode": self.fused_transcode,
            "storage_mib": self.storage_mib,
            "codec_params_mib": self.codec_params_mib,
            "traffic_mib": self.traffic_mib,
            "lower_bound_mib": self.lower_bound_mib,
            "codec_items_m": self.codec_items_m,
            "domains": len(self.domains),
            "codecs": self.codec_counts(),
        }

    def to_json(self) -> str:
        d = self.summary()
        d["domain_list"] = [
            {"id": dm.id, "dominator": dm.dominator, "ports": dm.ports,
             **({"shared_with": [label for label, _ in dm.shared]} if dm.shared else {})}
            for dm in self.domains
        ]
        d["codec_list"] = [c.to_json() for c in self.codecs]
        d["per_op"] = [
            {"node": r.node, "target": r.target, "bytes_read": r.bytes_read,
             "bytes_written": r.bytes_written}
            for r in self.per_op
        ]
        return json.dumps(d, indent=1)


# Fused operators the analysis keeps whole (docs/DESIGN.md, "Standalone operators"):
# the paper's graphs show attention as one operator, and its commutation-table
# row (INT8 from Y) only applies if the decomposition leaves it in place. The
# lowering path does not use this table: Arm decomposes SDPA itself.
# SiLU likewise: core ATen keeps GELU whole but decomposes SiLU into sigmoid
# and mul, which would charge SmolLM2 for two operators where SigLIP has one.
KEPT_WHOLE: tuple[torch._ops.OpOverload, ...] = (
    torch.ops.aten.scaled_dot_product_attention.default,
    torch.ops.aten.silu.default,
)


def analysis_decompositions() -> dict[Any, Any]:
    """Core-ATen decompositions minus the operators in `KEPT_WHOLE`."""
    from torch.export import default_decompositions

    table = default_decompositions()
    for op in KEPT_WHOLE:
        table.pop(op, None)
    return table


def prepare_program(program: ExportedProgram, fold_batch_norm: bool = False) -> tuple[ExportedProgram, dict[str, int]]:
    """The program the analysis sees (a new one): core ATen except `KEPT_WHOLE`
    (scaled dot-product attention), RMSNorm and rotary embeddings as standalone
    operators and, with `fold_batch_norm`, inference
    batch norms folded into their convolutions as the partitioner folds them.
    Folding is off by default: the published figures count the exported graph,
    batch norms included. Returns the program with what was rewritten."""
    from codec_tosa._passes.fold_batch_norm import FoldBatchNormPass
    from codec_tosa._passes.fuse_standalone_ops import FuseStandaloneOpsPass

    ep = program.run_decompositions(analysis_decompositions())
    fold, fuse = FoldBatchNormPass(ep), FuseStandaloneOpsPass(ep)
    if fold_batch_norm:
        fold(ep.graph_module)
    fuse(ep.graph_module)
    counts = {"batch_norm": fold.count, "rms_norm": len(fuse.report.rms_norm), "rope": len(fuse.report.rope)}
    return ep, counts


def port_graph(program: ExportedProgram | torch.fx.GraphModule, fold_batch_norm: bool = False,
               prepared: bool = False) -> PortGraph:
    """The port view of a program. An ExportedProgram not in edge dialect goes
    through `prepare_program` first unless `prepared` says it already did."""
    if isinstance(program, ExportedProgram):
        if not prepared and not _is_edge(program.graph_module):
            program, _ = prepare_program(program, fold_batch_norm)
        return PortGraph.from_program(program)
    if isinstance(program, torch.fx.GraphModule):
        return PortGraph.from_fx(program)
    raise TypeError(f"analyze: expected an ExportedProgram or a GraphModule, got {type(program).__name__}")


def _is_edge(gm: torch.fx.GraphModule) -> bool:
    from executorch.exir.dialects.edge._ops import EdgeOpOverload

    return any(isinstance(n.target, EdgeOpOverload) for n in gm.graph.nodes)


def analyze(
    program: ExportedProgram | torch.fx.GraphModule | PortGraph,
    policy: str = "W",
    placement: str = COALESCE,
    fused_transcode: bool = False,
    table: CommutationTable | None = None,
    verify: bool = False,
    fold_batch_norm: bool = False,
) -> Analysis:
    """Place codecs and measure storage, traffic and codec items.

    `verify=True` also runs the independent absolute-dominator check;
    `fold_batch_norm=True` analyses the graph the partitioner compiles (batch
    norms folded into convolutions) instead of the exported one.
    """
    graph = program if isinstance(program, PortGraph) else port_graph(program, fold_batch_norm)
    table = table or CommutationTable.default()
    result = place(graph, table, policy, placement, verify=verify, fused_transcode=fused_transcode)
    if result.semantics.missing:
        warn_missing(result.semantics.missing)
    return Analysis(policy, placement, fused_transcode, graph, result,
                    measure(graph, result.semantics, result.plan, fused_transcode))


__all__ = ["Analysis", "analyze", "port_graph"]
