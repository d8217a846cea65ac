"""Nested inputs and outputs through the Python API (issue 27): the README's TOSA
recipes, run as written on the LSTM of Arm's model test, which takes
``(x, (h0, c0))`` and here returns ``{"logits", "state": (h, c)}``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

import program_shapes  # noqa: E402
from test_recipes import IO_KERNELS, RECIPES  # noqa: E402


def _runnable(pte: bytes) -> bytes:
    """Arm's TOSABackend payload is a TOSA flatbuffer: relabelled, our runtime runs it."""
    from codec_tosa.backend import BACKEND_ID
    from codec_tosa.runtime.pte import delegates, with_delegates_replaced

    return with_delegates_replaced(pte, {i: (BACKEND_ID, d.payload) for i, d in enumerate(delegates(pte))})


# INT8 codes through five LSTM steps, calibrated on four inputs (measured here:
# 19-26 dB per output); an output wired to the wrong tensor is near 0 dB
MIN_SQNR_DB = 15.0


@pytest.mark.parametrize("title", ["TOSA, mixed policy", "TOSA-1.0+INT, integer policy"])
def test_a_nested_model_through_the_readme_recipe(title: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from codec_tosa.runtime.executorch_runner import run_pte
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.tools.cli import main
    from codec_tosa.tools.metrics import sqnr_db

    model, example = program_shapes.nested()
    gen = torch.Generator().manual_seed(1)

    def state_of(scale: float) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        return (torch.randn(1, 5, 8, generator=gen),
                (scale * torch.randn(1, 1, 16, generator=gen), scale * torch.randn(1, 1, 16, generator=gen)))

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
    for got, want in zip(outs, (eager["logits"], *eager["state"])):
        assert got.shape == want.shape
        db = sqnr_db(want.numpy(), got.numpy())
        assert db > MIN_SQNR_DB, (title, db)
    assert not np.array_equal(outs[1].numpy(), outs[2].numpy())  # h and c, not one output twice
