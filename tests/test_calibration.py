"""Calibration (docs/DESIGN.md, "Calibration"): each domain's range from min/max or
from the histogram search Arm's quantizer uses, over every tensor it is observed at."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from codec_tosa.planning.calibration import CalibrationError, learn_thetas
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


def _arm_observer_scale(tensors: list[torch.Tensor]) -> float:
    """The scale our codec learns on the range Arm's activation observer (torchao's
    HistogramObserver, as get_symmetric_quantization_config builds it) picks."""
    from torchao.quantization.pt2e import HistogramObserver

    from codec_tosa.codecs.int8 import DEFAULT_CODEC

    obs = HistogramObserver(dtype=torch.int8, quant_min=-128, quant_max=127,
                            qscheme=torch.per_tensor_affine, eps=2.0 ** -16)
    for t in tensors:
        obs(t)
    scale, zp = (float(v) for v in obs.calculate_qparams())
    return DEFAULT_CODEC.learn((-128 - zp) * scale, (127 - zp) * scale).scale


@pytest.mark.parametrize("seed", [1, 7, 11])
def test_histogram_takes_the_range_arms_observer_picks(seed: int) -> None:
    calib = _heavy_tailed(seed)
    minmax, hist = _thetas(calib, "minmax"), _thetas(calib, "histogram")
    assert minmax.keys() == hist.keys() and "x" in minmax
    lo = min(float(c[0].min()) for c in calib)
    hi = max(float(c[0].max()) for c in calib)
    assert minmax["x"] == pytest.approx((hi - lo) / 255, rel=1e-3)
    assert hist["x"] == pytest.approx(_arm_observer_scale([c[0] for c in calib]), rel=1e-9)
    # the search drops a far tail where that lowers the L2 quantization
    # error of the bulk; it never widens a range
    assert all(hist[k] <= minmax[k] * (1 + 1e-6) for k in minmax)


def test_histogram_differs_from_min_max_on_heavy_tails() -> None:
    """So that the test above tells the two observers apart."""
    assert any(_thetas(_heavy_tailed(seed), "histogram")["x"] < _thetas(_heavy_tailed(seed), "minmax")["x"] * 0.99
               for seed in (1, 7, 11))


def test_unknown_observer_is_refused() -> None:
    with pytest.raises(CalibrationError, match="unknown observer 'median'"):
        _thetas(_heavy_tailed(1), "median")


def test_seeded_inputs_follow_the_examples_domain_and_aliasing() -> None:
    """`random_calibration` (and the held-out samples, drawn the same way): standard
    normal where the example reaches beyond +-1, uniform over the example's range
    otherwise (an acos's [-1, 1], a sqrt's [0, 4]), integers as given, and a tensor
    passed twice drawn once."""
    from codec_tosa.planning.calibration import random_calibration

    gen = torch.Generator().manual_seed(0)
    normal = torch.randn(64, generator=gen)
    ramp = torch.linspace(-1.0, 1.0, 16)
    positive = torch.rand(32, generator=gen) * 4.0
    index = torch.tensor([3, 1, 2])
    (a, b, c, i, a2), = random_calibration((normal, ramp, positive, index, normal), 1, seed=5)
    assert a.min() < -1.0 and a.max() > 1.0 and not torch.equal(a, normal)
    assert -1.0 <= float(b.min()) and float(b.max()) <= 1.0 and not torch.equal(b, ramp)
    assert float(c.min()) >= float(positive.min()) and float(c.max()) <= float(positive.max())
    assert torch.equal(i, index)
    assert a2 is a


@pytest.mark.parametrize("observer", ["minmax", "histogram"])
def test_the_quantizer_observer_leaves_infinities_out_and_refuses_a_range_of_none(observer: str) -> None:
    # CodecQuantizer's observer (policy I) follows the same rule as learn_thetas
    from codec_tosa.quantizer.observers import DomainObserver

    x = torch.linspace(-2.0, 3.0, 101)
    with_inf = x.clone()
    with_inf[[0, 50]] = torch.tensor([-float("inf"), float("nan")])
    plain, seen = DomainObserver(observer=observer), DomainObserver(observer=observer)
    finite = torch.cat([x[1:50], x[51:]])  # what with_inf holds that a code can
    for _ in range(2):
        plain(finite)
    seen(with_inf)
    seen(finite)
    assert seen.theta() == plain.theta()
    assert float(seen.min_val) == pytest.approx(float(x[1]))
    nothing = DomainObserver(observer=observer, label="3 (dominator o(log))")
    nothing(torch.full((4,), -float("inf")))
    with pytest.raises(ValueError, match=r"domain 3 \(dominator o\(log\)\): calibration produced no finite value"):
        nothing.theta()
