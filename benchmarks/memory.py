"""Memory side by side (issue 52): files, load time and load RSS with weights inline
against weights in a memory-mapped .ptd, and peak activation memory, for codec_tosa's
policies W and I against stock Arm's FP32 and INT8 TOSA flows.

For every model (one child process builds it, so one model's memory never touches
another's numbers) this lowers:

* ``stock-fp``: Arm's `TOSAPartitioner` at TOSA-1.0+FP (Arm's TOSABackend);
* ``stock-int8``: Arm's PT2E INT8 flow (`TOSAQuantizer`, symmetric config, calibrated
  on the same inputs), then `TOSAPartitioner` at TOSA-1.0+INT;
* ``W`` and ``I``: codec_tosa's `compile` path (`tools.compiler.lower_program`) with
  `CodecSpec(policy)`, once inline and once with ``external_weights=True``
  (``W+ptd``, ``I+ptd``); with ``--vela`` also ``I`` for ethos-u85-256, for Vela's SRAM
  and off-chip bytes.

Per flow it records: .pte and .ptd bytes; ExecuTorch's planned buffers for the
program (`non_const_buffer_sizes`); per TOSA delegate the liveness plan of its
non-constant tensors (`serialization.memory_plan`: the peak of live bytes and the
arena ExecuTorch's greedy planner would give them, with the tensors alive at the
peak); and the load: in a fresh process that has imported the runtime and loaded
our C++ backend, `_load_program(pte, data_path=ptd)` and `load_method("forward")`
(both files go through ExecuTorch's mmap loader) are timed, with the process's
peak RSS (VmHWM, reset through /proc/self/clear_refs just before) over the RSS
before, then one forward run's peak the same way; the median of ``--repeats``
processes. Stock's TOSABackend delegates run on our backend (the same TOSA
reference model; this runtime has no TOSABackend), relabelled as validate does.

Usage (from the repository root)::

    OMP_NUM_THREADS=1 python benchmarks/memory.py [--models mobilenet_v2,ds_cnn,...]
        [--repeats 3] [--vela] [--json benchmarks/results/memory.json]

``NAME@N`` is the transformer NAME (smollm2, smollm2_decode, siglip) with N layers
(``smollm2`` alone: all 30). ``--flows`` picks some of the flows (for the full-depth
transformers, whose activations per layer are those of a shallow copy: only the
files change with depth); in the JSON they replace those flows of the model's row and
keep the others.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = ("ds_cnn", "mobilenet_v1_025", "resnet8", "deep_autoencoder", "mobilenet_v2")
FLOWS = ("stock-fp", "stock-int8", "W", "W+ptd", "I", "I+ptd")
MIB = 2**20


# ------------------------------------------------------------------ the load, in a fresh process

def _status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS


def child(pte: str, ptd: str | None, inputs: str) -> dict[str, Any]:
    """Load and run `pte` (with `ptd`) once: times and peak RSS over the RSS before."""
    import numpy as np
    import torch

    from codec_tosa.runtime import native

    native.load()
    import executorch.kernels.quantized  # noqa: F401  (the I/O quantize and dequantize)
    from executorch.extension.pybindings.portable_lib import _load_program

    arrays = np.load(inputs)
    x = tuple(torch.from_numpy(arrays[f"input_{i}"]) for i in range(len(arrays.files)))
    _reset_peak()
    before = _status()["VmRSS"]
    started = time.perf_counter()
    program = _load_program(pte, data_path=ptd)
    method = program.load_method("forward")
    load_s = time.perf_counter() - started
    load_peak = _status()["VmHWM"] - before
    after_load = _status()["VmRSS"] - before
    _reset_peak()
    before_run = _status()["VmRSS"]
    started = time.perf_counter()
    out = method(x)
    run_s = time.perf_counter() - started
    run_peak = _status()["VmHWM"] - before_run
    return {"load_s": load_s, "load_peak_bytes": load_peak, "after_load_bytes": after_load,
            "run_s": run_s, "run_peak_bytes": run_peak,
            "outputs": hashlib.sha256(b"".join(np.ascontiguousarray(t).tobytes() for t in out)).hexdigest()}


def measure_load(pte: Path, ptd: Path | None, inputs: Path, repeats: int) -> dict[str, Any]:
    """The median of `repeats` fresh processes' `child` figures."""
    runs = []
    for _ in range(repeats):
        command = [sys.executable, __file__, "--child", str(pte), "--inputs", str(inputs)]
        if ptd is not None:
            command += ["--ptd", str(ptd)]
        done = subprocess.run(command, capture_output=True, text=True, env=_env())
        line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{")), None)
        if done.returncode != 0 or line is None:
            return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
        runs.append(json.loads(line))
    out = {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "outputs"}
    out["outputs"] = runs[0]["outputs"]
    out["repeats"] = repeats
    return out


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


# ------------------------------------------------------------------ building one model's flows

def _builder(spec: str) -> Any:
    """A built-in model, or ``name@N``: the transformer `name` with N layers."""
    from codec_tosa_examples.models import BUILTIN_MODELS

    name, _, layers = spec.partition("@")
    if layers:
        return lambda: BUILTIN_MODELS[name](num_layers=int(layers))
    return BUILTIN_MODELS[spec]


def _stock(program: Any, model: Any, example: tuple, calibration: list, integer: bool) -> bytes:
    import torch
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from codec_tosa.arm import adapter as arm_adapter

    if not integer:
        part = arm_adapter.stock_partitioner(arm_adapter.tosa_compile_spec("TOSA-1.0+FP"))
        return bytes(to_edge_transform_and_lower(program, partitioner=[part]).to_executorch().buffer)
    spec = arm_adapter.tosa_compile_spec("TOSA-1.0+INT")
    quantizer = arm_adapter.arm_quantizer("TOSA-1.0+INT")
    prepared = prepare_pt2e(torch.export.export(model, example).module(check_guards=False), quantizer)
    with torch.no_grad():
        for batch in calibration:
            prepared(*batch)
    quantized = torch.export.export(convert_pt2e(prepared), example)
    part = arm_adapter.stock_partitioner(spec)
    return bytes(to_edge_transform_and_lower(quantized, partitioner=[part]).to_executorch().buffer)


def _memory(pte: bytes, ptd: Any = None, tosa: dict[int, bytes] | None = None) -> dict[str, Any]:
    """ExecuTorch's planned buffers and each TOSA delegate's activation plan."""
    from codec_tosa.runtime.pte import delegates, planned_buffers
    from codec_tosa.serialization import external
    from codec_tosa.serialization.memory_plan import activation_plan

    plans = []
    for d in delegates(pte):
        graph = (tosa or {}).get(d.index)
        if graph is None and (external.is_external(d.payload) or d.payload[4:8] == b"TOSA"):
            graph = external.complete(d.payload, ptd.get if ptd is not None else None)
        if graph is not None:
            plans.append({"index": d.index, "backend_id": d.backend_id, **activation_plan(graph).to_json()})
    return {"executorch_planned_bytes": sum(planned_buffers(pte).get("forward", ())), "delegates": plans,
            **{key: max((p[key] for p in plans), default=0) for key in
               ("peak_live_bytes", "planned_bytes", "fused_peak_live_bytes", "fused_planned_bytes")}}


def build(spec: str, directory: Path, vela: bool, flows_wanted: tuple[str, ...] = FLOWS) -> dict[str, Any]:
    """Lower every flow of one model into `directory`; their files and static figures."""
    import numpy as np
    import torch

    from codec_tosa.planning.calibration import random_calibration
    from codec_tosa.pytrees import tensor_leaves
    from codec_tosa.runtime import BACKEND_ID
    from codec_tosa.runtime.pte import delegates, with_delegates_replaced
    from codec_tosa.spec import CodecSpec
    from codec_tosa.tools.compiler import lower_program
    from codec_tosa.tools.loading import export_module
    from codec_tosa.tools.model_libs import prepare

    prepare()
    torch.manual_seed(0)
    model, example = _builder(spec)()
    # non-tensor inputs bound, as compile binds them: the program takes tensors only
    loaded = export_module(spec, model.eval(), example)
    model, example = loaded.module, loaded.inputs
    calibration = [tuple(example)] + random_calibration(tuple(example), 3)
    # the runtime's inputs: the example's tensors, flattened (a decode step's {"input_pos": ...})
    np.savez(directory / "inputs.npz", **{f"input_{i}": t.numpy() for i, t in enumerate(tensor_leaves(example))})
    flows: dict[str, Any] = {}
    for name in flows_wanted:
        started = time.perf_counter()
        row: dict[str, Any] = {}
        try:
            # each flow on its own export: lowering may change the program it is given
            program = export_module(spec, model, example).program
            if name.startswith("stock"):
                pte = _stock(program, model, tuple(example), calibration, name == "stock-int8")
                row["memory"] = _memory(pte)
                # this runtime has no TOSABackend: the same TOSA on ours, as validate runs it
                runnable = with_delegates_replaced(pte, {d.index: (BACKEND_ID, d.payload) for d in delegates(pte)
                                                         if d.backend_id == "TOSABackend"})
                ptd = None
            else:
                policy, external = name.split("+")[0], name.endswith("+ptd")
                lowered = lower_program(program, CodecSpec(policy=policy, external_weights=external), calibration)
                pte, ptd, runnable = lowered.pte, lowered.ptd, lowered.pte
                row["memory"] = _memory(pte, ptd)
        except Exception as e:  # noqa: BLE001  (a flow that does not lower is a row that says so)
            flows[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            continue
        row["lower_s"] = time.perf_counter() - started
        (directory / f"{name}.pte").write_bytes(runnable)
        row["pte_bytes"], row["ptd_bytes"] = len(pte), (ptd.nbytes if ptd is not None else 0)
        if ptd is not None:
            (directory / f"{name}.ptd").write_bytes(ptd.bytes())
        flows[name] = row
    if vela:
        flows["I@ethos-u85-256"] = _vela(export_module(spec, model, example).program, calibration, external=False)
        flows["I+ptd@ethos-u85-256"] = _vela(export_module(spec, model, example).program, calibration,
                                             external=True)
    return {"model": spec, "parameters": sum(p.numel() for p in model.parameters()), "flows": flows}


def _vela(program: Any, calibration: list, external: bool) -> dict[str, Any]:
    from codec_tosa.runtime.pte import delegates
    from codec_tosa.spec import CodecSpec
    from codec_tosa.targets.artefacts import delegate_file
    from codec_tosa.tools.compiler import lower_program

    try:
        lowered = lower_program(program, CodecSpec(policy="I", target="ethos-u85-256", external_weights=external),
                                calibration)
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    vela = lowered.report.get("vela", {})
    # compile keeps delegate k's TOSA as model.tosa, model_1.tosa, ... (Ethos-U delegates in order)
    indices = [d.index for d in delegates(lowered.pte) if d.backend_id == "EthosUBackend"]
    tosa = {index: lowered.files[delegate_file(k, "tosa")] for k, index in enumerate(indices)
            if delegate_file(k, "tosa") in lowered.files}
    return {"pte_bytes": len(lowered.pte), "ptd_bytes": lowered.ptd.nbytes if lowered.ptd is not None else 0,
            "sram_bytes": vela.get("sram_bytes"), "off_chip_bytes": vela.get("off_chip_bytes"),
            "memory": _memory(lowered.pte, lowered.ptd, tosa)}


# ------------------------------------------------------------------ the driver

def run_model(spec: str, repeats: int, vela: bool, flows: tuple[str, ...] = FLOWS) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="codec-tosa-memory-") as d:
        directory = Path(d)
        command = ([sys.executable, __file__, "--build", spec, "--dir", str(directory), "--flows", ",".join(flows)]
                   + (["--vela"] if vela else []))
        done = subprocess.run(command, capture_output=True, text=True, env=_env())
        line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("{")), None)
        if done.returncode != 0 or line is None:
            return {"model": spec, "error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
        result = json.loads(line)
        for name, row in result["flows"].items():
            pte = directory / f"{name}.pte"
            if "error" in row or not pte.is_file():
                continue
            ptd = directory / f"{name}.ptd"
            row["load"] = measure_load(pte, ptd if ptd.is_file() else None, directory / "inputs.npz", repeats)
        for name, row in result["flows"].items():  # a +ptd flow's outputs against its inline flow's
            inline = result["flows"].get(name.replace("+ptd", ""), {})
            if name.endswith("+ptd") and "outputs" in row.get("load", {}) and "outputs" in inline.get("load", {}):
                row["bit_identical_to_inline"] = row["load"]["outputs"] == inline["load"]["outputs"]
        return result


def _mib(n: Any) -> str:
    return "-" if n is None else f"{n / MIB:.2f}"


HEADER = ["model", "flow", ".pte KiB", ".ptd KiB", "load s", "load peak MiB", "run peak MiB", "= inline",
          "ET planned KiB", "peak live KiB", "planned KiB", "fused peak KiB", "Vela SRAM KiB", "off-chip KiB"]


def _kib(n: Any) -> str:
    return "-" if n is None else f"{n / 1024:.1f}"


def rows(results: list[dict[str, Any]]) -> list[list[str]]:
    """One row per model and flow, the cells of `HEADER`."""
    out = []
    for r in results:
        if "error" in r:
            out.append([r["model"], "error: " + r["error"]] + [""] * (len(HEADER) - 2))
            continue
        for name, f in r["flows"].items():
            if "error" in f:
                out.append([r["model"], name, "error: " + f["error"]] + [""] * (len(HEADER) - 3))
                continue
            load, mem = f.get("load", {}), f.get("memory", {})
            out.append([r["model"], name, _kib(f["pte_bytes"]), _kib(f["ptd_bytes"]),
                        f"{load['load_s']:.3f}" if "load_s" in load else "-",
                        _mib(load.get("load_peak_bytes")), _mib(load.get("run_peak_bytes")),
                        {True: "yes", False: "NO"}.get(f.get("bit_identical_to_inline"), ""),
                        _kib(mem.get("executorch_planned_bytes")), _kib(mem.get("peak_live_bytes")),
                        _kib(mem.get("planned_bytes")), _kib(mem.get("fused_peak_live_bytes")),
                        _kib(f.get("sram_bytes")), _kib(f.get("off_chip_bytes"))])
    return out


def table(results: list[dict[str, Any]]) -> str:
    cells = [HEADER] + rows(results)
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADER))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _peak_tensors(flow: dict[str, Any]) -> str:
    """The tensors alive at the fused peak of the delegate that holds it."""
    delegates = flow.get("memory", {}).get("delegates", [])
    if not delegates:
        return "-"
    top = max(delegates, key=lambda d: d["fused_peak_live_bytes"])
    return ", ".join(f"{name} {_kib(n)}" for name, n in top["fused_peak_tensors"])


def goals(results: list[dict[str, Any]]) -> list[list[str]]:
    """Per model, issue 52's goals side by side: the .pte with external weights as a
    share of the inline one, load peak against the activation plan, bit identity,
    and W's fused activation peak against stock INT8's and stock FP's (with the
    tensors alive at W's peak)."""
    out = [["model", "W+ptd .pte / W .pte", "load peak / planned (W+ptd)", "= inline", "W fused peak KiB",
            "/ stock INT8", "/ stock FP", "alive at W's peak (KiB)"]]
    for r in results:
        f = r.get("flows", {})
        w, ext, i8, fp = (f.get(k, {}) for k in ("W", "W+ptd", "stock-int8", "stock-fp"))
        if any("error" in x or not x for x in (w, ext)):
            continue
        peak = w["memory"]["fused_peak_live_bytes"]
        ratio = lambda other: (f"{peak / other['memory']['fused_peak_live_bytes']:.2f}"  # noqa: E731
                               if other.get("memory", {}).get("fused_peak_live_bytes") else "-")
        load = ext.get("load", {}).get("load_peak_bytes")
        planned = ext["memory"]["planned_bytes"] + ext["memory"]["executorch_planned_bytes"]
        out.append([r["model"], f"{100 * ext['pte_bytes'] / w['pte_bytes']:.2f}%",
                    f"{load / planned:.2f}" if load is not None and planned else "-",
                    {True: "yes", False: "NO"}.get(ext.get("bit_identical_to_inline"), "-"),
                    _kib(peak), ratio(i8), ratio(fp), _peak_tensors(w)])
    return out


def markdown(results: list[dict[str, Any]]) -> str:
    """Both tables as markdown, for docs/results/memory.md."""
    def md(cells: list[list[str]]) -> str:
        return "\n".join(["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(cells[0])]
                         + ["| " + " | ".join(row) + " |" for row in cells[1:]])
    return md([HEADER] + rows(results)) + "\n\n" + md(goals(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per load measurement")
    parser.add_argument("--vela", action="store_true", help="also policy I on ethos-u85-256: Vela's SRAM, off-chip")
    parser.add_argument("--flows", default=",".join(FLOWS), help=f"some of {', '.join(FLOWS)}")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "memory.json"))
    parser.add_argument("--markdown", action="store_true", help="print the JSON's tables as markdown, run nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--ptd", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    parser.add_argument("--build", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    flows = tuple(f for f in args.flows.split(",") if f)
    unknown = [f for f in flows if f not in FLOWS]
    if unknown:
        parser.error(f"--flows: unknown flow {unknown[0]} (known: {', '.join(FLOWS)})")
    if args.child:
        print(json.dumps(child(args.child, args.ptd, args.inputs)))
        return 0
    if args.build:
        try:
            print(json.dumps(build(args.build, Path(args.dir), args.vela, flows)))
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            return 1
        return 0
    out = Path(args.json)
    if args.markdown:
        print(markdown(json.loads(out.read_text())["models"]))
        return 0
    # the JSON keeps the other models' rows of earlier runs: a run of one model updates its own,
    # and a run of some of its flows (--flows) those flows only
    earlier = {r["model"]: r for r in (json.loads(out.read_text())["models"] if out.is_file() else [])}
    results = []
    for spec in [m for m in args.models.split(",") if m]:
        started = time.perf_counter()
        result = run_model(spec, args.repeats, args.vela, flows)
        if "flows" in result and "flows" in earlier.get(spec, {}):
            result["flows"] = {**earlier[spec]["flows"], **result["flows"]}
        results.append(result)
        print(f"{spec}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
        earlier[spec] = result  # in its earlier row's place, a new model last
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"models": list(earlier.values()), "repeats": args.repeats}, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
