"""Render the figures of `codec-tosa tables` as Markdown, with the qualitative checks."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from codec_tosa.tools.tables.collect import (
    DEFAULT_PLACEMENT, FUSED, PLACEMENTS, POLICIES, ModelTables, display_name, storage_matches,
)
from codec_tosa.tools.tables.published import (
    PAPER_PLACEMENTS, PAPER_POLICIES, PUBLISHED_ITEMS, PUBLISHED_PLACEMENT, PUBLISHED_STORAGE, PUBLISHED_TRAFFIC,
)
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


def difference(ours: float, published: float) -> float:
    """Relative difference of ours to the published figure, in percent."""
    return 100.0 * (ours - published) / published


def _cell(ours: float, published: float | None, digits: int = 1) -> str:
    # published figures have one decimal; ours keep `digits`
    if published is None:
        return f"{ours:.{digits}f}"
    return f"{published:.1f} / {ours:.{digits}f} ({difference(ours, published):+.1f}%)"


def comparison_rows(spec: str, policies: dict[str, dict[str, Any]],
                    placements: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Cells 'published / ours (difference)' for Tables 2, 3, 4 and the ratios."""
    traffic = PUBLISHED_TRAFFIC.get(spec)
    items = PUBLISHED_ITEMS.get(spec)
    place = PUBLISHED_PLACEMENT.get(spec)
    t = [policies[p]["traffic_mib"] for p in PAPER_POLICIES]
    i = [policies[p]["codec_items_m"] for p in PAPER_POLICIES[1:]]
    pl = [placements[p]["traffic_mib"] for p in PAPER_PLACEMENTS]
    rows = {
        "traffic": [_cell(v, traffic[k] if traffic else None) for k, v in enumerate(t)],
        "items": [_cell(v, items[k] if items else None, 2) for k, v in enumerate(i)],
        "placement": [_cell(v, place[k] if place else None) for k, v in enumerate(pl)],
    }
    # The paper's two headline ratios: W against Z, and coalesce against local.
    w_z, c_l = t[3] / t[0], pl[2] / pl[0]
    rows["ratios"] = [
        f"{traffic[3] / traffic[0]:.2f} / {w_z:.2f}" if traffic else f"{w_z:.2f}",
        f"{place[2] / place[0]:.2f} / {c_l:.2f}" if place else f"{c_l:.2f}",
    ]
    return rows


def render_comparison(models: Sequence[ModelTables], accounting: str) -> str:
    """Markdown: Tables 2-4 and the ratios as 'published / ours (difference)'."""
    rows = {m.spec: comparison_rows(m.spec, m.policies, m.placements) for m in models}
    name = [display_name(m.spec) for m in models]
    out = [f"### Published vs ours (accounting `{accounting}`): cells are published / ours (difference)", ""]
    out += ["Table 2, traffic (MiB):", ""]
    out += _table(["Model", *PAPER_POLICIES], ([n, *rows[m.spec]["traffic"]] for n, m in zip(name, models)))
    out += ["", "Table 3, codec items (millions):", ""]
    out += _table(["Model", *PAPER_POLICIES[1:]], ([n, *rows[m.spec]["items"]] for n, m in zip(name, models)))
    out += ["", "Table 4, traffic (MiB) at W per placement:", ""]
    out += _table(["Model", *PAPER_PLACEMENTS], ([n, *rows[m.spec]["placement"]] for n, m in zip(name, models)))
    out += ["", "Ratios, published / ours:", ""]
    out += _table(["Model", "W / Z traffic", "coalesce / local at W"],
                 ([n, *rows[m.spec]["ratios"]] for n, m in zip(name, models)))
    return "\n".join(out) + "\n"
