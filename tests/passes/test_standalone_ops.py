"""RMSNorm / RoPE fusion: the pass finds every instance and changes no output bit."""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

from codec_tosa._passes.fuse_standalone_ops import FuseStandaloneOpsPass, FusionReport, drop_dtype_asserts
from codec_tosa.ops import RMS_NORM, ROPE, rms_norm, rope


def fuse_standalone_ops(program: torch.export.ExportedProgram | torch.fx.GraphModule) -> FusionReport:
    """Run the pass on a program (its signature follows renamed outputs) or a bare graph module."""
    if isinstance(program, torch.export.ExportedProgram):
        pass_, gm = FuseStandaloneOpsPass(program), program.graph_module
    else:
        pass_, gm = FuseStandaloneOpsPass(), program
    assert pass_(gm).modified == (pass_.count > 0)
    assert pass_.count == len(pass_.report.rms_norm) + len(pass_.report.rope)
    return pass_.report


class _RMSNorm(nn.Module):
    # Written as transformers' LlamaRMSNorm is.
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(torch.float32)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class _Block(nn.Module):
    """norm -> q/k projections -> RoPE on both -> attention-like product -> norm."""

    def __init__(self) -> None:
        super().__init__()
        self.norm_in = _RMSNorm(32, 1e-5)
        self.q = nn.Linear(32, 32, bias=False)
        self.k = nn.Linear(32, 32, bias=False)
        self.norm_out = _RMSNorm(8, 1e-6)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.norm_in(x)
        q = self.q(h).view(1, 6, 4, 8).transpose(1, 2)
        k = self.k(h).view(1, 6, 4, 8).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        return self.norm_out(q @ k.transpose(-1, -2) @ q)


class _NotFusable(nn.Module):
    """Look-alikes that must be left alone."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Mean over the wrong dimension.
        a = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-5) * 2.0
        # An interior value (the variance) is also a model output.
        variance = x.pow(2).mean(-1, keepdim=True)
        b = torch.ones(8) * (x * torch.rsqrt(variance + 1e-5))
        # Halves swapped the wrong way round.
        c = x * 2.0 + torch.cat((-x[..., :4], x[..., 4:]), dim=-1) * 3.0
        return a, b, variance, c


def _targets(ep: torch.export.ExportedProgram) -> collections.Counter[object]:
    return collections.Counter(n.target for n in ep.graph.nodes if n.op == "call_function")


def _block_inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return torch.randn(1, 6, 32), torch.randn(1, 6, 8), torch.randn(1, 6, 8)


def test_custom_ops_compute_the_reference_math() -> None:
    torch.manual_seed(1)
    x, w = torch.randn(2, 5, 16), torch.randn(16)
    expected = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    assert torch.equal(rms_norm(x, w, 1e-5), expected)
    cos, sin = torch.randn(5, 16), torch.randn(5, 16)
    assert torch.equal(rope(x, cos, sin), x * cos + _rotate_half(x) * sin)


def test_fusion_finds_both_patterns_and_keeps_outputs_bit_exact() -> None:
    torch.manual_seed(0)
    model = _Block().eval()
    inputs = _block_inputs()
    ep = torch.export.export(model, inputs).run_decompositions()
    before = ep.module()(*inputs)

    report = fuse_standalone_ops(ep)

    assert (len(report.rms_norm), len(report.rope)) == (2, 2)
    counts = _targets(ep)
    assert counts[RMS_NORM] == 2 and counts[ROPE] == 2
    for gone in (torch.ops.aten.rsqrt.default, torch.ops.aten.neg.default, torch.ops.aten.cat.default):
        assert counts[gone] == 0
    assert torch.equal(ep.module()(*inputs), before)
    # The output node kept its name, so the program's signature still holds.
    assert ep.graph_signature.user_outputs[0] in report.rms_norm


def test_custom_ops_survive_a_second_decomposition() -> None:
    torch.manual_seed(0)
    inputs = _block_inputs()
    ep = torch.export.export(_Block().eval(), inputs).run_decompositions()
    fuse_standalone_ops(ep)
    again = ep.run_decompositions()
    counts = _targets(again)
    assert counts[RMS_NORM] == 2 and counts[ROPE] == 2
    assert torch.equal(again.module()(*inputs), ep.module()(*inputs))


def test_look_alikes_are_not_fused() -> None:
    x = torch.randn(3, 8)
    ep = torch.export.export(_NotFusable(), (x,)).run_decompositions()
    before = ep.module()(x)
    report = fuse_standalone_ops(ep)
    assert report.rms_norm == [] and report.rope == []
    assert all(torch.equal(a, b) for a, b in zip(ep.module()(x), before))


def test_fusion_works_on_a_graph_module() -> None:
    torch.manual_seed(0)
    inputs = _block_inputs()
    gm = torch.export.export(_Block().eval(), inputs).run_decompositions().module()
    before = gm(*inputs)
    report = fuse_standalone_ops(gm)
    assert (len(report.rms_norm), len(report.rope)) == (2, 2)
    assert torch.equal(gm(*inputs), before)


@pytest.mark.slow
def test_smollm2_has_61_rms_norms_and_60_rotary_applications() -> None:
    from codec_tosa import analyze
    from codec_tosa.tools.tables.collect import port_graph_of
    from codec_tosa_examples.models import smollm2

    model, inputs = smollm2()
    ep = torch.export.export(model, inputs).run_decompositions()
    with torch.no_grad():
        before = ep.module()(*inputs)
        assert torch.allclose(before, model(*inputs), atol=1e-4)
    report = fuse_standalone_ops(ep)
    assert len(report.rms_norm) == 61  # 2 per layer x 30 + the final norm
    assert len(report.rope) == 60  # query and key in each of 30 layers
    counts = _targets(ep)
    assert counts[torch.ops.aten.rsqrt.default] == 0
    assert counts[torch.ops.aten.neg.default] == 0
    with torch.no_grad():
        assert torch.equal(ep.module()(*inputs), before)

    # The tables analyse the rewritten graph; its storage is the published one.
    # the norms' casts; SDPA attention has no softmax cast (eager attention added 30)
    assert drop_dtype_asserts(ep) == 67
    graph = port_graph_of(ep)
    assert round(analyze(graph, policy="Z").storage_mib, 1) == 405.1
    assert round(analyze(graph, policy="W").storage_mib, 1) == 101.4
