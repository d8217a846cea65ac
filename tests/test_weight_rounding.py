"""GPTQ weight rounding (docs/DESIGN.md, "Weight rounding"): codes on the codec's own
scales that cut each layer's output error on held-out inputs, the artefact bit-exact with
its simulation, and closer to FP32 eager than nearest rounding on held-out inputs."""

from __future__ import annotations

import math

import pytest
import torch

import small_models
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import compile_module
from codec_tosa.validation.validate import Verdict, validate
from codec_tosa.quantizer.weight_rounding import gptq


def _inputs(n: int, columns: int, seed: int) -> torch.Tensor:
    """Correlated layer inputs [columns, n], as neighbouring pixels and channels are."""
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(columns, columns // 4, generator=torch.Generator().manual_seed(0))
    return (mixing @ torch.randn(columns // 4, n, generator=g) + 0.1 * torch.randn(columns, n, generator=g)).double()


def _output_sqnr_db(weight: torch.Tensor, rounded: torch.Tensor, x: torch.Tensor) -> float:
    ref, got = weight @ x, rounded @ x
    return 10 * math.log10(float((ref ** 2).sum()) / float(((ref - got) ** 2).sum()))


@pytest.mark.parametrize("qmax", [7, 127])
@pytest.mark.parametrize("groups", [1, 3])
def test_gptq_codes_cut_the_output_error_on_held_out_inputs(qmax, groups):
    """On inputs it never saw, GPTQ's codes at the per-row max-abs scales give a layer
    output at least 3 dB closer to the float layer's than rounding each weight to the
    nearest code; every code is an integer in the codec's range."""
    rows, columns = 24, 48
    w = torch.randn(groups, rows, columns, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    s = w.abs().amax(-1, keepdim=True) / qmax
    fit = [_inputs(2000, columns, 10 + g) for g in range(groups)]
    held_out = [_inputs(500, columns, 100 + g) for g in range(groups)]
    h = torch.stack([x @ x.T / x.shape[1] for x in fit])
    codes = gptq(w, h, s, qmax)
    assert codes.shape == w.shape and bool((codes == codes.round()).all()) and int(codes.abs().max()) <= qmax
    nearest = torch.clamp(torch.round(w / s), -qmax, qmax)
    for g in range(groups):
        ours = _output_sqnr_db(w[g], codes[g] * s[g], held_out[g])
        plain = _output_sqnr_db(w[g], nearest[g] * s[g], held_out[g])
        assert ours > plain + 3.0, (g, ours, plain)


def test_an_input_that_is_always_zero_gets_code_zero():
    """A column whose input is always zero carries no output; its codes are zero (the
    correlation is singular there, and GPTQ neither fails nor spends error on it)."""
    w = torch.randn(1, 8, 12, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x = _inputs(400, 12, 3)
    x[5] = 0.0
    s = w.abs().amax(-1, keepdim=True) / 7
    codes = gptq(w, (x @ x.T / x.shape[1]).unsqueeze(0), s, 7)
    assert bool((codes[0, :, 5] == 0).all())
    assert bool((codes[0, :, [0, 1, 2, 3, 4]] != 0).any())


def _compiled(tmp_path, **spec: object):
    m, x = small_models.mobile_block()
    tag = "-".join(f"{k}{v}" for k, v in spec.items()) or "plain"
    return compile_module("mobile_block", (m, x), CodecSpec(policy="I", **spec), tmp_path / tag,
                          progress=False, samples=6)


def test_gptq_int4_weights_are_exact_and_closer_to_fp32(tmp_path):
    """At INT4 weights, GPTQ's artefact equals its simulation on the reference model bit
    for bit, holds the same INT4 constants (same bytes), and is closer to FP32 eager on
    the held-out samples than nearest rounding; report.json says how each weight was
    rounded."""
    plain, ours = _compiled(tmp_path, weights="int4"), _compiled(tmp_path, weights="int4", weight_rounding="gptq")
    assert ours.report["precision"]["weight_rounding"] == "gptq"
    assert ours.report["precision"]["not_rounded"] == {}  # conv2d and linear only: every weight here
    vp, vo = validate(plain.pte), validate(ours.pte)
    assert vo.verdict == Verdict.PASS and vo.ambiguous_codes == 0
    assert all(o.vs_expected_max_abs == 0.0 for o in vo.outputs), [o.vs_expected_max_abs for o in vo.outputs]
    assert plain.pte.stat().st_size == ours.pte.stat().st_size
    for a, b in zip(vo.outputs, vp.outputs):
        assert a.sqnr_db > b.sqnr_db + 1.0, (a.sqnr_db, b.sqnr_db)


def test_the_pt2e_flow_rounds_between_calibration_and_convert():
    """From Python: `choose_precision` at fixed widths only rounds; the module
    convert_pt2e makes of `prepared` and the quantizer's own `converted()` compute the
    same; both differ from nearest rounding's; without gptq (or auto) the call is
    refused in one line."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from codec_tosa import CodecQuantizer

    m, x = small_models.mobile_block()
    calibration = small_models.calibration(x, 6)
    held_out = small_models.calibration(x, 12)[7:]
    outs = {}
    for rounding in ("nearest", "gptq"):
        q = CodecQuantizer(CodecSpec(policy="I", weight_rounding=rounding))
        prepared = prepare_pt2e(torch.export.export(m, x).module(check_guards=False), q)
        with torch.no_grad():
            for batch in calibration:
                prepared(*batch)
            if rounding == "gptq":
                widths = q.choose_precision(prepared, calibration)
                assert all(p.bits == 8 for p in widths)
            else:
                with pytest.raises(ValueError, match="choose_precision: precision is 'int8'"):
                    q.choose_precision(prepared, calibration)
            converted = convert_pt2e(prepared)
            outs[rounding] = torch.cat([converted(*h).flatten() for h in held_out])
            if rounding == "gptq":
                again = torch.cat([q.converted()(*h).flatten() for h in held_out])
                assert torch.equal(again, outs[rounding])
    assert not torch.equal(outs["gptq"], outs["nearest"])


@pytest.mark.parametrize("spec, message", [
    (dict(policy="W", weight_rounding="gptq"), "weight_rounding='gptq': the weights are integer codes"),
    (dict(policy="I", weight_rounding="stochastic"), "unknown weight_rounding 'stochastic'"),
])
def test_rounding_options_are_refused_in_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as e:
        CodecSpec(**spec)
    assert "\n" not in str(e.value)


def test_compile_with_gptq_through_the_cli_and_report(tmp_path, capsys):
    """`--weight-rounding gptq` at fixed widths: compile rounds, validate passes at 0
    steps, and `report` says how the weights were rounded."""
    from pathlib import Path

    from codec_tosa.tools.cli import main

    out = tmp_path / "gptq"
    model = f"{Path(small_models.__file__)}:mobile_block"
    assert main(["compile", model, "--policy", "I", "--weight-rounding", "gptq", "--samples", "2",
                 "-o", str(out)]) == 0
    assert main(["validate", str(out / "model.pte")]) == 0
    assert main(["report", str(out / "model.pte")]) == 0
    assert "weight rounding: gptq, every weight" in capsys.readouterr().out
