"""The one module that touches executorch's Arm-private APIs.

executorch 1.5.1 is pinned; everything private that codec_tosa reuses from
`executorch.backends.arm` is reached through the functions here, so an
upgrade has one place to change and one golden test
(tests/test_golden.py) to tell whether it still matches stock Arm output.
"""

from __future__ import annotations

import copy
import io
import time
from contextlib import ExitStack, contextmanager, nullcontext, redirect_stdout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterable, Iterator

import tosa_serializer as ts
from executorch.backends.arm.tosa.backend import TOSABackend
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

if TYPE_CHECKING:
    from codec_tosa._passes.lower_codecs import CodecOps

SerializerFactory = Callable[..., ts.TosaSerializer]


def tosa_compile_spec(tosa_spec: str) -> TosaCompileSpec:
    """Arm's compile spec for a TOSA spec string such as ``TOSA-1.0+INT+FP``."""
    return TosaCompileSpec(tosa_spec)


def compile_spec_from_list(compile_specs: Iterable[CompileSpec]) -> TosaCompileSpec:
    """Parse a delegate's compile-spec list; unknown (codec_tosa) keys are ignored by Arm."""
    return TosaCompileSpec._from_list(list(compile_specs))


def new_serializer(
    compile_spec: TosaCompileSpec, factory: SerializerFactory = ts.TosaSerializer
) -> ts.TosaSerializer:
    """A serializer set up exactly as `TOSABackend._preprocess` sets up its own."""
    version = compile_spec.tosa_spec.version
    serializer = factory(
        "",
        targetMajor=version.major,
        targetMinor=version.minor,
        targetPatch=version.micro,
        targetDraft=version.minor > 0,
    )
    if compile_spec.tosa_dev_mode:
        serializer.setExperimentalDevVersion()
    return serializer


def lower_into(
    edge_program: ExportedProgram,
    compile_spec: TosaCompileSpec,
    serializer: ts.TosaSerializer,
    *,
    dedup_const_shapes: bool | None = None,
    lower_codecs: bool = False,
) -> bytes:
    """Run Arm's pass pipeline and node visitors into `serializer`; return the flatbuffer.

    Graph-owned constants (Arm's `process_node._add_const` and the CONST_SHAPE
    visitor) are added inside the serializer's `graph_owned_constants()`
    context when it has one (`PooledTosaSerializer`), so only helper constants
    are pooled. `dedup_const_shapes` merges identical static CONST_SHAPE FX
    nodes after Arm's pass pipeline (in every control-flow submodule too);
    None means "when the serializer pools", so a plain serializer still gives
    stock bytes. `lower_codecs` (a program that carries a codec plan) runs
    `LowerCodecsPass` inside Arm's pipeline; off, the lowering is stock.
    """
    if dedup_const_shapes is None:
        dedup_const_shapes = hasattr(serializer, "graph_owned_constants")
    with ExitStack() as patches:
        patches.enter_context(_graph_owned_constants_marked())
        patches.enter_context(_cat_with_repeated_inputs_kept())
        patches.enter_context(_batch_norm_convolutions_typed())
        if dedup_const_shapes:
            patches.enter_context(_const_shape_dedup_after_arm_passes(serializer))
        if lower_codecs:
            patches.enter_context(_codecs_lowered_before_quant_decomposition())
            patches.enter_context(_permutes_cross_codecs())
        TOSABackend._preprocess_module(
            edge_program.graph_module, edge_program, compile_spec, serializer, None
        )
    return bytes(serializer.serialize())


def _graph_owned(tosa_graph: Any) -> ContextManager[None]:
    marker = getattr(tosa_graph, "graph_owned_constants", None)
    return marker() if marker is not None else nullcontext()


@contextmanager
def _patched(owner: Any, attribute: str, replacement: Any) -> Iterator[None]:
    """Replace `owner.attribute` for the block; an inherited one is shadowed, then unshadowed."""
    own = attribute in owner.__dict__
    original = owner.__dict__.get(attribute)
    setattr(owner, attribute, replacement)
    try:
        yield
    finally:
        if own:
            setattr(owner, attribute, original)
        else:
            delattr(owner, attribute)


@contextmanager
def _cat_with_repeated_inputs_kept() -> Iterator[None]:
    """Work around an executorch 1.5.1 bug that drops a concatenation.

    `PropagateViewCopyPermuteUpPass._maybe_split_upwards_cat_fanout` rebuilds a
    cat's tensor list from `all_input_nodes`, which lists each node once, so
    `cat([a, a])` followed by a permute becomes `cat([a])` and then `a`
    (RemoveNoopPass): a convolution after it gets half its input channels and
    the reference model aborts (found by the long fuzz profile; stock
    TOSAPartitioner + TOSABackend does the same). Such cats are left unsplit,
    which is always correct; other cats are untouched.
    """
    from executorch.backends.transforms.propagate_view_copy_permute_pass import (
        PropagateViewCopyPermuteUpPass as Up,
    )

    split = Up.__dict__["_maybe_split_upwards_cat_fanout"]

    def guarded(self: Any, node: Any, next_node: Any) -> bool:
        tensors = next_node.args[0] if next_node.args else ()
        if isinstance(tensors, (list, tuple)) and len(set(tensors)) != len(tensors):
            return False
        return split(self, node, next_node)

    with _patched(Up, "_maybe_split_upwards_cat_fanout", guarded):
        yield


@contextmanager
def _batch_norm_convolutions_typed() -> Iterator[None]:
    """Work around an executorch 1.5.1 bug that fails on a batch norm of a batch norm.

    `FuseBatchNorm2dPass` gives a batch norm with no convolution of its own a
    new 1x1 depthwise one (`create_node`, no `meta["val"]`) and rewires the
    norm's readers to it; a second batch norm reading it then asks for its
    dtype (`KeyError: 'val'`; found by the long fuzz profile, stock
    TOSAPartitioner + TOSABackend fails the same way). That convolution has
    its input's shape and dtype, so it gets its input's `val`. Only a node
    that would otherwise have no `val` gets one; Arm re-traces after the pass.
    """
    import torch
    from executorch.backends.arm._passes import fuse_batch_norm2d_pass as fuse_bn
    from executorch.exir.dialects._ops import ops as exir_ops

    create_node = fuse_bn.create_node
    convolution = exir_ops.edge.aten.convolution.default

    def typed_create_node(graph: Any, op_target: Any, args: tuple[Any, ...] = (), *rest: Any,
                          **kwargs: Any) -> Any:
        node = create_node(graph, op_target, args, *rest, **kwargs)
        source = args[0] if args else None
        val = getattr(source, "meta", {}).get("val")
        if op_target == convolution and "val" not in node.meta and isinstance(val, torch.Tensor):
            node.meta["val"] = val
        return node

    with _patched(fuse_bn, "create_node", typed_create_node):
        yield


@contextmanager
def _graph_owned_constants_marked() -> Iterator[None]:
    """Mark Arm's graph-owned constant call sites for the duration of a lowering.

    In executorch 1.5.1 these are `process_node._add_const` (parameters,
    buffers, lifted constants, lookup tables, packed FP4, which is patched by
    name right after it is added) and the CONST_SHAPE visitor (its output is
    referred to by FX name). Both are looked up at call time (a module global
    and a class attribute), so wrapping them here is enough; no frames are
    inspected.
    """
    from executorch.backends.arm import process_node
    from executorch.backends.arm.operators.op_tosa_shapes import TosaConstShapeVisitor

    add_const = process_node._add_const
    define_const_shape = TosaConstShapeVisitor.define_node

    def owned_add_const(tosa_graph: Any, *args: Any, **kwargs: Any) -> None:
        with _graph_owned(tosa_graph):
            return add_const(tosa_graph, *args, **kwargs)

    def owned_const_shape(self: Any, node: Any, tosa_graph: Any, *args: Any, **kwargs: Any) -> None:
        with _graph_owned(tosa_graph):
            return define_const_shape(self, node, tosa_graph, *args, **kwargs)

    with _patched(process_node, "_add_const", owned_add_const), _patched(
        TosaConstShapeVisitor, "define_node", owned_const_shape
    ):
        yield


@contextmanager
def _const_shape_dedup_after_arm_passes(serializer: Any) -> Iterator[None]:
    """Run the CONST_SHAPE dedup on the output of Arm's backend pass pipeline.

    `_preprocess_module` runs `transform_to_backend_pipeline` once per graph
    (main graph and each control-flow submodule) right before visiting nodes,
    so that is where identical CONST_SHAPE nodes are final.
    """
    from executorch.backends.arm._passes import ArmPassManager
    from executorch.exir.dialects._ops import ops as exir_ops

    from codec_tosa._passes.const_shape_dedup import dedup_const_shapes

    target = exir_ops.backend.tosa.CONST_SHAPE.default
    pipeline = ArmPassManager.transform_to_backend_pipeline

    def pipeline_then_dedup(self: Any, *args: Any, **kwargs: Any) -> Any:
        graph_module = pipeline(self, *args, **kwargs)
        started = time.perf_counter()
        removed = dedup_const_shapes(graph_module, target)
        record = getattr(serializer, "record_const_shape_dedup", None)
        if record is not None:
            record(removed, time.perf_counter() - started)
        return graph_module

    with _patched(ArmPassManager, "transform_to_backend_pipeline", pipeline_then_dedup):
        yield


def codec_ops() -> "CodecOps":
    """The operator targets `LowerCodecsPass` reads and writes, as Arm 1.5.1 lowers them.

    `_to_dim_order_copy` with a dtype is what Arm's visitor serialises as TOSA
    CAST (and only fp32->int32 gets a truncation decoration, which the codecs
    never ask for); `tosa.RESCALE` is executorch's TOSA dialect op, which
    Arm's pipeline itself inserts before the point where the pass runs.
    """
    import executorch.backends.arm.tosa.dialect  # noqa: F401  (registers exir_ops.backend.tosa)
    from executorch.exir.dialects._ops import ops as exir_ops

    from codec_tosa._passes.lower_codecs import CodecOps

    qd = exir_ops.edge.quantized_decomposed
    aten = exir_ops.edge.aten
    return CodecOps(
        quantize=qd.quantize_per_tensor.default,
        dequantize=qd.dequantize_per_tensor.default,
        mul=aten.mul.Tensor,
        full=aten.full.default,
        cast=exir_ops.edge.dim_order_ops._to_dim_order_copy.default,
        rescale=exir_ops.backend.tosa.RESCALE.default,
    )


@contextmanager
def _codecs_lowered_before_quant_decomposition() -> Iterator[None]:
    """Insert `LowerCodecsPass` right before Arm's `DecomposeQuantNodesPass`.

    At that point `FoldAndAnnotateQParamsPass` has folded every q/dq around
    an INT8 operator into the operator, so what is left are exactly the
    plan's encodes, decodes and transcodes; after it, Arm's decomposition
    finds nothing of ours left. Uses the pass manager's own per-instance
    insertion hook (`_configure_pass_insertions` -> `insert_passes_before`),
    so no pipeline list is copied.

    `MoveDataMovementOpsToSmallerDtypePass` counts `_to_dim_order_copy` as a
    layout operator and would move the encode's CAST f32->int16 after the
    RESCALE int16->int8 that follows it (feeding FP32 to the RESCALE); a CAST
    of ours is not a layout operator, so the move is refused for it. Layout
    operators next to our RESCALE still move onto the int8 side.
    """
    from executorch.backends.arm._passes import ArmPassManager
    from executorch.backends.arm._passes.decompose_quant_nodes import DecomposeQuantNodesPass
    from executorch.backends.arm._passes.move_data_movement_ops_to_smaller_dtype_pass import (
        MoveDataMovementOpsToSmallerDtypePass as MoveToSmaller,
    )

    from executorch.exir.dialects._ops import ops as exir_ops

    from codec_tosa._passes.lower_codecs import CODEC_META_KEY, LowerCodecsPass
    from codec_tosa._passes.permutes_onto_codes import PermutesOntoCodesPass

    ops = codec_ops()
    permute = exir_ops.edge.aten.permute_copy.default
    configure = ArmPassManager.__dict__["_configure_pass_insertions"]
    uses_wider_dtype = MoveToSmaller.__dict__["_uses_wider_dtype"]

    def configure_with_codecs(self: Any, exported_program: ExportedProgram) -> None:
        configure(self, exported_program)
        self.insert_passes_before(DecomposeQuantNodesPass, [LowerCodecsPass(ops)])
        # after Arm's permute propagation, before it moves layout ops across RESCALEs
        self.insert_passes_before(MoveToSmaller, [PermutesOntoCodesPass(permute)])

    def layout_only(self: Any, data_movement: Any, rescale: Any, smaller_side: Any) -> bool:
        if CODEC_META_KEY in data_movement.meta:
            return False
        return uses_wider_dtype(self, data_movement, rescale, smaller_side)

    with _patched(ArmPassManager, "_configure_pass_insertions", configure_with_codecs), \
            _patched(MoveToSmaller, "_uses_wider_dtype", layout_only):
        yield


@contextmanager
def _permutes_cross_codecs() -> Iterator[None]:
    """Let Arm's permute propagation cross our codec operators in one step.

    `PropagateViewCopyPermute{Down,Up}Pass` move a permute along a chain of
    single-input elementwise operators, then re-trace the whole graph. A
    codec's MUL has a second input (its scale, a [1,1,1,1] constant), so each
    one stopped the permute for a full re-trace, and the region pass
    (`RemovePermutesAroundElementwiseTosaOps`) did not count its CAST
    (`_to_dim_order_copy`) as elementwise: ShuffleNetV2 at W took 160
    re-traces, 139 s of a 180 s lowering (stock INT8: 17). A permute commutes
    with an elementwise operator whose other inputs are all-ones broadcasts,
    so for our codec operators (and only those) the passes now cross them
    like any single-input operator (docs/DESIGN.md, "Codec lowering").
    Only where permutes travel changes, never what is computed; `_move_node`
    relinks input 0, which is the data input of every codec operator (the
    test suite checks the lowered codecs bit-exact on the reference model).
    """
    import torch
    from executorch.backends.transforms.fuse_identical_input_transforms_pass import (
        FuseIdenticalInputTransformsPass,
    )
    from executorch.backends.transforms.propagate_view_copy_permute_pass import (
        PropagateViewCopyPermuteDownPass as Down,
        PropagateViewCopyPermutePass as Base,
        PropagateViewCopyPermuteUpPass as Up,
    )
    from executorch.backends.transforms.remove_permutes_around_elementwise_ops import (
        RemovePermutesAroundElementwiseOps as Region,
    )

    from codec_tosa._passes.lower_codecs import CODEC_META_KEY

    is_layout_invariant = FuseIdenticalInputTransformsPass.is_layout_invariant
    can_move = Base.__dict__["_can_move_through_elementwise"]
    validated = Base.__dict__["_validated_next_nodes"]
    permutable = Region.__dict__["is_node_permutable"]

    def data_input_only(self: Any, moving: Any, codec: Any) -> bool:
        """`codec` is ours, elementwise, and reads one layout-carrying tensor, its input 0."""
        if moving.target not in self._permute_targets or CODEC_META_KEY not in codec.meta:
            return False
        if not self.is_elementwise(codec) or not isinstance(codec.meta.get("val"), torch.Tensor):
            return False
        rank = len(codec.meta["val"].shape)
        inputs = codec.all_input_nodes
        return all(is_layout_invariant(i, rank) for i in inputs[1:]) and not is_layout_invariant(inputs[0], rank)

    def down_can_move(self: Any, moving: Any, frontier: Any, next_node: Any) -> bool:
        if can_move(self, moving, frontier, next_node):
            return True
        return (data_input_only(self, moving, next_node) and next_node.all_input_nodes[0] is frontier
                and len(next_node.meta["val"].shape) == len(frontier.meta["val"].shape))

    def up_next_nodes(self: Any, moving: Any, frontier: Any, stale: Any) -> Any:
        next_nodes = validated(self, moving, frontier, stale)
        if next_nodes and len(next_nodes) > 1 and data_input_only(self, moving, frontier):
            return next_nodes[:1]  # the scale constant is not a branch to follow
        return next_nodes

    def codec_permutable(self: Any, node: Any) -> bool:
        return CODEC_META_KEY in node.meta or permutable(self, node)

    with _patched(Down, "_can_move_through_elementwise", down_can_move), \
            _patched(Up, "_validated_next_nodes", up_next_nodes), \
            _patched(Region, "is_node_permutable", codec_permutable):
        yield


def arm_compile_spec_entries(compile_spec: TosaCompileSpec) -> list[CompileSpec]:
    """The compile-spec list Arm itself would put in a delegate."""
    return list(compile_spec._to_list())


def stock_partitioner(compile_spec: TosaCompileSpec, **kwargs: Any):
    """Arm's own TOSA partitioner (used for operator support and the stock baseline)."""
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    return TOSAPartitioner(compile_spec, **kwargs)


ETHOS_U_BACKEND_ID = "EthosUBackend"
TOSA_BACKEND_ID = "TOSABackend"  # Arm's stock TOSA delegate: a TOSA flatbuffer, as ours


def arm_quantizer(tosa_spec: str, ethos_u_target: str | None = None) -> Any:
    """Arm's stock PT2E quantizer for the target, with its symmetric INT8 config
    everywhere: `CodecQuantizer` asks it which operators Arm's INT flow takes."""
    from executorch.backends.arm.quantizer import (
        EthosUQuantizer,
        TOSAQuantizer,
        get_symmetric_quantization_config,
    )

    quantizer = (EthosUQuantizer(ethos_u_compile_spec(ethos_u_target)) if ethos_u_target
                 else TOSAQuantizer(tosa_compile_spec(tosa_spec)))
    quantizer.set_global(get_symmetric_quantization_config())
    return quantizer



def ethos_u_compile_spec(target: str) -> Any:
    """Arm's Ethos-U compile spec for `target` (``ethos-u55-128``, ``ethos-u85-256``, ...).

    Raises ValueError, one line, for a target Arm does not know."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec

    try:
        return EthosUCompileSpec(target)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"unknown Ethos-U target {target!r}: {e} (expected e.g. ethos-u55-128, "
                         "ethos-u65-256, ethos-u85-256)") from None


@dataclass
class VelaRun:
    """One Vela compilation inside EthosUBackend: the TOSA it was given, the
    directory holding Vela's own output (``out.tosa``, ``output/*summary*.csv``)
    and what Vela printed (its operator counts, or why it refused)."""

    tosa: bytes
    directory: str
    log: str = ""


@contextmanager
def vela_runs_kept(directory: str) -> Iterator[list[VelaRun]]:
    """Keep each Vela run of EthosUBackend in a subdirectory of `directory`.

    Arm's backend calls `arm_vela.vela_compile` with an intermediate path only
    when the compile spec carries one, and that path would then be written into
    the .pte; instead the call is given one here (looked up as a module global
    of Arm's backend at call time), so the .pte stays as stock writes it."""
    import os

    from executorch.backends.arm.ethosu import backend as ethosu_backend

    compile_fn = ethosu_backend.vela_compile
    runs: list[VelaRun] = []

    def kept(tosa_flatbuffer: bytes, args: list[str], verbose: bool = False,
             intermediate_path: str | None = None, **kwargs: Any) -> Any:
        path = os.path.join(directory, f"delegate_{len(runs)}")
        os.makedirs(path, exist_ok=True)
        run = VelaRun(bytes(tosa_flatbuffer), path)
        runs.append(run)
        printed = io.StringIO()
        try:
            with redirect_stdout(printed):
                return compile_fn(tosa_flatbuffer, args, verbose=verbose, intermediate_path=path, **kwargs)
        finally:
            run.log = printed.getvalue()

    with _patched(ethosu_backend, "vela_compile", kept):
        yield runs


def ethos_u_partitioner(compile_spec: Any, **kwargs: Any) -> Any:
    """Arm's stock Ethos-U partitioner (INT operator support for the target)."""
    from executorch.backends.arm.ethosu import EthosUPartitioner

    return EthosUPartitioner(compile_spec, **kwargs)


def vela_available() -> bool:
    """Whether Arm's Vela wrapper could import Vela (`ethos-u-vela`)."""
    from executorch.backends.arm import arm_vela

    return bool(getattr(arm_vela, "has_vela", False))


@dataclass(frozen=True)
class StockPartition:
    """One delegate as stock Arm lowers it."""

    program: ExportedProgram  # copy of what TOSABackend received (lower a further copy)
    tosa_bytes: bytes  # stock TOSABackend output
    seconds: float  # stock TOSABackend._preprocess wall time


def stock_partitions(
    exported_program: ExportedProgram, compile_spec: TosaCompileSpec
) -> list[StockPartition]:
    """Lower with Arm's partitioner and backend; return each delegate's input and output.

    Used by tests and benchmarks to get exactly the programs a backend sees,
    without the codec_tosa backend. `lower_into` mutates its program, so lower
    a `copy.deepcopy` of `.program`.
    """
    from executorch.exir import to_edge_transform_and_lower

    captured: list[StockPartition] = []
    preprocess = TOSABackend.__dict__["_preprocess"].__func__

    def capturing(edge_program: ExportedProgram, spec: TosaCompileSpec) -> Any:
        program = copy.deepcopy(edge_program)
        started = time.perf_counter()
        result = preprocess(edge_program, spec)
        seconds = time.perf_counter() - started
        captured.append(StockPartition(program, bytes(result.processed_bytes), seconds))
        return result

    with _patched(TOSABackend, "_preprocess", staticmethod(capturing)):
        to_edge_transform_and_lower(
            exported_program, partitioner=[stock_partitioner(compile_spec)]
        )
    return captured


def stock_int8_program(
    model: Any, example_inputs: tuple[Any, ...], compile_spec: TosaCompileSpec
) -> ExportedProgram:
    """Arm's stock PT2E INT8 flow: symmetric config everywhere, calibrated on the example."""
    import torch
    from executorch.backends.arm.quantizer import (
        TOSAQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = TOSAQuantizer(compile_spec)
    quantizer.set_global(get_symmetric_quantization_config())
    # check_guards=False: Arm's annotation passes fail on the `_guards_fn` node.
    graph = torch.export.export(model, example_inputs).module(check_guards=False)
    prepared = prepare_pt2e(graph, quantizer)
    prepared(*example_inputs)
    return torch.export.export(convert_pt2e(prepared), example_inputs)


# --- VGF target (issue 15) ---------------------------------------------------
# The stock VGF runtime finds its delegate by the id "VgfBackend", and
# ExecuTorch's to_backend resolves an id to the direct BackendDetails subclass
# of that class name, so a VGF delegate is always preprocessed by Arm's
# VgfBackend. Its preprocess is TOSA lowering (TOSABackend._preprocess)
# followed by model-converter (vgf_compile); we substitute the first step only,
# so the payload is made by Arm's own conversion code (docs/DESIGN.md, "The VGF target").

VGF_BACKEND_ID = "VgfBackend"


def vgf_compile_spec_entries(tosa_spec: str) -> list[CompileSpec]:
    """The compile-spec list Arm's VgfPartitioner would put in a delegate for `tosa_spec`.

    The VGF runtime ignores compile specs (the payload is self-describing);
    VgfBackend.preprocess needs them (output format "vgf", TOSA spec, and the
    TOSA dev-mode flag VgfCompileSpec always sets in executorch 1.5.1).
    """
    from executorch.backends.arm.vgf import VgfCompileSpec

    return list(VgfCompileSpec(tosa_spec)._to_list())


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
    import os

    from executorch.backends.arm.vgf import backend as vgf_backend
    from executorch.backends.arm.vgf.model_converter import find_model_converter_binary
    from executorch.exir.backend.backend_details import PreprocessResult

    from codec_tosa.plan_meta import has_plan

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
    import os

    from executorch.backends.arm.vgf.model_converter import find_model_converter_binary

    set_path = model_converter is not None and find_model_converter_binary() is None
    if set_path:
        os.environ["MODEL_CONVERTER_PATH"] = str(model_converter)
    try:
        yield
    finally:
        if set_path:
            os.environ.pop("MODEL_CONVERTER_PATH", None)


def vgf_compile_spec(tosa_spec: str) -> Any:
    """Arm's VGF compile spec for `tosa_spec` (the stock VGF baselines)."""
    from executorch.backends.arm.vgf import VgfCompileSpec

    return VgfCompileSpec(tosa_spec)


def vgf_partitioner(compile_spec: Any, **kwargs: Any) -> Any:
    """Arm's stock VGF partitioner (delegates to VgfBackend: Arm's TOSA, then model-converter)."""
    from executorch.backends.arm.vgf import VgfPartitioner

    return VgfPartitioner(compile_spec, **kwargs)


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

    with _patched(vgf_backend, "vgf_compile", kept), _model_converter_found(model_converter):
        yield runs


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
