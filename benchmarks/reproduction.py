"""The reproduction study behind docs/results/paper_tables.md (docs/DESIGN.md,
"Reproducing the paper's tables").

Builds the four paper models once, then evaluates every hypothesis about the
paper's graph, commutation table and accounting on all four, and prints per
model the published figure, ours and the difference. With --breakdown it also
prints, for the final `paper` accounting, the operator types that carry each
cell (traffic per target, codec items per producer -> consumer target).

    PYTHONPATH=.pypath OMP_NUM_THREADS=1 python benchmarks/reproduction.py [--breakdown] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from codec_tosa.planning.accounting import PAPER, PURE_VIEWS, STRIDED_VIEWS, Accounting
from codec_tosa.planning.analysis import prepare_program
from codec_tosa.commutation.table import CommutationTable, Row, _compute, _default_rows
from codec_tosa.graph import PortGraph
from codec_tosa.placement import place
from codec_tosa.tools.tables.published import PUBLISHED_ITEMS, PUBLISHED_PLACEMENT, PUBLISHED_TRAFFIC
from codec_tosa.tools.tables.render import difference
from codec_tosa.planning.traffic import Traffic, measure
from codec_tosa.units import MIB

MODELS = ("shufflenet_v2", "unet", "siglip", "smollm2")
SPLITS = frozenset({"aten.split_with_sizes.default", "aten.split.Tensor", "aten.chunk.default",
                    "aten.unbind.int"})


@dataclass
class Hypothesis:
    name: str
    claim: str
    graph: str = "prepared"  # prepared | folded (BN folded) | raw (export, no decomposition)
    accounting: Accounting = field(default_factory=lambda: Accounting("ours"))
    rows: tuple[Row, ...] = ()  # commutation-table rows replacing the default ones
    transcode_once: bool = False  # a transcode counts one codec item per element, not two


def _acc(name: str, free: frozenset[str] = frozenset(), inplace: bool = False) -> Accounting:
    return Accounting(name, free_targets=free, inplace_free=inplace)


VIEWS = PURE_VIEWS | STRIDED_VIEWS
HYPOTHESES = [
    Hypothesis("H0 ours", "every operator of the prepared graph moves what it reads and writes"),
    Hypothesis("H1 pure views free", "view/reshape/expand/squeeze/unsqueeze/slice/select/flatten move nothing",
               accounting=_acc("h1", PURE_VIEWS)),
    Hypothesis("H2 + permute/transpose free", "H1 plus strided views (permute, transpose)",
               accounting=_acc("h2", VIEWS)),
    Hypothesis("H3 + split/chunk free", "H2 plus split/chunk (they return views too)",
               accounting=_acc("h3", VIEWS | SPLITS)),
    Hypothesis("H4 + in-place fused", "H2 plus operators exported in place (relu_, add_) move nothing",
               accounting=PAPER),
    Hypothesis("H5 BN folded", "H4 on the graph with batch norms folded into convolutions",
               graph="folded", accounting=PAPER),
    Hypothesis("H6 raw export graph", "H2 on torch.export.export's graph, not decomposed to core ATen",
               graph="raw", accounting=_acc("h6", VIEWS)),
    Hypothesis("H7 cat free", "H4 plus cat (producers write into the concatenation) moves nothing",
               accounting=_acc("h7", VIEWS | {"aten.cat.default"}, True)),
    Hypothesis("H8 clone free", "H4 plus clone/contiguous copies move nothing",
               accounting=_acc("h8", VIEWS | {"aten.clone.default"}, True)),
    Hypothesis("H9 add routes at X", "H4 with add INT8 from X, one block {self, other, out} like cat",
               accounting=PAPER,
               rows=(Row("aten.add.Tensor", "X", ("self", "other", "out"), (("self", "other", "out"),)),)),
    Hypothesis("H10 add requantises at X", "H4 with add INT8 from X, trivial blocks like a compute op",
               accounting=PAPER, rows=(Row("aten.add.Tensor", "X", ("self", "other", "out"), ()),)),
    Hypothesis("H12 H4 + split/chunk free", "H4 plus split/chunk as views",
               accounting=_acc("h12", VIEWS | SPLITS, True)),
    Hypothesis("H11 transcode = one item", "H4, a transcode counts one codec item per element",
               accounting=PAPER, transcode_once=True),
]


def build_graphs(spec: str) -> dict[str, PortGraph]:
    from codec_tosa_examples.models import load_model

    model, inputs = load_model(spec)
    with torch.no_grad():
        ep = torch.export.export(model, inputs)
    graphs = {"prepared": PortGraph.from_program(prepare_program(ep)[0]),
              "raw": PortGraph.from_program(ep)}
    folded, counts = prepare_program(ep, fold_batch_norm=True)
    graphs["folded"] = PortGraph.from_program(folded) if counts["batch_norm"] else graphs["prepared"]
    return graphs


def table_for(h: Hypothesis) -> CommutationTable:
    replaced = {r.target for r in h.rows}
    rows = [r for r in _default_rows() if r.target not in replaced] + list(h.rows)
    # the raw export spells convolution aten.conv2d
    rows += [_compute(t, ("input", "weight"), ("weight",)) for t in ("aten.conv2d.default", "aten.conv2d.padding")]
    return CommutationTable.from_rows(rows)


def evaluate(h: Hypothesis, graph: PortGraph) -> dict[str, Any]:
    table = table_for(h)

    def one(policy: str, placement: str) -> tuple[float, float, Traffic, Any]:
        r = place(graph, table, policy, placement)
        t = h.accounting.apply(graph, measure(graph, r.semantics, r.plan))
        items = t.codec_items - (sum(c.elements for c in r.plan.codecs if c.kind == "transcode")
                                 if h.transcode_once else 0)
        return t.traffic_bytes / MIB, items / 1e6, t, r

    policies = {p: one(p, "nonlocal+coalesce") for p in "ZYXW"}
    placements = {pl: one("W", pl) for pl in ("local", "nonlocal", "nonlocal+coalesce")}
    return {"traffic": [policies[p][0] for p in "ZYXW"], "items": [policies[p][1] for p in "YXW"],
            "placement": [placements[pl][0] for pl in ("local", "nonlocal", "nonlocal+coalesce")],
            "_runs": {**{p: policies[p] for p in "ZYXW"}, **{f"W/{k}": v for k, v in placements.items()}}}


def published(spec: str) -> dict[str, list[float]]:
    return {"traffic": list(PUBLISHED_TRAFFIC[spec]), "items": list(PUBLISHED_ITEMS[spec]),
            "placement": list(PUBLISHED_PLACEMENT[spec])}


def fmt_row(ours: dict[str, Any], pub: dict[str, list[float]]) -> str:
    cells = []
    for key, digits in (("traffic", 1), ("items", 2), ("placement", 1)):
        cells += [f"{o:.{digits}f} ({difference(o, p):+.1f}%)" for o, p in zip(ours[key], pub[key])]
    return " | ".join(cells)


def traffic_by_target(t: Traffic) -> dict[str, float]:
    sums: dict[str, float] = collections.defaultdict(float)
    for r in t.per_op:
        sums[r.target] += r.total / MIB
    return sums


def items_by_edge(graph: PortGraph, placement: Any) -> dict[str, float]:
    """Codec items per (codec kind, producer target -> first consumer target)."""
    sums: dict[str, float] = collections.defaultdict(float)
    for c in placement.plan.codecs:
        v = c.value_id
        prod = graph.op_target[graph.val_op[v]] if graph.val_op[v] >= 0 else "input"
        uses = sorted({graph.op_target[graph.in_op[p]] if graph.in_op[p] >= 0 else "output"
                       for p in graph.val_uses[v]})
        n = c.elements * (2 if c.kind == "transcode" else 1)
        sums[f"{c.kind} {_short(prod)} -> {','.join(_short(u) for u in uses)}"] += n / 1e6
    return sums


def _short(target: str) -> str:
    return target.removeprefix("aten.").removesuffix(".default")


def breakdown(spec: str, result: dict[str, Any], graph: PortGraph, top: int = 6) -> list[str]:
    """The operator types that carry each cell of the final accounting."""
    runs = result["_runs"]
    lines = [f"#### {spec}"]
    for key in ("Z", "Y", "X", "W", "W/local"):
        t = runs[key][2]
        rows = sorted(traffic_by_target(t).items(), key=lambda kv: -kv[1])[:top]
        lines.append(f"- traffic {key} {t.traffic_bytes / MIB:.1f} MiB: "
                     + ", ".join(f"{_short(k)} {v:.1f}" for k, v in rows))
    for key in ("Y", "X", "W"):
        rows = sorted(items_by_edge(graph, runs[key][3]).items(), key=lambda kv: -kv[1])[:top]
        lines.append(f"- items {key} {runs[key][1]:.2f} M: " + "; ".join(f"{k} {v:.2f}" for k, v in rows))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--json", type=str)
    ap.add_argument("--only", nargs="*", help="hypothesis name prefixes (e.g. H0 H4)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    hyps = [h for h in HYPOTHESES if not args.only or any(h.name.startswith(o + " ") for o in args.only)]
    out: dict[str, Any] = {}
    details: list[str] = []
    for spec in MODELS:
        graphs = build_graphs(spec)
        out[spec] = {}
        for h in hyps:
            res = evaluate(h, graphs[h.graph])
            if args.breakdown and h.accounting is PAPER and h.graph == "prepared" and not h.rows \
                    and not h.transcode_once:
                details += breakdown(spec, res, graphs["prepared"])
            out[spec][h.name] = {k: v for k, v in res.items() if not k.startswith("_")}
        del graphs
        print(f"built and analysed {spec}", file=sys.stderr, flush=True)
    header = ("| hypothesis | model | Z | Y | X | W | items Y | items X | items W | local | nonlocal | coalesce |\n"
              "|---|---|" + "---:|" * 10)
    print(header)
    for h in hyps:
        for spec in MODELS:
            print(f"| {h.name} | {spec} | {fmt_row(out[spec][h.name], published(spec))} |")
    if details:
        print()
        print("\n".join(details))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"hypotheses": {h.name: h.claim for h in hyps}, "results": out}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
