"""Vela's figures for the Ethos-U delegates of any .pte, ours or stock Arm's (issue 50).

An `EthosUBackend` payload is Vela's command stream: cycles, SRAM and off-chip bytes
are not in it. They are Vela's estimate for the TOSA it compiled, so they are found
again by running Vela on that TOSA with the delegate's own compile flags, which the
.pte records (Vela is deterministic: the figures equal those of the run that made the
delegate). The TOSA is found beside the .pte (``model.tosa``, ``model_1.tosa``, ...:
what `codec-tosa compile` and `codec_tosa.save` write) or where Arm's own option
``EthosUCompileSpec.dump_intermediate_artifacts_to(DIR)`` wrote it (the .pte records
DIR; Arm names each delegate's TOSA ``output_<tag>_<TOSA spec>.tosa``).
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any, Sequence

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.runtime.pte import Delegate
from codec_tosa.targets.artefacts import delegate_file
from codec_tosa.targets.ethosu.vela_summary import read_vela_summary, vela_operator_counts, vela_report

# the compile-spec keys Arm's Ethos-U delegates record (ArmCompileSpec)
COMPILE_FLAGS = "compile_flags"
DUMP_DIRECTORY = "debug_artifact_path"
_TAG = re.compile(r"output_tag(\d+)_")


def ethos_u_delegates(found: Sequence[Delegate]) -> list[Delegate]:
    return [d for d in found if d.backend_id == arm_adapter.ETHOS_U_BACKEND_ID]


def delegate_tosa(found: Sequence[Delegate], pte: str | Path | None) -> dict[int, tuple[str, bytes]]:
    """Each VGF or Ethos-U delegate's TOSA (delegate index -> (where, bytes)) that can be
    found: beside the .pte, in the order compile and save write them, else (Ethos-U) in
    the directory Arm's ``dump_intermediate_artifacts_to`` recorded."""
    converted = [d for d in found if d.backend_id in (arm_adapter.ETHOS_U_BACKEND_ID, arm_adapter.VGF_BACKEND_ID)]
    out: dict[int, tuple[str, bytes]] = {}
    for k, d in enumerate(converted):
        beside = Path(pte).with_name(delegate_file(k, "tosa")) if pte is not None else None
        if beside is not None and beside.is_file():
            out[d.index] = (beside.name, beside.read_bytes())
    dumped = [d for d in ethos_u_delegates(found) if d.index not in out and d.arm_specs.get(DUMP_DIRECTORY)]
    for d, path in zip(dumped, _dumped_tosa(Path(dumped[0].arm_specs[DUMP_DIRECTORY])) if dumped else ()):
        out[d.index] = (str(path), path.read_bytes())
    return out


def _dumped_tosa(directory: Path) -> list[Path]:
    """Arm's per-delegate TOSA dumps in `directory`, in delegation-tag order."""
    files = [p for p in directory.glob("output_tag*.tosa") if _TAG.match(p.name)]
    return sorted(files, key=lambda p: int(_TAG.match(p.name)[1]))  # type: ignore[index]


def vela_figures(found: Sequence[Delegate], tosa: dict[int, tuple[str, bytes]],
                 program_cpu_ops: Sequence[str] = ()) -> dict[str, Any] | None:
    """report.json's ``vela`` for the Ethos-U delegates, Vela re-run on each one's TOSA
    with its compile flags; None when a delegate's TOSA was not found."""
    delegates = ethos_u_delegates(found)
    if not delegates or any(d.index not in tosa for d in delegates):
        return None
    runs = []
    for d in delegates:
        flags = d.arm_specs.get(COMPILE_FLAGS, "")
        with tempfile.TemporaryDirectory(prefix="codec-tosa-vela-") as directory:
            run = arm_adapter.run_vela(tosa[d.index][1], flags, directory)
            runs.append({"summary": read_vela_summary(directory), "operators": vela_operator_counts(run.log),
                         "compile_flags": flags})
    return vela_report(runs, program_cpu_ops)


MISSING = ("Vela figures: the TOSA Vela compiled is not beside the .pte; write it with codec_tosa.save, or lower "
           "with EthosUCompileSpec(...).dump_intermediate_artifacts_to(DIR) (Arm's option), and run report again")


__all__ = ["MISSING", "delegate_tosa", "ethos_u_delegates", "vela_figures"]
