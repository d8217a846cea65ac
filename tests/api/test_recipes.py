"""Every recipe of the README's "Python API" section, run as written (issue 21).

The code blocks are read from README.md itself, so a recipe cannot drift from
what is tested. Each one builds a .pte through the public API only (`codec_tosa`,
executorch, torchao), on a model this project did not tune; the test checks the
delegate's backend id, that no compute operator is left on the CPU, and that
`codec-tosa validate` gives the saved program a PASS.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[2] / "README.md"
# the only CPU operators an integer recipe may leave: the input encode and output decode
IO_KERNELS = {"quantized_decomposed::quantize_per_tensor", "quantized_decomposed::dequantize_per_tensor"}


def _recipes() -> dict[str, str]:
    """The section's python code blocks, by the bold title of the paragraph before each."""
    text = README.read_text()
    section = text[text.index("## Python API"):]
    section = section[:section.index("\n## ", 4)]
    found = {}
    # a bold title, then (before any other bold text or code block) the recipe's python block
    for m in re.finditer(r"\*\*([^*]+)\*\*(?:(?!```|\*\*).)*?```python\n(.*?)```", section, re.S):
        found[m.group(1)] = m.group(2)
    return found


RECIPES = _recipes()
EXPECTED = {  # recipe title -> the backend id of its one delegate
    "TOSA, mixed policy": "CodecTosaBackend",
    "External weights": "CodecTosaBackend",
    "VGF (ML SDK for Vulkan), mixed policy": "VgfBackend",
    "TOSA-1.0+INT, integer policy": "TOSABackend",
    "Ethos-U": "EthosUBackend",
    "Ethos-U, INT8 and INT16 per domain": "EthosUBackend",
    "XNNPACK": "XnnpackBackend",
}
# XNNPACK's arithmetic is not the plan's (docs/DESIGN.md, "XNNPACK"): its program is
# checked against eager, in ExecuTorch's runtime, not by validate
XNNPACK_MIN_SQNR_DB = 20.0


def test_the_readme_has_one_recipe_per_target() -> None:
    assert set(RECIPES) == set(EXPECTED)


class _Residual(torch.nn.Module):
    """conv + BN + relu6, a depthwise conv, a residual add, max-pool, global pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                        torch.nn.ReLU6())
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.head = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = torch.nn.functional.max_pool2d(y + self.dw(y), 2)
        return self.head(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))


@pytest.mark.parametrize("title", sorted(EXPECTED))
def test_recipe(title: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.tools.cli import main

    torch.manual_seed(0)
    model = _Residual()
    with torch.no_grad():  # a batch norm with statistics of its own
        model.stem[1].running_mean.uniform_(-0.5, 0.5)
        model.stem[1].running_var.uniform_(0.5, 2.0)
    gen = torch.Generator().manual_seed(1)
    example = (torch.randn(1, 3, 16, 16, generator=gen),)
    calibration = [(torch.randn(1, 3, 16, 16, generator=gen),) for _ in range(4)]
    monkeypatch.chdir(tmp_path)
    search_data = [(torch.randn(1, 3, 16, 16, generator=gen),) for _ in range(4)]
    namespace = {"model": model, "example": example, "calibration": calibration, "search_data": search_data}
    exec(RECIPES[title], namespace)

    if EXPECTED[title] == "XnnpackBackend":
        from codec_tosa.runtime.executorch_runner import run_pte
        from codec_tosa.validation.metrics import sqnr_db

        data = namespace["program"].buffer
        info = inspect_pte(data)
        assert info.delegate_ids == (EXPECTED[title],)
        assert set(info.operators) <= IO_KERNELS, info.operators
        held_out = (torch.randn(1, 3, 16, 16, generator=gen),)
        (out,) = run_pte(data, list(held_out))
        assert sqnr_db(model(*held_out).detach().numpy(), out.numpy()) >= XNNPACK_MIN_SQNR_DB
        return
    pte = tmp_path / "out" / "model.pte"
    assert (tmp_path / "out" / "model.ptd").is_file() == ("External" in title)
    info = inspect_pte(pte.read_bytes())
    assert info.delegate_ids == (EXPECTED[title],)
    assert set(info.operators) <= IO_KERNELS, info.operators
    assert main(["validate", str(pte), "--samples", "4"]) == 0
