"""Nested inputs and outputs through the Python API (issue 27): the README's TOSA
recipes, run as written on a recurrent cell that takes ``(x, (h, c))`` and
returns ``{"logits", "state": (h, c)}``, the shape of program of Arm's LSTM
model test (the LSTM itself, nested, is tests/tools/test_program_shapes.py
through the CLI, and benchmarks/arm_models.py at W and I)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import program_shapes  # noqa: E402
from test_recipes import IO_KERNELS, RECIPES  # noqa: E402


def _runnable(pte: bytes) -> bytes:
    """Arm's TOSABackend payload is a TOSA flatbuffer: relabelled, our runtime runs it."""
    from codec_tosa.runtime import BACKEND_ID
    from codec_tosa.runtime.pte import delegates, with_delegates_replaced

    return with_delegates_replaced(pte, {i: (BACKEND_ID, d.payload) for i, d in enumerate(delegates(pte))})


# the project's warning floor (INT8 through two layers calibrated on four
# inputs measured 13.6 dB on the logits here); wiring is checked apart below
MIN_SQNR_DB = 10.0


@pytest.mark.parametrize("title", ["TOSA, mixed policy", "TOSA-1.0+INT, integer policy"])
def test_a_nested_model_through_the_readme_recipe(title: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from codec_tosa.runtime.executorch_runner import run_pte
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.tools.cli import main
    from codec_tosa.validation.metrics import sqnr_db

    model, example = program_shapes.nested_cell()
    gen = torch.Generator().manual_seed(1)

    def state_of(scale: float) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        return (torch.randn(1, 8, generator=gen),
                (scale * torch.randn(1, 16, generator=gen), scale * torch.randn(1, 16, generator=gen)))

    calibration = [state_of(0.5) for _ in range(4)]
    monkeypatch.chdir(tmp_path)
    namespace = {"model": model, "example": example, "calibration": calibration}
    exec(RECIPES[title], namespace)

    pte = tmp_path / "out" / "model.pte"
    info = inspect_pte(pte.read_bytes())
    assert len(info.input_specs) == 3 and len(info.outputs) == 3  # flattened as torch.export flattens
    assert len(info.delegate_ids) == 1 and set(info.operators) <= IO_KERNELS, info
    assert main(["validate", str(pte), "--samples", "4"]) == 0
    # and against eager on a held-out input, output by output in pytree order
    x, (h0, c0) = state_of(0.5)
    with torch.no_grad():
        eager = model(x, (h0, c0))
    outs = run_pte(_runnable(pte.read_bytes()), [x, h0, c0])
    wanted = (eager["logits"], *eager["state"])
    for got, want in zip(outs, wanted):
        assert got.shape == want.shape
        assert sqnr_db(want.numpy(), got.numpy()) > MIN_SQNR_DB, (title, sqnr_db(want.numpy(), got.numpy()))
    # h and c have one shape: each output is nearer its own eager tensor than the other's
    h, c = outs[1].numpy(), outs[2].numpy()
    assert sqnr_db(wanted[1].numpy(), h) > sqnr_db(wanted[2].numpy(), h) + 3.0
    assert sqnr_db(wanted[2].numpy(), c) > sqnr_db(wanted[1].numpy(), c) + 3.0
