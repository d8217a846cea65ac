"""The named data a program's delegates read at init, each target's own
(`Target.named_data_keys`: our external weights, Vela's external blocks, XNNPACK's
external constants), checked against the .ptd that goes with the .pte (issue 52).

A .ptd that is missing, truncated or another program's is refused here in one line
naming the file, before anything loads the program: ExecuTorch's own runtime reports
it only as an init error code, and XNNPACK in executorch 1.5.1 crashes the process on
a program whose external constants have no .ptd."""

from __future__ import annotations

from pathlib import Path

from codec_tosa.runtime.pte import NamedData, PteError, delegates, named_data_in_pte, ptd_beside, read_ptd
from codec_tosa.targets import target_in


def needed_keys(data: bytes, path: str | Path = "<bytes>") -> dict[str, tuple[int, int | None]]:
    """Every named-data key the program's delegates read at init: key -> (the first
    delegate that reads it, its size in bytes or None where the target does not say)."""
    needed: dict[str, tuple[int, int | None]] = {}
    for d in delegates(data, path):
        target = target_in([d.backend_id])
        if target is None:
            continue
        for key, nbytes in target.named_data_keys(d.payload).items():
            needed.setdefault(key, (d.index, nbytes))
    return needed


def external_keys(data: bytes, path: str | Path = "<bytes>") -> dict[str, tuple[int, int | None]]:
    """The keys of `needed_keys` the .pte does not hold itself: what a .ptd must."""
    in_pte = named_data_in_pte(data)
    return {key: where for key, where in needed_keys(data, path).items() if key not in in_pte}


def check_named_data(data: bytes, ptd: NamedData | None, pte: str | Path) -> None:
    """Raises PteError (one line) unless `ptd` holds every key the program reads and
    does not hold itself, at its size."""
    needed = external_keys(data, pte)
    if not needed:
        return
    if ptd is None:
        index, _ = next(iter(needed.values()))
        raise PteError(f"{ptd_beside(pte)}: missing: delegate {index} of {pte} reads {len(needed)} blobs of named "
                       "data from it (write the .ptd beside the .pte, as compile and codec_tosa.save do)")
    for key, (index, nbytes) in needed.items():
        blob = ptd.get(key)
        if blob is None:
            raise PteError(f"{ptd.name}: not the named data of {pte}: delegate {index} reads key {key}, "
                           f"which it does not hold")
        if nbytes is not None and len(blob) != nbytes:
            raise PteError(f"{ptd.name}: not the named data of {pte}: key {key} holds {len(blob)} bytes, "
                           f"delegate {index} reads {nbytes}")


def named_data_for(pte: str | Path, data: bytes, ptd: str | Path | None = None) -> NamedData | None:
    """The .ptd that goes with the .pte at `pte` (bytes `data`), checked: `ptd`, else
    the one beside it (model.ptd), if any. None when there is none and none is needed.
    Raises PteError (one line, naming the file) when it is missing but needed,
    unreadable, truncated, or another program's."""
    path = Path(ptd) if ptd is not None else ptd_beside(pte)
    named = read_ptd(path) if ptd is not None or path.is_file() else None
    check_named_data(data, named, pte)
    return named


__all__ = ["check_named_data", "external_keys", "named_data_for", "needed_keys"]
