"""Rewrites of the graph a PT2E quantizer annotates into operators XNNPACK runs on codes.

`CodecQuantizer` for XNNPACK applies them in `transform_for_annotation`
(docs/DESIGN.md, "XNNPACK"), before XNNPACK's own scalar-to-attribute
transform. Each replaces operators by ones that compute the same values:

* `chunks_to_slices`: ``chunk`` / ``split`` / ``split_with_sizes`` along one
  axis become one unit-step ``slice`` per output. XNNPACK has no split kernel
  (its partitioner leaves ``split_with_sizes_copy`` on the CPU, so ShuffleNetV2
  falls apart into 15 delegates with every boundary in FP32), but it runs a
  slice on codes when input and output share their parameters, which a split's
  outputs do in the plan (one domain with the split's input).
* `means_keep_dims`: a 4-D mean over H and W that drops them becomes the mean
  that keeps them (XNNPACK's global average pool takes only that) and a
  ``view`` to the dropped shape (a reshape, on codes); the axes are written as
  ``[2, 3]``.
* `contiguous_permutes`: ``transpose`` or ``permute`` followed by
  ``contiguous`` (ShuffleNet's channel shuffle) becomes one ``permute_copy``,
  whose result is contiguous already, so the ``contiguous`` goes. Left as it
  is, the ``contiguous`` is a ``_clone_dim_order`` in the edge program, which
  XNNPACK runs FP32 only: a decode and an encode per shuffle.
* `drop_eval_dropout`: a dropout with ``train=False`` is the identity. Left in
  the graph it is an operator XNNPACK does not run on codes between two that
  it does, which would cost a decode and an encode.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch
import torch.fx
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa._passes.pass_base import CodecPass, calls

aten = torch.ops.aten

_SPLITS = (aten.chunk.default, aten.split.Tensor, aten.split_with_sizes.default)


def _with_val(node: torch.fx.Node, fn: Callable[..., Any], *args: Any) -> torch.fx.Node:
    """Give `node` a meta["val"] computed by `fn` on its arguments' values (FakeTensors)."""
    from torch._guards import detect_fake_mode

    vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in args]
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is not None:
        with mode:
            node.meta["val"] = fn(*vals)
    else:
        node.meta["val"] = fn(*vals)
    return node


def _copy_meta(src: torch.fx.Node, dst: torch.fx.Node) -> None:
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node"):
        if key in src.meta:
            dst.meta[key] = src.meta[key]


def _insert(before: torch.fx.Node, fn: Any, args: tuple[Any, ...], meta_from: torch.fx.Node) -> torch.fx.Node:
    """A call of `fn` on `args` before `before`, with its value and `meta_from`'s provenance."""
    with before.graph.inserting_before(before):
        node = before.graph.call_function(fn, args)
    _with_val(node, fn, *args)
    _copy_meta(meta_from, node)
    return node


def _done(gm: torch.fx.GraphModule, done: int) -> int:
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


def _split_bounds(node: torch.fx.Node, size: int) -> list[tuple[int, int]] | None:
    """[(start, end) per output] of a split of an axis of `size` elements, or None."""
    if node.target == aten.split_with_sizes.default:
        sizes = [int(s) for s in node.args[1]]
    else:
        n = int(node.args[1])
        # chunk: n outputs of ceil(size / n); split: outputs of n elements; the last may be short
        step = -(-size // n) if node.target == aten.chunk.default and n > 0 else n
        sizes = [min(step, size - i) for i in range(0, size, step)] if step > 0 else []
    if not sizes or sum(sizes) != size:
        return None
    bounds, start = [], 0
    for s in sizes:
        bounds.append((start, start + s))
        start += s
    return bounds


def chunks_to_slices(gm: torch.fx.GraphModule) -> int:
    """Replace each static chunk/split whose outputs are read only through getitem
    by one slice per output read; returns how many splits were replaced."""
    graph, done = gm.graph, 0
    for node in calls(graph, *_SPLITS):
        x = node.args[0]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        users = list(node.users)
        if any(u.op != "call_function" or u.target is not operator.getitem for u in users):
            continue
        dim_of = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0))
        dim = int(dim_of) % val.dim()
        size = val.shape[dim]
        if not isinstance(size, int):
            continue  # a symbolic size: no static bounds
        bounds = _split_bounds(node, size)
        if bounds is None:
            continue
        for getitem in users:
            k = int(getitem.args[1])
            start, end = bounds[k]
            sl = _insert(getitem, aten.slice.Tensor, (x, dim, start, end, 1), node)
            getitem.replace_all_uses_with(sl)
            graph.erase_node(getitem)
        graph.erase_node(node)
        done += 1
    return _done(gm, done)


def means_keep_dims(gm: torch.fx.GraphModule) -> int:
    """Rewrite each 4-D ``mean.dim`` over H and W as XNNPACK's global average pool
    takes it (axes ``[2, 3]``, ``keepdim=True``), followed by a view to its shape
    when it dropped the axes; returns how many means were rewritten."""
    graph, done = gm.graph, 0
    for node in calls(graph, aten.mean.dim):
        if node.kwargs.get("dtype") is not None:
            continue
        x = node.args[0]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() != 4:
            continue
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = bool(node.args[2]) if len(node.args) > 2 else bool(node.kwargs.get("keepdim", False))
        if dims is None or sorted(int(d) % 4 for d in dims) != [2, 3]:
            continue
        if keepdim and list(dims) == [2, 3]:
            continue
        mean = _insert(node, aten.mean.dim, (x, [2, 3], True), node)
        out: torch.fx.Node = mean
        if not keepdim:
            out = _insert(node, aten.view.default, (mean, [int(s) for s in node.meta["val"].shape]), node)
        node.replace_all_uses_with(out)
        graph.erase_node(node)
        done += 1
    return _done(gm, done)


def contiguous_permutes(gm: torch.fx.GraphModule) -> int:
    """Replace each ``transpose``/``permute`` read only by a ``contiguous`` with one
    ``permute_copy``; returns how many pairs were replaced."""
    graph, done = gm.graph, 0
    for node in calls(graph, aten.contiguous.default):
        src = node.args[0]
        if (not isinstance(src, torch.fx.Node) or src.op != "call_function" or len(src.users) != 1
                or src.target not in (aten.transpose.int, aten.permute.default)):
            continue
        x = src.args[0]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        rank = val.dim()
        if src.target == aten.transpose.int:
            d0, d1 = int(src.args[1]) % rank, int(src.args[2]) % rank
            dims = list(range(rank))
            dims[d0], dims[d1] = dims[d1], dims[d0]
        else:
            dims = [int(d) % rank for d in src.args[1]]
        perm = _insert(node, aten.permute_copy.default, (x, dims), src)
        node.replace_all_uses_with(perm)
        graph.erase_node(node)
        graph.erase_node(src)
        done += 1
    return _done(gm, done)


def drop_eval_dropout(gm: torch.fx.GraphModule) -> int:
    """Remove every dropout with ``train=False`` (the identity); returns how many."""
    graph, done = gm.graph, 0
    for node in calls(graph, aten.dropout.default):
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train", True)
        if train:
            continue
        node.replace_all_uses_with(node.args[0])
        graph.erase_node(node)
        done += 1
    return _done(gm, done)


class XnnpackRewritesPass(CodecPass):
    """All of the above, in place; `count` is how many operators were rewritten."""

    def call(self, gm: torch.fx.GraphModule) -> PassResult:
        count = drop_eval_dropout(gm) + chunks_to_slices(gm) + means_keep_dims(gm) + contiguous_permutes(gm)
        return self.done(gm, count)


__all__ = ["chunks_to_slices", "contiguous_permutes", "drop_eval_dropout", "means_keep_dims", "XnnpackRewritesPass"]
