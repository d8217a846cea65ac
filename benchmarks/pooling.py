"""Constant pooling (issue 5): TOSA size before and after, per model and mode.

    .venv/bin/python benchmarks/pooling.py                       # all models, fp + int8
    .venv/bin/python benchmarks/pooling.py --models inception_v3 --modes fp --check

For each model and mode the program is lowered once by stock Arm
(`TOSAPartitioner` + `TOSABackend`, "before") and each delegate again through
`arm_adapter.lower_into` into a `PooledTosaSerializer` with the CONST_SHAPE
dedup ("after"). Both flatbuffers are counted by `tosa_stats`.

Modes: ``fp`` is TOSA-1.0+FP on the float model; ``int8`` is Arm's stock
PT2E INT8 flow (symmetric config everywhere) in TOSA-1.0+INT; ``w`` is the
codec_tosa backend at policy W (`CodecTosaPartitioner`, TOSA-1.0+INT+FP,
calibrated on the example input) with ``pool_constants`` off ("before") and
on ("after"): two full runs.

Times: "stock s" is stock `TOSABackend._preprocess` (for ``w``: the backend
with pooling off), "pooled s" the pooled lowering of the same program, "pool s" the time spent inside pooling code
(serializer keys/lookups/remapping and the dedup pass), i.e. the extra cost.
With ``--check`` both flatbuffers run on the TOSA reference model with the
same random inputs and must agree bit for bit.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from codec_tosa.arm import adapter as arm_adapter  # noqa: E402
from codec_tosa.arm import stock
from codec_tosa.serialization.pooled import PooledTosaSerializer, PoolingStats  # noqa: E402
from codec_tosa.validation.reference_model import bit_identical, reference_inputs  # noqa: E402
from codec_tosa.serialization.tosa_stats import TosaStats, tosa_stats  # noqa: E402

MODES = {"fp": "TOSA-1.0+FP", "int8": "TOSA-1.0+INT", "w": "TOSA-1.0+INT+FP"}
DEFAULT_MODELS = ("inception_v3", "shufflenet_v2", "unet", "conformer", "sd3_block")

# Fields summed over the delegates of one program.
_SUMMED = ("operators", "const_ops", "const_shape_ops", "const_bytes", "const_shape_bytes", "payload_bytes")


@dataclass
class Row:
    model: str
    mode: str
    delegates: int
    before: dict[str, int]
    after: dict[str, int]
    stock_seconds: float
    pooled_seconds: float
    pooling: dict[str, Any] = field(default_factory=dict)
    bit_identical: bool | None = None

    def reduction(self, key: str) -> float:
        b = self.before[key]
        return 0.0 if b == 0 else 100.0 * (b - self.after[key]) / b


def _total(stats: list[TosaStats]) -> dict[str, int]:
    return {key: sum(getattr(s, key) for s in stats) for key in _SUMMED}


def _merge_pooling(all_stats: list[PoolingStats]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for stats in all_stats:
        for key, value in stats.to_dict().items():
            if isinstance(value, dict):
                merged = out.setdefault(key, {})
                for k, v in value.items():
                    merged[k] = merged.get(k, 0) + v
            else:
                out[key] = out.get(key, 0) + value
    return out


def build(model: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    from pooling_models import BENCH_MODELS

    if model in BENCH_MODELS:
        return BENCH_MODELS[model]()
    from codec_tosa_examples.models import load_model

    return load_model(model)


def measure_stock(model: str, mode: str, check: bool) -> Row:
    spec = arm_adapter.tosa_compile_spec(MODES[mode])
    module, inputs = build(model)
    if mode == "int8":
        program = stock.stock_int8_program(module, inputs, spec)
    else:
        program = torch.export.export(module, inputs)
    partitions = stock.stock_partitions(program, spec)
    before, after, pooling = [], [], []
    pooled_seconds = 0.0
    identical = True if check else None
    for part in partitions:
        serializer = arm_adapter.new_serializer(spec, PooledTosaSerializer)
        program_copy = copy.deepcopy(part.program)  # lowering mutates it; not timed
        started = time.perf_counter()
        pooled = arm_adapter.lower_into(program_copy, spec, serializer)
        pooled_seconds += time.perf_counter() - started
        before.append(tosa_stats(part.tosa_bytes))
        after.append(tosa_stats(pooled))
        pooling.append(serializer.stats)
        del serializer
        if check:
            identical = identical and bit_identical(
                part.tosa_bytes, pooled, reference_inputs(part.program)
            )
    return Row(
        model=model,
        mode=mode,
        delegates=len(partitions),
        before=_total(before),
        after=_total(after),
        stock_seconds=sum(p.seconds() for p in partitions),
        pooled_seconds=pooled_seconds,
        pooling=_merge_pooling(pooling),
        bit_identical=identical,
    )


@contextmanager
def _captured_codec_backend(into: list[tuple[Any, bytes, float, PoolingStats | None]]) -> Iterator[None]:
    """Record each CodecTosaBackend delegate: input program, payload, time, pooling stats."""
    from codec_tosa.targets.tosa.backend import CodecTosaBackend

    preprocess = CodecTosaBackend.__dict__["preprocess"].__func__
    new_serializer = arm_adapter.new_serializer
    made: list[Any] = []

    def recording_new_serializer(*args: Any, **kwargs: Any) -> Any:
        serializer = new_serializer(*args, **kwargs)
        made.append(getattr(serializer, "stats", None))  # the stats, never the serializer
        return serializer

    def capturing(edge_program: Any, compile_specs: list[Any]) -> Any:
        program = copy.deepcopy(edge_program)
        made.clear()
        started = time.perf_counter()
        result = preprocess(edge_program, compile_specs)
        seconds = time.perf_counter() - started
        into.append((program, bytes(result.processed_bytes), seconds, made[-1] if made else None))
        return result

    CodecTosaBackend.preprocess = staticmethod(capturing)
    arm_adapter.new_serializer = recording_new_serializer
    try:
        yield
    finally:
        CodecTosaBackend.preprocess = staticmethod(preprocess)
        arm_adapter.new_serializer = new_serializer


def measure_policy_w(model: str, mode: str, check: bool) -> Row:
    """Policy W through the codec_tosa backend, `pool_constants` off ("before") vs on."""
    from executorch.exir import to_edge_transform_and_lower

    from codec_tosa import CodecSpec, CodecTosaPartitioner

    module, inputs = build(model)
    runs: dict[bool, list[tuple[Any, bytes, float, PoolingStats | None]]] = {}
    for pool in (False, True):
        runs[pool] = []
        partitioner = CodecTosaPartitioner(
            CodecSpec(policy="W", pool_constants=pool), calibration=[inputs]
        )
        with _captured_codec_backend(runs[pool]):
            to_edge_transform_and_lower(torch.export.export(module, inputs), partitioner=[partitioner])
    off, on = runs[False], runs[True]
    identical = None
    if check:
        identical = all(
            bit_identical(a[1], b[1], reference_inputs(a[0])) for a, b in zip(off, on, strict=True)
        )
    return Row(
        model=model,
        mode=mode,
        delegates=len(on),
        before=_total([tosa_stats(r[1]) for r in off]),
        after=_total([tosa_stats(r[1]) for r in on]),
        stock_seconds=sum(r[2] for r in off),
        pooled_seconds=sum(r[2] for r in on),
        pooling=_merge_pooling([r[3] for r in on if r[3] is not None]),
        bit_identical=identical,
    )


MEASURE: dict[str, Callable[[str, str, bool], Row]] = {
    "fp": measure_stock,
    "int8": measure_stock,
    "w": measure_policy_w,
}


def markdown(rows: list[Row]) -> str:
    head = (
        "| model | mode | TOSA ops | CONST | CONST_SHAPE | const bytes | payload bytes "
        "| stock s | pooled s | pool s | bit-identical |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        b, a = r.before, r.after
        const_b = b["const_bytes"] + b["const_shape_bytes"]
        const_a = a["const_bytes"] + a["const_shape_bytes"]
        check = {None: "not run", True: "yes", False: "NO"}[r.bit_identical]
        lines.append(
            f"| {r.model} | {r.mode} "
            f"| {b['operators']} -> {a['operators']} ({-r.reduction('operators'):+.1f}%) "
            f"| {b['const_ops']} -> {a['const_ops']} "
            f"| {b['const_shape_ops']} -> {a['const_shape_ops']} "
            f"| {const_b} -> {const_a} "
            f"| {b['payload_bytes']} -> {a['payload_bytes']} ({-r.reduction('payload_bytes'):+.1f}%) "
            f"| {r.stock_seconds:.1f} | {r.pooled_seconds:.1f} | {r.pooling.get('seconds', 0.0):.2f} "
            f"| {check} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--modes", default="fp,int8")
    parser.add_argument("--check", action="store_true", help="compare on the reference model")
    parser.add_argument("--json", type=Path, help="append rows as JSON lines here")
    args = parser.parse_args(argv)
    rows = []
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            started = time.perf_counter()
            row = MEASURE[mode](model, mode, args.check)
            rows.append(row)
            print(markdown([row]).splitlines()[-1], f"[{time.perf_counter() - started:.0f} s]", flush=True)
            if args.json:
                with args.json.open("a") as f:
                    f.write(json.dumps(row.__dict__, sort_keys=True) + "\n")
    print()
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
