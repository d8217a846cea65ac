"""Shared test set-up: the helper modules in support/, and lowered programs cached
per (model, policy, placement, options) so that no test re-lowers what another
already lowered (lowering is deterministic, so sharing the result is exact)."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import pytest

from codec_tosa.tools.model_libs import repair_torchvision

sys.path.insert(0, str(Path(__file__).parent / "support"))
# torchvision's CUDA wheel cannot import beside CPU torch unless two operator schemas
# exist first (tools/model_libs.py): tests import torchvision directly, so define them
# here, as the model-loading tools do; `import codec_tosa` itself changes nothing
repair_torchvision()


@lru_cache(maxsize=None)
def _lowered(model: str, policy: str, placement: str, options: tuple[tuple[str, Any], ...]) -> Any:
    import torch

    import small_models
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import lower_program

    m, x = getattr(small_models, model)()
    spec = CodecSpec(policy=policy, placement=placement, **dict(options))
    return lower_program(torch.export.export(m, x), spec, small_models.calibration(x))


@pytest.fixture(scope="session")
def lowered() -> Callable[..., Any]:
    """``lowered("conv_cat_reshape", "W", "nonlocal+coalesce", pool_constants=False)``
    (placement None: the spec's default for the policy):
    the `Lowered` result (pte bytes, the PlannedProgram) of a tests/support/small_models
    builder, calibrated on `small_models.calibration`; computed once per session."""

    def get(model: str, policy: str, placement: str | None = None, **options: Any) -> Any:
        return _lowered(model, policy, placement, tuple(sorted(options.items())))

    return get
