"""Fold inference batch norms into the convolution that feeds them.

An accelerator never runs `conv -> batch_norm` as two operators: the norm is
an affine map per output channel, folded offline into the convolution's
weight and bias. Left in the graph it is an FP32 operator between two
compressible ones, so every such pair would cost a decode and an encode.
Both the analysis and the partitioner (through its pre-decomposition hook)
fold first, so the plan that is analysed is the plan that is compiled.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from executorch.backends.transforms.utils import (
    create_constant_placeholder,
    delete_constant_placeholder,
    get_param_tensor,
    is_param_node,
)
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx.passes.infra.pass_base import PassResult
from torch.nn.utils.fusion import fuse_conv_bn_weights

from codec_tosa._passes.pass_base import CodecPass
from codec_tosa.graph import user_input_nodes

_CONV = {torch.ops.aten.convolution.default, torch.ops.aten.conv2d.default}
# (target, index of eps in args, outputs are read through getitem)
_BN = {
    torch.ops.aten._native_batch_norm_legit_no_training.default: (6, True),
    torch.ops.aten.batch_norm.default: (7, False),
}


class FoldBatchNormPass(CodecPass):
    """Fold every `conv -> batch_norm` (inference) pair of `exported_program` in place
    (called on its graph module); `count` is how many. The folded weights are
    parameters of that program, as Arm's `FuseBatchNorm2dPass` makes its own."""

    def __init__(self, exported_program: ExportedProgram) -> None:
        super().__init__()
        self.exported_program = exported_program

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        ep = self.exported_program
        assert graph_module is ep.graph_module, "the pass rewrites the program it was made for"
        folded = 0
        for conv in list(graph_module.graph.nodes):
            if conv.op != "call_function" or conv.target not in _CONV or len(conv.users) != 1:
                continue
            bn = next(iter(conv.users))
            if bn.target not in _BN or bn.args[0] is not conv or not _foldable(ep, conv, bn):
                continue
            _fold(ep, conv, bn, folded)
            folded += 1
        if folded:
            graph_module.graph.eliminate_dead_code()
        return self.done(graph_module, folded)


def _foldable(ep: ExportedProgram, conv: torch.fx.Node, bn: torch.fx.Node) -> bool:
    if conv.target is torch.ops.aten.convolution.default and conv.args[6]:
        return False  # transposed: the output channel is not the weight's axis 0
    weight = conv.args[1]
    bias = conv.args[2] if len(conv.args) > 2 else None
    params = [weight, bias, *bn.args[1:5]]
    if not all(p is None or (isinstance(p, torch.fx.Node) and is_param_node(ep, p)) for p in params):
        return False
    if any(len(p.users) != 1 for p in (weight, bias) if isinstance(p, torch.fx.Node)):
        return False  # a shared weight cannot be rewritten for one of its users
    if bn.args[3] is None or bn.args[4] is None:
        return False
    if bn.target is torch.ops.aten.batch_norm.default and bn.args[5]:
        return False  # training mode
    _, via_getitem = _BN[bn.target]
    if via_getitem:
        return all(u.target is operator.getitem and u.args[1] == 0 for u in bn.users)
    return True


def _fold(ep: ExportedProgram, conv: torch.fx.Node, bn: torch.fx.Node, index: int) -> None:
    graph = ep.graph_module.graph
    weight, bias = conv.args[1], conv.args[2] if len(conv.args) > 2 else None
    eps_at, via_getitem = _BN[bn.target]
    tensors = [get_param_tensor(ep, a) if isinstance(a, torch.fx.Node) else None for a in bn.args[1:5]]
    bn_w, bn_b, mean, var = tensors
    w = get_param_tensor(ep, weight)
    b = get_param_tensor(ep, bias) if isinstance(bias, torch.fx.Node) else None
    fused_w, fused_b = fuse_conv_bn_weights(w, b, mean, var, float(bn.args[eps_at]), bn_w, bn_b)
    first_input = user_input_nodes(ep)[0]
    with graph.inserting_before(first_input):
        w_node = create_constant_placeholder(ep, graph, f"{conv.name}_bn_folded_weight",
                                             InputKind.PARAMETER, fused_w.detach())
        b_node = create_constant_placeholder(ep, graph, f"{conv.name}_bn_folded_bias",
                                             InputKind.PARAMETER, fused_b.detach())
    args = list(conv.args) + [None] * (3 - len(conv.args))
    args[1], args[2] = w_node, b_node
    conv.args = tuple(args)
    old_params = [a for a in (weight, bias, *bn.args[1:5]) if isinstance(a, torch.fx.Node)]
    for u in list(bn.users) if via_getitem else [bn]:
        u.replace_all_uses_with(conv)
        if u is not bn:
            graph.erase_node(u)
    graph.erase_node(bn)
    for p in old_params:
        if not p.users:
            delete_constant_placeholder(ep, p)
