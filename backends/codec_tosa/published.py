"""The paper's published Tables 2-4 and their comparison with ours.

Figures as printed in the paper (one decimal). Storage (Table 1) stays in
`tables.PUBLISHED_STORAGE`. See docs/DESIGN.md, "Reproducing the paper's tables".
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

# Table 2: traffic (MiB) at Z, Y, X, W (placement nonlocal+coalesce).
PUBLISHED_TRAFFIC: dict[str, tuple[float, float, float, float]] = {
    "shufflenet_v2": (54.8, 57.9, 58.0, 39.4),
    "unet": (920.4, 1039.9, 1095.9, 759.6),
    "siglip": (1802.7, 2029.8, 2047.8, 1768.0),
    "smollm2": (741.1, 546.3, 541.8, 427.2),
}
# Table 3: codec items (millions) at Y, X, W.
PUBLISHED_ITEMS: dict[str, tuple[float, float, float]] = {
    "shufflenet_v2": (4.2, 6.3, 4.3),
    "unet": (90.4, 138.9, 84.0),
    "siglip": (209.2, 228.1, 220.2),
    "smollm2": (47.9, 50.0, 47.1),
}
# Table 4: traffic (MiB) at W per placement: local, nonlocal, nonlocal+coalesce.
PUBLISHED_PLACEMENT: dict[str, tuple[float, float, float]] = {
    "shufflenet_v2": (70.6, 39.4, 39.4),
    "unet": (1251.1, 767.1, 759.6),
    "siglip": (2311.8, 1768.0, 1768.0),
    "smollm2": (643.1, 427.2, 427.2),
}

POLICIES = ("Z", "Y", "X", "W")
PLACEMENTS = ("local", "nonlocal", "nonlocal+coalesce")


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
    t = [policies[p]["traffic_mib"] for p in POLICIES]
    i = [policies[p]["codec_items_m"] for p in POLICIES[1:]]
    pl = [placements[p]["traffic_mib"] for p in PLACEMENTS]
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


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def render_comparison(models: Sequence[Any], names: dict[str, str], accounting: str) -> str:
    """Markdown: Tables 2-4 and the ratios as 'published / ours (difference)'."""
    rows = {m.spec: comparison_rows(m.spec, m.policies, m.placements) for m in models}
    name = [names.get(m.spec, m.spec) for m in models]
    out = [f"### Published vs ours (accounting `{accounting}`): cells are published / ours (difference)", ""]
    out += ["Table 2, traffic (MiB):", ""]
    out += table(["Model", *POLICIES], ([n, *rows[m.spec]["traffic"]] for n, m in zip(name, models)))
    out += ["", "Table 3, codec items (millions):", ""]
    out += table(["Model", *POLICIES[1:]], ([n, *rows[m.spec]["items"]] for n, m in zip(name, models)))
    out += ["", "Table 4, traffic (MiB) at W per placement:", ""]
    out += table(["Model", *PLACEMENTS], ([n, *rows[m.spec]["placement"]] for n, m in zip(name, models)))
    out += ["", "Ratios, published / ours:", ""]
    out += table(["Model", "W / Z traffic", "coalesce / local at W"],
                 ([n, *rows[m.spec]["ratios"]] for n, m in zip(name, models)))
    return "\n".join(out) + "\n"


__all__ = ["PUBLISHED_ITEMS", "PUBLISHED_PLACEMENT", "PUBLISHED_TRAFFIC", "comparison_rows",
           "difference", "render_comparison"]
