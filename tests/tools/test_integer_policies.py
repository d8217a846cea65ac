"""Policies V and I (docs/DESIGN.md, "Policy"; issue 11): the integer-target rows of
the commutation table, proven on the TOSA reference model."""

from __future__ import annotations

import numpy as np
import pytest

from codec_tosa.runtime.pte import delegate_payload, inspect_pte
from codec_tosa.serialization.tosa_stats import operator_dtypes
from codec_tosa.simulation import simulate
from codec_tosa.tools.reference_model import run_reference_model

import small_models


def _integer_between_convs(payload: bytes) -> list[tuple[str, list[str], list[str]]]:
    """The operators after the first CONV2D and up to the last one."""
    ops = list(operator_dtypes(payload))
    convs = [i for i, (op, _, _) in enumerate(ops) if op == "CONV2D"]
    assert len(convs) >= 2
    return ops[convs[0]:convs[-1] + 1]


def _matches_simulation(low, x) -> None:
    payload = delegate_payload(low.pte)
    ref = run_reference_model(payload, [t.numpy() for t in x], "test")
    sim = simulate(low.planned, x)
    steps = low.planned.output_steps([0.0] * len(sim))
    for r, s, step in zip(ref, sim, steps):
        assert step > 0  # every output is decoded from a domain
        assert np.max(np.abs(r.reshape(s.shape) - s.numpy())) <= step * (1 + 1e-4)


def test_relu6_at_w_is_fp32(lowered):
    low = lowered("conv_relu6_conv", "W")
    between = _integer_between_convs(delegate_payload(low.pte))
    assert any("FP32" in ins + outs for _, ins, outs in between)


def test_relu6_at_v_stays_on_codes(lowered):
    """conv -> relu6 -> conv at V: one CLAMP on INT8 between the convolutions, no FP32."""
    low = lowered("conv_relu6_conv", "V")
    assert inspect_pte(low.pte).operators == ()
    between = _integer_between_convs(delegate_payload(low.pte))
    assert all("FP32" not in ins + outs for _, ins, outs in between), between
    assert ("CLAMP", ["INT8"], ["INT8"]) in between
    _matches_simulation(low, small_models.conv_relu6_conv()[1])


def test_conv_relu6_domain_is_calibrated_after_the_relu6(lowered):
    """conv -> relu6 -> conv at V: the conv's output domain learns its theta on
    the relu6's output (zero point at the code minimum, scale from its maximum),
    not on the conv's, whose negative half the relu6 drops; the artefact still
    equals the simulation."""
    import torch

    model, x = small_models.conv_relu6_conv()
    low = lowered("conv_relu6_conv", "V")
    plan = low.planned.placement.plan
    graph = low.planned.graph
    relu6 = next(o for o in range(graph.num_ops) if graph.op_target[o] == "aten.hardtanh.default")
    out = graph.op_out[relu6][0]
    d = plan.value_domain[out]
    assert d >= 0 and plan.domains[d].observe == out
    with torch.no_grad():
        pre = [model.a(*c) for c in small_models.calibration(x)]
    hi = max(float(torch.clamp(t, 0, 6).max()) for t in pre)
    assert min(float(t.min()) for t in pre) < -0.1  # the relu6 does drop something
    theta = low.planned.thetas[d]
    assert theta.zero_point == theta.qmin
    assert theta.scale == pytest.approx(hi / 255, rel=1e-6)
    _matches_simulation(low, x)


_IO_KERNELS = {"quantized_decomposed::quantize_per_tensor", "quantized_decomposed::dequantize_per_tensor"}


def test_mobile_block_at_i_is_one_integer_delegate(lowered):
    """conv+BN+ReLU6, depthwise, residual add, cat, shuffle, avg-pools, linear:
    one TOSA-1.0+INT delegate, no floating-point operator in it; only the input
    encode and output decode run on the CPU (as in Arm's INT8 flow)."""
    from codec_tosa.runtime.pte import delegate_provenance
    from codec_tosa.serialization.tosa_stats import float_operators, tosa_stats

    low = lowered("mobile_block", "I")
    info = inspect_pte(low.pte)
    assert info.delegate_ids == ("CodecTosaBackend",)
    assert set(info.operators) <= _IO_KERNELS
    payload = delegate_payload(low.pte)
    assert float_operators(payload) == []
    ops = tosa_stats(payload).operators_by_type
    assert {"ADD", "AVG_POOL2D", "CLAMP", "CONCAT", "DEPTHWISE_CONV2D"} <= set(ops)
    assert delegate_provenance(low.pte)["spec"]["tosa"] == "TOSA-1.0+INT"


def test_target_needs_policy_i_and_a_known_target():
    from codec_tosa import arm_adapter
    from codec_tosa.spec import CodecSpec

    with pytest.raises(ValueError, match="needs --policy I"):
        CodecSpec(policy="W", target="ethos-u55-128")
    with pytest.raises(ValueError, match="unknown Ethos-U target 'ethos-u99-7'"):
        arm_adapter.ethos_u_compile_spec("ethos-u99-7")


def test_ethos_u55_delegate_is_vela(lowered):
    """--target ethos-u55-128: one EthosUBackend delegate (Vela's command stream)
    and Vela's summary of the TOSA it was given, which is all-integer."""
    pytest.importorskip("ethosu.vela")
    from codec_tosa.serialization.tosa_stats import float_operators
    low = lowered("mobile_block", "I", target="ethos-u55-128")
    info = inspect_pte(low.pte)
    assert info.delegate_ids == ("EthosUBackend",)
    assert list(low.files) == ["model.tosa"] and float_operators(low.files["model.tosa"]) == []
    vela = low.report["vela"]
    assert vela["cycles_total"] > 0 and vela["npu_ops"] > 0
    assert vela["cpu_ops"] == len(info.operators)  # Vela itself left nothing to the CPU
