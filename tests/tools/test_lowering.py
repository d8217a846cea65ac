"""The product path: CodecTosaPartitioner -> CodecTosaBackend -> .pte, proven on the
TOSA reference model and in the ExecuTorch runtime."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.simulation import simulate
from codec_tosa.runtime.pte import delegate_payload, delegate_provenance
from codec_tosa.validation.reference_model import run_reference_model
from codec_tosa.serialization.tosa_stats import tosa_stats
from codec_tosa.spec import CodecSpec

from small_models import conv_cat_reshape

PLACEMENTS = ("local", "nonlocal", "nonlocal+coalesce")


@pytest.fixture(scope="module")
def model(lowered):
    m, x = conv_cat_reshape()
    return m, x, lowered


def _lower(model, policy, placement, **kw):
    m, x, lowered = model
    low = lowered("conv_cat_reshape", policy, placement, **kw)
    payload = delegate_payload(low.pte)
    ref = run_reference_model(payload, [x[0].numpy()], "test")[0]
    return low, payload, ref


def test_policy_z_matches_eager(model):
    m, x, _ = model
    lowered, payload, ref = _lower(model, "Z", "nonlocal+coalesce")
    eager = m(*x).detach().numpy()
    assert np.max(np.abs(ref - eager)) <= 1e-4 * np.max(np.abs(eager))
    stats = tosa_stats(payload)
    assert "RESCALE" not in stats.operators_by_type  # no codecs at all
    assert delegate_provenance(lowered.pte)["spec"]["tosa"] == "TOSA-1.0+FP"


# W at every placement (lowered once for the traffic test below); Y and X at the
# placements tests/passes/test_materialize.py leaves them (the fuzz grid has every pair)
@pytest.mark.parametrize("placement,policy", [("local", "W"), ("nonlocal", "W"), ("nonlocal+coalesce", "W"),
                                              ("nonlocal", "Y"), ("local", "X")])
def test_compressed_matches_simulation_within_one_step(model, policy, placement):
    m, x, _ = model
    lowered, payload, ref = _lower(model, policy, placement)
    part = lowered.planned
    sim = simulate(part, x)[0].numpy()
    # the output is decoded from the linear's output domain: one step is its scale
    out_domain = part.placement.plan.value_domain[
        next(part.graph.in_value[p] for p in range(part.graph.num_in_ports)
             if part.graph.in_op[p] == -1)]
    step = part.thetas[out_domain].scale
    assert np.max(np.abs(ref.reshape(sim.shape) - sim)) <= step * (1 + 1e-4)
    eager = m(*x).detach().numpy()
    sqnr = 10 * np.log10(np.sum(eager**2) / np.sum((eager - ref.reshape(eager.shape)) ** 2))
    assert sqnr > 15  # INT8 codes everywhere: far from noise
    prov = delegate_provenance(lowered.pte)
    assert prov["spec"]["policy"] == policy and prov["spec"]["placement"] == placement
    assert len(prov["plan"]["domains"]) == len(part.placement.plan.domains)
    assert set(prov["versions"]) == {"codec_tosa", "executorch", "torch", "tosa-tools"}


def test_tosa_traffic_order_at_w(model):
    traffic = {pl: tosa_stats(_lower(model, "W", pl)[1]).traffic_bytes for pl in PLACEMENTS}
    assert traffic["nonlocal+coalesce"] <= traffic["nonlocal"] < traffic["local"]


def test_runtime_agrees_exactly_with_reference_model(model):
    from codec_tosa.runtime.executorch_runner import run_pte

    m, x, _ = model
    lowered, payload, ref = _lower(model, "W", "nonlocal+coalesce")
    (out,) = run_pte(lowered.pte, list(x))
    assert np.array_equal(out.numpy().reshape(ref.shape), ref)


def test_pooling_statistics_travel_in_the_pte(model):
    from codec_tosa.runtime.pte import read_pooling_stats

    lowered, payload, _ = _lower(model, "W", "nonlocal+coalesce")
    stats = read_pooling_stats(lowered.pte, payload)
    assert stats is not None and stats.operators_saved > 0
    assert stats.seconds == 0.0  # no timing in the artefact: same model, same bytes
    plain, plain_payload, _ = _lower(model, "W", "nonlocal+coalesce", pool_constants=False)
    assert read_pooling_stats(plain.pte, plain_payload) is None
    assert tosa_stats(plain_payload).operators - tosa_stats(payload).operators == stats.operators_saved


def test_transposed_convolution_stays_fp32_and_compiles():
    class Up(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = torch.nn.Conv2d(3, 4, 1)
            self.up = torch.nn.ConvTranspose2d(4, 4, 2, stride=2)  # 4 in, 4 out: axis 0 looks right

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.up(self.c(x))

    torch.manual_seed(0)
    m, x = Up().eval(), (torch.randn(1, 3, 4, 4),)
    lowered = lower_program(torch.export.export(m, x), CodecSpec(policy="Y"), [x])
    part = lowered.planned
    g, sem = part.graph, part.placement.semantics
    kinds = {g.op_name[op]: sem.int8_ops[op] for op in range(g.num_ops) if g.op_target[op].startswith("aten.conv")}
    assert sorted(kinds.values()) == [False, True]  # the plain conv is encoded, the transposed one not
    ref = run_reference_model(delegate_payload(lowered.pte), [x[0].numpy()], "t")[0]
    sim = simulate(part, x)[0].numpy()
    step = max(t.scale for t in part.thetas.values())
    assert np.max(np.abs(ref.reshape(sim.shape) - sim)) <= step


def test_a_tiny_activation_range_keeps_the_int32_bias_in_range():
    """A domain whose values are about 1e-6 (InceptionV3's head with random weights)
    gets the scale floor; the convolution after it stores its bias as int32 codes at
    s_in * s_w, which must not overflow, and the artefact must still be the plan."""
    import warnings

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 1)
            with torch.no_grad():
                self.conv.bias.uniform_(-0.5, 0.5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x)

    torch.manual_seed(0)
    m = Head().eval()
    calib = [(torch.randn(1, 4, 4, 4) * 1e-6,) for _ in range(3)]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*int32 bias codes overflow.*")
        lowered = lower_program(torch.export.export(m, calib[0]), CodecSpec(policy="W"), calib)
    held_out = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(5)) * 1e-6
    ref = run_reference_model(delegate_payload(lowered.pte), [held_out.numpy()], "t")[0]
    sim = simulate(lowered.planned, (held_out,))[0].numpy()
    assert np.array_equal(ref.reshape(sim.shape), sim)
    assert np.max(np.abs(sim - m(held_out).detach().numpy())) < 1e-2  # the bias survives


@pytest.mark.parametrize("policy", ["X", "W"])
def test_an_encoded_constant_is_encoded_offline_as_the_plan_rounds_it(policy):
    """A ViT's class token: a parameter concatenated with the activations. Its codes
    are computed at compile time with the plan's rounding; an encode left in the
    graph was constant-folded by Arm with the CAST as a truncation (the class
    token's row of the output was off by up to half a unit)."""

    class ClassToken(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cls = torch.nn.Parameter(torch.randn(1, 1, 8) * 0.7)
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1))

    torch.manual_seed(0)
    m = ClassToken().eval()
    gen = torch.Generator().manual_seed(3)
    calib = [(torch.randn(1, 4, 8, generator=gen),) for _ in range(4)]
    lowered = lower_program(torch.export.export(m, calib[0]), CodecSpec(policy=policy), calib)
    for _ in range(3):  # held out
        x = torch.randn(1, 4, 8, generator=gen)
        ref = run_reference_model(delegate_payload(lowered.pte), [x.numpy()], "t")[0]
        sim = simulate(lowered.planned, (x,))[0].numpy()
        assert np.array_equal(ref.reshape(sim.shape), sim)
