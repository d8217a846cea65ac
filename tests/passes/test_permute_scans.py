"""The permute propagation's scans without a re-trace each, and Arm's passes as
progress steps (issue 51).

Arm's propagation re-traces the whole graph after every scan that moved
something; on a chain the scans grow with depth, so the lowering grew with the
square of a transformer's layers. `arm.pipeline` recomputes `meta["val"]`
between scans where it can have changed and keeps only the last re-trace: the
graph handed on, and so the artefact, must be exactly what Arm's re-traces give.
"""

from __future__ import annotations

import collections
from typing import Any

import pytest
import torch

import small_models
from codec_tosa import progress
from codec_tosa.arm import pipeline as arm_pipeline
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import lower_program


def _lower(name: str) -> bytes:
    model, x = getattr(small_models, name)()
    return lower_program(torch.export.export(model, x), CodecSpec("W"), small_models.calibration(x)).pte


# the chain and the transformer in the default run; two CNN shapes in the slow tier
# (make test under 10 minutes; CI runs both)
@pytest.mark.parametrize("name", ["attention", pytest.param("mobile_block", marks=pytest.mark.slow),
                                  pytest.param("conv_cat_reshape", marks=pytest.mark.slow), "residual_stack"])
def test_scans_without_retraces_give_the_same_bytes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    refreshes: collections.Counter = collections.Counter()
    refresh = arm_pipeline._ValRefresher.refresh

    def counted(self: Any, graph_module: torch.fx.GraphModule) -> bool:
        done = refresh(self, graph_module)
        refreshes[done] += 1
        return done

    monkeypatch.setattr(arm_pipeline._ValRefresher, "refresh", counted)
    ours = _lower(name)
    assert refreshes[False] == 0 and refreshes[True] > 0, refreshes  # scans refreshed, none fell back
    # Arm's own way: a real re-trace after every scan
    monkeypatch.setattr(arm_pipeline._ValRefresher, "refresh", lambda self, gm: False)
    assert _lower(name) == ours


def test_lowering_reports_arm_passes_as_steps() -> None:
    """`on_step` hears each of Arm's passes inside the TOSA lowering; `on_stage` still
    hears the stages only."""
    model, x = small_models.attention()
    stages: list[str] = []
    steps: list[str] = []
    lower_program(torch.export.export(model, x), CodecSpec("W"), small_models.calibration(x),
                  on_stage=stages.append, on_step=steps.append)
    assert stages == [progress.PLACEMENT, "TOSA lowering: delegate 1", progress.SERIALISATION]
    assert steps[0].startswith("TOSA lowering: delegate 1: pass 1/")
    assert any(s.endswith(" CodecPermuteDownPass") for s in steps)
    n = int(steps[-1].split("pass ")[1].split("/")[1].split()[0])
    assert len(steps) == n
