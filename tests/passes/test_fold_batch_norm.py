"""Batch-norm folding keeps outputs and removes the FP32 norm between compressible convs."""

from __future__ import annotations

import torch
from torch import nn

from codec_tosa import analyze
from codec_tosa._passes.fold_batch_norm import FoldBatchNormPass


class ConvBn(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 6, 3, bias=bias), nn.BatchNorm2d(6)
        self.c2, self.b2 = nn.Conv2d(6, 6, 1, bias=bias), nn.BatchNorm2d(6)
        for bn in (self.b1, self.b2):  # non-trivial statistics
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.data.uniform_(0.5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b1(self.c1(x))
        return self.b2(self.c2(y)), y


def test_fold_keeps_outputs_and_removes_norms():
    torch.manual_seed(0)
    for bias in (False, True):
        m, x = ConvBn(bias).eval(), torch.randn(2, 3, 8, 8)
        ep = torch.export.export(m, (x,)).run_decompositions()
        fold = FoldBatchNormPass(ep)
        assert fold(ep.graph_module).modified and fold.count == 2
        targets = {str(n.target) for n in ep.graph.nodes}
        assert not any("batch_norm" in t for t in targets)
        for got, want in zip(ep.module()(x), m(x)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        # the norms' parameters and statistics are gone (num_batches_tracked was never read)
        left = {k for k in ep.state_dict if k.startswith(("b1.", "b2."))}
        assert left <= {"b1.num_batches_tracked", "b2.num_batches_tracked"}


def test_analysis_folds_on_request():
    torch.manual_seed(0)
    m, x = ConvBn(False).eval(), torch.randn(1, 3, 8, 8)
    ep = torch.export.export(m, (x,))
    folded, kept = analyze(ep, "Y", fold_batch_norm=True), analyze(ep, "Y")
    # folded: conv -> conv shares a domain; kept: the norm's output is encoded again
    assert folded.codec_counts()["encode"] == 1 and kept.codec_counts()["encode"] == 2
    assert folded.traffic_mib < kept.traffic_mib
