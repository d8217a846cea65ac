"""Bit-for-bit comparison of two TOSA flatbuffers on the TOSA reference model.

Pooling must not change a single output bit, so the check is exact: same
number of outputs, same dtypes, same bytes. Inputs are drawn for the
delegate's user inputs in their own dtypes (float32 for float, the full
range for integer inputs of an INT8 delegate).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def reference_inputs(program: Any, seed: int = 0) -> list[np.ndarray]:
    """Random inputs for the user inputs of a delegate program, in their dtypes."""
    rng = np.random.default_rng(seed)
    user_inputs = set(program.graph_signature.user_inputs)
    inputs: list[np.ndarray] = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        val = node.meta["val"]
        shape = tuple(int(d) for d in val.shape)
        dtype = torch.empty(0, dtype=val.dtype).numpy().dtype
        if val.dtype.is_floating_point:
            inputs.append(rng.standard_normal(shape).astype(dtype))
        elif val.dtype == torch.bool:
            inputs.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            info = np.iinfo(dtype)
            inputs.append(rng.integers(info.min, info.max, shape, endpoint=True).astype(dtype))
    return inputs


def run_reference(tosa_bytes: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Outputs of the reference model; raises if the graph is not valid TOSA."""
    import tosa_reference_model as trm

    outputs, status = trm.run(tosa_bytes, inputs)
    if status != trm.GraphStatus.TOSA_VALID:
        raise ValueError(f"reference model status {status}")
    return list(outputs)


def bit_identical(a: bytes, b: bytes, inputs: list[np.ndarray]) -> bool:
    """True when both flatbuffers produce exactly the same outputs."""
    out_a, out_b = run_reference(a, inputs), run_reference(b, inputs)
    return len(out_a) == len(out_b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(out_a, out_b)
    )
