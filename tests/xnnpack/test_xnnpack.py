"""CodecQuantizer for XNNPACK (docs/DESIGN.md, "XNNPACK"): XNNPACK's documented PT2E
flow with `CodecQuantizer(CodecSpec(policy="I", target="xnnpack"))` in place of
`XNNPACKQuantizer`, lowered by the stock `XnnpackPartitioner` and run in
ExecuTorch's runtime; and the table's XNNPACK kernels as data."""

from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from codec_tosa import CodecQuantizer, CodecSpec, CommutationTable
from codec_tosa.commutation.table import XNNPACK, Kernel, Row
from codec_tosa.validation.metrics import sqnr_db

CAL_SEED, HELD_OUT_SEED = 0, 1234


class MobileUnit(nn.Module):
    """What XNNPACK's rules and the plan disagree on, in one small network: a relu6
    after a convolution (stock XNNPACK leaves it a separate Clamp), a channel split
    (XNNPACK has no split kernel) into a ShuffleNet-style unit and its concatenation,
    a subtraction (stock leaves it FP32), a global mean that drops H and W (XNNPACK
    takes keepdim only)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.pw = nn.Conv2d(4, 4, 1)
        self.mix = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardtanh(self.bn(self.stem(x)), 0.0, 6.0)
        a, b = y.chunk(2, dim=1)
        b = torch.relu(self.pw(torch.relu(self.dw(b))))
        y = torch.cat([a, b], dim=1)
        y = self.mix(y) - y
        return self.fc(y.mean([2, 3]))


def _model() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    m = MobileUnit().eval()
    with torch.no_grad():  # a batch norm that does something
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m, (torch.randn(1, 3, 12, 12),)


def _inputs(n: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 3, 12, 12, generator=g),) for _ in range(n)]


def _quantize(model: nn.Module, x: tuple[torch.Tensor, ...], quantizer: Any) -> Any:
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    prepared = prepare_pt2e(torch.export.export(model, x).module(check_guards=False), quantizer)
    with torch.no_grad():
        for inputs in _inputs(16, CAL_SEED):
            prepared(*inputs)
    return torch.export.export(convert_pt2e(prepared), x)


@lru_cache(maxsize=None)
def _lowered(flow: str) -> bytes:
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from executorch.exir import to_edge_transform_and_lower

    model, x = _model()
    quantizer = (CodecQuantizer(CodecSpec(policy="I", target="xnnpack")) if flow == "codec"
                 else XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True)))
    ep = _quantize(model, x, quantizer)
    return bytes(to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer)


def _plan(pte: bytes) -> tuple[Counter[str], Counter[str]]:
    """(delegate calls by backend, CPU kernel calls by operator) of the forward plan."""
    from codec_tosa.runtime.pte import call_counts

    return call_counts(pte)


def _sqnr(pte: bytes) -> float:
    """The worst held-out input's SQNR of the runtime's output against FP32 eager."""
    from executorch.extension.pybindings import portable_lib

    model, _ = _model()
    module = portable_lib._load_for_executorch_from_buffer(pte)
    worst = math.inf
    for x in _inputs(8, HELD_OUT_SEED):
        with torch.no_grad():
            ref = model(*x).double()
        out = module.forward(list(x))[0].double()
        worst = min(worst, 10 * math.log10(float((ref ** 2).sum()) / float(((ref - out) ** 2).sum())))
    return worst


def test_codec_quantizer_program_is_one_xnnpack_delegate_with_nothing_on_the_cpu() -> None:
    delegates, cpu = _plan(_lowered("codec"))
    assert delegates == Counter({"XnnpackBackend": 1})
    assert cpu == Counter()  # not even the input's quantize: XNNPACK converts inside the delegate
    stock_delegates, stock_cpu = _plan(_lowered("stock"))
    assert sum(cpu.values()) <= sum(stock_cpu.values())
    # stock leaves the split on the CPU, between delegates
    assert sum(stock_delegates.values()) > 1 and any("split" in op for op in stock_cpu)


def test_runs_in_executorch_and_is_as_accurate_as_stock() -> None:
    ours, stock = _sqnr(_lowered("codec")), _sqnr(_lowered("stock"))
    assert ours >= stock - 0.5, (ours, stock)
    assert ours > 25.0


def test_annotation_follows_the_tables_xnnpack_kernels(tmp_path: Path) -> None:
    """A user table that takes XNNPACK's kernel away from sub leaves sub's ports plain;
    the default table quantizes it (stock XNNPACK leaves sub FP32, XNNPACK runs it INT8)."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e
    from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

    data = CommutationTable.default().to_json()
    for row in data["rows"]:
        if row["target"] == "aten.sub.Tensor":
            row["int8_kernels"] = {}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(data))
    with warnings.catch_warnings():  # the built-in addmm row's note, not this test's concern
        warnings.simplefilter("ignore")
        user_table = CommutationTable.from_json(path)
    model, x = _model()

    def sub_annotated(spec: CodecSpec) -> bool:
        prepared = prepare_pt2e(torch.export.export(model, x).module(check_guards=False), CodecQuantizer(spec))
        (sub,) = [n for n in prepared.graph.nodes if n.target == torch.ops.aten.sub.Tensor]
        annotation = sub.meta.get(Q_ANNOTATION_KEY)
        return annotation is not None and len(annotation.input_qspec_map) == 2

    assert sub_annotated(CodecSpec(policy="I", target="xnnpack"))
    assert not sub_annotated(CodecSpec(policy="I", target="xnnpack", table=user_table))


def test_xnnpack_kernels_are_rows_data() -> None:
    table = CommutationTable.default()
    takes = {t for t, r in table.rows.items() if r.kernel(XNNPACK) is not None}
    assert {"aten.conv2d.default", "aten.linear.default", "aten.add.Tensor", "aten.sub.Tensor",
            "aten.mul.Tensor", "aten.cat.default", "aten.mean.dim", "aten.slice.Tensor"} <= takes
    # XNNPACK runs these FP32 only, or not at all
    assert not takes & {"aten.sigmoid.default", "aten.avg_pool2d.default", "aten.bmm.default",
                        "aten.split_with_sizes.default", "aten.clone.default", "aten.gelu.default"}
    conv = table.rows["aten.conv2d.default"].kernel(XNNPACK)
    assert conv is not None and "aten.hardtanh.default" in conv.fuses
    add = table.rows["aten.add.Tensor"].kernel(XNNPACK)
    assert add is not None and add.fuses == ("aten.relu.default", "aten.relu_.default")
    mean = table.rows["aten.mean.dim"].kernel(XNNPACK)
    assert mean is not None
    assert mean.refusal({"dim": [2, 3], "keepdim": True, "dtype": None}.get) is None
    assert "keepdim" in (mean.refusal({"dim": [2, 3], "keepdim": False, "dtype": None}.get) or "")
    # the kernels survive JSON, and a row that states none has none
    row = table.rows["aten.mean.dim"]
    assert Row.from_json(json.loads(json.dumps(row.to_json()))) == row
    assert Row.from_json({**row.to_json(), "int8_kernels": {}}).kernel(XNNPACK) is None
    assert Row.from_json({"target": "aten.mean.dim"}, facts=row).kernel(XNNPACK) == mean


def test_a_kernel_naming_an_argument_the_operator_lacks_is_refused() -> None:
    bad = Row("aten.mul.Tensor", "I", ("self", "other", "out"), (),
              int8_kernels=(Kernel(XNNPACK, requires=(("alpha", (1,)),)),))
    with pytest.raises(ValueError, match="no argument 'alpha'"):
        CommutationTable.from_rows([bad])


def test_xnnpack_specs_are_policy_i_and_not_for_codec_tosa_partitioner() -> None:
    from codec_tosa import CodecTosaPartitioner

    with pytest.raises(ValueError, match="needs policy='I'"):
        CodecSpec(policy="W", target="xnnpack")
    with pytest.raises(ValueError, match="XnnpackPartitioner"):
        CodecTosaPartitioner(CodecSpec(policy="I", target="xnnpack"))


def test_split_and_mean_are_rewritten_into_what_xnnpack_runs_on_codes() -> None:
    from codec_tosa._passes.xnnpack_rewrites import chunks_to_slices, means_keep_dims

    model, x = _model()
    gm = torch.export.export(model, x).module(check_guards=False)
    with torch.no_grad():
        expected = gm(*x)
    assert chunks_to_slices(gm) == 1 and means_keep_dims(gm) == 1
    targets = Counter(n.target for n in gm.graph.nodes if n.op == "call_function")
    assert targets[torch.ops.aten.slice.Tensor] == 2 and targets[torch.ops.aten.chunk.default] == 0
    (mean,) = [n for n in gm.graph.nodes if n.target == torch.ops.aten.mean.dim]
    assert mean.args[1:] == ([2, 3], True)
    with torch.no_grad():
        assert torch.equal(gm(*x), expected)


class IntegerIndexPath(nn.Module):
    """A gather whose indices are computed from integer aranges with scalar add and mul,
    as HF's causal mask computes its indices (SmolLM2): the indices are int64 and
    stay int64 through the quantizer's transforms and annotation."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)[0]
        rows = (torch.arange(8) + 0).unsqueeze(-1)
        cols = (torch.arange(4) * 2 + 1).unsqueeze(0)
        return y[rows, cols] * 2.0


@pytest.mark.parametrize("target", ["xnnpack", "tosa"])
def test_an_integer_index_path_is_neither_observed_nor_turned_into_floats(target: str) -> None:
    """Calibration runs (XNNPACK's scalar-to-attribute transform made ``arange + 1`` an
    FP32 tensor and the gather failed on FP32 indices), no observer reads a non-float
    value, and the quantized module is eager to INT8 precision."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model, x = IntegerIndexPath().eval(), (torch.randn(1, 8, 16),)
    quantizer = CodecQuantizer(CodecSpec(policy="I", target=target))
    prepared = prepare_pt2e(torch.export.export(model, x).module(check_guards=False), quantizer)
    observed = [n.args[0] for n in prepared.graph.nodes if n.op == "call_module"]
    assert observed and all(a.meta["val"].is_floating_point() for a in observed)
    ints = [n for n in prepared.graph.nodes if n.op == "call_function"
            and n.target in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor)
            and not n.meta["val"].is_floating_point()]
    assert len(ints) == 3 and all(not isinstance(a, torch.fx.Node) for n in ints for a in n.args[1:])
    with torch.no_grad():
        prepared(*x)
        ref, out = model(*x), convert_pt2e(prepared)(*x)
    assert sqnr_db(ref.numpy(), out.numpy()) > 30.0


def test_cli_compiles_for_xnnpack_and_validate_holds_it_to_eager(tmp_path: Path, capsys: Any) -> None:
    """`codec-tosa compile --target xnnpack` writes an XnnpackBackend .pte; validate
    runs it in ExecuTorch and, XNNPACK's arithmetic not being the plan's, reports the
    SQNR against eager and the exact check INCOMPLETE (exit 3), never PASS."""
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.tools.cli import main
    from codec_tosa.validation.validate import Verdict, validate

    out = tmp_path / "out"
    assert main(["compile", f"{__file__}:_model", "--policy", "I", "--target", "xnnpack",
                 "--samples", "4", "-o", str(out)]) == 0
    info = inspect_pte((out / "model.pte").read_bytes())
    assert info.delegate_ids == ("XnnpackBackend",)
    v = validate(out / "model.pte")
    assert v.verdict is Verdict.INCOMPLETE, "\n".join(v.lines())
    assert all(o.sqnr_db is not None and o.sqnr_db >= 20.0 for o in v.outputs), "\n".join(v.lines())
    assert main(["validate", str(out / "model.pte")]) == 3
    assert "held to FP32 eager by SQNR only" in capsys.readouterr().out
