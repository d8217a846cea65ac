"""Console noise (issue 13 item 7): other packages' known-harmless output is
filtered, ours and every error are not, and --verbose shows everything."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from codec_tosa.quiet import is_noise, quiet
from model_files import SMALL_MODEL_FILE

REPO = Path(__file__).resolve().parents[2]

MODEL_FILE = SMALL_MODEL_FILE

# one fragment of each kind of noise the CLI used to print
NOISE = ("Failed to load", "FutureWarning", "register_constant()", "midr file", "CPU info and manual query",
         "Different TOSA spec", "Casting buffer", "is backward compatible")

TOSA_VERSION_NOTE = (b"WARNING: Different TOSA spec in flatbuffer and serializer versions detected. "
                     b"Read TOSA spec in flatbuffer 1.0.0 is backward compatible with serializer version 1.1.0d\n")


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "codec_tosa.tools.cli", *argv], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)


def _noise(run: subprocess.CompletedProcess[str]) -> list[str]:
    lines = (run.stdout + run.stderr).replace("\r", "\n").splitlines()
    return [line for line in lines if any(n in line for n in NOISE)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("quiet") / "model.py"
    path.write_text(MODEL_FILE)
    return path


def test_compile_validate_report_print_no_third_party_noise(model: Path) -> None:
    out = model.parent / "out"
    compiled = _cli("compile", f"{model}:build", "--policy", "W", "-o", str(out))
    assert compiled.returncode == 0, compiled.stderr
    assert compiled.stdout.startswith(f"wrote {out / 'model.pte'}")
    assert _noise(compiled) == []
    validated = _cli("validate", str(out / "model.pte"))
    assert validated.returncode == 0, validated.stderr
    assert validated.stdout.splitlines()[-1] == "PASS"
    assert _noise(validated) == []
    reported = _cli("report", str(out / "model.pte"))
    assert reported.returncode == 0, reported.stderr
    assert "1 TOSA delegate" in reported.stdout and "MiB fused" in reported.stdout
    assert _noise(reported) == [] and reported.stderr == ""


@pytest.mark.slow  # one more CLI compile in a fresh interpreter; the default run checks the filter itself
def test_verbose_shows_the_noise(model: Path) -> None:
    out = model.parent / "verbose"
    compiled = _cli("--verbose", "compile", f"{model}:build", "--policy", "W", "-o", str(out))
    assert compiled.returncode == 0, compiled.stderr
    noise = "\n".join(_noise(compiled))
    assert "Failed to load" in noise and "FutureWarning" in noise
    validated = _cli("--verbose", "validate", str(out / "model.pte"))
    assert validated.returncode == 0, validated.stderr
    assert "Different TOSA spec" in "\n".join(_noise(validated))


def test_errors_still_print(model: Path) -> None:
    run = _cli("validate", str(model.parent / "missing.pte"))
    assert run.returncode == 2
    assert run.stderr.strip().endswith("cannot read (No such file or directory)")
    run = _cli("compile", f"{model}:no_such_function", "-o", str(model.parent / "never"))
    assert run.returncode != 0 and "no_such_function" in run.stderr
    assert _noise(run) == []


# ------------------------------------------------------------- one channel each


def test_native_lines_are_filtered_and_ours_pass(capfd: pytest.CaptureFixture[str]) -> None:
    with quiet():
        os.write(1, TOSA_VERSION_NOTE + b"our line\n")
        ctypes.CDLL(None).printf(b"[cpuinfo_utils.cpp:42] Failed to open midr file /sys/x\nnative line\n"
                                 b"[cpuinfo_utils.cpp:125] CPU info and manual query on # of cpus dont match.\n")
        os.write(2, b"an error of ours\n")
    captured = capfd.readouterr()
    assert captured.out == "our line\nnative line\n"
    assert captured.err == "an error of ours\n"
    with quiet(verbose=True):
        os.write(1, TOSA_VERSION_NOTE)
    assert capfd.readouterr().out == TOSA_VERSION_NOTE.decode()


def test_an_exception_leaves_the_console_restored(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with quiet():
            os.write(2, b"said before the error\n")
            raise RuntimeError("boom")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "said before the error\nafter\n"


def test_python_warnings_by_category_and_message() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet():
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
            warnings.warn("a warning of ours", UserWarning)
        with quiet(verbose=True):
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
    assert [(w.category, str(w.message)[:13]) for w in seen] == [
        (UserWarning, "a warning of "), (FutureWarning, "`isinstance(t")]


def test_log_records_by_logger_and_message(caplog: pytest.LogCaptureFixture) -> None:
    arm = logging.getLogger("executorch.backends.arm._passes.cast_int64_pass")
    with caplog.at_level(logging.WARNING):
        with quiet():
            arm.warning("Casting buffer b_ids from torch.int64 to torch.int32 defined in\n  File model.py")
            arm.warning("something else")
            logging.getLogger("torchao").warning("Failed to load /x/torchao/_C_mxfp8.so: nope")
        with quiet(verbose=True):
            arm.warning("Casting buffer b_ids from torch.int64 to torch.int32")
    assert [r.getMessage()[:14] for r in caplog.records] == ["something else", "Casting buffer"]
    assert not arm.filters  # removed on the way out


def test_only_known_lines_are_noise() -> None:
    assert is_noise(TOSA_VERSION_NOTE.decode().strip())
    assert not is_noise("ERROR: Read TOSA spec version in flatbuffer 2.0 is not compatible with serializer "
                        "version 1.1.0d")
    assert not is_noise("Failed to load model.pte")
