"""`ZeroFullyMaskedRowsPass`: attention rows a constant mask masks fully give eager's zeros."""

from __future__ import annotations

import math

import pytest
import torch

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa._passes.fully_masked_rows import ZeroFullyMaskedRowsPass


def zero_fully_masked_rows(gm: torch.fx.GraphModule) -> int:
    """Run the pass; how many it rewrote (what `PassResult.modified` says too)."""
    pass_ = ZeroFullyMaskedRowsPass()
    assert pass_(gm).modified == (pass_.count > 0)
    return pass_.count


class Attention(torch.nn.Module):
    def __init__(self, mask: torch.Tensor | None) -> None:
        super().__init__()
        self.mask = mask

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def _rows_masked(additive: bool) -> torch.Tensor:
    """A (1, 2, 6, 6) mask whose query rows 1 and 4 of each head mask every key."""
    keep = torch.rand(1, 2, 6, 6, generator=torch.Generator().manual_seed(0)) > 0.3
    keep[..., 0] = True
    keep[:, :, [1, 4], :] = False
    return torch.where(keep, 0.0, -math.inf) if additive else keep


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, 2, 6, 4, generator=gen) for _ in range(3))


@pytest.mark.parametrize("additive", [False, True])
def test_fully_masked_rows_give_eagers_zeros_through_arms_annotation_pipeline(additive: bool) -> None:
    model = Attention(_rows_masked(additive)).eval()
    quantizer = arm_adapter.arm_quantizer("TOSA-1.0+INT", None)
    x, held_out = _inputs(1), _inputs(2)
    eager = model(*held_out)
    assert torch.equal(eager[:, :, [1, 4]], torch.zeros(1, 2, 2, 4))
    # upstream (executorch 1.5.1): Arm's annotation pipeline decomposes the safe
    # softmax as a plain one, so a fully masked row is no longer 0; when this
    # fails Arm has fixed it and the pass is no longer needed
    stock = quantizer.transform_for_annotation(torch.export.export(model, x).module(check_guards=False))
    assert float(stock(*held_out)[:, :, [1, 4]].abs().min()) > 0.0
    gm = torch.export.export(model, x).module(check_guards=False)
    assert zero_fully_masked_rows(gm) == 1
    torch.testing.assert_close(gm(*held_out), eager, rtol=0, atol=0)  # x * 1.0 is x
    ours = quantizer.transform_for_annotation(gm)
    torch.testing.assert_close(ours(*held_out), eager, rtol=1e-5, atol=1e-6)


def test_masks_without_fully_masked_rows_and_runtime_masks_are_left_alone() -> None:
    x = _inputs(1)
    partial = torch.ones(1, 2, 6, 6, dtype=torch.bool).tril()  # every row keeps its diagonal
    for model in (Attention(partial), Attention(None)):
        gm = torch.export.export(model.eval(), x).module(check_guards=False)
        assert zero_fully_masked_rows(gm) == 0

    class RuntimeMask(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m)

    gm = torch.export.export(RuntimeMask(), (*x, _rows_masked(False))).module(check_guards=False)
    assert zero_fully_masked_rows(gm) == 0
