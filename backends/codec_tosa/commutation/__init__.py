"""The commutation table (data), the operator families the other stages test
operators against (`operators`), and the policies that select the table's variants."""

from codec_tosa.commutation.policy import DEFAULT_ORDER, PolicyOrder
from codec_tosa.commutation.table import CommutationTable, Row, operator_ports

__all__ = ["DEFAULT_ORDER", "PolicyOrder", "CommutationTable", "Row", "operator_ports"]
