"""`--calibration FILE` and `--inputs FILE`: input tuples from an .npz or a function (issue 50)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from codec_tosa.tools.input_files import InputFileError, load_input_tuples

EXAMPLE = (torch.zeros(1, 3, 4, 4), (torch.zeros(2, 5), torch.zeros(2, 5)))  # nested, as an LSTM takes it


def test_an_npz_of_stacked_inputs_gives_one_tuple_each(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"input_0": rng.standard_normal((3, 1, 3, 4, 4), dtype=np.float32),
              "input_1": rng.standard_normal((3, 2, 5), dtype=np.float32),
              "input_2": rng.standard_normal((3, 2, 5), dtype=np.float32)}
    np.savez(tmp_path / "cal.npz", **arrays)
    cases = load_input_tuples(str(tmp_path / "cal.npz"), EXAMPLE)
    assert len(cases) == 3
    x, (h, c) = cases[2]
    assert torch.equal(x, torch.from_numpy(arrays["input_0"][2])) and torch.equal(c, torch.from_numpy(arrays["input_2"][2]))
    # unstacked: one tuple
    np.savez(tmp_path / "one.npz", **{k: v[0] for k, v in arrays.items()})
    assert len(load_input_tuples(str(tmp_path / "one.npz"), EXAMPLE)) == 1


def test_a_function_gives_tuples_nested_as_the_model_takes_them(tmp_path: Path) -> None:
    (tmp_path / "data.py").write_text(
        "import torch\n\ndef cal():\n    for k in range(2):\n"
        "        yield torch.full((1, 3, 4, 4), float(k)), (torch.zeros(2, 5), torch.ones(2, 5))\n")
    cases = load_input_tuples(f"{tmp_path / 'data.py'}:cal", EXAMPLE, "--calibration")
    assert [float(x[0, 0, 0, 0]) for x, _ in cases] == [0.0, 1.0]


@pytest.mark.parametrize("arrays, message", [
    ({"input_0": np.zeros((1, 3, 4, 4), np.float32)}, "no array input_1"),
    ({"input_0": np.zeros((1, 3, 5, 4), np.float32), "input_1": np.zeros((2, 5), np.float32),
      "input_2": np.zeros((2, 5), np.float32)}, r"input_0 has shape \(1, 3, 5, 4\)"),
    ({"input_0": np.zeros((2, 1, 3, 4, 4), np.float32), "input_1": np.zeros((3, 2, 5), np.float32),
      "input_2": np.zeros((3, 2, 5), np.float32)}, "do not hold the same number"),
    ({"input_0": np.zeros((1, 3, 4, 4), np.float64), "input_1": np.zeros((2, 5), np.float32),
      "input_2": np.zeros((2, 5), np.float32)}, "input 0 is .* torch.float64; the model takes"),
])
def test_a_file_that_does_not_fit_the_model_is_one_line(tmp_path: Path, arrays: dict, message: str) -> None:
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(InputFileError, match=message) as caught:
        load_input_tuples(str(tmp_path / "bad.npz"), EXAMPLE, "--calibration")
    assert "\n" not in str(caught.value) and "bad.npz" in str(caught.value)


def test_neither_npz_nor_function_is_refused() -> None:
    with pytest.raises(InputFileError, match="expected an .npz"):
        load_input_tuples("cal.npy", EXAMPLE)
