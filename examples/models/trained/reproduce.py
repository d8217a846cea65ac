"""Record what retraining gives on this machine's CPU capability, beside the committed weights.

    python -m codec_tosa_examples.models.trained.reproduce [--models NAME ...] [--epochs N]

The committed weights were trained on one CPU capability (the manifest's
``cpu_capability``); PyTorch's kernels for another (AVX2 against AVX-512) round
differently, so retraining there gives other weights, reproducibly. This writes
the epoch digests ``train`` gives here under the model's
``reproductions[<capability>]`` in ``weights/manifest.json``, leaving the weights
and their own digests alone, so that tests/models/test_trained.py checks
retraining bit for bit on either kind of machine. ``--epochs`` records only the
first N epochs (the tests retrain the first epoch of all but one model).
"""

from __future__ import annotations

import argparse
import json
from typing import Sequence

import torch

from . import WEIGHTS_DIR
from .architectures import ARCHITECTURES
from .train import MANIFEST, RECIPES, train


def expected_digests(entry: dict, capability: str) -> list[str] | None:
    """The epoch digests retraining must give on `capability`: the weights' own
    where they were trained on it, else a recorded reproduction (None: none recorded)."""
    if capability == entry["cpu_capability"]:
        return list(entry["epoch_digests"])
    recorded = entry.get("reproductions", {}).get(capability)
    return list(recorded) if recorded is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(ARCHITECTURES), default=list(ARCHITECTURES))
    parser.add_argument("--epochs", type=int, default=None, help="the first N epochs only (default: all)")
    args = parser.parse_args(argv)
    path = WEIGHTS_DIR / MANIFEST
    capability = torch.backends.cpu.get_cpu_capability()
    for name in args.models:
        epochs = None if args.epochs is None else min(args.epochs, RECIPES[name].epochs)
        digests = train(name, epochs=epochs).epoch_digests
        manifest = json.loads(path.read_text())  # re-read: other runs may have written meanwhile
        entry = manifest["models"][name]
        if capability == entry["cpu_capability"]:
            same = digests == entry["epoch_digests"][: len(digests)]
            print(f"{name}: trained on {capability}; retraining {'reproduces' if same else 'DIFFERS FROM'} "
                  "its digests (nothing written)", flush=True)
            continue
        kept = entry.setdefault("reproductions", {}).get(capability, [])
        if len(digests) < len(kept):  # a shorter run checks what a longer one recorded
            same = digests == kept[: len(digests)]
            print(f"{name}: {'reproduces' if same else 'DIFFERS FROM'} the {capability} digests recorded "
                  "(nothing written)", flush=True)
            continue
        entry["reproductions"][capability] = digests
        path.write_text(json.dumps(manifest, indent=2) + "\n")
        print(f"{name}: {len(digests)} epoch digests recorded for {capability}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
