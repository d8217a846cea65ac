"""Golden test of the Arm adapter: with policy Z and pooling off, our TOSA bytes
are exactly stock TOSABackend's for the same model."""

from __future__ import annotations

import torch
from executorch.exir import to_edge_transform_and_lower

from codec_tosa import arm_adapter
from codec_tosa.tools.compiler import lower_program
from codec_tosa.tools.validate import delegate_payload
from codec_tosa.spec import CodecSpec

from small_models import conv_cat_reshape


def test_policy_z_without_pooling_is_stock_arm():
    m, x = conv_cat_reshape()
    spec = CodecSpec(policy="Z", pool_constants=False)
    ours = delegate_payload(lower_program(torch.export.export(m, x), spec, [x]).pte)

    stock_part = arm_adapter.stock_partitioner(arm_adapter.tosa_compile_spec(spec.tosa_spec))
    edge = to_edge_transform_and_lower(torch.export.export(m, x), partitioner=[stock_part])
    from executorch.exir._serialize._program import _extract_delegate_payload

    stock = bytes(_extract_delegate_payload(edge.to_executorch().buffer, "TOSABackend"))
    assert ours == stock


def test_pooling_changes_the_bytes_but_not_the_outputs():
    from codec_tosa.tools.validate import run_reference_model

    m, x = conv_cat_reshape()
    ep = torch.export.export(m, x)
    plain = delegate_payload(lower_program(ep, CodecSpec(policy="W", pool_constants=False), [x]).pte)
    pooled = delegate_payload(lower_program(ep, CodecSpec(policy="W"), [x]).pte)
    assert len(pooled) < len(plain)
    a = run_reference_model(plain, [x[0].numpy()], "plain")[0]
    b = run_reference_model(pooled, [x[0].numpy()], "pooled")[0]
    assert (a == b).all()
