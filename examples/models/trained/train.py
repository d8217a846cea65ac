"""Train the digit classifiers and write their weights and manifest.

    python -m codec_tosa_examples.models.trained.train [--models NAME ...] [--out DIR]

writes ``DIR/<name>.pt`` (the eval-mode state_dict) per model and
``DIR/manifest.json`` (entries of models not trained in this run are kept).
DIR defaults to the committed ``weights/`` directory next to this file.

Training is reproducible bit for bit on one machine: one thread
(``torch.set_num_threads(1)``), ``torch.use_deterministic_algorithms(True)``,
every random draw (initialisation, dropout, shuffling) from seeded generators.
The manifest records the CPU capability, since other kernels (AVX2 vs AVX-512)
round differently and give different weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import nn

from . import WEIGHTS_DIR, architectures, data
from .architectures import ARCHITECTURES
from .data import Digits, accuracy, top1

MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Recipe:
    """AdamW with a one-cycle learning rate (cosine annealing after a 20% warm-up),
    cross-entropy, batch 64, reshuffled every epoch.

    Augmentation: Gaussian pixel noise, each training image its own sigma drawn
    uniformly from [0, train_noise]. Trained on clean images only, ResNet-8 and
    the MobileNet fell to 37% and 19% on the sigma-0.4 test set (upsampled digits
    have no high frequencies, so the models never saw any), which is useless for
    telling flows apart; with train_noise 0.3 the noise cost ResNet-8 nothing.
    0.15 leaves every model 88-96% on the noisy set, ~99.5% on the clean one.
    """

    epochs: int
    lr: float
    weight_decay: float = 1e-4
    train_noise: float = 0.15
    batch: int = 64
    seed: int = 0


# Epochs chosen so that each model trains in well under two minutes on one thread.
RECIPES: dict[str, Recipe] = {
    "digits_resnet8": Recipe(epochs=15, lr=3e-3),
    "digits_ds_cnn": Recipe(epochs=15, lr=3e-3),
    "digits_mobilenet": Recipe(epochs=30, lr=5e-3),
    "digits_vit": Recipe(epochs=60, lr=3e-3, weight_decay=5e-2),
}


@dataclass
class Trained:
    model: nn.Module  # in eval mode
    seconds: float  # the training loop only, not the evaluation
    epoch_digests: list[str]  # state_dict_digest after each epoch


def state_dict_digest(model_or_state: nn.Module | dict[str, torch.Tensor]) -> str:
    """sha256 over every (name, dtype, shape, bytes) of a state_dict, buffers included."""
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    h = hashlib.sha256()
    for name, tensor in state.items():
        t = tensor.detach().cpu().contiguous().reshape(-1)  # 1-d: 0-d tensors cannot be viewed as bytes
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def _deterministic_one_thread() -> Iterator[None]:
    # Restore the caller's settings afterwards (tests call train() in-process).
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng():
            yield
    finally:
        torch.use_deterministic_algorithms(det)
        torch.set_num_threads(threads)


def train(name: str, digits: Digits | None = None, epochs: int | None = None) -> Trained:
    """Train ``name`` by its recipe from scratch. ``epochs`` < the recipe's stops early
    on the same trajectory (the schedule is always the full one), so the result
    matches the full run's ``epoch_digests[epochs - 1]``."""
    recipe = RECIPES[name]
    run_epochs = recipe.epochs if epochs is None else epochs
    if not 1 <= run_epochs <= recipe.epochs:
        raise ValueError(f"epochs must be in 1..{recipe.epochs}, got {epochs}")
    d = data.digits() if digits is None else digits
    with _deterministic_one_thread():
        torch.manual_seed(recipe.seed)  # initialisation and dropout
        model = ARCHITECTURES[name]()
        shuffle = torch.Generator().manual_seed(recipe.seed)
        noise = torch.Generator().manual_seed(recipe.seed + 1)
        steps_per_epoch = -(-len(d.train_x) // recipe.batch)
        opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
        sched = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=recipe.lr, total_steps=recipe.epochs * steps_per_epoch, pct_start=0.2
        )
        loss_fn = nn.CrossEntropyLoss()
        digests: list[str] = []
        start = time.perf_counter()
        for _ in range(run_epochs):
            model.train()
            order = torch.randperm(len(d.train_x), generator=shuffle)
            for i in range(0, len(order), recipe.batch):
                idx = order[i : i + recipe.batch]
                x = d.train_x[idx]
                sigma = recipe.train_noise * torch.rand((len(idx), 1, 1, 1), generator=noise)
                x = x + sigma * torch.randn(x.shape, generator=noise)
                loss = loss_fn(model(x), d.train_y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
            digests.append(state_dict_digest(model))
        seconds = time.perf_counter() - start
    return Trained(model=model.eval(), seconds=seconds, epoch_digests=digests)


def evaluate(model: nn.Module, digits: Digits) -> dict[str, float]:
    """Eager FP32 top-1 on the three sets, batch 64, one thread (as the tests evaluate)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {
            "train_top1": accuracy(top1(model, digits.train_x), digits.train_y),
            "clean_top1": accuracy(top1(model, digits.test_x), digits.test_y),
            "noisy_top1": accuracy(top1(model, digits.noisy_x), digits.test_y),
        }
    finally:
        torch.set_num_threads(threads)


def source_digests() -> dict[str, str]:
    """sha256 of train.py, architectures.py and data.py as they are now."""
    files = [Path(__file__), Path(str(architectures.__file__)), Path(str(data.__file__))]
    return {f"{f.stem}_py_sha256": file_sha256(f) for f in files}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(ARCHITECTURES), default=list(ARCHITECTURES))
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR)
    args = parser.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"models": {}}
    manifest["data"] = {
        "source": "sklearn.datasets.load_digits",
        "split": f"stratified train_test_split test_size={data.TEST_FRACTION} random_state={data.SPLIT_SEED}",
        "resize": f"8x8 -> {data.SIZE}x{data.SIZE} bilinear (F.interpolate, align_corners=False)",
        "normalise": "scalar mean and population std of the training split (math.fsum)",
        "noise": f"N(0, {data.NOISE_SIGMA}^2) on normalised test images, torch.Generator seed {data.NOISE_SEED}",
    }
    d = data.digits()
    manifest["data"].update(train=len(d.train_y), test=len(d.test_y), mean=d.mean, std=d.std)
    sources = source_digests()  # the sources this run was started with
    for name in args.models:
        recipe = RECIPES[name]
        load_before = os.getloadavg()[0]
        result = train(name, d)
        # train_seconds is wall time: on a shared machine it grows with the load.
        load_average = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        weights = out / f"{name}.pt"
        torch.save(result.model.state_dict(), weights)
        scores = evaluate(result.model, d)
        manifest["models"][name] = {
            **asdict(recipe),
            "train_seconds": round(result.seconds, 2),
            "load_average_1min": load_average,  # before and after training, os.getloadavg()
            "cpus": os.cpu_count(),
            **scores,
            "params": sum(p.numel() for p in result.model.parameters()),
            "weights_sha256": file_sha256(weights),
            "state_dict_sha256": state_dict_digest(result.model),
            "epoch_digests": result.epoch_digests,
            **sources,
            "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "machine": platform.machine(),
            "threads": 1,
        }
        print(
            f"{name:18s} params {manifest['models'][name]['params']:6d}  {result.seconds:6.1f} s  "
            f"train {scores['train_top1']:.4f}  clean {scores['clean_top1']:.4f}  noisy {scores['noisy_top1']:.4f}",
            flush=True,
        )
        # Written after every model, so that an interrupted run leaves no weights
        # file without its entry.
        manifest["models"] = {k: manifest["models"][k] for k in ARCHITECTURES if k in manifest["models"]}
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
