"""Weight rounding: which INT8 or INT4 code each weight element gets (docs/DESIGN.md,
"Weight rounding").

A weight codec fixes each output channel's scale (`codecs.int8`, `codecs.int4`:
max |w| over the code range); the rounding then picks the codes. ``nearest`` rounds
each element on its own, as Arm's quantizers and convert_pt2e do. ``gptq`` picks them
one input column at a time and moves each column's rounding error onto the columns
not yet rounded, weighted by how the layer's calibration inputs correlate (GPTQ:
Frantar et al., 2022, after Optimal Brain Quantization). It minimises the error of
the layer's *output* on that data, ``||W X - Q X||``, not of the weight itself.

Scales and code ranges stay the codec's, so TOSA, Vela and the simulation see an
ordinary INT8 or INT4 constant: only which codes it holds changes. The rounded
weight (``scale * code``) replaces the float weight in the calibrated module just
before convert_pt2e (`apply_rounded`), whose ``round(w / scale)`` then gives these
codes exactly. The search (`precision_search`) scores a weight at either width with
its rounded values (`observers.WeightObserver.rounded`).

Rounded here: ``aten.conv2d`` (grouped and depthwise too, one problem per group)
and ``aten.linear`` with one output channel per row of a weight that no other
operator reads. Any other weighted operator keeps nearest rounding.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx

from codec_tosa.quantizer.observers import FakeQuantising, WeightObserver, weight_range

# the ridge GPTQ adds to the input correlation, as a fraction of its mean diagonal
# (the paper's 1%): keeps the inverse defined where inputs are collinear
DAMPING = 0.01
# columns whose error is spread lazily as one matrix product (the paper's blocks)
BLOCK = 128
# input columns (batch x output positions) one layer's correlation is estimated on:
# more only costs time
MAX_SAMPLES = 1 << 16

_CONV, _LINEAR = "aten.conv2d.default", "aten.linear.default"


class _Layer:
    """One rounded weight: its operator node, observer and accumulated input correlation.

    A deep layer sees few samples per input (ResNet-18 at 128x128: 16 positions of
    4,608 columns), so its samples take far less memory than its correlation (170 MB in
    double): they are kept as they come, and summed into the correlation only once they
    outnumber its columns, or when the layer is rounded (`correlation`). The sum is the
    same either way (`_summed`)."""

    def __init__(self, node: torch.fx.Node, observer: WeightObserver) -> None:
        self.node, self.observer = node, observer
        self.hessian: torch.Tensor | None = None  # [groups, columns, columns]
        self.pending: list[torch.Tensor] = []  # samples not yet in `hessian`, in order
        self.samples = 0

    def width(self) -> int:
        """Its correlation's columns: one group's weight columns."""
        assert self.observer.weight is not None
        return self.observer.weight[0].numel()

    @property
    def groups(self) -> int:
        return int(self.node.args[6]) if str(self.node.target) == _CONV and len(self.node.args) > 6 else 1

    def columns(self, x: torch.Tensor) -> torch.Tensor:
        """`x` as the samples the weight multiplies: [groups, one group's weight columns
        (input channels x kernel positions, or input features), samples]."""
        if str(self.node.target) == _LINEAR:
            cols = x.reshape(-1, x.shape[-1]).T
            return cols.unsqueeze(0)
        w = self.observer.weight
        assert w is not None
        args = list(self.node.args) + [None] * (7 - len(self.node.args))
        stride, padding, dilation = (a if a is not None else d for a, d in
                                     zip(args[3:6], ([1, 1], [0, 0], [1, 1])))
        unfolded = torch.nn.functional.unfold(x, tuple(w.shape[2:]), dilation=tuple(dilation),
                                              padding=tuple(padding), stride=tuple(stride))  # [B, C*kh*kw, L]
        batch, rows, positions = unfolded.shape
        # a group's input channels are contiguous, and unfold orders (channel, kh, kw)
        # as the weight does
        return unfolded.reshape(batch, self.groups, rows // self.groups, positions) \
            .permute(1, 2, 0, 3).reshape(self.groups, rows // self.groups, batch * positions)

    def observe(self, x: torch.Tensor, per_input: int) -> None:
        cols = self.columns(x.detach().float())
        if cols.shape[-1] > per_input:  # evenly spaced positions, the same on every input
            cols = cols[..., torch.linspace(0, cols.shape[-1] - 1, per_input).long()]
        self.pending.append(cols)
        self.samples += cols.shape[-1]
        if sum(c.shape[-1] for c in self.pending) > cols.shape[-2]:  # the correlation is the smaller
            self.hessian, self.pending = _summed(self.hessian, self.pending), []

    def correlation(self) -> Callable[[], torch.Tensor]:
        """What makes the mean correlation (sum / samples), a new matrix at each call
        (`_inverse_factor` overwrites it); the layer lets go of its sum and samples. A
        sum made while observing is kept to copy from: twice its size while factored."""
        hessian, pending, samples = self.hessian, self.pending, self.samples
        self.hessian, self.pending = None, []

        def make() -> torch.Tensor:
            summed = _summed(None if hessian is None else hessian.clone(), pending)
            assert summed is not None
            return summed.div_(samples)
        return make


def _summed(hessian: torch.Tensor | None, samples: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """`hessian` (None: nothing yet) plus each of `samples`' ``cols @ cols.T``, in order:
    each product in float, added in double (float to double is exact), in place."""
    for cols in samples:
        h = cols @ cols.transpose(1, 2)
        if hessian is None:
            hessian = h.double()
        else:
            for r0 in range(0, h.shape[-2], BLOCK):  # whole, add_ would first make a double copy of h
                hessian[..., r0:r0 + BLOCK, :].add_(h[..., r0:r0 + BLOCK, :])
        del h  # before the next product is made
    return hessian


def roundable(node: torch.fx.Node, observer: WeightObserver) -> str:
    """Why `node`'s weight keeps nearest rounding ("" if GPTQ rounds it)."""
    target = str(node.target)
    if target not in (_CONV, _LINEAR):
        return f"{target}: nearest rounding (GPTQ here rounds conv2d and linear)"
    if observer.ch_axis not in (0, None):
        return f"{target}: nearest rounding (scales along axis {observer.ch_axis})"
    if target == _CONV and any(isinstance(a, str) for a in node.args[3:6]):
        return f"{target}: nearest rounding (string padding)"
    source = node.args[1]
    weight = source.args[0] if isinstance(source, torch.fx.Node) and source.op == "call_module" else None
    if not isinstance(weight, torch.fx.Node) or weight.op != "get_attr":
        return f"{target}: nearest rounding (its weight is not a constant of the module)"
    if len(weight.users) != 1:
        return f"{target}: nearest rounding (its weight is shared)"
    return ""


def round_weights(prepared: torch.fx.GraphModule, data: Sequence[Sequence[Any]],
                  widths: Sequence[int]) -> dict[str, str]:
    """GPTQ codes at each of `widths` (8, 4) for every weight of calibrated `prepared`
    this module rounds, kept on its observer (`WeightObserver.rounded`); the inputs
    are `data`'s, as the quantized module sees them (every observer fake-quantising at
    its annotated width). Returns, by operator node, why a weight was not rounded."""
    modules = dict(prepared.named_modules())
    layers: dict[str, _Layer] = {}
    skipped: dict[str, str] = {}
    for node in prepared.graph.nodes:
        if node.op != "call_function" or len(node.args) < 2 or not isinstance(node.args[1], torch.fx.Node):
            continue
        source = node.args[1]
        observer = modules.get(str(source.target)) if source.op == "call_module" else None
        if not isinstance(observer, WeightObserver) or observer.weight is None:
            continue
        why = roundable(node, observer)
        if why:
            skipped[node.name] = why
        else:
            layers[node.name] = _Layer(node, observer)
    if not layers:
        return skipped
    capture = _Capture(prepared, layers, max(MAX_SAMPLES // max(len(data), 1), 1))
    with torch.no_grad(), FakeQuantising(prepared):
        for x in data:
            capture.run(*x)
    # the largest correlation first, while the fewest rounded weights are kept beside it
    # (each layer is rounded on its own, in any order)
    for layer in sorted(layers.values(), key=_Layer.width, reverse=True):
        layer.observer.rounded = _rounded(layer, widths)
        _heap_trimmed()
    return skipped


def _heap_trimmed() -> None:
    """Hand the C heap's free memory back to the system (glibc's ``malloc_trim``; where
    there is none, nothing). A layer's working tensors under 32 MB (ResNet-18's: its
    weight in double, its codes) come from glibc's heap, which keeps them once freed:
    without this, the next layer's correlation is made on top of them (ResNet-18: 70
    MB more at the third 4,608-column layer, and 90 MB more after the rounding)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim if sys.platform == "linux" else None
    except (AttributeError, OSError):  # not glibc (musl has none)
        return None


def _rounded(layer: _Layer, widths: Sequence[int]) -> dict[int, torch.Tensor]:
    """`layer`'s weight rounded by GPTQ at each of `widths`; its correlation, factor and
    working copies are gone when this returns, before the next layer's are made."""
    obs = layer.observer
    assert obs.weight is not None and (layer.hessian is not None or layer.pending)
    factor = _inverse_factor(layer.correlation())
    weight = obs.weight.double()
    rows = weight.shape[0]
    w = weight.reshape(layer.groups, rows // layer.groups, -1)
    rounded: dict[int, torch.Tensor] = {}
    for bits in widths:
        scales = obs.scales(bits).double()
        s = (scales.expand(rows) if scales.numel() == 1 else scales).reshape(layer.groups, -1, 1)
        codes = gptq_codes(w, factor, s, weight_range(bits)[1])
        rounded[bits] = (codes * s).reshape(weight.shape).to(obs.weight.dtype)
    return rounded


class _Capture(torch.fx.Interpreter):
    """Runs the module, adding each rounded layer's input to its correlation."""

    def __init__(self, gm: torch.fx.GraphModule, layers: Mapping[str, _Layer], per_input: int) -> None:
        super().__init__(gm)
        self.layers, self.per_input = layers, per_input

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.name in self.layers:
            self.layers[n.name].observe(self.env[n.args[0]], self.per_input)  # type: ignore[index]
        return super().run_node(n)


def gptq(weight: torch.Tensor, hessian: torch.Tensor, scales: torch.Tensor, qmax: int) -> torch.Tensor:
    """GPTQ's codes, in [-qmax, qmax], for `weight` [groups, rows, columns] with input
    correlation `hessian` [groups, columns, columns] and per-row `scales` [groups, rows, 1]:
    column by column, each column's code the nearest to its error-corrected value, the
    error spread over the later columns through the Cholesky factor of the inverse."""
    return gptq_codes(weight, inverse_factor(hessian), scales, qmax)


def inverse_factor(hessian: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The upper Cholesky factor of the ridged correlation's inverse, and the inputs
    that are always zero; None if no ridge up to 100x makes it positive definite.
    One per layer, whatever the widths rounded with it."""
    return _inverse_factor(hessian.clone)


def _inverse_factor(correlation: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`inverse_factor` of the matrix h that `correlation()` makes, in h's own memory.

    ``cholesky(h + ridge * eye)``, its ``cholesky_inverse`` and that one's upper factor
    would each be a new matrix of h's size (ResNet-18's last convolutions: 170 MB
    each). Here the ridge goes onto h's diagonal, and LAPACK factors, inverts and
    factors again in place, in h's column-major view (`h.mT`: the layout torch would
    copy h into). The numbers are those of the three calls, bit for bit: h is first
    made what the sum would be (`_as_summed`). A failed ridge leaves h overwritten, so
    the next one starts from a new h."""
    h = correlation()
    dead = torch.diagonal(h, dim1=-2, dim2=-1) == 0  # an input that is always zero: its weights do not matter
    mean = _as_summed(h)
    if not bool(torch.isfinite(mean).all()):
        # an infinite input: ``h + ridge * eye`` is NaN off its diagonal, which no ridge
        # makes positive definite
        return None
    diag = torch.diagonal(h, dim1=-2, dim2=-1).clone()
    info = torch.empty(h.shape[:-2], dtype=torch.int32)
    for attempt, damping in enumerate((DAMPING, DAMPING * 10, DAMPING * 100)):
        if attempt:
            del h, work  # the failed ridge's, before the next h is made
            h = correlation()
            _as_summed(h)
        torch.diagonal(h, dim1=-2, dim2=-1).copy_(diag).add_(damping * mean[:, None])
        work = h.mT
        torch.linalg.cholesky_ex(work, out=(work, info))
        if bool(info.any()):
            continue
        torch.cholesky_inverse(work, out=work)
        torch.linalg.cholesky_ex(work, upper=True, out=(work, info))
        if not bool(info.any()):
            return work, dead
    return None


def _as_summed(h: torch.Tensor) -> torch.Tensor:
    """h as ``h + ridge * eye`` would hold it, but for the ridge, in place: the always-zero
    inputs' diagonal 1, 0.0 for -0.0 (the sum adds +0.0 off the diagonal), and the lower
    triangle, the one torch's Cholesky reads, mirrored onto the upper one, which LAPACK
    reads of the column-major view. Returns the diagonal's mean (the ridge's unit)."""
    diag = torch.diagonal(h, dim1=-2, dim2=-1)
    diag[diag == 0] = 1.0
    h.add_(0.0)
    _mirror_lower(h)
    return diag.mean(-1)


def _mirror_lower(h: torch.Tensor) -> None:
    """Copies h's lower triangle onto its upper one, in place, a band of rows at a time."""
    n = h.shape[-1]
    for r0 in range(0, n, BLOCK):
        r1 = min(r0 + BLOCK, n)
        block = h[..., r0:r1, r0:r1]
        lower = torch.ones(r1 - r0, r1 - r0, dtype=torch.bool).tril()
        block.copy_(torch.where(lower, block, block.mT))
        h[..., r0:r1, r1:].copy_(h[..., r1:, r0:r1].mT)


def gptq_codes(weight: torch.Tensor, factor: tuple[torch.Tensor, torch.Tensor] | None, scales: torch.Tensor,
               qmax: int) -> torch.Tensor:
    """`gptq` given the layer's `inverse_factor` (None: nearest rounding)."""
    if factor is None:  # no positive-definite correlation even ridged
        return torch.clamp(torch.round(weight / scales), -qmax, qmax)
    u, dead = factor
    w = weight.clone().masked_fill_(dead[:, None, :], 0.0)
    cols = w.shape[-1]
    codes = torch.zeros_like(w)
    s = scales[..., 0]
    for b0 in range(0, cols, BLOCK):
        b1 = min(b0 + BLOCK, cols)
        block = w[..., b0:b1].clone()
        errors = torch.zeros_like(block)
        ub = u[:, b0:b1, b0:b1]
        for j in range(b1 - b0):
            col = block[..., j]
            q = torch.clamp(torch.round(col / s), -qmax, qmax)
            codes[..., b0 + j] = q
            err = (col - q * s) / ub[:, j, j][:, None]
            block[..., j:] -= err[..., None] * ub[:, j, j:][:, None, :]
            errors[..., j] = err
        w[..., b1:] -= errors @ u[:, b0:b1, b1:]
    return codes


def apply_rounded(gm: torch.fx.GraphModule) -> None:
    """Every rounded weight of prepared `gm` as its observer's width rounds it (the
    float weight where that width has no rounding): what convert_pt2e then encodes."""
    modules = dict(gm.named_modules())
    for node in gm.graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(str(node.target)), WeightObserver):
            continue
        obs = modules[str(node.target)]
        source = node.args[0]
        if not obs.rounded or not isinstance(source, torch.fx.Node) or source.op != "get_attr":
            continue
        value = obs.rounded.get(obs.bits, obs.weight)
        path, _, name = str(source.target).rpartition(".")
        owner = gm.get_submodule(path) if path else gm
        setattr(owner, name, torch.nn.Parameter(value.clone(), requires_grad=False))


__all__ = ["apply_rounded", "gptq", "round_weights"]
