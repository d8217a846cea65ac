"""External weights: a TOSA delegate's large constants as ExecuTorch named data (issue 52).

With ``CodecSpec(external_weights=True)`` the payload `CodecTosaBackend` writes into
the .pte is not the TOSA flatbuffer itself but a small side table followed by a
*skeleton* flatbuffer in which each listed constant has no data; the data goes
to the named data `preprocess` returns (`NamedDataStore`, external tag `TAG`),
which ExecuTorch writes into the .ptd beside the .pte. The C++ runtime backend
fetches each constant at init from the program's named data map; `complete`
puts the flatbuffer back together, byte for byte the one an inline lowering
writes, for everything that reads TOSA (the reference model, `tosa_stats`).

Which constants: every one of at least `MIN_BYTES`, the graph-owned ones
(parameters, buffers, lifted constants, lookup tables) first, then the helpers
the serializer pools when they are that large (a RESCALE's per-channel
multipliers: 6 KiB for a 1,536-wide Linear). The small ones (scalar shifts,
zero points) and CONST_SHAPE data stay inline.

The skeleton is deflated (zlib): without its weights a SmolLM2 layer's TOSA is
still ~58 KB, mostly tensor names (each written again in every operator that
reads it) and flatbuffer tables, which deflate ~7x. The .pte is then 0.5% of the
inline one instead of 2.4% (issue 52; docs/results/memory.md).

Payload (little-endian)::

    0   b"CTW1"
    4   u32 header_size   offset of the skeleton, a multiple of 16
    8   u32 entry_count
    12  u32 encoding      of the skeleton: 0 the flatbuffer as it is, 1 zlib-deflated
    16  entry_count x {u64 nbytes; u32 len + region; u32 len + block;
                       u32 len + tensor name; u32 len + key}
    zero padding to header_size, then the skeleton TOSA flatbuffer (`encoding`)

The payload is deliberately not a TOSA flatbuffer: a runtime or tool that does
not know this format refuses it instead of running a graph without weights.

Keys are ``"codec_tosa:" + sha256(tag + b"\\0" + bytes)``: content-addressed, so the
same weights get the same key in every program (two programs can share one
.ptd), and per tag, because ExecuTorch's `NamedDataStore` keeps the first of two
equal entries under different tags and would drop the second file's copy
(Arm keys Vela's external blocks the same way).
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tosa_serializer as ts
from tosa.TosaGraph import TosaGraph

from codec_tosa.serialization.tosa_copy import NotCopyable, loaded
from codec_tosa.serialization.tosa_stats import tensor_nbytes

MAGIC = b"CTW1"
KEY_PREFIX = "codec_tosa:"
# the external tag of every named data codec_tosa writes: ExecuTorch's
# `write_tensor_data_to_file(dir)` names the file `<tag>.ptd`, model.ptd beside model.pte
TAG = "model"
ALIGNMENT = 16  # of each blob in the .ptd, as XNNPACK's and Vela's
# A .ptd stores each blob in its own segment at 128-byte alignment: a smaller
# constant would cost the .ptd more padding than it saves the .pte
MIN_BYTES = 128
RAW, DEFLATED = 0, 1  # the skeleton's encoding
_HEAD = struct.Struct("<4sIII")

Where = tuple[str, str, str]  # (region, basic block, tensor) of a constant


def cpu_constant_tag(node: Any) -> str | None:
    """ExecuTorch's `ExecutorchBackendConfig(external_constants=...)` for a program with
    external weights: a CPU operator's constant (an embedding table the CPU looks up)
    goes to the same model.ptd as the delegates' weights, or stays inline (None) when
    too small to pay for its .ptd segment's alignment."""
    spec = node.meta.get("spec")
    return TAG if (getattr(spec, "allocated_memory", 0) or 0) >= MIN_BYTES else None


class ExternalWeightsError(ValueError):
    """A payload with external weights that is malformed, or its named data that does not fit it."""


@dataclass(frozen=True)
class Entry:
    """One constant the skeleton leaves out: where it is, its named-data key, its size."""

    region: str
    block: str
    tensor: str
    key: str
    nbytes: int


def weight_key(data: bytes | memoryview, tag: str = TAG) -> str:
    """The named-data key of a constant's bytes under `tag`."""
    return KEY_PREFIX + hashlib.sha256(tag.encode() + b"\0" + bytes(data)).hexdigest()


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<I", len(raw)) + raw


def pack(entries: Sequence[Entry], skeleton: bytes, encoding: int = DEFLATED) -> bytes:
    """The payload: `entries` and the `skeleton` flatbuffer they complete, deflated
    unless `encoding` is RAW."""
    table = b"".join(struct.pack("<Q", e.nbytes) + _string(e.region) + _string(e.block) + _string(e.tensor)
                     + _string(e.key) for e in entries)
    header_size = -(-(_HEAD.size + len(table)) // 16) * 16
    head = _HEAD.pack(MAGIC, header_size, len(entries), encoding) + table
    body = zlib.compress(skeleton, 9) if encoding == DEFLATED else skeleton
    return head + b"\0" * (header_size - len(head)) + body


def is_external(payload: bytes | memoryview) -> bool:
    """Whether a delegate payload keeps constants in named data (starts with `MAGIC`)."""
    return bytes(payload[:4]) == MAGIC


def unpack(payload: bytes) -> tuple[list[Entry], bytes]:
    """(entries, skeleton flatbuffer, inflated) of an external-weights payload; a
    plain flatbuffer is ``([], payload)``. Raises ExternalWeightsError on a
    malformed side table or skeleton."""
    if not is_external(payload):
        return [], payload
    if len(payload) < _HEAD.size:
        raise ExternalWeightsError(f"external-weights payload truncated ({len(payload)} bytes)")
    _, header_size, count, encoding = _HEAD.unpack_from(payload)
    if header_size % 16 or not _HEAD.size <= header_size < len(payload) or encoding not in (RAW, DEFLATED):
        raise ExternalWeightsError("external-weights payload has a malformed header")
    pos = _HEAD.size

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > header_size:
            raise ExternalWeightsError("external-weights payload: its side table is truncated")
        out = payload[pos:pos + n]
        pos += n
        return out

    def string() -> str:
        (n,) = struct.unpack("<I", take(4))
        return take(n).decode()

    entries = []
    for _ in range(count):
        (nbytes,) = struct.unpack("<Q", take(8))
        region, block, tensor, key = string(), string(), string(), string()
        entries.append(Entry(region, block, tensor, key, nbytes))
    body = bytes(payload[header_size:])
    if encoding == RAW:
        return entries, body
    try:
        return entries, zlib.decompress(body)
    except zlib.error as e:
        raise ExternalWeightsError(f"external-weights payload: its skeleton does not inflate ({e})") from None


def _flatbuffer_tensors(full: bytes) -> dict[Where, Any]:
    graph = TosaGraph.GetRootAs(full, 0)
    found: dict[Where, Any] = {}
    for r in range(graph.RegionsLength()):
        region = graph.Regions(r)
        for b in range(region.BlocksLength()):
            block = region.Blocks(b)
            for t in range(block.TensorsLength()):
                tensor = block.Tensors(t)
                found[(region.Name().decode(), block.Name().decode(), tensor.Name().decode())] = tensor
    return found


def _serializer_tensor(serializer: ts.TosaSerializer, where: Where) -> Any:
    region = next(r for r in serializer.regions if r.name == where[0])
    block = next(b for b in region.basicBlocks if b.name == where[1])
    return block.tensors[where[2]]


def externalize(full: bytes, serializer: ts.TosaSerializer, owned: Sequence[Where], tag: str = TAG,
                min_bytes: int = MIN_BYTES) -> tuple[bytes, list[tuple[str, bytes]]]:
    """From `full`, the flatbuffer `serializer` wrote, and the graph-owned constants
    it recorded (`owned`): the external-weights payload and the (key, bytes) blobs
    it leaves out, every constant of `min_bytes` or more (the graph-owned ones
    first, in their order). Empties those constants' data in `serializer` (it
    serializes the skeleton); a graph with none is returned as it is, inline."""
    tensors = _flatbuffer_tensors(full)
    entries: list[Entry] = []
    blobs: list[tuple[str, bytes]] = []
    graph_owned = set(owned)
    for where in dict.fromkeys([*owned, *tensors]):  # in order, once each
        tensor = tensors.get(where)
        if tensor is None or tensor.DataLength() < max(min_bytes, 1):
            continue
        if where not in graph_owned and not _sized_by_shape(tensor):
            continue  # Arm writes some helpers with more data than their shape (a [1] zero point of 576 bytes)
        data = tensor.DataAsNumpy().tobytes()
        key = weight_key(data, tag)
        entries.append(Entry(*where, key, len(data)))
        blobs.append((key, data))
    if not entries:
        return full, []
    for e in entries:
        _serializer_tensor(serializer, (e.region, e.block, e.tensor)).data = []
    return pack(entries, bytes(serializer.serialize())), blobs


def _sized_by_shape(tensor: Any) -> bool:
    """Whether a flatbuffer tensor's data is exactly what its shape and dtype need
    (the runtime checks each external constant's size against them)."""
    shape = [int(d) for d in tensor.ShapeAsNumpy()] if tensor.ShapeLength() else []
    return tensor.DataLength() == tensor_nbytes(shape, tensor.Type())


@contextmanager
def _loaded(flatbuffer: bytes) -> Iterator[ts.TosaSerializer]:
    """`tosa_copy.loaded`, its refusal said as this module's."""
    try:
        with loaded(flatbuffer) as serializer:
            yield serializer
    except NotCopyable:
        raise ExternalWeightsError("the skeleton of an external-weights payload is not a TOSA flatbuffer") from None


Lookup = Callable[[str], "bytes | memoryview | None"]


def complete(payload: bytes, lookup: Lookup | None) -> bytes:
    """The whole TOSA flatbuffer of a delegate payload: a plain one as it is; an
    external-weights one with each constant's bytes from ``lookup(key)`` (None: not
    there), byte for byte what the inline lowering writes. Raises
    ExternalWeightsError naming the first constant that is missing or of another size."""
    entries, skeleton = unpack(payload)
    if not entries:
        return skeleton
    data = []
    for e in entries:
        blob = lookup(e.key) if lookup is not None else None
        if blob is None:
            raise ExternalWeightsError(f"constant {e.tensor} ({e.nbytes} bytes) is not in the named data "
                                       f"(key {e.key})")
        if len(blob) != e.nbytes:
            raise ExternalWeightsError(f"constant {e.tensor}: {len(blob)} bytes under key {e.key}, "
                                       f"the payload expects {e.nbytes}")
        data.append(blob)
    with _loaded(skeleton) as serializer:
        for e, blob in zip(entries, data):
            tensor = _serializer_tensor(serializer, (e.region, e.block, e.tensor))
            dtype = tensor.dtype
            # the data setter converts values by dtype: raw bytes go in as INT8
            tensor.setDtype(ts.DType.INT8)
            tensor.data = np.frombuffer(blob, np.uint8)
            tensor.setDtype(dtype)
        return bytes(serializer.serialize())


def needed(payload: bytes) -> dict[str, int]:
    """The named data a delegate payload needs: key -> bytes ({} for a plain flatbuffer)."""
    return {e.key: e.nbytes for e in unpack(payload)[0]}


__all__ = ["ALIGNMENT", "DEFLATED", "Entry", "ExternalWeightsError", "MAGIC", "MIN_BYTES", "TAG", "complete", "cpu_constant_tag", "externalize",
           "is_external", "needed", "pack", "RAW", "unpack", "weight_key"]
