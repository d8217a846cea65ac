"""Peak activation memory (issue 52): the liveness plan of a TOSA graph's non-constant
tensors, made as ExecuTorch's greedy planner makes a program's, and ExecuTorch's own
planned buffers, in report.json and `report`, for our delegates and stock Arm's."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.memory_planning import pick_shared_obj

from codec_tosa.arm.adapter import stock_partitioner, tosa_compile_spec
from codec_tosa.runtime.pte import delegates, planned_buffers
from codec_tosa.serialization.memory_plan import ALIGNMENT, Lifetime, activation_plan, greedy_arena, lifetimes
from codec_tosa.serialization.tosa_stats import OperatorInfo, TensorInfo
from codec_tosa.spec import CodecSpec
from codec_tosa.tools.cli import main
from codec_tosa.tools.compiler import compile_module
import small_models


def _tensor(name: str, nbytes: int) -> TensorInfo:
    return TensorInfo(name, [nbytes], "INT8", nbytes, 0)


def _op(op: str, inputs: list[str], outputs: list[str]) -> OperatorInfo:
    return OperatorInfo("main", "main", op, inputs, outputs, 0)


def test_lifetimes_run_from_writer_to_last_reader_and_skip_constants() -> None:
    tensors = {n: _tensor(n, b) for n, b in [("x", 100), ("w", 1000), ("a", 200), ("b", 300), ("c", 50)]}
    ops = [_op("CONST", [], ["w"]), _op("CONV2D", ["x", "w"], ["a"]), _op("CLAMP", ["a"], ["b"]),
           _op("ADD", ["b", "x"], ["c"])]
    lives = {life.name: life for life in lifetimes(tensors, ops, ["x"], ["c"])}
    assert lives == {"x": Lifetime("x", 100, -1, 2), "a": Lifetime("a", 200, 0, 1),
                     "b": Lifetime("b", 300, 1, 2), "c": Lifetime("c", 50, 2, 3)}
    # at the CLAMP: x, a and b alive (600); at the ADD: x, b, c (450)
    assert greedy_arena(list(lives.values())) >= 600


def _executorch_greedy(lives: list[Lifetime]) -> int:
    """ExecuTorch's own `pick_shared_obj` on the same lifetimes, sizes aligned as its
    `greedy` aligns them, in the order our planner takes them."""
    objects: list = []
    for life in sorted(lives, key=lambda x: (-(-(-x.nbytes // ALIGNMENT) * ALIGNMENT), x.first, x.name)):
        size = -(-life.nbytes // ALIGNMENT) * ALIGNMENT
        pick_shared_obj(objects, SimpleNamespace(lifetime=[life.first, life.last], allocated_memory=size))
    return sum(o.size for o in objects)


@pytest.mark.parametrize("seed", range(20))
def test_the_greedy_arena_is_executorchs_and_never_below_the_peak(seed: int) -> None:
    rng = random.Random(seed)
    n_ops = rng.randrange(3, 40)
    lives = []
    for i in range(rng.randrange(2, 60)):
        first = rng.randrange(-1, n_ops)
        lives.append(Lifetime(f"t{i}", rng.choice([1, 16, 100, 1000, rng.randrange(1, 5000)]), first,
                              rng.randrange(first, n_ops + 1)))
    arena = greedy_arena(lives)
    assert arena == _executorch_greedy(lives)
    peak = max(sum(x.nbytes for x in lives if x.first <= i <= x.last) for i in range(-1, n_ops + 1))
    assert peak <= arena <= sum(-(-x.nbytes // ALIGNMENT) * ALIGNMENT for x in lives)


def test_codes_hold_less_than_floats_at_the_peak(lowered) -> None:
    """conv -> relu6 -> conv on an 8x8x8 activation: at Z the peak is the first convolution's
    FP32 output and the CLAMP's (2 x 2048 bytes); at V the CLAMP runs on INT8 codes and the
    peak is that convolution's INT32 accumulator and its INT8 RESCALE (2048 + 512)."""
    z, v = (activation_plan(delegates(lowered("conv_relu6_conv", p).pte)[0].payload) for p in "ZV")
    assert z.peak_live_bytes == 2 * 8 * 8 * 8 * 4 and sorted(b for _, b in z.peak_tensors) == [2048, 2048]
    assert v.peak_live_bytes == 8 * 8 * 8 * (4 + 1)
    assert sorted(b for _, b in v.peak_tensors) == [512, 2048]
    assert z.planned_bytes >= z.peak_live_bytes and v.planned_bytes >= v.peak_live_bytes
    # fused, the CLAMP runs inside the first convolution (Z), whose own output never
    # exists: the peak is the second convolution's input (the CLAMP's, 2048) beside its
    # 4-channel FP32 output (1024); at V the RESCALE runs inside it too
    assert z.fused_peak_live_bytes == 2048 + 1024 and "tosa_conv2d_default" not in dict(z.fused_peak_tensors)
    assert v.fused_peak_live_bytes < v.peak_live_bytes


@pytest.fixture(scope="module")
def stock_fp_pte(tmp_path_factory) -> tuple:
    model, example = small_models.linear_head()
    pte = to_edge_transform_and_lower(torch.export.export(model, example),
                                      partitioner=[stock_partitioner(tosa_compile_spec("TOSA-1.0+FP"))]
                                      ).to_executorch().buffer
    path = tmp_path_factory.mktemp("stock_memory") / "model.pte"
    path.write_bytes(pte)
    return path


def test_report_prints_the_plans_of_a_stock_pte(stock_fp_pte, lowered, capsys) -> None:
    assert main(["report", str(stock_fp_pte)]) == 0
    out = capsys.readouterr().out
    data = stock_fp_pte.read_bytes()
    assert planned_buffers(data) == {"forward": (768,)}  # the input and the output, (1, 6, 16) FP32 each
    plan = activation_plan(delegates(data)[0].payload)
    assert "activation memory: ExecuTorch's planned buffers 768 bytes" in out
    row = next(line for line in out.splitlines() if line.startswith("0 ") and "payload" in line)
    assert row.split()[2:6] == [str(plan.peak_live_bytes), str(plan.planned_bytes), str(plan.fused_peak_live_bytes),
                                str(plan.fused_planned_bytes)]
    # stock Arm's FP32 TOSA and our policy Z are the same graph: the same plan
    ours = activation_plan(delegates(lowered("linear_head", "Z").pte)[0].payload)
    assert (ours.peak_live_bytes, ours.planned_bytes) == (plan.peak_live_bytes, plan.planned_bytes)


def test_report_json_records_the_memory(tmp_path) -> None:
    out = tmp_path / "W"
    compile_module("linear_head", small_models.linear_head(), CodecSpec("W"), out, progress=False, samples=1)
    memory = json.loads((out / "report.json").read_text())["memory"]
    plan = activation_plan(delegates((out / "model.pte").read_bytes())[0].payload)
    assert memory["executorch_planned_buffers"] == {"forward": [768]}
    assert memory["executorch_planned_bytes"] == 768
    (d,) = memory["delegates"]
    assert (d["index"], d["tosa"], d["peak_live_bytes"], d["planned_bytes"]) == (
        0, "payload", plan.peak_live_bytes, plan.planned_bytes)
    assert memory["delegate_activation_bytes"] == plan.planned_bytes
