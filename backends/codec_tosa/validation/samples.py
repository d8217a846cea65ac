"""Held-out inputs for validation (docs/DESIGN.md, "Validation").

`compile` calibrates on the example and seed-0 random inputs
(`calibration.random_calibration`); validation draws its samples from a
different seed, so that no sample is a calibration input: a plan that is only
right on what it was calibrated on must show up here.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from codec_tosa.runtime.pte import TensorSpec

HELD_OUT_SEED = 7_919  # any seed but calibration's 0
DEFAULT_SAMPLES = 16
# `compile` without --samples stores up to DEFAULT_SAMPLES held-out inputs: as many
# as keep its reference stage within REFERENCE_SHARE of the compile, and never fewer
# than MIN_SAMPLES (on a big model each input set is three runs of it: eager, the
# planned program and the simulation, issue 27)
REFERENCE_SHARE = 0.25
MIN_SAMPLES = 4
# the precision search scores widths on the calibration inputs and this many more,
# drawn from a third seed: neither calibration's nor validation's
SEARCH_SEED = 104_729
SEARCH_SAMPLES = 8


def reference_budget(other_s: float) -> float:
    """Seconds the reference stage may take to be REFERENCE_SHARE of a compile
    whose other stages took `other_s`."""
    return other_s * REFERENCE_SHARE / (1.0 - REFERENCE_SHARE)


def held_out_inputs(example: Sequence[Any], n: int, seed: int = HELD_OUT_SEED) -> list[tuple[Any, ...]]:
    """`n` input tuples drawn like `example`, as calibration draws its own
    (`calibration.random_calibration`: inside an operator's domain where the
    example says so, nested like the example) from another seed."""
    from codec_tosa.planning.calibration import random_calibration

    return random_calibration(example, n, seed)


def inputs_for_specs(specs: Sequence[TensorSpec | None], n: int,
                     seed: int = HELD_OUT_SEED) -> list[tuple[torch.Tensor, ...]]:
    """`n` input tuples for a program known only by its input specs: standard
    normal floats, random booleans, zeros for integers (an index's range is not
    in the spec; zero is valid for any index or count)."""
    if any(s is None for s in specs):
        raise ValueError("the program takes a non-tensor input: give its inputs (--inputs or --model)")
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for _ in range(n):
        case = []
        for s in specs:
            assert s is not None
            dtype = getattr(torch, s.dtype)
            if dtype.is_floating_point:
                case.append(torch.randn(s.shape, generator=gen, dtype=dtype))
            elif dtype == torch.bool:
                case.append(torch.randint(0, 2, s.shape, generator=gen).to(torch.bool))
            else:
                case.append(torch.zeros(s.shape, dtype=dtype))
        cases.append(tuple(case))
    return cases
