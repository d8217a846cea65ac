"""Module selection with the stock quantizers' names and meaning, and a plain ``ep.module()``
(issue 50): `set_global`, `set_module_type`, `set_module_name` on `CodecQuantizer`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import small_models
from codec_tosa import CodecQuantizer, CodecSpec
from codec_tosa.runtime.pte import inspect_pte

README = Path(__file__).resolve().parents[2] / "README.md"
DQ = ("quantized_decomposed.dequantize_per_tensor", "quantized_decomposed.dequantize_per_channel")


def _partial_recipe() -> str:
    """The README's Linear-only lines (Arm's partial-quantization recipe), as written."""
    text = README.read_text()
    return re.search(r"Linear layers only:\n\n```\n(.*?)```", text, re.S).group(1)  # type: ignore[union-attr]


class ConvLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).mean((2, 3))
        return self.fc2(torch.relu(self.fc1(y)))


def _converted(model: torch.nn.Module, example: tuple, quantizer: object) -> torch.fx.GraphModule:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
    for case in small_models.calibration(example, 4):
        prepared(*case)
    annotated = {n.name for n in prepared.graph.nodes if _quantizes(n.meta.get("quantization_annotation"))}
    gm = convert_pt2e(prepared)
    gm.annotated = annotated  # type: ignore[attr-defined]
    return gm


def _quantizes(annotation: object) -> bool:
    return annotation is not None and (bool(annotation.input_qspec_map) or annotation.output_qspec is not None)


def _quantized_ops(gm: torch.fx.GraphModule) -> dict[str, bool]:
    """Each compute operator -> whether the quantizer annotated it (put it in the plan);
    a convolution's or linear's weight is then read through a dequantize too."""
    out = {}
    for n in gm.graph.nodes:
        target = str(n.target)
        if n.op != "call_function" or "quantized_decomposed" in target or "aten" not in target:
            continue
        out[n.name] = n.name in gm.annotated  # type: ignore[attr-defined]
        if n.name.startswith(("conv", "linear")):  # the plan encodes its weight
            assert out[n.name] == _weight_coded(n), n.name
    return out


def _weight_coded(node: torch.fx.Node) -> bool:
    return any(d in str(node.args[1].target) for d in DQ)


def _weights_coded(gm: torch.fx.GraphModule, kind: str) -> list[bool]:
    """Whether each convolution's (linear's) weight is read through a dequantize."""
    return [_weight_coded(n) for n in gm.graph.nodes if n.op == "call_function" and n.name.startswith(kind)]


def _by_kind(ops: dict[str, bool], kind: str) -> list[bool]:
    return [coded for name, coded in ops.items() if name.startswith(kind)]


def test_linear_only_keeps_convolutions_out_and_linears_in() -> None:
    from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model, example = ConvLinear().eval(), (torch.randn(1, 3, 16, 16),)
    ours, stock = CodecQuantizer(CodecSpec(policy="I")), TOSAQuantizer(TosaCompileSpec("TOSA-1.0+INT"))
    for quantizer in (ours, stock):
        exec(_partial_recipe(), {"quantizer": quantizer, "torch": torch,
                                 "get_symmetric_quantization_config": get_symmetric_quantization_config})
    gm = _converted(model, example, ours)
    ops = _quantized_ops(gm)
    assert _by_kind(ops, "conv2d") == [False]  # the convolution reads FP32
    assert _by_kind(ops, "linear") == [True, True]
    assert not any(coded for name, coded in ops.items() if name.startswith(("relu", "mean", "avg_pool")))
    # stock's partial recipe quantizes the same operators
    stock_gm = _converted(model, example, stock)
    assert _weights_coded(stock_gm, "conv2d") == [False] and _weights_coded(stock_gm, "linear") == [True, True]
    # lowered as Arm's LLM test lowers it: INT and FP in one delegate, nothing on the CPU
    program = to_edge_transform_and_lower(torch.export.export(gm, example), partitioner=[
        TOSAPartitioner(TosaCompileSpec("TOSA-1.0+INT+FP"))]).to_executorch()
    info = inspect_pte(program.buffer)
    assert info.delegate_ids == ("TOSABackend",) and not info.operators


def test_linear_only_on_a_transformer_block() -> None:
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config

    model, example = small_models.token_norms()
    quantizer = CodecQuantizer(CodecSpec(policy="I"))
    exec(_partial_recipe(), {"quantizer": quantizer, "torch": torch,
                             "get_symmetric_quantization_config": get_symmetric_quantization_config})
    ops = _quantized_ops(_converted(model, example, quantizer))
    linears = _by_kind(ops, "linear")
    assert len(linears) == 3 and all(linears)
    # softmax and layer norm (as Arm's transforms leave an unquantized one: whole) read FP32
    others = [name for name, coded in ops.items() if coded and not name.startswith("linear")]
    assert not others, others
    assert any(name.startswith(("softmax", "_softmax")) for name in ops)


def test_a_module_by_name_left_out_and_one_at_int16() -> None:
    from executorch.backends.arm.quantizer import get_symmetric_a16w8_quantization_config

    model, example = small_models.linear_head()
    quantizer = CodecQuantizer(CodecSpec(policy="I", target="ethos-u85-256"))
    quantizer.set_module_name("fc1", None)
    ops = _quantized_ops(_converted(model, example, quantizer))
    assert _by_kind(ops, "linear") == [False, True]  # fc1 out, fc2 in
    widths = CodecQuantizer(CodecSpec(policy="I", target="ethos-u85-256"))
    widths.set_module_name("fc2", get_symmetric_a16w8_quantization_config())  # a stock a16w8 config
    _converted(model, example, widths)
    bits = {p.bits for p in widths.precisions if "fc2" in p.why}
    assert bits == {16}
    assert any(p.bits == 8 for p in widths.precisions)


def test_a_module_may_choose_only_its_widths() -> None:
    quantizer = CodecQuantizer(CodecSpec(policy="I"))
    with pytest.raises(ValueError, match=r"set_module_type\(Linear\): the spec's observer='minmax' differs"):
        quantizer.set_module_type(torch.nn.Linear, CodecSpec(policy="I", observer="minmax"))
    with pytest.raises(TypeError, match="expected a CodecSpec, a stock QuantizationConfig or None"):
        quantizer.set_global("int8")


def test_a_plain_module_keeps_its_guard() -> None:
    """Arm's transforms refuse the `_guards_fn` call of a plain ``.module()`` on an average
    pool (stock's EthosUQuantizer fails there); ours sets it aside and puts it back."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.AvgPool2d(2)).eval()
    example = (torch.randn(1, 3, 16, 16),)
    prepared = prepare_pt2e(torch.export.export(model, example).module(), CodecQuantizer(CodecSpec(policy="I")))
    prepared(*example)
    with pytest.raises(AssertionError, match="Guard failed"):
        prepared(torch.randn(1, 3, 17, 16))
