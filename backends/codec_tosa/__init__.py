"""codec_tosa: non-local codec placement for ExecuTorch TOSA delegates.

Public API: `analyze`, `CommutationTable`, `PolicyOrder`, `Row`, `CodecSpec`,
`CodecTosaPartitioner` (mixed policies), `CodecQuantizer` (the plan as a PT2E
quantizer, for integer targets), `CodecTosaBackend`, and `save` (a lowered
program with what `codec-tosa validate` needs). The ExecuTorch-facing names
are imported on first use, so that `import codec_tosa` does not load
executorch's Arm backend (analysing a program still loads the parts of
executorch it uses).
"""

import importlib
from typing import Any

from codec_tosa.commutation import CommutationTable, PolicyOrder, Row
from codec_tosa.placement import PLACEMENTS
from codec_tosa.planning.analysis import Analysis, analyze

_LAZY = {
    "CodecSpec": "codec_tosa.spec",
    "CodecTosaPartitioner": "codec_tosa.targets.tosa.partitioner",
    "CodecQuantizer": "codec_tosa.quantizer.codec_quantizer",
    "CodecTosaBackend": "codec_tosa.targets.tosa.backend",
    "save": "codec_tosa.tools.save",
}

__all__ = ["Analysis", "analyze", "CommutationTable", "PolicyOrder", "Row", "PLACEMENTS", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'codec_tosa' has no attribute {name!r}")
