"""The two stock Arm TOSA flows, run on one peer case, as a JSON-able record.

* ``fp``:  ``to_edge_transform_and_lower(export(m, x), [TOSAPartitioner(TOSA-1.0+FP)])``
* ``int``: Arm's documented PT2E flow: ``TOSAQuantizer(TOSA-1.0+INT)`` with the global
  symmetric config, ``prepare_pt2e`` on the exported module, calibration on the case's
  example inputs, ``convert_pt2e``, export again, lower with
  ``TOSAPartitioner(TOSA-1.0+INT)``.

Both flows then run ``.to_executorch()`` (a lowered program that cannot become a .pte
is not usable); the partition verdict is read from the edge program either way, so a
failing ``to_executorch`` still says what was delegated.

``run_case`` runs each flow in its own forked child with a timeout, so a crash, hang
or runaway allocation in one case becomes a record instead of killing the run.
"""

from __future__ import annotations

import time
from typing import Any, TypedDict

import torch

from cases import PeerCase
from isolation import isolated, one_line

FLOWS = ("fp", "int")
DEFAULT_TIMEOUT_S = 120.0

# Data-movement ops that are harmless on the CPU when they only shape a delegate's
# result for the graph output (e.g. a final ``view``); any other CPU op is compute.
_GLUE_OPS = {
    "alias_copy", "clone", "contiguous", "detach_copy", "expand_copy", "lift_fresh_copy",
    "permute_copy", "select_copy", "slice_copy", "split_copy", "split_with_sizes_copy",
    "squeeze_copy", "t_copy", "transpose_copy", "unbind_copy", "unsqueeze_copy",
    "view_copy", "_unsafe_view", "reshape", "view",
}


class FlowRecord(TypedDict, total=False):
    ok: bool  # every stage passed (through .to_executorch())
    stage: str  # the last stage reached: export, quantize, lower, to_executorch, done
    error: str | None  # "ExceptionType: first line", or timeout / crash
    delegates: int  # executorch_call_delegate nodes in the edge program
    cpu_ops: list[str]  # non-delegated call_function ops (no getitem, no q/dq), sorted, with repeats
    cpu_compute_ops: list[str]  # cpu_ops minus output-only glue
    delegated: bool  # >= 1 delegate and no compute op left on the CPU
    seconds: float


class CaseRecord(TypedDict):
    operator: str
    fp: FlowRecord
    int: FlowRecord
    seconds: float


# --------------------------------------------------------------------------- graph reading


def op_name(target: Any) -> str:
    """``aten.add.Tensor`` style name for an op target."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # "aten.add.Tensor"
    # EdgeOpOverload: "aten.add.Tensor"; higher-order ops: "cond"; builtins: "getitem"
    return getattr(target, "__name__", None) or str(target)


def _base(name: str) -> str:
    # "aten.view_copy.default" -> "view_copy"
    parts = name.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


def _is_qdq(name: str) -> bool:
    return "quantize" in name  # quantize_per_tensor, dequantize_per_channel, ...


def _skipped(name: str) -> bool:
    return name in ("executorch_call_delegate", "getitem") or _is_qdq(name)


def partition_summary(edge_program: Any) -> dict[str, Any]:
    """Delegates and CPU ops of a lowered edge program, including control-flow
    submodules (their bodies are GraphModules; delegate payloads are not)."""
    gm = edge_program.graph_module
    delegates = 0
    cpu_ops: list[str] = []
    compute: list[str] = []
    for sub in gm.modules():
        if not isinstance(sub, torch.fx.GraphModule):
            continue
        glue = _output_glue(sub.graph)
        for node in sub.graph.nodes:
            if node.op != "call_function":
                continue
            name = op_name(node.target)
            if name == "executorch_call_delegate":
                delegates += 1
            if _skipped(name):
                continue
            cpu_ops.append(name)
            if node not in glue:
                compute.append(name)
    return {
        "delegates": delegates,
        "cpu_ops": sorted(cpu_ops),
        "cpu_compute_ops": sorted(compute),
        "delegated": delegates > 0 and not compute,
    }


def _output_glue(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Glue nodes (data movement, getitem, q/dq) whose every user is the output or
    other such glue: walking back from the output keeps the set closed."""
    glue: set[torch.fx.Node] = set()
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function":
            continue
        name = op_name(node.target)
        movable = _base(name) in _GLUE_OPS or name == "getitem" or _is_qdq(name)
        if movable and node.users and all(u.op == "output" or u in glue for u in node.users):
            glue.add(node)
    return glue


# --------------------------------------------------------------------------- the flows


def _lower(exported: Any, spec: str) -> Any:
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir import to_edge_transform_and_lower

    return to_edge_transform_and_lower(exported, partitioner=[TOSAPartitioner(TosaCompileSpec(spec))])


def run_flow(case: PeerCase, flow: str) -> FlowRecord:
    """One stock flow on one case, in this process."""
    rec: FlowRecord = {"ok": False, "stage": "build", "error": None}
    t0 = time.perf_counter()
    try:
        m, x = case.build()
        if flow == "fp":
            rec["stage"] = "export"
            exported = torch.export.export(m, x)
            rec["stage"] = "lower"
            edge = _lower(exported, "TOSA-1.0+FP")
        elif flow == "int":
            from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
            from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

            rec["stage"] = "export"
            graph = torch.export.export(m, x).module(check_guards=False)
            rec["stage"] = "quantize"
            quantizer = TOSAQuantizer(TosaCompileSpec("TOSA-1.0+INT"))
            quantizer.set_global(get_symmetric_quantization_config())
            prepared = prepare_pt2e(graph, quantizer)
            prepared(*x)  # calibrate on the example inputs
            converted = convert_pt2e(prepared)
            rec["stage"] = "export_quantized"
            exported = torch.export.export(converted, x)
            rec["stage"] = "lower"
            edge = _lower(exported, "TOSA-1.0+INT")
        else:
            raise ValueError(f"unknown flow {flow!r}")
        rec.update(partition_summary(edge.exported_program()))  # type: ignore[typeddict-item]
        rec["stage"] = "to_executorch"
        edge.to_executorch()
        rec["stage"] = "done"
        rec["ok"] = True
    except Exception as e:  # noqa: BLE001 - a failing flow is the data we collect
        rec["error"] = one_line(e)
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


# --------------------------------------------------------------------------- isolation


def preload() -> None:
    """Import the lowering stack once in the parent so forked children share it
    instead of each paying the import."""
    import executorch.backends.arm.quantizer  # noqa: F401
    import executorch.backends.arm.tosa.partitioner  # noqa: F401
    import executorch.exir  # noqa: F401
    import torchao.quantization.pt2e.quantize_pt2e  # noqa: F401


def _failed(kind: str, line: str) -> dict[str, Any]:
    return {"ok": False, "stage": "child", "error": line}


def run_flow_isolated(case: PeerCase, flow: str, timeout: float = DEFAULT_TIMEOUT_S) -> FlowRecord:
    """``run_flow`` in a forked child; a timeout or a dead child becomes the error."""
    return isolated(run_flow, (case, flow), timeout, _failed)  # type: ignore[return-value]


def run_case(case: PeerCase, timeout: float = DEFAULT_TIMEOUT_S, flows: tuple[str, ...] = FLOWS) -> CaseRecord:
    """Both stock flows on one case, each in its own forked child (an FP hang does
    not cost the INT verdict)."""
    t0 = time.perf_counter()
    out: dict[str, Any] = {"operator": case.operator}
    for flow in flows:
        out[flow] = run_flow_isolated(case, flow, timeout)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out  # type: ignore[return-value]


if __name__ == "__main__":
    import argparse
    import json

    from cases import collect_cases

    ap = argparse.ArgumentParser(description="Run the stock Arm flows on matching peer cases.")
    ap.add_argument("pattern", help="substring of case ids")
    ap.add_argument("--in-process", action="store_true", help="no fork (for debugging)")
    args = ap.parse_args()
    preload()
    for c in collect_cases(include_skipped=False):
        if args.pattern in c.id:
            r: Any = {f: run_flow(c, f) for f in FLOWS} if args.in_process else run_case(c)
            print(c.id, json.dumps(r, indent=1))
