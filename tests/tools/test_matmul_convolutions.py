"""Integer convolutions run as MATMUL in the reference stage's copies
(validation/matmul_convolutions, issue 51): the copy computes the original graph's
outputs bit for bit, and the reference stage learns the artefact's roundings from it."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
import torch
from torch import nn

from codec_tosa.pytrees import leaves
from codec_tosa.runtime.executorch_runner import run_pte_recorded
from codec_tosa.runtime.pte import ProgramFiles, delegates
from codec_tosa.serialization.tosa_copy import rewritten
from codec_tosa.serialization.tosa_stats import entry_io_tensors, iter_operators
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.artefact_rounding import ArtefactRuns, faster_program, rounding_names
from codec_tosa.validation import matmul_convolutions
from codec_tosa.validation.matmul_convolutions import candidate_macs, faster
from codec_tosa.validation.reference_model import run_reference_model


class _Patches(nn.Module):
    """A 3x3 convolution (stays one), a patch embedding (kernel = stride) and two
    Linears (1x1 convolutions once Arm lowers them), a GELU between: a ViT's stem in small."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 3, 3, padding=1)
        self.patch = nn.Conv2d(3, 8, 4, stride=4)
        self.up, self.down = nn.Linear(8, 12), nn.Linear(12, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch(self.stem(x)).flatten(2).transpose(1, 2)
        return self.down(nn.functional.gelu(self.up(tokens)))


def _draw(g: torch.Generator) -> tuple[torch.Tensor]:
    return (torch.randn(1, 3, 16, 8, generator=g),)


@lru_cache(maxsize=None)
def _program(policy: str) -> tuple[str, bytes, bytes]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    sets = [_draw(g) for _ in range(4)]
    pte = lower_program(torch.export.export(_Patches().eval(), sets[0]), CodecSpec(policy), sets).pte
    payload = next(d.payload for d in delegates(pte) if d.backend_id == "CodecTosaBackend")
    return policy, pte, payload


@pytest.fixture(params=["I", "W"])
def program(request) -> tuple[str, bytes, bytes]:
    return _program(request.param)


def _inputs(payload: bytes, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(s.shape).astype(np.float32) if s.dtype == "FP32"
            else rng.integers(-128, 128, s.shape).astype(np.int8) for s in entry_io_tensors(payload)[0]]


def test_the_kernel_sized_convolutions_become_matmuls_with_the_same_outputs(program) -> None:
    policy, _, payload = program
    copy = faster(payload)
    before = [o.op for o in iter_operators(payload)]
    after = [o.op for o in iter_operators(copy)]
    if policy == "I":
        # the patch embedding and both Linears go; the padded 3x3 stays a convolution
        assert before.count("CONV2D") == 4 and after.count("CONV2D") == 1
        assert after.count("MATMUL") == before.count("MATMUL") + 3
        assert after.count("TRANSPOSE") == before.count("TRANSPOSE") + 1  # the patches' tiles
    else:
        # at W the convolutions Arm runs in INT8 go, the others stay
        assert after.count("CONV2D") < before.count("CONV2D")
    rng = np.random.default_rng(7)  # held-out inputs, none of the calibration sets
    for _ in range(3):
        x = _inputs(payload, rng)
        a, b = run_reference_model(payload, x), run_reference_model(copy, x)
        assert len(a) == len(b) and all(p.dtype == q.dtype and p.tobytes() == q.tobytes() for p, q in zip(a, b))


def test_a_graph_without_an_integer_convolution_is_only_copied(lowered) -> None:
    payload = next(d.payload for d in delegates(lowered("attention", "Z").pte) if d.backend_id == "CodecTosaBackend")
    assert faster(payload) == payload


def test_a_small_program_is_run_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below WORTH_MACS of convolutions the copy would cost more than it saves."""
    _, pte, payload = _program("W")
    assert 0 < candidate_macs(payload) < matmul_convolutions.WORTH_MACS
    assert faster_program(ProgramFiles(pte)).pte == pte
    monkeypatch.setattr(matmul_convolutions, "WORTH_MACS", candidate_macs(payload))
    assert faster_program(ProgramFiles(pte)).pte != pte


def test_the_reference_stage_runs_the_fast_copy_and_gets_the_artefacts_roundings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ArtefactRuns records and asks the MATMUL copy; its roundings are, name for
    name and bit for bit, those of the artefact as written run on the inputs the
    runtime recorded for the real program (at W: the GELU's encode rounds)."""
    _, pte, payload = _program("W")
    monkeypatch.setattr(matmul_convolutions, "WORTH_MACS", 0)  # a small model: copied all the same
    fast = faster_program(ProgramFiles(pte))
    assert fast.pte != pte
    names = rounding_names(payload)
    assert names
    runs = ArtefactRuns(pte)
    g = torch.Generator().manual_seed(11)
    for _ in range(2):
        x = _draw(g)
        asked = runs.roundings(leaves(x))
        _, recorded = run_pte_recorded(pte, leaves(x))
        exposed = run_reference_model(rewritten(payload, outputs=names), recorded[0].inputs)
        own = len(entry_io_tensors(payload)[1])
        assert [r.name for r in asked] == names
        assert all(r.values.tobytes() == np.asarray(v).tobytes() for r, v in zip(asked, exposed[own:]))
