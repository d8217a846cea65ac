"""Copies of a TOSA flatbuffer for the tools that run one (never an artefact).

`loaded` opens a flatbuffer in tosa-tools' serializer at the graph's own version
(its loader takes a path). `rewritten` writes a single-block graph again,
operator by operator, through a new serializer: every tensor with its stored
bytes, every operator with its attributes, each operator a `Replacement` takes
written as whatever it writes instead, and `outputs` added to the block's own.
Nothing replaced and no output added, the copy is the original byte for byte
(tests/serialization/test_tosa_copy.py), so a copy differs from its artefact only
where a replacement says.
"""

from __future__ import annotations

import os
import re
import tempfile
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tosa_serializer as ts

from codec_tosa.quiet import quiet
from codec_tosa.serialization.tosa_stats import stored_bytes, tosa_version

# the constants a replacement reads or writes, by TOSA dtype
NUMPY = {ts.DType.INT8: np.int8, ts.DType.INT16: np.int16, ts.DType.INT32: np.int32, ts.DType.FP32: np.float32}


class NotCopyable(ValueError):
    """A graph `rewritten` does not write again (several blocks, an unreadable flatbuffer)."""


@contextmanager
def loaded(flatbuffer: bytes) -> Iterator[ts.TosaSerializer]:
    """A serializer holding `flatbuffer`, at the graph's own version (written back as
    its producer wrote it). Raises NotCopyable when the serializer cannot read it."""
    fd, path = tempfile.mkstemp(suffix=".tosa")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(flatbuffer)
        major, minor, patch, draft = tosa_version(flatbuffer)
        serializer = ts.TosaSerializer("", targetMajor=major, targetMinor=minor, targetPatch=patch,
                                       targetDraft=draft)
        with quiet():  # the serializer notes its own newer version: our probe, not the user's concern
            if not serializer.loadTosaFlatbuffer(path):
                raise NotCopyable("the TOSA serializer cannot read the flatbuffer")
        yield serializer
    finally:
        os.unlink(path)


_FIELDS: dict[str, list[str]] = {}


def attribute_fields(method: str) -> list[str]:
    """The arguments of ``TosaSerializerAttribute.<method>``, in order: the builders
    are generated from the schema and take positional arguments named as the
    fields a loaded operator's attribute object reads back (their signatures
    say them)."""
    if method not in _FIELDS:
        doc = getattr(ts.TosaSerializerAttribute, method).__doc__ or ""
        found = re.search(r"\((.*?)\)\s*->", doc)
        if found is None:
            raise NotCopyable(f"no signature for the serializer's {method}")
        _FIELDS[method] = [p.split(":")[0].strip() for p in found.group(1).split(",")[1:] if p.strip()]
    return _FIELDS[method]


def attribute(method: str, *fields: Any) -> Any:
    """A new operator attribute, ``attribute("Conv2dAttribute", pad, stride, ...)``."""
    built = ts.TosaSerializerAttribute()
    getattr(built, method)(*fields)
    return built


def _attribute_of(loaded_attribute: Any) -> Any:
    """The builder's copy of a loaded operator's attribute (``TosaConv2dAttribute`` ->
    ``Conv2dAttribute(pad, stride, ...)``)."""
    method = type(loaded_attribute).__name__.removeprefix("Tosa")
    return attribute(method, *[getattr(loaded_attribute, f) for f in attribute_fields(method)])


class BlockWriter:
    """The main block as `rewritten` writes it: what a replacement reads (`source`,
    the loaded block; `values`) and what it adds (tensors, constants, shapes, operators)."""

    def __init__(self, source: Any, target: Any, stored: dict[str, np.ndarray]) -> None:
        self.source = source
        self._stored = stored
        self._target = target
        self._fresh = 0
        self._constants: set[str] | None = None

    @property
    def constants(self) -> set[str]:
        """The tensors a CONST operator of the source block writes."""
        if self._constants is None:
            self._constants = {o.outputs[0] for o in self.source.operators if o.op == ts.Op.CONST}
        return self._constants

    def values(self, name: str) -> np.ndarray:
        """A constant's stored data as its dtype's numbers (every stored element: Arm
        writes some per-tensor zero points with more bytes than their shape needs)."""
        t = self.source.tensors[name]
        if t.dtype not in NUMPY or name not in self._stored:
            raise NotCopyable(f"constant {name} is {t.dtype}" + ("" if name in self._stored else ", stored empty"))
        return self._stored[name].view(NUMPY[t.dtype])

    def _name(self, base: str) -> str:
        self._fresh += 1
        return f"{base}__copy{self._fresh}"

    def tensor(self, base: str, shape: Sequence[int], dtype: Any) -> str:
        name = self._name(base)
        self._target.addTensor(name, list(shape), dtype)
        return name

    def const(self, base: str, values: np.ndarray, dtype: Any) -> str:
        name = self._name(base)
        self._target.addTensor(name, list(values.shape), dtype, np.ascontiguousarray(values, NUMPY[dtype]))
        self.operator(ts.Op.CONST, [], [name], attribute("ConstAttribute"))
        return name

    def shape(self, base: str, dims: Sequence[int]) -> str:
        name = self._name(base)
        self._target.addShape(name, len(dims), np.array(dims, np.int64))
        self.operator(ts.Op.CONST_SHAPE, [], [name], attribute("ConstShapeAttribute"))
        return name

    def operator(self, op: Any, inputs: Sequence[str], outputs: Sequence[str], attr: Any,
                 location: Any = None) -> None:
        self._target.addOperator(op, list(inputs), list(outputs), attr, location)

    def copy_operator(self, op: Any) -> None:
        self.operator(op.op, op.inputs, op.outputs, _attribute_of(op.attributes), op.location)


# given the writer and one loaded operator: True when it wrote that operator's
# replacement (its outputs under the same names), False to have it copied
Replacement = Callable[[BlockWriter, Any], bool]


def rewritten(flatbuffer: bytes, replace: Replacement | None = None, outputs: Sequence[str] = ()) -> bytes:
    """`flatbuffer` written again: each operator `replace` takes replaced, the others
    copied, and `outputs` (tensor names) added to the main block's outputs (a
    runner returns them after the graph's own). Raises NotCopyable for a graph of
    more than one block (control flow)."""
    major, minor, patch, draft = tosa_version(flatbuffer)
    with loaded(flatbuffer) as source:
        if len(source.regions) != 1 or len(source.regions[0].basicBlocks) != 1:
            raise NotCopyable("the graph has more than one basic block")
        block = source.regions[0].basicBlocks[0]
        copy = ts.TosaSerializer("", targetMajor=major, targetMinor=minor, targetPatch=patch, targetDraft=draft)
        target = copy.regions[0].basicBlocks[0]
        if (copy.regions[0].name, target.name) != (source.regions[0].name, block.name):
            # the serializer names its one region and block itself
            raise NotCopyable(f"the graph's block is {source.regions[0].name}/{block.name}, not "
                              f"{copy.regions[0].name}/{target.name}")
        for name in block.inputs:
            target.addInput(name)
        stored = stored_bytes(flatbuffer)
        for name in list(block.tensors):
            t = block.tensors[name]
            data = stored.get(name)
            written = target.addTensor(t.name, list(t.shape), ts.DType.INT8 if data is not None else t.dtype,
                                       data, t.placeholderFilename, t.is_unranked, t.is_variable, t.variable_name)
            if data is not None:  # the data goes in converted by dtype: stored bytes as INT8, then its own dtype
                written.setDtype(t.dtype)
        for name in list(block.shapes):
            s = block.getShapeByName(name)
            raw = bytes(s.data) if s.data is not None else b""
            target.addShape(name, s.rank, np.frombuffer(raw, np.int64) if raw else None)
        writer = BlockWriter(block, target, stored)
        for op in block.operators:
            if replace is None or not replace(writer, op):
                writer.copy_operator(op)
        for name in [*block.outputs, *outputs]:
            target.addOutput(name)
        return bytes(copy.serialize())


__all__ = ["BlockWriter", "NotCopyable", "Replacement", "attribute", "attribute_fields", "loaded", "rewritten"]
