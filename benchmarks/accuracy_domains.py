"""Where an INT8 flow loses accuracy, per quantized tensor (issue 23, the diagnosis behind docs/results/accuracy.md).

`benchmarks/accuracy.py` measures each flow's artefact end to end; this script
looks inside, on the same trained models, calibration (64 training images,
seed 0) and test images. For every activation tensor a flow quantizes it
reports the range the flow's calibration picked, ``[(qmin - z) s, (qmax - z) s]``,
and the *local* SQNR of that tensor: the FP32 tensor (from the FP32 graph, so
no upstream error) against its own quantize-dequantize at the flow's
parameters, pooled over the test images. It isolates the range choice (observer,
domain sharing, zero point) from error propagation; the artefacts' logit SQNR
is accuracy.py's.

* PT2E flows (``stock-int8``, ``I-<obs>[-sym]``): the prepared module after
  calibration, one row per observer call on an activation (weights skipped);
  a `DomainObserver` with a clamp bound (a fused relu / relu6) sees the
  clamped tensor, as the domain carries it;
* mixed flows (``W-<obs>[-sym]``, any of Y X W V): the partitioner's plan, one
  row per domain, observed at its dominator(s) in the planned edge program.

Tensors are matched across flows by value (same shape, equal to 1e-3 relative
on the first test image), so stock's ``conv2d_3`` and our domain observed at
``aten_convolution_default_3`` are one row. Also reported: the logit SQNR of
the FP32 model on inputs clipped to each flow's input range alone (what the
input quantizer's clipping costs on the noisy set), and where the flows'
input ranges lie.

Usage::

    python benchmarks/accuracy_domains.py [--models digits_ds_cnn ...]
        [--flows stock-int8 I-histogram I-minmax W-minmax W-histogram] [--limit N]
        [--json benchmarks/results/accuracy_domains.json]
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from accuracy import CALIBRATION_IMAGES, CALIBRATION_SEED, MODELS, SETS, Flow, parse_flow  # noqa: E402

DEFAULT_FLOWS = ("stock-int8", "I-histogram", "I-minmax", "W-minmax", "W-histogram")
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "accuracy_domains.json"


@dataclass
class Tensor:
    """One quantized activation tensor of one flow."""

    name: str  # the FX node whose value is quantized (the flow's own graph)
    scale: float
    zero_point: int
    qmin: int
    qmax: int
    clip: tuple[float, float] | None = None
    shape: tuple[int, ...] = ()
    probe: torch.Tensor | None = field(default=None, repr=False)  # its value on the first test image
    signal: dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in SETS})
    noise: dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in SETS})
    clipped: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SETS})
    elements: dict[str, int] = field(default_factory=lambda: {s: 0 for s in SETS})

    @property
    def lo(self) -> float:
        return (self.qmin - self.zero_point) * self.scale

    @property
    def hi(self) -> float:
        return (self.qmax - self.zero_point) * self.scale

    def observe(self, x: torch.Tensor, which: str, first: bool) -> None:
        x = x.detach().double()
        if self.clip is not None:
            x = x.clamp(*self.clip)
        if first:
            self.probe, self.shape = x.float().clone(), tuple(x.shape)
        q = torch.clamp(torch.round(x / self.scale) + self.zero_point, self.qmin, self.qmax)
        self.signal[which] += float((x * x).sum())
        self.noise[which] += float(((x - (q - self.zero_point) * self.scale) ** 2).sum())
        self.clipped[which] += int(((x < self.lo - self.scale / 2) | (x > self.hi + self.scale / 2)).sum())
        self.elements[which] += x.numel()

    def sqnr_db(self, which: str) -> float:
        n = self.noise[which]
        return math.inf if n == 0 else 10 * math.log10(max(self.signal[which], 1e-30) / n)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "scale": self.scale, "zero_point": self.zero_point,
                "range": [self.lo, self.hi], "clip": list(self.clip) if self.clip else None,
                **{f"sqnr_{s}_db": self.sqnr_db(s) for s in SETS},
                **{f"clipped_{s}": self.clipped[s] / max(self.elements[s], 1) for s in SETS}}


class _Capture(torch.fx.Interpreter):
    """Runs a graph; `on_value(node, value)` sees every node's output. Observer
    modules (`skip`) pass their input through without being updated."""

    def __init__(self, gm: torch.fx.GraphModule, skip: set[str], on_value: Any) -> None:
        super().__init__(gm)
        self.skip, self.on_value = skip, on_value

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op == "call_module" and n.target in self.skip:
            out = self.env[n.args[0]]
        else:
            out = super().run_node(n)
        self.on_value(n, out)
        return out


def _pt2e_tensors(flow: Flow, module: torch.nn.Module, example: tuple, calibration: list[tuple],
                  images: dict[str, torch.Tensor]) -> list[Tensor]:
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

    from accuracy import _stock_quantizer
    from codec_tosa import CodecQuantizer, CodecSpec
    from codec_tosa.quantizer.observers import DomainObserver, WeightObserver

    quantizer = (_stock_quantizer(flow.config, None) if flow.kind == "stock" else
                 CodecQuantizer(CodecSpec(policy="I", observer=flow.observer,
                                          symmetric_activations=flow.symmetric)))
    with torch.no_grad():
        prepared = prepare_pt2e(torch.export.export(module, example).module(check_guards=False), quantizer)
        for batch in calibration:
            prepared(*batch)
    modules = dict(prepared.named_modules(remove_duplicate=False))  # shared observers under each name
    observers = {n.target for n in prepared.graph.nodes
                 if n.op == "call_module" and "activation_post_process" in str(n.target)}
    by_node: dict[str, Tensor] = {}
    for n in prepared.graph.nodes:
        if n.op != "call_module" or n.target not in observers:
            continue
        obs = modules[n.target]
        src = n.args[0]
        if isinstance(obs, WeightObserver) or getattr(src, "op", "") == "get_attr" \
                or "PerChannel" in type(obs).__name__:
            continue  # a weight (biases have no observer of their own)
        scale, zp = obs.calculate_qparams()
        by_node[n.name] = Tensor(src.name, float(scale.reshape(-1)[0]), int(zp.reshape(-1)[0]),
                                 int(obs.quant_min), int(obs.quant_max),
                                 obs.clip if isinstance(obs, DomainObserver) else None)
    _run(prepared, observers, by_node, images)
    return _distinct(by_node.values())


def _mixed_tensors(flow: Flow, module: torch.nn.Module, example: tuple, calibration: list[tuple],
                   images: dict[str, torch.Tensor]) -> list[Tensor]:
    from executorch.exir import to_edge_transform_and_lower

    from codec_tosa import CodecSpec, CodecTosaPartitioner
    from codec_tosa.planning.calibration import lifted_args

    spec = CodecSpec(policy=flow.policy, observer=flow.observer, symmetric_activations=flow.symmetric)
    partitioner = CodecTosaPartitioner(spec, calibration=calibration)
    with torch.no_grad():
        to_edge_transform_and_lower(torch.export.export(module, example), partitioner=[partitioner])
    planned = partitioner.planned
    ep = planned.program
    by_node: dict[str, Tensor] = {}
    watch: dict[str, list[Tensor]] = {}
    for d in planned.placement.plan.domains:
        theta = planned.thetas[d.id]
        for x in d.observed:
            node = planned.graph.fx_value_node[x]
            t = Tensor(node.name, float(theta.scale), int(theta.zero_point), int(theta.qmin), int(theta.qmax))
            by_node[f"{d.id}:{node.name}"] = t
            watch.setdefault(node.name, []).append(t)
    for which, xs in images.items():
        for i in range(len(xs)):
            def on_value(n: torch.fx.Node, v: Any, first: bool = i == 0, which: str = which) -> None:
                for t in watch.get(n.name, ()):
                    if isinstance(v, torch.Tensor):
                        t.observe(v, which, first and which == SETS[0])
            with torch.no_grad():
                _Capture(ep.graph_module, set(), on_value).run(*lifted_args(ep, [xs[i:i + 1]]))
    return _distinct(by_node.values())


def _run(gm: torch.fx.GraphModule, observers: set[str], by_node: dict[str, Tensor],
         images: dict[str, torch.Tensor]) -> None:
    for which, xs in images.items():
        for i in range(len(xs)):
            def on_value(n: torch.fx.Node, v: Any, first: bool = i == 0, which: str = which) -> None:
                t = by_node.get(n.name)
                if t is not None:
                    t.observe(v, which, first and which == SETS[0])
            with torch.no_grad():
                _Capture(gm, observers, on_value).run(xs[i:i + 1])


def _distinct(tensors: Any) -> list[Tensor]:
    """One row per distinct (tensor, parameters): PT2E observes a value once per reader edge."""
    out: list[Tensor] = []
    for t in tensors:
        if t.probe is None:
            continue
        if any(u.shape == t.shape and u.scale == t.scale and u.zero_point == t.zero_point
               and torch.equal(u.probe, t.probe) for u in out):
            continue
        out.append(t)
    return out


def _same(a: Tensor, b: Tensor) -> bool:
    if a.shape != b.shape:
        return False
    scale = float(a.probe.abs().max()) or 1.0
    return bool(((a.probe - b.probe).abs() <= 1e-3 * scale).all())


def input_clipping(module: torch.nn.Module, images: dict[str, torch.Tensor], lo: float, hi: float
                   ) -> dict[str, float]:
    """Logit SQNR of FP32 on inputs clipped to [lo, hi] against FP32 on the inputs as they are."""
    from accuracy import eager, sqnr_db

    return {s: sqnr_db(eager(module, x), eager(module, x.clamp(lo, hi))) for s, x in images.items()}


def analyse(model: str, flows: list[Flow], limit: int | None) -> dict[str, Any]:
    from codec_tosa_examples.models import trained

    data = trained.digits()
    images = {"clean": data.test_x[:limit], "noisy": data.noisy_x[:limit]}
    calibration = trained.calibration_images(CALIBRATION_IMAGES, CALIBRATION_SEED)
    per_flow: dict[str, list[Tensor]] = {}
    for flow in flows:
        module, example = trained.load(model)
        build = _mixed_tensors if flow.kind == "mixed" else _pt2e_tensors
        per_flow[flow.name] = build(flow, module, example, calibration, images)
        print(f"[{model} {flow.name}] {len(per_flow[flow.name])} quantized tensors", file=sys.stderr, flush=True)
    module, _ = trained.load(model)
    # rows: the first flow's tensors in its graph order, then anything the others add
    base = flows[0].name
    rows: list[dict[str, Tensor]] = [{base: t} for t in per_flow[base]]
    for flow in flows[1:]:
        for t in per_flow[flow.name]:
            row = next((r for r in rows if flow.name not in r and _same(next(iter(r.values())), t)), None)
            if row is None:
                rows.append({flow.name: t})
            else:
                row[flow.name] = t
    # the input's tensor: the one equal to the image itself
    inputs = {}
    for flow in flows:
        x0 = images["clean"][:1]
        t = next((t for t in per_flow[flow.name] if t.shape == tuple(x0.shape)
                  and torch.allclose(t.probe, x0, atol=1e-6)), None)
        if t is not None:
            inputs[flow.name] = {"range": [t.lo, t.hi], "scale": t.scale, "zero_point": t.zero_point,
                                 "fp32_logit_sqnr_db_input_clipped_only": input_clipping(
                                     module, images, t.lo, t.hi)}
    return {"flows": [f.name for f in flows], "images": len(images["clean"]), "inputs": inputs,
            "rows": [{f: t.to_json() for f, t in r.items()} for r in rows]}


def markdown(model: str, result: dict[str, Any]) -> str:
    flows = result["flows"]
    head = ["tensor (" + flows[0] + ")", "shape"] + [f"{f} {c}" for f in flows for c in ("range", "dB clean")]
    lines = [f"### {model}: local SQNR per quantized tensor ({result['images']} test images)", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in result["rows"]:
        first = next(iter(row.values()))
        cells = [(row.get(flows[0]) or first)["name"] + ("" if flows[0] in row else " (" + next(iter(row)) + ")"),
                 "x".join(str(d) for d in first["shape"][1:])]
        for f in flows:
            t = row.get(f)
            cells += ([f"[{t['range'][0]:.3g}, {t['range'][1]:.3g}]", f"{t['sqnr_clean_db']:.1f}"]
                      if t else ["-", "-"])
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for f, v in result["inputs"].items():
        clip = v["fp32_logit_sqnr_db_input_clipped_only"]
        lines.append(f"* {f}: input range [{v['range'][0]:.3f}, {v['range'][1]:.3f}]; FP32 with only the input "
                     f"clipped to it: logit SQNR {clip['clean']:.1f} dB clean, {clip['noisy']:.1f} dB noisy")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--flows", nargs="+", default=list(DEFAULT_FLOWS), type=parse_flow)
    p.add_argument("--limit", type=int, help="the first N images of each test set only")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = p.parse_args(argv)
    flows = [f if isinstance(f, Flow) else parse_flow(f) for f in args.flows]
    bad = [f.name for f in flows if f.kind == "fp32" or f.config == "a16w8" or f.policy == "Z"]
    if bad:
        p.error(f"flows without INT8 activations to inspect: {', '.join(bad)}")
    from codec_tosa.quiet import quiet

    out: dict[str, Any] = {"command": shlex.join(["python", "benchmarks/accuracy_domains.py", *argv]),
                           "models": {}}
    with quiet():
        for model in args.models:
            out["models"][model] = analyse(model, flows, args.limit)
            args.json.write_text(json.dumps(out, indent=1))
            print(markdown(model, out["models"][model]) + "\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
