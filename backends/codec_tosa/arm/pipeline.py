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
from torch.export import ExportedProgram

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


# single inheritance: Arm's instances are re-classed in place (`__class__`), which
# Python allows only between classes of one layout
class CodecPermuteDownPass(PropagateViewCopyPermuteDownPass):
    make_fusion_pass = _codec_region

    def _can_move_through_elementwise(self, moving_node: torch.fx.Node, frontier: torch.fx.Node,
                                      next_node: torch.fx.Node) -> bool:
        if super()._can_move_through_elementwise(moving_node, frontier, next_node):
            return True
        return (_codec_on_data_input(self, moving_node, next_node)
                and next_node.all_input_nodes[0] is frontier
                and len(next_node.meta["val"].shape) == len(frontier.meta["val"].shape))


class CodecPermuteUpPass(PropagateViewCopyPermuteUpPass):
    make_fusion_pass = _codec_region

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
