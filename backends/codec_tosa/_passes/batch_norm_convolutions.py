"""Pass (inside Arm's pipeline, before its FuseBatchNorm2dPass): a typed convolution for every lone batch norm.

Arm's `FuseBatchNorm2dPass` folds each inference batch norm into the
convolution before it; a batch norm without one (after a linear, or after a
convolution with other readers) first gets a transparent one: a 1x1 depthwise
convolution of ones. In executorch 1.5.1 that convolution has no
`meta["val"]`, and a second batch norm reading the first then fails on it
(`KeyError: 'val'`; found by the long fuzz profile; stock Arm fails the same
way). This pass inserts those convolutions itself, as Arm would (same weight,
same name), with their input's `val`, so Arm's pass finds a convolution before
every batch norm and fuses it as usual. Nothing else changes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from executorch.backends.transforms.utils import create_constant_placeholder
from executorch.exir.dialects._ops import ops as exir_ops
from torch.export.graph_signature import InputKind
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.pass_base import CodecPass, calls

_BATCH_NORM = exir_ops.edge.aten._native_batch_norm_legit_no_training.default
_CONVOLUTION = exir_ops.edge.aten.convolution.default


class BatchNormConvolutionsPass(CodecPass):
    """Give each lone batch norm a typed 1x1 convolution of its own. The new
    weights are parameters of `exported_program`, as Arm's `FuseBatchNorm2dPass`
    makes its own (constructed with the same program; Arm's pass manager points
    both at its working copy before each call)."""

    def __init__(self, exported_program: Any) -> None:
        super().__init__()
        self.exported_program = exported_program

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        inserted = 0
        for bn in calls(graph, _BATCH_NORM):
            source = bn.all_input_nodes[0]
            val = source.meta.get("val")
            if not isinstance(val, torch.Tensor) or val.dtype == torch.bfloat16:
                continue  # Arm does not fuse bfloat16 batch norms
            if source.target == _CONVOLUTION and len(source.users) == 1:
                continue  # Arm fuses into this one
            if val.dim() not in (3, 4):
                continue  # Arm's transparent convolution is 1-D or 2-D; other ranks are Arm's to refuse
            spatial = val.dim() - 2
            # a constant placeholder goes before every user input: beside the batch
            # norm's weight, or first of all where it has none (affine=False)
            first = next(n for n in graph.nodes if n.op == "placeholder")
            with graph.inserting_before(bn.args[1] if isinstance(bn.args[1], torch.fx.Node) else first):
                weight = create_constant_placeholder(
                    exp_program=self.exported_program, graph=graph, kind=InputKind.PARAMETER,
                    name=bn.name + "_conv_weight", data=torch.ones((1,) * (spatial + 2), dtype=val.dtype))
            channels = val.shape[1]
            with graph.inserting_before(bn):
                conv = graph.call_function(_CONVOLUTION, (source, weight, None, [1] * spatial, [0] * spatial,
                                                          [1] * spatial, False, [0] * spatial, channels))
            conv.meta["val"] = val
            bn.replace_input_with(source, conv)
            inserted += 1
        if inserted:
            graph.lint()
        return self.done(graph_module, inserted)
