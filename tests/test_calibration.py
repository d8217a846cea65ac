"""Calibration (docs/DESIGN.md, "Calibration"): each domain's range from min/max or
from the histogram search Arm's quantizer uses, over every tensor it is observed at."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from codec_tosa.calibration import CalibrationError, learn_thetas
from codec_tosa.commutation.table import CommutationTable
from codec_tosa.graph import PortGraph
from codec_tosa.placement import place


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def _thetas(calibration: list[tuple[torch.Tensor, ...]], observer: str) -> dict[str, float]:
    """Scale per observed tensor name at policy I."""
    torch.manual_seed(0)
    ep = torch.export.export(_Linear().eval(), calibration[0])
    graph = PortGraph.from_program(ep)
    plan = place(graph, CommutationTable.default(), "I").plan
    thetas = learn_thetas(ep, graph, plan, calibration, observer=observer)
    return {graph.val_name[d.observe]: thetas[d.id].scale for d in plan.domains}


def _heavy_tailed(seed: int) -> list[tuple[torch.Tensor, ...]]:
    """Cauchy samples: a bulk near 0 and a few values thousands of times larger."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.tan(torch.pi * (torch.rand(1, 3, 64, 64, generator=g) - 0.5)),) for _ in range(4)]


def test_histogram_clips_a_heavy_tail_that_min_max_keeps() -> None:
    calib = _heavy_tailed(7)
    minmax, hist = _thetas(calib, "minmax"), _thetas(calib, "histogram")
    assert minmax.keys() == hist.keys() and "x" in minmax
    lo = min(float(c[0].min()) for c in calib)
    hi = max(float(c[0].max()) for c in calib)
    assert minmax["x"] == pytest.approx((hi - lo) / 255, rel=1e-3)
    # the histogram search drops the far tail where that lowers the L2
    # quantization error of the bulk (as Arm's HistogramObserver does); it
    # never widens a range
    assert hist["x"] < minmax["x"] * 0.95
    assert all(hist[k] <= minmax[k] * (1 + 1e-6) for k in minmax)


def test_unknown_observer_is_refused() -> None:
    with pytest.raises(CalibrationError, match="unknown observer 'median'"):
        _thetas(_heavy_tailed(1), "median")
