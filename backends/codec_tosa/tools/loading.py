"""Model specs -> exported programs, shared by every CLI command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram

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


def export_module(name: str, module: torch.nn.Module, inputs: tuple[Any, ...]) -> LoadedModel:
    """`module` (in eval mode) exported on `inputs`, which may be nested as it takes them."""
    module = module.eval()
    with torch.no_grad():
        program = torch.export.export(module, tuple(inputs))
    return LoadedModel(name, module, tuple(inputs), program)
