"""Queries of a TOSA flatbuffer that only tests ask (the package's reader is
`codec_tosa.serialization.tosa_stats`)."""

from __future__ import annotations

from typing import Iterator

from codec_tosa.serialization.tosa_stats import CONST_OPS, OperatorInfo, blocks

FLOAT_DTYPES = frozenset({"FP32", "FP16", "BF16", "FP8E4M3", "FP8E5M2"})


def float_operators(buf: bytes) -> list[OperatorInfo]:
    """The non-constant operators that read or write a floating-point tensor.

    Empty for an all-integer payload, the only kind an integer-only NPU
    (Ethos-U) accepts: this is how policy I's "no FP32 inside" is checked."""
    return [info for tensors, operators in blocks(buf) for info in operators
            if info.op not in CONST_OPS
            and any(n in tensors and tensors[n].dtype in FLOAT_DTYPES for n in info.inputs + info.outputs)]


def operator_dtypes(buf: bytes) -> Iterator[tuple[str, list[str], list[str]]]:
    """(operator, input dtypes, output dtypes) of every non-constant operator, in order."""
    for tensors, operators in blocks(buf):
        for info in operators:
            if info.op not in CONST_OPS:
                yield (info.op, [tensors[n].dtype for n in info.inputs if n in tensors],
                       [tensors[n].dtype for n in info.outputs if n in tensors])
