"""The table generator on a small model: numbers, files, and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from codec_tosa.tools import cli
from codec_tosa.tools.tables import collect as tables
from codec_tosa.tools.tables.render import render_markdown
from codec_tosa.units import MIB
from codec_tosa_examples.models import load_model



@pytest.fixture(scope="module")
def tiny() -> tables.ModelTables:
    (result,) = tables.collect(["tiny_shufflenet"], progress=False)
    return result


def test_storage_is_the_state_dict_at_z_and_int8_compute_weights_otherwise(tiny: tables.ModelTables) -> None:
    model, _ = load_model("tiny_shufflenet")
    state = model.state_dict()
    assert tiny.policies["Z"]["storage_mib"] * MIB == sum(t.numel() * t.element_size() for t in state.values())
    # Conv and linear weights at one byte, everything else as it is.
    compute = {f"{name}.weight" for name, m in model.named_modules()
               if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))}
    expected = sum(t.numel() * (1 if k in compute else t.element_size()) for k, t in state.items())
    for policy in ("Y", "X", "W"):
        assert tiny.policies[policy]["storage_mib"] * MIB == expected


def test_policy_and_placement_figures_are_consistent(tiny: tables.ModelTables) -> None:
    z = tiny.policies["Z"]
    assert z["codec_items_m"] == 0 and z["traffic_mib"] == z["lower_bound_mib"]
    # Compressing data-layout operators pays off on a ShuffleNet-like model.
    assert tiny.policies["W"]["traffic_mib"] < z["traffic_mib"]
    local, nonlocal_, coalesce, fused = (
        tiny.placements[k]["traffic_mib"] for k in (*tables.PLACEMENTS, tables.FUSED))
    lower = tiny.placements[tables.DEFAULT_PLACEMENT]["lower_bound_mib"]
    assert lower <= fused <= coalesce <= nonlocal_ < local
    # Tables 1-3 use the default placement, so W there is Table 4's coalesce column.
    assert tiny.policies["W"]["traffic_mib"] == coalesce
    assert tiny.fused == {"batch_norm": 0, "rms_norm": 0, "rope": 0}


def test_top_ops_are_the_largest_rows_in_order(tiny: tables.ModelTables) -> None:
    totals = [r["total_mib"] for r in tiny.top_ops]
    assert len(totals) == 10 and totals == sorted(totals, reverse=True)
    assert 0 < sum(r["share_pct"] for r in tiny.top_ops) <= 100.0
    assert all(r["read_mib"] + r["written_mib"] == pytest.approx(r["total_mib"]) for r in tiny.top_ops)


def test_markdown_has_every_table_and_the_figures(tiny: tables.ModelTables) -> None:
    text = render_markdown([tiny])
    for heading in ("Table 1: storage", "Table 2: traffic", "Table 3: codec items",
                    "Table 4: traffic (MiB) at W per placement", "TinyShuffleNet: top 10 operators"):
        assert heading in text
    w = tiny.policies["W"]["traffic_mib"]
    assert f"{w:.3f}" in text


def test_published_storage_check() -> None:
    def fake(spec: str, z: float, w: float) -> tables.ModelTables:
        m = tables.ModelTables(spec, 0, {"rms_norm": 0, "rope": 0})
        m.policies = {p: {"storage_mib": z if p == "Z" else w} for p in tables.POLICIES}
        return m

    assert tables.storage_matches(fake("unet", 93.29, 23.36)) is True
    assert tables.storage_matches(fake("unet", 93.29, 23.5)) is False
    assert tables.storage_matches(fake("tiny_shufflenet", 1.0, 1.0)) is None


def test_command_writes_markdown_json_and_charts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tables", "--models", "tiny_shufflenet", "--out", str(tmp_path),
                        "--top", "3", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "Table 4" in printed and "wall time" in printed
    data = json.loads((tmp_path / "paper_tables.json").read_text())
    model = data["models"]["tiny_shufflenet"]
    assert len(model["top_ops_at_W"]) == 3
    assert set(model["policies"]) == set(tables.POLICIES)
    assert set(model["placements_at_W"]) == {*tables.PLACEMENTS, tables.FUSED}
    assert (tmp_path / "paper_tables.md").read_text().startswith("### Table 1")
    charts = sorted(p.name for p in (tmp_path / "charts").iterdir())
    assert charts == ["table1_storage.png", "table2_traffic.png", "table3_codec_items.png",
                      "table4_placement.png", "top_ops_tiny_shufflenet.png"]
    assert (tmp_path / "charts" / "table1_storage.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_model_is_a_clear_error_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_export(*args: object) -> None:
        raise AssertionError("exported a model before checking every spec")

    monkeypatch.setattr(tables, "export_for_analysis", no_export)
    argv = ["tables", "--models", "tiny_shufflenet,nosuchnet", "--out", str(tmp_path), "--no-progress"]
    assert cli.main(argv) == 2
    assert "unknown model 'nosuchnet'" in capsys.readouterr().err
    assert not (tmp_path / "paper_tables.md").exists()


@pytest.mark.slow
def test_shufflenet_v2_matches_the_published_storage_and_claims() -> None:
    (m,) = tables.collect(["shufflenet_v2"], progress=False)
    assert tables.storage_matches(m)
    assert (round(m.policies["Z"]["storage_mib"], 1), round(m.policies["W"]["storage_mib"], 1)) == (8.8, 2.3)
    assert m.policies["W"]["traffic_mib"] < m.policies["Z"]["traffic_mib"]
    assert m.placements["nonlocal+coalesce"]["traffic_mib"] < m.placements["local"]["traffic_mib"]


@pytest.mark.slow
# SmolLM2's storage is checked with its fusion, in test_standalone_ops.py.
@pytest.mark.parametrize("spec", ["unet", "siglip"])
def test_storage_matches_the_published_figures(spec: str) -> None:
    (m,) = tables.collect([spec], progress=False)
    z, compressed = tables.PUBLISHED_STORAGE[spec]
    assert round(m.policies["Z"]["storage_mib"], 1) == z
    assert all(round(m.policies[p]["storage_mib"], 1) == compressed for p in ("Y", "X", "W"))
