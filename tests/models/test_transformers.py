"""The transformer models at one layer (issue 51): SmolLM2's prefill on embeddings
(`smollm2`), one decode step with a static KV cache (`smollm2_decode`, executorch's
own LLM construct) and the SigLIP vision tower (`siglip`), compiled through
`codec-tosa compile`'s path at W on tosa and at I on tosa, ethos-u85-256 and xnnpack,
and validated: PASS where the plan's simulation is the oracle (bit-exact delegates),
and for XNNPACK, whose arithmetic is not the plan's, INCOMPLETE with the SQNR against
eager above a floor set under what stock XNNPACK reached when measured (not re-run here). Each program is compiled once per module.

The default run keeps the regressions of issue 51 (F5: SmolLM2 at I on xnnpack; F7:
no delegate of constants only at I on tosa) and the decode step at W (mutated buffers'
state), on smaller copies (`SMALL`); the rest of the grid, and those at the paper's
shapes, are `slow`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable

import pytest

from codec_tosa.runtime.pte import call_counts
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import CompileResult, compile_module
from codec_tosa.validation.validate import Validation, Verdict, validate
from codec_tosa_examples.models.transformer import siglip, smollm2, smollm2_decode

LAYERS = 1
SAMPLES = 2  # held-out inputs beside the example: validate compares on 3 input sets
BUILDERS = {"smollm2": smollm2, "smollm2_decode": smollm2_decode, "siglip": siglip}
# worst SQNR against eager of the XNNPACK programs: stock XNNPACKQuantizer reaches 29.3 dB
# on the decode step and fails on SmolLM2's prefill (F5: its quantizer turns the causal
# mask's integer indices into floats); ours is 34.4 dB on the prefill
XNNPACK_SQNR_DB = {"smollm2": 30.0, "smollm2_decode": 25.0, "siglip": 25.0}

# the default run's copies: the same operators and graph as the paper's shapes, with
# 32 tokens instead of 128 (SmolLM2) and a 4,096-word vocabulary instead of 49,152
# (the decode step's embedding table and LM head)
SMALL = {"smollm2": {"seq_len": 32}, "smollm2_decode": {"vocab_size": 4096}, "siglip": {}}

Compiled = Callable[..., tuple[CompileResult, Validation]]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    cache: dict[tuple[str, str, str, bool], tuple[CompileResult, Validation]] = {}

    def get(model: str, policy: str, target: str, small: bool = False) -> tuple[CompileResult, Validation]:
        key = (model, policy, target, small)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{model}_{policy}_{target}")
            built = BUILDERS[model](num_layers=LAYERS, **(SMALL[model] if small else {}))
            result = compile_module(model, built, CodecSpec(policy, target=target), out, progress=False,
                                    samples=SAMPLES)
            cache[key] = result, validate(result.pte)
        return cache[key]

    return get


def _delegates(result: CompileResult) -> Counter[str]:
    return call_counts(Path(result.pte).read_bytes())[0]


def _slow(*values: object) -> pytest.ParameterSet:
    return pytest.param(*values, marks=pytest.mark.slow)


@pytest.mark.parametrize("model, policy, target, small", [
    ("smollm2", "I", "tosa", True),
    ("smollm2_decode", "W", "tosa", True),
    _slow("smollm2", "I", "tosa", False),
    _slow("smollm2_decode", "W", "tosa", False),
    _slow("smollm2", "W", "tosa", False),
    _slow("smollm2", "I", "ethos-u85-256", False),
    _slow("smollm2_decode", "I", "tosa", False),  # F1: the float KV cache's index_put between two INT parts
    _slow("smollm2_decode", "I", "ethos-u85-256", False),
    _slow("siglip", "W", "tosa", False),
    _slow("siglip", "I", "tosa", False),
    _slow("siglip", "I", "ethos-u85-256", False),
])
def test_compiles_and_validates_pass(compiled: Compiled, model: str, policy: str, target: str,
                                     small: bool) -> None:
    result, v = compiled(model, policy, target, small)
    assert sum(_delegates(result).values()) >= 1
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())


@pytest.mark.parametrize("model, small", [("smollm2", True), _slow("smollm2", False), _slow("smollm2_decode", False),
                                          _slow("siglip", False)])
def test_xnnpack_sqnr_against_eager_is_above_its_floor(compiled: Compiled, model: str, small: bool) -> None:
    result, v = compiled(model, "I", "xnnpack", small)
    assert set(_delegates(result)) == {"XnnpackBackend"}
    assert v.verdict is Verdict.INCOMPLETE, "\n".join(v.lines())  # no oracle but eager
    assert all(o.sqnr_db is not None and o.sqnr_db >= XNNPACK_SQNR_DB[model] for o in v.outputs), \
        "\n".join(v.lines())


def test_smollm2_at_i_has_no_delegate_of_constants_only(compiled: Compiled) -> None:
    """F7: Arm's INT partitioner tags the causal mask's and the RoPE tables' constant
    subgraphs apart; lowered, they were delegates of CONSTs only. One delegate is left."""
    result, _ = compiled("smollm2", "I", "tosa", small=True)
    assert _delegates(result) == Counter({"CodecTosaBackend": 1})
