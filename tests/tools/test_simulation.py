"""simulate() against the artefact: the TOSA reference model on held-out inputs.

The simulation (codec_tosa.validation.simulation) evaluates Arm's INT8 operators on codes
with the integer arithmetic of the lowering; these tests hold it to one
quantisation step of each output on seeded random inputs that calibration
never saw, on small ResNet-, MobileNet-, ShuffleNet- and attention-style
blocks, and pin the RESCALE constants to Arm's own function.
"""

from __future__ import annotations

import math
from typing import Any
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.reference_io import fp32_steps
from codec_tosa.validation.rescale import multiplier_and_shift, rescale
from codec_tosa.runtime.pte import delegate_payload
from codec_tosa.validation.reference_model import run_reference_model
from codec_tosa.validation.simulation import simulate_with_stats
from codec_tosa.spec import CodecSpec

HELD_OUT = 6  # random inputs per model, drawn after (and apart from) calibration


def _bn(c: int, gen: torch.Generator) -> nn.BatchNorm2d:
    """A batch norm with non-trivial statistics (defaults would fold to identity)."""
    bn = nn.BatchNorm2d(c)
    bn.running_mean = torch.randn(c, generator=gen) * 0.1
    bn.running_var = torch.rand(c, generator=gen) + 0.5
    bn.weight.data = torch.rand(c, generator=gen) + 0.5
    bn.bias.data = torch.randn(c, generator=gen) * 0.1
    return bn


class _Basic(nn.Module):
    """ResNet basic block: conv-BN-ReLU, conv-BN, add the (projected) input, ReLU."""

    def __init__(self, gen: torch.Generator, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), _bn(cout, gen)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), _bn(cout, gen)
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _bn(cout, gen))
                     if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.b2(self.c2(F.relu(self.b1(self.c1(x))))) + self.down(x))


class ResNetBlocks(nn.Module):
    """Stem, max pool, an identity and a projection basic block, pooled linear head."""

    def __init__(self, gen: torch.Generator, c: int = 16) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, c, 3, 1, 1, bias=False), _bn(c, gen)
        self.blocks = nn.Sequential(_Basic(gen, c, c, 1), _Basic(gen, c, 2 * c, 2))
        self.head = nn.Linear(2 * c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn(self.stem(x))), 3, 2, 1)
        return self.head(self.blocks(x).mean((2, 3)))


class _InvertedResidual(nn.Module):
    """mobilenet_v3 block: expand, hardswish, depthwise, squeeze-excite, project, add."""

    def __init__(self, gen: torch.Generator, c: int, e: int) -> None:
        super().__init__()
        self.expand, self.b1 = nn.Conv2d(c, e, 1, bias=False), _bn(e, gen)
        self.dw, self.b2 = nn.Conv2d(e, e, 3, 1, 1, groups=e, bias=False), _bn(e, gen)
        self.se1, self.se2 = nn.Conv2d(e, e // 4, 1), nn.Conv2d(e // 4, e, 1)
        self.project, self.b3 = nn.Conv2d(e, c, 1, bias=False), _bn(c, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardswish(self.b1(self.expand(x)))
        y = F.hardswish(self.b2(self.dw(y)))
        s = F.hardsigmoid(self.se2(F.relu(self.se1(y.mean((2, 3), keepdim=True)))))
        return x + self.b3(self.project(y * s))


class MobileNetBlocks(nn.Module):
    """Stem, two inverted residuals, pooled linear head."""

    def __init__(self, gen: torch.Generator, c: int = 16) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, c, 3, 2, 1, bias=False), _bn(c, gen)
        self.blocks = nn.Sequential(_InvertedResidual(gen, c, 3 * c), _InvertedResidual(gen, c, 3 * c))
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.hardswish(self.bn(self.stem(x)))
        return self.head(self.blocks(x).mean((2, 3)))


class AttentionBlock(nn.Module):
    """Single-head self-attention: linear q/k/v, two matmuls, output projection."""

    def __init__(self, gen: torch.Generator, d: int = 16) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) * 0.25, dim=-1)
        return self.o(a @ self.v(x))


class ShuffleBlock(nn.Module):
    """Split, transform one half, concat, channel shuffle, max pool, then a
    pooled linear head: the mean reads codes, which Arm re-quantises."""

    def __init__(self, gen: torch.Generator, c: int = 16) -> None:
        super().__init__()
        h = c // 2
        self.a, self.b1 = nn.Conv2d(h, h, 1, bias=False), _bn(h, gen)
        self.dw, self.b2 = nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), _bn(h, gen)
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left, right = x.chunk(2, dim=1)
        y = torch.cat((left, self.b2(self.dw(F.relu(self.b1(self.a(right)))))), dim=1)
        b, c, hh, ww = y.shape
        y = y.view(b, 2, c // 2, hh, ww).transpose(1, 2).contiguous().view(b, c, hh, ww)
        return self.head(F.max_pool2d(y, 3, 2, 1).mean((2, 3)))


BLOCKS = {
    "resnet": (ResNetBlocks, (1, 3, 24, 24)),
    "mobilenet": (MobileNetBlocks, (1, 3, 24, 24)),
    "attention": (AttentionBlock, (1, 6, 16)),
    "shuffle": (ShuffleBlock, (1, 16, 16, 16)),
}


def _lowered(name: str, seed: int, policy: str):
    cls, shape = BLOCKS[name]
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = cls(gen).eval()
    example = (torch.randn(shape, generator=gen),)
    calibration = [example] + [(torch.randn(shape, generator=gen),) for _ in range(3)]
    lowered = lower_program(torch.export.export(model, example), CodecSpec(policy=policy), calibration)
    return model, example, shape, lowered


def _max_steps(model, example, shape, lowered, seed: int) -> tuple[float, object]:
    """Worst |reference model - simulate| over held-out inputs, in output steps."""
    part = lowered.planned
    payload = delegate_payload(lowered.pte)
    with torch.no_grad():
        steps = part.output_steps(fp32_steps([model(*example)]))
    gen = torch.Generator().manual_seed(10_000 + seed)  # apart from the calibration stream
    worst, stats = 0.0, None
    for k in range(HELD_OUT):
        x = torch.randn(shape, generator=gen) * (0.5 + k % 3)  # inside and beyond the calibrated range
        ref = run_reference_model(payload, [x.numpy()], "test")[0]
        outs, stats = simulate_with_stats(part, [x])
        diff = np.abs(ref.reshape(outs[0].shape) - outs[0].numpy())
        worst = max(worst, float(diff.max()) / steps[0])
    return worst, stats


# mobilenet (depthwise convolutions, 22 s) in the slow tier: resnet, attention and
# shuffle keep the default run's convolutions, linears and channel shuffles
@pytest.mark.parametrize("name,seed,policy", [
    ("resnet", 0, "W"), ("resnet", 1, "Y"),
    pytest.param("mobilenet", 0, "W", marks=pytest.mark.slow),
    ("attention", 0, "W"),
    ("shuffle", 0, "W"), ("shuffle", 3, "Y"),
])
def test_simulation_matches_reference_model(name, seed, policy):
    model, example, shape, lowered = _lowered(name, seed, policy)
    worst, stats = _max_steps(model, example, shape, lowered, seed)
    assert stats.integer_ops, "no operator was simulated on codes"
    assert not stats.float_fallbacks, f"INT8 operators simulated in float: {stats.float_fallbacks}"
    # bit for bit: the codecs are lowered with the plan's own rounding (ties to
    # even), and everything else the simulation mirrors is integer arithmetic
    assert worst == 0.0, f"{name} seed {seed} at {policy}: {worst} steps"


def test_constants_are_derived_once_and_change_nothing() -> None:
    """The weights' decodes and centred codes are kept with the materialised program
    and reused on later input sets: the outputs equal a simulator that keeps nothing."""
    from codec_tosa.planning.calibration import lifted_args
    from codec_tosa.validation.simulation import IntegerSimulator, constants_of

    _, example, shape, lowered = _lowered("resnet", 2, "W")
    planned = lowered.planned
    sim = planned.materialized()
    gen = torch.Generator().manual_seed(20_000)
    first, second = (torch.randn(shape, generator=gen),), (torch.randn(shape, generator=gen),)
    simulate_with_stats(planned, first)
    kept = len(constants_of(sim))
    assert kept > 0  # every convolution's weight, as its products read it
    cached, stats = simulate_with_stats(planned, second)
    assert len(constants_of(sim)) == kept  # nothing derived again
    with torch.no_grad():
        fresh = IntegerSimulator(sim.graph_module).run(*lifted_args(sim, second))
    fresh = fresh[0] if isinstance(fresh, (tuple, list)) else fresh
    assert stats.integer_ops and torch.equal(cached[0], fresh)


@pytest.mark.parametrize("name", ["resnet", pytest.param("mobilenet", marks=pytest.mark.slow), "attention"])
def test_int8_gemm_and_float32_paths_simulate_alike(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Convolutions and linears of int8 codes summed by the int8 GEMM (where the CPU
    has an exact one) or in float32 chunks: the same simulation, bit for bit."""
    from codec_tosa.validation import integer_products
    from codec_tosa.planning.calibration import lifted_args
    from codec_tosa.validation.simulation import IntegerSimulator

    _, example, shape, lowered = _lowered(name, 0, "W")
    sim = lowered.planned.materialized()
    args = lifted_args(sim, (torch.randn(shape, generator=torch.Generator().manual_seed(7)),))
    with torch.no_grad():
        gemm = IntegerSimulator(sim.graph_module).run(*args)
        monkeypatch.setattr(integer_products, "int8_weight", lambda w: None)
        chunks = IntegerSimulator(sim.graph_module).run(*args)
    assert torch.equal(gemm[0], chunks[0])


def test_decodes_left_out_are_computed_when_read() -> None:
    """A decode read only by compute operators is left out while they run on codes;
    one that cannot (forced here, every one) decodes its inputs first, also once the
    codes' own value is freed: the materialised program's result, in eager."""
    from unittest import mock

    from codec_tosa.planning.calibration import lifted_args
    from codec_tosa.validation.simulation import IntegerSimulator

    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, padding=1)).eval()
    example = (torch.randn(1, 3, 12, 12, generator=torch.Generator().manual_seed(0)),)
    lowered = lower_program(torch.export.export(model, example), CodecSpec(policy="W"), [example])
    sim = lowered.planned.materialized()
    with torch.no_grad(), mock.patch.object(IntegerSimulator, "_accumulate", lambda self, n, key: None):
        outs, stats = simulate_with_stats(lowered.planned, example)
        eager = torch.fx.Interpreter(sim.graph_module).run(*lifted_args(sim, example))
    assert stats.float_fallbacks  # the convolutions, in float
    assert torch.equal(outs[0], eager[0] if isinstance(eager, (tuple, list)) else eager)


def test_an_accumulator_leaves_int32_before_it_could_wrap() -> None:
    """The int8 GEMM's int32 sums stay int32 with their bias only while the sum fits."""
    from codec_tosa.validation.simulation import _plus_bias

    bias = torch.tensor([[20], [-20]])
    kept = _plus_bias(torch.tensor([[5], [-5]], dtype=torch.int32), bias)
    assert kept.dtype == torch.int32 and kept.tolist() == [[25], [-25]]
    edge = torch.tensor([[2 ** 31 - 10], [-2 ** 31 + 10]], dtype=torch.int32)
    widened = _plus_bias(edge.clone(), bias)
    assert widened.dtype == torch.int64 and widened.tolist() == [[2 ** 31 + 10], [-2 ** 31 - 10]]


def test_multiplier_and_shift_match_arm():
    """The RESCALE constants are the ones Arm serialises (pins executorch 1.5.1)."""
    from executorch.backends.arm.operators.op_tosa_rescale import _compute_multiplier_and_shift

    rng = random.Random(0)
    scales = [2.0 ** rng.uniform(-40, 0.9) for _ in range(2000)]
    scales += [1.0, 0.5, 0.25 * (1 - 2**-40), 1 - 2**-33, 2.0**-62, 1e-19]  # rounding edges, capped shift
    multipliers, shifts = _compute_multiplier_and_shift(scales, 32)
    assert [multiplier_and_shift(s) for s in scales] == list(zip(multipliers, shifts))


def test_rescale_rounds_half_up_and_saturates():
    # scale 0.5: v/2 exactly, ties (odd v) go towards +inf; zero points around it
    v = torch.tensor([-5, -3, -1, 1, 3, 5, 1000, -1000])
    out = rescale(v, [0.5], input_zp=0, output_zp=0, out_dtype=torch.int8)
    assert out.tolist() == [-2, -1, 0, 1, 2, 3, 127, -128]
    out = rescale(torch.tensor([10, 11]), [0.5], input_zp=1, output_zp=-3, out_dtype=torch.int8)
    assert out.tolist() == [math.floor(9 / 2 + 0.5) - 3, 5 - 3]
    per_channel = rescale(torch.tensor([[4, 4], [4, 4]]), [0.25, 1.0], 0, 0, torch.int8, channel_axis=0)
    assert per_channel.tolist() == [[1, 1], [4, 4]]


def _policy_i_mismatches(lowered: Any, inputs: list[tuple[torch.Tensor, ...]]) -> int:
    """Output elements where the ExecuTorch runtime (CPU quantize, the delegate on
    the TOSA reference model) differs from the simulation, over `inputs`."""
    from codec_tosa.runtime.executorch_runner import run_pte
    from codec_tosa.validation.simulation import simulate

    bad = 0
    for x in inputs:
        got, want = run_pte(lowered.pte, list(x))[0], simulate(lowered.planned, x)[0]
        bad += int((got.reshape(want.shape) != want).sum())
    return bad


def _rounding_splits(scale: float) -> torch.Tensor:
    """float32 values within 8 ulps of k + 1/2 steps that ExecuTorch's quantize
    kernel (times the float32 reciprocal of the scale) and PyTorch's reference
    quantize round to different codes (there are some for about one scale in six)."""
    k = torch.arange(-100, 100, dtype=torch.float64) + 0.5
    tie = (k * scale).to(torch.float32)
    near, up, down = [tie], tie, tie
    for _ in range(8):
        up, down = torch.nextafter(up, up + 1), torch.nextafter(down, down - 1)
        near += [up, down]
    values = torch.cat(near)
    inv = torch.tensor(1.0) / torch.tensor(scale, dtype=torch.float32)
    executorch = torch.round(values * inv)
    reference = torch.ops.quantized_decomposed.quantize_per_tensor(
        values, scale, 0, -128, 127, torch.int8).to(torch.float32)
    return values[executorch != reference]


def test_policy_i_input_encode_rounds_as_executorchs_kernel() -> None:
    """At policy I the input is encoded on the CPU by ExecuTorch's quantize
    kernel; on the values where its rounding and PyTorch's reference quantize
    disagree (near k + 1/2 steps), the simulation rounds as the kernel does
    (found on U-Net's input: one code, then 0.8 steps at the output)."""
    import small_models

    model, x = small_models.conv_relu6_conv()
    # an input range whose symmetric scale has such values
    amax = next(a for a in (torch.tensor(4.0 + 0.01 * i).item() for i in range(300))
                if _rounding_splits(a / 127).numel() > 0)
    gen = torch.Generator().manual_seed(0)
    calibration = []
    for _ in range(4):
        c = torch.clamp(torch.randn(x[0].shape, generator=gen), -amax, amax)
        c.view(-1)[0] = amax
        calibration.append((c,))
    low = lower_program(torch.export.export(model, x),
                        CodecSpec("I", observer="minmax", symmetric_activations=True), calibration)
    split = _rounding_splits(amax / 127)
    held = torch.Generator().manual_seed(1234)
    inputs = [(split[torch.randint(0, split.numel(), x[0].shape, generator=held)],) for _ in range(2)]
    assert _policy_i_mismatches(low, inputs) == 0


def test_policy_i_residual_adds_are_simulated_in_int32() -> None:
    """ResNet basic blocks at I: Arm lowers each residual add through int32
    RESCALEs; the simulation does the same (adding the decoded values in FP32
    instead left U-Net 10 steps off), so the runtime equals it on held-out
    inputs."""
    import small_models
    from codec_tosa.validation.samples import held_out_inputs

    model, x = small_models.residual_stack()
    low = lower_program(torch.export.export(model, x), CodecSpec("I"), small_models.calibration(x))
    samples = held_out_inputs(x, 8)
    assert _policy_i_mismatches(low, samples) == 0
    _, stats = simulate_with_stats(low.planned, samples[0])
    adds = [n for n in stats.integer_ops if n.startswith("aten_add")]
    assert len(adds) == 4, stats.integer_ops  # one per block, each on codes


class _AvgPool(nn.Module):
    def __init__(self, kernel: int, stride: int, padding: int) -> None:
        super().__init__()
        self.kernel, self.stride, self.padding = kernel, stride, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, self.kernel, self.stride, self.padding, count_include_pad=False)


@pytest.mark.parametrize("kernel,stride,padding", [(2, 2, 0), (3, 1, 1), (3, 2, 1)])
@pytest.mark.parametrize("shift", [-1.0, 1.0])  # a negative and a positive zero point
def test_policy_i_avg_pool_is_simulated_as_tosa_computes_it(kernel: int, stride: int, padding: int,
                                                             shift: float) -> None:
    """INT8 AVG_POOL2D on codes chosen to put window sums on ties, held out from
    calibration: the simulation equals the reference model bit for bit, including
    which way a tie rounds, which follows the zero point Arm actually serialises."""
    from codec_tosa.serialization.tosa_stats import iter_constants, iter_operators
    from codec_tosa.validation.simulation import arm_pool_zero_point

    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(1, 4, 10, 10, generator=gen) + shift,)
    low = lower_program(torch.export.export(_AvgPool(kernel, stride, padding).eval(), x), CodecSpec("I"), [x])
    payload = delegate_payload(low.pte)
    encode = next(n for n in low.planned.materialized().graph.nodes if "quantize_per_tensor" in str(n.target))
    scale, zp = float(encode.args[1]), int(encode.args[2])
    assert zp != 0
    # upstream (executorch 1.5.1): the pool's zero points are its zero point quantized
    # as a value, saturated; when this fails Arm has fixed it and the simulation must follow
    consts = {c.name: c.data for c in iter_constants(payload)}
    (pool,) = [op for op in iter_operators(payload) if op.op == "AVG_POOL2D"]
    serialised = [int.from_bytes(consts[name], "little", signed=True) for name in pool.inputs[1:]]
    assert serialised == [arm_pool_zero_point(scale, zp)] * 2 == [-128 if zp < 0 else 127] * 2
    # codes whose window sums are often exact halves (pairs of neighbours differ by one)
    codes = torch.randint(-60, 60, (1, 4, 10, 10), generator=gen, dtype=torch.int8)
    codes[..., 1::2] = codes[..., ::2] + 1
    held_out = ((codes.float() - zp) * scale,)
    (ref,) = run_reference_model(payload, [codes.numpy()], "avg_pool")
    sim, stats = simulate_with_stats(low.planned, held_out)
    assert stats.integer_ops and not stats.float_fallbacks
    expected = (torch.from_numpy(ref).reshape(sim[0].shape).float() - zp) * scale
    assert torch.equal(expected, sim[0])


class _Bilinear(nn.Module):
    def __init__(self, size: tuple[int, int], align_corners: bool) -> None:
        super().__init__()
        self.size, self.align_corners = size, align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=self.size, mode="bilinear", align_corners=self.align_corners)


@pytest.mark.parametrize("size,align_corners", [((10, 12), False), ((10, 12), True), ((7, 13), False),
                                                ((5, 17), True)])
def test_policy_i_bilinear_resize_is_simulated_as_tosa_computes_it(size: tuple[int, int],
                                                                   align_corners: bool) -> None:
    """INT8 bilinear upsampling (Arm: RESIZE on the codes, then a RESCALE by
    1/(scale_y_n * scale_x_n)) on codes chosen to put the interpolations on ties,
    held out from calibration: the simulation equals the reference model bit for
    bit, for integer and fractional ratios, half-pixel and aligned corners."""
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(1, 3, 5, 6, generator=gen),)
    module = _Bilinear(size, align_corners).eval()
    low = lower_program(torch.export.export(module, x), CodecSpec("I"), [x])
    payload = delegate_payload(low.pte)
    graph = low.planned.materialized().graph
    encode = next(n for n in graph.nodes if "quantize_per_tensor" in str(n.target))
    scale, zp = float(encode.args[1]), int(encode.args[2])
    for k in range(3):
        codes = torch.randint(-128, 128, (1, 3, 5, 6), generator=gen, dtype=torch.int8)
        if k:  # neighbours one code apart: interpolations land on exact halves
            codes[..., 1::2] = (codes[..., ::2].int() + 1).clamp(-128, 127).to(torch.int8)
        (ref,) = run_reference_model(payload, [codes.numpy()], "resize")
        sim, stats = simulate_with_stats(low.planned, [(codes.float() - zp) * scale])
        assert stats.integer_ops and not stats.float_fallbacks
        expected = (torch.from_numpy(ref).reshape(sim[0].shape).float() - zp) * scale
        assert torch.equal(expected, sim[0]), f"{size} align_corners={align_corners}: codes {k}"


class _Extremum(nn.Module):
    def __init__(self, op: str) -> None:
        super().__init__()
        self.op = getattr(torch, op)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.op(x, y)


@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_policy_i_maximum_and_minimum_are_simulated_in_int32(op: str) -> None:
    """INT8 maximum/minimum (Arm: both operands RESCALEd to int32 at the smaller
    scale, the int32 MAXIMUM/MINIMUM, one RESCALE to the output's codes), on every
    code of x against a spread of codes of y, held out from calibration: the
    simulation equals the reference model bit for bit (in float, decoded operands
    then an encode, the output was a step off on Arm's fp16 cases)."""
    gen = torch.Generator().manual_seed(7)
    example = (torch.randn(1, 64, generator=gen), 2.7 * torch.randn(1, 64, generator=gen))
    calibration = [example, (torch.randn(1, 64, generator=gen), 2.7 * torch.randn(1, 64, generator=gen))]
    low = lower_program(torch.export.export(_Extremum(op).eval(), example), CodecSpec("I"), calibration)
    payload = delegate_payload(low.pte)
    encodes = [n for n in low.planned.materialized().graph.nodes
               if "quantize_per_tensor" in str(n.target) and "dequantize" not in str(n.target)][:2]
    (sx, zx), (sy, zy) = ((float(n.args[1]), int(n.args[2])) for n in encodes)
    assert sx != sy  # each operand has its own domain: one of them is RESCALEd to the other's scale
    decode = next(n for n in reversed(low.planned.materialized().graph.nodes) if "dequantize" in str(n.target))
    s_out, z_out = float(decode.args[1]), int(decode.args[2])
    # every code of x against 16 codes of y spread over its range, 64 pairs a run
    cx = torch.arange(-128, 128, dtype=torch.int8).repeat_interleave(16).reshape(64, 1, 64)
    cy = torch.linspace(-128, 127, 16).round().to(torch.int8).repeat(256).reshape(64, 1, 64)
    for codes in zip(cx, cy):
        (ref,) = run_reference_model(payload, [c.numpy() for c in codes], op)
        sim, stats = simulate_with_stats(low.planned, [(codes[0].float() - zx) * sx, (codes[1].float() - zy) * sy])
        assert stats.integer_ops and not stats.float_fallbacks
        expected = (torch.from_numpy(ref).reshape(sim[0].shape).float() - z_out) * s_out
        assert torch.equal(expected, sim[0])


def test_fp32_steps_of_index_and_rank0_outputs_are_zero() -> None:
    """A non-float output is compared exactly (step 0), a rank-0 one included
    (argmax of a vector: its slice crashed the reference stage)."""
    assert fp32_steps([torch.tensor(3), torch.tensor([1, 2]), torch.tensor(True)]) == [0.0, 0.0, 0.0]
    assert fp32_steps([torch.tensor([0.0, 2.55, float("inf")]), torch.tensor(1.5)]) == pytest.approx([0.01, 0.0])
