"""PNG bar charts of the figures of `codec-tosa tables`."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from codec_tosa.tools.tables.collect import (
    DEFAULT_PLACEMENT, FUSED, PLACEMENTS, POLICIES, ModelTables, display_name,
)

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
