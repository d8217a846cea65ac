"""Outputs and inputs that are not one float tensor, through compile and validate
(issues 22 and 27): each compiles and validates PASS; and the structural oracle
(the planned FP32 program against eager) fails an error the simulation shares."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import program_shapes
from codec_tosa.runtime.pte import inspect_pte
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import compile_model
from codec_tosa.validation.validate import Verdict, validate

SPEC = program_shapes.__file__


def _compile(model: str, policy: str, out: Path) -> Path:
    compile_model(f"{SPEC}:{model}", CodecSpec(policy), out, progress=False, samples=2)
    return out / "model.pte"


@pytest.mark.parametrize("model,policy", [("compare", "I"), ("in_place", "W"), ("log", "W"),
                                          ("self_attention", "W"), ("scaled", "I"), ("cond", "W")])
def test_compiles_and_validates(model: str, policy: str, tmp_path: Path) -> None:
    v = validate(_compile(model, policy, tmp_path))
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())
    assert all(o.planned_max_abs is not None for o in v.outputs)  # the oracle ran on every output


@pytest.mark.parametrize("model", ["view_fp16", "conv_fp16"])
def test_a_float16_program_is_delegated_at_w_with_its_codecs_and_validates(model: str, tmp_path: Path) -> None:
    """Arm's float16 cases (test_view rand_4d_4d_fp16, test_conv2d fp16_3x3) at W:
    each dequantize of the plan gives float16 (FP32 ones made ExecuTorch's verifier
    refuse the view's and the product's inputs as "mismatched dtypes"), so the whole
    program is one delegate with its codecs, and it validates."""
    pte = _compile(model, "W", tmp_path)
    info = inspect_pte(pte.read_bytes())
    assert len(info.delegate_ids) == 1 and not info.operators, info
    assert json.loads((tmp_path / "report.json").read_text())["modeled"]["codecs"] > 0
    v = validate(pte)
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())


def test_nested_inputs_and_outputs_are_flattened_as_torch_export_does(tmp_path: Path) -> None:
    """The LSTM takes (x, (h0, c0)) and returns {"logits", "state": (h, c)}: the
    program takes 3 tensors and returns 3, in torch.export's pytree order."""
    v = validate(_compile("nested", "W", tmp_path))
    assert v.verdict is Verdict.PASS and len(v.outputs) == 3
    io = np.load(tmp_path / "reference_io.npz")
    model, (x, (h0, c0)) = program_shapes.nested()
    assert [io[f"input_{i}"].shape for i in range(3)] == [x.shape, h0.shape, c0.shape]
    with torch.no_grad():
        out = model(x, (h0, c0))
    assert np.array_equal(io["eager_0"], out["logits"].numpy())
    assert np.array_equal(io["eager_2"], out["state"][1].numpy())


def test_a_buffer_the_program_mutates_keeps_its_state_and_is_not_an_output(tmp_path: Path) -> None:
    """A decode step's KV cache in small (issue 51), filled by a prompt before export:
    the program returns the cache's next state first (BUFFER_MUTATION), which
    ExecuTorch writes back in place and neither the runtime nor eager returns, so
    the planned and simulated outputs leave it out (else the reference stage
    compares a (1, 6, 8) cache with the (1, 4) output); and the .pte holds the
    buffer's state (InitializedMutableBufferPass), so the runtime starts where eager
    does (from zeros it is over a hundred steps off the simulation: FAIL)."""
    pte = _compile("prefilled_cache", "W", tmp_path)
    io = np.load(tmp_path / "reference_io.npz")
    assert io["eager_0"].shape == io["planned_0"].shape == io["simulated_0"].shape == (1, 4)
    assert "planned_1" not in io and "step_1" not in io
    v = validate(pte)
    assert v.verdict is Verdict.PASS and len(v.outputs) == 1, "\n".join(v.lines())


def test_a_structural_error_the_simulation_shares_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch norm folded wrongly (its convolution's weight scaled by 1.5 after
    folding): the artefact equals the simulation bit for bit, since both run the
    wrong weights, but the planned FP32 program no longer equals eager: FAIL."""
    from codec_tosa.targets.tosa import partitioner

    fold = partitioner.FoldBatchNormPass.call

    def wrong(self, graph_module):  # type: ignore[no-untyped-def]
        result = fold(self, graph_module)
        ep = self.exported_program
        name = next(k for k in ep.state_dict if k.endswith("weight") and ep.state_dict[k].dim() == 4)
        ep.state_dict[name].mul_(1.5)
        return result

    monkeypatch.setattr(partitioner.FoldBatchNormPass, "call", wrong)
    pte = _compile("conv_bn", "W", tmp_path)
    # the planned program is off eager, so compile measured both's FP32 noise in
    # float64 (reference_io.fp32_noise); the error is far beyond it
    assert "fp32_noise_0" in np.load(pte.parent / "reference_io.npz")
    v = validate(pte)
    assert v.verdict is Verdict.FAIL
    (o,) = v.outputs
    assert o.planned_failed and o.vs_expected_max_abs == 0.0
    assert any("a structural error" in line for line in v.lines())


@pytest.mark.parametrize("model,policy,words", [
    ("log10", "W", "delegated nothing of this model (operators on the CPU: aten::log10)"),
    ("log10_bf16", "W", "input x is bfloat16"),
    ("instance_norm", "I", "CodecQuantizer quantized nothing of this model (operators: "
     "aten._native_batch_norm_legit.no_stats"),
])
def test_refused_in_one_line_and_nothing_written(model: str, policy: str, words: str, tmp_path: Path) -> None:
    from codec_tosa.tools.cli import error_kind, error_line

    with pytest.raises(ValueError) as info:
        _compile(model, policy, tmp_path / "out")
    line = error_line(info.value)
    assert error_kind(info.value) == "refused" and words in line and "\n" not in line, line
    assert not (tmp_path / "out").exists()
