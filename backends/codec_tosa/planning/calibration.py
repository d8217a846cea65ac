"""Calibration: learn each domain's theta from the tensor at its absolute dominator
(or the union of the ranges at its dominators, after shared coalescence).

The range is the observed minimum and maximum (``minmax``), or the one
PyTorch's ``HistogramObserver`` picks (``histogram``): it clips rare outliers
where that lowers the L2 quantization error, and is what Arm's INT8 quantizer
observes activations with (``get_symmetric_quantization_config``)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from codec_tosa.codecs.base import Theta
from codec_tosa.codecs.int8 import DEFAULT_CODEC, QMAX, QMIN, Int8Affine
from codec_tosa.graph import PortGraph, user_input_nodes
from codec_tosa.placement.plan import Plan
from codec_tosa.pytrees import leaves, map_tensors


class CalibrationError(ValueError):
    """Calibration inputs or observed ranges are unusable; names the domain/node or input."""


def lifted_args(ep: ExportedProgram, user_inputs: Sequence[torch.Tensor],
                real_state: Mapping[str, torch.Tensor] | None = None) -> list[Any]:
    """Placeholder values of `ep.graph_module` in order: parameters, buffers, constants, inputs.

    `user_inputs` may be nested as the model takes them; the program's placeholders
    are their leaves. `real_state` replaces state-dict entries that are FakeTensors
    (see the partitioner).
    """
    args: list[Any] = []
    users = iter(leaves(tuple(user_inputs)))
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(users))
            continue
        t = ep.state_dict.get(spec.target) if spec.target in ep.state_dict else ep.constants.get(spec.target)
        if isinstance(t, FakeTensor):
            t = (real_state or {}).get(spec.target)
            if t is None:
                raise CalibrationError(
                    f"calibration: the value of {spec.target} is not available (the program holds "
                    "FakeTensors); lower with to_edge_transform_and_lower so that the partitioner "
                    "sees the real weights")
        args.append(t)
    return args


def check_calibration(ep: ExportedProgram, calibration: Sequence[Sequence[Any]]) -> list[list[torch.Tensor]]:
    """Each calibration entry's tensors as the program takes them (its pytree leaves,
    `pytrees.leaves`); refuses entries that do not fit the program, in one line."""
    if not calibration:
        raise CalibrationError("calibration: no input tuples given")
    expected = [n.meta["val"] for n in user_input_nodes(ep)]
    flat: list[list[torch.Tensor]] = []
    for i, entry in enumerate(calibration):
        if isinstance(entry, torch.Tensor) or not isinstance(entry, (tuple, list)):
            # a bare tensor would be read as a sequence of its first dimension's slices
            got = f"a tensor of shape {tuple(entry.shape)}" if isinstance(entry, torch.Tensor) \
                else type(entry).__name__
            raise CalibrationError(
                f"calibration input {i} is {got}: each entry must be a tuple of tensors, one per "
                f"program input, nested as the model takes them (e.g. calibration=[(x,), (y,)]; the "
                f"program takes {len(expected)})")
        inputs = leaves(tuple(entry))
        if len(inputs) != len(expected):
            raise CalibrationError(
                f"calibration input {i}: {len(inputs)} tensors, the program takes {len(expected)}")
        for k, (t, fake) in enumerate(zip(inputs, expected)):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(fake.shape):
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise CalibrationError(
                    f"calibration input {i}, tensor {k}: shape {got}, expected {tuple(fake.shape)}")
        flat.append(inputs)
    return flat


MINMAX = "minmax"
HISTOGRAM = "histogram"
OBSERVERS = (MINMAX, HISTOGRAM)
# Arm's get_symmetric_quantization_config: the smallest scale its observers give
HISTOGRAM_EPS = 2.0 ** -16


NO_FINITE_RANGE = "calibration produced no finite value, only infinities or NaNs: no range to code"


def finite_values(x: torch.Tensor) -> torch.Tensor | None:
    """What a range observer sees of `x`: its finite values, as float32 (flattened
    when some are not), or None when it has none. An INT8 code cannot hold an
    infinity or a NaN (quantize saturates an infinity at a code bound), so they say
    nothing about the range: atanh at +-1 or logit at 0 would otherwise leave the
    domain no finite scale."""
    if x.numel() == 0:
        return None
    seen = x.detach().float()
    finite = torch.isfinite(seen)
    if bool(finite.all()):
        return seen
    return seen[finite] if bool(finite.any()) else None


class _RangeObserver(torch.fx.Interpreter):
    """Min/max per watched node; with `histogram`, one HistogramObserver per
    domain, fed every tensor the domain is observed at."""

    def __init__(self, gm: torch.fx.GraphModule, watch: dict[str, list[int]], histogram: bool) -> None:
        super().__init__(gm)
        self.watch = watch
        self.lo: dict[str, float] = {}
        self.hi: dict[str, float] = {}
        self.histograms: dict[int, Any] = {}
        self.only_nonfinite: set[str] = set()  # watched nodes that gave a tensor with no finite value
        if histogram:
            # the observer Arm's quantizer uses (imported here: torchao is slow and loud to import)
            from torchao.quantization.pt2e import HistogramObserver

            for d in {d for ds in watch.values() for d in ds}:
                self.histograms[d] = HistogramObserver(
                    dtype=torch.int8, quant_min=QMIN, quant_max=QMAX, qscheme=torch.per_tensor_affine,
                    eps=HISTOGRAM_EPS)

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        if n.name not in self.watch or not isinstance(out, torch.Tensor):
            return out
        seen = finite_values(out)
        if seen is None:
            if out.numel():
                self.only_nonfinite.add(n.name)
            return out
        lo, hi = float(seen.min()), float(seen.max())
        self.lo[n.name] = min(lo, self.lo.get(n.name, math.inf))
        self.hi[n.name] = max(hi, self.hi.get(n.name, -math.inf))
        for d in self.watch[n.name] if self.histograms else ():
            self.histograms[d](seen)
        return out

    def histogram_range(self, d: int) -> tuple[float, float] | None:
        """The range HistogramObserver's qparams cover, or None if it saw nothing."""
        obs = self.histograms.get(d)
        if obs is None or obs.histogram.sum() == 0:
            return None
        scale, zero_point = obs.calculate_qparams()
        s, z = float(scale), int(zero_point)
        return (obs.quant_min - z) * s, (obs.quant_max - z) * s


def learn_thetas(
    ep: ExportedProgram,
    graph: PortGraph,
    plan: Plan,
    calibration: Sequence[Sequence[torch.Tensor]],
    codec: Int8Affine = DEFAULT_CODEC,
    real_state: Mapping[str, torch.Tensor] | None = None,
    observer: str | None = MINMAX,
) -> dict[int, Theta]:
    """Run the calibration inputs through `ep` and learn one theta per domain."""
    if observer not in OBSERVERS:
        raise CalibrationError(f"unknown observer {observer!r}: expected one of {', '.join(OBSERVERS)}")
    if not plan.domains:
        return {}
    flat = check_calibration(ep, calibration)
    learned = plan.domains
    where: dict[int, list[str]] = {}
    for d in learned:
        names = []
        for x, label in zip(d.observed, d.dominators):
            node = graph.fx_value_node[x]
            if node is None:
                raise CalibrationError(f"domain {d.id}: dominator {label} has no FX node")
            names.append(node.name)
        where[d.id] = names
    watch: dict[str, list[int]] = {}
    for d_id, names in where.items():
        for n in names:
            watch.setdefault(n, []).append(d_id)
    ranges = _RangeObserver(ep.graph_module, watch, histogram=observer == HISTOGRAM)
    # to_edge_transform_and_lower partitions under an active FakeTensorMode;
    # calibration needs real numbers
    with torch.no_grad(), unset_fake_temporarily():
        for inputs in flat:
            ranges.run(*lifted_args(ep, inputs, real_state))
    thetas: dict[int, Theta] = {}
    for d in learned:
        names = where[d.id]
        seen = [n for n in names if n in ranges.lo]  # empty tensors are not observed
        if not seen and ranges.only_nonfinite.intersection(names):
            raise CalibrationError(
                f"domain {d.id} (dominator {' + '.join(d.dominators)}, node {', '.join(names)}): "
                f"{NO_FINITE_RANGE}")
        lo = min((ranges.lo[n] for n in seen), default=0.0)
        hi = max((ranges.hi[n] for n in seen), default=0.0)
        # a constant domain (all zeros) has no spread to clip; its codec picks the scale
        clipped = ranges.histogram_range(d.id) if lo < hi else None
        thetas[d.id] = codec.learn(*(clipped or (lo, hi)))
    return thetas


def random_calibration(example_inputs: Sequence[Any], n: int = 4, seed: int = 0) -> list[tuple[Any, ...]]:
    """`n` seeded random input tuples drawn like `example_inputs` (used when the
    user gives no calibration data; validation draws its held-out samples the
    same way with another seed), nested like them (tuples, lists, dicts):

    * a floating-point tensor whose example reaches beyond -1 and beyond 1 is
      standard normal; one that does not (non-negative inputs of a sqrt, [-1, 1]
      inputs of an acos, images in [0, 1]) is uniform over the example's own
      range, so that an operator with a domain gets inputs inside it;
    * any other tensor (indices, masks, counts) is the example's, whose valid
      values are not known;
    * a tensor the example passes more than once (``mha(x, x, x)``) is drawn
      once per tuple and passed as often: torch.export specialises the program
      on the aliasing (self-attention reads only one of them)."""
    gen = torch.Generator().manual_seed(seed)

    def draw(t: torch.Tensor) -> torch.Tensor:
        if not t.dtype.is_floating_point or not t.numel():
            return t.clone()
        lo, hi = float(t.min()), float(t.max())
        # beyond [-1, 1] on both sides: a standard normal example; an example on
        # [-1, 1] exactly is an acos's or asin's domain (Arm's ramp tests)
        if lo < -1.0 and hi > 1.0 or not (math.isfinite(lo) and math.isfinite(hi)):
            return torch.randn(t.shape, generator=gen, dtype=t.dtype)
        return torch.rand(t.shape, generator=gen, dtype=t.dtype) * (hi - lo) + lo

    def one() -> tuple[Any, ...]:
        drawn: dict[int, torch.Tensor] = {}

        def aliased(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in drawn:
                drawn[id(t)] = draw(t)
            return drawn[id(t)]

        return tuple(map_tensors(x, aliased) for x in example_inputs)

    return [one() for _ in range(n)]
