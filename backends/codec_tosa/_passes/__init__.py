"""codec_tosa's own graph passes, one per file, and the one order they run in.

`PIPELINE` is that order. Each pass runs at one stage of the user's flow, which
decides what it is given (a GraphModule before PT2E annotation, an
ExportedProgram before edge decomposition, a partition's program in the
backend, a graph inside Arm's TOSA pass pipeline) and therefore its
signature; `requires` names the passes, or the steps of Arm's, that must have
run before it. tests/passes/test_pipeline.py checks that every module here is
listed, that compiles run the passes in this order, and that the passes
inside Arm's pipeline sit where this says.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Stage(Enum):
    """Where in the flow a pass runs, in flow order, and the signature that gives it."""

    ANNOTATION = "quantizer / partitioner: the model graph before PT2E annotation; (gm) -> count"
    PRE_DECOMPOSITION = "partitioner.transform_for_pre_decomposition (and analyze); (ep) -> count"
    PREPROCESS = "the backend, per partition, before Arm's pipeline; (ep) -> ep"
    ARM_PIPELINE = "inside Arm's TOSA pass pipeline (arm_pipeline); (gm) -> PassResult"
    AFTER_ARM_PIPELINE = "on the output of Arm's pass pipeline, per graph, before its visitors; (gm, ...) -> count"


@dataclass(frozen=True)
class PassEntry:
    module: str  # codec_tosa._passes.<module>
    function: str  # the entry point (a function, or a pass class for Arm's pipeline)
    stage: Stage
    requires: tuple[str, ...]  # passes (module names) or Arm steps that must have run before
    anchor: str | None = None  # ARM_PIPELINE: the Arm pass it is inserted right before


PIPELINE: tuple[PassEntry, ...] = (
    PassEntry("mean_to_avg_pool", "spatial_means_to_avg_pool", Stage.ANNOTATION, ()),
    PassEntry("shape_reads_to_full", "shape_reads_to_full", Stage.ANNOTATION, ()),
    PassEntry("fully_masked_rows", "zero_fully_masked_rows", Stage.ANNOTATION, ()),
    PassEntry("xnnpack_rewrites", "rewrite_for_xnnpack", Stage.ANNOTATION, ()),
    PassEntry("fold_batch_norm", "fold_batch_norms", Stage.PRE_DECOMPOSITION, ()),
    PassEntry("fuse_standalone_ops", "fuse_standalone_ops", Stage.PRE_DECOMPOSITION, ("fold_batch_norm",)),
    PassEntry("materialize_codecs", "materialize", Stage.PREPROCESS,
              ("the plan on node meta (planning.plan_program)",)),
    PassEntry("lower_codecs", "LowerCodecsPass", Stage.ARM_PIPELINE,
              ("materialize_codecs", "Arm: FoldAndAnnotateQParamsPass"), anchor="DecomposeQuantNodesPass"),
    PassEntry("batch_norm_convolutions", "BatchNormConvolutionsPass", Stage.ARM_PIPELINE, (),
              anchor="FuseBatchNorm2dPass"),
    PassEntry("permutes_onto_codes", "PermutesOntoCodesPass", Stage.ARM_PIPELINE,
              ("lower_codecs", "Arm: PropagateViewCopyPermuteUpPass"),
              anchor="MoveDataMovementOpsToSmallerDtypePass"),
    PassEntry("const_shape_dedup", "dedup_const_shapes", Stage.AFTER_ARM_PIPELINE,
              ("Arm: InsertConstShapesPass",)),
)

# a pass's own helpers, not passes
HELPERS: tuple[str, ...] = ("constant_inputs",)
