"""The C++ CodecTosaBackend runtime: build, registration, and bit-exact execution.

Until the Python CodecTosaBackend produces payloads, the TOSA flatbuffers come
from stock Arm lowering (TOSAPartitioner + TOSABackend); the .pte is then
re-labelled so its delegate names the backend id "CodecTosaBackend" (payload
bytes untouched), which is exactly what the C++ backend receives at runtime.
Outputs are compared bit for bit with ``tosa_reference_model.run`` on the same
payload, in the same process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import tosa_reference_model  # a dependency: missing fails, never skips
from torch import nn

from codec_tosa.runtime import native
from codec_tosa.runtime.executorch_runner import PteRunError, run_pte
from codec_tosa.runtime.pte import inspect_pte


BACKEND_ID = "CodecTosaBackend"


# --------------------------------------------------------------------------- models


class _ConvLinear(nn.Module):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.linear = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.relu(self.conv(x)))


class _MixedDtypes(nn.Module):
    """FP32, INT32 and BOOL tensors at the delegate boundary, several inputs/outputs."""

    def forward(
        self, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x * 2.0 - 1.0, x > 0.5, a + b


# --------------------------------------------------------------------------- lowering


@dataclass(frozen=True)
class Lowered:
    pte: bytes  # delegate relabelled to CodecTosaBackend
    payload: bytes  # the TOSA flatbuffer inside it


def _relabel(pte: bytes, payload: bytes | None = None) -> bytes:
    """Point every delegate at BACKEND_ID (optionally swapping its payload)."""
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte_file = deserialize_pte_binary(pte)
    program = pte_file.program
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            delegate.id = BACKEND_ID
            if payload is not None:
                program.backend_delegate_data[delegate.processed.index].data = payload
    return bytes(serialize_pte_binary(pte_file, extract_delegate_segments=True))


def _lower_stock(
    model: nn.Module,
    example: tuple[torch.Tensor, ...],
    tosa_spec: str,
    quant_config: str | None = None,
) -> tuple[bytes, bytes, object]:
    """Stock Arm flow; quant_config names an Arm quantization-config factory."""
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir._serialize._program import _extract_delegate_payload

    compile_spec = TosaCompileSpec(tosa_spec)
    model = model.eval()
    if quant_config is not None:
        from executorch.backends.arm.quantizer import TOSAQuantizer, arm_quantizer
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer = TOSAQuantizer(compile_spec)
        quantizer.set_global(getattr(arm_quantizer, quant_config)())
        graph = torch.export.export(model, example).module(check_guards=False)
        graph = prepare_pt2e(graph, quantizer)
        graph(*example)
        model = convert_pt2e(graph)
    edge = to_edge_transform_and_lower(
        torch.export.export(model, example), partitioner=[TOSAPartitioner(compile_spec)]
    )
    edge_program = edge.exported_program()
    pte = edge.to_executorch().buffer
    payload = _extract_delegate_payload(pte, "TOSABackend")
    assert payload is not None, "stock Arm lowering produced no TOSA delegate"
    return pte, payload, edge_program


def _reference(payload: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    outputs, status = tosa_reference_model.run(payload, inputs)
    assert status == tosa_reference_model.GraphStatus.TOSA_VALID
    return outputs


def _assert_bit_exact(actual: torch.Tensor, expected: np.ndarray) -> None:
    actual_np = actual.numpy()
    assert actual_np.dtype == expected.dtype
    assert actual_np.shape == expected.shape
    # Compare bytes, so that -0.0 vs 0.0 and NaN payloads count as differences.
    assert actual_np.tobytes() == np.ascontiguousarray(expected).tobytes()


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def backend_library() -> Path:
    return native.load()


@pytest.fixture(scope="module")
def fp32(backend_library: Path) -> tuple[Lowered, nn.Module]:
    torch.manual_seed(0)
    model = _ConvLinear().eval()
    pte, payload, edge = _lower_stock(model, (torch.randn(1, 3, 8, 8),), "TOSA-1.0+FP")
    return Lowered(_relabel(pte), payload), model


_QUANTIZED_FLOWS = {
    # boundary dtype: (TOSA spec, Arm quantization config)
    "int8": ("TOSA-1.0+INT", "get_symmetric_quantization_config"),
    "int16": ("TOSA-1.0+INT+int16", "get_symmetric_a16w8_quantization_config"),
}


@pytest.fixture(scope="module", params=sorted(_QUANTIZED_FLOWS))
def quantized(request: pytest.FixtureRequest, backend_library: Path) -> tuple[Lowered, object, str]:
    tosa_spec, config = _QUANTIZED_FLOWS[request.param]
    torch.manual_seed(1)
    example = (torch.randn(1, 3, 8, 8),)
    pte, payload, edge = _lower_stock(_ConvLinear(), example, tosa_spec, quant_config=config)
    return Lowered(_relabel(pte), payload), edge, request.param


# --------------------------------------------------------------------------- build


def test_build_is_cached_and_registers_the_backend(backend_library: Path) -> None:
    from executorch.extension.pybindings import portable_lib

    mtime = backend_library.stat().st_mtime_ns
    assert native.build() == backend_library
    assert backend_library.stat().st_mtime_ns == mtime  # no rebuild
    assert native.load() == backend_library  # once per process
    assert BACKEND_ID in portable_lib._get_registered_backend_names()


def test_cache_key_follows_the_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sources = tmp_path / "cpp"
    shutil.copytree(native.SOURCE_DIR, sources)
    monkeypatch.setattr(native, "SOURCE_DIR", sources)
    before = native.library_path()
    header = sources / "tosa_program.h"
    original = header.read_text()
    header.write_text(original + "\n// changed\n")
    assert native.library_path() != before
    header.write_text(original)
    assert native.library_path() == before


def test_cli_build_reports_the_cached_library(backend_library: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "codec_tosa.runtime.native", "build"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(backend_library) in result.stdout
    assert "cached" in result.stdout


# --------------------------------------------------------------------------- execution


def test_fp32_pte_matches_reference_model_bit_exactly(fp32: tuple[Lowered, nn.Module]) -> None:
    lowered, model = fp32
    assert inspect_pte(lowered.pte).delegate_ids == (BACKEND_ID,)
    for seed in (10, 11):  # two different inputs through one program: no stale state
        x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(seed))
        (out,) = run_pte(lowered.pte, [x])
        (expected,) = _reference(lowered.payload, [x.numpy()])
        _assert_bit_exact(out, expected)
        torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)


def test_repeated_runs_are_identical(fp32: tuple[Lowered, nn.Module]) -> None:
    lowered, _ = fp32
    x = torch.randn(1, 3, 8, 8)
    first = run_pte(lowered.pte, [x])
    second = run_pte(lowered.pte, [x])
    assert first[0].numpy().tobytes() == second[0].numpy().tobytes()


def _boundary_qparams(edge: object) -> tuple[tuple, tuple]:
    """(scale, zero_point, qmin, qmax, dtype) of the input quantize and output dequantize."""
    quantize = [n for n in edge.graph.nodes if "quantize_per_tensor" in str(n.target)]
    q_in = next(n for n in quantize if "dequantize" not in str(n.target))
    dq_out = next(n for n in quantize if "dequantize" in str(n.target))
    return tuple(q_in.args[1:]), tuple(dq_out.args[1:])


def test_quantized_pte_matches_reference_model_bit_exactly(
    quantized: tuple[Lowered, object, str],
) -> None:
    lowered, edge, boundary_dtype = quantized
    # The stock quantized program quantizes/dequantizes on the CPU around the
    # delegate, so the runner must have loaded the quantized kernels.
    assert inspect_pte(lowered.pte).needs_quantized_kernels
    (q_scale, q_zp, q_min, q_max, q_dtype), (d_scale, d_zp, d_min, d_max, d_dtype) = (
        _boundary_qparams(edge)
    )
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    (out,) = run_pte(lowered.pte, [x])

    ops = torch.ops.quantized_decomposed
    q = ops.quantize_per_tensor(x, q_scale, q_zp, q_min, q_max, q_dtype)
    (q_out,) = _reference(lowered.payload, [q.numpy()])
    assert q_out.dtype == np.dtype(boundary_dtype)  # the delegate's own I/O dtype
    expected = ops.dequantize_per_tensor(
        torch.from_numpy(q_out), d_scale, d_zp, d_min, d_max, d_dtype
    )
    _assert_bit_exact(out, expected.numpy())


def test_fp32_int32_bool_boundaries_and_several_outputs(backend_library: Path) -> None:
    x = torch.rand(2, 3)
    a = torch.randint(-5, 5, (2, 3), dtype=torch.int32)
    b = torch.randint(-5, 5, (2, 3), dtype=torch.int32)
    pte, payload, _ = _lower_stock(_MixedDtypes(), (x, a, b), "TOSA-1.0+INT+FP")
    outputs = run_pte(_relabel(pte), [x, a, b])
    expected = _reference(payload, [x.numpy(), a.numpy(), b.numpy()])
    assert [o.dtype for o in outputs] == [torch.float32, torch.bool, torch.int32]
    for out, ref in zip(outputs, expected):
        _assert_bit_exact(out, ref)
    torch.testing.assert_close(outputs[2], a + b)


class _HalfUpsample(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.interpolate(x, scale_factor=2, mode="bilinear") * 0.5


def test_fp16_boundaries(backend_library: Path) -> None:
    # Arm's operator tests run FP16 graphs (upsample_bilinear2d's fp16 cases): the
    # runtime takes and returns ExecuTorch Half as the reference model's binary16.
    x = torch.randn(1, 2, 4, 4, dtype=torch.float16)
    pte, payload, _ = _lower_stock(_HalfUpsample(), (x,), "TOSA-1.0+FP")
    (out,) = run_pte(_relabel(pte), [x])
    (ref,) = _reference(payload, [x.numpy()])
    assert out.dtype == torch.float16
    _assert_bit_exact(out, ref)
    torch.testing.assert_close(out.float(), _HalfUpsample()(x.float()), atol=2e-2, rtol=1e-2)


@pytest.mark.slow
def test_tiny_shufflenet_int8_matches_reference_model_bit_exactly(backend_library: Path) -> None:
    """Split, concat, channel shuffle, depthwise conv, pooling: a wider operator mix."""
    import codec_tosa_examples.models.tiny as tiny
    model, example = tiny.tiny_shufflenet()
    pte, payload, edge = _lower_stock(
        model.eval(), example, "TOSA-1.0+INT", quant_config="get_symmetric_quantization_config"
    )
    (out,) = run_pte(_relabel(pte), list(example))
    (q_args, dq_args) = _boundary_qparams(edge)
    ops = torch.ops.quantized_decomposed
    (q_out,) = _reference(payload, [ops.quantize_per_tensor(example[0], *q_args).numpy()])
    expected = ops.dequantize_per_tensor(torch.from_numpy(q_out), *dq_args)
    _assert_bit_exact(out, expected.numpy())


def _codec_tosa_partitioner(tosa_spec: str) -> object:
    """Arm's operator support and partitioning, delegating to CodecTosaBackend.

    Only the delegation target changes: the partitions (and the compile specs
    they carry) are stock TOSAPartitioner's.
    """
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult

    class _ToCodecTosaBackend(Partitioner):
        def __init__(self) -> None:
            super().__init__()
            self._inner = TOSAPartitioner(TosaCompileSpec(tosa_spec))

        def partition(self, exported_program: object) -> PartitionResult:
            result = self._inner.partition(exported_program)
            tags = {
                tag: DelegationSpec(BACKEND_ID, spec.compile_specs)
                for tag, spec in result.partition_tags.items()
            }
            return PartitionResult(
                tagged_exported_program=result.tagged_exported_program, partition_tags=tags
            )

        def ops_to_not_decompose(self, ep: object) -> object:
            return self._inner.ops_to_not_decompose(ep)

    return _ToCodecTosaBackend()


def test_codec_tosa_backend_pte_end_to_end(backend_library: Path) -> None:
    """Python CodecTosaBackend.preprocess -> .pte -> C++ CodecTosaBackend, bit-exact."""
    import codec_tosa.targets.tosa.backend as backend
    assert backend.CodecTosaBackend.__name__ == BACKEND_ID
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir._serialize._program import _extract_delegate_payload

    torch.manual_seed(0)
    model = _ConvLinear().eval()
    x = torch.randn(1, 3, 8, 8)
    edge = to_edge_transform_and_lower(
        torch.export.export(model, (x,)), partitioner=[_codec_tosa_partitioner("TOSA-1.0+FP")]
    )
    pte = edge.to_executorch().buffer
    assert inspect_pte(pte).delegate_ids == (BACKEND_ID,)
    payload = _extract_delegate_payload(pte, BACKEND_ID)
    (out,) = run_pte(pte, [x])
    (expected,) = _reference(payload, [x.numpy()])
    _assert_bit_exact(out, expected)
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy", ["Z", "W"])
def test_codec_tosa_partitioner_pte_runs_bit_exactly(backend_library: Path, policy: str) -> None:
    """The product path (placement, calibration, codecs for W) through the C++ runtime."""
    import codec_tosa.targets.tosa.partitioner as partitioner
    import codec_tosa.spec as spec
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir._serialize._program import _extract_delegate_payload

    torch.manual_seed(0)
    model = _ConvLinear().eval()
    x = torch.randn(1, 3, 8, 8)
    edge = to_edge_transform_and_lower(
        torch.export.export(model, (x,)),
        partitioner=[
            partitioner.CodecTosaPartitioner(spec.CodecSpec(policy=policy), calibration=[(x,)])
        ],
    )
    pte = edge.to_executorch().buffer
    (out,) = run_pte(pte, [x])
    (expected,) = _reference(_extract_delegate_payload(pte, BACKEND_ID), [x.numpy()])
    _assert_bit_exact(out, expected)


# --------------------------------------------------------------------------- bad input


def test_payload_with_other_shapes_is_rejected_at_execute(
    fp32: tuple[Lowered, nn.Module], capfd: pytest.CaptureFixture[str]
) -> None:
    lowered, _ = fp32
    torch.manual_seed(0)
    _, small_payload, _ = _lower_stock(_ConvLinear(4), (torch.randn(1, 3, 4, 4),), "TOSA-1.0+FP")
    mismatched = _relabel(lowered.pte, payload=small_payload)
    with pytest.raises(PteRunError, match="0x12"):  # Error::InvalidArgument
        run_pte(mismatched, [torch.randn(1, 3, 8, 8)])
    assert "CodecTosaBackend: input 0" in capfd.readouterr().err


def test_corrupt_payload_is_rejected_at_init(
    fp32: tuple[Lowered, nn.Module], capfd: pytest.CaptureFixture[str]
) -> None:
    lowered, _ = fp32
    corrupt = _relabel(lowered.pte, payload=b"\x1c\x00\x00\x00TOSA" + b"\xff" * 64)
    with pytest.raises(PteRunError, match="0x30"):  # Error::DelegateInvalidCompatibility
        run_pte(corrupt, [torch.randn(1, 3, 8, 8)])
    assert "not a valid TOSA flatbuffer" in capfd.readouterr().err


def test_unregistered_backend_is_named(backend_library: Path, fp32: tuple[Lowered, nn.Module]) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte_file = deserialize_pte_binary(fp32[0].pte)
    pte_file.program.execution_plan[0].delegates[0].id = "NoSuchBackend"
    pte = bytes(serialize_pte_binary(pte_file, extract_delegate_segments=True))
    with pytest.raises(PteRunError, match="NoSuchBackend"):
        run_pte(pte, [torch.randn(1, 3, 8, 8)])


def test_build_failure_is_a_one_line_run_error(
    fp32: tuple[Lowered, nn.Module], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_load() -> Path:
        raise native.NativeBuildError("building x failed (g++ exit 1):\nfoo.cpp:1: error: bar")

    monkeypatch.setattr(native, "load", broken_load)
    with pytest.raises(PteRunError, match="runtime library is unavailable") as info:
        run_pte(fp32[0].pte, [torch.randn(1, 3, 8, 8)])
    assert "\n" not in str(info.value)


def test_not_a_pte_is_a_clear_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pte"
    junk.write_bytes(b"definitely not a program")
    with pytest.raises(PteRunError, match="not a valid ExecuTorch program"):
        run_pte(junk, [])
    with pytest.raises(PteRunError, match="cannot read"):
        run_pte(tmp_path / "missing.pte", [])


# --------------------------------------------------------------------------- one process


def test_backend_loaded_before_reference_model_in_one_process(
    fp32: tuple[Lowered, nn.Module], tmp_path: Path
) -> None:
    """The other load order: this module imports tosa_reference_model first."""
    lowered, _ = fp32
    (tmp_path / "m.pte").write_bytes(lowered.pte)
    (tmp_path / "m.tosa").write_bytes(lowered.payload)
    script = textwrap.dedent(
        f"""
        import sys, torch
        from codec_tosa.runtime.executorch_runner import run_pte
        x = torch.randn(1, 3, 8, 8)
        (out,) = run_pte({str(tmp_path / 'm.pte')!r}, [x])
        assert "tosa_reference_model" not in sys.modules
        import tosa_reference_model as trm
        ref, status = trm.run(open({str(tmp_path / 'm.tosa')!r}, 'rb').read(), [x.numpy()])
        (again,) = run_pte({str(tmp_path / 'm.pte')!r}, [x])
        assert out.numpy().tobytes() == ref[0].tobytes() == again.numpy().tobytes()
        print("SAME")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=dict(os.environ)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "SAME" in result.stdout


class _Unshuffle(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.pixel_unshuffle(x, 2) * 2.0


@pytest.mark.parametrize("policy", ["W", "I"])
def test_a_channels_last_input_runs_in_its_layout(policy: str, tmp_path: Path) -> None:
    # Arm keeps a channels-last input NHWC in the TOSA graph; the runtime takes the
    # tensor's bytes as they lie (they are NHWC), and the runner hands a contiguous
    # tensor over in the layout the program declares (Arm's pixel_unshuffle test)
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import compile_module
    from codec_tosa.validation.validate import Verdict, validate

    x = torch.rand(1, 4, 8, 6).to(memory_format=torch.channels_last)
    result = compile_module("unshuffle", (_Unshuffle(), (x,)), CodecSpec(policy), tmp_path, progress=False,
                            samples=2)
    assert inspect_pte(Path(result.pte).read_bytes()).input_specs[0].channels_last
    v = validate(result.pte)
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())
    held_out = torch.rand(1, 4, 8, 6, generator=torch.Generator().manual_seed(3))
    (out,) = run_pte(Path(result.pte).read_bytes(), [held_out])
    want = _Unshuffle()(held_out)
    assert out.shape == want.shape
    torch.testing.assert_close(out.contiguous(), want, atol=2.0 / 127 * 2, rtol=0)
