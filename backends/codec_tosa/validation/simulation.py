"""Simulate a codec plan in PyTorch with the integer arithmetic of Arm's INT8 lowering.

`simulate` runs the materialised program (`_passes/materialize_codecs`) in eager,
but not as plain fake quantisation: wherever Arm's TOSA lowering computes on
codes, so does the simulation, so that it reproduces the artefact bit for
bit instead of drifting by a few quantisation steps on deep models
(docs/DESIGN.md, "Validation"):

* a compute operator whose operands are all read through dequantize nodes
  and whose result is read only by a quantize (conv, incl. depthwise;
  linear, lowered by Arm as a 1x1 CONV2D; mm/bmm, lowered as MATMUL) is
  evaluated on the codes: ``sum((x - zp_x) * (w - zp_w))`` accumulated
  exactly (`integer_products`: float32 chunks whose sums stay below 2**24,
  added in float64), plus the int32
  bias codes, then RESCALEd to the output codes with the per-channel scale
  ``(s_x * s_w[c]) / s_out`` in the order Arm's RewriteConvPass and
  RewriteMatmulPass compute it;
* a ``dequantize(theta_s) -> quantize(theta_d)`` pair (a transcode) is one
  int8 -> int8 RESCALE with scale ``s_s / s_d``, as Arm's InsertRescalePass
  builds it;
* a bilinear upsampling of codes is TOSA's integer RESIZE on the codes, then
  the RESCALE by ``1 / (scale_y_n * scale_x_n)`` Arm's RewriteUpsamplePass
  appends (`resize_axis`);
* a mean reading a dequantize is evaluated as Arm's DecomposeMeanDimPass
  lowers it: the sum over the reduced dimensions is re-quantised at the
  input's parameters (scale times the element count N, same zero point),
  then multiplied by 1/N. The plan asks for an FP32 mean of the decoded
  value; Arm adds this codec, and the artefact has it;
* a layer norm reading a dequantize is evaluated as Arm decomposes it, whose
  mean is such a mean of a decoded value (re-quantised the same way);
* everything else is left to the eager operators: the codecs themselves
  (quantized_decomposed encode and decode, which the lowering reproduces),
  the FP32 operators, and the operators that move codes without arithmetic
  (layout, cat, pad, max pool, nearest upsampling), whose fake-quantised
  evaluation already gives back exactly the codes they move.

`IntegerSimulator.run_node` dispatches on the operator's name through `_HANDLERS`,
one handler per operator family (`codec_tosa.commutation.operators`); a handler
whose integer path does not apply answers `_FALL_THROUGH`, and the node then
runs as torch runs it, like every operator without a handler.

The RESCALE arithmetic is in `codec_tosa.validation.rescale`.

Encodes round half to even (quantized_decomposed, the plan's semantics, and
what `_passes/lower_codecs` lowers them to).

The FP32 operators are the one place the two may legitimately differ: Arm
decomposes LayerNorm, softmax, GELU... into TOSA operators whose float32
results differ from PyTorch's by a few ulps, so an encode of such a value may
round the other way near a rounding boundary. The simulator carries a bound on
that difference through the FP32 operators (`rounding_ambiguity`) and lists
the codes it makes ambiguous; `simulate_envelope` re-simulates with them
flipped, which tells validate how far a correct artefact can be from the
simulation (docs/DESIGN.md, "Validation").
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import weakref
from fractions import Fraction
from dataclasses import dataclass, field
from typing import Any, Callable, Final, Mapping, Protocol, Sequence

import torch
import torch.fx
from codec_tosa.commutation.operators import (
    ADD, AVG_POOL, BILINEAR, CONVOLUTION, DEQUANTIZE, DEQUANTIZES, FUSED_ACTIVATIONS, INT32_ARITHMETIC,
    INTEGER_COMPUTE, LAYER_NORM, LINEAR, MATMULS, MAXIMUM, MEANS, MINIMUM, MUL, QUANTIZE, RELU, SUB, SUM,
)
from codec_tosa.validation import integer_products
from codec_tosa.planning.calibration import lifted_args
from codec_tosa.graph import target_key
from codec_tosa._passes.materialize_codecs import ARM_ANNOTATION_KEY
from codec_tosa.planning.program import PlannedProgram
from codec_tosa.pytrees import returned_outputs
from codec_tosa.validation.rescale import average, rescale
from codec_tosa.validation.rounding_ambiguity import FP32_DECOMPOSITIONS, AmbiguousCode, ambiguous_codes, error_bound

# an add's or sub's operands are shifted 20 bits left at twice the larger scale (12
# for int16 operands: Arm's InsertRescaleInt32Pass)
_ADD_SHIFT_BITS = 20
_ADD_SHIFT_BITS_INT16 = 12
_REDUCED_FLOATS = (torch.float16, torch.bfloat16)
_INT8 = torch.int8
_INT32 = torch.iinfo(torch.int32)
# activation codes: INT8, or INT16 in a 16-bit domain (codec_tosa.quantizer.precision)
_CODE_DTYPES = (torch.int8, torch.int16)
# a handler's answer where its integer path does not apply: the node runs as torch runs it
_FALL_THROUGH: Final = object()


@dataclass(frozen=True)
class _Codes:
    """What a dequantize node read: integer codes and the parameters that decode them."""

    codes: torch.Tensor
    scales: tuple[float, ...]  # one (per tensor) or one per index of `axis`
    zero_points: tuple[int, ...]
    axis: int | None
    qmin: int
    qmax: int
    dtype: torch.dtype

    def centred(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``codes - zero_point``, exactly: in float32 for 8- and 16-bit codes
        (below 2**17 in magnitude), else in `dtype` (default float64)."""
        if dtype is None:
            dtype = torch.float32 if self.codes.dtype in (*_CODE_DTYPES, torch.uint8) else torch.float64
        c = self.codes.to(dtype)
        if len(self.zero_points) == 1:
            return c - self.zero_points[0] if self.zero_points[0] else c
        shape = [1] * c.dim()
        shape[self.axis] = len(self.zero_points)  # type: ignore[index]
        return c - torch.tensor(self.zero_points, dtype=dtype).reshape(shape)


class _Constants:
    """What the simulation derives from the program's constants (weight and bias
    codes, their decodes): the same on every input set and every re-simulation, so
    computed once per materialised program and kept with it (`constants_of`)."""

    def __init__(self, placeholders: frozenset[str]) -> None:
        self.placeholders = placeholders  # names of the placeholders that are not user inputs
        self._values: dict[tuple[str, str], tuple[torch.Tensor, Any]] = {}

    def __len__(self) -> int:
        return len(self._values)

    def get(self, n: torch.fx.Node, what: str, source: Any, compute: Any) -> Any:
        """`compute()`, kept when `n` reads a constant placeholder whose tensor is `source`."""
        src = n.args[0] if n.args else None
        if not (isinstance(src, torch.fx.Node) and src.op == "placeholder" and src.name in self.placeholders):
            return compute()
        hit = self._values.get((n.name, what))
        if hit is not None and hit[0] is source:  # the same tensor object: the same values
            return hit[1]
        value = compute()
        self._values[(n.name, what)] = (source, value)
        return value


_CONSTANTS: "weakref.WeakKeyDictionary[torch.fx.GraphModule, _Constants]" = weakref.WeakKeyDictionary()


def constants_of(program: Any) -> _Constants:
    """The constants cache of a materialised ExportedProgram (made on first use)."""
    from torch.export.graph_signature import InputKind

    gm = program.graph_module
    if gm not in _CONSTANTS:
        _CONSTANTS[gm] = _Constants(frozenset(spec.arg.name for spec in program.graph_signature.input_specs
                                              if spec.kind != InputKind.USER_INPUT))
    return _CONSTANTS[gm]


@dataclass(frozen=True, eq=False)  # by identity: a decode evaluated again read other codes (`rerun`)
class _Undecoded:
    """A decode the simulation left out (`IntegerSimulator._dequantize`): its arguments,
    kept to compute it if an operator reads it after all (the codes' node may be gone)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class _Accumulator:
    """The int32 result of an INT8 compute operator, before its output RESCALE."""

    values: torch.Tensor  # int64 (or int32, `_plus_bias`) holding the exact accumulator
    in_scale: float
    weight_scales: tuple[float, ...]
    channel_axis: int
    # a relu or relu6 Arm folds into the output RESCALE (FuseQuantizedActivationPass):
    # the RESCALE saturates at the output zero point instead of the code minimum
    floored: bool = False
    # an int48 accumulator (int16 inputs): its RESCALE has 16-bit multipliers
    wide: bool = False


class Resolver(Protocol):
    """The artefact's own code at each ambiguous element of an encode, where it is
    known (`tools.artefact_rounding.ArtefactRounding`)."""

    def __call__(self, node: str, codes: torch.Tensor, ambiguous: Sequence[AmbiguousCode],
                 zero_point: int, qmin: int, qmax: int) -> torch.Tensor: ...

    @property
    def complete(self) -> bool:
        """Every encode with ambiguous codes so far was decided."""
        ...

    @property
    def flipped(self) -> int:
        """Ambiguous codes the artefact rounded the other way from the simulation."""
        ...


@dataclass
class SimulationStats:
    """Which operators the simulation evaluated on codes, and which it could not."""

    integer_ops: list[str] = field(default_factory=list)
    transcodes: list[str] = field(default_factory=list)
    requantised_means: list[str] = field(default_factory=list)  # Arm's codec on a mean's sum
    float_fallbacks: list[str] = field(default_factory=list)  # INT8 in the artefact, float here


class IntegerSimulator(torch.fx.Interpreter):
    """Runs a materialised program; see the module docstring for what runs on codes."""

    def __init__(self, gm: torch.fx.GraphModule,
                 flips: Mapping[str, Sequence[AmbiguousCode]] | None = None,
                 fp32_delegated: bool = True, find_ambiguous: bool = True,
                 keep_values: bool = False, constants: _Constants | None = None,
                 resolve: Resolver | None = None) -> None:
        # keep_values: every node's value stays in `env` after `run`, for `rerun`
        super().__init__(gm, garbage_collect_values=not keep_values)
        # constants: `constants_of` the program, to reuse across runs (None: nothing kept)
        self.constants = constants if constants is not None else _Constants(frozenset())
        # False at integer-only policies: an FP32 layer norm then runs on the
        # CPU (ExecuTorch's kernel), not as Arm's TOSA decomposition
        self.fp32_delegated = fp32_delegated
        self.codes: dict[torch.fx.Node, _Codes] = {}
        self.accumulators: dict[torch.fx.Node, _Accumulator] = {}
        # codes Arm computes on codes and the quantize reading them only hands on:
        # AVG_POOL2D's, and a bilinear RESIZE's after its RESCALE
        self.on_codes: dict[torch.fx.Node, torch.Tensor] = {}
        # the int48 accumulator and output RESCALE scales behind an int16 convolution's
        # encode (`_widened`)
        self.widened: dict[torch.fx.Node, tuple[_Accumulator, list[float], int]] = {}
        self.stats = SimulationStats()
        # bound on |artefact - eager| of each FP32 value (absent: computed alike)
        self.bounds: dict[torch.fx.Node, float] = {}
        self.ambiguous: list[AmbiguousCode] = []
        self.flips = dict(flips or {})  # codes to encode the other way, per quantize node
        self.find_ambiguous = find_ambiguous  # off in the envelope's re-simulations, which only need outputs
        # the artefact's code at each ambiguous element, where it is known (`Resolver`)
        self.resolve = resolve
        self.evaluated = 0  # nodes `rerun` evaluated

    def rerun(self, base: "IntegerSimulator") -> Any:
        """The program's output with `self.flips` applied, given `base`, a run on
        the same inputs without flips that kept its values: only the nodes whose
        inputs differ from `base`'s are evaluated, in graph order, starting at the
        flipped encodes. Exact, since every other node reads what it read in
        `base`; and cheap, since a flipped code's effect usually dies at the next
        requantisation (a RESCALE or an encode giving the same codes)."""
        order = {n: i for i, n in enumerate(self.graph.nodes)}
        self.env = dict(base.env)
        self.codes = dict(base.codes)
        by_name = {n.name: n for n in self.graph.nodes}
        queue = [(order[by_name[name]], by_name[name]) for name in self.flips]
        heapq.heapify(queue)
        queued = {n for _, n in queue}
        while queue:
            _, n = heapq.heappop(queue)
            value = self.run_node(n)
            if _same(value, base.env[n]):
                continue
            self.env[n] = value
            for u in n.users:
                if u not in queued and u.op != "output":
                    queued.add(u)
                    heapq.heappush(queue, (order[u], u))
        self.evaluated = len(queued)
        return self.run_node(next(n for n in reversed(self.graph.nodes) if n.op == "output"))

    def run_node(self, n: torch.fx.Node) -> Any:
        key = target_key(n.target) if n.op == "call_function" else ""
        handler = _HANDLERS.get(key)
        out = handler(self, n, key) if handler is not None else _FALL_THROUGH
        if out is _FALL_THROUGH:
            out = super().run_node(n)
            self._bound(n, key, out)
        return out

    def _bound(self, n: torch.fx.Node, key: str, out: Any, magnitude: float | None = None) -> None:
        """Record how far the artefact may be from `out`, the value of `n`
        (`magnitude`: as `error_bound` takes it)."""
        if key and self.find_ambiguous:  # the bounds only find ambiguous codes
            operands = [(self.env[a] if isinstance(a, torch.fx.Node) else a,
                         self.bounds.get(a, 0.0) if isinstance(a, torch.fx.Node) else 0.0)
                        for a in _flat(n.args) if isinstance(a, (torch.fx.Node, int, float))]
            bound = error_bound(key, out, operands, magnitude)
            if bound > 0:
                self.bounds[n] = bound

    # ---- the handlers, one per operator family (`_HANDLERS`) ------------------
    def _on_quantize(self, n: torch.fx.Node, key: str) -> torch.Tensor:
        out = self._quantize_on_codes(n)
        return out if out is not None else self._encode(n)

    def _on_mean(self, n: torch.fx.Node, key: str) -> Any:
        out = self._mean_of_decoded(n)
        return out if out is not None else _FALL_THROUGH

    def _on_layer_norm(self, n: torch.fx.Node, key: str) -> Any:
        ln = self._layer_norm_of_decoded(n)
        if ln is None:
            return _FALL_THROUGH
        shape = [(s, 0.0) for s in n.args[1]]
        self.bounds[n] = error_bound(key, ln, [(self.env[n.args[0]], 0.0), *shape])
        return ln

    def _on_fused_activation(self, n: torch.fx.Node, key: str) -> Any:
        if not (n.args and n.args[0] in self.accumulators):
            return _FALL_THROUGH
        # only a compute operator's fused activation reads an accumulator (checked there)
        acc = self.accumulators.pop(n.args[0])
        return self._accumulated(n, dataclasses.replace(acc, floored=True))

    def _on_pool_or_resize(self, n: torch.fx.Node, key: str) -> Any:
        codes = self._avg_pool_on_codes(n) if key == AVG_POOL else self._bilinear_resize_on_codes(n)
        if codes is None:
            return _FALL_THROUGH
        self.on_codes[n] = codes
        return codes.to(torch.float32)  # only the quantizes below read it (checked)

    def _on_integer_compute(self, n: torch.fx.Node, key: str) -> Any:
        acc = self._accumulate(n, key)
        if acc is not None:
            return self._accumulated(n, acc)
        if self._lowered_int8(n):
            self.stats.float_fallbacks.append(n.name)
        self._decode_inputs(n)  # the float path reads the decodes `_dequantize` left out
        return _FALL_THROUGH

    def _on_int32_arithmetic(self, n: torch.fx.Node, key: str) -> Any:
        acc = self._int32_arithmetic(n, key)
        return self._accumulated(n, acc) if acc is not None else _FALL_THROUGH

    def _on_fp32_decomposition(self, n: torch.fx.Node, key: str) -> Any:
        if _lowered_on_codes(n):
            return _FALL_THROUGH  # Arm computes it on codes: no FP32 decomposition in the artefact
        x = self.env.get(n.args[0]) if n.args and isinstance(n.args[0], torch.fx.Node) else None
        if not (isinstance(x, torch.Tensor) and x.dtype == torch.float32):
            return _FALL_THROUGH
        # as the artefact computes it, not as torch does; its steps' rounding
        # is relative to |out| + relative_to
        out, relative_to = FP32_DECOMPOSITIONS[key](x)
        self._bound(n, key, out, float((out.abs() + relative_to).max()) if out.numel() else 0.0)
        return out

    def _accumulated(self, n: torch.fx.Node, acc: _Accumulator) -> torch.Tensor:
        """`n`'s accumulator, kept for the quantize below: its only reader (checked),
        which RESCALEs it and never sees the value returned here."""
        self.accumulators[n] = acc
        return acc.values

    # ---- codecs ------------------------------------------------------------
    def _dequantize(self, n: torch.fx.Node, key: str) -> torch.Tensor | _Undecoded:
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        codes = args[0]
        # read only by compute operators, which run on the codes: the decode is left out
        # until one cannot (`_decode_inputs`). Half of what `simulate_envelope` keeps
        # of DeepLabV3 is such decodes, and its weights' take a second to compute
        left_out = bool(n.users) and all(u.op == "call_function" and target_key(u.target) in INTEGER_COMPUTE
                                         for u in n.users)
        out = _Undecoded(args, kwargs) if left_out else self._decode(n, args, kwargs)
        if key == DEQUANTIZE:
            _, scale, zp, qmin, qmax, dtype = _args(n, self)[:6]  # then out_dtype (FP16 programs)
            self.codes[n] = _Codes(codes, (float(scale),), (int(zp),), None, int(qmin), int(qmax), dtype)
        else:
            _, scales, zps, axis, qmin, qmax, dtype = _args(n, self)[:7]
            # a weight's, kept: thousands of per-channel parameters
            self.codes[n] = self.constants.get(n, "codes", codes, lambda: _Codes(
                codes, tuple(float(s) for s in scales.tolist()), tuple(int(z) for z in zps.tolist()), int(axis),
                int(qmin), int(qmax), dtype))
        return out

    def _decode(self, n: torch.fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        return self.constants.get(n, "decoded", args[0], lambda: self._decoded(n, args, kwargs))

    def _decode_inputs(self, n: torch.fx.Node) -> None:
        """The decodes `n` reads where `_dequantize` left them out."""
        for a in n.all_input_nodes:
            value = self.env[a]
            if isinstance(value, _Undecoded):
                self.env[a] = self._decode(a, value.args, value.kwargs)

    def _decoded(self, n: torch.fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
        out = n.target(*args, **kwargs)  # the decode: quantized_decomposed semantics
        if out.dtype in _REDUCED_FLOATS and n.users and all(_lowered_on_codes(u) for u in n.users):
            # an FP16 program's decode into operators Arm lowers on codes: Arm computes
            # their TABLEs and RESCALEs from FP32 decodes (QuantArgs.dequantize_value),
            # never in FP16 (exp's table a code off on Arm's rand_fp16 case)
            out = n.target(*args, **{**kwargs, "out_dtype": torch.float32})
        return out

    def _quantize_on_codes(self, n: torch.fx.Node) -> torch.Tensor | None:
        """The RESCALE Arm emits for this quantize, or None when it is an encode."""
        src = n.args[0]
        _, scale, zp, _, _, dtype = _args(n, self)
        if dtype not in _CODE_DTYPES or not isinstance(src, torch.fx.Node):
            return None
        if src in self.on_codes:
            return self.on_codes[src]
        if src in self.accumulators:
            acc = self.accumulators.pop(src)
            # Arm: post_conv2d_scale = (inp * w) / out, in Python floats (double)
            scales = [(acc.in_scale * w) / float(scale) for w in acc.weight_scales]
            codes = rescale(acc.values, scales, 0, int(zp), dtype, acc.channel_axis,
                            multiplier_bits=16 if acc.wide else 32)
            if acc.wide:
                self.widened[n] = (acc, scales, int(zp))
            return torch.clamp(codes, min=int(zp)) if acc.floored else codes
        held = self.codes.get(src)
        if held is not None and held.axis is None and held.dtype in _CODE_DTYPES:
            self.stats.transcodes.append(n.name)
            # Arm's InsertRescalePass: one scale dq.scale / q.scale, both zero points
            return rescale(held.codes, [held.scales[0] / float(scale)], held.zero_points[0], int(zp), dtype)
        return None

    def _encode(self, n: torch.fx.Node) -> torch.Tensor:
        """An encode of an FP32 value: its codes, the ones the artefact may round
        the other way, and the flips asked for."""
        codes = self._cpu_quantize(n) if self._on_cpu(n) else self._delegate_quantize(n)
        src = n.args[0]
        bound = self.bounds.get(src, 0.0) if isinstance(src, torch.fx.Node) else 0.0
        if bound > 0 and self.find_ambiguous:
            _, scale, zp, qmin, qmax, _ = _args(n, self)
            found = ambiguous_codes(n.name, self.env[src], codes, bound, float(scale), int(zp),
                                    int(qmin), int(qmax))
            self.ambiguous += found
            if found and self.resolve is not None:
                codes = self.resolve(n.name, codes, found, int(zp), int(qmin), int(qmax))
        flips = self.flips.get(n.name)
        if flips:
            codes = codes.clone()
            flat = codes.view(-1)
            for f in flips:
                flat[f.index] = f.alternative
        return codes

    def _delegate_quantize(self, n: torch.fx.Node) -> torch.Tensor:
        """An encode inside the delegate. INT16 codes there saturate at the type's
        range: Arm's RESCALEs clamp at -32768, not at a16w8's quant_min -32767, so
        a value moved on codes (cat, slice) keeps a -32768 that a RESCALE made
        (measured on the reference model: tests/test_precision.py)."""
        x, scale, zp, qmin, qmax, dtype = _args(n, self)[:6]
        if dtype == torch.int16 and isinstance(x, torch.Tensor):
            info = torch.iinfo(dtype)
            return torch.ops.quantized_decomposed.quantize_per_tensor(x, scale, zp, info.min, info.max, dtype)
        return super().run_node(n)

    def _on_cpu(self, n: torch.fx.Node) -> bool:
        """An encode ExecuTorch runs: at an integer-only policy, of a graph input or
        of an operator the plan keeps FP32 (the CPU's). Other encodes are Arm's
        (a TABLE's entries, the requantisation of an integer operator), which it
        computes with PyTorch's quantize."""
        if self.fp32_delegated:
            return False
        src = n.args[0]
        if not isinstance(src, torch.fx.Node):
            return False
        if src.op == "placeholder":
            return True
        return src.op == "call_function" and not _lowered_on_codes(src)

    def _cpu_quantize(self, n: torch.fx.Node) -> torch.Tensor:
        """An encode at an integer-only policy, which runs on the CPU as ExecuTorch's
        quantize_per_tensor kernel computes it: in float32, times the float32
        reciprocal of the scale, rounded half to even. PyTorch's reference
        divides instead, so an exact tie (x / scale = k + 0.5) or a value an ulp
        from one can round the other way (found on U-Net's input at policy I)."""
        x, scale, zp, qmin, qmax, dtype = _args(n, self)
        inv = torch.tensor(1.0, dtype=torch.float32) / torch.tensor(float(scale), dtype=torch.float32)
        q = torch.round(x.to(torch.float32) * inv) + int(zp)
        return torch.clamp(q, int(qmin), int(qmax)).to(dtype)

    def _mean_of_decoded(self, n: torch.fx.Node) -> torch.Tensor | None:
        """A mean whose input is a per-tensor dequantize, as Arm decomposes it."""
        src = n.args[0]
        held = self.codes.get(src) if isinstance(src, torch.fx.Node) else None
        if held is None or held.axis is not None:
            return None
        x = self.env[src]
        args = _args(n, self)
        dims = args[1] if len(args) > 1 and args[1] is not None else list(range(x.dim()))
        keepdim = bool(args[2]) if len(args) > 2 else False
        dims = [d % x.dim() for d in dims]
        total = self._requantised_mean(n, x, held, dims)
        out_shape = [s if d not in dims else 1 for d, s in enumerate(x.shape)] if keepdim else \
            [s for d, s in enumerate(x.shape) if d not in dims]
        return total.reshape(out_shape)

    def _requantised_mean(self, n: torch.fx.Node, x: torch.Tensor, held: _Codes,
                          dims: list[int]) -> torch.Tensor:
        """Arm's DecomposeMeanDimPass on a decoded `x` (dims kept): the sum is
        re-quantised at the input's parameters (scale times the count N, same
        zero point), then multiplied by 1/N."""
        # Arm drops reduced dimensions of size 1 and sums the others one at a time
        reduced = [d for d in dims if x.shape[d] != 1]
        count = 1
        for d in reduced:
            count *= x.shape[d]
        total = x
        for d in reduced:
            total = _sequential_sum(total, d)
        if reduced:
            sum_scale = held.scales[0] * count  # Python float, as Arm computes it
            theta = (sum_scale, held.zero_points[0], held.qmin, held.qmax, held.dtype)
            total = _fake_quantize(total, theta)
            total = total * (1 / count)
            self.stats.requantised_means.append(n.name)
        return total

    def _layer_norm_of_decoded(self, n: torch.fx.Node) -> tuple[torch.Tensor, ...] | None:
        """A layer norm whose input is a per-tensor dequantize, as Arm decomposes
        it: its mean is a mean of a decoded value, so Arm re-quantises the sum
        (`_requantised_mean`); then x - mean, the mean of its square (a
        sequential sum times 1/N), + eps, RSQRT, times weight, plus bias."""
        if not self.fp32_delegated:
            return None
        src = n.args[0]
        held = self.codes.get(src) if isinstance(src, torch.fx.Node) else None
        if held is None or held.axis is not None:
            return None
        x = self.env[src]
        _, shape, weight, bias, eps = _args(n, self)
        dims = list(range(x.dim() - len(shape), x.dim()))
        count = 1
        for d in dims:
            count *= x.shape[d]
        mean = self._requantised_mean(n, x, held, dims)
        centred = x - mean
        square = centred * centred
        for d in dims:
            square = _sequential_sum(square, d)
        rstd = torch.rsqrt(square * (1 / count) + eps)
        out = centred * rstd
        if weight is not None:
            out = out * weight
        if bias is not None:
            out = out + bias
        return out, mean, rstd

    def _avg_pool_on_codes(self, n: torch.fx.Node) -> torch.Tensor | None:
        """An avg_pool2d of per-tensor int8 codes whose readers all encode at the same
        theta (the averaging rows share it), as TOSA's INT8 AVG_POOL2D computes it:
        the sum of ``code - Z`` over the in-bounds window elements (Arm makes
        count_include_pad's padding an explicit PAD before it), divided by their
        count with TOSA's reciprocal multiplier (`rescale.average`), plus Z.

        Z is not the zero point: executorch 1.5.1's RewriteAvgPool2dPass writes
        each zero point as a `full` node carrying the pool's output qparams, and
        ComputeConstantOpsAOTPass then quantizes it like a value, giving
        ``quantize(zp, s, zp)``, saturated (-128 or 127 unless zp is 0). Input
        and output get the same Z, so the average is right; only which way a
        tie rounds follows Z's sign (tests/tools/test_simulation.py pins it)."""
        src = n.args[0]
        held = self.codes.get(src) if isinstance(src, torch.fx.Node) else None
        if held is None or held.axis is not None or held.dtype not in _CODE_DTYPES or not n.users:
            return None
        if not all(_is_quantize(u) and float(u.args[1]) == held.scales[0] and int(u.args[2]) == held.zero_points[0]
                   for u in n.users):
            return None
        _, kernel, stride, padding, ceil_mode, count_include_pad, divisor = (list(_args(n, self)) + [
            [], [0, 0], False, True, None][len(n.args) - 2:])[:7]
        if divisor is not None or (count_include_pad and any(padding)):
            return None  # not what Arm's decomposition leaves for AVG_POOL2D
        stride = stride or kernel
        pool = torch.nn.functional.avg_pool2d
        codes = held.codes.to(torch.float64)
        sums = pool(codes, kernel, stride, padding, ceil_mode, False, divisor_override=1)
        counts = pool(torch.ones_like(codes), kernel, stride, padding, ceil_mode, False, divisor_override=1)
        zp = arm_pool_zero_point(held.scales[0], held.zero_points[0])
        sums = sums - zp * counts
        self.stats.integer_ops.append(n.name)
        return average(torch.round(sums), torch.round(counts), zp, held.dtype)

    def _bilinear_resize_on_codes(self, n: torch.fx.Node) -> torch.Tensor | None:
        """A bilinear upsampling of per-tensor codes whose readers all encode at the
        same theta, as Arm lowers it at INT (RewriteUpsamplePass): TOSA RESIZE in
        integer arithmetic on the codes themselves (zero point included: the
        weights of each output sum to ``scale_y_n * scale_x_n``, so it passes
        through), an int32 result, then one RESCALE by ``1 / (scale_y_n *
        scale_x_n)`` with zero points 0. INT8 codes (no INT16 row takes it), and
        only upscales and identities along both axes: Arm rewrites some
        downscales into pools."""
        src = n.args[0]
        held = self.codes.get(src) if isinstance(src, torch.fx.Node) else None
        if (held is None or held.axis is not None or held.dtype != _INT8 or not n.users
                or not _lowered_on_codes(n) or held.codes.dim() != 4):
            return None
        if not all(_is_quantize(u) and u.args[5] == held.dtype and float(u.args[1]) == held.scales[0]
                   and int(u.args[2]) == held.zero_points[0] for u in n.users):
            return None
        align_corners = bool(_args(n, self)[2])
        out_hw = n.meta["val"].shape[2:]  # the output size, as export rounded it
        axes = [resize_axis(int(i), int(o), align_corners) for i, o in zip(held.codes.shape[2:], out_hw)]
        if any(a is None for a in axes):
            return None
        (y0, y1, dy, unit_y), (x0, x1, dx, unit_x) = axes  # type: ignore[misc]
        codes = held.codes.to(torch.int64)
        rows0, rows1 = codes[:, :, y0], codes[:, :, y1]
        wy0, wy1 = (unit_y - dy).reshape(-1, 1), dy.reshape(-1, 1)
        wx0, wx1 = unit_x - dx, dx
        acc = (rows0[..., x0] * wy0 * wx0 + rows0[..., x1] * wy0 * wx1
               + rows1[..., x0] * wy1 * wx0 + rows1[..., x1] * wy1 * wx1)
        self.stats.integer_ops.append(n.name)
        return rescale(acc, [float(1 / (unit_y * unit_x))], 0, 0, _INT8)

    # ---- INT8 compute operators ----------------------------------------------
    def _accumulate(self, n: torch.fx.Node, key: str) -> _Accumulator | None:
        if not n.users or not (all(_is_quantize(u) for u in n.users) or _fused_activation(n)):
            return None
        operands = _tensor_operands(n, key)
        held = [self.codes.get(a) if isinstance(a, torch.fx.Node) else None for a in operands]
        if any(h is None for h in held):
            return None
        x, w = held[0], held[1]
        bias = held[2] if len(held) > 2 else None
        assert x is not None and w is not None
        if x.axis is not None or x.dtype not in _CODE_DTYPES or w.dtype != _INT8:
            return None
        if key in MATMULS and x.dtype != _INT8:
            return None  # no int16 MATMUL row (Row.int16)
        if key in MATMULS and w.axis is not None:
            return None  # Arm's MATMUL rescale reads per-tensor scales only
        if w.axis not in (None, 0):
            return None  # per output channel is axis 0 of a conv / linear weight
        args = _args(n, self)
        if key == CONVOLUTION and args[6]:
            return None  # transposed
        acc = self._int8_products(key, x, w, operands[1], args)
        if acc is None:
            xs = x.centred()
            ws = self.constants.get(operands[1], "centred", w.codes, w.centred)
            if key == CONVOLUTION:
                _, _, _, stride, padding, dilation, _, _, groups = args
                acc = integer_products.convolution(xs, ws, stride, padding, dilation, groups)
            elif key == LINEAR:
                acc = integer_products.linear(xs, ws)
            else:
                acc = integer_products.matmul(xs, ws)
        axis = 1 if key == CONVOLUTION else acc.dim() - 1
        centred_bias = None
        if bias is not None:
            shape = [1] * acc.dim()
            shape[axis] = -1
            centred_bias = self.constants.get(operands[2], "centred", bias.codes,
                                              lambda: bias.centred(torch.int64)).reshape(shape)
        values = _plus_bias(acc, centred_bias)
        self.stats.integer_ops.append(n.name)
        # int16 x int8 products accumulate in int48 (TOSA's CONV2D at int16)
        return _Accumulator(values, x.scales[0], w.scales, axis, wide=x.dtype == torch.int16)

    def _int8_products(self, key: str, x: _Codes, w: _Codes, weight: torch.fx.Node,
                       args: tuple[Any, ...]) -> torch.Tensor | None:
        """A convolution's or linear's products of int8 codes by one int8 GEMM of the
        codes (`integer_products.convolution_int8`), where it applies: int8
        activations, weights of zero point 0, one group; None: the float32 path."""
        if key not in (CONVOLUTION, LINEAR) or x.dtype != _INT8 or any(w.zero_points):
            return None
        # the weight as the GEMM reads it, once per program (None: no exact int8 GEMM here)
        prepared = self.constants.get(weight, "int8", w.codes, lambda: integer_products.int8_weight(w.codes))
        if prepared is None:
            return None
        if key == LINEAR:
            return integer_products.linear_int8(x.codes, x.zero_points[0], prepared)
        _, _, _, stride, padding, dilation, _, _, groups = args
        if groups != 1:
            return None
        return integer_products.convolution_int8(x.codes, x.zero_points[0], prepared, stride, padding, dilation)

    def _int32_arithmetic(self, n: torch.fx.Node, key: str) -> _Accumulator | None:
        """add, sub, mul, sum, maximum or minimum of per-tensor int8 codes, as Arm's
        InsertRescaleInt32Pass lowers them: each operand RESCALEd to int32 (add,
        sub: both at ``2 * max(scale) / 2**20``; maximum, minimum: both at the
        smaller scale; mul, sum: at their own scale),
        the exact int32 result, and the quantize below RESCALEs it back. An FP32
        sum of the decoded values rounds differently near a boundary, and a
        ResNet's residual adds amplify one such code through the layers after
        it (U-Net at policy I was 10 steps off)."""
        if self.fp32_delegated or not n.users or not all(_is_quantize(u) for u in n.users):
            return None
        operands = n.args[:1] if key == SUM else n.args[:2]
        held = [self.codes.get(a) if isinstance(a, torch.fx.Node) else None for a in operands]
        if any(h is None or h.axis is not None or h.dtype not in _CODE_DTYPES for h in held):
            return None
        if len({h.dtype for h in held}) > 1:  # type: ignore[union-attr]
            return None  # Arm refuses operands of two widths (codec_tosa.quantizer.precision)
        alpha = n.args[2] if len(n.args) > 2 else n.kwargs.get("alpha", 1)
        if key in (ADD, SUB) and alpha != 1:
            return None  # add(x, y, alpha=2)
        scales = [h.scales[0] for h in held]  # type: ignore[union-attr]

        def int32(h: _Codes, scale: float, operand: Any) -> torch.Tensor:
            wide = self._widened(operand)
            if wide is not None:
                acc, conv_scales, _ = wide
                # Arm's RewriteConvPass at a16w8: the int32 operand RESCALEs straight from
                # the int48 accumulator, its scale times the convolution's (the int16
                # codes, rounded and clamped, never exist on this path)
                combined = [c * (h.scales[0] / scale) for c in conv_scales]
                return rescale(acc.values, combined, 0, 0, torch.int32, acc.channel_axis,
                               multiplier_bits=16).to(torch.int64)
            return rescale(h.codes, [h.scales[0] / scale], h.zero_points[0], 0, torch.int32).to(torch.int64)

        if key in (ADD, SUB):
            shift = _ADD_SHIFT_BITS_INT16 if held[0].dtype == torch.int16 else _ADD_SHIFT_BITS  # type: ignore[union-attr]
            common = 2 * max(scales) / (1 << shift)
            a, b = (int32(h, common, x) for h, x in zip(held, operands))  # type: ignore[arg-type]
            values, out_scale = (a + b if key == ADD else a - b), common
        elif key in (MAXIMUM, MINIMUM):
            common = min(scales)
            a, b = (int32(h, common, x) for h, x in zip(held, operands))  # type: ignore[arg-type]
            values, out_scale = (torch.maximum(a, b) if key == MAXIMUM else torch.minimum(a, b)), common
        elif key == MUL:
            a, b = (int32(h, h.scales[0], x) for h, x in zip(held, operands))  # type: ignore[union-attr]
            values, out_scale = a * b, math.prod(scales)
        else:
            _, dims, *rest = _args(n, self)
            keepdim = bool(rest[0]) if rest else False
            h = held[0]
            assert h is not None
            x = int32(h, h.scales[0], operands[0])
            # sum.dim_IntList with dim None (x.sum(dim=None)) reduces every dimension
            every = list(range(x.dim())) if dims is None else list(dims)
            values, out_scale = x.sum(dim=every, keepdim=keepdim), scales[0]
        self.stats.integer_ops.append(n.name)
        return _Accumulator(values, out_scale, (1.0,), 0)

    def _widened(self, operand: Any) -> tuple[_Accumulator, list[float], int] | None:
        """The accumulator behind `operand`, a decode that reads an int16 convolution's
        encode directly (Arm's "direct INT32 rescale user" of the convolution)."""
        if not isinstance(operand, torch.fx.Node) or not operand.args:
            return None
        q = operand.args[0]
        return self.widened.get(q) if isinstance(q, torch.fx.Node) else None

    def _lowered_int8(self, n: torch.fx.Node) -> bool:
        """Whether Arm lowers `n` on codes (a dequantize feeds it), though we could not."""
        return any(isinstance(a, torch.fx.Node) and a in self.codes for a in n.all_input_nodes)


# operator key -> the handler of its family (the families' keys are disjoint); the FP32
# decompositions come first so that any family below overrides them on a shared key
_Handler = Callable[[IntegerSimulator, torch.fx.Node, str], Any]
_HANDLERS: dict[str, _Handler] = {
    **dict.fromkeys(FP32_DECOMPOSITIONS, IntegerSimulator._on_fp32_decomposition),
    **dict.fromkeys(DEQUANTIZES, IntegerSimulator._dequantize),
    QUANTIZE: IntegerSimulator._on_quantize,
    **dict.fromkeys(MEANS, IntegerSimulator._on_mean),
    LAYER_NORM: IntegerSimulator._on_layer_norm,
    **dict.fromkeys(FUSED_ACTIVATIONS, IntegerSimulator._on_fused_activation),
    **dict.fromkeys((AVG_POOL, BILINEAR), IntegerSimulator._on_pool_or_resize),
    **dict.fromkeys(INTEGER_COMPUTE, IntegerSimulator._on_integer_compute),
    **dict.fromkeys(INT32_ARITHMETIC, IntegerSimulator._on_int32_arithmetic),
}


def arm_pool_zero_point(scale: float, zero_point: int) -> int:
    """The zero point Arm's AVG_POOL2D gets for codes at (scale, zero_point): the zero
    point quantized as a value at those parameters (`_avg_pool_on_codes`)."""
    q = torch.ops.quantized_decomposed.quantize_per_tensor(
        torch.tensor([float(zero_point)]), scale, zero_point, -128, 127, torch.int8)
    return int(q[0])


def resize_axis(size_in: int, size_out: int, align_corners: bool
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None:
    """One axis of TOSA's integer bilinear RESIZE with the parameters Arm's
    RewriteUpsamplePass gives it (scale ``2 * p / 2 * q`` for the ratio p/q of the
    output to the input size, less one each with align_corners; offset 0 with
    align_corners, else half-pixel ``scale_d // 2 - scale_n // 2``): per output
    index the two source indices, the weight ``d`` of the second, and the unit
    (``scale_n``) the weights sum to. None for a downscale."""
    corners = align_corners and size_in > 1 and size_out > 1
    ratio = Fraction(size_out - 1, size_in - 1) if corners else Fraction(size_out, size_in)
    if ratio < 1:
        return None
    scale_n, scale_d = 2 * ratio.numerator, 2 * ratio.denominator
    offset = 0 if align_corners else scale_d // 2 - scale_n // 2
    position = torch.arange(size_out, dtype=torch.int64) * scale_d + offset
    index = torch.div(position, scale_n, rounding_mode="floor")
    d = position - index * scale_n
    return index.clamp(0, size_in - 1), (index + 1).clamp(0, size_in - 1), d, scale_n


def _lowered_on_codes(n: torch.fx.Node) -> bool:
    """An operator Arm lowers on codes: it carries Arm's quantized mark (the
    materialisation's and CodecQuantizer's); anything else runs on the CPU."""
    mark = n.meta.get("custom", {}).get(ARM_ANNOTATION_KEY)
    quantized = getattr(mark, "quantized", None) if not isinstance(mark, dict) else mark.get("quantized")
    return bool(quantized)


def _fused_activation(n: torch.fx.Node) -> bool:
    """`n`'s one reader is a relu, or a hardtanh from 0, read only by a quantize:
    the activation Arm's FuseQuantizedActivationPass folds into `n`'s RESCALE (a
    PT2E quantizer leaves nothing quantized between them, as Arm's does)."""
    if len(n.users) != 1:
        return False
    (act,) = n.users
    key = target_key(act.target) if act.op == "call_function" else ""
    if key not in FUSED_ACTIVATIONS or len(act.users) != 1 or not _is_quantize(next(iter(act.users))):
        return False
    return key == RELU or float(act.args[1] if len(act.args) > 1 else -1.0) == 0.0


def _fake_quantize(x: torch.Tensor, theta: tuple[Any, ...]) -> torch.Tensor:
    """Encode then decode like the plan's own codecs, for a codec Arm inserts itself."""
    q = torch.ops.quantized_decomposed.quantize_per_tensor(x, *theta)
    return torch.ops.quantized_decomposed.dequantize_per_tensor(q, *theta)


def _plus_bias(acc: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``acc + bias`` of exact integers (`integer_products`; bias int64): int32 where
    the int8 GEMM gave int32 and the sum stays in its range, else int64. int32 halves
    what `simulate_envelope` keeps of each accumulator (DeepLabV3: 200 MB, all written
    for the first time on the first input set)."""
    if acc.dtype == torch.int32 and acc.numel():
        low, high = (int(v) for v in torch.aminmax(acc))
        reach = int(bias.abs().max()) if bias is not None and bias.numel() else 0
        if low - reach >= _INT32.min and high + reach <= _INT32.max:
            return acc if bias is None else acc.add_(bias.to(torch.int32))  # acc is the GEMM's own
    values = acc.to(torch.int64)
    if bias is not None:
        values += bias
    return values


def _sequential_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` (kept) in float32, element after element, as the TOSA
    reference model's REDUCE_SUM accumulates. The order matters here: the sum
    is re-quantised next, and sums of decoded codes often sit exactly on a
    rounding tie, so one ulp decides the code (torch.sum, pairwise, or a
    float64 sum flip codes on held-out inputs)."""
    total = x.narrow(dim, 0, 1).clone()
    for i in range(1, x.shape[dim]):
        total = total + x.narrow(dim, i, 1)
    return total


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and not isinstance(a, torch.Tensor) and a == b


def _flat(args: Any) -> list[Any]:
    if isinstance(args, (list, tuple)):
        return [b for a in args for b in _flat(a)]
    return [args]


def _args(n: torch.fx.Node, interp: torch.fx.Interpreter) -> tuple[Any, ...]:
    args, kwargs = interp.fetch_args_kwargs_from_env(n)
    if kwargs:
        schema = getattr(n.target, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
        args = tuple(args) + tuple(kwargs[k] for k in names[len(args):] if k in kwargs)
    return tuple(args)


def _tensor_operands(n: torch.fx.Node, key: str) -> list[Any]:
    """(activation, weight[, bias]) of a compute operator."""
    if key == CONVOLUTION:
        operands = list(n.args[:3])
    elif key == LINEAR:
        operands = list(n.args[:3]) if len(n.args) > 2 else list(n.args[:2]) + [n.kwargs.get("bias")]
    else:
        operands = list(n.args[:2])
    return [a for a in operands if a is not None]


def _is_quantize(n: torch.fx.Node) -> bool:
    """An encode into activation codes (INT8, or INT16 in a 16-bit domain)."""
    return (n.op == "call_function" and target_key(n.target) == QUANTIZE
            and len(n.args) > 5 and n.args[5] in _CODE_DTYPES)


def run_planned(planned: PlannedProgram, inputs: Sequence[Any],
                dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """The program as planned, in FP32, before any codec: the structural oracle
    validate holds to eager (tools/reference_io). `dtype` float64 runs it with
    every FP32 input and constant widened (its FP32 rounding's yardstick)."""
    program = planned.program
    assert program is not None
    args = lifted_args(program, inputs)
    if dtype != torch.float32:
        args = [a.to(dtype) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a for a in args]
    with torch.no_grad():
        out = torch.fx.Interpreter(program.graph_module).run(*args)
    return returned_outputs(program.graph_signature, _outputs(out))


def simulate_with_stats(planned: PlannedProgram, inputs: Sequence[torch.Tensor]
                        ) -> tuple[list[torch.Tensor], SimulationStats]:
    """`simulate`, and which operators it evaluated on codes."""
    outs, runner = _run(planned, planned.materialized(), inputs)
    return outs, runner.stats


def simulate(planned: PlannedProgram, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The plan's outputs on `inputs`, computed as Arm's INT8 lowering computes them."""
    return simulate_with_stats(planned, inputs)[0]


# re-simulations per input set: one per ambiguous code, up to this many, plus all
# flipped together. Each recomputes only what its flip changes (`IntegerSimulator.rerun`),
# which on a transformer at W is still a quarter of the graph per flip
MAX_FLIPS = 64


@dataclass
class Envelope:
    """The simulation on one input set and how far a correct artefact may be from it."""

    outputs: list[torch.Tensor]
    # per output element: sum over ambiguous codes of how far flipping that one code
    # moves it, or how far flipping all together moves it, whichever is larger
    allowance: list[torch.Tensor]
    ambiguous: list[AmbiguousCode]
    resimulations: int
    # per output, the bound on |artefact - simulation| its FP32 operators carry to
    # it (`rounding_ambiguity.error_bound`; 0 for an output the codes determine)
    output_bounds: list[float] = field(default_factory=list)
    # every ambiguous code was flipped alone, or decided by the artefact
    complete: bool = True
    # ambiguous codes the artefact rounded the other way, where the artefact decided
    # each of them (`outputs` are then its, and `allowance` 0); None: not asked
    artefact_flipped: int | None = None


def _run(planned: PlannedProgram, sim: Any, inputs: Sequence[torch.Tensor],
         keep_values: bool = False, resolve: Resolver | None = None) -> tuple[list[torch.Tensor], IntegerSimulator]:
    runner = IntegerSimulator(sim.graph_module, fp32_delegated=not planned.spec.integer_only,
                              constants=constants_of(sim),
                              keep_values=keep_values, resolve=resolve)
    with torch.no_grad():
        out = runner.run(*lifted_args(sim, inputs))
    return returned_outputs(sim.graph_signature, _outputs(out)), runner


def _rerun(planned: PlannedProgram, sim: Any, base: IntegerSimulator,
           flips: Mapping[str, Sequence[AmbiguousCode]]) -> list[torch.Tensor]:
    runner = IntegerSimulator(sim.graph_module, flips, fp32_delegated=not planned.spec.integer_only,
                              constants=constants_of(sim),
                              find_ambiguous=False)
    with torch.no_grad():
        out = runner.rerun(base)
    return returned_outputs(sim.graph_signature, _outputs(out))


def _outputs(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def simulate_envelope(planned: PlannedProgram, inputs: Sequence[torch.Tensor],
                      max_flips: int | None = None,
                      artefact: Callable[[], Resolver] | None = None) -> Envelope:
    """`simulate`, the codes the artefact may round the other way (encodes of FP32
    values Arm computes differently, within the bound of a rounding boundary), and
    the outputs' allowance: each ambiguous code flipped alone (when there are at
    most `max_flips`, default MAX_FLIPS) and all flipped together, re-simulated.

    `artefact`: where there are more than `max_flips`, makes the artefact's
    `Resolver` for these inputs; the simulation then runs again taking the
    artefact's code at each ambiguous element, and where it decided all of them,
    that is the envelope (exact: allowance 0)."""
    max_flips = MAX_FLIPS if max_flips is None else max_flips
    sim = planned.materialized()
    base, runner = _run(planned, sim, inputs, keep_values=True)
    ambiguous = runner.ambiguous
    if len(ambiguous) > max_flips and artefact is not None:
        resolver = artefact()
        outputs, resolved = _run(planned, sim, inputs, resolve=resolver)
        if resolver.complete:
            return Envelope(outputs, [torch.zeros(b.shape, dtype=torch.float64) for b in outputs],
                            resolved.ambiguous, 1, _output_bounds(sim, resolved), True, resolver.flipped)
    allowance = [torch.zeros(b.shape, dtype=torch.float64) for b in base]
    runs = 0
    if ambiguous:
        by_node: dict[str, list[AmbiguousCode]] = {}
        for a in ambiguous:
            by_node.setdefault(a.node, []).append(a)
        together = _rerun(planned, sim, runner, by_node)
        summed = [torch.zeros_like(a) for a in allowance]
        # each code flipped alone only where that completes the envelope: beyond
        # max_flips it stays incomplete whichever codes are flipped
        singles = ambiguous if len(ambiguous) <= max_flips else []
        for a in singles:
            moved = _rerun(planned, sim, runner, {a.node: [a]})
            summed = [s + _moved(m, b) for s, m, b in zip(summed, moved, base)]
        runs = 1 + len(singles)
        allowance = [torch.maximum(s, _moved(t, b)) for s, t, b in zip(summed, together, base)]
    return Envelope(base, allowance, ambiguous, runs, _output_bounds(sim, runner), len(ambiguous) <= max_flips)


def _output_bounds(sim: Any, runner: IntegerSimulator) -> list[float]:
    returned = returned_outputs(sim.graph_signature, _outputs(sim.graph_module.graph.output_node().args[0]))
    return [runner.bounds.get(n, 0.0) if isinstance(n, torch.fx.Node) else 0.0 for n in returned]


def _moved(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # in place on one float64 copy: an output is a million elements, moved once per re-simulation
    moved = a.reshape(b.shape).to(torch.float64, copy=True)
    moved -= b  # b widened exactly, as a is
    return moved.abs_()


__all__ = ["Envelope", "IntegerSimulator", "MAX_FLIPS", "Resolver", "SimulationStats", "run_planned", "simulate",
           "simulate_envelope", "simulate_with_stats"]
