"""The PyTorch simulation of a plan: what the artefact must compute (docs/DESIGN.md, "Validation")."""

from __future__ import annotations

from typing import Sequence

import torch

from codec_tosa.calibration import lifted_args
from codec_tosa.planning import PlannedProgram


def simulate(planned: PlannedProgram, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run the plan in PyTorch: the materialised program (q/dq = fake quantisation) in eager."""
    sim = planned.materialized()
    with torch.no_grad():
        out = torch.fx.Interpreter(sim.graph_module).run(*lifted_args(sim, inputs))
    return list(out) if isinstance(out, (list, tuple)) else [out]


__all__ = ["simulate"]
