"""FX pass: a permute next to one of our codecs moves onto the codes' side.

Arm's permute propagation leaves a permute wherever its partner cancelled or
its path ended, which can be the FP32 side of a codec: an image model's
input transpose ended up before the input encode, moving 4 bytes per element
where 1 will do. A permute commutes with every operator of an encode or a
decode (elementwise; the only other inputs are all-ones scale constants), so
after propagation this pass moves

* a permute whose only reader is an encode chain to after the chain, and
* a permute that is the only reader of a decode chain to before the chain,

so that layout operators stay on the INT8 side of a codec (docs/DESIGN.md,
"Codec lowering"). A chain is followed only while each operator has a single
reader, so no other reader sees a different layout.

The permute target is a parameter so this module does not import Arm's
dialect; `codec_tosa.arm.pipeline` supplies it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.pass_base import CodecPass, calls

from codec_tosa._passes.lower_codecs import CODEC_META_KEY


def _role(node: Any) -> str | None:
    return node.meta.get(CODEC_META_KEY) if isinstance(node, torch.fx.Node) else None


def _encode_chain(permute: torch.fx.Node) -> list[torch.fx.Node]:
    """The encode operators reading `permute`, one single reader after another."""
    chain: list[torch.fx.Node] = []
    node = permute
    while len(node.users) == 1:
        (user,) = node.users
        if _role(user) != "encode" or user.args[0] is not node:
            break
        chain.append(user)
        node = user
    return chain


def _decode_chain(permute: torch.fx.Node) -> list[torch.fx.Node]:
    """The decode operators `permute` reads, first to last, each read only by the next."""
    chain: list[torch.fx.Node] = []
    node = permute.args[0]
    reader = permute
    while _role(node) == "decode" and len(node.users) == 1 and next(iter(node.users)) is reader:
        chain.append(node)
        reader, node = node, node.args[0]
    return chain[::-1]


def _relaid(node: torch.fx.Node, like: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """`node` now has `like`'s shape, contiguous, and `dtype` (default: its own)."""
    node.meta["val"] = like.to(dtype or node.meta["val"].dtype)


class PermutesOntoCodesPass(CodecPass):
    """Move each permute next to a codec chain onto the chain's INT8 side; `count` is how many."""

    def __init__(self, permute_target: Any) -> None:
        super().__init__()
        self.permute_target = permute_target

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        moved = 0
        for node in calls(graph_module.graph, self.permute_target):
            moved += self._down_through_encode(node) or self._up_through_decode(node)
        if moved:
            graph_module.graph.lint()
        return self.done(graph_module, moved)

    @staticmethod
    def _down_through_encode(permute: torch.fx.Node) -> bool:
        chain = _encode_chain(permute)
        if not chain:
            return False
        source, last = permute.args[0], chain[-1]
        permuted = permute.meta["val"]
        for op in chain:
            _relaid(op, source.meta["val"])
        last.replace_all_uses_with(permute)
        chain[0].replace_input_with(permute, source)
        permute.replace_input_with(source, last)
        last.append(permute)
        _relaid(permute, permuted, last.meta["val"].dtype)
        return True

    @staticmethod
    def _up_through_decode(permute: torch.fx.Node) -> bool:
        chain = _decode_chain(permute)
        if not chain:
            return False
        first, last = chain[0], chain[-1]
        codes = first.args[0]
        permuted = permute.meta["val"]
        permute.replace_all_uses_with(last)
        permute.replace_input_with(last, codes)
        first.replace_input_with(codes, permute)
        first.prepend(permute)
        _relaid(permute, permuted, codes.meta["val"].dtype)
        for op in chain:
            _relaid(op, permuted)
        return True
