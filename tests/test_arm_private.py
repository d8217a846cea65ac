"""The private parts of executorch's Arm backend codec_tosa relies on (`arm_private`).

Each symbol is checked at import; these tests check that the check fails as it
should (one line, the version, the symbol), and that each hook still changes
what it is there to change, so that an upgrade which makes one obsolete or
breaks one is noticed. The other hooks' upstream-behaviour tests live with the
behaviour: tests/fuzz/test_fuzz.py (cat([a, a]); a batch norm of a batch norm, which
our BatchNormConvolutionsPass, inserted through Arm's pass manager, now handles),
tests/passes/test_permutes_onto_codes.py (permutes crossing codecs),
tests/passes/test_permute_scans.py (the propagation's scans without a re-trace each; Arm's
passes reported as steps),
tests/runtime/test_vgf.py (VgfBackend's TOSA step, `vgf_compile`),
tests/tools/test_integer_policies.py (`vela_compile`), tests/runtime/test_external_weights_targets.py
(`arm_vela._BLOCK_HEADER`, `_BLOCK_ALIGNMENT`: Vela's blocks read back as Arm wrote them) and
tests/serialization/test_golden.py (the whole lowering, byte for byte against stock).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import small_models
from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.arm import private as arm_private
from codec_tosa.arm import stock
from codec_tosa.arm.pipeline import CodecArmPassManager, CodecMoveToSmallerDtypePass
from codec_tosa.validation.simulation import simulate
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.reference_model import run_reference_model
from codec_tosa.runtime.pte import delegate_payload
from pooling_support import lower_pooled


def test_a_changed_private_symbol_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A symbol with other parameters, or none at all: one line naming executorch's
    version, the symbol and what it is used for."""
    from executorch.backends.arm import process_node
    from executorch.backends.arm.vgf import backend as vgf_backend

    arm_private.check()  # as pinned
    monkeypatch.setattr(vgf_backend, "vgf_compile", lambda tosa, flags: None)
    with pytest.raises(arm_private.ArmPrivateMismatch) as changed:
        arm_private.check()
    message = str(changed.value)
    assert "\n" not in message
    assert f"executorch {arm_private.executorch_version()}" in message
    assert "vgf.backend.vgf_compile takes (tosa, flags), expected (tosa_flatbuffer, compile_flags," in message
    assert "VGF payload" in message  # what it is for

    monkeypatch.undo()
    monkeypatch.delattr(process_node, "_add_const")
    with pytest.raises(arm_private.ArmPrivateMismatch, match=r"process_node\._add_const is missing"):
        arm_private.check()


def test_importing_codec_tosa_on_a_changed_executorch_fails_before_anything_runs(tmp_path: Path) -> None:
    """The check runs when the package is imported, not at the first lowering."""
    script = ("import executorch.backends.arm.process_node as p\n"
              "del p._add_const\n"
              "import codec_tosa.targets.tosa.partitioner\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("codec_tosa.arm.private.ArmPrivateMismatch: codec_tosa needs executorch 1.5.1"), last
    assert "process_node._add_const is missing" in last


def test_arm_builds_the_pass_manager_handed_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """`TOSABackend._preprocess_module` constructs its pass manager from the name
    `executorch.backends.arm._passes.ArmPassManager` at call time (once per graph);
    ours is handed in there, and its insertions run: no quantize/dequantize of the
    plan reaches Arm's visitors, and the artefact equals the simulation."""
    built: list[type] = []
    init = CodecArmPassManager.__init__

    def counted(self: Any, compile_spec: Any) -> None:
        built.append(type(self))
        init(self, compile_spec)

    monkeypatch.setattr(CodecArmPassManager, "__init__", counted)
    model, x = small_models.conv_cat_reshape()
    low = lower_program(torch.export.export(model, x), CodecSpec(policy="W"), small_models.calibration(x))
    assert built and all(issubclass(t, CodecArmPassManager) and t.options.lower_codecs for t in built)
    held_out = torch.randn(x[0].shape, generator=torch.Generator().manual_seed(99))
    (ref,) = run_reference_model(delegate_payload(low.pte), [held_out.numpy()])
    (sim,) = simulate(low.planned, (held_out,))
    np.testing.assert_array_equal(ref.reshape(sim.shape), sim.detach().numpy())


def test_arm_moves_a_codec_cast_across_its_rescale_without_our_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A codec with a zero point has a CAST beside its RESCALE (encode: CAST f32->i16 ->
    RESCALE i16->i8; decode: RESCALE i8->i16 -> CAST i16->f32). Arm's
    MoveDataMovementOpsToSmallerDtypePass counts the CAST as a layout operator and,
    left alone, moves it to the int8 side, so the decode's MUL reads int16 and the
    lowering fails. With `CodecMoveToSmallerDtypePass` the CAST stays."""
    model, x = small_models.conv_relu6_conv()
    calibration = small_models.calibration(x)
    lower_program(torch.export.export(model, x), CodecSpec(policy="W"), calibration)  # with our answer

    monkeypatch.delattr(CodecMoveToSmallerDtypePass, "_uses_wider_dtype")
    with pytest.raises(Exception) as failed:
        lower_program(torch.export.export(model, x), CodecSpec(policy="W"), calibration)
    cause = failed.value
    while cause.__cause__ is not None:
        cause = cause.__cause__
    assert "Expected matching dtypes but got torch.int16 and torch.float32" in str(cause)


def test_graph_owned_constants_are_marked_where_arm_adds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arm adds parameters through `process_node._add_const` and shapes through the
    CONST_SHAPE visitor; marked, they are never pooled. Unmarked, the serializer
    would take every one of them for a helper constant."""
    model, x = small_models.conv_cat_reshape()
    (part,) = stock.stock_partitions(torch.export.export(model, x), arm_adapter.tosa_compile_spec("TOSA-1.0+FP"))
    _, marked = lower_pooled(part.program, "TOSA-1.0+FP")
    assert marked.graph_owned_consts >= 2  # a weight and a bias at least

    monkeypatch.setattr(arm_private, "graph_owned_constants_marked", contextlib.nullcontext)
    _, unmarked = lower_pooled(part.program, "TOSA-1.0+FP")
    assert unmarked.graph_owned_consts == 0
    # each of them is then a pooling request
    assert unmarked.helper_requests == marked.helper_requests + marked.graph_owned_consts


def test_arm_s_serializer_version_check_runs_for_our_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in `TOSABackend._preprocess`: a serializer that cannot write the compile
    spec's TOSA version is refused before anything is lowered."""
    import tosa_serializer as ts

    spec = arm_adapter.tosa_compile_spec("TOSA-1.0+FP")
    arm_adapter.new_serializer(spec)  # as pinned
    monkeypatch.setattr(ts, "TOSA_VERSION_MAJOR", ts.TOSA_VERSION_MAJOR + 1)  # a serializer for TOSA 2
    with pytest.raises(RuntimeError, match=r"TOSA serializer version \(2\.\d+\) doesn't match specification"):
        arm_adapter.new_serializer(spec)


def test_the_partitioner_hands_arm_an_intermediate_path(tmp_path: Path) -> None:
    """`CodecTosaPartitioner(..., intermediates=DIR)`: each delegate's TOSA lands in
    DIR as Arm's own backend writes it (`debug_tosa_dump`'s name, with the TOSA
    spec), and it is the delegate's payload."""
    from executorch.exir import to_edge_transform_and_lower

    from codec_tosa.targets.tosa.partitioner import CodecTosaPartitioner
    from codec_tosa.runtime.pte import delegates

    model, x = small_models.conv_cat_reshape()
    partitioner = CodecTosaPartitioner(CodecSpec(policy="W"), small_models.calibration(x),
                                       intermediates=str(tmp_path))
    pte = to_edge_transform_and_lower(torch.export.export(model, x), partitioner=[partitioner]).to_executorch()
    (payload,) = [d.payload for d in delegates(pte.buffer)]
    (dumped,) = tmp_path.glob("*.tosa")
    assert "TOSA-1.0+INT+FP" in dumped.name
    assert dumped.read_bytes() == payload


def test_a_lowering_fills_module_level_tables_that_are_emptied_after_it() -> None:
    """torchao's device cache (convert_pt2e), ExecuTorch's `is_same_node` cache (the
    partitioner), export's proxy map and torch.fx's source cache each keep a part of
    every lowering for the process's life; `lowering_tables_emptied` empties them
    after one (the precision search's candidates where they cannot run in a child
    process). Each is still there and still fills: else the workaround is obsolete."""
    import importlib
    import linecache

    import torch.fx.graph_module

    def table(module: str, name: str) -> Any:
        return getattr(importlib.import_module(module), name)

    caches = [table(*where) for where in arm_private._LOWERING_CACHES]
    proxies = table(*arm_private._EXPORT_PROXY_MAP)
    sources = torch.fx.graph_module._loader.eval_cache
    model, x = small_models.conv_cat_reshape()
    spec = arm_adapter.tosa_compile_spec("TOSA-1.0+INT")
    before = set(sources)
    with arm_private.lowering_tables_emptied():
        stock.stock_partitions(stock.stock_int8_program(model, x, spec), spec)
        assert all(cache.cache_info().currsize > 0 for cache in caches), [c.cache_info() for c in caches]
        made = set(sources) - before
        assert proxies and made and made <= set(linecache.cache)
    assert all(cache.cache_info().currsize == 0 for cache in caches)
    assert not proxies
    assert not made & set(sources) and not made & set(linecache.cache)
