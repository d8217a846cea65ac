"""Inputs and outputs as torch.export flattens them (issue 27).

A model may take and return tuples, lists and dicts of tensors (an LSTM's
``(x, (h0, c0))``); `torch.export` flattens them with PyTorch's pytree into the
program's flat list of placeholders and outputs, and an ExecuTorch program
takes and returns those flat lists. Calibration, the simulation, reference_io
and validate all work on the flat leaves; this module is the one place that
flattens, in the same order torch.export does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch.export.graph_signature import ExportGraphSignature, OutputKind
from torch.utils import _pytree as pytree


def leaves(tree: Any) -> list[Any]:
    """The leaves of `tree` in torch.export's order (a tensor is its own one leaf)."""
    return pytree.tree_flatten(tree)[0]


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """The tensor leaves of a model's output (a `ModelOutput`-like mapping too)."""
    if isinstance(tree, Mapping) and not isinstance(tree, dict):
        tree = dict(tree)  # ModelOutput-like: an ordered mapping pytree may not know
    return [t for t in leaves(tree) if isinstance(t, torch.Tensor)]


def map_tensors(tree: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`tree` with `fn` applied to every tensor leaf, structure kept."""
    return pytree.tree_map(lambda t: fn(t) if isinstance(t, torch.Tensor) else t, tree)


def returned_outputs(signature: ExportGraphSignature, outputs: Sequence[Any]) -> list[Any]:
    """Of a program's graph outputs (values, or the output node's arguments), those
    its caller gets back: all but the new values of the buffers it mutates (a KV
    cache's next state), which ExecuTorch writes back in place and neither the
    runtime nor eager returns (issue 51). `outputs` as they are where they do not
    line up with `signature`'s output specs."""
    specs = signature.output_specs
    if len(specs) != len(outputs):
        return list(outputs)
    return [o for o, spec in zip(outputs, specs) if spec.kind != OutputKind.BUFFER_MUTATION]


__all__ = ["leaves", "map_tensors", "returned_outputs", "tensor_leaves"]
