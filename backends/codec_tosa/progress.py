"""Progress of a lowering, for the CLI's bar and for Python callers (docs/DESIGN.md, "Tools").

A lowering runs inside ExecuTorch's `to_edge_transform_and_lower`, which
calls our partitioner and then our backend once per delegate; neither gets
an argument from the caller. So the caller's callback travels in a context
variable: `reporting(callback)` around the lowering, `stage(...)` where a
stage starts. Without a callback, `stage` does nothing.

Inside a delegate's TOSA lowering (minutes on a deep model), `reporting(...,
steps=...)` also hears each of Arm's passes as it starts, as
"TOSA lowering: delegate 1: pass 37/152 RewriteConvPass" (`step`); the stages
callback does not (issue 51).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Callable, Iterator

Callback = Callable[[str], None]  # called with the stage that starts, e.g. "TOSA lowering: delegate 1"

PLACEMENT = "placement + calibration"
SERIALISATION = "serialisation"


@dataclass
class _Reporter:
    callback: Callback | None
    delegates: int = 0
    steps: Callback | None = None  # hears the steps inside a stage (`step`)


_current: ContextVar[_Reporter | None] = ContextVar("codec_tosa_progress", default=None)


@contextmanager
def reporting(callback: Callback | None, steps: Callback | None = None) -> Iterator[None]:
    """Report the stages of the lowering run inside to `callback` (None: report nothing),
    and the steps inside them to `steps` (None: none)."""
    token = _current.set(_Reporter(callback, steps=steps) if callback is not None or steps is not None else None)
    try:
        yield
    finally:
        _current.reset(token)


def stage(name: str) -> None:
    reporter = _current.get()
    if reporter is not None and reporter.callback is not None:
        reporter.callback(name)


def delegate_lowering() -> None:
    """One more delegate's TOSA lowering starts (numbered from 1 in the order ExecuTorch lowers them)."""
    reporter = _current.get()
    if reporter is not None:
        reporter.delegates += 1
        if reporter.callback is not None:
            reporter.callback(f"TOSA lowering: delegate {reporter.delegates}")


def stepping() -> bool:
    """Whether anyone hears `step` (so that a caller can skip preparing its steps)."""
    reporter = _current.get()
    return reporter is not None and reporter.steps is not None


def step(detail: str) -> None:
    """One more step of the current delegate's TOSA lowering starts, e.g. "pass 37/152 RewriteConvPass"."""
    reporter = _current.get()
    if reporter is not None and reporter.steps is not None:
        reporter.steps(f"TOSA lowering: delegate {max(reporter.delegates, 1)}: {detail}")
