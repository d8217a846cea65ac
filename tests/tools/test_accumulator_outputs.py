"""Accumulator outputs end to end (docs/DESIGN.md, "Accumulator outputs"): at policy I
the last convolution's or linear's result leaves the delegate as its int32
accumulator, one RESCALE fewer than requantising it, and the artefact still equals
the simulation."""

from __future__ import annotations

import numpy as np
import torch

from codec_tosa.runtime.pte import delegate_payload, inspect_pte
from codec_tosa.serialization.tosa_stats import operator_dtypes, tosa_stats
from codec_tosa.simulation import simulate
from codec_tosa.tools.report import IO_KERNELS
from codec_tosa.tools.validate import sqnr_db

import small_models


def _rescales(payload: bytes) -> int:
    return tosa_stats(payload).operators_by_type.get("RESCALE", 0)


def _after_last_conv(payload: bytes) -> list[tuple[str, list[str], list[str]]]:
    ops = list(operator_dtypes(payload))
    last = max(i for i, (op, _, _) in enumerate(ops) if op == "CONV2D")
    return ops[last:]


def _held_out(example: tuple[torch.Tensor, ...], n: int = 8) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(4321)  # not small_models.calibration's seed
    return [tuple(torch.randn(t.shape, generator=g) for t in example) for _ in range(n)]


def test_the_last_convolution_writes_the_int32_output(lowered):
    wide = lowered("conv_relu6_conv", "I")
    narrow = lowered("conv_relu6_conv", "I", accumulator_outputs=False)
    w, n = delegate_payload(wide.pte), delegate_payload(narrow.pte)
    assert _rescales(w) == _rescales(n) - 1
    tail = _after_last_conv(w)
    assert [op for op, _, _ in tail if op == "RESCALE"] == []
    assert tail[0][2] == ["INT32"] and tail[-1][2] == ["INT32"], tail
    assert _after_last_conv(n)[1][0] == "RESCALE"
    for low in (wide, narrow):
        assert set(inspect_pte(low.pte).operators) <= IO_KERNELS
    domains = wide.planned.placement.plan.domains
    assert [d.accumulator for d in domains].count(True) == 1
    assert all(d.id in wide.planned.thetas for d in domains if not d.accumulator)
    assert not any(d.id in wide.planned.thetas for d in domains if d.accumulator)


def test_the_int32_output_is_more_accurate_on_held_out_inputs(lowered):
    """Same weight codes, same per-channel scales (applied by the CPU decode); what
    changes is the output rounding, which the accumulator does not have. Measured
    against FP32 eager on inputs calibration never saw, for a convolution and a
    linear output."""
    for name in ("conv_relu6_conv", "mobile_block"):
        model, example = getattr(small_models, name)()
        xs = _held_out(example)
        with torch.no_grad():
            eager = np.concatenate([model(*x).numpy().ravel() for x in xs])
        sqnr = {}
        for wide in (None, False):
            low = lowered(name, "I") if wide is None else lowered(name, "I", accumulator_outputs=False)
            got = np.concatenate([simulate(low.planned, x)[0].numpy().ravel() for x in xs])
            sqnr[wide] = sqnr_db(eager, got)
        assert sqnr[None] > sqnr[False], (name, sqnr)


def test_an_ethos_u_linear_head_hands_over_its_accumulator(lowered):
    """mobile_block ends in a linear, which Arm lowers as a CONV2D: Vela is given
    one RESCALE fewer, takes the int8 -> int32 convolution and leaves nothing but
    the input quantize and output dequantize to the CPU."""
    wide = lowered("mobile_block", "I", target="ethos-u55-128")
    narrow = lowered("mobile_block", "I", target="ethos-u55-128", accumulator_outputs=False)
    w, n = wide.files["model.tosa"], narrow.files["model.tosa"]
    assert _rescales(w) == _rescales(n) - 1
    assert _after_last_conv(w)[-1][2] == ["INT32"]
    for low in (wide, narrow):
        assert low.report["vela"]["cpu_ops"] == len(inspect_pte(low.pte).operators)
        assert set(inspect_pte(low.pte).operators) <= IO_KERNELS
