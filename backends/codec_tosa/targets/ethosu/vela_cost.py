"""Vela's cycles for one width assignment: the precision search's cost on Ethos-U
(docs/DESIGN.md, "Precision per domain").

On Ethos-U an INT16 domain's price is not its bytes. Vela runs int16 activations at
half the MAC rate, and an INT16 domain adds RESCALE and CLAMP layers where the INT8
one fuses them into its convolution. Per byte, one INT16 group can therefore cost
several times what another does. (ResNet-8 on U85-256: a conv block's cycles double,
a 1x1 shortcut's barely move; docs/results/precision.md.) So on an Ethos-U target the
search asks Vela.

A candidate is the calibrated module with those widths (`CodecQuantizer.with_widths`,
a copy). It goes through `convert_pt2e` and export, and is lowered with Arm's stock
`EthosUPartitioner`, exactly as the user's flow will lower it. Its cost is Vela's
``cycles_total``, summed over the delegates. That is one lowering per candidate
(about 13 s for ResNet-8 here), cached by widths.

Vela may refuse a candidate: on U55-128, MobileNetV2's int16 convolutions fail with
"Non-passthrough operation (Conv2D) could not run on NPU", stock a16w8 included
(docs/results/precision.md). Such a candidate costs None and `refusal` says why; the
search leaves that group at INT8.

Vela's per-layer CSV would price every group from two lowerings. It names layers by
Arm's TOSA tensor names, though (``tosa_rescale_default_3``), and those cannot be
traced back to our domains, so it is not used.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Mapping, Sequence, TypeVar

import torch
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.targets.ethosu.vela_summary import read_vela_summary, vela_report

_T = TypeVar("_T")


class VelaCycles:
    """Vela's cycles of `prepared` (calibrated by `quantizer`) at given widths."""

    def __init__(self, quantizer: Any, prepared: torch.fx.GraphModule, example: Sequence[Any],
                 target: str) -> None:
        self.quantizer, self.prepared, self.example, self.target = quantizer, prepared, tuple(example), target
        self._cycles: dict[tuple[tuple[int, ...], tuple[int, ...]], int | None] = {}
        self._refusals: dict[tuple[tuple[int, ...], tuple[int, ...]], str] = {}
        self.seconds = 0.0  # spent lowering and in Vela

    @property
    def lowerings(self) -> int:
        return len(self._cycles)

    def __call__(self, bits: Mapping[int, int], weight_bits: Mapping[int, int]) -> int | None:
        """The cycles, or None where Vela refuses these widths (`refusal` says why)."""
        key = self._key(bits, weight_bits)
        if key not in self._cycles:
            start = time.perf_counter()
            self._cycles[key] = self._lower(key, bits, weight_bits)
            self.seconds += time.perf_counter() - start
        return self._cycles[key]

    def refusal(self, bits: Mapping[int, int], weight_bits: Mapping[int, int]) -> str:
        """Vela's error for widths it refused ("" otherwise, or if not yet lowered)."""
        return self._refusals.get(self._key(bits, weight_bits), "")

    @staticmethod
    def _key(bits: Mapping[int, int], weight_bits: Mapping[int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(bits[d] for d in sorted(bits)), tuple(weight_bits[op] for op in sorted(weight_bits))

    def _lower(self, key: tuple[tuple[int, ...], tuple[int, ...]], bits: Mapping[int, int],
               weight_bits: Mapping[int, int]) -> int | None:
        if _FORKS:
            summaries, refused = _in_child_process(lambda: self._set_and_lowered(bits, weight_bits))
        else:
            with arm_adapter.lowering_tables_emptied():
                summaries, refused = self._vela_summaries(self.quantizer.with_widths(self.prepared, bits, weight_bits))
        if refused:
            self._refusals[key] = refused
            return None
        if not summaries:
            raise ValueError(f"precision search: Arm's EthosUPartitioner delegated nothing of the model for "
                             f"{self.target}, so Vela has no cycles to price the widths by")
        return vela_report([{"summary": s, "operators": {}} for s in summaries])["cycles_total"]

    def _set_and_lowered(self, bits: Mapping[int, int], weight_bits: Mapping[int, int]
                         ) -> tuple[list[dict[str, Any]], str]:
        """In a child process: `prepared` itself, no copy, takes the widths (the
        parent's is untouched) and is lowered."""
        self.quantizer.set_widths(self.prepared, bits, weight_bits)
        return self._vela_summaries(self.prepared)

    def _vela_summaries(self, candidate: torch.fx.GraphModule) -> tuple[list[dict[str, Any]], str]:
        """Vela's summary of each delegate of calibrated `candidate`, and ""; or no
        summaries and Vela's error where Vela refuses it."""
        partitioner = arm_adapter.ethos_u_partitioner(arm_adapter.ethos_u_compile_spec(self.target))
        with tempfile.TemporaryDirectory(prefix="codec-tosa-search-") as d, arm_adapter.vela_runs_kept(d) as runs:
            with torch.no_grad():
                program = torch.export.export(convert_pt2e(candidate), self.example)
            try:
                to_edge_transform_and_lower(program, partitioner=[partitioner])
            except Exception:
                if not (runs and runs[-1].refused):
                    raise  # not Vela's verdict: a failure of ours or Arm's, not a price
                return [], runs[-1].refused
            return [read_vela_summary(r.directory) for r in runs], ""


# fork where it is safe: macOS's fork is not, with threads, and Windows has none
_FORKS = sys.platform == "linux"


def _in_child_process(work: Callable[[], _T]) -> _T:
    """`work()`, run in a forked child process.

    A candidate's lowering builds some 100 MB (ResNet-18) that is dropped once Vela
    has priced it, but the process would not get it back: module-level tables of
    torch, torchao and ExecuTorch keep parts of every lowering, and the allocator keeps
    the rest. A forked child shares the parent's pages until it writes them, and
    returns all it made when it exits: the search's peak is the parent's plus one
    lowering's, however many candidates it prices. The result, or the exception,
    comes back pickled; the child runs torch on one thread (a forked OpenMP pool
    hangs). Without fork (`_FORKS`) the lowering runs in this process, and what the
    tables keep of it is dropped after it (`lowering_tables_emptied`)."""
    sys.stdout.flush()
    sys.stderr.flush()  # else what is buffered is printed twice, once by the child
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(read)
            gc.freeze()  # the parent's objects: its collections do not touch (copy) their pages
            torch.set_num_threads(1)
            outcome = _outcome(work)
            with os.fdopen(write, "wb") as pipe:
                pipe.write(outcome)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        outcome = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not outcome:
        raise RuntimeError(f"precision search: the child process lowering a candidate died ({status:#x})")
    ok, value = pickle.loads(outcome)
    if not ok:
        raise value
    return value


def _outcome(work: Callable[[], Any]) -> bytes:
    """(True, work()) or (False, the exception it raised, its traceback noted), pickled."""
    try:
        return pickle.dumps((True, work()))
    except Exception as e:  # noqa: BLE001 (every failure goes back to the parent)
        e.add_note("".join(traceback.format_exception(e)))  # where, in the child
        try:
            return pickle.dumps((False, e))
        except Exception:  # noqa: BLE001 (an exception that does not pickle)
            return pickle.dumps((False, RuntimeError("".join(traceback.format_exception(e)))))


__all__ = ["VelaCycles"]
