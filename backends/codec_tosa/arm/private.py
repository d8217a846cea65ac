"""Every private symbol of executorch's Arm backend that codec_tosa relies on, checked at import.

Arm's public extension points come first (`codec_tosa.arm.pipeline` hands Arm
a pass-manager subclass and subclasses of three of its passes). What is left
is listed in `PRIVATE_SYMBOLS`: a private method a subclass overrides, or a
module global / class attribute that one of the context managers below
replaces for the duration of one call. `check()` runs when `codec_tosa`
imports this module; on an executorch whose symbol is gone or takes other
parameters it fails in one line that names the version and the symbol, before
anything half works. Each entry has a test of the upstream behaviour it
changes (tests/test_arm_private.py and the tests it names), which fails when
that behaviour changes, so a workaround that is no longer needed is noticed.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import io
import os
import time
from contextlib import contextmanager, nullcontext, redirect_stdout
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

from executorch.backends.arm.tosa.backend import TOSABackend
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from torch.export import ExportedProgram

EXECUTORCH_PINNED = "1.5.1"


@dataclass(frozen=True)
class PrivateSymbol:
    """`module:qualname`, the parameters codec_tosa calls or overrides it with, and why."""

    module: str
    qualname: str
    parameters: tuple[str, ...] | None  # None: not called with arguments (a class, a module global)
    why: str

    @property
    def name(self) -> str:
        return f"{self.module}.{self.qualname}"

    def resolve(self) -> Any:
        owner: Any = importlib.import_module(self.module)
        for part in self.qualname.split("."):
            owner = getattr(owner, part)
        return owner


_PASSES = "executorch.backends.arm._passes"
_TRANSFORMS = "executorch.backends.transforms"

PRIVATE_SYMBOLS: tuple[PrivateSymbol, ...] = (
    # the lowering itself: Arm's pass pipeline and node visitors into our serializer
    PrivateSymbol("executorch.backends.arm.tosa.backend", "TOSABackend._preprocess_module",
                  ("graph_module", "edge_program", "compile_spec", "tosa_graph", "debug_hook",
                   "submodule_name", "containing_graph_module"),
                  "lower_into runs Arm's pipeline and visitors into a serializer of ours"),
    PrivateSymbol(_PASSES, "ArmPassManager", None,
                  "looked up by TOSABackend._preprocess_module at call time: where ours is handed in"),
    PrivateSymbol(_PASSES, "ArmPassManager._configure_pass_insertions", ("self", "exported_program"),
                  "documented for subclasses: where arm_pipeline inserts our passes"),
    PrivateSymbol(_PASSES, "ArmPassManager._transform", ("self", "exported_program", "graph_module"),
                  "runs self.passes: arm_pipeline reports each as it starts (progress.step)"),
    # Arm's passes arm_pipeline subclasses or inserts before (private modules)
    PrivateSymbol(f"{_PASSES}.decompose_quant_nodes", "DecomposeQuantNodesPass", None,
                  "LowerCodecsPass runs right before it"),
    PrivateSymbol(f"{_PASSES}.fuse_batch_norm2d_pass", "FuseBatchNorm2dPass", None,
                  "BatchNormConvolutionsPass runs right before it"),
    PrivateSymbol(f"{_PASSES}.propagate_view_copy_permute_pass", "PropagateViewCopyPermuteUpPass", None,
                  "subclassed: permutes cross codec operators"),
    PrivateSymbol(f"{_PASSES}.propagate_view_copy_permute_pass", "PropagateViewCopyPermuteDownPass", None,
                  "subclassed: permutes cross codec operators"),
    PrivateSymbol(f"{_PASSES}.remove_permutes_around_elementwise_tosa_ops",
                  "RemovePermutesAroundElementwiseTosaOps.is_node_permutable", ("self", "node"),
                  "subclassed: codec operators are permutable"),
    # private methods our pass subclasses override (arm_pipeline)
    PrivateSymbol(f"{_TRANSFORMS}.propagate_view_copy_permute_pass",
                  "PropagateViewCopyPermutePass._can_move_through_elementwise",
                  ("self", "moving_node", "frontier", "next_node"),
                  "a permute crosses a codec operator (docs/DESIGN.md, 'Codec lowering')"),
    PrivateSymbol(f"{_TRANSFORMS}.propagate_view_copy_permute_pass",
                  "PropagateViewCopyPermutePass._validated_next_nodes",
                  ("self", "node", "frontier", "stale_nodes"),
                  "a codec's scale constant is not a branch for a permute moving up"),
    PrivateSymbol(f"{_TRANSFORMS}.propagate_view_copy_permute_pass",
                  "PropagateViewCopyPermuteUpPass._maybe_split_upwards_cat_fanout",
                  ("self", "node", "next_node"),
                  "executorch 1.5.1 drops a tensor of cat([a, a]) when it splits the cat"),
    PrivateSymbol(f"{_TRANSFORMS}.propagate_view_copy_permute_pass",
                  "PropagateViewCopyPermutePass._retrace", ("self", "graph_module"),
                  "the propagation's scans refresh meta['val'] instead of re-tracing (issue 51)"),
    PrivateSymbol(f"{_PASSES}.move_data_movement_ops_to_smaller_dtype_pass",
                  "MoveDataMovementOpsToSmallerDtypePass._uses_wider_dtype",
                  ("self", "data_movement", "rescale", "smaller_side"),
                  "an encode's CAST is not a layout operator to move across its RESCALE"),
    # globals replaced for one call (the context managers below)
    PrivateSymbol("executorch.backends.arm.process_node", "_add_const",
                  ("tosa_graph", "values", "tosa_arg", "name"),
                  "Arm's graph-owned constants are not pooled (serialization/pooled.py)"),
    PrivateSymbol("executorch.backends.arm.operators.op_tosa_shapes", "TosaConstShapeVisitor.define_node",
                  ("self", "node", "tosa_graph", "inputs", "output"),
                  "a CONST_SHAPE is referred to by FX name, so it is graph-owned"),
    PrivateSymbol("executorch.backends.arm.tosa.backend", "TOSABackend._preprocess",
                  ("edge_program", "compile_spec"),
                  "VgfBackend's TOSA step runs ours for a planned partition, Arm's for any other"),
    PrivateSymbol("executorch.backends.arm.vgf.backend", "TOSABackend", None,
                  "VgfBackend reaches its TOSA step through this module global"),
    PrivateSymbol("executorch.backends.arm.vgf.backend", "vgf_compile",
                  ("tosa_flatbuffer", "compile_flags", "artifact_path", "tag_name"),
                  "the TOSA behind a VGF payload is kept (validate runs it on the reference model)"),
    PrivateSymbol("executorch.backends.arm.ethosu.backend", "vela_compile",
                  ("tosa_flatbuffer", "args", "verbose", "intermediate_path"),
                  "the TOSA behind an Ethos-U payload and Vela's own output are kept"),
    # read, not replaced: the header of each block of Vela's binary stream
    PrivateSymbol("executorch.backends.arm.arm_vela", "_BLOCK_HEADER", None,
                  "which blocks of an Ethos-U payload are external (named data in the .ptd)"),
    PrivateSymbol("executorch.backends.arm.arm_vela", "_BLOCK_ALIGNMENT", None,
                  "each block's data is padded to it"),
)


class ArmPrivateMismatch(ImportError):
    """The installed executorch lacks a private symbol codec_tosa relies on, or changed it."""


def executorch_version() -> str:
    try:
        return importlib.metadata.version("executorch")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _parameters(obj: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(obj).parameters)


def mismatch(symbol: PrivateSymbol) -> str | None:
    """Why `symbol` is not as codec_tosa expects it, or None."""
    try:
        obj = symbol.resolve()
    except (ImportError, AttributeError) as e:
        return f"{symbol.name} is missing ({e})"
    if symbol.parameters is not None:
        found = _parameters(obj)
        if found[:len(symbol.parameters)] != symbol.parameters:
            return f"{symbol.name} takes ({', '.join(found)}), expected ({', '.join(symbol.parameters)})"
    return None


def check(symbols: tuple[PrivateSymbol, ...] = PRIVATE_SYMBOLS) -> None:
    """Raise ArmPrivateMismatch, one line, for the first symbol that is not as expected."""
    for symbol in symbols:
        problem = mismatch(symbol)
        if problem is not None:
            raise ArmPrivateMismatch(
                f"codec_tosa needs executorch {EXECUTORCH_PINNED}'s Arm backend; executorch "
                f"{executorch_version()}: {problem} (used for: {symbol.why})")


@contextmanager
def patched(owner: Any, attribute: str, replacement: Any) -> Iterator[None]:
    """Replace `owner.attribute` for the block; an inherited one is shadowed, then unshadowed."""
    own = attribute in vars(owner)
    original = vars(owner).get(attribute)
    setattr(owner, attribute, replacement)
    try:
        yield
    finally:
        if own:
            setattr(owner, attribute, original)
        else:
            delattr(owner, attribute)


check()


# --- Arm's lowering, with our pass manager and constant ownership ---------------

@contextmanager
def pass_manager_handed_in(manager: type) -> Iterator[None]:
    """`TOSABackend._preprocess_module` constructs `ArmPassManager(compile_spec)`,
    imported from `executorch.backends.arm._passes` when called (once per graph:
    the main graph and each control-flow submodule). Arm has no parameter for
    a pass-manager class, so that name is `manager` (a subclass, arm_pipeline)
    for the block."""
    from executorch.backends.arm import _passes

    with patched(_passes, "ArmPassManager", manager):
        yield


def _graph_owned(tosa_graph: Any) -> ContextManager[None]:
    marker = getattr(tosa_graph, "graph_owned_constants", None)
    return marker() if marker is not None else nullcontext()


@contextmanager
def graph_owned_constants_marked() -> Iterator[None]:
    """Mark Arm's graph-owned constant call sites for the duration of a lowering.

    In executorch 1.5.1 these are `process_node._add_const` (parameters,
    buffers, lifted constants, lookup tables, packed FP4, which is patched by
    name right after it is added) and the CONST_SHAPE visitor (its output is
    referred to by FX name). Both are looked up at call time (a module global
    and a class attribute), so wrapping them is enough; no frames are inspected.
    Arm has no hook for who owns a constant; the pooling serializer needs to know.
    """
    from executorch.backends.arm import process_node
    from executorch.backends.arm.operators.op_tosa_shapes import TosaConstShapeVisitor

    add_const = process_node._add_const
    define_const_shape = TosaConstShapeVisitor.define_node

    @functools.wraps(add_const)
    def owned_add_const(tosa_graph: Any, *args: Any, **kwargs: Any) -> None:
        with _graph_owned(tosa_graph):
            return add_const(tosa_graph, *args, **kwargs)

    @functools.wraps(define_const_shape)
    def owned_const_shape(self: Any, node: Any, tosa_graph: Any, *args: Any, **kwargs: Any) -> None:
        with _graph_owned(tosa_graph):
            return define_const_shape(self, node, tosa_graph, *args, **kwargs)

    with patched(process_node, "_add_const", owned_add_const), patched(
        TosaConstShapeVisitor, "define_node", owned_const_shape
    ):
        yield


# --- what EthosUBackend and VgfBackend compile -----------------------------------

@dataclass
class VelaRun:
    """One Vela compilation inside EthosUBackend: the TOSA it was given, the
    directory holding Vela's own output (``out.tosa``, ``output/*summary*.csv``)
    and what Vela printed (its operator counts, or why it refused); `refused` is
    the error Vela raised, "" if it compiled."""

    tosa: bytes
    directory: str
    log: str = ""
    refused: str = ""
    flags: tuple[str, ...] = ()  # the compile flags it was given (the delegate's Vela configuration)


@contextmanager
def vela_runs_kept(directory: str) -> Iterator[list[VelaRun]]:
    """Keep each Vela run of EthosUBackend in a subdirectory of `directory`.

    Arm's backend calls `arm_vela.vela_compile` with an intermediate path only
    when the compile spec carries one, and that path would then be written into
    the .pte; instead the call is given one here (looked up as a module global
    of Arm's backend at call time), so the .pte stays as stock writes it."""
    from executorch.backends.arm.ethosu import backend as ethosu_backend

    compile_fn = ethosu_backend.vela_compile
    runs: list[VelaRun] = []

    @functools.wraps(compile_fn)
    def kept(tosa_flatbuffer: bytes, args: list[str], verbose: bool = False,
             intermediate_path: str | None = None, **kwargs: Any) -> Any:
        path = os.path.join(directory, f"delegate_{len(runs)}")
        os.makedirs(path, exist_ok=True)
        run = VelaRun(bytes(tosa_flatbuffer), path, flags=tuple(args))
        runs.append(run)
        printed = io.StringIO()
        try:
            with redirect_stdout(printed):
                return compile_fn(tosa_flatbuffer, args, verbose=verbose, intermediate_path=path, **kwargs)
        except Exception as e:
            run.refused = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            raise
        finally:
            run.log = printed.getvalue()

    with patched(ethosu_backend, "vela_compile", kept):
        yield runs


# --- VGF target (issue 15) ---------------------------------------------------
# The stock VGF runtime finds its delegate by the id "VgfBackend", and
# ExecuTorch's to_backend resolves an id to the direct BackendDetails subclass
# of that class name, so a VGF delegate is always preprocessed by Arm's
# VgfBackend. Its preprocess is TOSA lowering (TOSABackend._preprocess)
# followed by model-converter (vgf_compile); we substitute the first step only,
# so the payload is made by Arm's own conversion code (docs/DESIGN.md, "The VGF target").

def install_vgf_tosa_lowering(lower: Callable[[ExportedProgram, TosaCompileSpec], bytes],
                              model_converter: str | None = None) -> None:
    """From now on, Arm's VgfBackend converts the TOSA that `lower` makes of a
    partition that carries a codec plan (`plan_meta`); any other partition, stock
    Arm's own, is lowered by Arm's TOSABackend as before.

    `lower(edge_program, tosa_compile_spec)` replaces `TOSABackend._preprocess`
    as VgfBackend sees it: VgfBackend reaches TOSABackend through its module's
    global name, which is what is swapped (once per process; later calls only
    update `lower`). VgfBackend also uses `filter_tosa_compile_specs` (kept);
    any other attribute it starts using after an upgrade fails loudly here.

    `model_converter` is exported as MODEL_CONVERTER_PATH when Arm's lookup (that
    variable, then PATH) would not find one, e.g. when the venv's python runs
    without the venv's bin/ on PATH.
    """
    from executorch.backends.arm.vgf import backend as vgf_backend
    from executorch.backends.arm.vgf.model_converter import find_model_converter_binary
    from executorch.exir.backend.backend_details import PreprocessResult

    from codec_tosa.placement.meta import has_plan

    _VGF_LOWERING["lower"] = lower
    if model_converter is not None and find_model_converter_binary() is None:
        os.environ["MODEL_CONVERTER_PATH"] = str(model_converter)
    if getattr(vgf_backend.TOSABackend, "codec_tosa_dispatch", False):
        return

    def preprocess(edge_program: ExportedProgram, compile_spec: TosaCompileSpec) -> PreprocessResult:
        if has_plan(edge_program.graph_module):
            return PreprocessResult(processed_bytes=_VGF_LOWERING["lower"](edge_program, compile_spec))
        return TOSABackend._preprocess(edge_program, compile_spec)

    class TosaStep:
        """What VgfBackend.preprocess uses of TOSABackend in executorch 1.5.1."""

        codec_tosa_dispatch = True
        filter_tosa_compile_specs = staticmethod(TOSABackend.filter_tosa_compile_specs)
        _preprocess = staticmethod(preprocess)

    vgf_backend.TOSABackend = TosaStep


_VGF_LOWERING: dict[str, Callable[[ExportedProgram, TosaCompileSpec], bytes]] = {}


@contextmanager
def _model_converter_found(model_converter: str | None) -> Iterator[None]:
    """MODEL_CONVERTER_PATH set to `model_converter` for the duration when Arm's
    lookup (that variable, then PATH) would not find one."""
    from executorch.backends.arm.vgf.model_converter import find_model_converter_binary

    set_path = model_converter is not None and find_model_converter_binary() is None
    if set_path:
        os.environ["MODEL_CONVERTER_PATH"] = str(model_converter)
    try:
        yield
    finally:
        if set_path:
            os.environ.pop("MODEL_CONVERTER_PATH", None)


@dataclass
class VgfConversion:
    """One model-converter run inside Arm's VgfBackend: the TOSA given, the VGF made, wall time."""

    tag: str
    tosa: bytes
    vgf: bytes
    seconds: float


@contextmanager
def vgf_conversions_kept(model_converter: str | None = None) -> Iterator[list[VgfConversion]]:
    """Record every model-converter run of VgfBackend (ours or stock) while active.

    `model_converter` is used when Arm's own lookup finds none (as in
    `tosa_lowering_inside_vgf`), so stock Arm's VGF flow runs from the venv's
    python without the venv's bin/ on PATH.

    VgfBackend hands its TOSA to `vgf_compile`, a module global of Arm's
    backend looked up at call time, so wrapping it sees the converter's exact
    input and output without changing either; a failed conversion is recorded
    with an empty VGF before its error propagates.
    """
    from executorch.backends.arm.vgf import backend as vgf_backend

    compile_fn = vgf_backend.vgf_compile
    runs: list[VgfConversion] = []

    @functools.wraps(compile_fn)
    def kept(tosa_flatbuffer: bytes, compile_flags: list[str], artifact_path: str | None = None,
             tag_name: str = "") -> Any:
        run = VgfConversion(tag_name, bytes(tosa_flatbuffer), b"", 0.0)
        runs.append(run)
        started = time.perf_counter()
        try:
            vgf = compile_fn(tosa_flatbuffer, compile_flags, artifact_path, tag_name)
        finally:
            run.seconds = time.perf_counter() - started
        run.vgf = bytes(vgf)
        return vgf

    with patched(vgf_backend, "vgf_compile", kept), _model_converter_found(model_converter):
        yield runs


# --- the blocks of Vela's binary stream (issue 52) ----------------------------------

def vela_blocks(payload: bytes) -> list[tuple[str, bool, bytes]]:
    """(name, external, data) of each block of an Ethos-U payload, as Arm's `vela_compile`
    writes them (`arm_vela._BLOCK_HEADER`: name, length, external flag, reserved; the
    data padded to `_BLOCK_ALIGNMENT`); an external block's data is the named-data key
    of its bytes. Raises ValueError on a stream that does not parse."""
    from executorch.backends.arm import arm_vela

    header, alignment = arm_vela._BLOCK_HEADER, arm_vela._BLOCK_ALIGNMENT
    blocks, offset = [], 0
    while offset < len(payload):
        if offset + header.size > len(payload):
            raise ValueError(f"Vela block stream truncated at byte {offset}")
        name, length, external, _ = header.unpack_from(payload, offset)
        start = offset + header.size
        if start + length > len(payload):
            raise ValueError(f"Vela block {name.rstrip(bytes(1)).decode(errors='replace')} is truncated")
        blocks.append((name.rstrip(bytes(1)).decode(errors="replace"), bool(external),
                       bytes(payload[start:start + length])))
        offset = start + -(-length // alignment) * alignment
    return blocks


# --- the TOSA behind a VGF or Ethos-U payload ------------------------------------
# Arm's VgfBackend and EthosUBackend keep only what they compiled the TOSA into,
# but checking such a delegate on the TOSA reference model needs the TOSA itself
# (codec_tosa.save writes it beside the .pte as model.tosa). Both hand it to a
# module global of theirs (`vgf_compile`, `vela_compile`) looked up at call time,
# so a wrapper sees the TOSA and the payload made of it without changing either.

_JOURNAL: "dict[str, bytes]" = {}  # sha256 of a payload -> the TOSA it was compiled from
_JOURNAL_SIZE = 64  # the most recent payloads of the process


def install_payload_journal() -> None:
    """From now on, remember the TOSA behind each VGF and Ethos-U payload this
    process makes (idempotent; `CodecTosaPartitioner` and `CodecQuantizer` call it)."""
    from executorch.backends.arm.ethosu import backend as ethosu_backend
    from executorch.backends.arm.vgf import backend as vgf_backend

    for module, name in ((ethosu_backend, "vela_compile"), (vgf_backend, "vgf_compile")):
        compile_fn = getattr(module, name)
        if getattr(compile_fn, "codec_tosa_journal", False):
            continue

        @functools.wraps(compile_fn)
        def journaled(tosa_flatbuffer: bytes, *args: Any, _compile: Any = compile_fn, **kwargs: Any) -> Any:
            result = _compile(tosa_flatbuffer, *args, **kwargs)
            # Vela returns a VelaCompileResult whose processed_bytes are the payload
            payload = getattr(result, "processed_bytes", result)
            _remember(bytes(payload), bytes(tosa_flatbuffer))
            return result

        journaled.codec_tosa_journal = True  # type: ignore[attr-defined]
        setattr(module, name, journaled)


def _remember(payload: bytes, tosa: bytes) -> None:
    import hashlib

    _JOURNAL[hashlib.sha256(payload).hexdigest()] = tosa
    while len(_JOURNAL) > _JOURNAL_SIZE:
        _JOURNAL.pop(next(iter(_JOURNAL)))


def tosa_of_payload(payload: bytes) -> bytes | None:
    """The TOSA a VGF or Ethos-U payload of this process was compiled from, if journaled."""
    import hashlib

    return _JOURNAL.get(hashlib.sha256(bytes(payload)).hexdigest())


# --- what one lowering leaves behind in module-level tables (issue 50) ------------
# Not checked at import: a table that is gone only stops being emptied, nothing fails.
# tests/test_arm_private.py checks that each is still there and still fills.

# cached pure functions that an fx Node or a module, as key, keeps alive with all it reaches
_LOWERING_CACHES = (
    # the partitioner's node comparisons: every Node keeps its graph, so the whole
    # lowered program (constants, Vela's command stream)
    ("executorch.exir.backend.utils", "is_same_node"),
    # convert_pt2e's device lookup: the converted module with its weights
    ("torchao.utils", "_assert_and_get_unique_device"),
)
# export's map of the last trace's fake tensors to their proxies, whose Nodes keep the
# traced module's real weights; read only by that trace's leak report
_EXPORT_PROXY_MAP = ("torch.fx.experimental.proxy_tensor", "_FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT")


def _module_global(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


@contextmanager
def lowering_tables_emptied() -> Iterator[None]:
    """Around a convert, export and lowering whose results are dropped after it (one
    candidate of the precision search, when it cannot run in a child process): on the
    way out, empty what torch, torchao and ExecuTorch keep of it in module-level
    tables, which would otherwise hold each such lowering for the process's life
    (ResNet-18: 60 to 100 MB each). The two caches above (pure functions: only time is
    lost), export's proxy map, and torch.fx's source of each GraphModule compiled
    inside (graph_module._loader and linecache, kept for tracebacks: a lowering
    compiles some 400)."""
    import gc
    import linecache

    import torch.fx.graph_module

    sources = getattr(getattr(torch.fx.graph_module, "_loader", None), "eval_cache", {})
    before = set(sources)
    try:
        yield
    finally:
        for module, name in _LOWERING_CACHES:
            cache_clear = getattr(_module_global(module, name), "cache_clear", None)
            if cache_clear is not None:
                cache_clear()
        proxies = _module_global(*_EXPORT_PROXY_MAP)
        if isinstance(proxies, dict):
            proxies.clear()
        for name in set(sources) - before:
            del sources[name]
            linecache.cache.pop(name, None)
        gc.collect()  # the graphs' reference cycles, now rather than at the collector's next turn
