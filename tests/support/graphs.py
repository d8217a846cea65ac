"""Hand-built port graphs for the placement tests (no FX, no ExecuTorch)."""

from __future__ import annotations

from codec_tosa.graph import GraphBuilder, PortGraph

CONV = "aten.convolution.default"
RELU = "aten.relu.default"
CAT = "aten.cat.default"
VIEW = "aten.view.default"
PERMUTE = "aten.permute.default"
CLONE = "aten.clone.default"

SHAPE = (1, 8, 4, 4)  # 128 elements


class G:
    """A tiny DSL: `g.conv("c1", x)` adds an operator and returns its value id."""

    def __init__(self) -> None:
        self.b = GraphBuilder()
        self.n = 0

    def input(self, name: str = "x", shape: tuple[int, ...] = SHAPE) -> int:
        return self.b.placeholder(name, shape)

    def conv(self, name: str, x: int, shape: tuple[int, ...] = SHAPE) -> int:
        w = self.b.constant(f"{name}_w", (shape[1], 8, 1, 1))
        bias = self.b.constant(f"{name}_b", (shape[1],))
        return self.b.op(name, CONV, [("input", x), ("weight", w), ("bias", bias)], shape)[0]

    def unary(self, name: str, target: str, x: int, shape: tuple[int, ...] = SHAPE) -> int:
        return self.b.op(name, target, [("self", x)], shape)[0]

    def relu(self, name: str, x: int) -> int:
        return self.unary(name, RELU, x)

    def view(self, name: str, x: int, shape: tuple[int, ...] = SHAPE) -> int:
        return self.unary(name, VIEW, x, shape)

    def cat(self, name: str, xs: list[int], shape: tuple[int, ...]) -> int:
        return self.b.op(name, CAT, [("tensors", x) for x in xs], shape)[0]

    def output(self, *xs: int) -> PortGraph:
        self.b.graph_output(list(xs))
        return self.b.finish()
