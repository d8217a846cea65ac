"""Stock Arm, for comparison: what Arm's own flow makes of a model.

Tests and benchmarks put codec_tosa beside these; nothing in the compile path
uses them. They call only Arm's public API, except that `stock_partitions`
observes Arm's TOSA backend (`arm_private.preprocess_observed`) to keep the
program each delegate received.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable

from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from torch.export import ExportedProgram

from codec_tosa import arm_private
from codec_tosa.arm_adapter import stock_partitioner


@dataclass(frozen=True)
class StockPartition:
    """One delegate as stock Arm lowers it."""

    program: ExportedProgram  # copy of what TOSABackend received (lower a further copy)
    tosa_bytes: bytes  # stock TOSABackend output
    seconds: float  # stock TOSABackend._preprocess wall time


def stock_partitions(
    exported_program: ExportedProgram, compile_spec: TosaCompileSpec
) -> list[StockPartition]:
    """Lower with Arm's partitioner and backend; return each delegate's input and output.

    Gives exactly the programs a backend sees, without the codec_tosa backend.
    `lower_into` mutates its program, so lower a `copy.deepcopy` of `.program`.
    """
    from executorch.exir import to_edge_transform_and_lower

    captured: list[StockPartition] = []

    def keep(edge_program: ExportedProgram, spec: TosaCompileSpec, run: Callable[[], Any]) -> Any:
        program = copy.deepcopy(edge_program)
        started = time.perf_counter()
        result = run()
        captured.append(StockPartition(program, bytes(result.processed_bytes), time.perf_counter() - started))
        return result

    with arm_private.preprocess_observed(keep):
        to_edge_transform_and_lower(exported_program, partitioner=[stock_partitioner(compile_spec)])
    return captured


def stock_int8_program(
    model: Any, example_inputs: tuple[Any, ...], compile_spec: TosaCompileSpec
) -> ExportedProgram:
    """Arm's stock PT2E INT8 flow: symmetric config everywhere, calibrated on the example."""
    import torch
    from executorch.backends.arm.quantizer import (
        TOSAQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = TOSAQuantizer(compile_spec)
    quantizer.set_global(get_symmetric_quantization_config())
    # check_guards=False: Arm's annotation passes fail on the `_guards_fn` node.
    graph = torch.export.export(model, example_inputs).module(check_guards=False)
    prepared = prepare_pt2e(graph, quantizer)
    prepared(*example_inputs)
    return torch.export.export(convert_pt2e(prepared), example_inputs)


def vgf_compile_spec(tosa_spec: str) -> Any:
    """Arm's VGF compile spec for `tosa_spec`."""
    from executorch.backends.arm.vgf import VgfCompileSpec

    return VgfCompileSpec(tosa_spec)


def vgf_partitioner(compile_spec: Any, **kwargs: Any) -> Any:
    """Arm's stock VGF partitioner (delegates to VgfBackend: Arm's TOSA, then model-converter)."""
    from executorch.backends.arm.vgf import VgfPartitioner

    return VgfPartitioner(compile_spec, **kwargs)
