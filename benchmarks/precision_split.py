"""Does a width change inside a plain convolution chain pay on Ethos-U? (issue 25)

A chain of convolutions is one precision group: Arm types a convolution's output
like its input, so a width change needs a RESCALE between two convolutions.
Stock Arm's per-module config makes exactly that split. This lowers a chain of four
3x3 convolutions (8-16-16-16-8 channels, 32x32, relu between) through Arm's PT2E
flow and EthosUPartitioner three ways: a8w8, a16w8 on the first two convolutions
only, and a16w8; and prints Vela's cycles, SQNR of the artefact against FP32 on
held-out inputs, and the RESCALE and CLAMP count.

    OMP_NUM_THREADS=1 python benchmarks/precision_split.py [--target ethos-u85-256]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import precision  # noqa: E402  (its stock quantizers, lowering and metrics)


class Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
        self.c3, self.c4 = nn.Conv2d(16, 16, 3, padding=1), nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c4(torch.relu(self.c3(torch.relu(self.c2(torch.relu(self.c1(x)))))))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="ethos-u85-256")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "precision_split.json")
    args = parser.parse_args(argv)
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.planning.calibration import random_calibration
    from codec_tosa.serialization.tosa_stats import tosa_stats
    from codec_tosa.quiet import quiet

    arm_adapter.install_payload_journal()
    torch.manual_seed(0)
    module, example = Chain().eval(), (torch.randn(1, 8, 32, 32),)
    calib = [example] + random_calibration(example, 7, 0)
    tests = random_calibration(example, 8, 9)
    ref = precision._eager(module, tests)
    rows = []
    for flow, config, hand in (("a8w8", "a8w8", ()), ("a16w8 on c1, c2", "a8w8", ("c1", "c2")),
                               ("a16w8", "a16w8", ())):
        with quiet():
            low = precision._lower(precision._stock_quantizer(args.target, config, hand), module, example, calib,
                                   args.target)
            got = precision._outputs(low["pte"], tests)
        ops = tosa_stats(low["tosa"][0]).operators_by_type
        rows.append({"flow": flow, "cycles": low["vela"]["cycles_total"], "sqnr_db": precision._sqnr(ref, got),
                     "rescale": ops.get("RESCALE", 0), "clamp": ops.get("CLAMP", 0)})
    args.json.write_text(json.dumps({"target": args.target, "rows": rows}, indent=1))
    print(f"{args.target}\n| flow | cycles | SQNR dB | RESCALE / CLAMP |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['flow']} | {r['cycles']:,} | {r['sqnr_db']:.1f} | {r['rescale']} / {r['clamp']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
