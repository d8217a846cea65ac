"""The data set: scikit-learn's 8x8 digits, upsampled to 32x32 and normalised.

Everything here is deterministic and offline (``load_digits`` reads a file that
ships inside scikit-learn, itself a dependency of executorch):

* split: stratified 80/20 (1437 train / 360 test) by
  ``sklearn.model_selection.train_test_split(..., stratify=y, random_state=SPLIT_SEED)``;
* pixels 0..16 are scaled to [0, 1], upsampled 8x8 -> 32x32 by
  ``torch.nn.functional.interpolate(mode="bilinear", align_corners=False)``, then
  normalised by one scalar mean and (population) std of the training split only;
* ``noisy_x`` is the normalised test split plus Gaussian noise of std NOISE_SIGMA
  drawn from a ``torch.Generator`` seeded with NOISE_SEED (identical on every run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

import torch
import torch.nn.functional as F

SPLIT_SEED = 0
TEST_FRACTION = 0.2
SIZE = 32  # the models' input is (N, 1, SIZE, SIZE)
NOISE_SIGMA = 0.4
NOISE_SEED = 0
CLASSES = 10


@dataclass(frozen=True)
class Digits:
    """Images are float32 (N, 1, 32, 32), labels int64 (N,). noisy_x pairs with test_y."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    noisy_x: torch.Tensor
    mean: float  # the training-split statistics the images were normalised with
    std: float


def _upsample(images: torch.Tensor) -> torch.Tensor:
    # (N, 8, 8) in 0..16 -> (N, 1, 32, 32) in [0, 1].
    x = (images.to(torch.float32) / 16.0).unsqueeze(1)
    return F.interpolate(x, size=(SIZE, SIZE), mode="bilinear", align_corners=False)


def _mean_std(x: torch.Tensor) -> tuple[float, float]:
    """Population mean and std, exactly rounded (math.fsum): torch's float64
    reductions change in the last bits with the thread count, and so would the
    normalised images."""
    values = x.double().flatten()
    mean = math.fsum(values.tolist()) / len(values)
    var = math.fsum(((values - mean) ** 2).tolist()) / len(values)
    return mean, math.sqrt(var)


@lru_cache(maxsize=1)
def _build() -> Digits:
    from sklearn.datasets import load_digits  # imported here: only data users pay for it
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = torch.from_numpy(bunch.images.copy())
    labels = torch.from_numpy(bunch.target.copy()).to(torch.int64)
    idx_train, idx_test = train_test_split(
        torch.arange(len(labels)).numpy(),
        test_size=TEST_FRACTION,
        stratify=labels.numpy(),
        random_state=SPLIT_SEED,
    )
    idx_train_t, idx_test_t = torch.from_numpy(idx_train), torch.from_numpy(idx_test)
    train_x = _upsample(images[idx_train_t])
    test_x = _upsample(images[idx_test_t])
    mean, std = _mean_std(train_x)
    train_x = (train_x - mean) / std
    test_x = (test_x - mean) / std
    gen = torch.Generator().manual_seed(NOISE_SEED)
    noisy_x = test_x + NOISE_SIGMA * torch.randn(test_x.shape, generator=gen, dtype=torch.float32)
    return Digits(
        train_x=train_x.contiguous(),
        train_y=labels[idx_train_t].contiguous(),
        test_x=test_x.contiguous(),
        test_y=labels[idx_test_t].contiguous(),
        noisy_x=noisy_x.contiguous(),
        mean=mean,
        std=std,
    )


def digits() -> Digits:
    """The data set; a fresh copy per call, so callers may modify the tensors."""
    d = _build()
    return Digits(
        train_x=d.train_x.clone(),
        train_y=d.train_y.clone(),
        test_x=d.test_x.clone(),
        test_y=d.test_y.clone(),
        noisy_x=d.noisy_x.clone(),
        mean=d.mean,
        std=d.std,
    )


def calibration_images(n: int = 64, seed: int = 0) -> list[tuple[torch.Tensor]]:
    """n distinct training images chosen by ``seed``, each a 1-tuple of a (1, 1, 32, 32) tensor."""
    train_x = _build().train_x
    if not 0 < n <= len(train_x):
        raise ValueError(f"n must be in 1..{len(train_x)}, got {n}")
    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(seed))
    return [(train_x[int(i) : int(i) + 1].clone(),) for i in order[:n]]


def top1(model_or_callable: Callable[[torch.Tensor], Any], x: torch.Tensor, batch: int = 64) -> torch.Tensor:
    """Predicted labels (N,) int64: argmax of the logits, ``batch`` images per call.

    Works for an nn.Module (left in whatever mode it is in) and for any callable
    that maps a batch to logits, or to a tuple / list whose first item is the
    logits (as an ExecuTorch method returns). Use ``batch=1`` for programs
    exported with the static shape (1, 1, 32, 32).
    """
    preds: list[torch.Tensor] = []
    with torch.no_grad():
        for start in range(0, len(x), batch):
            out = model_or_callable(x[start : start + batch])
            if isinstance(out, (tuple, list)):
                out = out[0]
            preds.append(torch.as_tensor(out).reshape(-1, CLASSES).argmax(dim=1))
    return torch.cat(preds)


def accuracy(pred: torch.Tensor, y: torch.Tensor) -> float:
    """Fraction of pred == y, computed as (exact integer count) / N."""
    if pred.shape != y.shape:
        raise ValueError(f"pred {tuple(pred.shape)} and labels {tuple(y.shape)} differ in shape")
    return int((pred == y).sum()) / len(y)
