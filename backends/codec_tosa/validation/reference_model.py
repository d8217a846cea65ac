"""The one runner of the TOSA reference model (tosa-tools' Python binding).

`run_reference_model` runs a TOSA flatbuffer in a forked child, so that a
graph the binding accepts but crashes on is reported, not fatal.
`reference_inputs` draws inputs for a delegate program's user inputs in their
own dtypes (float32 for float, the full range for integer inputs of an INT8
delegate); `bit_identical` compares two flatbuffers exactly (pooling must not
change a single output bit).
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch


class ReferenceModelError(ValueError):
    """The reference model rejected, failed on or crashed on a graph (one line)."""


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


def run_reference_model(payload: bytes, inputs: list[np.ndarray], path: str | Path = "<payload>") -> list[np.ndarray]:
    """Run the delegate on the TOSA reference model's Python binding, in a forked
    child: the binding crashes its process (SIGSEGV) when a graph it accepted
    fails during evaluation, and validate must report that, not die of it. The
    child's console output is captured; a crash is reported with the reference
    model's own ERROR_IF reason."""
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryFile() as console:
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_reference_model_child, args=(payload, inputs, send, console.fileno()),
                            daemon=True)
        child.start()
        send.close()
        try:
            kind, value = receive.recv()
        except EOFError:  # the child died without answering
            kind, value = "crash", None
        child.join()
        console.seek(0)
        output = console.read().decode(errors="replace")
    if kind == "crash":
        raise ReferenceModelError(f"{path}: the TOSA reference model crashed on the delegate "
                              f"(exit code {child.exitcode}): {_error_if_reason(output)}")
    if kind == "rejected":
        raise ReferenceModelError(f"{path}: the TOSA reference model rejects the delegate: {value}")
    if kind == "status":
        raise ReferenceModelError(f"{path}: the TOSA reference model returned status {value}")
    return value


def _reference_model_child(payload: bytes, inputs: list[np.ndarray], send: Any, console: int) -> None:
    faulthandler.disable()  # a crash is reported by the parent, without a Python traceback
    os.dup2(console, 1)
    os.dup2(console, 2)
    import tosa_reference_model as trm

    try:
        outs, status = trm.run(payload, inputs)
    except ValueError as e:
        send.send(("rejected", str(e)))
        return
    if status != trm.GraphStatus.TOSA_VALID:
        send.send(("status", str(status)))
        return
    send.send(("ok", [np.asarray(o) for o in outs]))


def _error_if_reason(output: str) -> str:
    """The reference model prints `ERROR_IF() fails AT file:line eval(): (cond)`
    and then the operator's message; one line of both."""
    lines = [line.strip() for line in output.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("ERROR_IF() fails"):
            cond = line.rsplit("eval():", 1)[-1].strip()
            message = lines[i + 1] if i + 1 < len(lines) else ""
            return f"{message} (ERROR_IF {cond})" if message else f"ERROR_IF {cond}"
    return "the graph fails during evaluation (no ERROR_IF reason printed)"


def bit_identical(a: bytes, b: bytes, inputs: list[np.ndarray]) -> bool:
    """True when both flatbuffers produce exactly the same outputs."""
    out_a, out_b = run_reference_model(a, inputs, "a"), run_reference_model(b, inputs, "b")
    return len(out_a) == len(out_b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(out_a, out_b)
    )
