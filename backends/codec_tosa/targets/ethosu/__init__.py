"""Ethos-U: Arm's EthosUBackend (Vela), its figures and its cost for the precision search."""
