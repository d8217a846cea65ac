"""The C++ CodecTosaBackend's recorder: every delegate call's real inputs and outputs.

Validation runs each delegate alone on the TOSA reference model with what the
runtime really handed it (docs/DESIGN.md, "Validation"), which matters where a
delegate reads values the CPU computed or a program has several delegates.
`topk` has no TOSA lowering in executorch 1.5.1, so it stays on the CPU and
splits the models below.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from codec_tosa.runtime import native
from codec_tosa.runtime.executorch_runner import DelegateCall, run_pte, run_pte_recorded
from codec_tosa.runtime.pte import delegates, inspect_pte
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.reference_model import run_reference_model
import small_models

BACKEND_ID = "CodecTosaBackend"


class _CpuFed(nn.Module):
    """The first operator stays on the CPU: the only delegate reads its result."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(torch.topk(x, 4, dim=1).values))


def _lower(model: nn.Module, x: torch.Tensor, policy: str = "W") -> bytes:
    calibration = [(x,)] + [(torch.randn(x.shape, generator=torch.Generator().manual_seed(i)),)
                            for i in range(1, 3)]
    return lower_program(torch.export.export(model, (x,)), CodecSpec(policy=policy), calibration).pte


@pytest.fixture(scope="module")
def cpu_fed() -> tuple[bytes, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(1, 6, 6, 6)
    return _lower(_CpuFed().eval(), x), x


@pytest.fixture(scope="module")
def two_delegates() -> tuple[bytes, torch.Tensor]:
    model, (x,) = small_models.conv_topk_conv()
    return _lower(model, x), x


def _fnv1a64(data: bytes) -> str:
    """The hash as the recorder's comment defines it, to check the library's."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def _assert_reference_reproduces(call: DelegateCall) -> None:
    expected = run_reference_model(call.payload, call.inputs)
    assert len(expected) == len(call.outputs)
    for got, want in zip(call.outputs, expected):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_payload_hash_is_fnv1a_64() -> None:
    for data in (b"", b"a", bytes(range(256)) * 3):
        assert native.payload_hash(data) == _fnv1a64(data)


def test_cpu_fed_delegate_is_recorded_and_reproduced_by_the_reference_model(
    cpu_fed: tuple[bytes, torch.Tensor],
) -> None:
    pte, x = cpu_fed
    info = inspect_pte(pte)
    assert "aten::topk" in info.operators and info.delegate_ids == (BACKEND_ID,)
    outputs, calls = run_pte_recorded(pte, [x])
    (plain,) = run_pte(pte, [x])
    assert torch.equal(outputs[0], plain)  # recording does not change the run
    (call,) = calls
    (delegate,) = delegates(pte)
    assert (call.call, call.delegate_index, call.backend_id) == (0, 0, BACKEND_ID)
    assert call.payload == delegate.payload and call.payload_hash == _fnv1a64(delegate.payload)
    # what the delegate read is the CPU's topk, not the program input
    assert call.inputs[0].shape != tuple(x.shape)
    _assert_reference_reproduces(call)


def test_two_delegates_are_recorded_in_order_with_their_payloads(
    two_delegates: tuple[bytes, torch.Tensor],
) -> None:
    pte, x = two_delegates
    every = delegates(pte)
    assert [d.backend_id for d in every] == [BACKEND_ID, BACKEND_ID]
    assert every[0].payload != every[1].payload
    (out,), calls = run_pte_recorded(pte, [x])
    assert [c.call for c in calls] == [0, 1]
    order = [c.delegate_index for c in inspect_pte(pte).delegate_calls]
    assert [c.delegate_index for c in calls] == order
    for call in calls:
        assert call.payload == every[call.delegate_index].payload
        _assert_reference_reproduces(call)
    # the last delegate's recorded output is (the codes of) the program's output
    assert calls[-1].outputs[0].size == out.numel()
    # a second recorded run numbers its calls from 0 again
    _, again = run_pte_recorded(pte, [x])
    assert [c.call for c in again] == [0, 1]
    assert all(a.inputs[0].tobytes() == b.inputs[0].tobytes() for a, b in zip(calls, again))


def test_recording_is_off_unless_asked(cpu_fed: tuple[bytes, torch.Tensor], tmp_path: Path) -> None:
    pte, x = cpu_fed
    native.record(tmp_path)
    native.record(None)
    run_pte(pte, [x])
    _ = run_pte_recorded(pte, [x])  # on and off again around its own directory
    run_pte(pte, [x])
    assert list(tmp_path.iterdir()) == []


def test_a_recording_that_cannot_be_written_does_not_fail_the_run(
    cpu_fed: tuple[bytes, torch.Tensor], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    pte, x = cpu_fed
    (expected,) = run_pte(pte, [x])
    native.record(tmp_path / "missing")
    try:
        (out,) = run_pte(pte, [x])
    finally:
        native.record(None)
    assert torch.equal(out, expected)
    assert "recording: cannot write" in capfd.readouterr().err
