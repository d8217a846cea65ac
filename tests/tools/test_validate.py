"""validate on held-out samples, its verdicts and exit statuses, the SQNR floor,
a bare .pte, a rebuilt model, a VGF .pte; compile's progress stages and the
first-use friction of issue 13 (docs/DESIGN.md, "Validation")."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from codec_tosa import progress
from codec_tosa.planning.calibration import CalibrationError, random_calibration
from codec_tosa.runtime.pte import inspect_pte
from codec_tosa.tools.cli import DEFAULT_SAMPLES as CLI_SAMPLES, main
from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.reference_io import InputSet, sqnr_warnings
from codec_tosa.validation.samples import DEFAULT_SAMPLES, held_out_inputs
from codec_tosa.validation.validate import EXIT_STATUS, SQNR_FLOOR_DB, Verdict, sqnr_db, validate
from codec_tosa.spec import CodecSpec
from model_files import SMALL_MODEL_FILE
import small_models

MODEL_FILE = SMALL_MODEL_FILE
SAMPLES = 4


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("validate")
    (d / "model.py").write_text(MODEL_FILE)
    for policy in "WZ":
        assert main(["compile", f"{d / 'model.py'}:build", "--policy", policy, "--samples", str(SAMPLES),
                     "-o", str(d / policy)]) == 0
    return {"dir": d, "model": d / "model.py", "W": d / "W" / "model.pte", "Z": d / "Z" / "model.pte"}


def _build() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    namespace: dict[str, object] = {}
    exec(MODEL_FILE, namespace)
    return namespace["build"]()  # type: ignore[operator, no-any-return]


def test_compile_stores_held_out_samples_with_their_outputs(compiled) -> None:
    io = np.load(compiled["dir"] / "W" / "reference_io.npz")
    model, example = _build()
    samples = io["sample_input_0"]
    assert samples.shape == (SAMPLES, *example[0].shape)
    # held out: neither the example nor a calibration input
    calibration = [example] + random_calibration(example, 3)
    for s in samples:
        assert all(not np.array_equal(s, c[0].numpy()) for c in calibration)
    with torch.no_grad():
        eager = [model(torch.from_numpy(s)).numpy() for s in samples]
    np.testing.assert_array_equal(io["sample_eager_0"], np.stack(eager))
    assert io["sample_simulated_0"].shape == io["sample_eager_0"].shape


def test_validate_checks_every_sample_and_passes_within_one_step(compiled, capsys) -> None:
    v = validate(compiled["W"])
    assert v.cases == 1 + SAMPLES and v.verdict is Verdict.PASS, "\n".join(v.lines())
    (o,) = v.outputs
    assert o.ref_vs_runtime_max_abs == 0.0 and o.steps is not None and o.steps <= 1.0
    assert validate(compiled["W"], samples=2).cases == 3
    assert main(["validate", str(compiled["W"]), "--samples", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "PASS"


def test_without_fp32_fed_encodes_nothing_is_ambiguous_and_agreement_is_exact(compiled, capsys) -> None:
    """conv -> relu -> conv: the ReLU is computed alike by the artefact, so no
    code may round the other way, no allowance is stored, and the artefact
    equals the simulation bit for bit."""
    io = np.load(compiled["dir"] / "W" / "reference_io.npz")
    assert io["ambiguous_codes"].tolist() == [0] * (1 + SAMPLES) and "sample_allowance_0" not in io
    v = validate(compiled["W"])
    assert v.ambiguous_codes == 0 and v.outputs[0].steps == 0.0 and v.outputs[0].beyond_allowance is None
    assert "ambiguous codes: 0 " in "\n".join(v.lines())


def test_a_sample_off_by_three_steps_fails_and_is_named(compiled, tmp_path) -> None:
    io = dict(np.load(compiled["dir"] / "W" / "reference_io.npz"))
    step = float(io["step_0"])
    bad = io["sample_simulated_0"].copy()
    bad[2] += 3 * step
    shutil.copy(compiled["W"], tmp_path / "model.pte")
    np.savez(tmp_path / "reference_io.npz", **{**io, "sample_simulated_0": bad})
    v = validate(tmp_path / "model.pte")
    assert v.verdict is Verdict.FAIL and v.exit_status == 1
    assert v.outputs[0].worst_case == "sample 2" and v.outputs[0].steps >= 2.9
    assert validate(tmp_path / "model.pte", samples=2).verdict is Verdict.PASS  # sample 2 not checked


def test_a_bare_pte_is_incomplete(compiled, tmp_path, capsys) -> None:
    shutil.copy(compiled["W"], tmp_path / "model.pte")
    v = validate(tmp_path / "model.pte", samples=3)
    assert v.verdict is Verdict.INCOMPLETE and v.cases == 3, "\n".join(v.lines())
    assert v.reference_model_ran and v.delegates[0].max_abs == [0.0]
    assert main(["validate", str(tmp_path / "model.pte"), "--samples", "2"]) == EXIT_STATUS[Verdict.INCOMPLETE] == 3
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "INCOMPLETE" and any("not compared" in line for line in out)


def test_pte_info_has_the_program_input_specs(compiled) -> None:
    _, example = _build()
    (spec,) = inspect_pte(compiled["W"].read_bytes()).input_specs
    assert spec is not None and spec.shape == tuple(example[0].shape) and spec.dtype == "float32"


def test_a_rebuilt_model_is_compared_with_eager(compiled, capsys) -> None:
    # Z: held to 1e-4 of eager, so complete
    assert main(["validate", str(compiled["Z"]), "--model", f"{compiled['model']}:build", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "compared against FP32 eager" in out and "SQNR vs FP32 eager" in out
    # W: the simulation cannot be rebuilt, so the outputs were not held to the plan's criterion
    assert main(["validate", str(compiled["W"]), "--model", f"{compiled['model']}:build", "--samples", "2"]) == 3
    out = capsys.readouterr().out
    assert "SQNR vs FP32 eager" in out and "cannot be rebuilt" in out


def test_sqnr_below_the_floor_warns_in_validate_and_compile(compiled, tmp_path) -> None:
    io = dict(np.load(compiled["dir"] / "W" / "reference_io.npz"))
    rng = np.random.default_rng(1)
    # an FP32 reference the output has nothing to do with: SQNR about 0 dB
    noise = {k: rng.standard_normal(io[k].shape).astype(np.float32) for k in ("eager_0", "sample_eager_0")}
    shutil.copy(compiled["W"], tmp_path / "model.pte")
    np.savez(tmp_path / "reference_io.npz", **{**io, **noise})
    v = validate(tmp_path / "model.pte")
    assert v.outputs[0].sqnr_db < SQNR_FLOOR_DB
    assert any("output 0" in w and "floor" in w for w in v.warnings)
    assert any(line.startswith("  warning: output 0") for line in v.lines())
    assert not validate(compiled["W"]).warnings
    x = torch.randn(1, 100)
    assert sqnr_db(x.numpy(), np.zeros_like(x.numpy())) == pytest.approx(0.0)
    (w,) = sqnr_warnings([InputSet("example", [], [x.numpy()], [np.zeros_like(x.numpy())])])
    assert "output 0" in w and "0.0 dB" in w
    assert sqnr_warnings([InputSet("example", [], [x.numpy()], [x.numpy() * 1.001])]) == []


def test_validate_help_documents_the_exit_statuses(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    assert "0 PASS, 1 FAIL, 3 INCOMPLETE" in capsys.readouterr().out
    assert CLI_SAMPLES == DEFAULT_SAMPLES


def test_held_out_inputs_are_seeded_and_distinct() -> None:
    example = (torch.randn(1, 3, 4, 4), torch.arange(3))
    a, b = held_out_inputs(example, 2), held_out_inputs(example, 2)
    assert all(torch.equal(x, y) for ca, cb in zip(a, b) for x, y in zip(ca, cb))
    assert not torch.equal(a[0][0], a[1][0]) and torch.equal(a[0][1], example[1])


def test_lowering_reports_its_stages() -> None:
    model, example = _build()
    stages: list[str] = []
    lower_program(torch.export.export(model, example), CodecSpec("W"), [example], on_stage=stages.append)
    assert stages == [progress.PLACEMENT, "TOSA lowering: delegate 1", progress.SERIALISATION]


def test_calibration_with_bare_tensors_says_to_use_tuples() -> None:
    model, example = _build()
    with pytest.raises(CalibrationError, match="each entry must be a tuple of tensors"):
        lower_program(torch.export.export(model, example), CodecSpec("W"), [example[0], example[0]])


def test_import_codec_tosa_changes_no_other_package_and_the_repair_is_explicit() -> None:
    """`import codec_tosa` defines no torchvision operator and sets no environment
    variable; where torchvision is a CUDA build beside CPU torch, the model-loading
    tools' `repair_torchvision` (which the CLI's loaders and the tests call) makes it
    importable."""
    code = "\n".join([
        "import os, sys, torch",
        "before = dict(os.environ)",
        "import codec_tosa",
        "assert dict(os.environ) == before and 'torchvision' not in sys.modules",
        "try:",
        "    torch._C._dispatch_find_schema_or_throw('torchvision::nms', '')",
        "    raise SystemExit('import codec_tosa defined torchvision::nms')",
        "except RuntimeError:",
        "    pass",
        "from codec_tosa.tools.model_libs import repair_torchvision",
        "repair_torchvision()",
        "import torchvision",
        "torchvision.models.resnet18()",
        "print('ok')"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_a_vgf_pte_is_validated_on_the_emulation_layer(compiled, capsys) -> None:
    out = compiled["dir"] / "vgf"
    assert main(["compile", f"{compiled['model']}:build", "--policy", "W", "--target", "vgf",
                 "--samples", "1", "-o", str(out)]) == 0
    v = validate(out / "model.pte")
    assert v.verdict is Verdict.PASS and v.runtime.startswith("VGF"), "\n".join(v.lines())
    assert v.delegates[0].backend_id == "VgfBackend" and v.delegates[0].max_abs == [0.0]
    assert any("no VgfBackend" in n for n in v.notes)
    capsys.readouterr()
    assert main(["report", str(out / "model.pte")]) == 0
    assert "converted from model.tosa" in capsys.readouterr().out
    (out / "model.tosa").unlink()  # without the TOSA, the VGF is not compared with the reference model
    assert validate(out / "model.pte").verdict is Verdict.INCOMPLETE


def test_an_integer_vgf_is_arms_vgf_flow_and_validates(compiled) -> None:
    """--policy I --target vgf: CodecQuantizer, then Arm's own VgfPartitioner (issue 50)."""
    out = compiled["dir"] / "vgf_i"
    assert main(["compile", f"{compiled['model']}:build", "--policy", "I", "--target", "vgf",
                 "--samples", "1", "-o", str(out)]) == 0
    assert (out / "model.vgf").is_file() and (out / "model.tosa").is_file()
    v = validate(out / "model.pte")
    assert v.verdict is Verdict.PASS and v.delegates[0].backend_id == "VgfBackend", "\n".join(v.lines())
    assert v.delegates[0].max_abs == [0.0]


def test_a_cpu_fed_delegate_is_compared_through_the_recorded_calls(tmp_path) -> None:
    """The runtime records each delegate call's real inputs, so the delegate after
    the CPU's topk runs on the reference model too, and the verdict is PASS."""
    builder = f"{Path(small_models.__file__)}:conv_topk_conv"
    assert main(["compile", builder, "--policy", "W", "--samples", "2",
                 "-o", str(tmp_path / "out")]) == 0
    v = validate(tmp_path / "out" / "model.pte")
    assert len(v.delegates) == 2 and all(d.reason is None for d in v.delegates), "\n".join(v.lines())
    assert all(d.max_abs and all(m == 0.0 for m in d.max_abs) for d in v.delegates), "\n".join(v.lines())
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())


def test_an_infinity_the_approximation_misses_is_named_not_a_domain_error() -> None:
    # logit(0) = -inf: an INT8 output saturates; the SQNR is -inf and the warning says why
    eager = np.array([-np.inf, 0.5, 1.0])
    saturated = np.array([-2.0, 0.5, 1.0])
    assert sqnr_db(eager, saturated) == -np.inf
    assert sqnr_db(eager, eager.copy()) == np.inf  # inf agrees with itself
    (w,) = sqnr_warnings([InputSet("example", [], [eager], [saturated])])
    assert "infinities or NaNs" in w and "cannot hold them" in w


def test_the_reference_stage_keeps_to_its_time_budget(tmp_path, monkeypatch) -> None:
    """compile without --samples stops drawing held-out sets at its budget (here none:
    the minimum), keeps the ones it took exactly as an unbudgeted compile does, and
    report.json and validate say how many of how many."""
    from codec_tosa.tools.compiler import compile_module
    from codec_tosa.validation.samples import MIN_SAMPLES

    monkeypatch.setattr("codec_tosa.tools.compiler.reference_budget", lambda other_s: 0.0)
    budgeted = compile_module("small", _build(), CodecSpec("W"), tmp_path / "budget", progress=False)
    assert budgeted.report["held_out"] == {"asked": DEFAULT_SAMPLES, "stored": MIN_SAMPLES, "budget_s": 0.0}
    full = compile_module("small", _build(), CodecSpec("W"), tmp_path / "all", progress=False,
                          samples=DEFAULT_SAMPLES)
    assert full.report["held_out"] == {"asked": DEFAULT_SAMPLES, "stored": DEFAULT_SAMPLES}
    a, b = np.load(tmp_path / "budget" / "reference_io.npz"), np.load(tmp_path / "all" / "reference_io.npz")
    for key in ("sample_input_0", "sample_eager_0", "sample_simulated_0", "sample_planned_0"):
        np.testing.assert_array_equal(a[key], b[key][:MIN_SAMPLES])
    v = validate(tmp_path / "budget" / "model.pte")
    assert v.cases == 1 + MIN_SAMPLES and v.verdict is Verdict.PASS
    assert any(f"compile stored {MIN_SAMPLES} of {DEFAULT_SAMPLES} held-out samples" in n for n in v.notes)
    assert not any("held-out samples, as many as" in n for n in validate(tmp_path / "all" / "model.pte").notes)


def test_a_vgf_program_output_is_judged_against_the_simulation_not_the_reference_model() -> None:
    """A VGF's output that is a program output may differ from the reference model by a
    code its GPU FP32 rounds the other way: the output check (with the ambiguous codes'
    allowance) judges it; an output that feeds the CPU stays held to the reference model."""
    from codec_tosa.validation.validate import DelegateCheck

    deferred = DelegateCheck(0, "VgfBackend", [0.0149], calls=2, fp32_rtol=1e-4, deferred=(0,))
    assert not deferred.failed and "held to the simulation below instead" in deferred.line("VGF")
    feeding_the_cpu = DelegateCheck(0, "VgfBackend", [0.0149, 0.0], calls=2, fp32_rtol=1e-4, deferred=(1,))
    assert feeding_the_cpu.failed and feeding_the_cpu.line("VGF").endswith("FAIL")
    assert DelegateCheck(0, "VgfBackend", [0.0], calls=1, deferred=(0,)).line("VGF").endswith(": ok")
