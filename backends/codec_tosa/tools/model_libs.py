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
    # Builders use random weights: never let transformers/timm reach the hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # transformers imports torchao, whose CUDA-only kernels cannot load beside
    # CPU torch either; it logs one warning per library. Expected: silence it.
    logging.getLogger("torchao").setLevel(logging.ERROR)
    _define_schemas()


def repair_torchvision() -> None:
    """What `import codec_tosa` does: define the two schemas only when torchvision
    is installed, not yet imported, and its C extension cannot load here. Where
    the extension loads, defining them first would make its own registration
    fail and leave torchvision without its kernels, so it is left alone. No
    environment change (unlike `prepare`): importing a library must not switch
    the user's Hugging Face hub offline."""
    import ctypes
    import importlib.util
    import sys
    from pathlib import Path

    if "torchvision" in sys.modules:
        return
    try:
        spec = importlib.util.find_spec("torchvision")
    except (ImportError, ValueError):
        return
    if spec is None or spec.origin is None:
        return
    extensions = sorted(Path(spec.origin).parent.glob("_C*.so"))
    try:
        for so in extensions:
            ctypes.CDLL(str(so))  # what torchvision's import does first (torch.ops.load_library)
        if extensions:
            return
    except OSError:
        pass  # e.g. a CUDA build beside CPU torch: libcudart or a CUDA torch symbol is missing
    _define_schemas()


def _define_schemas() -> None:
    global _LIBRARY
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
