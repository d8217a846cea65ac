"""codec_tosa: non-local codec placement for ExecuTorch TOSA delegates.

Public API: `analyze`, `CommutationTable`, `PolicyOrder`, `Row`, `CodecSpec`,
`CodecTosaPartitioner` (mixed policies), `CodecQuantizer` (the plan as a PT2E
quantizer, for integer targets), `CodecTosaBackend`, and `save` (a lowered
program with what `codec-tosa validate` needs). The ExecuTorch-facing names
are imported on first use, so that `import codec_tosa` does not load
executorch's Arm backend (analysing a program still loads the parts of
executorch it uses).
"""

from typing import Any

from codec_tosa.tools.model_libs import repair_torchvision

# torchvision's CUDA wheel cannot import beside CPU torch unless two operator
# schemas exist first; define them (only where its C extension cannot load),
# so that `import codec_tosa` then `import torchvision` works
repair_torchvision()

from codec_tosa.analysis import Analysis, analyze
from codec_tosa.commutation import CommutationTable, PolicyOrder, Row
from codec_tosa.placement import PLACEMENTS

_LAZY = {
    "CodecSpec": "codec_tosa.spec",
    "CodecTosaPartitioner": "codec_tosa.partitioner",
    "CodecQuantizer": "codec_tosa.quantizer",
    "CodecTosaBackend": "codec_tosa.backend",
    "save": "codec_tosa.tools.save",
}

__all__ = ["Analysis", "analyze", "CommutationTable", "PolicyOrder", "Row", "PLACEMENTS", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'codec_tosa' has no attribute {name!r}")
