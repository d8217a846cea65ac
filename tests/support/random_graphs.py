"""Random DAGs of the operators the placement cares about (property tests, benchmark)."""

from __future__ import annotations

import random

from codec_tosa.graph import GraphBuilder, PortGraph

CONV = "aten.convolution.default"
LINEAR = "aten.linear.default"
CAT = "aten.cat.default"
VIEW = "aten.view.default"
PERMUTE = "aten.permute.default"
SPLIT = "aten.split_with_sizes.default"
RELU = "aten.relu.default"
ADD = "aten.add.Tensor"

KINDS = ("conv", "linear", "cat", "view", "permute", "split", "relu", "add")


def random_dag(rng: random.Random, n_ops: int, n_inputs: int = 2, fanin: int = 3,
               shape: tuple[int, ...] = (1, 4, 2, 2)) -> PortGraph:
    """All values share one shape (cat and split just relabel it) so that any
    value can feed any operator; the structure is what matters."""
    b = GraphBuilder()
    values = [b.placeholder(f"in{i}", shape) for i in range(n_inputs)]
    used: set[int] = set()
    window = 16  # pick recent values mostly: long chains and local fan-out

    def pick() -> int:
        v = values[-1 - min(int(rng.expovariate(0.3)), min(window, len(values)) - 1)]
        used.add(v)
        return v

    for i in range(n_ops):
        kind = rng.choice(KINDS)
        name = f"{kind}{i}"
        if kind in ("conv", "linear"):
            w = b.constant(f"{name}_w", (shape[1], shape[1], 1, 1))
            arg = "input"
            outs = b.op(name, CONV if kind == "conv" else LINEAR, [(arg, pick()), ("weight", w)], shape)
        elif kind == "cat":
            outs = b.op(name, CAT, [("tensors", pick()) for _ in range(rng.randint(2, fanin))], shape)
        elif kind == "split":
            outs = b.op(name, SPLIT, [("self", pick())], [(shape, _f32()), (shape, _f32())])
        elif kind == "add":
            outs = b.op(name, ADD, [("self", pick()), ("other", pick())], shape)
        else:
            target = {"view": VIEW, "permute": PERMUTE, "relu": RELU}[kind]
            outs = b.op(name, target, [("self", pick())], shape)
        values.extend(outs)
    b.graph_output([v for v in values[n_inputs:] if v not in used][-8:] or [values[-1]])
    return b.finish()


def _f32():
    import torch

    return torch.float32
