"""CodecTosaBackend: materialise the codec plan, lower with Arm's TOSA pipeline, pool constants."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, final

from executorch.exir._serialize._named_data_store import NamedDataStore
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from codec_tosa import progress
from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.graph import user_input_nodes
from codec_tosa._passes.materialize_codecs import MaterializeCodecsPass
from codec_tosa.placement.meta import has_plan
from codec_tosa.planning.provenance import read_options
from codec_tosa.serialization import external
from codec_tosa.serialization.pooled import MarkingTosaSerializer, PooledTosaSerializer, PoolingStats
from codec_tosa.serialization.pooling_record import pooling_record
from codec_tosa.serialization.tosa_stats import entry_io_tensors
from codec_tosa.runtime import BACKEND_ID


@dataclass
class TosaLowering:
    """One partition lowered to TOSA: the payload, what pooling saved (None when
    pooling is off) and, with external weights, the (key, bytes) of the constants
    the payload leaves to named data (`serialization.external`)."""

    payload: bytes
    pooling: PoolingStats | None = None
    weights: list[tuple[str, bytes]] = field(default_factory=list)


def lower_to_tosa(edge_program: ExportedProgram, arm_spec: Any, pool_constants: bool,
                  external_weights: bool = False) -> TosaLowering:
    """Our TOSA lowering of one partition: materialise its plan, run Arm's pipeline
    with our codec lowering inside, serialise (pooling helper constants), and with
    `external_weights` move the graph-owned constants out of the payload.

    Shared by `CodecTosaBackend` and the VGF target (docs/DESIGN.md, "The flow").
    """
    progress.delegate_lowering()
    planned = has_plan(edge_program.graph_module)
    if planned:
        MaterializeCodecsPass(edge_program)(edge_program.graph_module)
    serializer = arm_adapter.new_serializer(
        arm_spec, PooledTosaSerializer if pool_constants else MarkingTosaSerializer)
    inputs = [n.name for n in user_input_nodes(edge_program)]
    payload = arm_adapter.lower_into(edge_program, arm_spec, serializer, lower_codecs=planned)
    _require_every_input_read(inputs, payload)
    pooling = serializer.stats if isinstance(serializer, PooledTosaSerializer) else None
    if not external_weights:
        return TosaLowering(payload, pooling)
    payload, weights = external.externalize(payload, serializer, serializer.owned)
    return TosaLowering(payload, pooling, weights)


class UnreadDelegateInput(ValueError):
    """Arm's pipeline left a delegate input unread and dropped it from the TOSA graph."""


def _require_every_input_read(inputs: list[str], payload: bytes) -> None:
    """The delegate call passes every input of the partition; Arm's serializer skips
    placeholders its passes left without users (a value only a constant-folded
    operator read), so the TOSA graph would take fewer inputs than the call passes
    and the runtime would refuse the program. Say so at compile time, naming them."""
    tosa_inputs, _ = entry_io_tensors(payload)
    if len(tosa_inputs) == len(inputs):
        return
    read = {t.name for t in tosa_inputs}
    unread = [name for name in inputs if name not in read]
    raise UnreadDelegateInput(
        f"delegate input {', '.join(unread) or '?'}: Arm's TOSA lowering folded every operator "
        "that reads it to a constant (one that reads only its shape) and dropped it from the "
        "TOSA graph, so the program would not run")


@final
class CodecTosaBackend(BackendDetails):
    """A direct BackendDetails subclass (Arm's TOSABackend cannot be subclassed).

    The payload is a plain TOSA flatbuffer; the runtime side is the C++
    library built by `codec_tosa.runtime.native`.
    """

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        arm_spec = arm_adapter.compile_spec_from_list(compile_specs)
        options = read_options(compile_specs)
        lowered = lower_to_tosa(edge_program, arm_spec, bool(options.get("pool_constants", True)),
                                bool(options.get("external_weights", False)))
        # what pooling saved travels in the .pte as named data (`codec-tosa report`),
        # keyed by the payload the .pte holds
        record = None if lowered.pooling is None else pooling_record(lowered.pooling, lowered.payload)
        if not lowered.weights:
            return PreprocessResult(processed_bytes=lowered.payload, data_store_output=record)
        store = NamedDataStore()
        if record is not None:
            store.merge_named_data_store(record)
        for key, data in lowered.weights:  # to the .ptd (serialization/external)
            store.add_named_data(key, data, alignment=external.ALIGNMENT, external_tag=external.TAG)
        return PreprocessResult(processed_bytes=lowered.payload, data_store_output=store.get_named_data_store_output())

assert CodecTosaBackend.__name__ == BACKEND_ID

__all__ = ["BACKEND_ID", "CodecTosaBackend", "TosaLowering", "lower_to_tosa"]
