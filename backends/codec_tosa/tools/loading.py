"""Model specs -> exported programs, shared by every CLI command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.utils import _pytree as pytree

from codec_tosa.tools import model_libs


@dataclass
class LoadedModel:
    spec: str
    module: torch.nn.Module
    inputs: tuple[Any, ...]  # the example, nested as the model takes it
    program: ExportedProgram


def load_and_export(spec: str) -> LoadedModel:
    """Build a built-in model or ``path/to/file.py:function`` and export it (static shapes)."""
    model_libs.prepare()
    from codec_tosa_examples.models import load_model

    module, inputs = load_model(spec)
    return export_module(spec, module, inputs)


class BoundConstants(torch.nn.Module):
    """`module` with its non-tensor inputs (scalars, None, strings) bound: it takes
    the tensor leaves of `inputs` only. torch.export bakes such inputs into the
    program as constants anyway; bound, the program, calibration, the simulation
    and validate all see the same tensors (Arm's operator tests pass dims, scalars
    and rounding modes this way)."""

    def __init__(self, module: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
        super().__init__()
        self.inner = module
        flat, self._spec = pytree.tree_flatten(tuple(inputs), is_leaf=lambda x: x is None)
        self._constants = [None if isinstance(x, torch.Tensor) else x for x in flat]
        self._is_tensor = [isinstance(x, torch.Tensor) for x in flat]

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        flat = [next(it) if t else c for t, c in zip(self._is_tensor, self._constants)]
        return self.inner(*pytree.tree_unflatten(flat, self._spec))


def bind_constants(module: torch.nn.Module, inputs: tuple[Any, ...]) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """`module` and `inputs` as they are when every input leaf is a tensor, else
    `BoundConstants` and the tensor leaves."""
    flat = pytree.tree_flatten(tuple(inputs), is_leaf=lambda x: x is None)[0]
    if all(isinstance(x, torch.Tensor) for x in flat):
        return module, tuple(inputs)
    return BoundConstants(module, inputs).eval(), tuple(x for x in flat if isinstance(x, torch.Tensor))


def export_module(name: str, module: torch.nn.Module, inputs: tuple[Any, ...]) -> LoadedModel:
    """`module` (in eval mode) exported on `inputs`, which may be nested as it takes
    them; non-tensor inputs are bound (`bind_constants`)."""
    module, inputs = bind_constants(module.eval(), tuple(inputs))
    with torch.no_grad():
        program = torch.export.export(module, tuple(inputs))
    return LoadedModel(name, module, tuple(inputs), program)
