"""Arm's TOSA pass pipeline with codec_tosa's passes in it, through Arm's extension points.

`CodecArmPassManager` is an `ArmPassManager` subclass. It uses what Arm's pass
manager offers subclasses in executorch 1.5.1:

- `_configure_pass_insertions` (documented "Subclasses can override this")
  with `insert_passes_before`: `BatchNormConvolutionsPass` right before Arm's
  `FuseBatchNorm2dPass`, `LowerCodecsPass` right before its
  `DecomposeQuantNodesPass`, `PermutesOntoCodesPass` right before the
  layout-to-smaller-dtype move;
- `add_pass`: three of Arm's passes are given codec_tosa's answers to their
  extension points (the same instance, re-classed to a subclass below, so its
  state and its place in the pipeline are Arm's);
- `transform_to_backend_pipeline`: the CONST_SHAPE dedup on its output.

The subclasses answer only for codec operators (`CODEC_META_KEY`) and for
cat([a, a]); on any other node they defer to Arm. Where an answer is a
private method it is listed, with its signature, in `arm_private`.
"""

from __future__ import annotations

import copy
import operator
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import torch

# first: it checks every private symbol below, so a changed executorch fails in one line
from codec_tosa.arm import private as arm_private  # noqa: F401,I001

from executorch.backends.arm._passes import ArmPassManager  # noqa: E402
from executorch.backends.arm._passes.decompose_quant_nodes import DecomposeQuantNodesPass
from executorch.backends.arm._passes.fuse_batch_norm2d_pass import FuseBatchNorm2dPass
from executorch.backends.arm._passes.move_data_movement_ops_to_smaller_dtype_pass import (
    MoveDataMovementOpsToSmallerDtypePass,
)
from executorch.backends.arm._passes.propagate_view_copy_permute_pass import (
    PropagateViewCopyPermuteDownPass,
    PropagateViewCopyPermuteUpPass,
)
from executorch.backends.arm._passes.remove_permutes_around_elementwise_tosa_ops import (
    RemovePermutesAroundElementwiseTosaOps,
)
from executorch.backends.transforms.fuse_identical_input_transforms_pass import (
    FuseIdenticalInputTransformsPass,
)
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.fx.passes.infra.pass_base import PassResult
from torch.utils import _pytree as pytree

from codec_tosa import progress
from codec_tosa._passes.batch_norm_convolutions import BatchNormConvolutionsPass
from codec_tosa._passes.const_shape_dedup import DedupConstShapesPass
from codec_tosa._passes.lower_codecs import CODEC_META_KEY, CodecOps, LowerCodecsPass
from codec_tosa._passes.permutes_onto_codes import PermutesOntoCodesPass


def codec_ops() -> CodecOps:
    """The operator targets `LowerCodecsPass` reads and writes, as Arm 1.5.1 lowers them.

    `_to_dim_order_copy` with a dtype is what Arm's visitor serialises as TOSA
    CAST (and only fp32->int32 gets a truncation decoration, which the codecs
    never ask for); `tosa.RESCALE` is executorch's TOSA dialect op, which
    Arm's pipeline itself inserts before the point where the pass runs.
    """
    import executorch.backends.arm.tosa.dialect  # noqa: F401  (registers exir_ops.backend.tosa)

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


# --- codec_tosa's answers to the extension points of three Arm passes ----------
# Arm's permute propagation moves a permute along a chain of single-input
# elementwise operators, then re-traces the whole graph. A codec's MUL has a
# second input (its scale, an all-ones-shaped constant), so each one stopped a
# permute for a full re-trace, and the region pass did not count its CAST as
# elementwise: ShuffleNetV2 at W took 160 re-traces, 139 s of a 180 s lowering
# (stock INT8: 17). A permute commutes with an elementwise operator whose other
# inputs are all-ones broadcasts, so codec operators are crossed like
# single-input ones (docs/DESIGN.md, "Codec lowering"). Only where permutes
# travel changes, never what is computed; `_move_node` relinks input 0, the
# data input of every codec operator.

def _codec_on_data_input(propagation: Any, moving: torch.fx.Node, codec: torch.fx.Node) -> bool:
    """`codec` is ours, elementwise, and reads one layout-carrying tensor, its input 0."""
    if moving.target not in propagation._permute_targets or CODEC_META_KEY not in codec.meta:
        return False
    if not propagation.is_elementwise(codec) or not isinstance(codec.meta.get("val"), torch.Tensor):
        return False
    rank = len(codec.meta["val"].shape)
    invariant = FuseIdenticalInputTransformsPass.is_layout_invariant
    inputs = codec.all_input_nodes
    return all(invariant(i, rank) for i in inputs[1:]) and not invariant(inputs[0], rank)


class CodecRegionPass(RemovePermutesAroundElementwiseTosaOps):
    """Arm's permute-region cancellation, counting our codec operators (their CAST too) as permutable."""

    def is_node_permutable(self, node: torch.fx.Node) -> bool:
        return CODEC_META_KEY in node.meta or super().is_node_permutable(node)


def _codec_region(propagation: Any) -> ExportPass | None:
    """The propagation's region pass (its public `make_fusion_pass`), codec-aware."""
    if getattr(propagation, "exported_program", None) is None:
        return None
    return CodecRegionPass(propagation.exported_program)


# --- the permute propagation's re-traces (issue 51) -------------------------------
# Arm's propagation loop (executorch 1.5.1, backends/transforms/propagate_view_copy_permute_pass)
# moves what it can in one scan, marking everything downstream of each move stale,
# then re-traces the whole graph (an ExportPass replay: fake-tensor propagation,
# a new GraphModule, codegen) to refresh `meta["val"]`, and scans again. On a chain
# (a transformer's residual stream) each scan moves about one permute per layer
# boundary, so the scans grow with depth and so does each re-trace: quadratic
# in layers (SmolLM2 at W: 20 re-traces at 1 layer, 62 at 4; stock FP 12 and 30).
# Between scans the loop reads only the graph and `meta["val"]`, so there the
# re-trace is replaced by recomputing `val` where it can have changed (a node whose
# arguments or val were rewritten, a new node, a reader of a value whose shape,
# dtype or strides changed), with the kernels the replay would run; the pass's
# last re-trace stays a real one, so the graph it hands on (node names included)
# is what a replay of the same final graph gives. Every decision sees the same
# shapes as before: same moves, same graph, same bytes.

# ArmPass.call_operator's quantized operators without a fake kernel (executorch 1.5.1,
# backends/arm/_passes/arm_pass.py): the replay makes their val as `_compute` does
_NO_FAKE_KERNEL = frozenset({exir_ops.edge.aten.bmm.default, exir_ops.edge.aten.leaky_relu.default})


def _fake_key(val: Any) -> Any:
    """What the propagation can read of a `meta["val"]`: shape, dtype, strides, device."""
    def key(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return (tuple(x.shape), x.dtype, tuple(x.stride()), x.device, x.storage_offset())
        return x
    return pytree.tree_map(key, val)


class _ValRefresher:
    """Keeps `meta["val"]` of a graph current between the propagation's scans."""

    def __init__(self, graph_module: torch.fx.GraphModule) -> None:
        self.seen: dict[torch.fx.Node, tuple[Any, Any, Any]] = {}
        self._snapshot(graph_module)

    def _snapshot(self, graph_module: torch.fx.GraphModule) -> None:
        self.seen = {n: (n.args, n.kwargs, n.meta.get("val")) for n in graph_module.graph.nodes}

    def refresh(self, graph_module: torch.fx.GraphModule) -> bool:
        """Recompute what can be stale; False where a node cannot be recomputed here
        (the caller then re-traces for real)."""
        mode = next((n.meta["val"].fake_mode for n in graph_module.graph.nodes
                     if n.op == "placeholder" and isinstance(n.meta.get("val"), FakeTensor)), None)
        if mode is None:
            return False
        changed: set[torch.fx.Node] = set()
        with mode, enable_python_dispatcher():
            for n in graph_module.graph.nodes:
                if n.op != "call_function":
                    continue
                old = self.seen.get(n)
                val = n.meta.get("val")
                if (old is not None and old[0] is n.args and old[1] is n.kwargs and old[2] is val
                        and not any(i in changed for i in n.all_input_nodes)):
                    continue
                try:
                    new = self._compute(n)
                except Exception:  # noqa: BLE001 - the real re-trace decides
                    return False
                if val is None or _fake_key(new) != _fake_key(val):
                    changed.add(n)
                n.meta["val"] = new
                n.meta["tensor_meta"] = pytree.tree_map(lambda _: None, new)
        self._snapshot(graph_module)
        return True

    @staticmethod
    def _compute(n: torch.fx.Node) -> Any:
        """What ExportPass's replay (with ArmPass.call_operator) sets as `n`'s val."""
        def data(a: Any) -> Any:
            return a.meta["val"] if isinstance(a, torch.fx.Node) else a

        args, kwargs = pytree.tree_map(data, (n.args, n.kwargs))
        if n.target in _NO_FAKE_KERNEL and len(n.meta.get("input_qparams", {})) > 0:
            old = n.meta["val"]
            qparams = n.meta.get("output_qparams", {})
            dtype = next(iter(qparams.values())).dtype if len(qparams) > 0 else old.dtype
            return torch.empty_like(old, dtype=dtype)
        if n.target is operator.getitem:
            return args[0][args[1]]
        return n.target(*args, **kwargs)


def _propagation_call(pass_cls: type, self: Any, graph_module: torch.fx.GraphModule) -> PassResult:
    """Arm's propagation with its intermediate re-traces replaced (see above)."""
    self._codec_refresher = _ValRefresher(graph_module)
    try:
        result = super(pass_cls, self).call(graph_module)
    finally:
        self._codec_refresher = None
    if not result.modified:
        return result
    return PassResult(super(pass_cls, self)._retrace(result.graph_module), True)


def _propagation_retrace(pass_cls: type, self: Any, graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    refresher = getattr(self, "_codec_refresher", None)
    if refresher is None:
        return super(pass_cls, self)._retrace(graph_module)
    graph_module.graph.eliminate_dead_code()
    graph_module.graph.lint()
    if refresher.refresh(graph_module):
        return graph_module
    graph_module = super(pass_cls, self)._retrace(graph_module)
    refresher._snapshot(graph_module)
    return graph_module


# single inheritance: Arm's instances are re-classed in place (`__class__`), which
# Python allows only between classes of one layout
class CodecPermuteDownPass(PropagateViewCopyPermuteDownPass):
    make_fusion_pass = _codec_region

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        return _propagation_call(CodecPermuteDownPass, self, graph_module)

    def _retrace(self, graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return _propagation_retrace(CodecPermuteDownPass, self, graph_module)

    def _can_move_through_elementwise(self, moving_node: torch.fx.Node, frontier: torch.fx.Node,
                                      next_node: torch.fx.Node) -> bool:
        if super()._can_move_through_elementwise(moving_node, frontier, next_node):
            return True
        return (_codec_on_data_input(self, moving_node, next_node)
                and next_node.all_input_nodes[0] is frontier
                and len(next_node.meta["val"].shape) == len(frontier.meta["val"].shape))


class CodecPermuteUpPass(PropagateViewCopyPermuteUpPass):
    make_fusion_pass = _codec_region

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        return _propagation_call(CodecPermuteUpPass, self, graph_module)

    def _retrace(self, graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return _propagation_retrace(CodecPermuteUpPass, self, graph_module)

    def _validated_next_nodes(self, node: torch.fx.Node, frontier: torch.fx.Node,
                              stale_nodes: set[torch.fx.Node]) -> list[torch.fx.Node] | None:
        next_nodes = super()._validated_next_nodes(node, frontier, stale_nodes)
        if next_nodes and len(next_nodes) > 1 and _codec_on_data_input(self, node, frontier):
            return next_nodes[:1]  # the scale constant is not a branch to follow
        return next_nodes

    def _maybe_split_upwards_cat_fanout(self, node: torch.fx.Node, next_node: torch.fx.Node) -> bool:
        """executorch 1.5.1 rebuilds the cat's tensor list from `all_input_nodes`,
        which lists each node once: `cat([a, a])` followed by a permute became
        `cat([a])`, then `a` (RemoveNoopPass), and a convolution after it got half
        its input channels (found by the long fuzz profile; stock Arm does the
        same). Such cats stay unsplit, which is always correct."""
        tensors = next_node.args[0] if next_node.args else ()
        if isinstance(tensors, (list, tuple)) and len(set(tensors)) != len(tensors):
            return False
        return super()._maybe_split_upwards_cat_fanout(node, next_node)


class CodecMoveToSmallerDtypePass(MoveDataMovementOpsToSmallerDtypePass):
    """Arm counts `_to_dim_order_copy` as a layout operator and would move an
    encode's CAST f32->int16 after the RESCALE int16->int8 that follows it
    (feeding FP32 to the RESCALE). A CAST of ours is not a layout operator;
    layout operators next to our RESCALE still move onto the int8 side."""

    def _uses_wider_dtype(self, data_movement: torch.fx.Node, rescale: torch.fx.Node,
                          smaller_side: torch.fx.Node) -> bool:
        if CODEC_META_KEY in data_movement.meta:
            return False
        return super()._uses_wider_dtype(data_movement, rescale, smaller_side)


# Arm's pass -> the subclass with our answers (same constructor, no state of its own)
SUBSTITUTES: dict[type, type] = {
    PropagateViewCopyPermuteDownPass: CodecPermuteDownPass,
    PropagateViewCopyPermuteUpPass: CodecPermuteUpPass,
    MoveDataMovementOpsToSmallerDtypePass: CodecMoveToSmallerDtypePass,
}


def drop_provenance_history(graph_module: torch.fx.GraphModule) -> None:
    """Keeps each node's `from_node` to the node it was made from, without that node's
    own history. torch's Interpreter deep-copies a node's whole `from_node` chain into
    every node a retracing pass makes, and the chain gains a level at each: over Arm's
    passes that copying was a quarter of a one-layer SmolLM2's TOSA lowering at I.
    Nothing reads the chain inside a delegate (its graph becomes TOSA); the program
    outside keeps its own. Lists and NodeSources are replaced, never mutated: they
    may be shared with the graph the partitioner cut this one from."""
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            sources = node.meta.get("from_node")
            if sources and any(getattr(s, "from_node", None) for s in sources):
                node.meta["from_node"] = [_without_history(s) for s in sources]


def _without_history(source: Any) -> Any:
    if not getattr(source, "from_node", None):
        return source
    flat = copy.copy(source)
    flat.from_node = []
    flat._dict = None  # NodeSource caches its to_dict(), history included
    return flat


class _ArmPass:
    """One of Arm's passes, run on a graph whose provenance history is dropped first
    (`drop_provenance_history`) and reported to `progress.step` as it starts. Arm's
    pass manager reads and sets a pass's `exported_program` (where it has one): forwarded."""

    def __init__(self, inner: Any, index: int, total: int) -> None:
        self.__dict__["_inner"] = inner
        self.__dict__["_label"] = f"pass {index}/{total} {type(inner).__name__}"
        self.__dict__["__name__"] = type(inner).__name__  # Arm's error messages name the pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __call__(self, graph_module: torch.fx.GraphModule) -> Any:
        progress.step(self._label)  # nothing when nobody listens
        drop_provenance_history(graph_module)
        return self._inner(graph_module)


@dataclass(frozen=True)
class PipelineOptions:
    """What one lowering asks of the pipeline.

    `lower_codecs`: the program carries a codec plan; `dedup_const_shapes`:
    merge identical static CONST_SHAPE nodes (every graph, control-flow
    submodules too), reporting (removed, seconds) to `record_dedup` if given.
    """

    lower_codecs: bool = False
    dedup_const_shapes: bool = False
    record_dedup: Callable[[int, float], None] | None = None


class CodecArmPassManager(ArmPassManager):
    """Arm's pass manager, with codec_tosa's passes inserted where the plan needs them."""

    options: ClassVar[PipelineOptions] = PipelineOptions()

    @classmethod
    def configured(cls, options: PipelineOptions) -> type["CodecArmPassManager"]:
        """A subclass for one lowering: Arm constructs its pass manager from the compile spec alone."""
        return type(cls.__name__, (cls,), {"options": options})

    def _configure_pass_insertions(self, exported_program: ExportedProgram) -> None:
        super()._configure_pass_insertions(exported_program)
        # every batch norm gets a convolution of its own, typed (executorch 1.5.1's is not)
        self.insert_passes_before(FuseBatchNorm2dPass, [BatchNormConvolutionsPass(exported_program)])
        if self.options.lower_codecs:
            # after FoldAndAnnotateQParamsPass has folded every q/dq around an INT8
            # operator into it: what is left are the plan's encodes, decodes, transcodes
            self.insert_passes_before(DecomposeQuantNodesPass, [LowerCodecsPass(codec_ops())])
            # after Arm's permute propagation, before it moves layout ops across RESCALEs
            self.insert_passes_before(CodecMoveToSmallerDtypePass,
                                      [PermutesOntoCodesPass(exir_ops.edge.aten.permute_copy.default)])

    def add_pass(self, pipeline_pass: Any) -> None:
        substitute = SUBSTITUTES.get(type(pipeline_pass))
        if substitute is not None and type(pipeline_pass) not in self._skip_pass_types:
            pipeline_pass.__class__ = substitute
        super().add_pass(pipeline_pass)

    def _transform(self, exported_program: ExportedProgram, graph_module: torch.fx.GraphModule
                   ) -> torch.fx.GraphModule:
        # the lowering's longest stage reports each of Arm's passes as it starts
        # (`progress.step`, when someone listens), each on a graph without provenance history
        passes = self.passes
        self.passes = [_ArmPass(p, i + 1, len(passes)) for i, p in enumerate(passes)]
        try:
            return super()._transform(exported_program, graph_module)
        finally:
            self.passes = passes

    def transform_to_backend_pipeline(self, exported_program: ExportedProgram,
                                      graph_module: torch.fx.GraphModule) -> torch.fx.GraphModule:
        # Arm runs this once per graph (main and each control-flow submodule),
        # right before visiting nodes: where identical CONST_SHAPE nodes are final
        graph_module = super().transform_to_backend_pipeline(exported_program, graph_module)
        if self.options.dedup_const_shapes:
            started = time.perf_counter()
            dedup = DedupConstShapesPass(exir_ops.backend.tosa.CONST_SHAPE.default)
            dedup(graph_module)
            removed = dedup.count
            if self.options.record_dedup is not None:
                self.options.record_dedup(removed, time.perf_counter() - started)
        return graph_module
