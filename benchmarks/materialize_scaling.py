"""Materialisation scaling: time of `materialize_codecs` against the number of codecs.

The model is a chain of blocks, each one `Linear(8, 8)` + ReLU, all applying
the same Linear (torch's `run_decompositions`, inside `to_edge`, is quadratic
in the number of parameters: 40,000 of them did not finish in 20 minutes),
exported, taken to the edge dialect (linear kept, as Arm's partitioner keeps
it) and planned at policy W (min/max calibration); per block that is an encoded weight and bias (6 new constants: each
linear's weight is encoded at its own port) and the activation codecs between blocks. Timed: only
`MaterializeCodecsPass` on a fresh copy of the planned program; not timed:
export, edge, planning. Each size runs in its own subprocess.

"Codecs" counts what materialisation inserts: encoded weights, encoded
biases, encodes, decodes, transcodes and value codes (MaterializeStats).

    .venv/bin/python benchmarks/materialize_scaling.py [--blocks 250,2500,20000] [--json PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

FEATURES = 8


class Chain(torch.nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = blocks
        self.layer = torch.nn.Linear(FEATURES, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.blocks):
            x = torch.relu(self.layer(x))
        return x


def measure(blocks: int) -> dict[str, float | int]:
    from executorch.exir import to_edge
    from executorch.exir.capture._config import EdgeCompileConfig

    from codec_tosa._passes.materialize_codecs import MaterializeCodecsPass
    from codec_tosa.planning.program import plan_program
    from codec_tosa.spec import CodecSpec

    x = (torch.randn(1, FEATURES, generator=torch.Generator().manual_seed(1)),)
    started = time.perf_counter()
    exported = torch.export.export(Chain(blocks).eval(), x)
    # the edge verifier is skipped (not what is measured; 30 ms per block)
    edge = to_edge(exported, compile_config=EdgeCompileConfig(preserve_ops=[torch.ops.aten.linear.default],
                                                              _check_ir_validity=False))
    ep = edge.exported_program()
    delegated = {n.name for n in ep.graph.nodes if n.op == "call_function"}
    # min/max calibration: the histogram observer's search (0.1 s per domain) is not what is measured
    planned = plan_program(ep, CodecSpec(policy="W", observer="minmax"), [x], {}, delegated)
    prepared = time.perf_counter() - started
    program = copy.deepcopy(ep)
    nodes = len(program.graph.nodes)
    started = time.perf_counter()
    materialize = MaterializeCodecsPass(program)
    materialize(program.graph_module)
    seconds = time.perf_counter() - started
    codecs = materialize.stats.codecs
    del planned
    return {"blocks": blocks, "fx_nodes": nodes, "codecs": codecs, "seconds": seconds,
            "us_per_codec": 1e6 * seconds / max(codecs, 1), "prepare_seconds": prepared}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", default="250,2500,20000")
    parser.add_argument("--json", type=Path, default=Path(__file__).resolve().parent / "results" / "materialize_scaling.json")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one)))
        return
    rows = []
    print(f"{'blocks':>7} {'FX nodes':>9} {'codecs':>8} {'materialize s':>14} {'us/codec':>9}")
    for blocks in (int(b) for b in args.blocks.split(",")):
        done = subprocess.run([sys.executable, __file__, "--one", str(blocks)], capture_output=True,
                              text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{row['blocks']:>7} {row['fx_nodes']:>9} {row['codecs']:>8} {row['seconds']:>14.2f} "
              f"{row['us_per_codec']:>9.1f}", flush=True)
    args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
