"""Policies V and I (docs/DESIGN.md, "Policy"; issue 11): the integer-target rows of
the commutation table, proven on the TOSA reference model."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest
import torch

from codec_tosa.quantizer.search import sqnr_db
from codec_tosa.runtime.executorch_runner import run_pte
from codec_tosa.runtime.pte import delegate_payload, delegates, inspect_pte
from codec_tosa.serialization.tosa_stats import iter_constants, rescale_neighbours, tosa_stats
from codec_tosa.validation.simulation import simulate
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.cli import main
from codec_tosa.tools.compiler import compile_model
from codec_tosa.validation.reference_model import run_reference_model
from codec_tosa.tools.report import IO_KERNELS
from codec_tosa.validation.validate import ValidationError, Verdict, validate

import small_models
from tosa_queries import float_operators, operator_dtypes

SAMPLES = 4  # held-out samples compile stores and validate checks


def _integer_between_convs(payload: bytes) -> list[tuple[str, list[str], list[str]]]:
    """The operators after the first CONV2D and up to the last one."""
    ops = list(operator_dtypes(payload))
    convs = [i for i, (op, _, _) in enumerate(ops) if op == "CONV2D"]
    assert len(convs) >= 2
    return ops[convs[0]:convs[-1] + 1]


def _matches_simulation(low, x) -> None:
    payload = delegate_payload(low.pte)
    ref = run_reference_model(payload, [t.numpy() for t in x], "test")
    sim = simulate(low.planned, x)
    steps = low.planned.output_steps([0.0] * len(sim))
    for r, s, step in zip(ref, sim, steps):
        assert step > 0  # every output is decoded from a domain
        assert np.max(np.abs(r.reshape(s.shape) - s.numpy())) <= step * (1 + 1e-4)


def test_relu6_at_w_is_fp32(lowered):
    low = lowered("conv_relu6_conv", "W")
    between = _integer_between_convs(delegate_payload(low.pte))
    assert any("FP32" in ins + outs for _, ins, outs in between)


def test_relu6_at_v_stays_on_codes(lowered):
    """conv -> relu6 -> conv at V: one CLAMP on INT8 between the convolutions, no FP32."""
    low = lowered("conv_relu6_conv", "V")
    assert inspect_pte(low.pte).operators == ()
    between = _integer_between_convs(delegate_payload(low.pte))
    assert all("FP32" not in ins + outs for _, ins, outs in between), between
    assert ("CLAMP", ["INT8"], ["INT8"]) in between
    _matches_simulation(low, small_models.conv_relu6_conv()[1])


@pytest.mark.parametrize("policy", ["V", "W"])
def test_conv_relu6_domain_is_calibrated_after_the_relu6(lowered, policy):
    """conv -> relu6 -> conv: the conv's output domain learns its theta on the
    relu6's output (zero point at the code minimum, scale from its maximum),
    not on the conv's, whose negative half the relu6 drops: at V the relu6
    runs on its codes (a CLAMP), at W on their decode in FP32; the artefact
    still equals the simulation."""
    import torch

    model, x = small_models.conv_relu6_conv()
    low = lowered("conv_relu6_conv", policy, observer="minmax")  # the scale below is minmax's
    plan = low.planned.placement.plan
    graph = low.planned.graph
    relu6 = next(o for o in range(graph.num_ops) if graph.op_target[o] == "aten.hardtanh.default")
    out = graph.op_out[relu6][0]
    d = plan.value_domain[graph.in_value[graph.op_in[relu6][0]]]  # the conv's output domain
    assert d >= 0 and plan.domains[d].observe == out
    with torch.no_grad():
        pre = [model.a(*c) for c in small_models.calibration(x)]
    hi = max(float(torch.clamp(t, 0, 6).max()) for t in pre)
    assert min(float(t.min()) for t in pre) < -0.1  # the relu6 does drop something
    theta = low.planned.thetas[d]
    assert theta.zero_point == theta.qmin
    assert theta.scale == pytest.approx(hi / 255, rel=1e-6)
    _matches_simulation(low, x)


_IO_KERNELS = {"quantized_decomposed::quantize_per_tensor", "quantized_decomposed::dequantize_per_tensor"}


def test_mobile_block_at_i_is_one_integer_delegate(lowered):
    """conv+BN+ReLU6, depthwise, residual add, cat, shuffle, avg-pools, linear:
    one TOSA-1.0+INT delegate, no floating-point operator in it; only the input
    encode and output decode run on the CPU (as in Arm's INT8 flow); every relu6
    follows a convolution and is folded into its RESCALE, as Arm folds it."""
    from codec_tosa.runtime.pte import delegate_provenance
    from codec_tosa.serialization.tosa_stats import tosa_stats

    low = lowered("mobile_block", "I")
    info = inspect_pte(low.pte)
    assert info.delegate_ids == ("CodecTosaBackend",)
    assert set(info.operators) <= IO_KERNELS
    payload = delegate_payload(low.pte)
    assert float_operators(payload) == []
    ops = tosa_stats(payload).operators_by_type
    assert {"ADD", "AVG_POOL2D", "CONCAT", "DEPTHWISE_CONV2D"} <= set(ops) and "CLAMP" not in ops
    assert delegate_provenance(low.pte)["spec"]["tosa"] == "TOSA-1.0+INT"


def test_target_needs_policy_i_and_a_known_target():
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.spec import CodecSpec

    with pytest.raises(ValueError, match="needs policy='I'"):
        CodecSpec(policy="W", target="ethos-u55-128")
    with pytest.raises(ValueError, match="unknown Ethos-U target 'ethos-u99-7'"):
        arm_adapter.ethos_u_compile_spec("ethos-u99-7")


def test_ethos_u55_delegate_is_vela(lowered):
    """--target ethos-u55-128: one EthosUBackend delegate (Vela's command stream)
    and Vela's summary of the TOSA it was given, which is all-integer."""
    low = lowered("mobile_block", "I", target="ethos-u55-128")
    info = inspect_pte(low.pte)
    assert info.delegate_ids == ("EthosUBackend",)
    assert list(low.files) == ["model.tosa"] and float_operators(low.files["model.tosa"]) == []
    vela = low.report["vela"]
    assert vela["cycles_total"] > 0 and vela["npu_ops"] > 0
    # Vela's own count: it left nothing to the CPU; the program's CPU operators are the I/O kernels
    assert vela["cpu_ops"] == 0 and vela["program_cpu_ops"] == sorted(info.operators)


@pytest.fixture(scope="module")
def compiled() -> Iterator[Callable[..., Path]]:
    """``compiled("integer_activations", "ethos-u55-128")``: the directory `compile`
    wrote for a tests/support/small_models builder at policy I (once per module)."""
    import tempfile

    done: dict[tuple[str, str], Path] = {}
    root = Path(tempfile.mkdtemp(prefix="codec-tosa-policy-i-"))

    def get(model: str, target: str = "tosa") -> Path:
        if (model, target) not in done:
            out = root / f"{model}-{target}"
            compile_model(f"{small_models.__file__}:{model}", CodecSpec("I", target=target), out,
                          progress=False, samples=SAMPLES)
            done[model, target] = out
        return done[model, target]

    yield get
    shutil.rmtree(root, ignore_errors=True)


def _passes(pte: Path) -> None:
    v = validate(pte)
    assert v.verdict is Verdict.PASS and v.cases == 1 + SAMPLES, "\n".join(v.lines())
    assert all(d.complete for d in v.delegates) and v.expected == "simulation"


def test_sub_mul_and_table_activations_are_one_integer_delegate(compiled) -> None:
    """sub, mul, sigmoid, tanh, hardswish, silu, gelu at I: one TOSA-1.0+INT delegate
    with no FP32 tensor (SUB, MUL, TABLE: silu is one TABLE, as Arm keeps it whole
    between q/dq), equal to the simulation on held-out samples."""
    pte = compiled("integer_activations") / "model.pte"
    data = pte.read_bytes()
    info = inspect_pte(data)
    assert info.delegate_ids == ("CodecTosaBackend",) and set(info.operators) <= IO_KERNELS
    payload = delegate_payload(data)
    assert float_operators(payload) == []
    ops = tosa_stats(payload).operators_by_type
    # sigmoid, tanh, hardswish, gelu and silu; the one mul
    assert (ops["TABLE"], ops["SUB"], ops["MUL"], ops["CONV2D"]) == (5, 1, 1, 7)
    _passes(pte)


def test_softmax_and_layer_norm_are_integer_as_arm_decomposes_them(compiled, capsys) -> None:
    """At I the softmax and the layer norm are decomposed as Arm's INT8 flow
    decomposes them (before annotation) and run in one all-integer delegate:
    the softmax as REDUCE_MAX, SUB, exp and reciprocal TABLEs, REDUCE_SUM, MUL;
    the layer norm's means as sums times 1/N, its rsqrt as a TABLE. `report`
    names nothing left on the CPU but the I/O kernels."""
    pte = compiled("token_norms") / "model.pte"
    data = pte.read_bytes()
    assert set(inspect_pte(data).operators) <= IO_KERNELS
    (payload,) = [d.payload for d in delegates(data)]
    assert float_operators(payload) == []
    ops = tosa_stats(payload).operators_by_type
    # the softmax's sum, the layer norm's mean and its mean of squares
    assert ops["REDUCE_MAX"] == 1 and ops["TABLE"] == 3 and ops["REDUCE_SUM"] == 3
    assert main(["report", str(pte)]) == 0
    assert ("not integer at policy I (left on the CPU in FP32): none"
            in capsys.readouterr().out.splitlines())
    _passes(pte)


def test_an_ethos_u_pte_is_validated_on_the_tosa_vela_was_given(compiled, capsys) -> None:
    """Nothing here runs Vela's command stream: validate runs the program with
    model.tosa in its place (the CPU quantize and dequantize on ExecuTorch's
    kernels), checks that call on the reference model and the outputs against
    the simulation, and says so."""
    pte = compiled("integer_activations", "ethos-u55-128") / "model.pte"
    assert inspect_pte(pte.read_bytes()).delegate_ids == ("EthosUBackend",)
    _passes(pte)
    assert main(["validate", str(pte)]) == 0
    out = capsys.readouterr().out
    assert "note: Vela's command stream itself is not executed here" in out and out.endswith("PASS\n")
    assert main(["report", str(pte)]) == 0
    assert "EthosUBackend (Ethos-U), Ethos-U " in capsys.readouterr().out


def test_an_ethos_u_pte_without_or_with_a_broken_model_tosa(compiled, tmp_path, capsys) -> None:
    src = compiled("integer_activations", "ethos-u55-128")
    for name in ("model.pte", "reference_io.npz"):
        shutil.copy(src / name, tmp_path / name)
    pte = tmp_path / "model.pte"
    with pytest.raises(ValidationError, match="there is no model.tosa beside the .pte"):
        validate(pte)
    assert main(["validate", str(pte)]) == 2

    tosa = (src / "model.tosa").read_bytes()
    (tmp_path / "model.tosa").write_bytes(tosa[: len(tosa) // 2])
    with pytest.raises(ValidationError, match="model.tosa: the EthosUBackend delegate is unusable"):
        validate(pte)

    # a TOSA flatbuffer that is not what Vela compiled: its largest INT8 constant inverted
    largest = max((c.data for c in iter_constants(tosa) if c.dtype == "INT8"), key=len)
    assert tosa.count(largest) == 1
    (tmp_path / "model.tosa").write_bytes(tosa.replace(largest, bytes(255 - b for b in largest)))
    v = validate(pte)
    assert v.verdict is Verdict.FAIL and v.exit_status == 1, "\n".join(v.lines())
    capsys.readouterr()


def _rescales_fed_by(payload: bytes, producer: str) -> int:
    return rescale_neighbours(payload)[0][producer]


def test_policy_i_shares_a_concatenation_with_its_inputs_domain(lowered, compiled):
    """Inception reduction at I: by default (nonlocal+share) the max-pool branch
    joins the cat's domain although the stem's output also feeds a convolution,
    so no RESCALE follows the MAX_POOL2D (nonlocal+coalesce keeps one); the
    domain learns its theta from the union of the stem's and the cat's ranges,
    and the TOSA still equals the simulation."""
    import torch

    model, x = small_models.inception_reduction()
    share = lowered("inception_reduction", "I", observer="minmax")
    coalesce = lowered("inception_reduction", "I", "nonlocal+coalesce", observer="minmax")
    assert share.planned.placement.placement == "nonlocal+share"
    assert _rescales_fed_by(delegate_payload(coalesce.pte), "MAX_POOL2D") == 1
    assert _rescales_fed_by(delegate_payload(share.pte), "MAX_POOL2D") == 0
    plan, graph = share.planned.placement.plan, share.planned.graph
    (d,) = [d for d in plan.domains if d.shared]
    observed = {graph.fx_value_node[v].name for v in d.observed}
    with torch.no_grad():
        stem = [model.stem(*c) for c in small_models.calibration(x)]
        cat = [torch.cat([model.branch(t), model.pooled(t)], 1) for t in stem]
    assert len(observed) == 2
    lo = min(float(t.min()) for t in stem + cat)
    hi = max(float(t.max()) for t in stem + cat)
    theta = share.planned.thetas[d.id]
    # the relu'd range [0, hi] at the code minimum and the scale from the union's maximum
    assert lo == 0.0 and theta.zero_point == theta.qmin
    assert theta.scale == pytest.approx(hi / 255, rel=1e-5)
    assert max(float(t.max()) for t in cat) < hi  # the stem's range is the wider
    _passes(compiled("inception_reduction") / "model.pte")


def test_a_relu_whose_domain_holds_negative_values_is_not_folded(tmp_path: Path) -> None:
    """Arm's fold saturates at -128, so where a cat gives the relu's domain x's
    negative values (zero point above -128) it would lose the relu (U-Net 256 at
    3.6 dB for 12.3 in simulation). Such a relu stays a CLAMP; on held-out inputs
    its half of the output is non-negative, and the output is eager's to INT8 noise."""
    module, (x,) = small_models.conv_relu_cat_input()
    compile_model(f"{small_models.__file__}:conv_relu_cat_input", CodecSpec("I"), tmp_path, progress=False,
                  samples=SAMPLES)
    pte = tmp_path / "model.pte"
    _passes(pte)
    ops = tosa_stats(delegate_payload(pte.read_bytes())).operators_by_type
    assert ops.get("CLAMP") == 1, ops
    for seed in range(3):
        held_out = torch.randn(x.shape, generator=torch.Generator().manual_seed(100 + seed))
        (out,) = run_pte(pte.read_bytes(), [held_out])
        with torch.no_grad():
            eager = module(held_out)
        assert float(out[:, :4].min()) >= 0.0
        assert sqnr_db([eager], [out.reshape(eager.shape)]) > 30.0  # INT8 codes: about 40 dB


def test_relus_whose_domain_holds_only_non_negative_values_stay_folded(tmp_path: Path) -> None:
    """Through a max pool, an upsampling and a cat every value of the cat's domain is
    a relu's: both relus fold into their convolutions (no CLAMP), as Arm folds them."""
    compile_model(f"{small_models.__file__}:conv_relu_cat_pooled", CodecSpec("I"), tmp_path, progress=False,
                  samples=SAMPLES)
    pte = tmp_path / "model.pte"
    _passes(pte)
    ops = tosa_stats(delegate_payload(pte.read_bytes())).operators_by_type
    assert "CLAMP" not in ops and ops.get("CONV2D") == 2, ops


def test_symmetric_activations_fold_the_relu6_at_the_lowest_code(tmp_path: Path) -> None:
    """With zero point 0 Arm's FuseQuantizedActivationPass drops the relu6 into a
    RESCALE that saturates at -128, not at the code of 0.0: the relu6 is lost (a
    trained ResNet-8 fell to 10% top-1). A folded activation's domain keeps zero
    point -128 even with symmetric activations; every other domain is symmetric."""
    compile_model(f"{small_models.__file__}:conv_relu6_conv", CodecSpec("I", symmetric_activations=True),
                  tmp_path, progress=False, samples=SAMPLES)
    pte = tmp_path / "model.pte"
    _passes(pte)
    info = inspect_pte(pte.read_bytes())
    assert len(info.delegate_ids) == 1 and set(info.operators) <= IO_KERNELS, info.operators
    ops = tosa_stats(delegate_payload(pte.read_bytes())).operators_by_type
    assert "CLAMP" not in ops, ops  # folded, as Arm folds it
