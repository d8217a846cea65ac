"""`codec-tosa tables`: the paper-style tables for a set of models (the command).

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
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from codec_tosa.tools.tables.charts import write_charts
from codec_tosa.tools.tables.collect import collect
from codec_tosa.tools.tables.render import checks, render_comparison, render_markdown

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
                        "backend's traffic model (default: paper; see docs/results/paper_tables.md)")
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
    markdown = render_markdown(models) + "\n" + render_comparison(models, args.accounting)
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
