"""`codec-tosa tables`: the paper-style tables for a set of models.

Each model is built, exported and decomposed once (RMSNorm / RoPE chains
fused into standalone operators), turned into one port graph, and that graph
is analysed at every policy and placement:

* Table 1: storage (MiB) per policy Z, Y, X, W (codec parameters separate);
* Table 2: traffic (MiB) per policy, change relative to Z;
* Table 3: codec items (millions) per policy;
* Table 4: traffic at W per placement, change relative to `local`, plus the
  fused-transcode traffic and the lower bound;
* per model, the operators contributing most traffic at W.

Output: Markdown (also printed), JSON, and PNG bar charts.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

POLICIES: tuple[str, ...] = ("Z", "Y", "X", "W")
PLACEMENTS: tuple[str, ...] = ("local", "nonlocal", "nonlocal+coalesce")
DEFAULT_PLACEMENT = "nonlocal+coalesce"
FUSED = "nonlocal+coalesce+fused"

# Published storage (MiB) at Z and at Y/X/W (identical: weight compression is
# the same for every compressing policy).
PUBLISHED_STORAGE: dict[str, tuple[float, float]] = {
    "shufflenet_v2": (8.8, 2.3),
    "unet": (93.3, 23.4),
    "siglip": (329.7, 85.0),
    "smollm2": (405.1, 101.4),
}

DISPLAY_NAMES: dict[str, str] = {
    "shufflenet_v2": "ShuffleNetV2",
    "unet": "U-Net",
    "siglip": "SigLIP",
    "smollm2": "SmolLM2",
    "inception_v3": "InceptionV3",
    "tiny_shufflenet": "TinyShuffleNet",
}

MIB = float(1 << 20)


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
    from codec_tosa.analysis import prepare_program

    with torch.no_grad():
        ep = torch.export.export(model, inputs)
    return prepare_program(ep)


def port_graph_of(ep: torch.export.ExportedProgram) -> Any:
    """The port graph of a program `export_for_analysis` prepared."""
    from codec_tosa.analysis import port_graph

    return port_graph(ep, prepared=True)


def analyse_model(spec: str, graph: Any, parameters: int, fused: dict[str, int],
                  top: int = 10, accounting: str = "ours") -> ModelTables:
    """Analyse one port graph at every policy and placement, under `accounting`
    (accounting.py: `ours` is the backend's traffic model, `paper` the reproduction)."""
    from codec_tosa import analyze as _analyze
    from codec_tosa.accounting import ACCOUNTINGS, account

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
    from tqdm import tqdm

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
# Rendering
# ---------------------------------------------------------------------------


def _pct(value: float, base: float) -> str:
    return f"{100.0 * (value - base) / base:+.1f}%" if base else "n/a"


def _mib(value: float) -> str:
    # The paper's one decimal, but small models would show only zeros.
    return f"{value:.1f}" if abs(value) >= 1.0 else f"{value:.3f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], text_columns: int = 1) -> list[str]:
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i < text_columns else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def storage_matches(m: ModelTables) -> bool | None:
    """Whether storage rounds to the published figures (None: none published)."""
    published = PUBLISHED_STORAGE.get(m.spec)
    if published is None:
        return None
    z, compressed = published
    return round(m.policies["Z"]["storage_mib"], 1) == z and all(
        round(m.policies[p]["storage_mib"], 1) == compressed for p in ("Y", "X", "W")
    )


def _published_cell(m: ModelTables) -> str:
    published = PUBLISHED_STORAGE.get(m.spec)
    if published is None:
        return "-"
    return f"{published[0]:.1f} / {published[1]:.1f} ({'match' if storage_matches(m) else 'DIFFERS'})"


def render_markdown(models: Sequence[ModelTables]) -> str:
    out: list[str] = []
    out.append("### Table 1: storage (MiB)")
    out.append("")
    out += _table(
        ["Model", *POLICIES, "codec params at W", "published Z / Y,X,W"],
        ([display_name(m.spec),
          *(_mib(m.policies[p]['storage_mib']) for p in POLICIES),
          f"{m.policies['W']['codec_params_mib']:.3f}",
          _published_cell(m)] for m in models),
    )
    out += ["", "### Table 2: traffic (MiB), change relative to Z", ""]
    out += _table(
        ["Model", *POLICIES],
        ([display_name(m.spec),
          *(_mib(m.policies[p]['traffic_mib'])
            + ("" if p == "Z" else f" ({_pct(m.policies[p]['traffic_mib'], m.policies['Z']['traffic_mib'])})")
            for p in POLICIES)] for m in models),
    )
    out += ["", "### Table 3: codec items (millions)", ""]
    out += _table(
        ["Model", *POLICIES],
        ([display_name(m.spec), *(f"{m.policies[p]['codec_items_m']:.2f}" for p in POLICIES)]
         for m in models),
    )
    out += ["", "### Table 4: traffic (MiB) at W per placement, change relative to local", ""]
    out += _table(
        ["Model", *PLACEMENTS, "fused transcodes", "lower bound"],
        ([display_name(m.spec),
          *(_mib(m.placements[pl]['traffic_mib'])
            + ("" if pl == "local" else f" ({_pct(m.placements[pl]['traffic_mib'], m.placements['local']['traffic_mib'])})")
            for pl in PLACEMENTS),
          f"{_mib(m.placements[FUSED]['traffic_mib'])} ({_pct(m.placements[FUSED]['traffic_mib'], m.placements['local']['traffic_mib'])})",
          _mib(m.placements[DEFAULT_PLACEMENT]['lower_bound_mib'])] for m in models),
    )
    for m in models:
        out += ["", f"### {display_name(m.spec)}: top {len(m.top_ops)} operators by traffic at W "
                f"({DEFAULT_PLACEMENT})", ""]
        out += _table(
            ["Node", "Target", "read (MiB)", "written (MiB)", "total (MiB)", "share"],
            ([r["node"], f"`{r['target']}`", f"{r['read_mib']:.2f}", f"{r['written_mib']:.2f}",
              f"{r['total_mib']:.2f}", f"{r['share_pct']:.1f}%"] for r in m.top_ops),
            text_columns=2,
        )
        out += ["", f"By operator type (all {display_name(m.spec)} operators of a target summed):", ""]
        out += _table(
            ["Target", "operators", "total (MiB)", "share"],
            ([f"`{r['target']}`", str(r["count"]), f"{r['total_mib']:.2f}", f"{r['share_pct']:.1f}%"]
             for r in m.by_target),
        )
    out += ["", "### Checks", ""]
    out += [f"- {line}" for line in checks(models)]
    return "\n".join(out) + "\n"


def checks(models: Sequence[ModelTables]) -> list[str]:
    """The qualitative claims, evaluated on these numbers."""
    lines: list[str] = []
    for m in models:
        name = display_name(m.spec)
        z, w = m.policies["Z"]["traffic_mib"], m.policies["W"]["traffic_mib"]
        local = m.placements["local"]["traffic_mib"]
        coalesce = m.placements[DEFAULT_PLACEMENT]["traffic_mib"]
        nonlocal_ = m.placements["nonlocal"]["traffic_mib"]
        lines.append(
            f"{name}: W {'<' if w < z else '>='} Z traffic ({_pct(w, z)}); "
            f"nonlocal+coalesce vs local {_pct(coalesce, local)}; "
            f"coalescence alone (vs nonlocal) {_pct(coalesce, nonlocal_)}"
        )
        matches = storage_matches(m)
        if matches is not None:
            lines.append(f"{name}: storage {'matches' if matches else 'DIFFERS from'} the published figures")
        if m.fused["rms_norm"] or m.fused["rope"]:
            lines.append(f"{name}: analysed with {m.fused['rms_norm']} RMSNorm and "
                         f"{m.fused['rope']} RoPE standalone operators")
    return lines


def write_charts(models: Sequence[ModelTables], directory: Path) -> list[Path]:
    """One grouped bar chart per table plus one top-operator chart per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    names = [display_name(m.spec) for m in models]
    paths: list[Path] = []

    def grouped(filename: str, title: str, ylabel: str, series: dict[str, list[float]]) -> None:
        # One panel per model: the models differ by two orders of magnitude.
        fig, axes = plt.subplots(1, len(models), figsize=(2.6 * len(models) + 1.5, 3.6), squeeze=False)
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for k, ax in enumerate(axes[0]):
            values = [v[k] for v in series.values()]
            ax.bar(range(len(series)), values, color=[colors[i % len(colors)] for i in range(len(series))])
            ax.set_xticks(range(len(series)), list(series), rotation=45, ha="right", fontsize=8)
            ax.set_title(names[k], fontsize=10)
            if k == 0:
                ax.set_ylabel(ylabel)
        fig.suptitle(title)
        fig.tight_layout()
        path = directory / filename
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    def per_policy(key: str) -> dict[str, list[float]]:
        return {p: [m.policies[p][key] for m in models] for p in POLICIES}

    grouped("table1_storage.png", "Table 1: storage", "MiB", per_policy("storage_mib"))
    grouped("table2_traffic.png", "Table 2: traffic per policy", "MiB", per_policy("traffic_mib"))
    grouped("table3_codec_items.png", "Table 3: codec items", "millions", per_policy("codec_items_m"))
    series = {pl: [m.placements[pl]["traffic_mib"] for m in models] for pl in PLACEMENTS}
    series["fused transcodes"] = [m.placements[FUSED]["traffic_mib"] for m in models]
    series["lower bound"] = [m.placements[DEFAULT_PLACEMENT]["lower_bound_mib"] for m in models]
    grouped("table4_placement.png", "Table 4: traffic at W per placement", "MiB", series)

    for m in models:
        fig, ax = plt.subplots(figsize=(8, 4))
        rows = list(reversed(m.top_ops))
        ax.barh([f"{r['node']} ({r['target'].split('.')[-2] if '.' in r['target'] else r['target']})"
                 for r in rows], [r["total_mib"] for r in rows])
        ax.set_xlabel("MiB")
        ax.set_title(f"{display_name(m.spec)}: top operators by traffic at W")
        fig.tight_layout()
        path = directory / f"top_ops_{m.spec.replace('/', '_').replace(':', '_')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _parse_models(values: Sequence[str]) -> list[str]:
    specs = [s.strip() for v in values for s in v.split(",") if s.strip()]
    if not specs:
        raise ValueError("--models: no model given")
    return specs


def add_tables_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the `tables` subcommand on an argparse subparsers object."""
    from codec_tosa_examples.models import PAPER_MODELS

    p = subparsers.add_parser(
        "tables", help="regenerate the paper-style tables (storage, traffic, codec items, placement)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=[",".join(PAPER_MODELS)],
                   help="built-in names or path/to/file.py:function, comma- or space-separated "
                        f"(default: {','.join(PAPER_MODELS)})")
    p.add_argument("--out", type=Path, default=Path("out/tables"),
                   help="directory for paper_tables.md, paper_tables.json and charts/ "
                        "(default: out/tables)")
    p.add_argument("--top", type=int, default=10, help="operators per model in the top list (default: 10)")
    p.add_argument("--accounting", choices=("paper", "ours"), default="paper",
                   help="paper: the reproduction of the published tables (views as metadata, in-place "
                        "operators fused); ours: every operator moves what it reads and writes, the "
                        "backend's traffic model (default: paper; see benchmarks/REPRODUCTION.md)")
    p.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_tables)
    return p


def run_tables(args: argparse.Namespace) -> int:
    try:
        specs = _parse_models(args.models)
    except ValueError as e:
        print(f"codec-tosa tables: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        models = collect(specs, top=args.top, progress=not args.no_progress, accounting=args.accounting)
    except ValueError as e:  # unknown model names, bad model files
        print(f"codec-tosa tables: {e}", file=sys.stderr)
        return 2
    wall = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    from codec_tosa.published import render_comparison

    markdown = render_markdown(models) + "\n" + render_comparison(models, DISPLAY_NAMES, args.accounting)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "paper_tables.md").write_text(markdown)
    payload = {
        "command": f"codec-tosa tables --accounting {args.accounting} --models " + ",".join(specs),
        "accounting": args.accounting,
        "wall_seconds": wall,
        "peak_rss_mib": peak_mib,
        "torch": torch.__version__,
        "checks": checks(models),
        "models": {m.spec: m.to_json() for m in models},
    }
    (out / "paper_tables.json").write_text(json.dumps(payload, indent=1) + "\n")
    charts = [] if args.no_charts else write_charts(models, out / "charts")
    print(markdown)
    print(f"wrote {out / 'paper_tables.md'}, {out / 'paper_tables.json'}"
          + (f" and {len(charts)} charts in {out / 'charts'}" if charts else ""))
    print(f"wall time {wall:.1f} s, peak RSS {peak_mib:.0f} MiB")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point (`python -m codec_tosa.tables`) until cli.py wires it."""
    parser = argparse.ArgumentParser(prog="codec-tosa")
    add_tables_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
