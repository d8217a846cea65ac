"""The names of the files `codec-tosa compile` writes, read back by validate and report."""

PTE = "model.pte"
PTD = "model.ptd"  # the named data (external weights) of model.pte, when it has any
REPORT = "report.json"
REFERENCE_IO = "reference_io.npz"


def delegate_file(k: int, suffix: str) -> str:
    """The file beside the .pte that holds delegate k's TOSA or VGF (`suffix` "tosa"
    or "vgf"): model.tosa for the first, model_1.tosa, ... for the others."""
    return f"model.{suffix}" if k == 0 else f"model_{k}.{suffix}"
