"""Validation: the plan's integer simulation, the TOSA reference model, reference
inputs and outputs, and the checks `codec-tosa validate` runs."""
