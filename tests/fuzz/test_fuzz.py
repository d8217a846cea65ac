"""Fuzzing the whole path (issue 6): random small modules from conv, linear, cat,
reshape/permute/pad/slice, add, relu and batch norm, with random shapes and
fan-out. For each: the analysis invariants at every policy and placement, and
the compiled .pte validated on the TOSA reference model and in the ExecuTorch
runtime (`validate`: Z within 1e-4 relative of eager; Y/X/W/V/I within one
quantisation step of the PyTorch simulation of the plan). At policy I (TOSA-1.0+INT)
every delegate is all-integer and only the input encodes and output decodes run on
the CPU.

Every compiled example is validated on its example input and held-out samples
(`validate --samples`): 2 in the fast profile, 16 in the long one.

Fast profile (CI, `make test`): a few examples per policy/placement, derandomised.
Long profile (`make fuzz`): CODEC_TOSA_FUZZ_EXAMPLES=N runs about N compiled
examples in all, randomly.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.batch_norm_convolutions import BatchNormConvolutionsPass
from codec_tosa.arm.pipeline import CodecPermuteUpPass
from codec_tosa.planning.analysis import analyze, port_graph
from codec_tosa.commutation.policy import INTEGER_POLICY
from codec_tosa.planning.calibration import random_calibration
from codec_tosa.targets.artefacts import PTE, REFERENCE_IO
from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.reference_io import reference_outputs
from codec_tosa.validation.simulation import simulate
from codec_tosa.placement import COALESCE, LOCAL, NONLOCAL, PLACEMENTS, SHARE
from codec_tosa.runtime.executorch_runner import run_pte
from codec_tosa.runtime.pte import PteInfo, inspect_pte
from codec_tosa.runtime.pte import delegate_payload, delegates

from codec_tosa.validation.samples import held_out_inputs
from codec_tosa.validation.validate import Z_RTOL, Validation, ValidationError, Verdict, validate
from codec_tosa.serialization.tosa_stats import tosa_stats
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.report import IO_KERNELS

from fuzz_models import Recipe, Step, build, recipes
from tosa_queries import float_operators

LONG = int(os.environ.get("CODEC_TOSA_FUZZ_EXAMPLES", "0"))
# `make fuzz` appends one JSON line per compiled example here (benchmarks/fuzz_summary.py)
RECORD = os.environ.get("CODEC_TOSA_FUZZ_RECORD")
# shared observation at W and at I (its default), to keep the fast profile short
COMBOS = [("Z", COALESCE)] + [(p, pl) for p in "YXWVI" for pl in PLACEMENTS
                              if pl != SHARE or p in "WI"]
FAST_PER_COMBO = 2  # 12 compiled examples in `make test`, 36 with `make test-slow`
# held-out samples per compiled example: simulate and run are milliseconds on these modules
SAMPLES = int(os.environ.get("CODEC_TOSA_FUZZ_SAMPLES", "16" if LONG else "2"))
PER_COMBO = max(1, math.ceil(LONG / len(COMBOS))) if LONG else FAST_PER_COMBO
SETTINGS = settings(
    max_examples=PER_COMBO, deadline=None, derandomize=not LONG, database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True)


def check_analysis(recipe: Recipe) -> None:
    """Every domain has an absolute dominator (independent check) at every policy
    and placement, on the exported graph and on the graph the partitioner sees
    (batch norms folded), or dominators cutting it under shared observation;
    traffic share <= coalesce <= nonlocal <= local; Z has no codecs."""
    model, inputs = build(recipe)
    ep = torch.export.export(model, inputs)
    for fold in (False, True):
        graph = port_graph(ep, fold)
        for policy in "ZYXWVI":
            t = {pl: analyze(graph, policy, pl, verify=True).traffic for pl in PLACEMENTS}
            assert t[SHARE].traffic_bytes <= t[COALESCE].traffic_bytes <= t[NONLOCAL].traffic_bytes \
                <= t[LOCAL].traffic_bytes, recipe
            if policy == "Z":
                assert t[COALESCE].codec_items == 0
                assert t[COALESCE].traffic_bytes == t[COALESCE].lower_bound_bytes


def compile_and_validate(recipe: Recipe, policy: str, placement: str, out: Path) -> None:
    model, inputs = build(recipe)
    v = compile_and_validate_module(model, inputs, recipe.seed, policy, placement, out, str(recipe))
    info = inspect_pte((out / PTE).read_bytes()) if v is not None else None
    if info is not None and not info.operators and len(info.delegate_ids) == 1:
        # one delegate is the whole program, so its inputs and outputs are the
        # program's: everything must have been compared
        assert v is not None and v.reference_model_ran, recipe
        assert v.verdict is Verdict.PASS, "\n".join(v.lines())
    if RECORD:
        record(recipe, policy, placement, v, info)


def record(recipe: Recipe, policy: str, placement: str, v: Validation | None, info: PteInfo | None) -> None:
    """One passed example, for the long profile's summary."""
    line = {
        "policy": policy, "placement": placement, "steps": [s.kind for s in recipe.steps],
        "outputs": len(recipe.outputs), "delegates": len(info.delegate_ids) if info else 0,
        "cpu_operators": sorted(set(info.operators)) if info else [],
        "reference_model_ran": bool(v and v.reference_model_ran),
        "verdict": v.verdict.value if v else None,
        "max_steps": max((o.steps or 0.0 for o in v.outputs), default=0.0) if v else 0.0,
        "outputs_compared_on_reference_model": sum(
            not math.isnan(o.ref_vs_runtime_max_abs) for o in v.outputs) if v else 0,
        "max_fraction_of_tolerance": max(
            ((o.vs_expected_max_abs or 0.0) / o.tolerance if o.tolerance else 0.0 for o in v.outputs),
            default=0.0) if v else 0.0,
    }
    with open(RECORD, "a") as f:  # one short write per line: shards can share the file
        f.write(json.dumps(line) + "\n")


def compile_and_validate_module(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], seed: int,
                                policy: str, placement: str, out: Path, what: str) -> Validation | None:
    """Compile, write the .pte and reference_io.npz as compile does, validate;
    None for a program with nothing delegated (checked against eager here)."""
    calib = [inputs] + random_calibration(inputs, 2, seed=seed)
    program = torch.export.export(model, inputs)
    spec = CodecSpec(policy, placement)
    lowered = lower_program(program, spec, calib)
    part = lowered.planned
    with torch.no_grad():
        eager = list(model(*inputs))
    info = inspect_pte(lowered.pte)
    if not info.delegate_ids:
        # nothing worth delegating (layout operators Arm drops, a lone batch
        # norm): a CPU-only program, which must still compute the model. Its
        # kernels round differently from eager's, so it is held to validate's
        # policy-Z criterion, not to allclose
        outs = run_pte(lowered.pte, list(inputs))
        assert all(float((o.reshape(e.shape) - e).abs().max()) <= Z_RTOL * float(e.abs().max())
                   for o, e in zip(outs, eager) if e.numel()), what
        # (at policy I the compiler drops a plan nothing was delegated for)
        assert part is None or not part.placement or not part.placement.plan.codecs, what
        return None
    if policy == INTEGER_POLICY:  # TOSA-1.0+INT: no FP32 tensor in any delegate
        assert all(float_operators(d.payload) == [] for d in delegates(lowered.pte)), what
    held_out = held_out_inputs(inputs, SAMPLES)
    out.mkdir(parents=True, exist_ok=True)
    (out / PTE).write_bytes(lowered.pte)
    # as compile writes it (its envelope included), with the planned FP32 oracle
    reference_outputs(part, model, inputs, held_out, spec, program.graph_signature).io.save(out / REFERENCE_IO)
    v = validate(out / PTE)
    report = "\n".join(v.lines()) + f"\n{what}"
    # every delegate call is recorded by the runtime and run on the reference
    # model, and every output has eager and the simulation: all is compared
    assert v.verdict is Verdict.PASS, report
    assert v.cases == 1 + SAMPLES, report
    assert v.expected == ("eager" if policy == "Z" else "simulation"), report
    assert len(v.outputs) == len(eager), report
    return v


def _tier(policy: str, placement: str) -> Any:
    """Each policy at its default placement runs in `make test`, the other
    placements in `make test-slow` (CI runs both)."""
    default = CodecSpec(policy=policy).placement
    return pytest.param(policy, placement, marks=() if placement == default else pytest.mark.slow)


@pytest.mark.parametrize("policy,placement", [_tier(*c) for c in COMBOS])
def test_fuzz_compile_validate(policy: str, placement: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    @SETTINGS
    @given(recipes(max_steps=8 if LONG else 5))
    def run(recipe: Recipe) -> None:
        check_analysis(recipe)
        compile_and_validate(recipe, policy, placement, tmp_path_factory.mktemp("fuzz"))

    run()


@settings(max_examples=max(15, LONG), deadline=None, derandomize=not LONG, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(recipes(max_steps=10))
def test_fuzz_analysis_invariants(recipe: Recipe) -> None:
    """Cheaper than compiling, so more and larger graphs."""
    check_analysis(recipe)


class Crossed(torch.nn.Module):
    """The delegate reads the inputs in the other order (b first) and writes its
    outputs in the other order; one output is an input returned as it is."""

    def __init__(self) -> None:
        super().__init__()
        self.c = torch.nn.Conv2d(3, 3, 1)
        self.d = torch.nn.Conv2d(3, 3, 1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.c(b)
        return self.d(a) + y, a, y


@pytest.mark.parametrize("policy", ["Z", "W"])
def test_validate_wires_the_delegate_as_the_program_calls_it(policy: str, tmp_path: Path) -> None:
    """Found by the long fuzz profile: the reference model must get the delegate's
    inputs, and its outputs be compared with the program outputs they become,
    as the delegate call in the .pte says (not by position in the program)."""
    torch.manual_seed(0)
    model = Crossed().eval()
    a, b = torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 4) * 3
    v = compile_and_validate_module(model, (a, b), 0, policy, COALESCE, tmp_path, "Crossed")
    assert v is not None and v.reference_model_ran
    info = inspect_pte((tmp_path / PTE).read_bytes())
    assert info.delegate_calls[0].tensor_args[:2] == (info.inputs[1], info.inputs[0])
    compared = [not math.isnan(o.ref_vs_runtime_max_abs) for o in v.outputs]
    assert compared == [True, False, True]  # output 1 is the input a


def test_lone_batch_norm_is_delegated_and_validates(tmp_path: Path) -> None:
    """Found by the long fuzz profile: a lone batch norm used to stay on the CPU,
    because its saved mean and variance (empty, and read by nobody) were taken
    for zero-size tensors. It is delegated now, as Arm's own partitioner does,
    and the delegate equals the reference model and eager (policy-Z criterion
    for an FP32 operator)."""
    recipe = Recipe(inputs=((1, 1, 4, 4),), steps=(Step("bn", (0,), ()),), outputs=(1,), seed=1)
    model, inputs = build(recipe)
    v = compile_and_validate_module(model, inputs, 1, "Y", LOCAL, tmp_path, str(recipe))
    assert v is not None and v.verdict is Verdict.PASS and len(v.delegates) == 1


CAT_TWICE = Recipe(inputs=((1, 1, 3, 4),), steps=(Step("cat", (0, 0), ()), Step("conv", (1,), (1, 3, 1))),
                   outputs=(2,), seed=0)


@pytest.mark.parametrize("policy,placement", [("Z", COALESCE), ("X", NONLOCAL)])
def test_conv_after_cat_of_one_tensor_twice(policy: str, placement: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the long fuzz profile: executorch 1.5.1's permute propagation turns
    conv(cat([x, x])) into conv(x), and the reference model's Python binding then
    crashes its process. arm_pipeline keeps such cats; validate runs the reference
    model in a child process, so without the workaround it reports the crash."""
    model, inputs = build(CAT_TWICE)
    v = compile_and_validate_module(model, inputs, 0, policy, placement, tmp_path / "kept", str(CAT_TWICE))
    assert v is not None and v.reference_model_ran
    assert "CONCAT" in tosa_stats(delegate_payload((tmp_path / "kept" / PTE).read_bytes())).operators_by_type

    if policy != "Z":
        return
    # the upstream bug is still there (when this fails, the workaround can go);
    # it is Arm's permute propagation, the same at every policy
    monkeypatch.delattr(CodecPermuteUpPass, "_maybe_split_upwards_cat_fanout")
    with pytest.raises(ValidationError, match="reference model crashed on the delegate .*input channel mismatch"):
        compile_and_validate_module(model, inputs, 0, policy, placement, tmp_path / "dropped", str(CAT_TWICE))


# a batch norm (lone: after a linear) read by another batch norm, their sum and a relu
BN_OF_BN = Recipe(inputs=((1, 2, 4, 4),), steps=(
    Step("conv", (0,), (3, 3, 1)), Step("linear", (1,), (3,)), Step("bn", (2,), ()), Step("bn", (3,), ()),
    Step("add", (4, 2), ()), Step("relu", (5,), ())), outputs=(6, 1), seed=3)


def test_batch_norm_of_a_lone_batch_norm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the long fuzz profile at V: executorch 1.5.1's FuseBatchNorm2dPass gives
    a lone batch norm a new convolution without meta["val"], and a batch norm reading
    it fails (KeyError: 'val'). BatchNormConvolutionsPass gives each lone batch norm a typed one first; the program
    compiles to one delegate and validates."""
    model, inputs = build(BN_OF_BN)
    v = compile_and_validate_module(model, inputs, 3, "V", COALESCE, tmp_path / "typed", str(BN_OF_BN))
    assert v is not None and v.verdict is Verdict.PASS and len(v.delegates) == 1

    # the upstream bug is still there (when this fails, the workaround can go)
    monkeypatch.setattr(BatchNormConvolutionsPass, "call", lambda self, gm: PassResult(gm, False))
    with pytest.raises(Exception) as failed:
        compile_and_validate_module(model, inputs, 3, "V", COALESCE, tmp_path / "untyped", str(BN_OF_BN))
    assert isinstance(_root_cause(failed.value), KeyError) and "'val'" in str(_root_cause(failed.value))


def _root_cause(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def test_recipes_build_what_they_describe() -> None:
    """The shape bookkeeping of the strategy matches what PyTorch computes
    (otherwise the fuzzer would test fewer structures than it claims)."""
    from hypothesis import find

    from fuzz_models import KINDS

    for kind in KINDS:
        recipe = find(recipes(max_steps=4), lambda r, k=kind: any(s.kind == k for s in r.steps),
                      settings=settings(database=None, derandomize=True))
        model, inputs = build(recipe)
        with torch.no_grad():
            values = list(inputs)
            for i, step in enumerate(recipe.steps):
                values.append(model._apply(i, step, [values[s] for s in step.srcs]))
        assert [tuple(v.shape) for v in values] == [tuple(s) for s in model.shapes], recipe


# Found by the long fuzz profile at policy I (reduced by hand)
FOUND_AT_I = {
    # a batch norm with no convolution to fold into kept the planning step's
    # delegation tag and went into the integer delegate, which cannot lower FP32
    "lone_bn": Recipe(
        inputs=((1, 2, 6, 4), (1, 4, 6, 4)),
        steps=(Step("reshape", (0,), (0,)), Step("cat", (2, 2), ()), Step("bn", (0,), ()), Step("relu", (3,), ()),
               Step("relu", (2,), ()), Step("bn", (3,), ())), outputs=(7,), seed=36564),
    # aten.pad, kept whole, had no integer row and no CPU kernel (aten::pad.out)
    "pad": Recipe(inputs=((1, 2, 4, 4),), steps=(Step("conv", (0,), (2, 1, 1)), Step("pad", (1,), (0, 1, 1, 0)),
                                                 Step("conv", (2,), (2, 3, 1))), outputs=(3,), seed=1),
    # nothing delegated: the plan's codecs quantized on the CPU (not the model)
    "nothing_delegated": Recipe(
        inputs=((1, 2, 6, 4), (1, 4, 6, 4)),
        steps=(Step("reshape", (0,), (0,)), Step("cat", (2, 2), ()), Step("bn", (0,), ()), Step("relu", (3,), ()),
               Step("relu", (2,), ()), Step("bn", (2,), ())), outputs=(7,), seed=36564),
}


@pytest.mark.parametrize("name", sorted(FOUND_AT_I))
def test_policy_i_compiles_what_the_fuzzer_found(name: str, tmp_path: Path) -> None:
    compile_and_validate(FOUND_AT_I[name], INTEGER_POLICY, LOCAL, tmp_path)


# slice -> zero pad -> convolution (weight (5, 4, 3, 3)), the pad also a program output
PAD_READ_TWICE = Recipe(inputs=((1, 4, 5, 5),), steps=(
    Step("slice", (0,), (2, 1, 5)), Step("pad", (1,), (0, 0, 1, 0)), Step("conv", (2,), (5, 3, 1))),
    outputs=(3, 2), seed=5)


@pytest.mark.parametrize("placement", [NONLOCAL, COALESCE])
def test_policy_i_value_read_as_codes_and_decoded(placement: str, tmp_path: Path) -> None:
    """Found by the long fuzz profile at I: the pad's codes are read by the convolution
    and decoded for the output. Through one shared dequantize, Arm's INT partitioner
    left that dequantize, then the convolution, on the CPU, and the convolution's weight
    dequantize in the delegate as an FP32 constant (TOSA-1.0+INT rejected it). With a
    decode of its own the convolution stays in the one all-integer delegate."""
    model, inputs = build(PAD_READ_TWICE)
    v = compile_and_validate_module(model, inputs, 5, INTEGER_POLICY, placement, tmp_path, str(PAD_READ_TWICE))
    assert v is not None and v.verdict is Verdict.PASS and v.reference_model_ran
    data = (tmp_path / PTE).read_bytes()
    info = inspect_pte(data)
    assert info.delegate_ids == ("CodecTosaBackend",) and set(info.operators) <= IO_KERNELS
    payload = delegate_payload(data)
    assert float_operators(payload) == []
    assert tosa_stats(payload).operators_by_type["CONV2D"] == 1
