"""Accuracy on real data with trained weights, measured on the artefacts (issue 23).

Models: the digit classifiers of `codec_tosa_examples.models.trained` (ResNet-8,
DS-CNN, MobileNet-style, ViT; committed weights). Every flow calibrates on the
same 64 training images (`calibration_images(64, seed=0)`) and is evaluated on
the 360 clean test images and the same images with seeded sigma-0.4 noise.

Flows (one row each):

* ``fp32``: the eager model (the reference every other row is compared with);
* ``stock-int8``: Arm's documented PT2E flow, `TOSAQuantizer` at TOSA-1.0+INT
  with `get_symmetric_quantization_config()`, prepare_pt2e on
  ``torch.export.export(m, x).module(check_guards=False)``, calibrate,
  convert_pt2e, export, `TOSAPartitioner`;
* ``stock-a16w8``: the same with `get_symmetric_a16w8_quantization_config()`
  at TOSA-1.0+INT+int16;
* ``Z``, ``Y-<obs>``, ``X-<obs>``, ``W-<obs>``, ``V-<obs>``: the README's mixed
  recipe, `CodecTosaPartitioner(CodecSpec(policy=P, observer=obs), calibration=...)`;
* ``I-<obs>``: `CodecQuantizer(CodecSpec(policy="I", observer=obs))` in Arm's
  PT2E flow, then `TOSAPartitioner` at TOSA-1.0+INT;
* a ``-sym`` suffix (``W-minmax-sym``) adds ``symmetric_activations=True``
  (``--sym`` adds one for every Y..I flow asked for).

``<obs>`` is ``minmax`` or ``histogram``. Every number but fp32's is computed
by running the artefact: the .pte in the ExecuTorch runtime with codec_tosa's
C++ backend (`run_pte`; the TOSA reference model inside), Arm's `TOSABackend`
delegates relabelled as `CodecTosaBackend` (the same TOSA flatbuffer), so the
CPU part (input quantize, output dequantize, anything not delegated) runs on
ExecuTorch's own kernels. The integer flows (stock-int8, stock-a16w8, I-*) are
also lowered for each Ethos-U target with the same quantizer configuration and
calibration (`EthosUQuantizer` / `CodecQuantizer(target=...)`, then
`EthosUPartitioner`): Vela's cycle estimate is reported, and the program is
run with each Ethos-U delegate replaced by the TOSA Vela was given
(`with_delegates_replaced`); the JSON says whether its logits equal the
TOSA-1.0+INT artefact's bit for bit.

Per row: top-1 on each test set, disagreements with FP32's top-1, logit SQNR
against FP32 pooled over the test set (total signal power over total noise
power) and the per-image SQNR's minimum and 5th percentile (JSON), Vela
cycles, and compile seconds (export, PT2E quantization where the flow has it,
to_edge_transform_and_lower and to_executorch).

The parent runs one child process per model; the child rewrites the JSON after
every flow, so a long run keeps what it finished, and a later run adds or
replaces rows (``--fresh`` starts a new file).

Usage::

    python benchmarks/accuracy.py [--models digits_resnet8 ...] [--flows fp32 stock-int8 W-minmax ...] [--sym]
        [--ethos-u ethos-u55-128 ethos-u85-256 | --ethos-u none] [--limit N]
        [--json benchmarks/results/accuracy.json] [--fresh] [--table]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "accuracy.json"
MODELS = ("digits_resnet8", "digits_ds_cnn", "digits_mobilenet", "digits_vit")
OBSERVERS = ("minmax", "histogram")
FLOWS = ("fp32", "stock-int8", "stock-a16w8", "Z",
         *(f"{p}-{o}" for p in "YXWVI" for o in OBSERVERS))
ETHOS_U = ("ethos-u55-128", "ethos-u85-256")
CALIBRATION_IMAGES, CALIBRATION_SEED = 64, 0
SETS = ("clean", "noisy")


# --------------------------------------------------------------------------- flows


@dataclass(frozen=True)
class Flow:
    name: str
    kind: str  # "fp32", "stock", "mixed", "integer"
    policy: str | None = None
    observer: str | None = None
    symmetric: bool = False
    config: str | None = None  # stock: "int8" or "a16w8"

    @property
    def integer(self) -> bool:
        """Lowered for the Ethos-U targets too."""
        return self.kind in ("stock", "integer")


def parse_flow(name: str) -> Flow:
    if name == "fp32":
        return Flow(name, "fp32")
    if name in ("stock-int8", "stock-a16w8"):
        return Flow(name, "stock", config=name.split("-", 1)[1])
    parts = name.split("-")
    policy = parts[0]
    symmetric = parts[-1] == "sym"
    if symmetric:
        parts = parts[:-1]
    if policy == "Z" and len(parts) == 1:
        return Flow(name, "mixed", "Z", None, symmetric)
    if policy in ("Y", "X", "W", "V", "I") and len(parts) == 2 and parts[1] in OBSERVERS:
        return Flow(name, "integer" if policy == "I" else "mixed", policy, parts[1], symmetric)
    raise argparse.ArgumentTypeError(
        f"unknown flow {name!r}: expected fp32, stock-int8, stock-a16w8, Z, or P-OBS[-sym] with P in "
        f"Y X W V I and OBS in {' '.join(OBSERVERS)}")


@dataclass
class Artefact:
    pte: bytes  # runnable here: every delegate a CodecTosaBackend (TOSA) one
    compile_s: float
    delegates: list[str]  # backend ids as lowered
    cpu_ops: list[str]  # the program's CPU operators
    vela: dict[str, Any] = field(default_factory=dict)
    converted: Any = None  # PT2E flows: the converted module (diagnostics only)


def _export(module: torch.nn.Module, example: tuple) -> Any:
    with torch.no_grad():
        return torch.export.export(module, example)


def _pt2e(module: torch.nn.Module, example: tuple, quantizer: Any, calibration: list[tuple]) -> tuple[Any, Any]:
    """Arm's documented PT2E steps: (converted module, its export)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    with torch.no_grad():
        prepared = prepare_pt2e(torch.export.export(module, example).module(check_guards=False), quantizer)
        for batch in calibration:
            prepared(*batch)
        converted = convert_pt2e(prepared)
        return converted, torch.export.export(converted, example)


def _stock_quantizer(config: str, target: str | None) -> Any:
    from executorch.backends.arm.ethosu import EthosUCompileSpec
    from executorch.backends.arm.quantizer import (
        EthosUQuantizer,
        TOSAQuantizer,
        get_symmetric_a16w8_quantization_config,
        get_symmetric_quantization_config,
    )
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec

    quantizer = EthosUQuantizer(EthosUCompileSpec(target)) if target else TOSAQuantizer(
        TosaCompileSpec(_stock_tosa(config)))
    quantizer.set_global(get_symmetric_a16w8_quantization_config() if config == "a16w8"
                         else get_symmetric_quantization_config())
    return quantizer


def _stock_tosa(config: str) -> str:
    return "TOSA-1.0+INT+int16" if config == "a16w8" else "TOSA-1.0+INT"


def _int_partitioner(tosa_spec: str, target: str | None) -> Any:
    from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner

    return EthosUPartitioner(EthosUCompileSpec(target)) if target else TOSAPartitioner(TosaCompileSpec(tosa_spec))


def build(flow: Flow, module: torch.nn.Module, example: tuple, calibration: list[tuple],
          target: str | None = None) -> Artefact:
    """Lower `flow` (for Ethos-U `target`, or TOSA when None) and make it runnable here."""
    import tempfile

    from executorch.exir import to_edge_transform_and_lower

    from codec_tosa import CodecQuantizer, CodecSpec, CodecTosaPartitioner
    from codec_tosa.arm import adapter as arm_adapter

    t = time.perf_counter()
    converted = None
    if flow.kind == "mixed":
        spec = (CodecSpec(policy="Z") if flow.policy == "Z" else
                CodecSpec(policy=flow.policy, observer=flow.observer, symmetric_activations=flow.symmetric))
        program = _export(module, example)
        partitioner: Any = CodecTosaPartitioner(spec, calibration=calibration)
    else:
        if flow.kind == "stock":
            quantizer = _stock_quantizer(flow.config, target)
            tosa_spec = _stock_tosa(flow.config)
        else:
            quantizer = CodecQuantizer(CodecSpec(policy="I", observer=flow.observer,
                                                 symmetric_activations=flow.symmetric,
                                                 target=target or "tosa"))
            tosa_spec = "TOSA-1.0+INT"
        converted, program = _pt2e(module, example, quantizer, calibration)
        partitioner = _int_partitioner(tosa_spec, target)
    vela: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="accuracy-vela-") as d:
        if target:
            with arm_adapter.vela_runs_kept(d) as runs:
                edge = to_edge_transform_and_lower(program, partitioner=[partitioner])
                pte = bytes(edge.to_executorch().buffer)
            vela = _vela(runs)
        else:
            edge = to_edge_transform_and_lower(program, partitioner=[partitioner])
            pte = bytes(edge.to_executorch().buffer)
    compile_s = time.perf_counter() - t
    from codec_tosa.runtime.pte import inspect_pte

    info = inspect_pte(pte)
    return Artefact(runnable(pte), compile_s, list(info.delegate_ids), sorted(set(info.operators)), vela,
                    converted)


def _vela(runs: list[Any]) -> dict[str, Any]:
    from codec_tosa.targets.ethosu.vela_summary import read_vela_summary, vela_operator_counts, vela_report

    report = vela_report([{"tosa": r.tosa, "summary": read_vela_summary(r.directory),
                           "operators": vela_operator_counts(r.log)} for r in runs])
    return {k: report[k] for k in ("delegates", "cycles_total", "cycles_npu", "sram_bytes", "off_chip_bytes",
                                   "npu_ops", "cpu_ops", "encoded_weight_bytes")}


def runnable(pte: bytes) -> bytes:
    """The program with every delegate a CodecTosaBackend one the runtime here runs:
    Arm's TOSABackend payload is the same TOSA flatbuffer (relabelled); an
    EthosUBackend payload (Vela's command stream) is replaced by the TOSA Vela
    was given, as `codec-tosa validate` does."""
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa.runtime import BACKEND_ID
    from codec_tosa.runtime.pte import delegates, with_delegates_replaced

    replacements: dict[int, tuple[str, bytes]] = {}
    for d in delegates(pte):
        if d.backend_id == BACKEND_ID:
            continue
        if d.backend_id == arm_adapter.TOSA_BACKEND_ID:
            replacements[d.index] = (BACKEND_ID, d.payload)
        elif d.backend_id == arm_adapter.ETHOS_U_BACKEND_ID:
            tosa = arm_adapter.tosa_of_payload(d.payload)
            if tosa is None:
                raise RuntimeError(f"delegate {d.index}: the TOSA Vela was given was not journaled")
            replacements[d.index] = (BACKEND_ID, tosa)
        else:
            raise RuntimeError(f"delegate {d.index}: backend {d.backend_id} cannot run here")
    return with_delegates_replaced(pte, replacements) if replacements else pte


# --------------------------------------------------------------------------- metrics


def run_artefact(pte: bytes, images: torch.Tensor) -> torch.Tensor:
    """Logits (N, 10): the program run in the ExecuTorch runtime, one image per call
    (the programs are exported with the static shape (1, 1, 32, 32))."""
    from codec_tosa.runtime.executorch_runner import run_pte

    return torch.cat([run_pte(pte, [images[i:i + 1].contiguous()])[0].reshape(1, -1).float()
                      for i in range(len(images))])


def eager(module: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([module(images[i:i + 1]).reshape(1, -1).float() for i in range(len(images))])


def sqnr_db(ref: torch.Tensor, got: torch.Tensor) -> float:
    from codec_tosa.validation.validate import sqnr_db as pooled

    return pooled(ref.double().numpy().reshape(-1), got.double().numpy().reshape(-1))


def metrics(logits: torch.Tensor, ref: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    pred, ref_pred = logits.argmax(1), ref.argmax(1)
    per_image = [sqnr_db(ref[i], logits[i]) for i in range(len(ref))]
    finite = [v for v in per_image if math.isfinite(v)]
    return {
        "top1": int((pred == labels).sum()) / len(labels),
        "correct": int((pred == labels).sum()),
        "disagree": int((pred != ref_pred).sum()),
        "sqnr_db": sqnr_db(ref, logits),
        "sqnr_min_db": min(finite) if finite else math.inf,
        "sqnr_p5_db": float(np.percentile(finite, 5)) if finite else math.inf,
        "sqnr_median_db": float(np.median(finite)) if finite else math.inf,
    }


# --------------------------------------------------------------------------- child: one model


def _load_json(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())
    return {"commands": [], "calibration": {"images": CALIBRATION_IMAGES, "seed": CALIBRATION_SEED},
            "models": {}}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=_jsonable))
    os.replace(tmp, path)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    raise TypeError(type(v).__name__)


def _store(path: Path, model: str, flow: str, row: dict[str, Any]) -> None:
    data = _load_json(path)
    data["models"].setdefault(model, {"rows": {}})["rows"][flow] = row
    _write_json(path, data)


def child(model: str, flows: list[Flow], targets: list[str], limit: int | None, path: Path) -> int:
    from codec_tosa.quiet import quiet

    with quiet():
        return _child(model, flows, targets, limit, path)


def _child(model: str, flows: list[Flow], targets: list[str], limit: int | None, path: Path) -> int:
    from codec_tosa.arm import adapter as arm_adapter
    from codec_tosa_examples.models import trained

    arm_adapter.install_payload_journal()  # the TOSA behind each Ethos-U payload, stock flows' included
    data = trained.digits()
    images = {"clean": data.test_x[:limit], "noisy": data.noisy_x[:limit]}
    labels = data.test_y[:limit]
    calibration = trained.calibration_images(CALIBRATION_IMAGES, CALIBRATION_SEED)
    module, example = trained.load(model)
    ref = {s: eager(module, images[s]) for s in SETS}
    failed = 0
    for flow in flows:
        t = time.perf_counter()
        row: dict[str, Any] = {"flow": flow.name, "images": len(labels), "run": os.environ.get("ACCURACY_RUN", "")}
        try:
            if flow.kind == "fp32":
                row.update({s: metrics(ref[s], ref[s], labels) for s in SETS})
            else:
                row.update(_lowered_row(flow, model, images, ref, labels, calibration, targets))
        except Exception as e:  # noqa: BLE001 (one flow's failure is its row, not the run's)
            failed += 1
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            row["traceback"] = traceback.format_exc(limit=-8)
        row["wall_s"] = time.perf_counter() - t
        _store(path, model, flow.name, row)
        print(f"[{model} {flow.name}] " + (row.get("error") or _summary(row)), file=sys.stderr, flush=True)
    return 1 if failed else 0


def _summary(row: dict[str, Any]) -> str:
    parts = [f"{s} top1 {row[s]['top1']:.4f} disagree {row[s]['disagree']} sqnr {row[s]['sqnr_db']:.1f} dB"
             for s in SETS]
    cycles = [f"{t} {v['cycles_total']}" for t, v in row.get("ethos_u", {}).items() if "cycles_total" in v]
    return "; ".join(parts + cycles) + f" ({row['wall_s']:.0f} s)"


def _lowered_row(flow: Flow, model: str, images: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
                 labels: torch.Tensor, calibration: list[tuple], targets: list[str]) -> dict[str, Any]:
    from codec_tosa_examples.models import trained

    module, example = trained.load(model)  # fresh per flow: no flow sees another's changes
    art = build(flow, module, example, calibration)
    row: dict[str, Any] = {"compile_s": art.compile_s, "delegates": art.delegates, "cpu_ops": art.cpu_ops}
    logits = {s: run_artefact(art.pte, images[s]) for s in SETS}
    row.update({s: metrics(logits[s], ref[s], labels) for s in SETS})
    if art.converted is not None:
        # diagnostics: what the PT2E converted module (fake-quantized eager) would have claimed
        row["pt2e_module_sqnr_db"] = {s: sqnr_db(ref[s], eager(art.converted, images[s])) for s in SETS}
    if flow.integer and targets:
        row["ethos_u"] = {}
        for target in targets:
            try:
                module, example = trained.load(model)
                u = build(flow, module, example, calibration, target)
                u_logits = {s: run_artefact(u.pte, images[s]) for s in SETS}
                entry = dict(u.vela)
                entry.update({"compile_s": u.compile_s, "delegates": u.delegates, "cpu_ops": u.cpu_ops,
                              "equal_to_tosa": all(torch.equal(u_logits[s], logits[s]) for s in SETS)})
                entry.update({s: metrics(u_logits[s], ref[s], labels) for s in SETS})
            except Exception as e:  # noqa: BLE001
                entry = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                         "traceback": traceback.format_exc(limit=-8)}
            row["ethos_u"][target] = entry
    return row


# --------------------------------------------------------------------------- tables


def _fmt_db(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.1f}"


def markdown(model: str, rows: dict[str, Any]) -> str:
    head = ["flow", "top-1 clean", "top-1 noisy", "disagree clean", "disagree noisy", "SQNR clean dB",
            "SQNR noisy dB", "U55-128 cycles", "U85-256 cycles", "compile s"]
    lines = [f"### {model}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes: list[str] = []
    known = [f for f in FLOWS if f in rows]
    order = [g for f in known for g in (f, f"{f}-sym") if g in rows]
    order += sorted(f for f in rows if f not in order)
    for name in order:
        r = rows[name]
        if "error" in r:
            lines.append(f"| {name} | " + " | ".join(["-"] * (len(head) - 2)) + f" | error |")
            notes.append(f"{name}: {r['error']}")
            continue
        n = r["images"]
        cells = [name]
        cells += [f"{100 * r[s]['top1']:.2f}" for s in SETS]
        cells += [f"{r[s]['disagree']}/{n}" for s in SETS]
        cells += [_fmt_db(r[s]["sqnr_db"]) for s in SETS]
        for target in ETHOS_U:
            u = r.get("ethos_u", {}).get(target)
            if u is None:
                cells.append("")
            elif "error" in u:
                cells.append("error")
                notes.append(f"{name} {target}: {u['error']}")
            else:
                mark = "" if u.get("equal_to_tosa") else "*"
                cells.append(f"{u['cycles_total']}{mark}")
                if mark:
                    cpu = sorted(set(u["cpu_ops"]) - set(r["cpu_ops"]))
                    notes.append(f"{name} {target}: the Ethos-U artefact's logits differ from the TOSA one's"
                                 + (f" ({', '.join(cpu)} left on the CPU)" if cpu else "") + ": "
                                 + ", ".join(f"{s} top-1 {100 * u[s]['top1']:.2f}, disagree {u[s]['disagree']}, "
                                             f"SQNR {_fmt_db(u[s]['sqnr_db'])} dB" for s in SETS))
        cells.append(f"{r['compile_s']:.1f}" if "compile_s" in r else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + [f"* {n}" for n in notes]
    return "\n".join(lines)


def tables(path: Path, models: Sequence[str] | None = None) -> str:
    data = _load_json(path)
    return "\n\n".join(markdown(m, data["models"][m]["rows"]) for m in (models or data["models"])
                       if m in data["models"])


# --------------------------------------------------------------------------- parent


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--flows", nargs="+", default=list(FLOWS), type=parse_flow)
    p.add_argument("--sym", action="store_true",
                   help="also run every Y..I flow with symmetric_activations=True (the -sym flows)")
    p.add_argument("--ethos-u", nargs="+", default=list(ETHOS_U),
                   help="Ethos-U targets the integer flows are also lowered for ('none': none)")
    p.add_argument("--limit", type=int, help="the first N images of each test set only (quick checks)")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    p.add_argument("--fresh", action="store_true", help="start a new JSON instead of adding to it")
    p.add_argument("--table", action="store_true", help="print the tables of the JSON and exit")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    targets = [] if args.ethos_u == ["none"] else args.ethos_u
    flows = [f if isinstance(f, Flow) else parse_flow(f) for f in args.flows]
    if args.sym:
        flows += [parse_flow(f"{f.name}-sym") for f in flows if f.observer and not f.symmetric
                  and f"{f.name}-sym" not in {g.name for g in flows}]
    if args.child:
        return child(args.child, flows, targets, args.limit, args.json)
    if args.table:
        print(tables(args.json, args.models if "--models" in argv else None))
        return 0

    data = _load_json(Path("/nonexistent") if args.fresh else args.json)
    data["commands"].append(shlex.join(["python", "benchmarks/accuracy.py", *argv]))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    _write_json(args.json, data)
    run_id = f"{os.getpid()}-{time.time():.0f}"
    # one thread: the same FP32 eager reductions on every run (and the machine is shared)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), ACCURACY_RUN=run_id)
    status = 0
    for model in args.models:
        remaining = [f.name for f in flows]
        while remaining:
            cmd = [sys.executable, __file__, "--child", model, "--flows", *remaining, "--json", str(args.json),
                   "--ethos-u", *(targets or ["none"])] + (["--limit", str(args.limit)] if args.limit else [])
            rc = subprocess.run(cmd, env=env).returncode
            if rc in (0, 1):
                status |= rc
                break
            # the child died (a crash in native code): it stores rows in order, so the first
            # flow without a row of this run is the one it died on; that flow gets an error
            # row and a new child goes on with the rest
            status = 1
            rows = _load_json(args.json)["models"].get(model, {}).get("rows", {})
            crashed = next((f for f in remaining if rows.get(f, {}).get("run") != run_id), None)
            if crashed is None:
                break
            _store(args.json, model, crashed, {"flow": crashed, "run": run_id,
                                               "error": f"the child process died (status {rc})"})
            remaining = remaining[remaining.index(crashed) + 1:]
    print(tables(args.json, args.models))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
