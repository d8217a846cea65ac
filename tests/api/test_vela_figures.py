"""Vela's figures wherever a .pte holds an Ethos-U delegate (issue 50): `codec_tosa.save`
writes them, `codec-tosa report` prints them for ours and for a stock Arm .pte, and they
equal those of `codec-tosa compile` on the same model and calibration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import small_models
from codec_tosa.tools.cli import main

TARGET = "ethos-u85-256"
FIGURES = ("cycles_total", "npu_ops", "cpu_ops", "sram_bytes", "off_chip_bytes", "encoded_weight_bytes")
MODEL_FILE = "import small_models\n\ndef build():\n    return small_models.mobile_block()\n"


def _pipeline(quantizer_line: str, dump: Path | None = None) -> bytes:
    """Arm's Ethos-U flow as its tutorial writes it, `quantizer_line` building the quantizer."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
    from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from codec_tosa import CodecQuantizer

    model, example = small_models.mobile_block()
    compile_spec = EthosUCompileSpec(TARGET)
    if dump is not None:
        compile_spec.dump_intermediate_artifacts_to(str(dump))
    quantizer = eval(quantizer_line, {"EthosUQuantizer": EthosUQuantizer, "CodecQuantizer": CodecQuantizer,
                                      "compile_spec": compile_spec})
    quantizer.set_global(get_symmetric_quantization_config())
    # stock Arm refuses the guard of a plain .module() on this model's average pools
    prepared = prepare_pt2e(torch.export.export(model, example).module(check_guards=False), quantizer)
    for sample in small_models.calibration(example, 4):
        prepared(*sample)
    quantized = torch.export.export(convert_pt2e(prepared), example)
    program = to_edge_transform_and_lower(quantized, partitioner=[EthosUPartitioner(compile_spec)]).to_executorch()
    _pipeline.last = (program, quantizer, model)  # type: ignore[attr-defined]
    return bytes(program.buffer)


def _report_figures(pte: Path, capsys: pytest.CaptureFixture[str]) -> list[int]:
    """The Ethos-U delegate row `codec-tosa report` prints."""
    capsys.readouterr()
    assert main(["report", str(pte)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("Ethos-U delegate"))
    return [int(v) for v in lines[header + 2].split()[1:]]


def test_save_report_and_compile_give_one_set_of_vela_figures(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import codec_tosa

    _pipeline("CodecQuantizer(compile_spec)")
    program, quantizer, model = _pipeline.last  # type: ignore[attr-defined]
    pte = codec_tosa.save(program, quantizer, tmp_path / "saved", model=model)
    saved = json.loads((tmp_path / "saved" / "report.json").read_text())["vela"]
    (entry,) = saved["per_delegate"]
    assert entry["cycles_total"] > 0 and entry["npu_ops"] > 0 and entry["cpu_ops"] == 0
    assert f"--accelerator-config={TARGET}" in entry["compile_flags"]
    assert _report_figures(pte, capsys) == [entry[k] for k in FIGURES]

    # the CLI on the same model and calibration inputs
    monkeypatch.chdir(tmp_path)
    Path("model.py").write_text(MODEL_FILE)
    _, example = small_models.mobile_block()
    np.savez("calibration.npz", input_0=np.stack([c[0].numpy() for c in small_models.calibration(example, 4)]))
    assert main(["compile", "model.py:build", "--policy", "I", "--target", TARGET, "--calibration",
                 "calibration.npz", "--samples", "0", "-o", "compiled"]) == 0
    compiled = json.loads(Path("compiled/report.json").read_text())["vela"]
    assert [compiled["per_delegate"][0][k] for k in FIGURES] == [entry[k] for k in FIGURES]

    # without report.json, report runs Vela again on model.tosa: the same figures
    Path("compiled/report.json").unlink()
    assert _report_figures(Path("compiled/model.pte"), capsys) == [entry[k] for k in FIGURES]


def test_report_gives_a_stock_pte_its_vela_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.targets.ethosu.vela_summary import read_vela_summary

    with arm_adapter.vela_runs_kept(str(tmp_path / "runs")) as runs:
        stock = _pipeline("EthosUQuantizer(compile_spec)", dump=tmp_path / "arm_dump")
    (run,) = runs
    during = read_vela_summary(run.directory)
    (tmp_path / "stock").mkdir()
    (tmp_path / "stock" / "model.pte").write_bytes(stock)  # as program.write_to_file writes it
    figures = _report_figures(tmp_path / "stock" / "model.pte", capsys)
    assert figures[0] == int(during["cycles_total"]) > 0
    assert figures[3] == int(float(during["sram_memory_used"]) * 1024)


def test_report_says_how_to_get_the_figures_without_the_tosa(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "model.pte").write_bytes(_pipeline("EthosUQuantizer(compile_spec)"))
    capsys.readouterr()
    assert main(["report", str(tmp_path / "model.pte")]) == 0
    assert "dump_intermediate_artifacts_to(DIR)" in capsys.readouterr().out
