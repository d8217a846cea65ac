"""codec_tosa's own graph passes, one per file, and the one order they run in.

Every pass has one signature (`pass_base.CodecPass`: torch.fx's `PassBase`,
as ExecuTorch's `ExportPass` and Arm's `ArmPass`): it is constructed with
what it needs beyond the graph and called as ``pass_(graph_module) ->
PassResult``. `PIPELINE` is the order they run in. Each runs at one stage of
the user's flow, which decides which graph it is called on (the model graph
before PT2E annotation, the exported program before edge decomposition, a
partition's program in the backend, a graph inside Arm's TOSA pass
pipeline); `requires` names the passes, or the steps of Arm's, that must have
run before it. tests/passes/test_pipeline.py checks that every module here is
listed with a `CodecPass`, that compiles run the passes in this order, and
that the passes inside Arm's pipeline sit where this says.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Stage(Enum):
    """Where in the flow a pass runs, in flow order, and the graph it is called on."""

    ANNOTATION = "quantizer / partitioner: the model graph before PT2E annotation"
    PRE_DECOMPOSITION = ("partitioner.transform_for_pre_decomposition (and analyze): the exported "
                         "program's graph, before edge decomposition")
    PREPROCESS = "the backend, per partition, before Arm's pipeline: the partition program's graph"
    ARM_PIPELINE = "inside Arm's TOSA pass pipeline (arm_pipeline): the graph Arm's passes rewrite"
    AFTER_ARM_PIPELINE = "on the output of Arm's pass pipeline, per graph, before its node visitors"


@dataclass(frozen=True)
class PassEntry:
    module: str  # codec_tosa._passes.<module>
    pass_class: str  # its CodecPass
    stage: Stage
    requires: tuple[str, ...]  # passes (module names) or Arm steps that must have run before
    anchor: str | None = None  # ARM_PIPELINE: the Arm pass it is inserted right before


PIPELINE: tuple[PassEntry, ...] = (
    PassEntry("mean_to_avg_pool", "MeanToAvgPoolPass", Stage.ANNOTATION, ()),
    PassEntry("shape_reads_to_full", "ShapeReadsToFullPass", Stage.ANNOTATION, ()),
    PassEntry("fully_masked_rows", "ZeroFullyMaskedRowsPass", Stage.ANNOTATION, ()),
    PassEntry("xnnpack_rewrites", "XnnpackRewritesPass", Stage.ANNOTATION, ()),
    PassEntry("fold_batch_norm", "FoldBatchNormPass", Stage.PRE_DECOMPOSITION, ()),
    PassEntry("fuse_standalone_ops", "FuseStandaloneOpsPass", Stage.PRE_DECOMPOSITION, ("fold_batch_norm",)),
    PassEntry("materialize_codecs", "MaterializeCodecsPass", Stage.PREPROCESS,
              ("the plan on node meta (planning.plan_program)",)),
    PassEntry("lower_codecs", "LowerCodecsPass", Stage.ARM_PIPELINE,
              ("materialize_codecs", "Arm: FoldAndAnnotateQParamsPass"), anchor="DecomposeQuantNodesPass"),
    PassEntry("batch_norm_convolutions", "BatchNormConvolutionsPass", Stage.ARM_PIPELINE, (),
              anchor="FuseBatchNorm2dPass"),
    PassEntry("permutes_onto_codes", "PermutesOntoCodesPass", Stage.ARM_PIPELINE,
              ("lower_codecs", "Arm: PropagateViewCopyPermuteUpPass"),
              anchor="MoveDataMovementOpsToSmallerDtypePass"),
    PassEntry("const_shape_dedup", "DedupConstShapesPass", Stage.AFTER_ARM_PIPELINE,
              ("Arm: InsertConstShapesPass",)),
)

# a pass's own helpers, not passes
HELPERS: tuple[str, ...] = ("constant_inputs", "pass_base")
