"""External weights of our delegate (issue 52): `CodecSpec(external_weights=True)` keeps the
delegate's graph-owned constants in model.ptd (ExecuTorch named data), the C++ backend fetches
them at init, everything that reads TOSA sees the whole flatbuffer put back together, and a
.ptd that is missing, truncated or another program's is refused in one line."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.extension.pybindings import portable_lib

from codec_tosa import CodecSpec, CodecTosaPartitioner, save
from codec_tosa.planning.provenance import option_specs
from codec_tosa.runtime import native
from codec_tosa.runtime.executorch_runner import PteRunError, run_pte, run_pte_recorded
from codec_tosa.runtime.pte import (NamedData, ProgramFiles, PteError, delegates, program_files, read_ptd,
                                   with_delegates_replaced)
from codec_tosa.serialization import external
from codec_tosa.serialization.tosa_stats import iter_constants
from codec_tosa.tools.cli import as_flags, main
from codec_tosa.tools.compiler import compile_module, lower_program
from codec_tosa.tools.report import report_lines
from codec_tosa.validation.reference_model import run_reference_model
from codec_tosa.validation.validate import Verdict, validate
import small_models


def _payload(pte: bytes) -> bytes:
    (d,) = delegates(pte)
    return d.payload


@pytest.fixture(scope="module", params=["W", "Z"])
def pair(request, lowered) -> tuple[str, object, object]:
    """(policy, inline lowering, external-weights lowering) of linear_head; Z has pooling
    off (the plain serializer's bytes), W pools helper constants."""
    policy = request.param
    return (policy, lowered("linear_head", policy),
            lowered("linear_head", policy, external_weights=True))


def test_the_payload_leaves_its_weights_to_the_ptd_and_is_put_back_byte_for_byte(pair) -> None:
    policy, inline, ext = pair
    whole, payload = _payload(inline.pte), _payload(ext.pte)
    assert not external.is_external(whole) and external.is_external(payload)
    entries, skeleton = external.unpack(payload)
    assert ext.ptd is not None and inline.ptd is None
    # every constant of MIN_BYTES or more goes: the weights and the bias of the two linears,
    # and at W the helpers the serializer pools when that large (a RESCALE's per-channel
    # multipliers), the graph-owned ones first
    big = {c.name: c.data for c in iter_constants(whole) if len(c.data) >= external.MIN_BYTES}
    helpers = {name for name in big if name.startswith("tosa_rescale")}
    assert bool(helpers) == (policy == "W")
    assert [e.tensor for e in entries][:3] == [n for n in big if n not in helpers]
    assert {e.tensor for e in entries} == set(big) and len(entries) == 3 + len(helpers)
    for e in entries:  # content-addressed keys, the bytes of the inline constant
        assert e.key == external.weight_key(big[e.tensor]) and bytes(ext.ptd.get(e.key)) == big[e.tensor]
    # the skeleton keeps the smaller constants and none of the data moved
    kept = sum(len(c.data) for c in iter_constants(skeleton))
    assert kept == sum(len(c.data) for c in iter_constants(whole)) - sum(map(len, big.values())) > 0
    assert external.complete(payload, ext.ptd.get) == whole
    weights = sum(len(big[n]) for n in big if n not in helpers)
    assert weights == (2 * 16 * 32 * (4 if policy == "Z" else 1) + 32 * 4)
    # the skeleton lost the data, and is deflated in the payload (side table included)
    assert len(skeleton) <= len(whole) - sum(map(len, big.values()))
    assert len(payload) < len(skeleton) + 256 * len(entries)


def test_outputs_are_bit_identical_to_the_inline_program(pair) -> None:
    _, inline, ext = pair
    _, (x,) = small_models.linear_head()
    for case in [x] + [torch.randn(x.shape, generator=torch.Generator().manual_seed(s)) for s in range(3)]:
        want = run_pte(inline.pte, [case])
        got, calls = run_pte_recorded(ext.program, [case])
        assert [t.numpy().tobytes() for t in got] == [t.numpy().tobytes() for t in want]
        # the recorded call carries the whole TOSA: the reference model reproduces it
        (call,) = calls
        assert call.payload == _payload(inline.pte)
        (ref,) = run_reference_model(call.payload, call.inputs)
        assert np.ascontiguousarray(ref).tobytes() == call.outputs[0].tobytes()


def test_keys_are_stable_and_shared_between_programs(lowered) -> None:
    a = lowered("linear_head", "W", external_weights=True)
    b = lowered("linear_head", "W", "nonlocal+coalesce", external_weights=True, observer="minmax")
    # other calibration statistics, same weights (INT8 weight codes do not depend on them)
    keys_a, keys_b = set(external.needed(_payload(a.pte))), set(external.needed(_payload(b.pte)))
    assert keys_a & keys_b
    assert external.weight_key(b"abc") == external.weight_key(b"abc") != external.weight_key(b"abc", "other")


def test_an_inline_program_is_unchanged() -> None:
    """No compile spec, provenance or payload byte changes unless external weights are asked."""
    assert option_specs(CodecSpec())[0].value == b'{"pool_constants": true}'
    assert "external_weights" not in CodecSpec().to_json()
    assert CodecSpec(external_weights=True).to_json()["external_weights"] is True


def test_without_its_ptd_or_with_another_programs_the_runtime_refuses_in_one_line(lowered) -> None:
    ext = lowered("linear_head", "W", external_weights=True)
    other = lowered("linear_head", "Z", external_weights=True)
    _, (x,) = small_models.linear_head()
    with pytest.raises(PteRunError, match=r"keeps its weights in named data and no \.ptd was given") as e:
        run_pte(ext.pte, [x])
    assert "\n" not in str(e.value)
    with pytest.raises(PteRunError, match=r"not the named data of this program: delegate 0's weight codec_tosa:"):
        run_pte(ProgramFiles(ext.pte, other.ptd), [x])


def test_the_cpp_backend_refuses_at_init_not_crashes(lowered) -> None:
    """Past the Python checks, ExecuTorch's own loader: the C++ backend's init fails
    (error 0x30, its log names the weight and key), the process lives on."""
    native.load()
    ext = lowered("linear_head", "W", external_weights=True)
    other = lowered("linear_head", "Z", external_weights=True)
    _, (x,) = small_models.linear_head()
    for named in (None, other.ptd.bytes()):
        module = portable_lib._load_for_executorch_from_buffer(ext.pte, named)
        with pytest.raises(RuntimeError, match="0x30"):
            module.run_method("forward", (x,))
    named = ext.ptd.bytes()  # kept alive while the module runs
    # a skeleton that does not inflate (its last bytes cut) is refused at init as well
    (d,) = delegates(ext.pte)
    cut = with_delegates_replaced(ext.pte, {d.index: (d.backend_id, bytes(d.payload)[:-4])})
    module = portable_lib._load_for_executorch_from_buffer(cut, named)
    with pytest.raises(RuntimeError, match="0x"):
        module.run_method("forward", (x,))
    module = portable_lib._load_for_executorch_from_buffer(ext.pte, named)
    assert module.run_method("forward", (x,))[0].shape == (1, 6, 16)


def test_malformed_side_tables_and_wrong_blobs_are_refused() -> None:
    skeleton = b"\0" * 64
    entry = external.Entry("main", "main", "w", external.weight_key(b"x" * 8), 8)
    payload = external.pack([entry], skeleton)
    assert external.unpack(payload) == ([entry], skeleton)
    raw = external.pack([entry], skeleton, external.RAW)
    assert external.unpack(raw) == ([entry], skeleton) and raw.endswith(skeleton) and len(raw) > len(payload)
    with pytest.raises(external.ExternalWeightsError, match="skeleton does not inflate"):
        external.unpack(payload[:-4])
    with pytest.raises(external.ExternalWeightsError, match="side table is truncated"):
        external.unpack(payload[:8] + struct.pack("<I", 2) + payload[12:])  # 2 entries, 1 written
    with pytest.raises(external.ExternalWeightsError, match="malformed header"):
        external.unpack(external.MAGIC + b"\x03" + b"\0" * 40)
    with pytest.raises(external.ExternalWeightsError, match=r"constant w \(8 bytes\) is not in the named data"):
        external.complete(payload, {}.get)
    with pytest.raises(external.ExternalWeightsError, match="constant w: 7 bytes under key"):
        external.complete(payload, {entry.key: b"x" * 7}.get)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("external") / "W"
    result = compile_module("linear_head", small_models.linear_head(), CodecSpec("W", external_weights=True), out,
                            progress=False, samples=2)
    assert result.files == ("model.ptd",)
    assert result.report["ptd"] == {"file": "model.ptd", "bytes": (out / "model.ptd").stat().st_size, "keys": 4}
    return out


def test_compile_writes_the_pair_and_validate_passes_it(compiled, capsys) -> None:
    v = validate(compiled / "model.pte")
    assert v.verdict is Verdict.PASS, "\n".join(v.lines())
    # the two linears' weights and a bias (1,152 bytes), a RESCALE's 32 multipliers (128)
    assert any("named data: " in n and "4 keys" in n for n in v.notes)
    lines = report_lines(compiled / "model.pte", lambda h, r: "")
    assert any(line.startswith("external weights: 4 constants, 1280 bytes in the .ptd") for line in lines)


def test_an_inline_compile_into_the_same_directory_removes_the_stale_ptd(compiled, tmp_path) -> None:
    out = tmp_path / "W"
    shutil.copytree(compiled, out)
    compile_module("linear_head", small_models.linear_head(), CodecSpec("W"), out, progress=False, samples=2)
    assert not (out / "model.ptd").exists()
    assert validate(out / "model.pte").verdict is Verdict.PASS


@pytest.mark.parametrize("damage, message", [
    ("missing", r"model\.ptd: missing: delegate 0 of .*model\.pte reads 4 blobs of named data"),
    ("truncated", r"model\.ptd: truncated: its segments need \d+ bytes, the file has \d+"),
    ("empty", r"model\.ptd: empty, not a \.ptd"),
    ("garbage", r"model\.ptd: not an ExecuTorch named-data file \(\.ptd\)"),
    ("other", r"model\.ptd: not the named data of .*model\.pte: delegate 0 reads key codec_tosa:"),
])
def test_a_bad_ptd_is_one_line_at_validate_and_report(compiled, tmp_path, lowered, damage, message,
                                                      capsys) -> None:
    out = tmp_path / "bad"
    shutil.copytree(compiled, out)
    ptd = out / "model.ptd"
    good = ptd.read_bytes()
    if damage == "missing":
        ptd.unlink()
    elif damage == "truncated":
        ptd.write_bytes(good[:-100])
    elif damage == "empty":
        ptd.write_bytes(b"")
    elif damage == "garbage":
        ptd.write_bytes(bytes(range(256)) * 8)
    else:
        ptd.write_bytes(lowered("linear_head", "Z", external_weights=True).ptd.bytes())
    with pytest.raises(PteError, match=message):
        validate(out / "model.pte")
    for command in ("validate", "report"):
        assert main([command, str(out / "model.pte")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "model.ptd" in err, err


_WIDE_MODEL_FILE = """
import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.ReLU()).eval(), (torch.randn(1, 3, 6, 6),)
"""


def test_the_cli_flag_writes_the_pair(tmp_path, capsys) -> None:
    (tmp_path / "model.py").write_text(_WIDE_MODEL_FILE)
    out = tmp_path / "out"
    assert main(["compile", f"{tmp_path / 'model.py'}:build", "--policy", "W", "--external-weights", "--samples", "1",
                 "-o", str(out)]) == 0
    assert f"{out / 'model.ptd'}" in capsys.readouterr().out
    assert main(["validate", str(out / "model.pte")]) == 0
    assert main(["compile", f"{tmp_path / 'model.py'}:build", "--target", "vgf", "--external-weights",
                 "-o", str(tmp_path / "vgf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar's lines
    assert err == ("codec-tosa compile: error: --external-weights: --target vgf keeps its weights in the VGF file: "
                   "Arm's VgfBackend has no named-data support in executorch 1.5.1")
    assert not (tmp_path / "vgf").exists()


def test_a_model_without_large_constants_stays_inline(tmp_path) -> None:
    """conv 3->4 (108 INT8 weight bytes) -> relu -> conv 4->4: nothing of MIN_BYTES, so the
    payload stays the plain flatbuffer, there is no .ptd, and save takes the bytes."""
    from model_files import SMALL_MODEL_FILE

    namespace: dict = {}
    exec(SMALL_MODEL_FILE, namespace)
    model, example = namespace["build"]()
    part = CodecTosaPartitioner(CodecSpec("W", external_weights=True), calibration=small_models.calibration(example))
    program = to_edge_transform_and_lower(torch.export.export(model, example), partitioner=[part]).to_executorch()
    files = program_files(program)
    (d,) = delegates(files.pte)
    assert files.ptd is None and not external.is_external(d.payload)
    assert max(len(c.data) for c in iter_constants(d.payload)) < external.MIN_BYTES
    pte = save(program.buffer, part, tmp_path / "out", model=model, samples=1)
    assert not (pte.parent / "model.ptd").exists() and validate(pte).verdict is Verdict.PASS


def test_read_ptd_serves_views_of_the_mapped_file(compiled) -> None:
    named = read_ptd(compiled / "model.ptd")
    assert len(named) == 4 and named.nbytes == (compiled / "model.ptd").stat().st_size
    key = next(iter(named))
    assert isinstance(named.get(key), memoryview) and named.get("nope") is None
    assert NamedData(named.bytes(), "copy").get(key) == named.get(key)


def test_save_writes_the_ptd_beside_the_pte(tmp_path) -> None:
    model, example = small_models.linear_head()
    part = CodecTosaPartitioner(CodecSpec("W", external_weights=True), calibration=small_models.calibration(example))
    program = to_edge_transform_and_lower(torch.export.export(model, example), partitioner=[part]).to_executorch()
    assert program_files(program).ptd is not None
    pte = save(program, part, tmp_path / "saved", model=model, samples=2)
    assert (pte.parent / "model.ptd").is_file()
    assert validate(pte).verdict is Verdict.PASS
    with pytest.raises(ValueError, match="named data that .pte bytes do not hold: pass the program manager"):
        save(program.buffer, part, tmp_path / "bytes", model=model, samples=2)
    assert not (tmp_path / "bytes").exists()


def test_the_option_is_checked_and_vgf_refuses_it_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"external_weights='yes': expected True or False"):
        CodecSpec(external_weights="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"target='vgf' keeps its weights in the VGF file: .*executorch 1\.5\.1"):
        CodecTosaPartitioner(CodecSpec("W", target="vgf", external_weights=True))
    assert as_flags("external_weights=True: target='vgf' keeps") == "--external-weights: --target vgf keeps"


class _Lookup(torch.nn.Module):
    """An embedding table (which stays on the CPU: its indices are integers) feeding a linear."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(256, 64)
        self.head = torch.nn.Linear(64, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.table(tokens))


def test_the_cpu_operators_constants_go_to_the_same_ptd() -> None:
    """SmolLM2's embedding table runs on the CPU: with external weights its table is in
    model.ptd beside the delegate's weights, and the .pte holds no large tensor."""
    torch.manual_seed(0)
    model = _Lookup().eval()
    tokens = [torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(s)) for s in range(4)]
    program = lambda: torch.export.export(model, (tokens[0],))  # noqa: E731
    inline = lower_program(program(), CodecSpec("W"), [(t,) for t in tokens[:2]])
    ext = lower_program(program(), CodecSpec("W", external_weights=True), [(t,) for t in tokens[:2]])
    table = model.table.weight.detach().numpy().tobytes()
    assert table in inline.pte and table not in ext.pte
    assert ext.ptd is not None and any(bytes(ext.ptd.get(k)) == table for k in ext.ptd)
    assert len(ext.pte) < len(table) < len(inline.pte)
    for t in tokens:  # held-out tokens too: the same outputs, bit for bit
        got, want = run_pte(ext.program, [t]), run_pte(inline.pte, [t])
        assert [g.numpy().tobytes() for g in got] == [w.numpy().tobytes() for w in want]


def test_a_wide_linear_with_its_helpers_external_runs_and_validates(tmp_path) -> None:
    """Pooled helpers of 128 bytes or more go to the .ptd too, but only where their data
    is what their shape needs: Arm writes a Linear's weight zero point as a [1] tensor
    with one byte per output channel, which the runtime would refuse (a 160-wide Linear:
    160 bytes). Through compile and validate."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 160), torch.nn.GELU(), torch.nn.Linear(160, 16))
    x = torch.randn(1, 4, 16)
    result = compile_module("wide", (model, (x,)), CodecSpec("W", external_weights=True), tmp_path / "W",
                            progress=False, samples=2)
    (d,) = delegates(Path(result.pte).read_bytes())
    entries, skeleton = external.unpack(d.payload)
    shapes = {c.name: c for c in iter_constants(skeleton)}
    assert len(entries) > 4  # four weights and biases, and helpers
    assert all(e.tensor in shapes or e.nbytes >= external.MIN_BYTES for e in entries)
    assert validate(result.pte).verdict is Verdict.PASS
