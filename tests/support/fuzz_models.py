"""Random small PyTorch modules for the whole-pipeline fuzz test (issue 6).

A module is a recipe: a list of steps, each reading earlier values by index
(so values fan out to several steps) and appending one NCHW value. Hypothesis
draws and shrinks the recipe; `FuzzModule` replays it in `forward`. Every value
stays 4-D (linear outputs come back as (1, F, 1, 1)), so any step can follow
any other and shapes are tracked here, not guessed by the strategy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

Shape = tuple[int, int, int, int]
KINDS = ("conv", "linear", "cat", "reshape", "permute", "pad", "slice", "add", "relu", "bn")
MAX_CHANNELS = 8
MAX_SIDE = 8


@dataclass(frozen=True)
class Step:
    kind: str
    srcs: tuple[int, ...]  # indices into the values so far
    arg: tuple[int, ...] = ()  # kind-specific integers (see FuzzModule._apply)

    def __repr__(self) -> str:  # short, for hypothesis' falsifying-example output
        return f"{self.kind}{self.srcs}{self.arg or ''}"


@dataclass(frozen=True)
class Recipe:
    inputs: tuple[Shape, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    seed: int


class FuzzModule(nn.Module):
    def __init__(self, recipe: Recipe) -> None:
        super().__init__()
        self.recipe = recipe
        gen = torch.Generator().manual_seed(recipe.seed)
        shapes: list[Shape] = list(recipe.inputs)
        self.layers = nn.ModuleDict()
        for i, step in enumerate(recipe.steps):
            src = shapes[step.srcs[0]]
            if step.kind == "conv":
                cout, k, stride = step.arg
                layer: nn.Module = nn.Conv2d(src[1], cout, k, stride=stride, padding=k // 2)
            elif step.kind == "linear":
                layer = nn.Linear(src[1] * src[2] * src[3], step.arg[0])
            elif step.kind == "bn":
                layer = nn.BatchNorm2d(src[1])
                # non-trivial statistics, so that folding or not is visible
                layer.running_mean.copy_(torch.randn(src[1], generator=gen) * 0.5)
                layer.running_var.copy_(torch.rand(src[1], generator=gen) + 0.5)
            else:
                layer = nn.Identity()
            for p in layer.parameters():
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=gen) * (1.0 / max(1, p[0].numel()) ** 0.5))
            self.layers[str(i)] = layer
            shapes.append(step_shape(step, shapes))
        self.shapes = shapes

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = list(inputs)
        for i, step in enumerate(self.recipe.steps):
            values.append(self._apply(i, step, [values[s] for s in step.srcs]))
        return tuple(values[o] for o in self.recipe.outputs)

    def _apply(self, i: int, step: Step, xs: list[torch.Tensor]) -> torch.Tensor:
        layer = self.layers[str(i)]
        x = xs[0]
        kind, a = step.kind, step.arg
        if kind in ("conv", "bn"):
            return layer(x)
        if kind == "linear":
            return layer(x.flatten(1)).reshape(1, -1, 1, 1)
        if kind == "relu":
            return torch.relu(x)
        if kind == "add":
            return x + xs[1]
        if kind == "cat":
            return torch.cat(xs, dim=1)
        if kind == "reshape":
            return x.reshape(reshape_target(x.shape, a[0]))
        if kind == "permute":
            return x.permute(0, *a)
        if kind == "pad":
            return F.pad(x, a)
        if kind == "slice":
            dim, start, stop = a
            return x.narrow(dim, start, stop - start)
        raise AssertionError(kind)


def reshape_target(shape: Any, option: int) -> Shape:
    n, c, h, w = (int(d) for d in shape)
    return [(1, c, h * w, 1), (1, c * h, w, 1), (1, c, w, h), (1, h, c, w)][option]


def step_shape(step: Step, shapes: list[Shape]) -> Shape:
    s = shapes[step.srcs[0]]
    n, c, h, w = s
    kind, a = step.kind, step.arg
    if kind == "conv":
        cout, k, stride = a
        return (1, cout, (h + 2 * (k // 2) - k) // stride + 1, (w + 2 * (k // 2) - k) // stride + 1)
    if kind == "linear":
        return (1, a[0], 1, 1)
    if kind == "cat":
        return (1, sum(shapes[i][1] for i in step.srcs), h, w)
    if kind == "reshape":
        return reshape_target(s, a[0])
    if kind == "permute":
        return (1, *(s[d] for d in a))  # type: ignore[return-value]
    if kind == "pad":
        left, right, top, bottom = a
        return (1, c, h + top + bottom, w + left + right)
    if kind == "slice":
        dim, start, stop = a
        out = list(s)
        out[dim] = stop - start
        return tuple(out)  # type: ignore[return-value]
    return s  # add, relu, bn


@st.composite
def recipes(draw: st.DrawFn, max_steps: int = 6) -> Recipe:
    """A random recipe: 1-2 inputs, 1..max_steps steps, 1-2 outputs."""
    side = st.integers(2, 6)
    inputs = [(1, draw(st.integers(1, 4)), draw(side), draw(side))]
    if draw(st.booleans()):
        inputs.append((1, draw(st.integers(1, 4)), inputs[0][2], inputs[0][3]))
    shapes: list[Shape] = list(inputs)
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, max_steps))):
        # mostly recent values: chains, plus fan-out from older ones
        pick = st.integers(max(0, len(shapes) - 4), len(shapes) - 1) | st.integers(0, len(shapes) - 1)
        src = draw(pick)
        step = _draw_step(draw, draw(st.sampled_from(KINDS)), src, shapes, pick)
        steps.append(step)
        shapes.append(step_shape(step, shapes))
    outputs = [len(shapes) - 1]
    if draw(st.booleans()):
        extra = draw(st.integers(0, len(shapes) - 1))
        if extra not in outputs:  # an input or an intermediate value as a second output
            outputs.append(extra)
    return Recipe(tuple(inputs), tuple(steps), tuple(outputs), draw(st.integers(0, 2**16)))


def _draw_step(draw: st.DrawFn, kind: str, src: int, shapes: list[Shape],
               pick: st.SearchStrategy[int]) -> Step:
    n, c, h, w = shapes[src]
    if kind == "conv":
        k = draw(st.sampled_from((1, 3)))
        stride = draw(st.sampled_from((1, 2))) if min(h, w) >= 4 else 1
        return Step(kind, (src,), (draw(st.integers(1, 6)), k, stride))
    if kind == "linear":
        return Step(kind, (src,), (draw(st.integers(1, 8)),))
    if kind in ("cat", "add"):
        same = [i for i, s in enumerate(shapes)
                if (s[2:] == shapes[src][2:] if kind == "cat" else s == shapes[src])]
        # the same value twice is allowed (cat(x, x), x + x)
        other = draw(st.sampled_from(same))
        srcs = (src, other)
        if kind == "cat" and draw(st.booleans()):
            srcs += (draw(st.sampled_from(same)),)
        if kind == "cat" and sum(shapes[i][1] for i in srcs) > 3 * MAX_CHANNELS:
            srcs = (src, other)
        return Step(kind, srcs)
    if kind == "reshape":
        return Step(kind, (src,), (draw(st.integers(0, 3)),))
    if kind == "permute":
        return Step(kind, (src,), tuple(draw(st.permutations((1, 2, 3)))))
    if kind == "pad":
        if max(h, w) >= MAX_SIDE + 4:
            return Step("relu", (src,))
        return Step(kind, (src,), tuple(draw(st.integers(0, 1)) for _ in range(4)))
    if kind == "slice":
        dim = draw(st.integers(1, 3))
        size = shapes[src][dim]
        if size < 2:
            return Step("relu", (src,))
        start = draw(st.integers(0, size - 1))
        return Step(kind, (src,), (dim, start, draw(st.integers(start + 1, size))))
    return Step(kind, (src,))  # relu, bn


def build(recipe: Recipe) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    gen = torch.Generator().manual_seed(recipe.seed + 1)
    inputs = tuple(torch.randn(s, generator=gen) for s in recipe.inputs)
    return FuzzModule(recipe).eval(), inputs
