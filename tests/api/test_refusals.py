"""No combination of policy and target gives a program without the delegate it asked
for: the partitioner serves what it is given or refuses in one line (issue 21)."""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

from codec_tosa import CodecSpec, CodecTosaPartitioner


class _ConvReluConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("target", ["tosa", "ethos-u55-128"])
def test_an_integer_spec_on_an_unquantized_program_names_the_quantizer_recipe(target: str) -> None:
    x = (torch.randn(1, 3, 8, 8),)
    ep = torch.export.export(_ConvReluConv().eval(), x)
    with pytest.raises(ValueError) as caught:
        to_edge_transform_and_lower(ep, partitioner=[CodecTosaPartitioner(CodecSpec(policy="I", target=target))])
    message = str(caught.value)
    assert "\n" not in message and "CodecQuantizer" in message and "not quantized" in message


def test_specs_no_partitioner_can_serve_are_refused_when_made() -> None:
    # an integer VGF is Arm's VgfPartitioner's (on a CodecQuantizer program), not ours
    with pytest.raises(ValueError, match="an integer VGF is Arm's: quantize with CodecQuantizer"):
        CodecTosaPartitioner(CodecSpec(policy="I", target="vgf"))
    with pytest.raises(ValueError, match="needs policy='I'"):
        CodecSpec(policy="W", target="ethos-u85-256")


def test_calibration_from_a_data_loader_generator() -> None:
    """`calibration=` is any iterable of input tuples: a generator over a DataLoader
    that yields (images, labels) batches, as a user calibrates on their own data."""
    from torch.utils.data import DataLoader, TensorDataset

    from codec_tosa.runtime.pte import inspect_pte

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(8, 3, 8, 8), torch.zeros(8, dtype=torch.long))
    loader = DataLoader(data, batch_size=1)
    x = (torch.randn(1, 3, 8, 8),)
    part = CodecTosaPartitioner(CodecSpec(policy="W"), calibration=((images,) for images, _ in loader))
    pte = to_edge_transform_and_lower(torch.export.export(_ConvReluConv().eval(), x),
                                      partitioner=[part]).to_executorch().buffer
    assert inspect_pte(pte).delegate_ids == ("CodecTosaBackend",)
    assert part.planned is not None and part.planned.placement.plan.domains
