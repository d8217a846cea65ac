"""Ambiguous codes decided by the artefact's own rounding (tools/artefact_rounding;
docs/DESIGN.md, "Validation"): where an input set has too many to flip each
alone, compile asks the TOSA reference model which way the artefact rounded
each, and only those; every other code stays the simulation's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import codec_tosa.validation.simulation as simulation
from codec_tosa.pytrees import leaves
from codec_tosa.validation.rounding_ambiguity import AmbiguousCode
from codec_tosa.runtime.executorch_runner import run_pte
from codec_tosa.runtime.pte import delegates, inspect_pte, read_pte
from codec_tosa.serialization.tosa_stats import entry_io_tensors
from codec_tosa.spec import CodecSpec
from codec_tosa.validation.artefact_rounding import (ArtefactRounding, ArtefactRuns, _Rounding, artefact_roundings,
                                                   exposing, rounding_names)
from codec_tosa.tools.compiler import CompileResult, compile_model, lower_program
from codec_tosa.validation.reference_model import run_reference_model
from codec_tosa.validation.samples import held_out_inputs
from codec_tosa.validation.validate import Verdict, validate
from model_files import TRANSFORMER_MODEL_FILE


def _ambiguous(node: str, index: int, code: int, alternative: int) -> AmbiguousCode:
    return AmbiguousCode(node, index, code, alternative, 0.1, 0.2)


def test_the_artefacts_code_is_taken_only_at_ambiguous_elements() -> None:
    codes = torch.tensor([[3, -2], [7, 0]], dtype=torch.int8)
    amb = [_ambiguous("q", 1, -2, -1), _ambiguous("q", 2, 7, 8)]
    # the artefact rounded element 1 the other way and element 2 as the simulation
    decides = ArtefactRounding([_Rounding("cast", np.array([[3, -1], [7, 0]], dtype=np.int8))])
    out = decides("q", codes, amb, 0, -128, 127)
    assert out.tolist() == [[3, -1], [7, 0]] and out.dtype == torch.int8
    assert (decides.resolved, decides.flipped, decides.complete) == (2, 1, True)
    # a rounding that differs where the code is not ambiguous is another encode's
    # (or a wrong one): it decides nothing
    other = ArtefactRounding([_Rounding("cast", np.array([[4, -1], [7, 0]], dtype=np.int8))])
    assert torch.equal(other("q", codes, amb, 0, -128, 127), codes) and other.unresolved == ["q"]
    # nor does one that gives an ambiguous element a third value
    third = ArtefactRounding([_Rounding("cast", np.array([[3, -3], [7, 0]], dtype=np.int8))])
    assert torch.equal(third("q", codes, amb, 0, -128, 127), codes) and not third.complete
    # two matching roundings that disagree: neither decides
    both = ArtefactRounding([_Rounding("a", np.array([[3, -1], [7, 0]], dtype=np.int8)),
                             _Rounding("b", np.array([[3, -2], [7, 0]], dtype=np.int8))])
    assert torch.equal(both("q", codes, amb, 0, -128, 127), codes) and not both.complete


def test_an_int16_rounding_gets_the_zero_point_and_a_channels_last_one_is_transposed() -> None:
    # encode (s, z): CAST f32->i16 gives round(x/s); the codec's RESCALE adds z, saturating
    codes = torch.tensor([[-128, 5, 127]], dtype=torch.int8)
    amb = [_ambiguous("q", 1, 5, 6)]
    decides = ArtefactRounding([_Rounding("wide", np.array([[-300, -4, 200]], dtype=np.int16))])
    assert decides("q", codes, amb, 10, -128, 127).tolist() == [[-128, 6, 127]] and decides.flipped == 1
    nchw = torch.arange(3 * 2 * 2, dtype=torch.int8).reshape(1, 3, 2, 2) * 2
    nhwc = nchw.permute(0, 2, 3, 1).numpy().copy()
    nhwc[0, 1, 0, 2] += 1  # channel 2, row 1, column 0: flat index 2*4 + 1*2 + 0 = 10
    amb = [_ambiguous("q", 10, int(nchw.reshape(-1)[10]), int(nchw.reshape(-1)[10]) + 1)]
    decides = ArtefactRounding([_Rounding("cast", nhwc)])
    assert decides("q", nchw, amb, 0, -128, 127).reshape(-1)[10] == nchw.reshape(-1)[10] + 1
    assert decides.flipped == 1


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> CompileResult:
    """The transformer compiled at W as a user compiles it, with no ambiguous code
    flipped alone (MAX_FLIPS 0: the artefact decides every one; the .pte is the same)."""
    d = tmp_path_factory.mktemp("artefact_rounding")
    (d / "model.py").write_text(TRANSFORMER_MODEL_FILE)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(simulation, "MAX_FLIPS", 0)
        return compile_model(f"{d / 'model.py'}:build", CodecSpec(policy="W"), d / "W", progress=False, samples=4)


def _example() -> tuple[torch.Tensor, ...]:
    namespace: dict[str, object] = {}
    exec(TRANSFORMER_MODEL_FILE, namespace)
    return namespace["build"]()[1]  # type: ignore[operator, index]


def test_exposing_the_roundings_leaves_the_graphs_outputs_bit_identical(compiled) -> None:
    payload = delegates(read_pte(compiled.pte))[0].payload
    names = rounding_names(payload)
    assert names  # the transformer's encodes of softmax, GELU and layer norm outputs at W
    specs_in, specs_out = entry_io_tensors(payload)
    rng = np.random.default_rng(1)
    x = [rng.standard_normal(s.shape).astype(np.float32) for s in specs_in]
    plain = run_reference_model(payload, x)
    exposed = run_reference_model(exposing(payload, names), x)
    assert len(exposed) == len(specs_out) + len(names)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(plain, exposed))
    assert {e.dtype for e in exposed[len(specs_out):]} <= {np.dtype(np.int8), np.dtype(np.int16)}


def test_the_artefact_decides_every_ambiguous_code_and_the_runtime_agrees(compiled) -> None:
    """With flips alone ruled out (max_flips=0), the artefact's rounding decides
    each ambiguous code, and the simulation so decided is the runtime's output,
    with no allowance, on held-out inputs; without the artefact the envelope
    stays incomplete."""
    planned, pte = compiled.planned, read_pte(compiled.pte)
    checked = 0
    for x in [_example(), *held_out_inputs(_example(), 3, seed=7)]:
        without = simulation.simulate_envelope(planned, x, max_flips=0)
        if not without.ambiguous:
            continue
        env = simulation.simulate_envelope(planned, x, max_flips=0,
                                           artefact=lambda: ArtefactRounding.of(pte, leaves(x)))
        assert not without.complete and env.complete and env.artefact_flipped is not None
        runtime = run_pte(pte, leaves(x))
        # the output is a layer norm's, in FP32: equal to the bound its FP32 operators
        # carry to it (ulps), where the envelope of all flips together allowed ~0.03
        assert all(float((r - o.reshape(r.shape)).abs().max()) <= b
                   for r, o, b in zip(runtime, env.outputs, env.output_bounds))
        assert all(float(a.abs().max()) == 0.0 for a in env.allowance)
        checked += 1
    assert checked >= 2


def test_a_rounding_off_where_it_is_not_ambiguous_decides_nothing(compiled) -> None:
    """A rounding the artefact got wrong away from a boundary (one code moved by
    one) is not adopted: that encode stays unresolved and the input set keeps
    its incomplete envelope, for validate to judge."""
    planned, pte = compiled.planned, read_pte(compiled.pte)
    x = _example()
    roundings = artefact_roundings(pte, leaves(x))
    decides = ArtefactRounding(roundings)
    env = simulation.simulate_envelope(planned, x, max_flips=0, artefact=lambda: decides)
    assert env.complete and decides.resolved
    node = env.ambiguous[0].node
    ambiguous_at = {a.index for a in env.ambiguous if a.node == node}
    tampered = []
    for r in roundings:
        values = r.values.copy()
        flat = values.reshape(-1)
        k = next(i for i in range(flat.size) if i not in ambiguous_at)
        flat[k] = flat[k] + 1 if flat[k] < np.iinfo(flat.dtype).max else flat[k] - 1
        tampered.append(_Rounding(r.name, values))
    wrong = ArtefactRounding(tampered)
    env = simulation.simulate_envelope(planned, x, max_flips=0, artefact=lambda: wrong)
    assert not env.complete and env.artefact_flipped is None and node in wrong.unresolved


def test_compile_lets_the_artefact_decide_and_validate_says_so(compiled) -> None:
    """Through compile and validate, as a user runs them, on a model with more
    ambiguous codes per input set than are flipped alone (here: any)."""
    out = compiled.out_dir
    io = np.load(out / "reference_io.npz")
    report = json.loads((out / "report.json").read_text())["ambiguous_codes"]
    decided = int((io["artefact_flipped"] >= 0).sum())
    assert decided == report["decided_by_artefact"] >= 2 and report["complete"]
    assert "sample_allowance_0" not in io or float(np.abs(io["sample_allowance_0"]).max()) == 0.0
    v = validate(Path(out) / "model.pte")
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())
    assert any("decided by the artefact's own rounding" in line for line in v.lines())


def test_the_artefact_is_asked_within_the_reference_stages_budget(tmp_path, monkeypatch) -> None:
    """compile without --samples: the artefact (a reference-model run of the whole
    program) decides the example's codes and the first held-out set's always, a later
    set's only while the budget allows (here none): the first set it would have to
    decide past the budget ends the stage, so every stored set is decided and
    validate holds the artefact to it exactly; report.json counts the runs."""
    monkeypatch.setattr(simulation, "MAX_FLIPS", 0)
    monkeypatch.setattr("codec_tosa.tools.compiler.reference_budget", lambda other_s: 0.0)
    (tmp_path / "model.py").write_text(TRANSFORMER_MODEL_FILE)
    result = compile_model(f"{tmp_path / 'model.py'}:build", CodecSpec(policy="W"), tmp_path / "W", progress=False)
    io = np.load(result.out_dir / "reference_io.npz")
    held = result.report["held_out"]
    assert held["artefact_runs"] == 2 and held["artefact_s"] > 0 and held["stored"] == 1
    assert (io["artefact_flipped"] >= 0).all() and io["envelope_complete"].all() and len(io["envelope_complete"]) == 2
    assert result.report["ambiguous_codes"]["decided_by_artefact"] == 2
    v = validate(result.out_dir / "model.pte")
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())


def test_the_artefact_decides_with_its_weights_in_a_ptd(tmp_path, monkeypatch) -> None:
    """External weights: the artefact's rounding is read from the whole flatbuffer the
    recorded call carries, not from the payload (a side table and a deflated skeleton)."""
    monkeypatch.setattr(simulation, "MAX_FLIPS", 0)
    (tmp_path / "model.py").write_text(TRANSFORMER_MODEL_FILE)
    result = compile_model(f"{tmp_path / 'model.py'}:build", CodecSpec(policy="W", external_weights=True),
                           tmp_path / "W", progress=False, samples=2)
    assert result.files == ("model.ptd",)
    ambiguous = result.report["ambiguous_codes"]
    assert ambiguous["decided_by_artefact"] == 3 and ambiguous["complete"]
    v = validate(result.out_dir / "model.pte")
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())


class _PositionsOnTheCpu(nn.Module):
    """One delegate call reading the input and a value the CPU computes from shapes only."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.ones(1, x.shape[1], dtype=torch.long).cumsum(-1).to(torch.float32)  # int64: CPU
        return torch.softmax(self.linear(x) + 0.1 * positions.unsqueeze(-1), dim=-1)


class _EmbeddingOnTheCpu(nn.Module):
    """One delegate call reading what the CPU computes from the input (int64 indices)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding, self.linear = nn.Embedding(16, 8), nn.Linear(8, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(self.embedding(tokens)), dim=-1)


@pytest.mark.parametrize("module, draw, direct", [
    (_PositionsOnTheCpu, lambda g: torch.randn(1, 6, 8, generator=g), True),
    (_EmbeddingOnTheCpu, lambda g: torch.randint(0, 16, (1, 6), generator=g), False),
])
def test_one_delegate_call_on_its_own_inputs_is_asked_without_running_the_program(module, draw, direct) -> None:
    """Issue 51: where the program is one delegate call reading program inputs and
    values no instruction derives from one, the call's inputs are taken directly
    after the first run (one reference-model run per input set, not two), and the
    roundings are those of the recorded runs; where it reads a value the CPU derives
    from an input, every input set is recorded."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model, sets = module().eval(), [(draw(g),) for _ in range(4)]
    pte = lower_program(torch.export.export(model, sets[0]), CodecSpec("W"), sets).pte
    assert len(inspect_pte(pte).delegate_calls) == 1
    runs = ArtefactRuns(pte)
    for x in [(draw(g),) for _ in range(3)]:
        asked, recorded = runs.roundings(leaves(x)), artefact_roundings(pte, leaves(x))
        assert asked and [r.name for r in asked] == [r.name for r in recorded]
        assert all(a.values.tobytes() == r.values.tobytes() for a, r in zip(asked, recorded))
    assert runs.recorded_runs == (1 if direct else 3)
