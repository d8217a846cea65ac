"""Small digit classifiers trained here on real offline data, with committed weights.

Data: scikit-learn's 8x8 digits upsampled to 32x32 (see ``data``). Models
(see ``architectures``): MLPerf Tiny ResNet-8 and DS-CNN, a MobileNet-style
net and a small ViT. ``train`` reproduces ``weights/`` bit for bit on one
thread on the CPU capability they were trained on (AVX-512); on another
(AVX2) its kernels round differently, and ``reproduce`` records the digests
retraining gives there. ``weights/manifest.json`` records how, and the
accuracies.

``load(name)`` and the four builders return ``(model in eval mode, (image,))``
where the image is the first clean test image, shape (1, 1, 32, 32).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .architectures import ARCHITECTURES
from .data import Digits, accuracy, calibration_images, digits, top1

WEIGHTS_DIR = Path(__file__).parent / "weights"
MODELS: tuple[str, ...] = tuple(ARCHITECTURES)


def manifest() -> dict[str, Any]:
    """The committed ``weights/manifest.json``."""
    return json.loads((WEIGHTS_DIR / "manifest.json").read_text())


def load(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Model ``name`` with its committed weights, in eval mode, and one test image."""
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown trained model {name!r}: expected one of {', '.join(MODELS)}")
    # Construct under a forked RNG: the random initialisation is overwritten
    # anyway and must not disturb the caller's random stream.
    with torch.random.fork_rng():
        model = ARCHITECTURES[name]()
    state = torch.load(WEIGHTS_DIR / f"{name}.pt", map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    example = digits().test_x[:1].clone()
    return model.eval(), (example,)


def digits_resnet8() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """MLPerf Tiny ResNet-8 on 1x32x32 digits (77.6k parameters)."""
    return load("digits_resnet8")


def digits_ds_cnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """MLPerf Tiny DS-CNN with a global average pool on 1x32x32 digits."""
    return load("digits_ds_cnn")


def digits_mobilenet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """MobileNet-style net (depthwise separable + one inverted residual) on 1x32x32 digits."""
    return load("digits_mobilenet")


def digits_vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """2-layer ViT on 4x4 patches (64 tokens, dim 48, 3 heads) of 1x32x32 digits."""
    return load("digits_vit")


__all__ = [
    "MODELS",
    "WEIGHTS_DIR",
    "Digits",
    "accuracy",
    "calibration_images",
    "digits",
    "digits_ds_cnn",
    "digits_mobilenet",
    "digits_resnet8",
    "digits_vit",
    "load",
    "manifest",
    "top1",
]
