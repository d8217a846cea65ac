"""Model specs -> exported programs, shared by every CLI command."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.export import ExportedProgram

from codec_tosa.tools import model_libs


@dataclass
class LoadedModel:
    spec: str
    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    program: ExportedProgram


def load_and_export(spec: str) -> LoadedModel:
    """Build a built-in model or ``path/to/file.py:function`` and export it (static shapes)."""
    model_libs.prepare()
    from codec_tosa_examples.models import load_model

    module, inputs = load_model(spec)
    with torch.no_grad():
        program = torch.export.export(module, inputs)
    return LoadedModel(spec, module, inputs, program)
