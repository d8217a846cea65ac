"""External weights on the other targets, each through its own mechanism (issue 52):
XNNPACK's external constants (the quantized program's lifted constants tagged), Ethos-U's
external Vela blocks (Arm's `external_block_placements`), and VGF's one-line refusal."""

from __future__ import annotations

import hashlib

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from codec_tosa import CodecQuantizer, CodecSpec, CodecTosaPartitioner, save
from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.runtime.executorch_runner import run_pte
from codec_tosa.runtime.pte import PteError, delegates, named_data_in_pte, program_files
from codec_tosa.serialization import external
from codec_tosa.targets import target_of
from codec_tosa.targets.named_data import check_named_data
from codec_tosa.validation.validate import Verdict, validate
import small_models


def _quantized(spec: CodecSpec, model_name: str = "mobile_block"):
    model, example = getattr(small_models, model_name)()
    quantizer = CodecQuantizer(spec)
    prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
    for batch in small_models.calibration(example):
        prepared(*batch)
    return model, example, quantizer, torch.export.export(convert_pt2e(prepared), example)


@pytest.fixture(scope="module")
def xnnpack() -> dict:
    out = {}
    for ext in (False, True):
        model, example, quantizer, quantized = _quantized(CodecSpec("I", target="xnnpack", external_weights=ext))
        quantizer.tag_external_weights(quantized)
        program = to_edge_transform_and_lower(quantized, partitioner=[XnnpackPartitioner()]).to_executorch()
        out[ext] = (program, program_files(program))
    out["example"], out["model"], out["quantizer"] = example, model, quantizer
    return out


def test_xnnpack_constants_go_to_the_ptd_and_outputs_are_bit_identical(xnnpack) -> None:
    _, inline = xnnpack[False]
    _, ext = xnnpack[True]
    assert inline.ptd is None and ext.ptd is not None
    (d_inline,), (d_ext,) = delegates(inline.pte), delegates(ext.pte)
    keys = target_of("xnnpack").named_data_keys(d_ext.payload)
    # the same constants under the same keys (sha256 of their bytes), now all in the .ptd
    assert keys == target_of("xnnpack").named_data_keys(d_inline.payload) and len(keys) >= 6
    assert set(keys) <= set(named_data_in_pte(inline.pte)) and not set(keys) & set(named_data_in_pte(ext.pte))
    assert all(len(ext.ptd.get(k)) == n for k, n in keys.items())
    assert len(ext.pte) + sum(keys.values()) <= len(inline.pte) + 1024
    check_named_data(ext.pte, ext.ptd, "model.pte")
    for s in range(3):
        x = [torch.randn(xnnpack["example"][0].shape, generator=torch.Generator().manual_seed(s))]
        want, got = run_pte(inline.pte, x), run_pte(ext, x)
        assert [t.numpy().tobytes() for t in got] == [t.numpy().tobytes() for t in want]


def test_an_xnnpack_pte_without_its_ptd_is_refused_before_it_loads(xnnpack, tmp_path) -> None:
    """XNNPACK in executorch 1.5.1 crashes the process on this: never get there."""
    _, ext = xnnpack[True]
    with pytest.raises(PteError, match=r"model\.ptd: missing: delegate 0 of .*model\.pte reads \d+ blobs"):
        check_named_data(ext.pte, None, tmp_path / "model.pte")
    (tmp_path / "model.pte").write_bytes(ext.pte)
    with pytest.raises(PteError, match="model.ptd: missing"):
        validate(tmp_path / "model.pte")


def test_save_writes_an_xnnpack_pair_that_validate_runs(xnnpack, tmp_path) -> None:
    program, _ = xnnpack[True]
    pte = save(program, xnnpack["quantizer"], tmp_path / "out", model=xnnpack["model"], samples=2)
    assert (pte.parent / "model.ptd").is_file()
    v = validate(pte)
    assert v.verdict is Verdict.INCOMPLETE  # XNNPACK is held to eager by SQNR (docs/DESIGN.md, "XNNPACK")
    assert all(o.sqnr_db is not None and o.sqnr_db > 20 for o in v.outputs), "\n".join(v.lines())
    assert any(n.startswith("named data: ") for n in v.notes)


def test_ethos_u_weight_block_goes_to_the_ptd(tmp_path) -> None:
    target = "ethos-u85-256"
    lowered = {}
    for ext in (False, True):
        spec = CodecSpec("I", target=target, external_weights=ext)
        _, _, _, quantized = _quantized(spec)
        program = to_edge_transform_and_lower(quantized, partitioner=[CodecTosaPartitioner(spec)]).to_executorch()
        lowered[ext] = program_files(program)
    blocks = {ext: arm_adapter.vela_blocks(delegates(lowered[ext].pte)[0].payload) for ext in (False, True)}
    inline = {name: data for name, _, data in blocks[False]}
    external_blocks = [(name, data) for name, ext, data in blocks[True] if ext]
    assert [name for name, _ in external_blocks] == ["weight_data"]
    assert not any(ext for _, ext, _ in blocks[False]) and lowered[False].ptd is None
    key = external_blocks[0][1].decode()
    weights = bytes(lowered[True].ptd.get(key))
    # Arm's key: sha256(placement NUL data), the placement being codec_tosa's tag
    assert weights == inline["weight_data"] and key == hashlib.sha256(
        external.TAG.encode() + b"\0" + weights).hexdigest()
    # every other block is as inline
    assert {n: d for n, e, d in blocks[True] if not e} == {n: d for n, d in inline.items() if n != "weight_data"}
    assert target_of(target).named_data_keys(delegates(lowered[True].pte)[0].payload) == {key: None}
    check_named_data(lowered[True].pte, lowered[True].ptd, "model.pte")
    with pytest.raises(PteError, match="does not hold"):
        check_named_data(lowered[True].pte, _other_ptd(), "model.pte")


def _other_ptd():
    spec = CodecSpec("W", external_weights=True)
    model, example = small_models.linear_head()
    part = CodecTosaPartitioner(spec, calibration=small_models.calibration(example))
    program = to_edge_transform_and_lower(torch.export.export(model, example), partitioner=[part]).to_executorch()
    return program_files(program).ptd


def test_vgf_refuses_external_weights_naming_the_version() -> None:
    with pytest.raises(ValueError, match=r"VgfBackend has no named-data support in executorch 1\.5\.1"):
        CodecQuantizer(CodecSpec("I", target="vgf", external_weights=True))
