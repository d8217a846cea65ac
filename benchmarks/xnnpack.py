"""XNNPACK flows side by side, measured in ExecuTorch's own runtime (pybindings).

For every model (one child process each, so one model's crash or memory never
touches another's numbers) this builds each flow registered in `FLOWS` from the
same module, the same seeded calibration inputs and the same held-out inputs:

* ``fp32``: `torch.export` then `XnnpackPartitioner` (no quantization);
* ``stock-int8``: XNNPACK's own PT2E flow, `XNNPACKQuantizer` with
  `get_symmetric_quantization_config(is_per_channel=True)` (static INT8), then
  `XnnpackPartitioner`;
* ``codec-int8``: the same flow with the codec plan's quantizer swapped in,
  `CodecQuantizer(CodecSpec(policy="I", target="xnnpack"))` (public API only);
* anything else added to `FLOWS` (one entry: a function
  ``(model, example_inputs, calibration) -> .pte bytes``), or named on the
  command line as ``package.module:function``.

For each flow it reports, read back from the .pte's execution plan (so a flow
that only hands back bytes is analysed exactly like the stock ones): XNNPACK
delegates, operators the CPU runs outside delegates, and the quantize /
dequantize among them; .pte bytes; SQNR of the runtime's outputs against FP32
eager on the held-out inputs (worst and mean over inputs, the worst output of
each); latency in the ExecuTorch runtime, median and p90 over ``--runs`` timed
runs after warm-up, per thread count, with flows interleaved round-robin in one
process (A, B, C, A, B, C, ...) so that drift hits all equally, and as ratios to
``stock-int8``; and the peak resident memory of loading and running the flow
once (below); for the trained ``digits_*`` models, top-1 agreement with FP32
eager (and accuracy) on their whole clean and noisy test sets. SQNR:
random-weight models whose output barely depends on the input are flagged,
since their SQNR mostly measures the last layer's bias.

Threads: XNNPACK runs its parallel loops on ExecuTorch's process-wide
threadpool. `portable_lib._unsafe_reset_threadpool(n)` replaces that pool, and
an XNNPACK runtime captures the pool when its delegate is initialised (at
program load), so this script resets the pool only while no program is loaded
and then loads fresh modules for that thread count. Each setting is checked:
the pool's reported size, the process's OS thread count right after the reset
(pthreadpool keeps n - 1 workers), and each OS thread's own CPU clock during the
timed runs (how many threads worked, and the workers' share), which holds even
on a machine shared with other load (the main thread's run-queue wait per wall
second is recorded as a measure of that).

Peak memory: for each flow, the median VmHWM of fresh processes that import the
runtime, take one thread, load the input, `_load_for_executorch` the .pte file
and run it once, minus the median VmHWM of the same processes without the load
and run (alternating, ``--mem-repeats`` of each). Cross-check, in the JSON: each
process's VmHWM minus its own VmRSS just before the load.

Usage::

    python benchmarks/xnnpack.py [--models mobilenet_v2,resnet8,ds_cnn]
        [--flows fp32,stock-int8[,pkg.mod:function]] [--runs 100] [--threads 1,2]
        [--json benchmarks/results/xnnpack.json]
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib
import importlib.util
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:  # heavy imports stay out of the memory-measurement children
    import torch
    from torch import nn
    from torch.export import ExportedProgram

    Inputs = tuple[torch.Tensor, ...]
    FlowFn = Callable[[nn.Module, Inputs, list[Inputs]], bytes]

DEFAULT_MODELS = (
    "resnet8", "ds_cnn", "mobilenet_v1_025", "deep_autoencoder",
    "digits_resnet8", "digits_ds_cnn", "digits_mobilenet", "digits_vit",
    "shufflenet_v2", "mobilenet_v2", "resnet18", "vit_tiny",
)
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "xnnpack.json"
STOCK = "stock-int8"  # latency ratios are against this flow
CALIBRATION_SEED = 0
HELD_OUT_SEED = 1234  # a different stream: no flow ever calibrates on these
MEM_MARK = "XNNPACK_MEM "  # prefix of the memory child's one result line
OBSERVER_EPS = 2.0**-12  # get_symmetric_quantization_config's observer eps


# --------------------------------------------------------------------------- flows


def pt2e_quantize(model: "nn.Module", example: "Inputs", calibration: list["Inputs"],
                  quantizer: Any) -> "ExportedProgram":
    """PT2E: export, prepare, calibrate on every calibration input, convert, export again.

    ``check_guards=False`` drops the ``_guards_fn`` call_module that `.module()` adds
    by default (a no-op for static shapes). XNNPACK's quantizer works either way
    (checked on resnet8 and mobilenet_v2); doing it for every flow hands any third
    flow's quantizer the same graph the stock one sees.
    """
    import torch
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    graph_module = torch.export.export(model, example).module(check_guards=False)
    prepared = prepare_pt2e(graph_module, quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    converted = convert_pt2e(prepared)
    return torch.export.export(converted, example)


def lower_to_xnnpack(ep: "ExportedProgram", partitioners: Sequence[Any] | None = None) -> bytes:
    """`to_edge_transform_and_lower` with `XnnpackPartitioner` (by default), then .pte bytes."""
    # The quantized kernels' out-variants must be registered before emission, or
    # .to_executorch() of a program with CPU-side q/dq fails ("Missing out variants").
    import executorch.kernels.quantized  # noqa: F401
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    parts = list(partitioners) if partitioners is not None else [XnnpackPartitioner()]
    edge = to_edge_transform_and_lower(ep, partitioner=parts)
    return edge.to_executorch().buffer


def flow_fp32(model: "nn.Module", example: "Inputs", calibration: list["Inputs"]) -> bytes:
    import torch

    return lower_to_xnnpack(torch.export.export(model, example))


def flow_stock_int8(model: "nn.Module", example: "Inputs", calibration: list["Inputs"]) -> bytes:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    return lower_to_xnnpack(pt2e_quantize(model, example, calibration, quantizer))


def flow_codec_int8(model: "nn.Module", example: "Inputs", calibration: list["Inputs"]) -> bytes:
    """The codec plan for XNNPACK: the stock flow with `CodecQuantizer` swapped in for
    `XNNPACKQuantizer`, through the public API only."""
    from codec_tosa import CodecQuantizer, CodecSpec

    quantizer = CodecQuantizer(CodecSpec(policy="I", target="xnnpack"))
    return lower_to_xnnpack(pt2e_quantize(model, example, calibration, quantizer))


# One entry per flow, in report order. A third flow is one more line here, e.g.
#     "ours-int8": lambda model, example, calibration: my_flow(model, example, calibration),
# or, without editing this file, `--flows fp32,stock-int8,my_package.my_module:my_flow`.
FLOWS: dict[str, "FlowFn"] = {
    "fp32": flow_fp32,
    STOCK: flow_stock_int8,
    "codec-int8": flow_codec_int8,
}


def resolve_flow(name: str) -> "FlowFn":
    """A registered flow, or ``package.module:function`` / ``path/to/file.py:function``."""
    if name in FLOWS:
        return FLOWS[name]
    if ":" not in name:
        raise ValueError(f"unknown flow {name!r}: expected one of {', '.join(FLOWS)} or module:function")
    target, func_name = name.rsplit(":", 1)
    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"_xnnpack_flow_{abs(hash(target))}", target)
        if spec is None or spec.loader is None:
            raise ValueError(f"flow {name!r}: cannot import {target!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ValueError(f"flow {name!r}: {target!r} has no function {func_name!r}")
    return func


# --------------------------------------------------------------------------- models


@dataclass
class Workload:
    """A model with the inputs every flow shares."""

    module: "nn.Module"
    example: "Inputs"
    calibration: list["Inputs"]
    held_out: list["Inputs"]
    note: str = ""  # how it was built, when that differs from the obvious
    # a trained classifier's labelled test sets (name -> (N, ...) images): top-1 agreement
    test_sets: dict[str, "torch.Tensor"] = field(default_factory=dict)
    labels: "torch.Tensor | None" = None


def seeded_inputs(example: "Inputs", n: int, seed: int) -> list["Inputs"]:
    """n inputs shaped like `example`: standard normal for floating tensors (as the
    project's `random_calibration`), other tensors copied."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [
        tuple(torch.randn(t.shape, generator=gen, dtype=t.dtype) if t.dtype.is_floating_point
              else t.clone() for t in example)
        for _ in range(n)
    ]


def _random_workload(module: "nn.Module", example: "Inputs", n_cal: int, n_held: int,
                     note: str = "") -> Workload:
    return Workload(module.eval(), tuple(example), seeded_inputs(example, n_cal, CALIBRATION_SEED),
                    seeded_inputs(example, n_held, HELD_OUT_SEED), note)


def _built_seeded(build: Callable[[], "nn.Module"]) -> "nn.Module":
    import torch

    # fork_rng: building never disturbs the caller's random stream.
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return build().eval()


def _resnet18() -> tuple["nn.Module", "Inputs"]:
    import torch
    from codec_tosa.tools import model_libs

    model_libs.prepare()  # torchvision is a CUDA build here; this makes it importable
    import torchvision

    module = _built_seeded(lambda: torchvision.models.resnet18(weights=None))
    return module, (torch.zeros(1, 3, 224, 224),)


def _project_model(spec: str) -> tuple["nn.Module", "Inputs"]:
    """shufflenet_v2, mobilenet_v2, vit_tiny, ... or path/to/file.py:function."""
    from codec_tosa.tools import model_libs

    model_libs.prepare()
    from codec_tosa_examples.models import load_model

    module, example = load_model(spec)
    return module, tuple(example)


def _digits_workload(name: str, n_cal: int, n_held: int) -> Workload:
    """A trained digits model: calibrate on training images, evaluate on test images
    (SQNR on the first `n_held`; top-1 agreement on the whole clean and noisy test sets)."""
    from codec_tosa_examples.models import trained

    module, example = trained.load(name)
    data = trained.digits()
    held_out = [(x.unsqueeze(0).clone(),) for x in data.test_x[:n_held]]
    return Workload(module, tuple(example), trained.calibration_images(n_cal, CALIBRATION_SEED),
                    held_out, "digits: calibration = training images, held-out = first test images",
                    test_sets={"test": data.test_x, "noisy": data.noisy_x}, labels=data.test_y)


def _ds_cnn_avgpool() -> tuple["nn.Module", "Inputs"]:
    """DS-CNN with the wheel's original AvgPool2d((24, 5)) over the 25x5 map (which drops the
    last row), which the project's ``ds_cnn`` replaces by a global pool as Arm's test does."""
    from executorch.examples.models.mlperf_tiny import DSCNNKWSModel

    wrapper = DSCNNKWSModel()
    return _built_seeded(wrapper.get_eager_model), tuple(wrapper.get_example_inputs())


# Builders of this script's own; every other name is the project's
# (`codec_tosa_examples.models.load_model`: the MLPerf Tiny models as Arm's tests
# build them, shufflenet_v2, mobilenet_v2, vit_tiny, the trained digits_* models, ...).
MODELS: dict[str, Callable[[], tuple["nn.Module", "Inputs"]]] = {
    "resnet18": _resnet18,
    "ds_cnn_avgpool": _ds_cnn_avgpool,
}


def build_workload(name: str, n_cal: int, n_held: int) -> Workload:
    """`name`: a key of MODELS, a trained ``digits_*`` model, a project model
    (`codec_tosa_examples.models.load_model`) or ``path/to/file.py:function``."""
    if name.startswith("digits_"):
        return _digits_workload(name, n_cal, n_held)  # the project's trained models, their data
    if name in MODELS:
        module, example = MODELS[name]()
    else:
        try:
            module, example = _project_model(name)
        except ValueError as exc:
            raise ValueError(f"{exc} (or one of this script's: {', '.join(MODELS)}, digits_*)") from exc
    return _random_workload(module, example, n_cal, n_held)


# --------------------------------------------------------------------------- .pte analysis


@dataclass
class PteStats:
    pte_bytes: int
    xnnpack_delegates: int  # DelegateCall instructions to XnnpackBackend
    other_delegates: dict[str, int]
    delegate_payload_bytes: int
    cpu_ops: dict[str, int]  # KernelCall instructions outside delegates, by operator
    cpu_op_count: int
    qdq_outside: int  # quantize/dequantize among cpu_ops
    # Inside the XNNPACK delegates, decoded from their flatbuffers ("" error when it worked):
    xnnpack_nodes: dict[str, int] = field(default_factory=dict)  # node type -> count
    xnnpack_converts: int = 0  # XNNConvert: a quantize or dequantize run inside a delegate
    fused_activations: int = 0  # relu/clamp folded into the producing node's output range
    boundary_values: dict[str, int] = field(default_factory=dict)  # "in/out <dtype>" -> count
    xnnpack_decode_error: str = ""


def decode_xnnpack_payload(payload: bytes) -> dict[str, Any]:
    """One XNNPACK delegate payload as JSON, via the wheel's flatc and the backend's schema
    (the reverse of xnnpack_graph_serialize.serialize_xnnpack_binary)."""
    import re

    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import (
        XNNHeader,
        _get_schema_bytes,
    )
    from executorch.exir._serialize._flatbuffer import _get_flatc_path

    header = XNNHeader.from_bytes(payload[: XNNHeader.EXPECTED_LENGTH])
    flatbuffer = payload[header.flatbuffer_offset: header.flatbuffer_offset + header.flatbuffer_size]
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "schema.fbs").write_bytes(_get_schema_bytes())
        Path(tmp, "graph.bin").write_bytes(flatbuffer)
        subprocess.run([_get_flatc_path(), "--json", "--strict-json", "--raw-binary", "-o", tmp,
                        str(Path(tmp, "schema.fbs")), "--", str(Path(tmp, "graph.bin"))],
                       check=True, capture_output=True)
        text = Path(tmp, "graph.json").read_text()
    # flatc writes bare inf / nan (e.g. a ReLU's output_max); Python's json reads Infinity / NaN.
    text = re.sub(r"(?<=[:\[,\s])(-?)inf\b", r"\1Infinity", text)
    return json.loads(re.sub(r"(?<=[:\[,\s])-?nan\b", "NaN", text))


def _xnnpack_contents(graphs: list[dict[str, Any]]) -> dict[str, Any]:
    nodes: Counter[str] = Counter()
    boundary: Counter[str] = Counter()
    fused = 0
    for graph in graphs:
        for node in graph.get("xnodes", []):
            kind = node["xnode_union_type"].removeprefix("XNN")
            nodes[kind] += 1
            fused += kind != "Clamp" and node.get("output_min_max") is not None
        for value in graph.get("xvalues", []):
            union = value["xvalue_union"]
            tensor = union.get("tensor_value", union)
            flags = tensor.get("flags", 0)  # XNN_VALUE_FLAG_EXTERNAL_INPUT = 1, _OUTPUT = 2
            dtype = tensor.get("datatype", "?").removeprefix("xnn_datatype_")
            for bit, side in ((1, "in"), (2, "out")):
                if flags & bit:
                    boundary[f"{side} {dtype}"] += 1
    return {"xnnpack_nodes": dict(sorted(nodes.items())), "xnnpack_converts": nodes["Convert"],
            "fused_activations": fused, "boundary_values": dict(sorted(boundary.items()))}


def analyse_pte(pte: bytes) -> PteStats:
    """Count what the 'forward' execution plan runs: delegate calls and CPU kernels."""
    from codec_tosa.runtime.pte import call_counts, delegates as pte_delegates

    delegates, ops = call_counts(pte)
    payload, graphs, decode_error = 0, [], ""
    for delegate in (d for d in pte_delegates(pte) if d.method == "forward"):
        data = delegate.payload
        payload += len(data)
        if delegate.backend_id == "XnnpackBackend" and not decode_error:
            try:
                graphs.append(decode_xnnpack_payload(data))
            except Exception as exc:  # the counts above stand without it
                decode_error = _reason(exc)
    xnn = delegates.pop("XnnpackBackend", 0)
    return PteStats(
        pte_bytes=len(pte), xnnpack_delegates=xnn, other_delegates=dict(delegates),
        delegate_payload_bytes=payload, cpu_ops=dict(sorted(ops.items())),
        cpu_op_count=sum(ops.values()),
        qdq_outside=sum(n for name, n in ops.items() if "quantize" in name.split("::")[-1]),
        **(_xnnpack_contents(graphs) if not decode_error else {}),
        xnnpack_decode_error=decode_error,
    )


# --------------------------------------------------------------------------- runtime


def runtime() -> Any:
    """ExecuTorch's pybindings, with the quantized kernels that CPU-side q/dq need."""
    import executorch.extension.pybindings.portable_lib as portable_lib
    import executorch.kernels.quantized  # noqa: F401  registers quantized_decomposed::* kernels

    return portable_lib


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def thread_cpu_ns() -> dict[int, int]:
    """CPU time of every OS thread of this process, exact to the nanosecond.

    Linux encodes a thread's CPU clock as a clockid: MAKE_THREAD_CPUCLOCK(tid,
    CPUCLOCK_SCHED) = (~tid << 3) | 4 (per-thread) | 2 (sched), which
    clock_gettime accepts for any thread of the caller's process. Unlike CPU time /
    wall time, this says which threads worked even when other processes take the CPUs,
    and unlike /proc/.../schedstat it is current for a thread that is running.
    """
    out = {}
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            out[tid] = time.clock_gettime_ns(((~tid) << 3) | 6)
        except OSError:
            continue  # the thread ended meanwhile
    return out


def run_queue_wait_ns() -> int:
    """Time the calling thread has spent runnable but not running (schedstat field 2)."""
    import threading

    try:
        return int(Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def thread_activity(before: dict[int, int], after: dict[int, int], wait_ns: int,
                    wall_ns: int) -> dict[str, Any]:
    """Which threads ran during `wall_ns`: the evidence that the pool size took effect."""
    import threading

    main = threading.get_native_id()
    cpu = {tid: ns - before.get(tid, 0) for tid, ns in after.items()}
    total = max(1, sum(cpu.values()))
    return {
        # threads that were on a CPU for at least 5% of the timed loop's wall time
        "busy_threads": sum(1 for ns in cpu.values() if ns >= 0.05 * wall_ns),
        "worker_cpu_share": 1.0 - cpu.get(main, 0) / total,  # CPU time not on the main thread
        "cpu_per_wall": total / max(1, wall_ns),
        # run-queue wait of the main thread per wall second: how shared the machine was
        "main_wait_per_wall": wait_ns / max(1, wall_ns),
    }


def set_threads(n: int) -> dict[str, int]:
    """Resize ExecuTorch's threadpool (XNNPACK's). Only call with no program loaded:
    a loaded XNNPACK delegate keeps the old pool, which the reset destroys."""
    rt = runtime()
    before = os_threads()
    rt._unsafe_reset_threadpool(n)
    got = rt._threadpool_get_thread_count()
    if got != n:
        raise RuntimeError(f"threadpool reports {got} threads after a reset to {n}")
    return {"pool_threads": got, "os_threads_before_reset": before, "os_threads_after_reset": os_threads()}


def sqnr_db(reference: "torch.Tensor", actual: "torch.Tensor") -> float:
    ref = reference.detach().double().flatten()
    noise = float(((ref - actual.detach().double().flatten()) ** 2).sum())
    signal = float((ref ** 2).sum())
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def leaves(value: Any) -> list["torch.Tensor"]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


# --------------------------------------------------------------------------- memory


def memory_child(pte_path: str, inputs_path: str, threads: int) -> None:
    """One fresh process: import the runtime, build the input, then (unless pte_path is
    '-') load the program and run it once. Prints peak resident memory."""
    rt = runtime()
    import torch

    set_threads(threads)
    inputs = torch.load(inputs_path, weights_only=True)
    status_before = _proc_status()
    if pte_path != "-":
        module = rt._load_for_executorch(pte_path)  # the file loader, as a deployment would
        module.forward(list(inputs))
    status = _proc_status()
    print(MEM_MARK + json.dumps({
        "vm_hwm_kib": status["VmHWM"], "vm_rss_kib": status["VmRSS"],
        "vm_rss_before_load_kib": status_before["VmRSS"],
        "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }), flush=True)


def _proc_status() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


def _run_memory_child(pte_path: str, inputs_path: str, threads: int) -> dict[str, int]:
    proc = subprocess.run(
        [sys.executable, __file__, "--mem-child", pte_path, "--mem-inputs", inputs_path,
         "--mem-threads", str(threads)],
        capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith(MEM_MARK):
            return json.loads(line[len(MEM_MARK):])
    raise RuntimeError(f"memory child exited {proc.returncode}: {_last_line(proc.stderr)}")


def measure_memory(ptes: dict[str, Path], inputs_path: Path, repeats: int
                   ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Median VmHWM over `repeats` fresh processes per flow, minus the same for a process
    that loaded nothing. Processes alternate baseline, flows, baseline, ... so drift in
    the page cache or the allocator hits every flow alike."""
    samples: dict[str, list[int]] = {"<baseline>": [], **{name: [] for name in ptes}}
    # Cross-check: the same process's peak minus its own RSS just before the load.
    own: dict[str, list[int]] = {name: [] for name in ptes}
    errors: dict[str, str] = {}
    for _ in range(repeats):
        for name, path in [("<baseline>", "-"), *((n, str(p)) for n, p in ptes.items())]:
            if name in errors:
                continue
            try:
                mem = _run_memory_child(path, str(inputs_path), 1)
            except Exception as exc:  # a crash here is a runtime failure of that flow
                errors[name] = _reason(exc)
                continue
            samples[name].append(mem["vm_hwm_kib"])
            if name in own:
                own[name].append(mem["vm_hwm_kib"] - mem["vm_rss_before_load_kib"])
    if "<baseline>" in errors:
        raise RuntimeError(f"baseline memory process failed: {errors['<baseline>']}")
    base = statistics.median(samples["<baseline>"])
    baseline = {"vm_hwm_kib_median": base, "samples_kib": samples["<baseline>"]}
    per_flow: dict[str, dict[str, Any]] = {}
    for name in ptes:
        if name in errors:
            per_flow[name] = {"error": errors[name]}
        else:
            peak = statistics.median(samples[name])
            per_flow[name] = {"peak_kib_over_baseline": peak - base, "vm_hwm_kib_median": peak,
                              "samples_kib": samples[name],
                              "peak_kib_over_own_pre_load": statistics.median(own[name])}
    return baseline, per_flow


# --------------------------------------------------------------------------- timing


def time_interleaved(ptes: dict[str, bytes], inputs: "Inputs", threads: int, runs: int,
                     warmup: int) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Latency of every flow at one thread count, round-robin A, B, C, A, B, C, ..."""
    import numpy as np

    rt = runtime()
    gc.collect()  # no module of a previous setting may outlive the reset
    check = set_threads(threads)
    modules = {name: rt._load_for_executorch_from_buffer(pte) for name, pte in ptes.items()}
    check["os_threads_after_load"] = os_threads()
    args = list(inputs)
    for _ in range(warmup):
        for module in modules.values():
            module.forward(args, clone_outputs=False)
    wall: dict[str, list[int]] = {name: [] for name in modules}
    cpu0, wait0, loop0 = thread_cpu_ns(), run_queue_wait_ns(), time.perf_counter_ns()
    for _ in range(runs):
        for name, module in modules.items():
            t0 = time.perf_counter_ns()
            module.forward(args, clone_outputs=False)
            wall[name].append(time.perf_counter_ns() - t0)
    loop_ns = time.perf_counter_ns() - loop0
    check.update(thread_activity(cpu0, thread_cpu_ns(), run_queue_wait_ns() - wait0, loop_ns))
    del modules
    gc.collect()
    out = {}
    for name, ns in wall.items():
        ms = np.asarray(ns, dtype=np.float64) / 1e6
        out[name] = {
            "median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "min_ms": float(ms.min()), "mean_ms": float(ms.mean()),
        }
    return check, out


# --------------------------------------------------------------------------- one model


@dataclass
class FlowResult:
    flow: str
    error: str = ""  # one line; empty when everything was measured
    build_s: float = math.nan
    stats: PteStats | None = None
    sqnr_worst_db: float = math.nan
    sqnr_mean_db: float = math.nan
    latency: dict[str, dict[str, float]] = field(default_factory=dict)  # threads -> stats
    ratio_to_stock: dict[str, float] = field(default_factory=dict)  # threads -> median / stock's
    memory: dict[str, Any] = field(default_factory=dict)
    # trained classifiers: per test set, top-1 agreement with FP32 eager and accuracy
    top1: dict[str, dict[str, float]] = field(default_factory=dict)


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Everything for one model (the child process's job); scratch files are removed."""
    with tempfile.TemporaryDirectory(prefix=f"xnnpack_{name}_") as tmp:
        return _run_model(name, args, Path(tmp))


def _run_model(name: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    import torch

    runtime()  # import it (and its kernels) before anything is timed
    torch.manual_seed(0)
    work = build_workload(name, args.calibration, args.held_out)
    with torch.no_grad():
        references = [leaves(work.module(*x)) for x in work.held_out]
    out_max = max(float(t.abs().max()) for ref in references for t in ref)
    # How much the outputs depend on the input: random weights can make the signal die out,
    # leaving an output that is (nearly) the last layer's bias for every input.
    changes = [float((a - b).abs().max()) for ref in references[1:] for a, b in zip(ref, references[0])]
    spread = max(changes) / max(out_max, 1e-30) if changes else 1.0
    warning = ""
    if out_max < OBSERVER_EPS * 127:
        # XNNPACK's observers floor every scale at eps (xnnpack_quantizer.py, "eps": 2**-12):
        # outputs this small quantize to (almost) nothing whatever the flow does.
        warning = (f"FP32 eager outputs are at most {out_max:.2g} in magnitude, under 127 x the "
                   f"observers' smallest scale (2^-12): INT8 SQNR here reflects the random "
                   f"weights, not the flow")
    elif spread < 1e-3:
        warning = (f"FP32 eager outputs barely depend on the input (max change across the "
                   f"held-out inputs {spread:.1e} of their magnitude): the random weights kill "
                   f"the signal, so SQNR measures little more than the last bias")
    flows = {flow: FlowResult(flow) for flow in args.flows}
    pte_dir = Path(args.pte_dir) if args.pte_dir else tmp
    pte_dir.mkdir(parents=True, exist_ok=True)
    ptes: dict[str, bytes] = {}

    for flow, result in flows.items():
        _progress(f"{name}: building {flow}")
        try:
            fn = resolve_flow(flow)
            t0 = time.perf_counter()
            pte = fn(work.module, work.example, work.calibration)
            result.build_s = time.perf_counter() - t0
            if not isinstance(pte, (bytes, bytearray)):
                raise TypeError(f"flow returned {type(pte).__name__}, expected .pte bytes")
            ptes[flow] = bytes(pte)
            result.stats = analyse_pte(ptes[flow])
        except Exception as exc:
            result.error = f"build: {_reason(exc)}"
            ptes.pop(flow, None)
            _progress(f"{name}: {flow} failed: {result.error}")
    paths = {}
    for flow, pte in ptes.items():
        paths[flow] = pte_dir / f"{name}.{flow.replace(':', '_').replace('/', '_')}.pte"
        paths[flow].write_bytes(pte)

    # Memory first, each flow in a fresh process: that also finds a flow that crashes
    # the runtime before it can take this process (and the other flows) down with it.
    inputs_path = tmp / "input.pt"
    torch.save(work.held_out[0], inputs_path)
    baseline: dict[str, Any] = {}
    if args.mem_repeats > 0 and paths:
        _progress(f"{name}: peak memory, {args.mem_repeats} fresh process(es) per flow")
        try:
            baseline, per_flow = measure_memory(paths, inputs_path, args.mem_repeats)
            for flow, mem in per_flow.items():
                flows[flow].memory = mem
                if "error" in mem:
                    flows[flow].error = f"runtime (fresh process): {mem['error']}"
                    ptes.pop(flow)
        except Exception as exc:
            baseline = {"error": _reason(exc)}

    # Accuracy of what the runtime computes, against FP32 eager.
    for flow in list(ptes):
        try:
            per_input = runtime_sqnr(ptes[flow], work.held_out, references)
            flows[flow].sqnr_worst_db = min(per_input)
            flows[flow].sqnr_mean_db = statistics.fmean(per_input)
        except Exception as exc:
            flows[flow].error = f"runtime: {_reason(exc)}"
            ptes.pop(flow)
    eager_top1: dict[str, dict[str, float]] = {}
    if work.test_sets:
        with torch.no_grad():
            eager_pred = {k: work.module(x).argmax(-1) for k, x in work.test_sets.items()}
        for k, pred in eager_pred.items():
            eager_top1[k] = {"n": len(pred), "accuracy": float((pred == work.labels).float().mean())}
        for flow in list(ptes):
            try:
                flows[flow].top1 = runtime_top1(ptes[flow], work.test_sets, eager_pred, work.labels)
            except Exception as exc:
                flows[flow].error = f"runtime (top-1): {_reason(exc)}"
                ptes.pop(flow)
    gc.collect()

    thread_checks: dict[str, Any] = {}
    for threads in args.threads:
        if not ptes:
            break
        _progress(f"{name}: timing {', '.join(ptes)} interleaved, {threads} thread(s), "
                  f"{args.warmup} warm-up + {args.runs} runs")
        try:
            check, latency = time_interleaved(ptes, work.held_out[0], threads, args.runs, args.warmup)
        except Exception as exc:
            thread_checks[str(threads)] = {"error": _reason(exc)}
            continue
        thread_checks[str(threads)] = check
        for flow, stats in latency.items():
            flows[flow].latency[str(threads)] = stats
        stock = latency.get(STOCK)
        for flow, stats in latency.items():
            flows[flow].ratio_to_stock[str(threads)] = (
                stats["median_ms"] / stock["median_ms"] if stock else math.nan)

    return {
        "model": name,
        "note": work.note,
        "eager_output_max_abs": out_max,
        "eager_output_spread": spread,  # max |y_i - y_0| over held-out inputs / max |y|
        "warning": warning,
        "inputs": [list(t.shape) for t in work.example],
        "calibration_inputs": len(work.calibration),
        "held_out_inputs": len(work.held_out),
        "eager_top1": eager_top1,
        "flows": [_flow_json(r) for r in flows.values()],
        "memory_baseline": baseline,
        "thread_checks": thread_checks,
        "pte_dir": str(pte_dir) if args.pte_dir else None,
    }


def runtime_sqnr(pte: bytes, held_out: list["Inputs"], references: list[list["torch.Tensor"]]
                 ) -> list[float]:
    """Per held-out input, the worst output's SQNR of the runtime against FP32 eager.
    A function of its own so that the module is gone before any threadpool reset."""
    module = runtime()._load_for_executorch_from_buffer(pte)
    per_input = []
    for x, ref in zip(held_out, references):
        outs = leaves(module.forward(list(x)))
        if len(outs) != len(ref):
            raise RuntimeError(f"{len(outs)} outputs, eager has {len(ref)}")
        per_input.append(min(sqnr_db(r, o) for r, o in zip(ref, outs)))
    return per_input


def runtime_top1(pte: bytes, test_sets: dict[str, "torch.Tensor"], eager: dict[str, "torch.Tensor"],
                 labels: "torch.Tensor") -> dict[str, dict[str, float]]:
    """Per test set, the share of images whose runtime top-1 class is FP32 eager's,
    and the runtime's accuracy against the labels (one image per call, batch 1)."""
    import torch

    module = runtime()._load_for_executorch_from_buffer(pte)
    out = {}
    for name, images in test_sets.items():
        pred = torch.stack([leaves(module.forward([x.unsqueeze(0).contiguous()]))[0].reshape(-1).argmax()
                            for x in images])
        out[name] = {"n": len(pred), "agreement": float((pred == eager[name]).float().mean()),
                     "accuracy": float((pred == labels).float().mean())}
    return out


def _flow_json(result: FlowResult) -> dict[str, Any]:
    out = asdict(result)
    out["stats"] = asdict(result.stats) if result.stats else None
    return out


# --------------------------------------------------------------------------- parent


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or ["(no output)"])[-1].strip()[:300]


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_child_process(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The model in its own process; a crash or timeout becomes a one-line reason."""
    with tempfile.TemporaryDirectory(prefix="xnnpack_child_") as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "stderr.log"
        cmd = [sys.executable, __file__, "--child", model, "--child-out", str(out),
               "--flows", ",".join(args.flows), "--runs", str(args.runs),
               "--warmup", str(args.warmup), "--threads", ",".join(map(str, args.threads)),
               "--calibration", str(args.calibration), "--held-out", str(args.held_out),
               "--mem-repeats", str(args.mem_repeats)]
        if args.pte_dir:
            cmd += ["--pte-dir", args.pte_dir]
        t0 = time.perf_counter()
        try:
            with log.open("w") as err:
                proc = subprocess.run(cmd, stderr=err, timeout=args.timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            return {"model": model, "error": f"timed out after {args.timeout} s", "flows": []}
        wall = time.perf_counter() - t0
        if rc != 0 or not out.exists():
            return {"model": model, "flows": [],
                    "error": f"child exited {rc}: {_last_line(log.read_text(errors='replace'))}"}
        result = json.loads(out.read_text())
        result["child_wall_s"] = wall
        return result


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def print_table(results: list[dict[str, Any]], threads: list[int]) -> None:
    head = f"{'model':<18} {'flow':<18} {'XNN':>3} {'CPU':>4} {'q/dq':>4} {'Cvt':>4} {'.pte KiB':>9} " \
           f"{'SQNR worst/mean dB':>19}"
    for t in threads:
        head += f" {f'{t}T med/p90 ms':>16} {'x stock':>7}"
    head += f" {'peak MiB':>8}"
    print(head)
    print("-" * len(head))
    for res in results:
        if res.get("error"):
            print(f"{res['model']:<18} FAILED: {res['error']}")
            continue
        for flow in res["flows"]:
            s = flow["stats"] or {}
            sq = "-" if math.isnan(flow["sqnr_worst_db"]) else \
                f"{_fmt(flow['sqnr_worst_db'], '.1f')}/{_fmt(flow['sqnr_mean_db'], '.1f')}"
            label = flow["flow"].rsplit(":", 1)[-1]  # module:function flows by function name
            line = (f"{res['model']:<18} {label[:18]:<18} {s.get('xnnpack_delegates', '-'):>3} "
                    f"{s.get('cpu_op_count', '-'):>4} {s.get('qdq_outside', '-'):>4} "
                    f"{s.get('xnnpack_converts', '-'):>4} "
                    f"{_fmt(s.get('pte_bytes', math.nan) / 1024, '.1f'):>9} {sq:>19}")
            for t in threads:
                lat = flow["latency"].get(str(t))
                cell = f"{lat['median_ms']:.3f}/{lat['p90_ms']:.3f}" if lat else "-"
                line += f" {cell:>16} {_fmt(flow['ratio_to_stock'].get(str(t), math.nan), '.2f'):>7}"
            mem = flow["memory"].get("peak_kib_over_baseline")
            line += f" {_fmt(mem / 1024 if mem is not None else None, '.1f'):>8}"
            print(line)
            if flow["error"]:
                print(f"{'':<18}   ! {flow['error']}")
    print("XNN: XNNPACK delegate calls; CPU: kernel calls outside delegates (q/dq: of which quantize/"
          "dequantize); Cvt: quantize/dequantize run inside delegates (XNNConvert nodes)")
    trained = [r for r in results if r.get("eager_top1")]
    if trained:
        print()
        print("Trained classifiers, whole test sets: top-1 agreement with FP32 eager (accuracy):")
        for res in trained:
            eager = ", ".join(f"{k} {v['accuracy']:.2%}" for k, v in res["eager_top1"].items())
            print(f"  {res['model']}: FP32 eager accuracy {eager}")
            for flow in res["flows"]:
                if flow.get("top1"):
                    cells = ", ".join(f"{k} {v['agreement']:.2%} ({v['accuracy']:.2%})"
                                      for k, v in flow["top1"].items())
                    print(f"    {flow['flow']}: {cells}")
    print()
    print("CPU operators outside delegates:")
    for res in results:
        for flow in res.get("flows", []):
            if flow["stats"] and flow["stats"]["cpu_ops"]:
                ops = ", ".join(f"{k} x{v}" for k, v in flow["stats"]["cpu_ops"].items())
                print(f"  {res['model']} / {flow['flow']}: {ops}")
    print()
    print("Inside the XNNPACK delegates: fused activations; delegate inputs/outputs by dtype; nodes:")
    for res in results:
        for flow in res.get("flows", []):
            s = flow["stats"]
            if not s:
                continue
            if s["xnnpack_decode_error"]:
                print(f"  {res['model']} / {flow['flow']}: not decoded: {s['xnnpack_decode_error']}")
                continue
            io = ", ".join(f"{k} x{v}" for k, v in s["boundary_values"].items())
            nodes = ", ".join(f"{k} x{v}" for k, v in s["xnnpack_nodes"].items())
            print(f"  {res['model']} / {flow['flow']}: fused {s['fused_activations']}; {io}; {nodes}")
    print()
    print("Thread checks during the timed runs (all flows): pool size; OS threads before -> after "
          "the reset; threads on a CPU >= 5% of the time; share of CPU time off the main thread; "
          "main thread's run-queue wait per wall second (machine contention):")
    for res in results:
        for t, check in res.get("thread_checks", {}).items():
            if "error" in check:
                print(f"  {res['model']} {t}T: {check['error']}")
                continue
            print(f"  {res['model']} {t}T: pool {check['pool_threads']}; OS threads "
                  f"{check['os_threads_before_reset']} -> {check['os_threads_after_reset']}; "
                  f"busy {check['busy_threads']}; off-main CPU {check['worker_cpu_share']:.0%}; "
                  f"wait/wall {check['main_wait_per_wall']:.2f}")
    for res in results:
        if res.get("warning"):
            print(f"  note: {res['model']}: {res['warning']}")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


def _environment() -> dict[str, Any]:
    from importlib.metadata import version

    env: dict[str, Any] = {"python": platform.python_version(), "cpu_count": os.cpu_count(),
                           "machine": platform.machine(), "loadavg_start": os.getloadavg()}
    for pkg in ("executorch", "torch", "torchao"):
        try:
            env[pkg] = version(pkg)
        except Exception:
            env[pkg] = None
    return env


def _csv(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=_csv, default=list(DEFAULT_MODELS))
    ap.add_argument("--flows", type=_csv, default=list(FLOWS),
                    help="registered names or package.module:function (default: all registered)")
    ap.add_argument("--runs", type=int, default=100, help="timed runs per flow and thread count")
    ap.add_argument("--warmup", type=int, default=10, help="untimed interleaved rounds first")
    ap.add_argument("--threads", type=lambda s: [int(x) for x in _csv(s)], default=[1, 2])
    ap.add_argument("--calibration", type=int, default=8, help="seeded calibration inputs")
    ap.add_argument("--held-out", type=int, default=8, help="seeded held-out inputs (SQNR)")
    ap.add_argument("--mem-repeats", type=int, default=3, help="fresh processes per flow (0: skip)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per model")
    ap.add_argument("--pte-dir", default=None, help="keep the .pte files here")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    # Child modes (internal).
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--mem-child", help=argparse.SUPPRESS)
    ap.add_argument("--mem-inputs", help=argparse.SUPPRESS)
    ap.add_argument("--mem-threads", type=int, default=1, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mem_child:
        memory_child(args.mem_child, args.mem_inputs, args.mem_threads)
        return 0
    if args.child:
        try:
            result = run_model(args.child, args)
        except Exception as exc:  # the model itself (build, eager) failed: one line, no flows
            traceback.print_exc()
            result = {"model": args.child, "error": _reason(exc), "flows": []}
        Path(args.child_out).write_text(json.dumps(_json_safe(result)))
        return 0
    if args.runs < 50:
        print(f"note: --runs {args.runs} is below 50; fine for a smoke test, not for figures")
    env = _environment()
    results = []
    for model in args.models:
        _progress(f"=== {model}")
        results.append(run_child_process(model, args))
        if results[-1].get("error"):
            _progress(f"{model} FAILED: {results[-1]['error']}")

    def finite(r: dict[str, Any]) -> dict[str, Any]:  # undo the JSON 'inf' strings for printing
        for f in r.get("flows", []):
            for key in ("sqnr_worst_db", "sqnr_mean_db"):
                v = f[key]
                f[key] = math.nan if v is None else (math.inf if v == "inf" else
                                                     -math.inf if v == "-inf" else v)
        return r

    env["loadavg_end"] = os.getloadavg()
    print()
    print_table([finite(copy.deepcopy(r)) for r in results], args.threads)
    report = {"environment": env, "command": " ".join([Path(sys.executable).name, *sys.argv]),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                           if not k.startswith(("child", "mem_child", "mem_inputs", "mem_threads"))},
              "memory_method": ("peak_kib_over_baseline: median VmHWM (/proc/self/status) of fresh "
                                "processes that import the runtime, set 1 thread, torch.load the input, "
                                "_load_for_executorch the .pte file and run forward once, minus the median "
                                "VmHWM of the same processes without the load and run; cross-check "
                                "peak_kib_over_own_pre_load: each process's VmHWM minus its own VmRSS "
                                "just before the load"),
              "models": results}
    args.json.write_text(json.dumps(_json_safe(report), indent=1))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
