"""Layout operators around our codecs: on the codes, and found without a re-trace per codec.

Arm's permute propagation re-traces the whole graph after each round of
moves; before `arm_pipeline`'s permute-pass subclasses, every codec operator
stopped a permute for a round (ShuffleNetV2 at W: 160 re-traces against 17
for stock INT8). `PermutesOntoCodesPass` then moves a permute left on the FP32
side of a codec onto its INT8 side (an image model's input transpose).
"""

from __future__ import annotations

import collections
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from executorch.backends.transforms import propagate_view_copy_permute_pass as propagation

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.arm import stock
from codec_tosa.codecs import Int8Affine
from codec_tosa.codecs.int8 import NEAR_SYMMETRIC, QMAX, QMIN
from codec_tosa.runtime.pte import delegate_payload
from codec_tosa.serialization import tosa_stats as ts
from codec_tosa.validation.simulation import simulate
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.reference_model import run_reference_model

import small_models


def _transpose_input_dtypes(payload: bytes) -> list[str]:
    tensors = ts.tensors(payload)
    return [tensors[op.inputs[0]].dtype for op in ts.iter_operators(payload) if op.op == "TRANSPOSE"]


@pytest.mark.parametrize("model", ["conv_relu6_conv", "mobile_block"])
def test_every_transpose_moves_codes_not_fp32(lowered, model: str) -> None:
    """The input's NCHW->NHWC transpose runs after the input encode, on INT8 codes;
    so does every other TRANSPOSE of a W artefact, and the artefact still equals
    the simulation bit for bit on held-out inputs."""
    low = lowered(model, "W")
    payload = delegate_payload(low.pte)
    dtypes = _transpose_input_dtypes(payload)
    assert dtypes and set(dtypes) == {"INT8"}, dtypes
    _, example = getattr(small_models, model)()
    g = torch.Generator().manual_seed(4321)  # held out: not among the calibration inputs
    for _ in range(3):
        x = torch.randn(example[0].shape, generator=g)
        (ref,) = run_reference_model(payload, [x.numpy()])
        (sim,) = simulate(low.planned, (x,))
        np.testing.assert_array_equal(ref.reshape(sim.shape), sim.detach().numpy())


@pytest.fixture
def retraces() -> Iterator[collections.Counter]:
    counts: collections.Counter = collections.Counter()
    original = propagation.PropagateViewCopyPermutePass._retrace

    def counted(self: Any, graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
        counts[type(self).__name__] += 1
        return original(self, graph_module)

    propagation.PropagateViewCopyPermutePass._retrace = counted
    try:
        yield counts
    finally:
        propagation.PropagateViewCopyPermutePass._retrace = original


def test_permute_propagation_does_not_retrace_per_codec(retraces: collections.Counter) -> None:
    """On a channel-shuffle block at W, propagation re-traces at most twice as
    often as for stock INT8 (8 against 5 here; without the adapter's crossing
    rule, once per codec operator on a permute's path: 19)."""
    model, x = small_models.mobile_block()
    calibration = small_models.calibration(x)
    spec = arm_adapter.tosa_compile_spec("TOSA-1.0+INT")
    stock_program = stock.stock_int8_program(model, x, spec)
    from executorch.exir import to_edge_transform_and_lower

    to_edge_transform_and_lower(stock_program, partitioner=[arm_adapter.stock_partitioner(spec)])
    stock_retraces = sum(retraces.values())
    retraces.clear()
    lower_program(torch.export.export(model, x), CodecSpec(policy="W"), calibration)
    ours = sum(retraces.values())
    assert ours <= 2 * stock_retraces, (ours, stock_retraces)


def test_a_nearly_symmetric_range_gets_zero_point_zero() -> None:
    """z = 0 (2-operator codecs) where it coarsens the step by at most NEAR_SYMMETRIC;
    a one-signed or lopsided range keeps its zero point."""
    codec = Int8Affine()
    g = torch.Generator().manual_seed(7)
    for _ in range(200):
        lo, hi = (-torch.rand(1, generator=g).item() * 10, torch.rand(1, generator=g).item() * 10)
        theta = codec.learn(lo, hi)
        asymmetric = (hi - lo) / (QMAX - QMIN)
        if theta.zero_point == 0:
            assert theta.scale <= NEAR_SYMMETRIC * asymmetric * (1 + 1e-6)
            assert QMIN * theta.scale <= lo and hi <= QMAX * theta.scale * (1 + 1e-6)  # nothing saturates
        else:
            assert max(lo / QMIN, hi / QMAX) > NEAR_SYMMETRIC * asymmetric
    assert codec.learn(-4.8, 4.9).zero_point == 0
    assert codec.learn(0.0, 6.0).zero_point == QMIN  # a ReLU output keeps all 256 codes
    assert codec.learn(-1.0, 3.0).zero_point != 0
