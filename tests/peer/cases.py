"""Arm's own operator tests (shipped in the executorch wheel) as a reusable case suite.

Each ``executorch/backends/arm/test/ops/test_*.py`` pairs small ``nn.Module``s with
test data inside its test functions, e.g.::

    @common.parametrize("test_data", Add.test_data)
    def test_add_tensor_tosa_INT(test_data):
        pipeline = TosaPipelineINT[input_t1](Add(), test_data(), aten_op, exir_op)
        pipeline.run()

The data dicts come in many shapes (lambdas returning inputs, lambdas returning
``(module, inputs)``, plain tuples, classes, module factories...), so instead of
parsing source we *run* each TOSA test function with the pipeline classes in its
module namespace replaced by a recorder: whatever the test constructs its
``TosaPipelineFP`` / ``TosaPipelineINT`` with is exactly the (module, inputs) pair
Arm tests. Every other pipeline (Ethos-U, VGF, OpNotSupported, Pass, Quantization
pipelines) is replaced by an inert stub, so nothing is ever lowered here.

A case is identified by ``<file>:<module class>:<test-data id>``; FP and INT tests
that use the same module class with the same test-data id collapse into one case.
Files or test functions that cannot give a case are kept in the list as skipped
entries (``skip`` set) so nothing disappears silently.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import itertools
import random
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from isolation import one_line

ARM_TESTS_PACKAGE = "executorch.backends.arm.test"
OPS_PACKAGE = f"{ARM_TESTS_PACKAGE}.ops"
# Arm's model tests of single torch.nn modules and functionals, pipelines like the
# operator tests' (arm_models.py runs them beside the whole models)
MODELS_PACKAGE = f"{ARM_TESTS_PACKAGE}.models"
MODULE_TEST_FILES = ("test_nn_modules.py", "test_nn_functional.py")
# Arm's conftest seeds every test with 0 by default (TEST_SEED); we do the same.
SEED = 0
# Test functions for hardware targets duplicate the TOSA ones with the same data.
_HARDWARE_MARKERS = ("u55", "u65", "u85", "vgf")
# The stock pipelines whose (module, inputs) we want.
_WANTED_PIPELINES = {"TosaPipelineFP": "FP", "TosaPipelineINT": "INT"}


@dataclass(frozen=True)
class PeerCase:
    """One (module, test data) pair from Arm's operator tests.

    ``build()`` re-runs the originating Arm test function with the recorder, seeded,
    so each call gives a fresh module and bit-identical inputs (and a case holds no
    tensors while it waits to be run)."""

    id: str
    file: str  # e.g. "test_add.py" (relative to executorch/backends/arm/test/ops)
    operator: str  # the file's operator name, e.g. "add" for test_add.py
    test: str = ""  # the first Arm test function that gave this pair
    param: str = ""  # the test-data id within that function's parametrisation
    flows: tuple[str, ...] = ()  # which Arm TOSA pipelines use it: "FP", "INT"
    arm_xfail: str | None = None  # Arm's own xfail/skip reason for it, if any
    input_dtypes: tuple[str, ...] = ()  # e.g. ("float32", "int64"); non-tensor inputs as their type
    skip: str | None = None  # set: this entry is not runnable, and why
    _build: Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]] | None = field(
        default=None, repr=False, compare=False
    )

    def build(self) -> tuple[torch.nn.Module, tuple[Any, ...]]:
        if self.skip is not None or self._build is None:
            raise RuntimeError(f"case {self.id} is skipped: {self.skip}")
        return self._build()


# --------------------------------------------------------------------------- recorder


class _Sink:
    """Absorbs whatever a test does with a pipeline after constructing it
    (``pipeline.run()``, ``pipeline.quantizer.set_io(...)``,
    ``pipeline.add_stage_after("export", pipeline.tester.check_count, {...})``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> "_Sink":
        return self

    def __getattr__(self, name: str) -> "_Sink":
        if name.startswith("__"):
            raise AttributeError(name)
        return self

    def __getitem__(self, key: Any) -> "_Sink":
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __bool__(self) -> bool:
        return False


@dataclass
class _Recorded:
    flow: str  # "FP" or "INT"
    module: Any
    inputs: Any


class _Recording:
    """The pipelines constructed during one test-function call."""

    def __init__(self) -> None:
        self.pipelines: list[_Recorded] = []

    def stub(self, flow: str | None) -> type:
        recording = self

        class StubPipeline(_Sink):
            # ``TosaPipelineINT[input_t1](...)``: the generic subscript is a no-op.
            def __class_getitem__(cls, item: Any) -> type:
                return cls

            def __init__(self, module: Any = None, test_data: Any = None, *args: Any, **kwargs: Any) -> None:
                if flow is not None:
                    recording.pipelines.append(_Recorded(flow, module, test_data))

        StubPipeline.__name__ = f"Recorded{flow or 'Ignored'}Pipeline"
        return StubPipeline


class _DirectLowering(Exception):
    """Raised instead of lowering when a test body exports or lowers by itself
    (not through a pipeline): such tests are not cases, and running them for real
    would make collection slow."""


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise _DirectLowering()


@functools.lru_cache(maxsize=1)
def _lowering_entry_points() -> tuple[tuple[type, ...], tuple[Any, ...]]:
    """(pipeline/tester base classes, lowering functions) a test module may hold."""
    import executorch.exir as exir
    from executorch.backends.arm.test.tester import test_pipeline
    from executorch.backends.arm.test.tester.arm_tester import ArmTester

    return (test_pipeline.BasePipeline, ArmTester), (exir.to_edge, exir.to_edge_transform_and_lower, torch.export.export)


def _patched_namespace(mod: types.ModuleType, recording: _Recording) -> dict[str, Any]:
    """Replacements for every pipeline class, tester and lowering function the test
    module can reach by name: wanted pipelines record, the rest do nothing or refuse."""
    (pipeline_base, tester), lowering = _lowering_entry_points()
    patches: dict[str, Any] = {}
    for name, value in vars(mod).items():
        if isinstance(value, type) and issubclass(value, pipeline_base):
            flow = next((f for n, f in _WANTED_PIPELINES.items() if value.__name__ == n), None)
            patches[name] = recording.stub(flow)
        elif isinstance(value, type) and issubclass(value, tester):
            patches[name] = recording.stub(None)
        elif any(value is f for f in lowering):
            patches[name] = _refuse
    return patches


def _seed() -> None:
    random.seed(SEED)
    torch.manual_seed(SEED)


def _seeded(value: Any) -> Any:
    """Wrap a test-data lambda so that it reseeds torch right before it runs: the
    inputs then do not depend on how much randomness module construction used."""
    if isinstance(value, types.FunctionType):

        @functools.wraps(value)
        def seeded(*args: Any, **kwargs: Any) -> Any:
            _seed()
            return value(*args, **kwargs)

        return seeded
    return value


def _record_call(mod: types.ModuleType, func: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[list[_Recorded], BaseException | None]:
    """Call one Arm test function with recording pipelines; returns what it built
    and the exception it raised, if any (recorded pipelines before it still count)."""
    recording = _Recording()
    patches = _patched_namespace(mod, recording)
    saved = {name: vars(mod)[name] for name in patches}
    vars(mod).update(patches)
    export = torch.export.export  # tests also call it as ``torch.export.export``
    torch.export.export = _refuse  # type: ignore[assignment]
    # Some test data is uninitialised memory (``torch.IntTensor(5)``); deterministic
    # mode makes torch fill it (NaN / max int) so rebuilt inputs are bit-identical.
    deterministic = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True, warn_only=True)
    error: BaseException | None = None
    try:
        _seed()
        func(**{k: _seeded(v) for k, v in kwargs.items()})
    except _DirectLowering:
        pass  # whatever pipelines it recorded before lowering by itself still count
    except Exception as e:  # noqa: BLE001 - any failure of the test body is data
        error = e
    finally:
        vars(mod).update(saved)
        torch.export.export = export  # type: ignore[assignment]
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
    return recording.pipelines, error


# --------------------------------------------------------------------------- parametrisation


@dataclass
class _Param:
    id: str
    kwargs: dict[str, Any]
    xfail: str | None


def _mark_reason(marks: Sequence[Any]) -> str | None:
    for m in marks:
        if m.name in ("xfail", "skip", "skipif"):
            reason = m.kwargs.get("reason") or (m.args[1] if m.name == "skipif" and len(m.args) > 1 else None)
            return f"{m.name}: {reason}" if reason else m.name
    return None


def _params(func: Callable[..., Any]) -> list[_Param] | None:
    """The cartesian product of a test function's ``parametrize`` marks (pytest
    applies them that way); None when it has arguments no mark provides (fixtures)."""
    marks = getattr(func, "pytestmark", [])
    axes: list[list[_Param]] = []
    for mark in marks:
        if mark.name != "parametrize":
            continue
        names = mark.args[0]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        ids = mark.kwargs.get("ids")
        axis: list[_Param] = []
        for i, ps in enumerate(mark.args[1]):
            if hasattr(ps, "values"):  # pytest.param(...)
                values, pid, pmarks = ps.values, ps.id, ps.marks
            else:
                values, pid, pmarks = ((ps,) if len(names) == 1 else tuple(ps)), None, ()
            if pid is None:
                pid = str(ids[i]) if isinstance(ids, (list, tuple)) else str(i)
            axis.append(_Param(pid, dict(zip(names, values)), _mark_reason(pmarks)))
        axes.append(axis)
    wanted = set(inspect.signature(func).parameters)
    given = {n for axis in axes for p in axis[:1] for n in p.kwargs}
    if wanted - given:
        return None
    combos: list[_Param] = []
    # pytest lists the mark closest to the function first; its id comes first too.
    for combo in itertools.product(*reversed(axes)) if axes else [()]:
        kwargs: dict[str, Any] = {}
        for p in combo:
            kwargs.update(p.kwargs)
        pid = "-".join(p.id for p in combo) or "default"
        xfail = next((p.xfail for p in combo if p.xfail), None)
        combos.append(_Param(pid, kwargs, xfail))
    return combos


# --------------------------------------------------------------------------- collection


def ops_dir(package: str = OPS_PACKAGE) -> Path:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0])


def _import_test_module(name: str, package: str = OPS_PACKAGE) -> types.ModuleType:
    """Import one Arm test file. test_transpose_conv2d.py does ``import conftest``
    (Arm's pytest conftest, on sys.path when pytest runs from their test dir); give
    it Arm's conftest under that name for the import only, without shadowing ours."""
    full = f"{package}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    arm_conftest_path = ops_dir().parent / "conftest.py"
    spec = importlib.util.spec_from_file_location("_arm_test_conftest", arm_conftest_path)
    assert spec is not None and spec.loader is not None
    arm_conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(arm_conftest)
    previous = sys.modules.get("conftest")
    sys.modules["conftest"] = arm_conftest
    try:
        return importlib.import_module(full)
    finally:
        if previous is None:
            sys.modules.pop("conftest", None)
        else:
            sys.modules["conftest"] = previous


def _as_inputs(value: Any) -> tuple[Any, ...]:
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    return (value,)


def _dtypes(inputs: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(str(a.dtype).removeprefix("torch.") if isinstance(a, torch.Tensor) else type(a).__name__ for a in inputs)


def _one_line(e: BaseException) -> str:
    return one_line(e, 300)  # a case's skip reason


def _builder(mod: types.ModuleType, func: Callable[..., Any], kwargs: dict[str, Any], index: int) -> Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]:
    def build() -> tuple[torch.nn.Module, tuple[Any, ...]]:
        recorded, error = _record_call(mod, func, kwargs)
        if index >= len(recorded):
            raise RuntimeError(f"rebuilding {func.__name__} gave {len(recorded)} pipelines ({error!r})")
        r = recorded[index]
        return r.module.eval(), _as_inputs(r.inputs)

    return build


def _file_cases(path: Path, package: str = OPS_PACKAGE) -> list[PeerCase]:
    stem = path.stem
    operator = stem.removeprefix("test_")
    try:
        mod = _import_test_module(stem, package)
    except Exception as e:  # noqa: BLE001
        return [PeerCase(id=f"{stem}:<import>", file=path.name, operator=operator, skip=f"import failed: {_one_line(e)}")]

    cases: dict[str, PeerCase] = {}
    skipped: list[PeerCase] = []
    hardware_only = True
    for fname, func in sorted(vars(mod).items()):
        if not (fname.startswith("test_") and callable(func) and getattr(func, "__module__", None) == mod.__name__):
            continue
        if any(m in fname.lower() for m in _HARDWARE_MARKERS):
            continue
        hardware_only = False
        params = _params(func)
        if params is None:
            skipped.append(PeerCase(id=f"{stem}:{fname}", file=path.name, operator=operator, test=fname, skip="needs pytest fixtures"))
            continue
        for p in params:
            recorded, error = _record_call(mod, func, p.kwargs)
            if not recorded and error is not None:
                skipped.append(
                    PeerCase(id=f"{stem}:{fname}[{p.id}]", file=path.name, operator=operator, test=fname, param=p.id, skip=f"test body raised: {_one_line(error)}")
                )
                continue
            for index, r in enumerate(recorded):
                if not isinstance(r.module, torch.nn.Module):
                    skipped.append(
                        PeerCase(id=f"{stem}:{fname}[{p.id}]#{index}", file=path.name, operator=operator, test=fname, param=p.id, skip=f"not an nn.Module: {type(r.module).__name__}")
                    )
                    continue
                cid = f"{stem}:{type(r.module).__name__}:{p.id}"
                if cid in cases:  # the same pair from another flow's test
                    old = cases[cid]
                    if r.flow not in old.flows:
                        cases[cid] = _with_flow(old, r.flow)
                    continue
                cases[cid] = PeerCase(
                    id=cid, file=path.name, operator=operator, test=fname, param=p.id,
                    flows=(r.flow,), arm_xfail=p.xfail or _mark_reason(getattr(func, "pytestmark", [])),
                    input_dtypes=_dtypes(_as_inputs(r.inputs)),
                    _build=_builder(mod, func, p.kwargs, index),
                )
    if not cases and not skipped:
        reason = "only hardware-target (Ethos-U/VGF) tests" if hardware_only else "no TosaPipelineFP/TosaPipelineINT test"
        skipped.append(PeerCase(id=f"{stem}:<none>", file=path.name, operator=operator, skip=reason))
    # Keep a skipped entry's id from colliding with a case's (or another skip's).
    seen = set(cases)
    unique_skips = []
    for s in skipped:
        if s.id not in seen:
            seen.add(s.id)
            unique_skips.append(s)
    return list(cases.values()) + unique_skips


def _with_flow(case: PeerCase, flow: str) -> PeerCase:
    from dataclasses import replace

    return replace(case, flows=tuple(sorted(case.flows + (flow,))))


@functools.lru_cache(maxsize=1)
def _collect() -> tuple[PeerCase, ...]:
    out: list[PeerCase] = []
    for path in sorted(ops_dir().glob("test_*.py")):
        out.extend(_file_cases(path))
    return tuple(out)


def module_test_cases() -> list[PeerCase]:
    """The runnable cases of Arm's model tests of single nn modules and functionals
    (`MODULE_TEST_FILES`), one per module, collected as the operator tests are."""
    folder = ops_dir(MODELS_PACKAGE)
    return [c for f in MODULE_TEST_FILES for c in _file_cases(folder / f, MODELS_PACKAGE) if c.skip is None]


def collect_cases(include_skipped: bool = True) -> list[PeerCase]:
    """All cases, in file order; skipped entries (``case.skip`` set) included
    unless ``include_skipped`` is False. Collection is cached per process."""
    cases = list(_collect())
    return cases if include_skipped else [c for c in cases if c.skip is None]


if __name__ == "__main__":
    import collections

    all_cases = collect_cases()
    runnable = [c for c in all_cases if c.skip is None]
    print(f"{len(runnable)} cases from {len({c.file for c in runnable})} files; {len(all_cases) - len(runnable)} skipped entries")
    reasons = collections.Counter((c.skip or "").split(":")[0] for c in all_cases if c.skip)
    for reason, n in reasons.most_common():
        print(f"  {n:4d} {reason}")
