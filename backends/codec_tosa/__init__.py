"""codec_tosa: non-local codec placement for ExecuTorch TOSA delegates.

Public API: `analyze`, `CommutationTable`, `PolicyOrder`, and (with the
backend) `CodecSpec`, `CodecTosaPartitioner`, `CodecTosaBackend`.
"""

from codec_tosa.analysis import Analysis, analyze
from codec_tosa.commutation import CommutationTable, PolicyOrder, Row
from codec_tosa.placement import PLACEMENTS

__all__ = ["Analysis", "analyze", "CommutationTable", "PolicyOrder", "Row", "PLACEMENTS"]
