"""LowerCodecsPass: the plan's codecs as minimal TOSA sequences, bit-exact on the reference model.

Codec semantics are those of `torch.ops.quantized_decomposed` (what `simulate()`
runs). Hand-built programs hold nothing but codecs (and one FP32 operator
between them), are lowered by Arm's pipeline with the pass, run on the TOSA
reference model and compared bit for bit with eager PyTorch over all 256
codes, exact ties, near-ties, huge values and the zero-point extremes. The
product path is then checked across policies on a small model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)
from executorch.exir import to_edge
from executorch.exir.capture._config import EdgeCompileConfig

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.simulation import simulate
from codec_tosa.runtime.pte import delegate_payload
from codec_tosa.validation.reference_model import run_reference_model as run_reference
from codec_tosa.serialization.tosa_stats import tosa_stats
from codec_tosa.spec import CodecSpec

from small_models import calibration, conv_cat_reshape

TOSA_SPEC = "TOSA-1.0+INT+FP"
QD = torch.ops.quantized_decomposed
# what Arm's emulated rounding leaves behind; none of it may come from a codec
EMULATION_OPS = {"FLOOR", "CEIL", "SELECT", "GREATER_EQUAL"}
# (scale, zero point): zero-point extremes, zero, a power-of-two scale (exact ties
# survive x * (1/s)) and ordinary scales
THETAS = [(0.1, -128), (0.1, 127), (0.02, 0), (1 / 64, 3), (0.0123, -7), (3.0, 0), (2.0**-7, -128)]


class Encode(torch.nn.Module):
    def __init__(self, scale: float, zp: int) -> None:
        super().__init__()
        self.scale, self.zp = scale, zp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return QD.quantize_per_tensor(x, self.scale, self.zp, -128, 127, torch.int8)


class Decode(Encode):
    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return QD.dequantize_per_tensor(c, self.scale, self.zp, -128, 127, torch.int8)


class DecodeToHalf(Encode):
    """A float16 program's decode: the dequantize gives float16 (``out_dtype``)."""

    def forward(self, c: torch.Tensor) -> torch.Tensor:
        return QD.dequantize_per_tensor(c, self.scale, self.zp, -128, 127, torch.int8, out_dtype=torch.float16)


class CodecsAroundRelu(Encode):
    """encode -> decode -> relu (FP32) -> encode -> decode, as the plan writes it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = QD.quantize_per_tensor(x, self.scale, self.zp, -128, 127, torch.int8)
        y = torch.relu(QD.dequantize_per_tensor(c, self.scale, self.zp, -128, 127, torch.int8))
        c = QD.quantize_per_tensor(y, self.scale / 2, -128, -128, 127, torch.int8)
        return QD.dequantize_per_tensor(c, self.scale / 2, -128, -128, 127, torch.int8)


def _lower(module: torch.nn.Module, example: torch.Tensor) -> bytes:
    ep = torch.export.export(module, (example,))
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    spec = arm_adapter.tosa_compile_spec(TOSA_SPEC)
    return arm_adapter.lower_into(edge, spec, arm_adapter.new_serializer(spec), lower_codecs=True)


def _operators(payload: bytes) -> dict[str, int]:
    return {op: n for op, n in tosa_stats(payload).operators_by_type.items()
            if op not in ("CONST", "CONST_SHAPE")}


def _encode_inputs(scale: float, zp: int) -> torch.Tensor:
    """Exact ties, near-ties, the saturation edges and huge values, in FP32."""
    k = torch.arange(-300, 300, dtype=torch.float64)
    ties = ((k + 0.5) * scale).float()
    near = torch.cat([((k + 0.49999997) * scale).float(), ((k - 0.49999997) * scale).float(),
                      torch.tensor([0.49999997 * scale, -0.49999997 * scale])])
    tie_f32 = ties.clone()
    neighbours = torch.cat([torch.nextafter(tie_f32, torch.tensor(math.inf)),
                            torch.nextafter(tie_f32, torch.tensor(-math.inf))])
    edges = torch.tensor([(q - zp + d) * scale for q in (-128, 127) for d in (-1.5, -0.5, 0.0, 0.5, 1.5)])
    huge = torch.tensor([3e38, -3e38, 3.4028235e38, -3.4028235e38, 1e10, -1e10, 0.0, -0.0])
    rand = torch.randn(2000, generator=torch.Generator().manual_seed(0)) * 200 * scale
    return torch.cat([ties, near, neighbours, edges.float(), huge, rand]).float()


@pytest.mark.parametrize("scale,zp", THETAS)
def test_encode_is_bit_exact_and_minimal(scale: float, zp: int) -> None:
    x = _encode_inputs(scale, zp)
    payload = _lower(Encode(scale, zp), x)
    expected = QD.quantize_per_tensor(x, scale, zp, -128, 127, torch.int8).numpy()
    (out,) = run_reference(payload, [x.numpy()])
    assert out.dtype == np.int8
    mismatch = np.flatnonzero(out.reshape(-1) != expected)
    assert mismatch.size == 0, f"{mismatch.size} codes differ, e.g. x={x[mismatch[:5]].tolist()}"
    expected_ops = {"MUL": 1, "CAST": 1} if zp == 0 else {"MUL": 1, "CAST": 1, "RESCALE": 1}
    assert _operators(payload) == expected_ops


@pytest.mark.parametrize("scale,zp", THETAS)
def test_decode_of_all_256_codes_is_bit_exact_and_minimal(scale: float, zp: int) -> None:
    codes = torch.arange(-128, 128, dtype=torch.int8)
    payload = _lower(Decode(scale, zp), codes)
    expected = QD.dequantize_per_tensor(codes, scale, zp, -128, 127, torch.int8).numpy()
    (out,) = run_reference(payload, [codes.numpy()])
    assert out.dtype == np.float32
    assert out.reshape(-1).tobytes() == expected.tobytes()
    expected_ops = {"CAST": 1, "MUL": 1} if zp == 0 else {"RESCALE": 1, "CAST": 1, "MUL": 1}
    assert _operators(payload) == expected_ops


@pytest.mark.parametrize("scale,zp", THETAS)
def test_float16_codecs_are_bit_exact_with_one_cast_more(scale: float, zp: int) -> None:
    """A float16 program's codecs (Arm's test_view rand_4d_4d_fp16 at W): the encode
    takes its input to FP32 first, as quantize_per_tensor does; the decode rounds
    the FP32 product to float16, as eager's float16 dequantize does."""
    x = _encode_inputs(scale, zp).half()
    payload = _lower(Encode(scale, zp), x)
    (out,) = run_reference(payload, [x.numpy()])
    assert out.dtype == np.int8
    assert np.array_equal(out.reshape(-1), QD.quantize_per_tensor(x, scale, zp, -128, 127, torch.int8).numpy())
    codes = torch.arange(-128, 128, dtype=torch.int8)
    payload_dq = _lower(DecodeToHalf(scale, zp), codes)
    (out,) = run_reference(payload_dq, [codes.numpy()])
    expected = DecodeToHalf(scale, zp)(codes).numpy()
    assert out.dtype == np.float16
    assert out.reshape(-1).tobytes() == expected.tobytes()
    expected_ops = {"MUL": 1, "CAST": 2} if zp == 0 else {"MUL": 1, "CAST": 2, "RESCALE": 1}
    assert _operators(payload) == expected_ops and _operators(payload_dq) == expected_ops


@pytest.mark.parametrize("scale,zp", [(0.05, -128), (0.05, 127), (0.05, 0)])
def test_fp32_operator_between_codecs_matches_eager_bit_for_bit(scale: float, zp: int) -> None:
    module = CodecsAroundRelu(scale, zp)
    x = _encode_inputs(scale, zp)
    payload = _lower(module, x)
    (out,) = run_reference(payload, [x.numpy()])
    assert out.reshape(-1).tobytes() == module(x).numpy().tobytes()
    assert not EMULATION_OPS & set(_operators(payload))


def test_stock_lowering_of_the_same_program_still_emulates_rounding() -> None:
    """Without the pass (no plan), Arm's own decomposition runs: the hook is opt-in."""
    x = _encode_inputs(0.1, 3)
    ep = torch.export.export(Encode(0.1, 3), (x,))
    edge = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).exported_program()
    spec = arm_adapter.tosa_compile_spec(TOSA_SPEC)
    payload = arm_adapter.lower_into(edge, spec, arm_adapter.new_serializer(spec))
    assert EMULATION_OPS <= set(_operators(payload))


# ---- the product path --------------------------------------------------------


@pytest.fixture(scope="module")
def small_model():
    m, x = conv_cat_reshape()
    return m, x, torch.export.export(m, x), calibration(x)


@pytest.mark.parametrize("policy", ["Y", "X", "W"])
def test_policies_lower_codecs_without_rounding_emulation(small_model, policy: str) -> None:
    m, x, ep, calib = small_model
    lowered = lower_program(ep, CodecSpec(policy=policy), calib)
    payload = delegate_payload(lowered.pte)
    ops = _operators(payload)
    assert not EMULATION_OPS & set(ops), ops
    part = lowered.planned
    graph = part.graph
    out_port = next(p for p in range(graph.num_in_ports) if graph.in_op[p] == -1)
    step = part.thetas[part.placement.plan.value_domain[graph.in_value[out_port]]].scale
    g = torch.Generator().manual_seed(123)  # held out: not among the calibration inputs
    for _ in range(3):
        held_out = (torch.randn(x[0].shape, generator=g),)
        (ref,) = run_reference(payload, [held_out[0].numpy()])
        sim = simulate(part, held_out)[0].numpy()
        # INT8 convolutions accumulate in int32 and RESCALE (simulate runs them in FP32
        # on decoded values), so the output may differ by one step of its domain
        assert np.max(np.abs(ref.reshape(sim.shape) - sim)) <= step * (1 + 1e-4)
