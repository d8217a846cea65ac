"""PooledTosaSerializer: one CONST per distinct helper constant per basic block.

Arm's node visitors emit a fresh CONST for every helper operand they need
(RESCALE multipliers/shifts/zero points, conv and matmul zero points, the MUL
shift, PAD values, reshape shapes, ...), and most of them are identical. This
serializer keeps the first CONST of each distinct value in a basic block and
hands the same tensor to every later request.

What is pooled, and what is not:

* The pool key is ``(dtype, shape, exact serialized bytes)``: ``0.0`` and
  ``-0.0``, INT8 and INT32 zeros, ``[1]`` and ``[1, 1]`` stay distinct. The
  bytes come from a throw-away ``TosaSerializerTensor``, i.e. the serializer's
  own encoding, so nothing is equal here that differs in the flatbuffer.
* Pools are per (region, basic block): a control-flow branch cannot see the
  tensors of its parent block, so it gets its own pool.
* Graph-owned constants (parameters, buffers, lifted constants, lookup
  tables, CONST_SHAPE outputs of FX nodes) are never pooled: later lowering
  refers to them by their FX names, and packed FP4 constants are patched in
  place right after being added. Whoever adds them says so, either by calling
  `addUnpooledConst` or by adding them inside `graph_owned_constants()`; the
  adapter (`codec_tosa.arm.adapter`) does the latter around Arm's call sites.
  No call-stack inspection.
* Some Arm call sites ignore `addConst`'s return value and use the name they
  asked for. A pooled request therefore records ``asked name -> pooled name``
  and `addOperator` rewrites operator inputs through that map.

The serializer caches *names*, never the pybind wrappers it returns: a wrapper
keeps the serializer alive, so caching one would leak every serializer.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import tosa_serializer as ts

# (dtype, shape, serialized bytes)
PoolKey = tuple[int, tuple[int, ...], bytes]
BlockKey = tuple[str, str]


@dataclass
class PoolingStats:
    """What pooling did during one lowering (read after `serialize`)."""

    helper_requests: int = 0  # addConst calls that were eligible for pooling
    helper_consts_emitted: int = 0  # CONST / CONST_SHAPE operators actually emitted
    helper_consts_reused: int = 0  # requests answered with an existing constant
    helper_bytes_saved: int = 0  # serialized data bytes not emitted
    graph_owned_consts: int = 0  # constants added unpooled
    remapped_operator_inputs: int = 0  # operator inputs rewritten to a pooled name
    const_shapes_deduplicated: int = 0  # FX CONST_SHAPE nodes removed before visiting
    reused_by_dtype: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0  # time spent in pooling code (keys, lookups, remapping)

    @property
    def operators_saved(self) -> int:
        """TOSA operators this serializer (and the CONST_SHAPE dedup) avoided."""
        return self.helper_consts_reused + self.const_shapes_deduplicated

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["operators_saved"] = self.operators_saved
        return out

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "PoolingStats":
        data = json.loads(text)
        data.pop("operators_saved", None)
        return cls(**data)


def _dtype_name(dtype: ts.DType) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def serialized_bytes(shape: Sequence[int], dtype: ts.DType, vals: Any) -> bytes:
    """The bytes the serializer itself would store for this constant."""
    probe = ts.TosaSerializerTensor("", list(shape), dtype, vals)
    return bytes(probe.data)


class MarkingTosaSerializer(ts.TosaSerializer):
    """A `TosaSerializer` that knows which constants are graph-owned (added inside
    `graph_owned_constants()`, or by `addUnpooledConst`) and records where each
    lives, as (region, block, tensor) in `owned`: what external weights move to
    named data (`serialization.external`). It writes exactly what the plain
    serializer writes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._graph_owned_depth = 0
        self.owned: list[tuple[str, str, str]] = []

    @contextmanager
    def graph_owned_constants(self) -> Iterator[None]:
        """Within this context every `addConst` is graph-owned (never pooled)."""
        self._graph_owned_depth += 1
        try:
            yield
        finally:
            self._graph_owned_depth -= 1

    def addUnpooledConst(
        self, shape: Sequence[int], dtype: ts.DType, vals: Any = None, name: str = ""
    ) -> Any:
        """Add a constant exactly as the plain serializer would (graph-owned)."""
        tensor = ts.TosaSerializer.addConst(self, list(shape), dtype, vals, name)
        if dtype != ts.DType.SHAPE:
            region = self.currRegion
            self.owned.append((region.name, region.currBasicBlock.name, tensor.name))
        return tensor

    def addConst(  # noqa: N802 (the serializer's own name)
        self, shape: Sequence[int], dtype: ts.DType, vals: Any = None, name: str = ""
    ) -> Any:
        if self._graph_owned_depth > 0:
            return self.addUnpooledConst(shape, dtype, vals, name)
        return super().addConst(list(shape), dtype, vals, name)


class PooledTosaSerializer(MarkingTosaSerializer):
    """A `TosaSerializer` that pools helper constants per basic block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pools: dict[BlockKey, dict[PoolKey, str]] = {}
        self._aliases: dict[BlockKey, dict[str, str]] = {}
        self.stats = PoolingStats()

    # -- classification -------------------------------------------------

    def addUnpooledConst(
        self, shape: Sequence[int], dtype: ts.DType, vals: Any = None, name: str = ""
    ) -> Any:
        """Add a constant exactly as the plain serializer would (graph-owned)."""
        self.stats.graph_owned_consts += 1
        return super().addUnpooledConst(shape, dtype, vals, name)

    def record_const_shape_dedup(self, removed: int, seconds: float) -> None:
        """Account for CONST_SHAPE FX nodes merged before this serializer saw them."""
        self.stats.const_shapes_deduplicated += removed
        self.stats.seconds += seconds

    # -- pooling --------------------------------------------------------

    def _block_key(self) -> BlockKey:
        region = self.currRegion
        return (region.name, region.currBasicBlock.name)

    def _existing(self, name: str, dtype: ts.DType) -> Any:
        block = self.currRegion.currBasicBlock
        return block.shapes[name] if dtype == ts.DType.SHAPE else block.tensors[name]

    def addConst(  # noqa: N802 (the serializer's own name)
        self, shape: Sequence[int], dtype: ts.DType, vals: Any = None, name: str = ""
    ) -> Any:
        if self._graph_owned_depth > 0 or vals is None:
            # No data means nothing to compare (and nothing is ever shared).
            return self.addUnpooledConst(shape, dtype, vals, name)
        started = time.perf_counter()
        self.stats.helper_requests += 1
        data = serialized_bytes(shape, dtype, vals)
        key: PoolKey = (int(dtype), tuple(int(d) for d in shape), data)
        block = self._block_key()
        pool = self._pools.setdefault(block, {})
        pooled_name = pool.get(key)
        if pooled_name is None:
            self.stats.seconds += time.perf_counter() - started
            tensor = super().addConst(list(shape), dtype, vals, name)
            pool[key] = tensor.name
            self.stats.helper_consts_emitted += 1
            return tensor
        if name and name != pooled_name:
            self._aliases.setdefault(block, {})[name] = pooled_name
        self.stats.helper_consts_reused += 1
        self.stats.helper_bytes_saved += len(data)
        by_dtype = self.stats.reused_by_dtype
        by_dtype[_dtype_name(dtype)] = by_dtype.get(_dtype_name(dtype), 0) + 1
        existing = self._existing(pooled_name, dtype)
        self.stats.seconds += time.perf_counter() - started
        return existing

    def addOperator(  # noqa: N802
        self, op: ts.Op, inputs: Sequence[str], outputs: Sequence[str], *args: Any, **kwargs: Any
    ) -> Any:
        if self._aliases:  # nothing to remap until something was pooled by name
            started = time.perf_counter()
            aliases = self._aliases.get(self._block_key(), {})
            remapped = [aliases.get(name, name) for name in inputs]
            self.stats.remapped_operator_inputs += sum(
                1 for old, new in zip(inputs, remapped) if old != new
            )
            inputs = remapped
            self.stats.seconds += time.perf_counter() - started
        return super().addOperator(op, list(inputs), list(outputs), *args, **kwargs)
