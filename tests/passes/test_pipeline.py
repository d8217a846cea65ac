"""The declared pass order (`codec_tosa._passes.PIPELINE`) is the order compiles run our passes in."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import CodeType
from typing import Any, Callable, Iterator

import pytest
import torch

import small_models
from codec_tosa import _passes
from codec_tosa._passes import PIPELINE, Stage
from codec_tosa._passes.pass_base import CodecPass
from codec_tosa.arm.pipeline import CodecArmPassManager
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.compiler import lower_program


def _pass_class(module: str, name: str) -> type[CodecPass]:
    return getattr(importlib.import_module(f"codec_tosa._passes.{module}"), name)


def _entry_code(module: str, name: str) -> CodeType:
    return _pass_class(module, name).call.__code__


def test_every_pass_module_is_declared_once() -> None:
    modules = {p.stem for p in Path(_passes.__file__).parent.glob("*.py")} - {"__init__"}
    declared = [e.module for e in PIPELINE]
    assert sorted(declared) == sorted(set(declared))
    assert modules == set(declared) | set(_passes.HELPERS)
    for e in PIPELINE:  # one signature: every pass is a CodecPass (torch.fx's PassBase)
        assert issubclass(_pass_class(e.module, e.pass_class), CodecPass), e.pass_class
    stages = [list(Stage).index(e.stage) for e in PIPELINE]
    assert stages == sorted(stages), "PIPELINE lists the stages in flow order"


def _run_recorded(compile_: Callable[[], Any]) -> list[str]:
    """Which of our passes `compile_` calls, in call order (repeats collapsed)."""
    codes = {_entry_code(e.module, e.pass_class): e.module for e in PIPELINE}
    calls: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            name = codes[frame.f_code]
            if not calls or calls[-1] != name:
                calls.append(name)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        compile_()
    finally:
        sys.setprofile(previous)
    return calls


def _in_declared_order(calls: list[str]) -> None:
    order = {e.module: i for i, e in enumerate(PIPELINE)}
    first = list(dict.fromkeys(calls))
    assert [order[c] for c in first] == sorted(order[c] for c in first), first
    requires = {e.module: e.requires for e in PIPELINE}
    for i, c in enumerate(first):
        missing = [r for r in requires[c] if r in order and r not in first[:i]]
        assert not missing, f"{c} ran before {missing}"


def test_a_mixed_policy_compile_runs_its_passes_in_the_declared_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Policy W through the partitioner: batch norms folded, the plan materialised, the
    codecs lowered, lone batch norms given a convolution and permutes moved inside Arm's pipeline, CONST_SHAPEs merged
    after it; and Arm's pass list has our passes right before their anchors."""
    pass_lists: list[list[type]] = []
    apply = CodecArmPassManager._apply_pass_insertions

    def kept(self: Any) -> None:
        apply(self)
        pass_lists.append([type(p) for p in self.passes])

    monkeypatch.setattr(CodecArmPassManager, "_apply_pass_insertions", kept)
    model, x = small_models.conv_bn_relu6()
    calls = _run_recorded(lambda: lower_program(torch.export.export(model, x), CodecSpec(policy="W"),
                                                small_models.calibration(x)))
    _in_declared_order(calls)
    assert calls == ["fold_batch_norm", "materialize_codecs", "lower_codecs", "batch_norm_convolutions",
                     "permutes_onto_codes", "const_shape_dedup"]

    assert pass_lists
    for entry in (e for e in PIPELINE if e.stage is Stage.ARM_PIPELINE):
        for passes in pass_lists:
            names = [t.__name__ for t in passes]
            at = names.index(entry.pass_class)
            assert entry.anchor in [t.__name__ for t in passes[at + 1].__mro__], (entry.pass_class, names[at + 1])


def test_an_integer_compile_runs_its_passes_in_the_declared_order() -> None:
    """Policy I through CodecQuantizer: the annotation-stage rewrites first; no plan to
    materialise or lower (Arm folds the quantizer's q/dq itself)."""
    model, x = small_models.conv_cat_reshape()
    calls = _run_recorded(lambda: lower_program(torch.export.export(model, x), CodecSpec(policy="I"),
                                                small_models.calibration(x)))
    _in_declared_order(calls)
    assert calls[:2] == ["mean_to_avg_pool", "shape_reads_to_full"]
    assert "materialize_codecs" not in calls and "lower_codecs" not in calls


def _depth(sources: Any) -> int:
    """Levels of a `from_node` chain (0: none)."""
    return 1 + max((_depth(s.from_node) for s in sources), default=0) if sources else 0


def _deepest(graph_module: torch.fx.GraphModule) -> int:
    return max((_depth(n.meta.get("from_node")) for n in graph_module.graph.nodes), default=0)


def test_dropping_provenance_history_keeps_the_source_and_leaves_the_original_alone() -> None:
    from torch.fx.traceback import NodeSource

    from codec_tosa.arm.pipeline import drop_provenance_history

    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    root = NodeSource(node, "export")
    middle = NodeSource(node, "decompose")
    middle.from_node = [root]
    top = NodeSource(node, "arm")
    top.from_node = [middle]
    node.meta["from_node"] = [top]
    drop_provenance_history(gm)
    kept = node.meta["from_node"]
    assert _depth(kept) == 1 and kept[0].name == node.name and kept[0].pass_name == "arm"
    assert top.from_node == [middle] and _depth([top]) == 3  # shared objects are not mutated


def test_arm_passes_run_without_provenance_history_and_the_bytes_do_not_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch deep-copies a node's whole `from_node` chain into each node a pass makes,
    and the chain grows a level per pass that retraces; the pipeline drops it before
    each of Arm's passes. Kept, it grows past that; dropped, the artefact is the same."""
    from codec_tosa.arm import pipeline as arm_pipeline

    model, x = small_models.attention()
    program = torch.export.export(model, x)
    deepest: list[int] = []
    call = arm_pipeline._ArmPass.__call__

    def watched(self: Any, graph_module: torch.fx.GraphModule) -> Any:
        result = call(self, graph_module)
        deepest.append(_deepest(getattr(result, "graph_module", graph_module)))
        return result

    monkeypatch.setattr(arm_pipeline._ArmPass, "__call__", watched)
    dropped = lower_program(program, CodecSpec("W"), small_models.calibration(x)).pte
    assert max(deepest) <= 3, max(deepest)  # the node it was made from, and at most its one-pass history
    bounded, deepest[:] = max(deepest), []
    monkeypatch.setattr(arm_pipeline, "drop_provenance_history", lambda gm: None)
    kept = lower_program(program, CodecSpec("W"), small_models.calibration(x)).pte
    assert max(deepest) > bounded + 2, (max(deepest), bounded)
    assert dropped == kept
