"""One function in a forked child with a timeout, for both flows of the peer suite
(`stock.py`, `ours.py`): a crash, hang or runaway allocation in one case becomes a
record instead of killing the run."""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.connection import Connection
from typing import Any, Callable

import torch

# (kind, one line) -> the record a failure becomes; kind is "timeout" or "crash"
Failure = Callable[[str, str], dict[str, Any]]


def one_line(e: BaseException, limit: int = 400) -> str:
    """The exception's type and first line."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:limit]


def _child(conn: Connection, fn: Callable[..., Any], args: tuple[Any, ...], failure: Failure) -> None:
    torch.set_num_threads(1)
    try:
        conn.send(fn(*args))
    except BaseException as e:  # noqa: BLE001 - report, never hang the parent
        conn.send(failure("crash", one_line(e)))
    finally:
        conn.close()


def isolated(fn: Callable[..., Any], args: tuple[Any, ...], timeout: float, failure: Failure) -> dict[str, Any]:
    """`fn(*args)` in a forked child (not daemonic: validate runs the runtime in
    processes of its own), with its wall seconds; a timeout or a dead child
    becomes `failure`'s record."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    t0 = time.perf_counter()
    proc = ctx.Process(target=_child, args=(send, fn, args, failure), daemon=False)
    proc.start()
    send.close()  # the child holds the write end; EOF on recv means it died
    record: dict[str, Any] | None = None
    timed_out = False
    try:
        if recv.poll(timeout):  # also True when the child died (EOF)
            record = recv.recv()
        else:
            timed_out = True
    except EOFError:
        pass
    finally:
        recv.close()
    if record is None:
        if timed_out:
            proc.kill()
            record = failure("timeout", f"timeout after {timeout:.0f}s")
        else:
            proc.join(30)
            code = proc.exitcode
            record = failure("crash", f"child died: signal {-code}" if code is not None and code < 0
                             else f"child died: exit {code}")
    proc.join(10)
    if proc.is_alive():  # stuck in interpreter teardown: the record is already in
        proc.kill()
        proc.join()
    record["seconds"] = round(time.perf_counter() - t0, 3)
    return record
