"""Transformers side by side (issue 51, item 4): codec_tosa's flows and the stock flows
on SmolLM2 (prefill), a SmolLM2 decode step and SigLIP, one row per model x flow.

Every flow is built in a child process of its own (this file with ``--child``), so its
compile seconds and peak RSS (the child's VmHWM, read right after the compile: it
includes building the model, ~0.4-1 GiB at one layer) are its own, and a crash or a
timeout (``--timeout`` seconds per flow) is a row with a one-line error. The flows:

* ours, as ``codec-tosa compile`` runs them (`tools.compiler.compile_module`, the
  reference stage included), then ``codec-tosa validate``: ``W/tosa``, ``W/vgf``,
  ``I/tosa``, ``I/ethos-u85-256``, ``I/xnnpack``;
* stock: ``arm-fp`` (TOSAPartitioner, TOSA-1.0+FP), ``arm-int8`` (TOSAQuantizer,
  symmetric INT8), ``arm-partial`` (Linear only at TOSA-1.0+INT+FP, as executorch's
  backends/arm/test/models/test_llama.py), ``ethos-u-a8w8`` and ``ethos-u-a16w8``
  (EthosUQuantizer on ethos-u85-256, Vela), ``xnnpack-int8`` (XNNPACKQuantizer,
  per channel), and for ``smollm2_decode`` ``q8da4w`` (export_llama's recipe:
  4-bit embedding in groups of 32, then torchao 8-bit dynamic activations and 4-bit
  weights in groups of 32 on every Linear, XNNPACK's dynamic-quant partitioner; the
  yaml's group 128 leaves SmolLM2's 576-wide layers in FP32, /work/notes/51_models.md F8).
  Every stock .pte keeps its mutated buffers' state (`InitializedMutableBufferPass`,
  as ours and export_llama do), or the decode step would start from a zero cache.

Columns: compile s; peak RSS; delegates and CPU kernel calls (count, and the names of
the non-trivial ones: not I/O quantize/dequantize, the cache write-back copy_, dim-order
or view copies); where the artefact is TOSA (a TOSA payload, or the TOSA a VGF or
Ethos-U delegate was compiled from) its operators (CONST and CONST_SHAPE not
counted) and traffic unfused / fused (`tosa_stats`, as ``codec-tosa report``); weight
bytes: the TOSA constants where TOSA, else the .pte's bytes; on Ethos-U Vela's cycles,
SRAM and off-chip bytes; on XNNPACK the latency median at 1 and 2 threads
(`xnnpack.time_interleaved`); SQNR of the artefact run in ExecuTorch's runtime against
FP32 eager, pooled over ``--samples`` held-out inputs (seed 1234; stock TOSA and the
TOSA of VGF / Ethos-U delegates run on our runtime, as validate runs them: the VGF
and Ethos-U rows' SQNR is their TOSA's); ours also validate's verdict.

For ``smollm2_decode`` also a rollout of ``--rollout`` tokens: eager decodes greedily
from the builder's prefilled cache (feeds back its argmax, advances input_pos); the
artefact, loaded once so its cache carries over, is fed the same tokens (teacher
forcing, so every step compares logits on the same input) and the row records the
worst and the pooled SQNR of its logits over the steps, and the steps whose argmax
is eager's. The held-out inputs of the decode step all equal the example (its inputs
are integers, which `random_calibration` clones): the rollout is its real test.

Left out: VGF latency (no VgfBackend runtime here: validate runs each VGF on the
emulation layer, its SQNR is its TOSA's), Arm's static int8 KV cache variants and the
int32-cast FP flow, Ethos-U55; full depth only as ``NAME@30`` with ``--flows``.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/transformer_flows.py --models smollm2@1,smollm2_decode@1,siglip@1
        [--flows W/tosa,arm-fp,...] [--timeout 900] [--samples 2] [--rollout 16] [--runs 20]
        [--json benchmarks/results/transformers.json]
    python benchmarks/transformer_flows.py --markdown     # the JSON's rows as a Markdown table
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

BENCHMARKS = Path(__file__).resolve().parent
# (not named transformers.py: a script's folder is first on sys.path, so every script
# here that builds a model would import it instead of Hugging Face's package)
import memory  # noqa: E402  (NAME@N model specs, VmHWM)

ROOT = BENCHMARKS.parent
DEFAULT_JSON = BENCHMARKS / "results" / "transformers.json"
DEFAULT_MODELS = ("smollm2@1", "smollm2_decode@1", "siglip@1")
OURS = {"W/tosa": ("W", "tosa"), "W/vgf": ("W", "vgf"), "I/tosa": ("I", "tosa"),
        "I/ethos-u85-256": ("I", "ethos-u85-256"), "I/xnnpack": ("I", "xnnpack")}
STOCK_TARGETS = {"arm-fp": "tosa", "arm-int8": "tosa", "arm-partial": "tosa", "ethos-u-a8w8": "ethos-u85-256",
                 "ethos-u-a16w8": "ethos-u85-256", "xnnpack-int8": "xnnpack", "q8da4w": "xnnpack"}
DECODE_ONLY = {"q8da4w"}
ETHOS_U = "ethos-u85-256"
HELD_OUT_SEED = 1234  # not the calibration's seed (0)
CALIBRATION = 4  # the example and 3 seeded random inputs, as compile calibrates
MIB = 2**20
# CPU kernels named in the table only when something else runs there: the I/O encodes
# and decodes, the mutated cache's write-back, layout and view copies
TRIVIAL = {"quantize_per_tensor", "dequantize_per_tensor", "dequantize_per_channel", "copy_", "_to_dim_order_copy",
           "unsqueeze_copy", "squeeze_copy", "view_copy", "expand_copy", "slice_copy", "select_copy",
           "permute_copy", "clone"}

Inputs = tuple[Any, ...]


def flows_for(model: str) -> list[str]:
    """Every flow of `model`, ours first."""
    decode = model.partition("@")[0] == "smollm2_decode"
    return list(OURS) + [f for f in STOCK_TARGETS if decode or f not in DECODE_ONLY]


def one_line(e: BaseException) -> str:
    from codec_tosa.tools.cli import error_line

    return error_line(e)[:300]


# ---------------------------------------------------------------- the stock flows (in the child)


def _to_pte(program: Any, partitioners: list[Any]) -> bytes:
    """`to_edge_transform_and_lower`, then `.to_executorch` keeping mutated buffers'
    state (compile's own configuration of it)."""
    import executorch.kernels.quantized  # noqa: F401  (out variants of CPU-side q/dq)
    from executorch.exir import to_edge_transform_and_lower

    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import _executorch_config

    edge = to_edge_transform_and_lower(program, partitioner=partitioners)
    return bytes(edge.to_executorch(_executorch_config(edge, CodecSpec())).buffer)


def _quantized(module: Any, example: Inputs, calibration: list[Inputs], quantizer: Any) -> Any:
    from xnnpack import pt2e_quantize

    return pt2e_quantize(module, example, calibration, quantizer)


def stock_pte(flow: str, module: Any, example: Inputs, calibration: list[Inputs]) -> tuple[bytes, dict[str, Any]]:
    """One stock flow's .pte and its Vela figures (Ethos-U flows only)."""
    import torch

    from codec_tosa.arm import adapter as arm_adapter

    if flow == "arm-fp":
        spec = arm_adapter.tosa_compile_spec("TOSA-1.0+FP")
        return _to_pte(torch.export.export(module, example), [arm_adapter.stock_partitioner(spec)]), {}
    if flow == "arm-int8":
        spec = arm_adapter.tosa_compile_spec("TOSA-1.0+INT")
        program = _quantized(module, example, calibration, arm_adapter.arm_quantizer("TOSA-1.0+INT"))
        return _to_pte(program, [arm_adapter.stock_partitioner(spec)]), {}
    if flow == "arm-partial":
        from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config

        spec = arm_adapter.tosa_compile_spec("TOSA-1.0+INT+FP")
        quantizer = TOSAQuantizer(spec)
        quantizer.set_global(None)  # test_llama.py's _use_partial_quantizer(eps=2**-12)
        quantizer.set_module_type(torch.nn.Linear, get_symmetric_quantization_config(eps=2**-12))
        return _to_pte(_quantized(module, example, calibration, quantizer), [arm_adapter.stock_partitioner(spec)]), {}
    if flow in ("ethos-u-a8w8", "ethos-u-a16w8"):
        return _ethos_u(flow, module, example, calibration)
    if flow == "xnnpack-int8":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                                             get_symmetric_quantization_config)

        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        return _to_pte(_quantized(module, example, calibration, quantizer), [XnnpackPartitioner()]), {}
    if flow == "q8da4w":
        return _q8da4w(module, example), {}
    raise ValueError(f"unknown flow {flow}")


def _ethos_u(flow: str, module: Any, example: Inputs, calibration: list[Inputs]) -> tuple[bytes, dict[str, Any]]:
    from executorch.backends.arm import quantizer as arm_quantizers
    from ethos_u import _vela

    from codec_tosa.arm import adapter as arm_adapter

    arm_adapter.install_payload_journal()  # the TOSA behind the payload, run for the SQNR as validate runs it
    spec = arm_adapter.ethos_u_compile_spec(ETHOS_U)
    quantizer = arm_quantizers.EthosUQuantizer(spec)
    config = (arm_quantizers.get_symmetric_quantization_config() if flow == "ethos-u-a8w8"
              else arm_quantizers.get_symmetric_a16w8_quantization_config())
    quantizer.set_global(config)
    program = _quantized(module, example, calibration, quantizer)
    with tempfile.TemporaryDirectory() as d, arm_adapter.vela_runs_kept(d) as runs:
        pte = _to_pte(program, [arm_adapter.ethos_u_partitioner(spec)])
        return pte, _vela(runs, pte)


def _q8da4w(module: Any, example: Inputs, group: int = 32) -> bytes:
    """export_llama's ``-qmode 8da4w -G 32 -E 4,32`` and XNNPACK partitioners, in its order."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (XnnpackDynamicallyQuantizedPartitioner,
                                                                           XnnpackPartitioner)
    from executorch.examples.models.llama.source_transformation.quantize import (get_quant_embedding_transform,
                                                                                 get_quant_weight_transform)

    with torch.no_grad():
        module = get_quant_embedding_transform(f"4,{group}")(module)
        module = get_quant_weight_transform(quantization_mode="8da4w", group_size=group)(module)
        program = torch.export.export(module, example, strict=True)
    return _to_pte(program, [XnnpackDynamicallyQuantizedPartitioner(), XnnpackPartitioner()])


# ---------------------------------------------------------------- ours (in the child)


def ours_pte(flow: str, spec: str, module: Any, example: Inputs) -> tuple[bytes, dict[str, Any]]:
    """``codec-tosa compile`` of one of our flows into a temporary directory, then
    ``codec-tosa validate``: the .pte, report.json's figures and the verdict."""
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import compile_module
    from codec_tosa.validation.validate import validate

    policy, target = OURS[flow]
    with tempfile.TemporaryDirectory(prefix="codec-tosa-transformers-") as d:
        result = compile_module(spec, (module, example), CodecSpec(policy=policy, target=target), d, progress=False)
        extra: dict[str, Any] = {"compile_times": result.report.get("times"), "vela": result.report.get("vela"),
                                 "ambiguous_codes": result.report.get("ambiguous_codes", {}).get("total")}
        extra["peak_rss_bytes"] = memory._status()["VmHWM"]  # the compile's, before validate runs
        extra["compiled_s"] = time.perf_counter()
        try:
            extra["validate"] = validate(result.pte).verdict.value
        except Exception as e:  # noqa: BLE001  (a validate that cannot run is a cell, not a lost row)
            extra["validate"] = f"error: {one_line(e)}"
        return result.pte.read_bytes(), extra


# ---------------------------------------------------------------- the artefact's figures


def _kernel(name: str) -> str:
    """``aten::index.Tensor_out`` -> ``index.Tensor``: the operator, without its out variant."""
    return name.split("::")[-1].removesuffix(".out").removesuffix("_out")


def program_figures(pte: bytes) -> dict[str, Any]:
    """Delegate calls by backend, CPU kernel calls, and the non-trivial kernels' names."""
    from codec_tosa.runtime.pte import call_counts

    delegate_calls, kernels = call_counts(pte)
    named = Counter({_kernel(k): n for k, n in kernels.items() if _kernel(k).split(".")[0] not in TRIVIAL})
    return {"delegates": dict(delegate_calls), "delegate_calls": sum(delegate_calls.values()),
            "cpu_calls": sum(kernels.values()), "cpu_kernels": {_kernel(k): n for k, n in kernels.items()},
            "cpu_nontrivial": dict(sorted(named.items()))}


def delegate_tosa(pte: bytes) -> list[bytes]:
    """The TOSA of every delegate: its payload, or the TOSA a VGF / Ethos-U payload of
    this process was compiled from (Arm's backends journal it)."""
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.runtime.pte import delegates
    from codec_tosa.tools.report import is_tosa_flatbuffer

    found = []
    for d in delegates(pte):
        tosa = d.payload if is_tosa_flatbuffer(d.payload) else arm_adapter.tosa_of_payload(d.payload)
        if tosa is not None:
            found.append(tosa)
    return found


def tosa_figures(tosa: list[bytes]) -> dict[str, Any]:
    """Operators, traffic and constants of the delegates' TOSA, summed (`codec-tosa report`'s)."""
    from codec_tosa.serialization.tosa_stats import tosa_stats
    from codec_tosa.tools.report import sum_stats

    s = sum_stats([tosa_stats(t) for t in tosa])
    return {"tosa_ops": s.operators - s.const_ops - s.const_shape_ops, "traffic_bytes": s.traffic_bytes,
            "fused_traffic_bytes": s.fused_traffic_bytes, "weight_bytes": s.constant_bytes}


def runnable(pte: bytes) -> bytes:
    """The program as the runtime here runs it, as validate runs it: stock's TOSABackend
    payload relabelled ours (the same TOSA flatbuffer), a VGF or Ethos-U delegate
    replaced by the TOSA it was compiled from; XNNPACK's left as they are."""
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.runtime import BACKEND_ID
    from codec_tosa.runtime.pte import delegates, with_delegates_replaced

    replaced: dict[int, tuple[str, bytes]] = {}
    for d in delegates(pte):
        if d.backend_id == arm_adapter.TOSA_BACKEND_ID:
            replaced[d.index] = (BACKEND_ID, d.payload)
        elif d.backend_id in (arm_adapter.ETHOS_U_BACKEND_ID, arm_adapter.VGF_BACKEND_ID):
            tosa = arm_adapter.tosa_of_payload(d.payload)
            if tosa is None:
                raise RuntimeError(f"delegate {d.index}: the TOSA {d.backend_id} was given was not journaled")
            replaced[d.index] = (BACKEND_ID, tosa)
    return with_delegates_replaced(pte, replaced) if replaced else pte


def _floats(tree: Any) -> list[Any]:
    from codec_tosa.pytrees import tensor_leaves

    return [t.detach().float().reshape(-1) for t in tensor_leaves(tree) if t.is_floating_point()]


def _pooled_sqnr(eager: list[Any], got: list[Any]) -> float:
    import torch

    from codec_tosa.validation.metrics import sqnr_db

    return float(sqnr_db(torch.cat(eager).numpy(), torch.cat(got).numpy()))


def held_out_sqnr(pte: bytes, held_out: list[Inputs], eager: list[list[Any]]) -> float:
    """SQNR pooled over the held-out inputs, the runtime's float outputs against eager's
    (the program's first outputs: a decode step returns its logits only)."""
    from codec_tosa.pytrees import leaves
    from codec_tosa.runtime.executorch_runner import run_pte

    got, want = [], []
    for x, e in zip(held_out, eager):
        outs = [o.float().reshape(-1) for o in run_pte(pte, leaves(x)) if o.is_floating_point()]
        got += outs[:len(e)]
        want += e
    return _pooled_sqnr(want, got)


def eager_rollout(module: Any, example: Inputs, steps: int) -> tuple[list[Inputs], list[Any]]:
    """Greedy decoding in eager from the builder's state: each step's inputs and logits."""
    import torch
    from torch.utils import _pytree as pytree

    flat, structure = pytree.tree_flatten(example)
    token, position = flat
    inputs, logits = [], []
    with torch.no_grad():
        for step in range(steps):
            x = pytree.tree_unflatten([token, position + step], structure)
            out = _floats(module(*x))[0]
            inputs.append(x)
            logits.append(out)
            token = out.argmax().reshape(token.shape).to(token.dtype)
    return inputs, logits


def rollout_figures(pte: bytes, inputs: list[Inputs], eager: list[Any]) -> dict[str, Any]:
    """The artefact loaded once (its cache carries over) and fed eager's tokens step by
    step: the worst and pooled SQNR of its logits, and the steps whose argmax is eager's."""
    from codec_tosa.pytrees import leaves
    from codec_tosa.runtime import native
    from xnnpack import runtime

    native.load()
    module = runtime()._load_for_executorch_from_buffer(pte)
    got = [module.forward(list(leaves(x)))[0].float().reshape(-1) for x in inputs]
    del module
    per_step = [_pooled_sqnr([e], [g]) for e, g in zip(eager, got)]
    return {"rollout_steps": len(inputs), "rollout_sqnr_worst_db": min(per_step),
            "rollout_sqnr_pooled_db": _pooled_sqnr(eager, got),
            "rollout_top1_agree": sum(int(e.argmax() == g.argmax()) for e, g in zip(eager, got)),
            "rollout_sqnr_per_step_db": per_step}


def latency(pte: bytes, example: Inputs, runs: int) -> dict[str, float]:
    """XNNPACK latency median (ms) at 1 and 2 threads, in ExecuTorch's runtime."""
    from codec_tosa.pytrees import leaves
    from xnnpack import time_interleaved

    out = {}
    for threads in (1, 2):
        _, timed = time_interleaved({"flow": pte}, tuple(leaves(example)), threads, runs, warmup=3)
        out[f"latency_ms_{threads}t"] = timed["flow"]["median_ms"]
    return out


# ---------------------------------------------------------------- one flow, in its own process


def child(spec: str, flow: str, samples: int, rollout: int, runs: int) -> dict[str, Any]:
    """Build `spec`, lower it by `flow` (timed, with the VmHWM after it), and measure."""
    import torch

    from codec_tosa.planning.calibration import random_calibration
    from codec_tosa.tools.loading import export_module
    from codec_tosa.tools.model_libs import prepare

    torch.set_num_threads(1)
    prepare()
    torch.manual_seed(0)
    built, example = memory._builder(spec)()
    loaded = export_module(spec, built.eval(), example)  # non-tensor inputs bound, as compile binds them
    module, example = loaded.module, tuple(loaded.inputs)
    pristine = copy.deepcopy(module) if rollout else None  # the prefilled cache, before any flow runs it
    calibration = [example] + random_calibration(example, CALIBRATION - 1)
    held_out = random_calibration(example, samples, seed=HELD_OUT_SEED)
    with torch.no_grad():
        eager = [_floats(module(*x)) for x in held_out]
    row: dict[str, Any] = {"model": spec, "flow": flow, "side": "ours" if flow in OURS else "stock",
                           "target": OURS[flow][1] if flow in OURS else STOCK_TARGETS[flow]}
    started = time.perf_counter()
    try:
        if flow in OURS:
            pte, extra = ours_pte(flow, spec, module, example)
            row["compile_s"] = extra.pop("compiled_s") - started
        else:
            pte, vela = stock_pte(flow, module, example, calibration)
            row["compile_s"] = time.perf_counter() - started
            extra = {"vela": vela or None, "peak_rss_bytes": memory._status()["VmHWM"]}
    except Exception as e:  # noqa: BLE001  (a flow that does not lower is a row that says so)
        return row | {"error": one_line(e), "compile_s": time.perf_counter() - started,
                      "peak_rss_bytes": memory._status()["VmHWM"]}
    row.update(extra)
    row["pte_bytes"] = len(pte)
    row.update(program_figures(pte))
    tosa = delegate_tosa(pte)
    if tosa:
        row.update(tosa_figures(tosa))
    else:
        row["weight_bytes"] = len(pte)
    measure(row, pte, example, held_out, eager, pristine, rollout, runs)
    return row


def measure(row: dict[str, Any], pte: bytes, example: Inputs, held_out: list[Inputs], eager: list[list[Any]],
            pristine: Any, rollout: int, runs: int) -> None:
    """SQNR, rollout and latency into `row`; each failure a cell of its own."""
    try:
        program = runnable(pte)
        row["sqnr_db"] = held_out_sqnr(program, held_out, eager)
        if rollout and pristine is not None:
            inputs, logits = eager_rollout(pristine, example, rollout)
            row.update(rollout_figures(program, inputs, logits))
    except Exception as e:  # noqa: BLE001
        row["run_error"] = one_line(e)
    if row["target"] == "xnnpack":
        try:
            row.update(latency(pte, example, runs))
        except Exception as e:  # noqa: BLE001
            row["latency_error"] = one_line(e)


def run_flow(spec: str, flow: str, args: argparse.Namespace) -> dict[str, Any]:
    """`child` in a fresh interpreter, with a time limit (its process group killed after)."""
    base = {"model": spec, "flow": flow, "side": "ours" if flow in OURS else "stock",
            "target": OURS[flow][1] if flow in OURS else STOCK_TARGETS[flow]}
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, __file__, "--child", spec, flow, "--out", out.name, "--samples", str(args.samples),
                   "--rollout", str(args.rollout if spec.startswith("smollm2_decode") else 0), "--runs", str(args.runs)]
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=memory._env(), start_new_session=True)
        try:
            _, err = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            return base | {"error": f"timeout after {args.timeout:.0f} s", "compile_s": time.perf_counter() - started}
        text = Path(out.name).read_text()
        if proc.returncode != 0 or not text:
            last = (err.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            return base | {"error": f"child died: {last}"[:300], "compile_s": time.perf_counter() - started}
        return json.loads(text)


# ---------------------------------------------------------------- tables


def _f(value: Any, spec: str, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    return format(value if scale == 1.0 else value / scale, spec)


def cells(r: dict[str, Any]) -> list[str]:
    """One row's table cells (the JSON keeps more)."""
    head = [r["model"], r["flow"], _f(r.get("compile_s"), ".0f"), _f(r.get("peak_rss_bytes"), ".0f", MIB)]
    if "error" in r:
        return head + ["error: " + r["error"]] + [""] * (len(HEADER) - len(head) - 1)
    delegates = ", ".join(f"{k.removesuffix('Backend')}x{n}" for k, n in r["delegates"].items()) or "0"
    cpu = f"{r['cpu_calls']}: " + (", ".join(f"{k}x{n}" for k, n in r["cpu_nontrivial"].items()) or "-")
    traffic = ("-" if "traffic_bytes" not in r
               else f"{r['traffic_bytes'] / MIB:.1f}/{r['fused_traffic_bytes'] / MIB:.1f}")
    vela = r.get("vela") or {}
    lat = ("-" if "latency_ms_1t" not in r else f"{r['latency_ms_1t']:.1f}/{r['latency_ms_2t']:.1f}")
    rollout = ("-" if "rollout_sqnr_pooled_db" not in r else
               f"{r['rollout_sqnr_worst_db']:.1f}/{r['rollout_sqnr_pooled_db']:.1f} "
               f"({r['rollout_top1_agree']}/{r['rollout_steps']})")
    sqnr = _f(r.get("sqnr_db"), ".1f") if "run_error" not in r else "run error: " + r["run_error"][:80]
    return head + [delegates, cpu, _f(r.get("tosa_ops"), "d"), traffic, _f(r.get("weight_bytes"), ".1f", MIB),
                   _f(vela.get("cycles_total"), ",d"), _f(vela.get("sram_bytes"), ".0f", 1024),
                   _f(vela.get("off_chip_bytes"), ".0f", 1024), lat, sqnr, rollout, r.get("validate", "")]


HEADER = ["model", "flow", "compile s", "peak RSS MiB", "delegates", "CPU calls: non-trivial", "TOSA ops",
          "traffic MiB unfused/fused", "weights MiB", "U85 cycles", "SRAM KiB", "off-chip KiB",
          "XNNPACK ms 1t/2t", "SQNR dB", "rollout SQNR worst/pooled (top1)", "validate"]


def table(rows: list[dict[str, Any]]) -> str:
    body = [HEADER] + [cells(r) for r in rows]
    widths = [min(60, max(len(row[i]) for row in body)) for i in range(len(HEADER))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in body]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    def md(header: list[str], body: list[list[str]]) -> list[str]:
        return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                + ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in body])

    return "\n".join(md(HEADER, [cells(r) for r in rows]) + ["", *md(RATIO_HEADER, ratios(rows))])


# ours against the stock flow of the same target, as the issue's goals pair them
PAIRS = (("W/tosa", "arm-fp"), ("W/tosa", "arm-int8"), ("I/tosa", "arm-int8"),
         ("I/ethos-u85-256", "ethos-u-a8w8"), ("I/xnnpack", "xnnpack-int8"))
RATIO_HEADER = ["model", "ours / stock", "compile", "peak RSS", "fused traffic", "U85 cycles", "XNNPACK 1t",
                "SQNR dB ours / stock"]


def ratios(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Per model, each pair's ratios (ours over stock; < 1: ours is smaller or faster)."""
    by = {(r["model"], r["flow"]): r for r in rows}
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for mine, theirs in PAIRS:
            a, b = by.get((model, mine)), by.get((model, theirs))
            if a is None or b is None:
                continue

            def ratio(key: str, inner: str | None = None) -> str:
                x = (a.get(key) or {}).get(inner) if inner else a.get(key)
                y = (b.get(key) or {}).get(inner) if inner else b.get(key)
                return f"{x / y:.2f}" if x and y and "error" not in a and "error" not in b else "-"

            sqnr = f"{_f(a.get('sqnr_db'), '.1f')} / {_f(b.get('sqnr_db'), '.1f')}"
            out.append([model, f"{mine} / {theirs}", ratio("compile_s"), ratio("peak_rss_bytes"),
                        ratio("fused_traffic_bytes"), ratio("vela", "cycles_total"), ratio("latency_ms_1t"), sqnr])
    return out


# ---------------------------------------------------------------- driver


def write_json(path: Path, command: str, rows: list[dict[str, Any]]) -> None:
    """This run's rows replace those of the same model and flow; the others are kept."""
    old = json.loads(path.read_text()) if path.is_file() else {"commands": [], "rows": []}
    mine = {(r["model"], r["flow"]) for r in rows}
    kept = [r for r in old["rows"] if (r["model"], r["flow"]) not in mine]
    commands = old["commands"] + ([command] if command not in old["commands"] else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"commands": commands, "held_out_seed": HELD_OUT_SEED, "rows": kept + rows},
                               indent=1, default=float) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), help="NAME@N: the transformer with N layers")
    p.add_argument("--flows", default="", help="some of: " + ", ".join([*OURS, *STOCK_TARGETS]) + " (default all)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per flow")
    p.add_argument("--samples", type=int, default=2, help="held-out inputs for SQNR")
    p.add_argument("--rollout", type=int, default=16, help="decode steps of the rollout (smollm2_decode)")
    p.add_argument("--runs", type=int, default=20, help="timed XNNPACK runs per thread count")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--markdown", action="store_true", help="only print the JSON's rows as Markdown")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.json.read_text())["rows"]))
        return 0
    if args.child:
        Path(args.out).write_text(json.dumps(child(*args.child, args.samples, args.rollout, args.runs), default=float))
        return 0
    wanted = [f for f in args.flows.split(",") if f]
    unknown = [f for f in wanted if f not in OURS and f not in STOCK_TARGETS]
    if unknown:
        p.error(f"--flows: unknown flow {unknown[0]}")
    command = shlex.join(["python", "benchmarks/transformer_flows.py", *argv])
    rows: list[dict[str, Any]] = []
    for spec in [m for m in args.models.split(",") if m]:
        for flow in [f for f in flows_for(spec) if not wanted or f in wanted]:
            rows.append(run_flow(spec, flow, args))
            print(" | ".join(cells(rows[-1])), file=sys.stderr, flush=True)
            write_json(args.json, command, rows)  # after every row: a long run keeps what it finished
    print(table(rows))
    body = [RATIO_HEADER] + ratios(rows)
    print("\n" + "\n".join(" | ".join(c) for c in body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
