"""Arm's model tests end to end: compile time per stage and the artefact, ours beside stock Arm INT8 (issues 22 and 27).

For each model (executorch's Arm model tests that need no download, built as
those tests build them, random weights; then the single modules and functionals
of Arm's test_nn_modules.py and test_nn_functional.py, recorded from Arm's own
test functions as tests/peer/cases.py records the operator tests) and each
policy, one child process:

* ours: `codec-tosa compile` as the CLI runs it (`tools.compiler.compile_module`,
  default 16 held-out samples), its stages from report.json (export, placement +
  calibration + lowering, serialisation, reference outputs), then `validate`;
* stock: Arm's documented INT8 flow on the same module and example: export,
  `TOSAQuantizer` with `get_symmetric_quantization_config()`, prepare_pt2e, 4
  calibration inputs, convert_pt2e, export, `to_edge_transform_and_lower` with
  `TOSAPartitioner(TOSA-1.0+INT)`, `to_executorch`;
* both artefacts: delegates, compute operators left on the CPU, TOSA
  operators, fused traffic (`tosa_stats`), and the worst SQNR against FP32
  eager over 4 held-out inputs, each run in ExecuTorch's runtime (stock's
  TOSABackend payload relabelled: it is the same TOSA flatbuffer).

It prints two tables, compile seconds per stage (ours/stock, the reference
stage's share) and the artefacts side by side, and writes
`benchmarks/results/arm_models.json` (a run replaces the rows of the models it ran;
``--fresh`` starts a new file). The goals (issue 27): ours at most 2x stock,
the reference stage at most 25% of compile.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/arm_models.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/arm_models.py --models lstm mobile_block --policies I
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "arm_models.json"
POLICIES = ("W", "I")
CALIBRATION = 4
HELD_OUT = 4  # inputs each artefact runs on, against eager
_IO_KERNELS = {"quantized_decomposed::quantize_per_tensor", "quantized_decomposed::dequantize_per_tensor"}


# ---------------------------------------------------------------- the models


def _builtin(name: str) -> Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]:
    def build() -> tuple[torch.nn.Module, tuple[Any, ...]]:
        from codec_tosa.tools import model_libs

        model_libs.prepare()
        from codec_tosa_examples.models import load_model

        return load_model(name)

    return build


def _lstm() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Arm's test_lstm_arm: the quantizable LSTM, inputs (x, (h0, c0))."""
    from torch.nn.quantizable.modules import rnn

    torch.manual_seed(0)
    return rnn.LSTM(10, 20, 2).eval(), (torch.randn(5, 3, 10), (torch.randn(2, 3, 20), torch.randn(2, 3, 20)))


def _mobilenet_v3() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Arm's test_mobilenet_v3_arm: torchvision's MobileNetV3-small, 232x232 input."""
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    from torchvision import models

    torch.manual_seed(0)
    return models.mobilenet_v3_small(weights=None).eval(), (torch.rand(1, 3, 232, 232),)


def _deit_tiny() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Arm's test_deit_tiny_arm: timm's DeiT-tiny (pretrained=False), 224x224."""
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    import timm

    torch.manual_seed(0)
    return timm.models.deit.deit_tiny_patch16_224(pretrained=False).eval(), (torch.rand(1, 3, 224, 224),)


def _deeplab_v3() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Arm's test_dl3_arm: torchvision's DeepLabV3-ResNet50, 224x224, random
    weights (no backbone download either); it returns a dict ``{"out": ...}``."""
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    from torchvision.models.segmentation import deeplabv3_resnet50

    torch.manual_seed(0)
    return deeplabv3_resnet50(weights=None, weights_backbone=None).eval(), (torch.randn(1, 3, 224, 224),)


def _mobile_block() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """Issue 22's MobileNet-style block (tests/support/small_models.py)."""
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    import small_models

    return small_models.mobile_block()


Builder = Callable[[], tuple[torch.nn.Module, tuple[Any, ...]]]


def module_tests() -> dict[str, Builder]:
    """Arm's test_nn_modules / test_nn_functional modules, as tests/peer/cases.py
    records them from Arm's own test functions: ``nn_modules.GRU``,
    ``nn_functional.one_hot``, ... (non-tensor arguments stay in the example)."""
    sys.path.insert(0, str(ROOT / "tests" / "peer"))
    from cases import module_test_cases

    builders: dict[str, Builder] = {}
    for case in module_test_cases():
        file, module, param = case.id.split(":")
        name = param.removesuffix("Module") if module == param else param
        builders[f"{file.removeprefix('test_')}.{name}"] = case.build
    return builders


def all_models() -> dict[str, Builder]:
    return {**MODELS, **module_tests()}


MODELS: dict[str, Builder] = {
    "ds_cnn": _builtin("ds_cnn"),
    "resnet8": _builtin("resnet8"),
    "mobilenet_v1_025": _builtin("mobilenet_v1_025"),
    "deep_autoencoder": _builtin("deep_autoencoder"),
    "mobile_block": _mobile_block,
    "lstm": _lstm,
    "mobilenet_v2": _builtin("mobilenet_v2"),
    "mobilenet_v3_small": _mobilenet_v3,
    "deit_tiny": _deit_tiny,
    "inception_v3": _builtin("inception_v3"),
    "deeplab_v3": _deeplab_v3,
}
# run only when named: DeepLabV3 at W compiled in 123 s here, but validate's 17
# reference-model runs of a ResNet-50 at output stride 8 had not finished 18 minutes later
OPT_IN = {"deeplab_v3"}


# ---------------------------------------------------------------- one model


def stock_int8(module: torch.nn.Module, example: tuple[Any, ...],
               held_out: list[tuple[Any, ...]] | None) -> dict[str, Any]:
    """Arm's documented INT8 flow, timed: quantize (export + PT2E) and lower; then
    its artefact on `held_out` (None: not run, as `compile_time.py` times only)."""
    from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from codec_tosa.planning.calibration import random_calibration

    spec = TosaCompileSpec("TOSA-1.0+INT")
    calibration = [example] + random_calibration(example, CALIBRATION - 1)
    t0 = time.perf_counter()
    quantizer = TOSAQuantizer(spec).set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(torch.export.export(module, example).module(check_guards=False), quantizer)
    for batch in calibration:
        prepared(*batch)
    quantized = torch.export.export(convert_pt2e(prepared), example)
    t1 = time.perf_counter()
    pte = bytes(to_edge_transform_and_lower(quantized, partitioner=[TOSAPartitioner(spec)]).to_executorch().buffer)
    t2 = time.perf_counter()
    built = artefact(pte, module, held_out) if held_out is not None else {}
    return {"quantize_s": t1 - t0, "lower_s": t2 - t1, "total_s": t2 - t0, **built}


def held_out_inputs(example: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    from codec_tosa.planning.calibration import random_calibration

    return random_calibration(example, HELD_OUT, seed=7)  # not the calibration's seed


def artefact(pte: bytes, module: torch.nn.Module, held_out: list[tuple[Any, ...]]) -> dict[str, Any]:
    """What a .pte delegates and leaves on the CPU, its TOSA, and its worst SQNR
    against eager over `held_out`, run in ExecuTorch's runtime."""
    from codec_tosa.pytrees import leaves, tensor_leaves
    from codec_tosa.runtime.executorch_runner import run_pte
    from codec_tosa.runtime.pte import inspect_pte
    from codec_tosa.validation.metrics import sqnr_db
    from codec_tosa.tools.report import program_delegates

    info = inspect_pte(pte)
    total = program_delegates(pte).total()
    runnable = _runnable(pte)
    worst = float("inf")
    for x in held_out:
        with torch.no_grad():
            eager = tensor_leaves(module(*x))
        outs = run_pte(runnable, [t for t in leaves(x) if isinstance(t, torch.Tensor)])
        for e, o in zip(eager, outs):
            if e.is_floating_point():
                worst = min(worst, sqnr_db(e.float().numpy(), o.float().numpy().reshape(e.shape)))
    return {"delegates": len(info.delegate_ids),
            "cpu_ops": sorted({op for op in info.operators if op not in _IO_KERNELS}),
            "tosa_ops": total.operators, "fused_traffic_bytes": total.fused_traffic_bytes,
            "sqnr_db": worst}


def _runnable(pte: bytes) -> bytes:
    """The program as the runtime here runs it (stock's TOSABackend payload relabelled),
    as the accuracy benchmark runs its artefacts."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from accuracy import runnable

    return runnable(pte)


def ours(name: str, module: torch.nn.Module, example: tuple[Any, ...], policy: str,
         held_out: list[tuple[Any, ...]]) -> dict[str, Any]:
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.cli import error_line
    from codec_tosa.tools.compiler import compile_module
    from codec_tosa.validation.validate import validate

    with tempfile.TemporaryDirectory(prefix="codec-tosa-compile-time-") as d:
        t0 = time.perf_counter()
        try:
            result = compile_module(name, (module, example), CodecSpec(policy), d, progress=False)
        except Exception as e:  # noqa: BLE001 - a refusal is a row
            return {"error": error_line(e), "total_s": time.perf_counter() - t0}
        total = time.perf_counter() - t0
        times = result.report["times"]
        ambiguous = result.report.get("ambiguous_codes", {}).get("total")
        try:
            verdict = validate(result.pte).verdict.value
        except Exception as e:  # noqa: BLE001
            verdict = f"validate: {error_line(e)}"
        built = artefact(Path(result.pte).read_bytes(), module, held_out)
    return {"total_s": total, **{k: float(v) for k, v in times.items()}, "ambiguous_codes": ambiguous,
            "verdict": verdict, **built}


def run_model(name: str, policies: tuple[str, ...]) -> dict[str, Any]:
    return model_row(name, policies, lambda module, example, policy, held_out:
                     ours(name, module, example, policy, held_out or []), held_out=True)


OursAt = Callable[[torch.nn.Module, tuple[Any, ...], str, "list[tuple[Any, ...]] | None"], dict[str, Any]]


def model_row(name: str, policies: tuple[str, ...], ours_at: OursAt, held_out: bool) -> dict[str, Any]:
    """One model's row: stock INT8, then `ours_at(module, example, policy, held_out)`
    per policy on a fresh module; `held_out`: draw inputs both artefacts run on
    (else None, and stock's artefact is not run)."""
    torch.set_num_threads(1)
    from codec_tosa.tools.loading import bind_constants

    build = MODELS.get(name) or module_tests()[name]
    # non-tensor inputs (max_pool1d's kernel size) bound as ours binds them: stock's
    # program would otherwise take them as runtime inputs no caller sets
    module, example = bind_constants(*build())
    drawn = held_out_inputs(tuple(example)) if held_out else None
    row: dict[str, Any] = {"model": name}
    try:
        row["stock"] = stock_int8(module, tuple(example), drawn)
    except Exception as e:  # noqa: BLE001 - stock fails on some models too
        row["stock"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    module, example = bind_constants(*build())  # a fresh module: PT2E's export may leave state behind
    for policy in policies:
        row[policy] = ours_at(module, tuple(example), policy, drawn)
    return row


def _child(conn: Any, run: Callable[[str, tuple[str, ...]], dict[str, Any]], name: str,
           policies: tuple[str, ...]) -> None:
    try:
        conn.send(run(name, policies))
    except BaseException as e:  # noqa: BLE001
        conn.send({"model": name, "error": f"{type(e).__name__}: {e}"})
    conn.close()


def run_models(run: Callable[[str, tuple[str, ...]], dict[str, Any]], names: list[str],
               policies: tuple[str, ...], timeout: float, path: Path, command: str,
               show: Callable[[dict[str, Any]], None], fresh: bool = False) -> list[dict[str, Any]]:
    """`run(name, policies)` for each model in a spawned interpreter of its own (as a
    user's), with a timeout; after each, `show(row)` and the JSON at `path` rewritten:
    this run's rows replace those of the same models (all of them when `fresh`)."""
    order = list(all_models())
    kept: list[dict[str, Any]] = []
    commands: list[str] = []
    if not fresh and path.exists():
        old = json.loads(path.read_text())
        kept = [r for r in old["rows"] if r["model"] not in names]
        commands = old.get("commands", [old["command"]] if "command" in old else [])
    commands.append(command)
    ctx = multiprocessing.get_context("spawn")
    rows: list[dict[str, Any]] = []
    for name in names:
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(send, run, name, policies))
        proc.start()
        send.close()
        row = recv.recv() if recv.poll(timeout) else {"model": name, "error": f"timeout {timeout:.0f}s"}
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        rows.append(row)
        show(row)
        merged = sorted(kept + rows, key=lambda r: order.index(r["model"]) if r["model"] in order else len(order))
        path.write_text(json.dumps({"commands": commands, "rows": merged}, indent=1) + "\n")
    return rows


# ---------------------------------------------------------------- table


def time_table(rows: list[dict[str, Any]], policies: tuple[str, ...], columns: str,
               cells: Callable[[dict[str, Any]], str]) -> str:
    """Compile seconds per model and policy: stock's, ours, the ratio, then
    `cells(ours)` under `columns` (an error row where either failed)."""
    head = f"{'model':<18} {'pol':<3} {'stock s':>7} {'ours s':>7} {'x stock':>7} {columns}"
    lines = [head, "-" * len(head)]
    for r in rows:
        stock = r.get("stock", {}).get("total_s")
        for p in policies:
            o = r.get(p, {})
            if "error" in o or "error" in r:
                lines.append(f"{r['model']:<18} {p:<3} {stock or 0:7.1f} {'-':>7}  {o.get('error', r.get('error'))}")
                continue
            ratio = o["total_s"] / stock if stock else float("nan")
            lines.append(f"{r['model']:<18} {p:<3} {stock or 0:7.1f} {o['total_s']:7.1f} {ratio:7.2f} {cells(o)}")
    return "\n".join(lines)


def table(rows: list[dict[str, Any]], policies: tuple[str, ...]) -> str:
    def cells(o: dict[str, Any]) -> str:
        ambiguous = o.get("ambiguous_codes")
        return (f"{o.get('export_s', 0):6.1f} {o.get('lowering_s', 0):6.1f} {o.get('serialisation_s', 0):5.1f} "
                f"{o.get('reference_s', 0):6.1f} {100 * o.get('reference_s', 0.0) / o['total_s']:5.0f} "
                f"{ambiguous if ambiguous is not None else '-':>5}  {o['verdict']}")

    return time_table(rows, policies, f"{'export':>6} {'lower':>6} {'ser':>5} {'ref':>6} {'ref %':>5} {'ambig':>5}"
                      "  verdict", cells)


def artefacts_table(rows: list[dict[str, Any]], policies: tuple[str, ...]) -> str:
    """The artefacts side by side: stock INT8, then ours per policy."""
    head = (f"{'model':<18} {'flow':<9} {'deleg':>5} {'CPU ops':>7} {'TOSA ops':>8} {'fused KiB':>9} "
            f"{'compile s':>9} {'SQNR dB':>7}  CPU operators")
    lines = [head, "-" * len(head)]
    for r in rows:
        for flow, o in [("stock", r.get("stock", {})), *((p, r.get(p, {})) for p in policies)]:
            if "error" in o or "delegates" not in o:
                lines.append(f"{r['model']:<18} {flow:<9} {o.get('error', r.get('error', '-'))}")
                continue
            lines.append(f"{r['model']:<18} {flow:<9} {o['delegates']:5d} {len(o['cpu_ops']):7d} "
                         f"{o['tosa_ops']:8d} {o['fused_traffic_bytes'] / 1024:9.1f} {o['total_s']:9.1f} "
                         f"{o['sqnr_db']:7.1f}  {', '.join(o['cpu_ops'])[:60]}")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]], policies: tuple[str, ...]) -> str:
    """Both tables as Markdown, for docs/results/arm_models.md."""
    out = ["| model | policy | stock s | ours s | ours / stock | export | placement + lowering | serialisation "
           "| reference | reference share | ambiguous codes | validate |", "|" + "---|" * 12]
    arts = ["| model | flow | delegates | CPU operators | TOSA operators | fused traffic KiB | compile s "
            "| worst SQNR vs eager (dB) |", "|" + "---|" * 8]
    for r in rows:
        stock = r.get("stock", {})
        for p in policies:
            o = r.get(p, {})
            if "error" in o or "error" in r:
                out.append(f"| {r['model']} | {p} | {stock.get('total_s', 0):.1f} | - | - | - | - | - | - | - | - "
                           f"| {o.get('error', r.get('error'))} |")
                continue
            out.append(f"| {r['model']} | {p} | {stock['total_s']:.1f} | {o['total_s']:.1f} "
                       f"| {o['total_s'] / stock['total_s']:.2f} | {o['export_s']:.1f} | {o['lowering_s']:.1f} "
                       f"| {o['serialisation_s']:.1f} | {o['reference_s']:.1f} "
                       f"| {100 * o['reference_s'] / o['total_s']:.0f}% | {o['ambiguous_codes']} | {o['verdict']} |")
        for flow, o in [("stock INT8", stock), *((p, r.get(p, {})) for p in policies)]:
            if "delegates" not in o:
                continue
            cpu = ", ".join(o["cpu_ops"]) or "0"
            arts.append(f"| {r['model']} | {flow} | {o['delegates']} | {cpu} | {o['tosa_ops']} "
                        f"| {o['fused_traffic_bytes'] / 1024:.1f} | {o['total_s']:.1f} | {o['sqnr_db']:.1f} |")
    return "\n".join(out) + "\n\n" + "\n".join(arts)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    models = all_models()
    p.add_argument("--models", nargs="+", default=[m for m in models if m not in OPT_IN], choices=list(models),
                   help="default: every whole model but " + ", ".join(sorted(OPT_IN))
                   + ", then every nn module / functional test")
    p.add_argument("--policies", nargs="+", default=list(POLICIES))
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per model")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--markdown", action="store_true", help="only print the JSON's tables as Markdown")
    p.add_argument("--fresh", action="store_true", help="start a new JSON instead of replacing its rows")
    args = p.parse_args()
    policies = tuple(args.policies)
    if args.markdown:
        print(markdown(json.loads(args.json.read_text())["rows"], policies))
        return 0
    rows = run_models(run_model, args.models, policies, args.timeout, args.json,
                      "python benchmarks/arm_models.py " + " ".join(sys.argv[1:]),
                      lambda row: print("\n".join(table([row], policies).splitlines()[2:]), flush=True), args.fresh)
    print()
    print(table(rows, policies))
    print()
    print(artefacts_table(rows, policies))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
