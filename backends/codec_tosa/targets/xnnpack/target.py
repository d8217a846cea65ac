"""XNNPACK: ExecuTorch's XnnpackBackend on the CPU, lowering a CodecQuantizer
program with XNNPACK's own partitioner. XNNPACK requantizes in its own fixed
point, so the plan's simulation is not its oracle: its outputs are held to eager.

External weights are ExecuTorch's external constants: XNNPACK stores every
constant as named data (key: sha256 of its bytes) and sends the ones whose node
carries ``meta["custom"]["delegate_constant_tag"]`` to that tag's .ptd. ExecuTorch's
own tagging pass (`delegate_external_constants_pass_unlifted`) misses PT2E-quantized
weights in executorch 1.5.1, so `tag_external_weights` tags the lifted constant
placeholders of the quantized program instead. XNNPACK in 1.5.1 crashes the
process on such a program loaded without its .ptd: validate checks the pair first
(`targets.named_data`)."""

from __future__ import annotations

from typing import Any

import flatbuffers
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from codec_tosa.serialization import external
from codec_tosa.targets.base import Int8Flow, Target
from codec_tosa.targets.xnnpack.int8_flow import XnnpackInt8Flow

XNNPACK_BACKEND_ID = "XnnpackBackend"  # the delegates XnnpackPartitioner makes


class XnnpackTarget(Target):
    name = "xnnpack"
    backend_id = XNNPACK_BACKEND_ID
    simulated = False
    payload_is_tosa = False
    partitioner_name = "XnnpackPartitioner"
    run_note = (f"the {XNNPACK_BACKEND_ID} delegates ran in ExecuTorch's runtime; XNNPACK requantizes in its "
                "own fixed point, so the plan's simulation is not their oracle: outputs are held to FP32 "
                "eager by SQNR only")

    def int8_flow(self, spec: Any) -> Int8Flow:
        return XnnpackInt8Flow()

    def integer_partitioner(self, spec: Any) -> Any:
        return XnnpackPartitioner()

    def tag_external_weights(self, program: ExportedProgram) -> int:
        """Tags every lifted constant (parameter, buffer, constant tensor) of `program`
        for the external tag codec_tosa uses (model.ptd); returns how many."""
        kinds = {InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR}
        names = {s.arg.name for s in program.graph_signature.input_specs if s.kind in kinds}
        tagged = 0
        for node in program.graph.nodes:
            if node.op == "placeholder" and node.name in names:
                node.meta.setdefault("custom", {})["delegate_constant_tag"] = external.TAG
                tagged += 1
        return tagged

    def named_data_keys(self, payload: bytes) -> dict[str, int | None]:
        """The named data an XNNPACK payload reads at init: every constant's key and size
        (in the .pte, or with external constants in the .ptd)."""
        return _constant_keys(payload)


# XNNGraph.constant_data is the schema's ninth field (schema.fbs); ConstantDataOffset's
# fields are offset, size, named_key (vtable slots 4, 6, 8)
_CONSTANT_DATA_SLOT = 4 + 2 * 8


def _constant_keys(payload: bytes) -> dict[str, int | None]:
    """key -> bytes of each named constant of an XNNPACK payload (`schema.fbs`), {} for
    one that does not parse."""
    try:
        header = XNNHeader.from_bytes(payload[:XNNHeader.EXPECTED_LENGTH])
        start, size = header.flatbuffer_offset, header.flatbuffer_size
    except (ValueError, AttributeError):
        return {}
    buf = bytearray(payload[start:start + size])
    if len(buf) < 8 or len(buf) != size:
        return {}
    root = flatbuffers.table.Table(buf, flatbuffers.encode.Get(flatbuffers.packer.uoffset, buf, 0))
    field = root.Offset(_CONSTANT_DATA_SLOT)
    if not field:
        return {}
    vector, count = root.Vector(field), root.VectorLen(field)
    keys: dict[str, int | None] = {}
    for i in range(count):
        entry = flatbuffers.table.Table(buf, root.Indirect(vector + 4 * i))
        key_field, size_field = entry.Offset(8), entry.Offset(6)
        if not key_field:
            continue
        key = entry.String(entry.Pos + key_field).decode()
        if key:
            keys[key] = (int(entry.Get(flatbuffers.number_types.Uint64Flags, entry.Pos + size_field))
                         if size_field else None)
    return keys


__all__ = ["XNNPACK_BACKEND_ID", "XnnpackTarget"]
