"""Accounting rules: which operators of the analysed graph move bytes.

The traffic model (`traffic.py`) charges every runtime operator for what it
reads and writes. That is the backend's own accounting, `ours`: an
accelerator executing the graph as it stands does move those bytes.

The paper's Tables 2-4 were made with a different accounting, which the
reproduction study (docs/DESIGN.md, "Reproducing the paper's tables";
docs/results/paper_tables.md) narrows down to two uniform rules, tested on all
four models:

* **views are metadata**: operators that only reinterpret shape or strides
  (view/reshape, expand, squeeze/unsqueeze, slice/select, flatten, a
  same-dtype `to`, and the strided views permute/transpose) move nothing;
* **in-place operators are fused into their producer**: an operator that the
  exported training IR shows as in-place (`relu_`, `add_`: torchvision's and
  timm's `ReLU(inplace=True)`, ResNet's `out += identity`) moves nothing.

Codecs are charged in both accountings; codec items do not depend on it.
Accounting is applied after measurement, so placement is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from codec_tosa.commutation.operators import PURE_VIEWS, STRIDED_VIEWS
from codec_tosa.graph import PortGraph
from codec_tosa.planning.traffic import Traffic


@dataclass(frozen=True)
class Accounting:
    """One accounting: operator targets that move nothing, and whether in-place
    operators (by export provenance) move nothing."""

    name: str
    free_targets: frozenset[str] = frozenset()
    inplace_free: bool = False
    description: str = ""

    def free_ops(self, graph: PortGraph) -> set[int]:
        """Operators this accounting charges nothing for."""
        free: set[int] = set()
        for op in range(graph.num_ops):
            if graph.op_target[op] in self.free_targets:
                free.add(op)
            elif self.inplace_free and was_inplace(graph, op):
                free.add(op)
        return free

    def apply(self, graph: PortGraph, traffic: Traffic) -> Traffic:
        """`traffic` (measured with per-operator rows) under this accounting."""
        if not self.free_targets and not self.inplace_free:
            return traffic
        names = {graph.op_name[op] for op in self.free_ops(graph)}
        # codec rows are named "encode(x)->dN" etc., never an operator's name
        kept = [r for r in traffic.per_op if r.node not in names or r.target.startswith("codec.")]
        freed = sum(r.total for r in traffic.per_op) - sum(r.total for r in kept)
        return replace(traffic, traffic_bytes=traffic.traffic_bytes - freed, per_op=kept)


OURS = Accounting(
    "ours", description="every runtime operator moves what it reads and writes (the backend's model)")
PAPER = Accounting(
    "paper", free_targets=PURE_VIEWS | STRIDED_VIEWS, inplace_free=True,
    description="views (permute/transpose included) are metadata; in-place operators are fused")
ACCOUNTINGS: dict[str, Accounting] = {a.name: a for a in (OURS, PAPER)}


def account(analysis: Any, accounting: Accounting) -> Any:
    """An `Analysis` whose traffic follows `accounting` (the same object for `ours`)."""
    if accounting is OURS:
        return analysis
    return replace(analysis, traffic=accounting.apply(analysis.graph, analysis.traffic))


def was_inplace(graph: PortGraph, op: int) -> bool:
    """Whether an operator comes from an in-place operator of the exported
    program (`relu` from `relu_`), by the provenance decomposition records."""
    node = graph.fx_op_node[op]
    if node is None:
        return False
    target = graph.op_target[op]
    parts = target.split(".")
    if len(parts) != 3:
        return False
    inplace_name = f"{parts[0]}.{parts[1]}_."
    return any(str(t).startswith(inplace_name) for t in _provenance_targets(node.meta.get("from_node")))


def _provenance_targets(sources: Any) -> list[Any]:
    out: list[Any] = []
    for s in sources or ():
        out.append(getattr(s, "target", None))
        out += _provenance_targets(getattr(s, "from_node", None))
    return out


__all__ = ["ACCOUNTINGS", "Accounting", "OURS", "account", "PAPER", "PURE_VIEWS", "STRIDED_VIEWS", "was_inplace"]
