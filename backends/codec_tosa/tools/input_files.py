"""Input tuples from a user's file: ``codec-tosa compile --calibration FILE --inputs FILE``
and ``codec-tosa validate --inputs FILE`` (issue 50).

FILE is either

* an ``.npz`` whose arrays ``input_0``, ``input_1``, ... are the program's tensor
  inputs in order (as torch.export flattens them); each array is one input (the
  example's shape) or several stacked on a new first axis, so that
  ``np.savez("calibration.npz", input_0=np.stack(images))`` gives one tuple per image;
* or ``path/to/file.py:function``, a function of no arguments returning an iterable of
  input tuples, nested as the model takes them (a bare tensor is a tuple of one).

Every tuple is checked against the example's shapes and dtypes; a mismatch is one
line naming the file, the tuple and the input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch.utils import _pytree as pytree


class InputFileError(ValueError):
    """A calibration or input file that cannot be read as input tuples (one line)."""


def load_input_tuples(source: str, example: Sequence[Any], option: str = "--inputs") -> list[tuple[Any, ...]]:
    """The input tuples `source` holds, nested like `example` (the model's example inputs)."""
    leaves, structure = pytree.tree_flatten(tuple(example))
    if source.endswith(".npz"):
        flat = _from_npz(Path(source), leaves, option)
        cases = [tuple(pytree.tree_unflatten(list(f), structure)) for f in flat]
    elif ":" in source:
        cases = _from_function(source, option)
    else:
        raise InputFileError(f"{option} {source}: expected an .npz of input_0, input_1, ... or "
                             "path/to/file.py:function")
    if not cases:
        raise InputFileError(f"{option} {source}: holds no input tuple")
    for k, case in enumerate(cases):
        _check(case, leaves, f"{option} {source}: tuple {k}")
    return cases


def _from_npz(path: Path, leaves: list[Any], option: str) -> list[list[torch.Tensor]]:
    try:
        data = np.load(path)
    except (OSError, ValueError) as e:
        raise InputFileError(f"{option} {path}: cannot read ({e})") from None
    with data:
        names = [f"input_{i}" for i in range(len(leaves))]
        missing = [n for n in names if n not in data.files]
        if missing:
            raise InputFileError(f"{option} {path}: no array {missing[0]} (the model takes {len(leaves)} "
                                 f"tensor inputs: {', '.join(names)}; found {', '.join(data.files) or 'none'})")
        arrays = [data[n] for n in names]
    counts = set()
    for name, array, leaf in zip(names, arrays, leaves):
        shape = tuple(leaf.shape) if isinstance(leaf, torch.Tensor) else ()
        if array.shape == shape:
            counts.add(None)
        elif array.shape[1:] == shape:
            counts.add(array.shape[0])
        else:
            raise InputFileError(f"{option} {path}: {name} has shape {array.shape}; the model takes {shape} "
                                 f"(one input) or (N, {', '.join(map(str, shape))}) (N stacked)")
    if len(counts) != 1:
        raise InputFileError(f"{option} {path}: the arrays do not hold the same number of inputs "
                             f"({sorted(str(c or 1) for c in counts)})")
    (n,) = counts
    if n is None:
        return [[torch.from_numpy(np.array(a)) for a in arrays]]
    return [[torch.from_numpy(np.array(a[k])) for a in arrays] for k in range(n)]


def _from_function(source: str, option: str) -> list[tuple[Any, ...]]:
    # the model builders' resolver: importing it loads the example models' libraries
    from codec_tosa_examples.models import resolve_builder

    try:
        function = resolve_builder(source)
    except ValueError as e:
        raise InputFileError(f"{option} {source}: {e}") from None
    produced = function()
    try:
        items = list(produced)
    except TypeError:
        raise InputFileError(f"{option} {source}: the function returned {type(produced).__name__}, "
                             "not an iterable of input tuples") from None
    return [(c,) if isinstance(c, torch.Tensor) else tuple(c) for c in items]


def _check(case: tuple[Any, ...], leaves: list[Any], where: str) -> None:
    flat = pytree.tree_flatten(case)[0]
    if len(flat) != len(leaves):
        raise InputFileError(f"{where}: {len(flat)} tensor inputs; the model takes {len(leaves)}")
    for i, (x, leaf) in enumerate(zip(flat, leaves)):
        if not isinstance(leaf, torch.Tensor):
            continue
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(leaf.shape) or x.dtype != leaf.dtype:
            got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
            raise InputFileError(f"{where}: input {i} is {got}; the model takes {tuple(leaf.shape)} {leaf.dtype}")


__all__ = ["InputFileError", "load_input_tuples"]
