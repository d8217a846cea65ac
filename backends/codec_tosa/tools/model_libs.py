"""Import guard for the model libraries (torchvision, timm, smp, transformers).

torchvision 0.28.0 is a CUDA build on this machine: its C extension cannot
load beside the CPU torch wheel, and its Python side then fails at import
with ``operator torchvision::nms does not exist`` when it registers fake
kernels for ops that were never defined. Defining the two schemas it
registers fakes for (``nms`` and ``qnms``) before the first import fixes it.
timm, segmentation_models_pytorch and transformers all import torchvision
when it is installed, so every model builder calls :func:`prepare` first.
"""

from __future__ import annotations

import logging
import os

import torch

# Schemas exactly as torchvision's C++ library declares them.
_SCHEMAS: dict[str, str] = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}

# Kept alive for the life of the process: a Library object deregisters its
# definitions when it is garbage-collected.
_LIBRARY: torch.library.Library | None = None


def _defined(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


def prepare() -> None:
    """Make torchvision importable and keep Hugging Face offline. Idempotent."""
    global _LIBRARY
    # Builders use random weights: never let transformers/timm reach the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # transformers imports torchao, whose CUDA-only kernels cannot load beside
    # CPU torch either; it logs one warning per library. Expected: silence it.
    logging.getLogger("torchao").setLevel(logging.ERROR)
    missing = [name for name in _SCHEMAS if not _defined(name)]
    if not missing:
        return
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("torchvision", "FRAGMENT")
    for name in missing:
        _LIBRARY.define(_SCHEMAS[name])


def import_torchvision():  # type: ignore[no-untyped-def]
    """Return the torchvision module, imported after :func:`prepare`."""
    prepare()
    import torchvision

    return torchvision
