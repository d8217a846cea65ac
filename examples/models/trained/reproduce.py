"""Record what retraining gives on this machine's kind of CPU, beside the committed weights.

    python -m codec_tosa_examples.models.trained.reproduce [--models NAME ...] [--epochs N]

The committed weights were trained on one CPU capability (the manifest's
``cpu_capability``). Kernels round differently on another kind of CPU: another
capability (AVX2 against AVX-512), and also another vendor at the same
capability (seen here: an AMD EPYC with AVX-512 retrains other digests than the
AVX-512 machine that trained the weights, also with oneDNN capped at
AVX512_CORE or MKL told AVX512), so retraining
there gives other weights, reproducibly. This writes the epoch digests ``train``
gives here under the model's ``reproductions[<kind>]`` in
``weights/manifest.json`` (`cpu_kind`: capability and vendor, e.g.
``AVX512/AuthenticAMD``), leaving the weights and their own digests alone, so
that tests/models/test_trained.py checks retraining bit for bit on every kind of
machine recorded. ``--epochs`` records only the first N epochs (the tests
retrain the first epoch of all but one model).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Sequence

import torch

from . import WEIGHTS_DIR
from .architectures import ARCHITECTURES
from .train import MANIFEST, RECIPES, train


def cpu_kind() -> str:
    """This machine's kind of CPU as far as the kernels' rounding goes: PyTorch's
    CPU capability and the vendor, e.g. ``AVX512/AuthenticAMD``."""
    vendor = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        ids = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
               if line.startswith("vendor_id")]
        vendor = ids[0] if ids else vendor
    return f"{torch.backends.cpu.get_cpu_capability()}/{vendor}"


def expected_digests(entry: dict, kind: str) -> list[str] | None:
    """The epoch digests retraining must give on a CPU of `kind` (`cpu_kind`): a
    reproduction recorded on that kind, else the weights' own where they were
    trained at its capability (the manifest does not name the trainer's vendor),
    else None."""
    recorded = entry.get("reproductions", {}).get(kind)
    if recorded is not None:
        return list(recorded)
    if kind.split("/")[0] == entry["cpu_capability"]:
        return list(entry["epoch_digests"])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(ARCHITECTURES), default=list(ARCHITECTURES))
    parser.add_argument("--epochs", type=int, default=None, help="the first N epochs only (default: all)")
    args = parser.parse_args(argv)
    path = WEIGHTS_DIR / MANIFEST
    kind = cpu_kind()
    for name in args.models:
        epochs = None if args.epochs is None else min(args.epochs, RECIPES[name].epochs)
        digests = train(name, epochs=epochs).epoch_digests
        manifest = json.loads(path.read_text())  # re-read: other runs may have written meanwhile
        entry = manifest["models"][name]
        expected = expected_digests(entry, kind)
        same = expected is not None and digests == expected[: len(digests)]
        recorded = kind in entry.get("reproductions", {})
        if same or (recorded and len(digests) <= len(expected or [])):
            # a run no longer than what is recorded for this kind checks it
            print(f"{name}: {'reproduces' if same else 'DIFFERS FROM'} the digests expected on {kind} "
                  "(nothing written)", flush=True)
            continue
        entry.setdefault("reproductions", {})[kind] = digests
        path.write_text(json.dumps(manifest, indent=2) + "\n")
        print(f"{name}: {len(digests)} epoch digests recorded for {kind}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
