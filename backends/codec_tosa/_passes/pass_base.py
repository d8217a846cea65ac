"""The one signature of codec_tosa's passes.

Every pass is a `CodecPass`: torch.fx's `PassBase`, the interface ExecuTorch's
`ExportPass` and Arm's `ArmPass` implement, called as
``pass_(graph_module) -> PassResult``. That is what Arm's pass manager runs,
so the passes inside its pipeline need nothing more, and the others are called
the same way wherever they run. What a pass needs beyond the graph (the
`ExportedProgram` whose constants it reads or adds, the operator overloads of
the dialect it rewrites) it takes when constructed, as Arm's passes take their
program; what it did it keeps on the instance (`count`, and its own detail)
for reports and tests.
"""

from __future__ import annotations

from typing import Any

import torch.fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult


class CodecPass(PassBase):
    """A codec_tosa pass. Subclasses implement `call` and report through `done`."""

    def __init__(self) -> None:
        self.count = 0  # what the last call rewrote (nodes, pairs, chains: the pass says)

    @property
    def __name__(self) -> str:  # pass managers name passes by it
        return type(self).__name__

    def done(self, graph_module: torch.fx.GraphModule, count: int) -> PassResult:
        """The result of a call that rewrote `count` things (recompiling the module if any)."""
        self.count = count
        if count:
            graph_module.recompile()
        return PassResult(graph_module, count > 0)


def calls(graph: torch.fx.Graph, *targets: Any) -> list[torch.fx.Node]:
    """The nodes of `graph` that call one of `targets`, in graph order; a list, so
    that a pass may rewrite the graph as it walks them."""
    return [n for n in graph.nodes if n.op == "call_function" and n.target in targets]
