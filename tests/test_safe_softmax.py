"""SDPA's safe-softmax guard (planning/safe_softmax): proven never to fire, it is
removed at the mixed policies, with no output bit changed; otherwise it stays."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from executorch.backends.arm.common.pipeline_config import SDPASafeSoftmaxGuardPolicy
from executorch.backends.arm.vgf import VgfCompileSpec
from executorch.exir.backend.compile_spec_schema import CompileSpec

import small_models
from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.planning.safe_softmax import constant_value, guards_never_fire
from codec_tosa.runtime.executorch_runner import run_pte
from codec_tosa.runtime.pte import delegates
from codec_tosa.serialization.tosa_stats import tosa_stats
from codec_tosa.spec import CodecSpec
from codec_tosa.targets.tosa import partitioner as partitioner_module
from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.metrics import sqnr_db

T = 6  # tokens of small_models.sdpa_attention
TRIL = torch.ones(T, T, dtype=torch.bool).tril()  # every row attends its diagonal
ROW_MASKED = TRIL.clone().index_fill_(0, torch.tensor([2]), False)  # query row 2 attends nothing


class ComputedMask(small_models.SdpaAttention):
    """A causal mask built in the graph from `arange`, as transformers builds SmolLM2's;
    `masked_row` masks that query row fully."""

    def __init__(self, masked_row: int | None = None) -> None:
        super().__init__()
        self.masked_row = masked_row

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i = torch.arange(x.shape[1])
        mask = i[:, None] >= i[None, :]
        if self.masked_row is not None:
            mask = mask & (i[:, None] != self.masked_row)
        return self.attend(x, mask)


class RuntimeMask(small_models.SdpaAttention):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.attend(x, mask)


def _additive(mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, 0.0, -math.inf)


@pytest.mark.parametrize("model, never_fire", [
    (small_models.SdpaAttention(), True),
    (small_models.SdpaAttention(causal=True), True),
    (small_models.SdpaAttention(TRIL), True),
    (small_models.SdpaAttention(_additive(TRIL)), True),
    (ComputedMask(), True),
    (small_models.SdpaAttention(ROW_MASKED), False),
    (small_models.SdpaAttention(_additive(ROW_MASKED)), False),
    (ComputedMask(masked_row=2), False),
    (small_models.Attention(), False),  # no SDPA: no guard to remove
], ids=["no-mask", "causal", "bool-mask", "additive-mask", "computed-mask", "bool-row-masked",
        "additive-row-masked", "computed-row-masked", "explicit-softmax"])
def test_guards_never_fire_reads_every_attentions_mask(model: torch.nn.Module, never_fire: bool) -> None:
    ep = torch.export.export(model.eval(), (torch.randn(1, T, 16),))
    assert guards_never_fire(ep) is never_fire


def test_a_mask_read_from_an_input_is_not_proven() -> None:
    ep = torch.export.export(RuntimeMask().eval(), (torch.randn(1, T, 16), TRIL))
    assert guards_never_fire(ep) is False


def test_a_computed_mask_is_computed_as_eager_computes_it() -> None:
    ep = torch.export.export(ComputedMask(masked_row=4).eval(), (torch.randn(1, T, 16),))
    (sdpa,) = [n for n in ep.graph.nodes if n.target == torch.ops.aten.scaled_dot_product_attention.default]
    i = torch.arange(T)
    want = (i[:, None] >= i[None, :]) & (i[:, None] != 4)
    assert torch.equal(constant_value(ep, sdpa.args[3]), want)
    x = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "x")
    assert constant_value(ep, x) is None


def _lowered(model: torch.nn.Module, policy: str) -> bytes:
    gen = torch.Generator().manual_seed(1)
    calibration = [(torch.randn(1, T, 16, generator=gen),) for _ in range(16)]
    return lower_program(torch.export.export(model, calibration[0]), CodecSpec(policy=policy), calibration).pte


def _guard_ops(pte: bytes) -> tuple[int, int]:
    counts: Counter[str] = sum((Counter(tosa_stats(d.payload).operators_by_type) for d in delegates(pte)), Counter())
    return counts["EQUAL"], counts["SELECT"]


def _pipeline_guard_policies(pte: bytes) -> list[SDPASafeSoftmaxGuardPolicy]:
    """Each delegate's guard policy, as Arm's pass pipeline reads it from the .pte's compile specs."""
    return [arm_adapter.compile_spec_from_list([CompileSpec(k, v.encode()) for k, v in d.arm_specs.items()])
            ._get_pass_pipeline_config().sdpa_safe_softmax_guard for d in delegates(pte)]


def test_removed_guards_change_no_output_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    model, _ = small_models.sdpa_attention()
    removed = _lowered(model, "W")
    with monkeypatch.context() as m:  # the same lowering with the proof withheld
        m.setattr(partitioner_module, "guards_never_fire", lambda ep: False)
        kept = _lowered(model, "W")
    assert _guard_ops(kept) == (1, 1) and _guard_ops(removed) == (0, 0)
    assert _pipeline_guard_policies(removed) == [SDPASafeSoftmaxGuardPolicy.REMOVE]
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):  # held-out inputs, not the calibration's
        x = torch.randn(1, T, 16, generator=gen)
        (a,), (b,) = run_pte(removed, [x]), run_pte(kept, [x])
        assert torch.equal(a, b)
        assert sqnr_db(model(x).detach().numpy(), a.numpy()) > 30.0  # INT8 codes: near eager (35-39 dB here), not equal


def test_a_fully_masked_row_keeps_the_guard_and_eagers_zeros() -> None:
    model = small_models.SdpaAttention(ROW_MASKED).eval()
    pte = _lowered(model, "W")
    assert _guard_ops(pte) >= (1, 1)
    assert _pipeline_guard_policies(pte) == [SDPASafeSoftmaxGuardPolicy.PRESERVE]
    x = torch.randn(1, T, 16, generator=torch.Generator().manual_seed(7))
    (got,) = run_pte(pte, [x])
    eager = model(x)
    assert torch.isfinite(got).all()
    # the masked row's attention is 0, so its output is the projection's bias
    torch.testing.assert_close(eager[0, 2], model.out.bias)
    assert sqnr_db(eager[0, 2].detach().numpy(), got[0, 2].numpy()) > 30.0


def test_the_reference_policy_keeps_stocks_guards() -> None:
    model, _ = small_models.sdpa_attention()
    pte = _lowered(model, "Z")
    assert _guard_ops(pte) == (1, 1)
    assert _pipeline_guard_policies(pte) == [SDPASafeSoftmaxGuardPolicy.PRESERVE]


def test_vgf_delegates_carry_the_removal() -> None:
    for remove, policy in ((True, SDPASafeSoftmaxGuardPolicy.REMOVE), (False, SDPASafeSoftmaxGuardPolicy.PRESERVE)):
        entries = arm_adapter.vgf_compile_spec_entries("TOSA-1.0+FP", None, remove)
        assert VgfCompileSpec._from_list(entries)._get_pass_pipeline_config().sdpa_safe_softmax_guard is policy
