"""The VGF target (issue 15): TOSA -> VGF with the ML SDK's model-converter, run by
scenario_runner on the ML emulation layer over lavapipe, against the TOSA reference model.

These tests need the four ML SDK wheels and, from apt, mesa-vulkan-drivers and
libvulkan1; without them they fail with the line that installs what is missing
(they must run in CI, so they do not skip).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import tosa_serializer as ts

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.arm import stock
from codec_tosa.validation.reference_model import run_reference_model
from codec_tosa.spec import CodecSpec
from codec_tosa.targets.vgf import ConversionError, NoVulkanDevice, VgfToolMissing, run_vgf, vgf_tools
from codec_tosa.targets.vgf import convert
from codec_tosa.targets.vgf import run as vgf_run
from codec_tosa.targets.vgf import tools as vgf_tools_module
from codec_tosa.tools.compiler import lower_program

VGF_BACKEND_ID = arm_adapter.VGF_BACKEND_ID

from small_models import calibration, conv_cat_reshape


def _held_out(example: tuple[torch.Tensor, ...], seed: int) -> list[np.ndarray]:
    # seeds unlike calibration()'s (1): inputs the codec scales were not fitted to
    g = torch.Generator().manual_seed(seed)
    return [(2.0 * torch.randn(t.shape, generator=g)).numpy() for t in example]


@pytest.fixture(scope="module")
def model():
    m, x = conv_cat_reshape()
    return m, x, torch.export.export(m, x), calibration(x)


@pytest.fixture(scope="module")
def lowered_w(model):
    _, _, ep, calib = model
    return lower_program(ep, CodecSpec(policy="W", target="vgf"), calib)


def test_policy_w_pte_delegates_to_vgfbackend_with_the_converted_tosa(lowered_w):
    from executorch.exir._serialize._program import _extract_delegate_payload

    assert sorted(lowered_w.files) == ["model.tosa", "model.vgf"]
    payload = _extract_delegate_payload(lowered_w.pte, VGF_BACKEND_ID)
    assert payload is not None and bytes(payload) == lowered_w.files["model.vgf"]
    # Arm's conversion inside VgfBackend gives what ours gives for our TOSA
    assert convert(lowered_w.files["model.tosa"]) == lowered_w.files["model.vgf"]


@pytest.mark.parametrize("seed", [101, 202])
def test_policy_w_vgf_equals_reference_model_bit_for_bit(lowered_w, model, seed):
    inputs = _held_out(model[1], seed)
    reference = run_reference_model(lowered_w.files["model.tosa"], inputs, "W")
    on_vgf = run_vgf(lowered_w.files["model.vgf"], inputs, "W")
    assert len(on_vgf) == len(reference) == 1
    assert on_vgf[0].dtype == reference[0].dtype
    assert np.array_equal(on_vgf[0], reference[0].reshape(on_vgf[0].shape))


def test_stock_tosa_fp_vgf_matches_reference_model(model):
    m, x, ep, _ = model
    (partition,) = stock.stock_partitions(ep, arm_adapter.tosa_compile_spec("TOSA-1.0+FP"))
    inputs = _held_out(x, 303)
    reference = run_reference_model(partition.tosa_bytes, inputs, "stock FP")[0]
    on_vgf = run_vgf(convert(partition.tosa_bytes, "stock FP"), inputs, "stock FP")[0]
    reference = reference.reshape(on_vgf.shape)
    # FP32 on a different implementation: summation order may differ in the last bits
    assert np.max(np.abs(on_vgf - reference)) <= 1e-6 * max(1.0, float(np.max(np.abs(reference))))
    eager = m(torch.from_numpy(inputs[0])).detach().numpy()
    assert np.max(np.abs(on_vgf - eager.reshape(on_vgf.shape))) <= 1e-4 * float(np.max(np.abs(eager)))


def test_stock_vgf_flow_conversions_are_kept_as_arm_made_them(model):
    from executorch.exir import to_edge_transform_and_lower

    from codec_tosa.runtime.pte import delegates

    _, x, ep, _ = model
    spec = stock.vgf_compile_spec("TOSA-1.0+FP")
    with arm_adapter.vgf_conversions_kept(str(vgf_tools().model_converter)) as kept:
        edge = to_edge_transform_and_lower(ep, partitioner=[stock.vgf_partitioner(spec)])
    pte = bytes(edge.to_executorch().buffer)
    (payload,) = [d.payload for d in delegates(pte) if d.backend_id == VGF_BACKEND_ID]
    assert len(kept) == 1 and kept[0].vgf == payload
    # the recorded TOSA is what was converted: converting it again gives the payload
    assert convert(kept[0].tosa) == payload
    inputs = _held_out(x, 404)
    on_vgf = run_vgf(payload, inputs, "stock FP")[0]
    reference = run_reference_model(kept[0].tosa, inputs, "stock FP")[0].reshape(on_vgf.shape)
    assert np.max(np.abs(on_vgf - reference)) <= 1e-6 * max(1.0, float(np.max(np.abs(reference))))


def _int48_abs() -> bytes:
    """ABS on INT48, which TOSA has but the converter's SPIR-V lowering rejects."""
    s = ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)
    s.addInputTensor(ts.TosaSerializerTensor("x", [1, 4], ts.DType.INT48))
    block = s.currRegion.currBasicBlock
    block.addTensor("y", [1, 4], ts.DType.INT48)
    attr = ts.TosaSerializerAttribute()
    attr.AbsAttribute()
    s.addOperator(ts.Op.ABS, ["x"], ["y"], attr)
    s.addOutputTensor(block.tensors["y"])
    return bytes(s.serialize())


def test_converter_rejection_names_the_operator_in_one_line():
    with pytest.raises(ConversionError) as caught:
        convert(_int48_abs(), "int48 abs")
    message = str(caught.value)
    assert caught.value.operator == "ABS"
    assert "\n" not in message
    assert message.startswith("int48 abs: model-converter failed at TOSA operator ABS: \"error: ")
    assert "spirv.Tosa.Abs" in message  # the converter's own words, quoted


def test_converter_rejects_a_file_that_is_not_tosa():
    with pytest.raises(ConversionError) as caught:
        convert(b"not a flatbuffer" * 8, "junk")
    assert caught.value.operator is None
    assert "\n" not in str(caught.value) and "junk: model-converter failed: \"error:" in str(caught.value)


def test_a_missing_wheel_is_named_with_its_install_line(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "scenario_runner" else real(name, *a))
    vgf_tools.cache_clear()
    try:
        with pytest.raises(VgfToolMissing, match=r"pip install ai-ml-sdk-scenario-runner==0\.11\.0$"):
            vgf_tools()
    finally:
        vgf_tools.cache_clear()


def test_no_vulkan_device_is_reported_with_the_apt_line(monkeypatch, tmp_path, lowered_w, model):
    # an ICD manifest pointing nowhere: the loader finds no driver, as on a machine without one
    missing = tmp_path / "no_icd.json"
    monkeypatch.setattr(vgf_run, "lavapipe_icd", lambda: missing)
    with pytest.raises(NoVulkanDevice, match=r"apt-get install -y mesa-vulkan-drivers libvulkan1$"):
        run_vgf(lowered_w.files["model.vgf"], _held_out(model[1], 404), "W")


def test_missing_vulkan_loader_is_named(monkeypatch):
    monkeypatch.setattr(vgf_tools_module.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(VgfToolMissing, match=r"apt-get install -y mesa-vulkan-drivers libvulkan1$"):
        vgf_tools_module.lavapipe_icd()


def test_inputs_must_match_the_vgf_tensors(lowered_w, model):
    (x,) = _held_out(model[1], 505)
    with pytest.raises(ValueError, match="float64 given"):
        run_vgf(lowered_w.files["model.vgf"], [x.astype(np.float64)])
    with pytest.raises(ValueError, match="takes 1 input"):
        run_vgf(lowered_w.files["model.vgf"], [x, x])


def test_a_delegate_the_converter_rejects_fails_lowering_in_one_line(model, monkeypatch):
    from codec_tosa.targets.tosa import partitioner

    _, _, ep, calib = model
    # our TOSA step hands VgfBackend a graph the converter rejects, as a policy could
    monkeypatch.setattr(partitioner, "_lower_planned_tosa", lambda program, spec: _int48_abs())
    with pytest.raises(ConversionError) as caught:
        lower_program(ep, CodecSpec(policy="W", target="vgf"), calib)
    assert caught.value.operator == "ABS" and "\n" not in str(caught.value)
    assert str(caught.value).startswith("VgfBackend delegate: model-converter failed at TOSA operator ABS")


class _EmbeddingOnTheCpu(torch.nn.Module):
    """A VGF delegate reading what the CPU computes from the input (an int64 lookup)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embedding, self.linear = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(self.embedding(tokens)), dim=-1)


def test_a_vgf_fed_by_the_cpu_is_run_on_the_inputs_its_call_recorded(tmp_path) -> None:
    """Issue 51 (F6): the VGF reads the CPU's embedding lookup; validate runs the program
    with the VGF's TOSA in its place, records the call's inputs, runs the VGF on them
    and holds it to the reference model, and the output is compared: PASS, not INCOMPLETE."""
    from codec_tosa.tools.compiler import compile_module
    from codec_tosa.validation.validate import Verdict, validate

    tokens = torch.tensor([[1, 5, 9, 2, 14, 7]])
    result = compile_module("embedding_on_cpu", (_EmbeddingOnTheCpu(), (tokens,)), CodecSpec("W", target="vgf"),
                            tmp_path / "vgf", progress=False, samples=2)
    v = validate(result.pte)
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())
    assert any("on the inputs its call recorded" in n for n in v.notes)
    (check,) = v.delegates
    assert check.reason is None and check.calls == 3 and all(m is not None for m in check.max_abs)
