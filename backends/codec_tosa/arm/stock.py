"""Stock Arm, for comparison: what Arm's own flow makes of a model.

Tests and benchmarks put codec_tosa beside these; nothing in the compile path
uses them. They use only Arm's and ExecuTorch's public API.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import torch
from executorch.backends.arm.quantizer import (
    TOSAQuantizer,
    get_symmetric_quantization_config,
)
from executorch.backends.arm.tosa.backend import TOSABackend
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from executorch.backends.arm.vgf import VgfCompileSpec
from executorch.backends.arm.vgf import VgfPartitioner
from executorch.exir import to_edge_transform_and_lower
from executorch.exir.lowered_backend_module import LoweredBackendModule
from torch.export import ExportedProgram
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from codec_tosa.arm.adapter import stock_partitioner


@dataclass(frozen=True)
class StockPartition:
    """One delegate as stock Arm lowers it."""

    program: ExportedProgram  # what TOSABackend received (lower a copy: lowering mutates it)
    tosa_bytes: bytes  # stock TOSABackend output
    compile_specs: tuple[Any, ...]

    def seconds(self) -> float:
        """Wall time of stock `TOSABackend.preprocess` on (a copy of) this partition,
        run again; the bytes must come out the same."""
        program = copy.deepcopy(self.program)
        started = time.perf_counter()
        again = TOSABackend.preprocess(program, list(self.compile_specs)).processed_bytes
        seconds = time.perf_counter() - started
        assert bytes(again) == self.tosa_bytes, "stock TOSABackend is not deterministic here"
        return seconds


def lowered_modules(edge: Any) -> list[Any]:
    """The LoweredBackendModules (delegates) of a lowered edge program, in graph order."""
    gm = edge.exported_program().graph_module
    return [m for _, m in gm.named_children() if isinstance(m, LoweredBackendModule)]


def stock_partitions(
    exported_program: ExportedProgram, compile_spec: TosaCompileSpec
) -> list[StockPartition]:
    """Lower with Arm's partitioner and backend; return each delegate's input and output.

    Read from ExecuTorch's lowered modules (`original_module`, the program the
    backend was handed a copy of, and `processed_bytes`), so only public API is
    used. `lower_into` mutates its program, so lower a `copy.deepcopy` of `.program`.
    """
    edge = to_edge_transform_and_lower(exported_program, partitioner=[stock_partitioner(compile_spec)])
    return [StockPartition(m.original_module, bytes(m.processed_bytes), tuple(m.compile_specs))
            for m in lowered_modules(edge)]


def stock_int8_program(
    model: Any, example_inputs: tuple[Any, ...], compile_spec: TosaCompileSpec
) -> ExportedProgram:
    """Arm's stock PT2E INT8 flow: symmetric config everywhere, calibrated on the example."""
    quantizer = TOSAQuantizer(compile_spec)
    quantizer.set_global(get_symmetric_quantization_config())
    # check_guards=False: Arm's annotation passes fail on the `_guards_fn` node.
    graph = torch.export.export(model, example_inputs).module(check_guards=False)
    prepared = prepare_pt2e(graph, quantizer)
    prepared(*example_inputs)
    return torch.export.export(convert_pt2e(prepared), example_inputs)


def vgf_compile_spec(tosa_spec: str) -> Any:
    """Arm's VGF compile spec for `tosa_spec`."""
    return VgfCompileSpec(tosa_spec)


def vgf_partitioner(compile_spec: Any, **kwargs: Any) -> Any:
    """Arm's stock VGF partitioner (delegates to VgfBackend: Arm's TOSA, then model-converter)."""
    return VgfPartitioner(compile_spec, **kwargs)
