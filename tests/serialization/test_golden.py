"""Golden test of the Arm adapter: with policy Z and pooling off, our TOSA bytes
are exactly stock TOSABackend's for the same model."""

from __future__ import annotations

import torch
from executorch.exir import to_edge_transform_and_lower

import pytest

import small_models
from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.runtime.pte import delegates, delegate_payload
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import lower_program

from small_models import conv_cat_reshape


@pytest.mark.parametrize("model", ["conv_cat_reshape", "conv_bn_relu6", "depthwise", "linear_head",
                                   "attention", "sdpa_attention"])
def test_policy_z_without_pooling_is_stock_arm(model):
    m, x = getattr(small_models, model)()
    spec = CodecSpec(policy="Z", pool_constants=False)
    ours = [d.payload for d in delegates(lower_program(torch.export.export(m, x), spec, [x]).pte)]

    stock_part = arm_adapter.stock_partitioner(arm_adapter.tosa_compile_spec(spec.tosa_spec))
    edge = to_edge_transform_and_lower(torch.export.export(m, x), partitioner=[stock_part])
    stock = [d.payload for d in delegates(edge.to_executorch().buffer)]
    assert len(ours) == len(stock) >= 1
    assert ours == stock


def test_pooling_changes_the_bytes_but_not_the_outputs():
    from codec_tosa.validation.validate import run_reference_model

    m, x = conv_cat_reshape()
    ep = torch.export.export(m, x)
    plain = delegate_payload(lower_program(ep, CodecSpec(policy="W", pool_constants=False), [x]).pte)
    pooled = delegate_payload(lower_program(ep, CodecSpec(policy="W"), [x]).pte)
    assert len(pooled) < len(plain)
    a = run_reference_model(plain, [x[0].numpy()], "plain")[0]
    b = run_reference_model(pooled, [x[0].numpy()], "pooled")[0]
    assert (a == b).all()
