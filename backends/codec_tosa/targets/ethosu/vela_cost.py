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

import tempfile
import time
from typing import Any, Mapping, Sequence

import torch
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.targets.ethosu.vela_summary import read_vela_summary, vela_report


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
        candidate = self.quantizer.with_widths(self.prepared, bits, weight_bits)
        with torch.no_grad():
            program = torch.export.export(convert_pt2e(candidate), self.example)
        partitioner = arm_adapter.ethos_u_partitioner(arm_adapter.ethos_u_compile_spec(self.target))
        with tempfile.TemporaryDirectory(prefix="codec-tosa-search-") as d, arm_adapter.vela_runs_kept(d) as runs:
            try:
                to_edge_transform_and_lower(program, partitioner=[partitioner])
            except Exception:
                if not (runs and runs[-1].refused):
                    raise  # not Vela's verdict: a failure of ours or Arm's, not a price
                self._refusals[key] = runs[-1].refused
                return None
            kept = [{"summary": read_vela_summary(r.directory), "operators": {}} for r in runs]
        if not runs:
            raise ValueError(f"precision search: Arm's EthosUPartitioner delegated nothing of the model for "
                             f"{self.target}, so Vela has no cycles to price the widths by")
        return vela_report(kept)["cycles_total"]


__all__ = ["VelaCycles"]
