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
