"""Keep known-harmless third-party chatter off the console.

torch, torchao, executorch's Arm backend and the TOSA reference model print
warnings that say nothing about the user's model (docs/DESIGN.md, "Console
output"): libraries torchao cannot load on a CPU, deprecations inside torch,
Arm passes narrating int64 casts, serializer version notes. `quiet()` drops
exactly those, through the three channels they use:

* Python warnings, by category and message (and module where one is known);
* `logging` records, by logger name and message;
* native (C/C++) output: file descriptors 1 and 2 are redirected to temporary
  files around the call, and a thread forwards every line that matches no
  known-noise pattern to the real console as it arrives.

Everything else passes: our own output, unknown warnings and every error.
`quiet(verbose=True)` changes nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Iterator

__all__ = ["NoiseRules", "DEFAULT_RULES", "quiet", "is_noise"]


@dataclass(frozen=True)
class WarningRule:
    category: type[Warning]
    message: str = ""  # regex matched at the start of the message
    module: str = ""  # regex matched at the start of the warning's module


@dataclass(frozen=True)
class LogRule:
    logger: str  # exact logger name
    message: str  # regex searched in the formatted message


@dataclass(frozen=True)
class NoiseRules:
    warnings: tuple[WarningRule, ...]
    log_records: tuple[LogRule, ...]
    lines: tuple[str, ...]  # regexes searched in each console line

    def line_pattern(self) -> re.Pattern[bytes]:
        return re.compile("|".join(f"(?:{p})" for p in self.lines).encode())


DEFAULT_RULES = NoiseRules(
    warnings=(
        # torch's pytree deprecations, raised from inside torch and executorch
        WarningRule(FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
        WarningRule(FutureWarning, module=r"torch\."),
        WarningRule(FutureWarning, module=r"executorch\."),
        WarningRule(FutureWarning, module=r"torchao\."),
        WarningRule(DeprecationWarning, module=r"(torch|torchao|executorch)\."),
    ),
    log_records=(
        # optional CUDA kernels of torchao, absent on a CPU-only install
        LogRule("torchao", r"^Failed to load .*torchao/_C"),
        LogRule("torch.utils._pytree", r"is an Enum subclass and is now natively supported"),
        # Arm narrates every int64 buffer it narrows, with the model's stack trace
        LogRule("executorch.backends.arm._passes.cast_int64_pass", r"^Casting buffer "),
    ),
    lines=(
        # the same messages when they reach the console another way
        r"^Failed to load \S*torchao/_C\S*\.so",
        r"torch/utils/_pytree\.py:\d+\] .* is an Enum subclass and is now natively supported",
        # executorch's thread pool on a machine without ARM CPU identification
        r"cpuinfo_utils\.cpp.*Failed to open midr file",
        r"cpuinfo_utils\.cpp:\d+\] CPU info and manual query on # of cpus dont match",
        r"cpuinfo_utils\.cpp:\d+\] Reading file /sys/",  # XNNPACK's, when it loads
        # TOSA serialization library version notes (compatible versions only)
        r"^WARNING: Different TOSA spec in flatbuffer and serializer versions detected\. "
        r".* is backward compatible",
        r"^WARNING: TOSA file created with version of SerLib before software version was encoded\. "
        r"It is backward compatible",
        r"^Reference model version \S+ is backward compatible with serializer version",
    ),
)


def is_noise(line: str, rules: NoiseRules = DEFAULT_RULES) -> bool:
    """Whether one console line is known noise."""
    return rules.line_pattern().search(line.encode()) is not None


@contextmanager
def quiet(verbose: bool = False, rules: NoiseRules = DEFAULT_RULES) -> Iterator[None]:
    """Filter known third-party noise inside the block (nothing when `verbose`).

    Exceptions propagate untouched; the console is restored before they reach
    the caller, so the caller's error message is never filtered."""
    if verbose:
        yield
        return
    with ExitStack() as stack:
        stack.enter_context(_native_lines_filtered(rules.line_pattern()))
        stack.enter_context(_warnings_filtered(rules.warnings))
        stack.enter_context(_log_records_filtered(rules.log_records))
        yield


@contextmanager
def _warnings_filtered(rules: tuple[WarningRule, ...]) -> Iterator[None]:
    with warnings.catch_warnings():
        for r in rules:
            warnings.filterwarnings("ignore", message=r.message, category=r.category, module=r.module)
        yield


class _LogFilter(logging.Filter):
    def __init__(self, pattern: str) -> None:
        super().__init__()
        self.pattern = re.compile(pattern)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return self.pattern.search(record.getMessage()) is None
        except Exception:  # noqa: BLE001 (a malformed record is not ours to drop)
            return True


@contextmanager
def _log_records_filtered(rules: tuple[LogRule, ...]) -> Iterator[None]:
    # a logger's own filters see every record logged on it, whichever handler
    # (torch's, the root's, logging's last resort) would print it
    installed = [(logging.getLogger(r.logger), _LogFilter(r.message)) for r in rules]
    for logger, f in installed:
        logger.addFilter(f)
    try:
        yield
    finally:
        for logger, f in installed:
            logger.removeFilter(f)


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    try:  # C stdio buffers (C++ iostreams are synchronised with them)
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


class _LineForwarder(threading.Thread):
    """Follows a file that a redirected descriptor appends to and copies each
    line that is not noise to `out` (the descriptor's original target).

    A file, not a pipe: native code writing while holding the GIL must never
    block on a full pipe that this thread (needing the GIL) would drain."""

    POLL_S = 0.05

    def __init__(self, path: str, out: int, noise: re.Pattern[bytes]) -> None:
        super().__init__(daemon=True, name="codec-tosa-quiet")
        self.source = open(path, "rb", buffering=0)  # noqa: SIM115 (closed in run)
        self.out = out
        self.noise = noise
        self.done = threading.Event()

    def run(self) -> None:
        pending = b""
        try:
            while True:
                finishing = self.done.is_set()
                chunk = self.source.read(1 << 16)
                if chunk:
                    pending = self._forward(pending + chunk)
                    continue
                if finishing:
                    break
                if b"\r" in pending:  # a progress bar redraws without a newline: show it now
                    self._write(pending)
                    pending = b""
                self.done.wait(self.POLL_S)
            if pending:
                self._write(pending if not self.noise.search(pending) else b"")
        finally:
            self.source.close()

    def _forward(self, data: bytes) -> bytes:
        """Write the complete lines of `data`; return the unfinished tail."""
        *lines, tail = data.split(b"\n")
        kept = [line + b"\n" for line in lines if not self.noise.search(line.rsplit(b"\r", 1)[-1])]
        self._write(b"".join(kept))
        return tail

    def _write(self, data: bytes) -> None:
        while data:
            try:
                data = data[os.write(self.out, data):]
            except InterruptedError:
                continue
            except OSError:
                return


@contextmanager
def _native_lines_filtered(noise: re.Pattern[bytes], fds: tuple[int, ...] = (1, 2)) -> Iterator[None]:
    redirected: list[tuple[int, int, _LineForwarder]] = []
    _flush_all()
    try:
        for fd in fds:
            try:
                saved = os.dup(fd)
            except OSError:  # closed descriptor: nothing to filter
                continue
            handle, path = tempfile.mkstemp(prefix="codec-tosa-console-")
            forwarder = _LineForwarder(path, saved, noise)
            os.unlink(path)  # both descriptors stay valid; nothing is left behind
            os.dup2(handle, fd)
            os.close(handle)
            redirected.append((fd, saved, forwarder))
            forwarder.start()
        yield
    finally:
        _flush_all()
        for fd, saved, forwarder in redirected:
            os.dup2(saved, fd)
        for fd, saved, forwarder in redirected:
            forwarder.done.set()
            forwarder.join(timeout=10)
            if not forwarder.is_alive():
                os.close(saved)
