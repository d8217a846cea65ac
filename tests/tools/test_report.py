"""`report` describes any TOSA delegate: stock Arm ones, several per program."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.fx.passes.operator_support import OperatorSupportBase

from codec_tosa.arm.adapter import stock_partitioner, tosa_compile_spec
from codec_tosa.tools.cli import main
from codec_tosa.tools.report import program_delegates as read_program_delegates
from codec_tosa.serialization.tosa_stats import tosa_stats


class TwoConvs(nn.Module):
    """conv -> relu -> subtract -> conv; the subtraction is kept on the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) - 1.0)


class NoSub(OperatorSupportBase):
    """Keeps subtractions out of the delegate, splitting it in two."""

    def is_node_supported(self, submodules: object, node: torch.fx.Node) -> bool:
        return "sub" not in str(node.target)


@pytest.fixture(scope="module")
def stock_pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A .pte with two stock TOSABackend delegates (TOSAPartitioner)."""
    from executorch.exir import to_edge_transform_and_lower

    torch.manual_seed(0)
    model, inputs = TwoConvs().eval(), (torch.randn(1, 3, 8, 8),)
    part = stock_partitioner(tosa_compile_spec("TOSA-1.0+FP"), additional_checks=[NoSub()])
    pte = to_edge_transform_and_lower(torch.export.export(model, inputs),
                                      partitioner=[part]).to_executorch().buffer
    path = tmp_path_factory.mktemp("stock") / "two.pte"
    path.write_bytes(pte)
    return path


def _report(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, list[str]]:
    rc = main(["report", str(path)])
    captured = capsys.readouterr()
    return rc, captured.out.splitlines() + [f"stderr: {line}" for line in captured.err.splitlines()
                                            if "error" in line]


def test_two_stock_delegates_are_read_one_by_one(stock_pte: Path) -> None:
    found = read_program_delegates(stock_pte.read_bytes())
    assert [(d.method, d.index, d.backend_id) for d in found.tosa] == [("forward", 0, "TOSABackend"),
                                                                        ("forward", 1, "TOSABackend")]
    assert found.other == []
    assert [d.provenance.get("tosa_spec") for d in found.tosa] == ["TOSA-1.0+FP"] * 2
    convs = [d.stats.operators_by_type.get("CONV2D") for d in found.tosa]
    assert convs == [1, 1]
    # the sum is field by field, per-operator dicts by key
    total = found.total()
    for name in ("operators", "const_bytes", "traffic_bytes", "fused_traffic_bytes", "fused_groups"):
        assert getattr(total, name) == sum(getattr(d.stats, name) for d in found.tosa)
    assert total.operators_by_type["CONV2D"] == 2
    # the first delegate's ReLU (a CLAMP) runs inside its convolution
    assert found.tosa[0].stats.fused_traffic_bytes < found.tosa[0].stats.traffic_bytes


def test_report_describes_each_stock_delegate_and_the_sum(stock_pte: Path, capsys) -> None:
    rc, lines = _report(capsys, stock_pte)
    assert rc == 0, lines
    assert lines[0] == f"{stock_pte}: {stock_pte.stat().st_size} bytes; 2 TOSA delegates"
    headers = [line for line in lines if line.startswith("delegate ")]
    assert [h.split(",")[0] for h in headers] == [
        "delegate 0 of method forward: TOSABackend (stock Arm TOSA)",
        "delegate 1 of method forward: TOSABackend (stock Arm TOSA)"]
    assert all(h.endswith("TOSA spec TOSA-1.0+FP") for h in headers)
    total = read_program_delegates(stock_pte.read_bytes()).total()
    assert "total over 2 TOSA delegates: " f"{total.operators} operators, {total.constant_bytes} constant bytes" in lines
    traffic = [line for line in lines if line.startswith("TOSA traffic")]
    assert len(traffic) == 3  # each delegate, then the sum
    assert traffic[-1].startswith(f"TOSA traffic (non-constant operators): {total.traffic_bytes / 2**20:.4g} "
                                  f"MiB unfused, {total.fused_traffic_bytes / 2**20:.4g} MiB fused")


def _renamed(pte: bytes, ids: list[str], payloads: list[bytes | None]) -> bytes:
    """The program with its delegates' backend ids (and optionally payloads) replaced."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte_file = deserialize_pte_binary(pte)
    program = pte_file.program
    for d, new_id, payload in zip(program.execution_plan[0].delegates, ids, payloads):
        d.id = new_id
        if payload is not None:
            program.backend_delegate_data[d.processed.index].data = payload
    return bytes(serialize_pte_binary(pte_file, extract_delegate_segments=True))


def test_any_tosa_payload_is_described_and_other_delegates_are_named(stock_pte: Path, tmp_path: Path,
                                                                     capsys) -> None:
    pte = _renamed(stock_pte.read_bytes(), ["VendorBackend", "NpuBackend"], [None, b"\x00" * 40])
    path = tmp_path / "mixed.pte"
    path.write_bytes(pte)
    found = read_program_delegates(pte)
    assert [d.backend_id for d in found.tosa] == ["VendorBackend"]
    assert [(d.backend_id, d.payload_bytes) for d in found.other] == [("NpuBackend", 40)]
    rc, lines = _report(capsys, path)
    assert rc == 0, lines
    assert "other delegates (not TOSA, not described): NpuBackend (method forward, 40 bytes)" in lines
    assert any(line.startswith("delegate 0 of method forward: VendorBackend (TOSA flatbuffer payload)")
               for line in lines)
    # no TOSA delegate at all is a one-line error naming the file
    pte = _renamed(stock_pte.read_bytes(), ["NpuBackend", "NpuBackend"], [b"\x00" * 40, b"\x00" * 40])
    path.write_bytes(pte)
    rc, lines = _report(capsys, path)
    assert rc == 2
    assert [line for line in lines if line.startswith("stderr:")] == [
        f"stderr: codec-tosa report: error: {path}: holds no TOSA delegate (delegates: "
        "['NpuBackend (method forward, 40 bytes)', 'NpuBackend (method forward, 40 bytes)'])"]


def test_report_json_records_the_delegate_figures(tmp_path: Path) -> None:
    """compile writes each delegate's unfused and fused traffic into report.json."""
    import json

    from codec_tosa.tools.compiler import compile_model
    from codec_tosa.spec import CodecSpec

    model = tmp_path / "model.py"
    model.write_text("import torch\n\n\ndef build():\n    torch.manual_seed(0)\n"
                     "    m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())\n"
                     "    return m.eval(), (torch.randn(1, 3, 6, 6),)\n")
    result = compile_model(f"{model}:build", CodecSpec(policy="W"), tmp_path / "out", progress=False)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())["tosa"]
    (d,) = read_program_delegates(result.pte.read_bytes()).tosa
    stats = tosa_stats(d.payload)
    assert rep["delegates"][0]["backend_id"] == "CodecTosaBackend"
    assert rep["delegates"][0]["traffic_bytes"] == stats.traffic_bytes == rep["total"]["traffic_bytes"]
    assert rep["delegates"][0]["fused_traffic_bytes"] == stats.fused_traffic_bytes
    assert 0 < stats.fused_traffic_bytes < stats.traffic_bytes
