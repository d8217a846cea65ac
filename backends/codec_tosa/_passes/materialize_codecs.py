"""Pass: materialise a codec plan in an edge-dialect partition program (docs/DESIGN.md, "Materialisation").

The partitioner leaves the plan on FX node meta (`plan_meta`); this pass turns
it into graph nodes that Arm's TOSA lowering (TOSA-1.0+INT+FP) maps to INT8
TOSA operators. The representation is PT2E's, because that is the one Arm's
pass pipeline understands:

* an encoded producer port of domain ``s`` gets ``quantize_per_tensor(theta_s)
  -> dequantize_per_tensor(theta_s)`` right after it, and *every* use reads
  a dequantize of it. An INT8 consumer in ``s`` has the dequantize folded into
  its input (codes flow, no float round trip); a plain consumer or the graph
  output keeps it (the decode, one per value). When a value has both, the
  plain readers get a dequantize of their own, as PT2E gives each reader one:
  Arm's INT-only partitioner leaves a dequantize read outside the delegate on
  the CPU, and with it every operator that read the same node (a convolution,
  whose weight's dequantize then stayed in the delegate as an FP32 constant);
* an encoded use of domain ``d`` reading a plain value: one ``q(theta_d) ->
  dq(theta_d)`` per (value, domain), shared by those uses (the encode);
* an encoded use of ``d`` reading a value encoded in ``s != d``: ``q(theta_d)
  -> dq(theta_d)`` after ``dq(theta_s)`` (the transcode). Arm's
  ``InsertRescalePass`` turns the remaining ``dq_s -> q_d`` pair into one
  int8 -> int8 ``RESCALE``, so transcodes come out fused (codes in, codes
  out) without anything more from us;
* a WEIGHT in-port (offline-encoded operand): the constant it reads is
  evaluated, encoded (symmetric INT8, `Int8Affine.learn_weight`), stored as a
  new int8 lifted constant and read through ``dequantize_per_channel`` (or
  ``dequantize_per_tensor``), like PT2E's ``convert``. The original FP
  constant (and any constant-folded chain such as linear's weight permute) is
  removed when nothing else reads it.

What Arm's passes need, learned from executorch 1.5.1 ``backends/arm/_passes``:

* ``FoldAndAnnotateQParamsPass.is_foldable`` only folds q/dq into a node whose
  ``meta["custom"]["_arm_annotation_info"]`` says ``quantized``; the Arm
  quantizer sets it, so we set it on every operator with an encoded or
  weight port, and on the ``getitem`` nodes that read its encoded results
  (a q after a getitem of ``split``/``max_pool2d_with_indices`` must fold
  into the getitem, or the q is left reading int8). Nowhere else: plain
  operators stay FP32 and their dq/q neighbours are decomposed by
  ``DecomposeQuantNodesPass`` into MUL/ADD/FLOOR/CEIL/SELECT/CLAMP/CAST
  chains, which is exactly the decode/encode.
* q/dq around ``view_copy``, ``permute_copy``, ``_clone_dim_order``, ``cat``,
  ``slice`` and ``max_pool2d`` fold like around any annotated operator: the
  TOSA RESHAPE/TRANSPOSE/CONCAT/SLICE/MAX_POOL2D run on INT8. Arm's view
  propagation may still move a RESHAPE/TRANSPOSE into an FP32 encode chain
  (before its CAST), which is Arm's choice, not a codec.
* A list argument (``cat``) is folded with the *first* input's qparams
  (``_merge_qparams``); the plan guarantees all ``cat`` inputs share the
  block's domain (a transcode is inserted otherwise), so nothing is lost.
* TOSA INT8 ``CONV2D`` takes an INT32 bias at scale ``s_in * s_w[c]`` (zero
  point 0); Arm does not convert an FP32 bias (``RewriteConvPass`` only adds
  a zero int32 bias when there is none), so the bias of an operator with an
  encoded weight is stored as int32 codes behind ``dequantize_per_channel``,
  like the bias qspec Arm's quantizer derives. It stays a 32-bit operand, as
  docs/DESIGN.md requires.
* Weight axes: conv (non-transposed) and linear weights are encoded per
  output channel, axis 0, which ``RewriteConvPass``/``DecomposeLinearPass``
  turn into per-channel RESCALE. Arm's ``RewriteMatmulPass`` (mm/bmm ->
  MATMUL) only reads per-tensor scales, so a constant operand of mm/bmm/
  addmm (e.g. linear decomposed to ``permute(weight) -> addmm``) is encoded
  per tensor, which is also invariant under the permute. The encoded tensor
  is the value *at the port* (after any constant-folded permute/view), so no
  axis has to be mapped back through layout operators. A transposed
  convolution (output channels on axis 1) is not encoded: its table row
  (``int8_refused_if``) tells the planner to keep it FP32.
* The axis, bias argument and the activation whose scale the bias is
  accumulated with are the table row's facts, carried on node meta
  (`plan_meta.OpFacts`); so is the fact that an INT8 ``addmm`` cannot be
  lowered (the edge program keeps ``aten.linear``, which Arm's partitioner
  lists in ``ops_to_not_decompose`` for INT+FP).

The rewrite is in place: the pass mutates the program it is made for (the
backend already receives a deep copy of the partition).
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed ops)
import torch.fx
from executorch.exir.dialects._ops import ops as exir_ops
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputSpec, TensorArgument
from torch.fx.passes.infra.pass_base import PassResult

from codec_tosa.codecs.base import ChannelTheta, Theta
from codec_tosa.codecs.int8 import DEFAULT_CODEC, INT32_QMAX as _INT32_QMAX, INT32_QMIN as _INT32_QMIN
from codec_tosa._passes.constant_inputs import ConstantInputs
from codec_tosa._passes.pass_base import CodecPass
from codec_tosa.graph import program_constants, CONSTANT, FxUse, PortGraph, replace_fx_use
from codec_tosa.placement.meta import PortCodec, OpFacts, read_port_codecs, read_op_facts

_QD = exir_ops.edge.quantized_decomposed
Q_TENSOR = _QD.quantize_per_tensor.default
DQ_TENSOR = _QD.dequantize_per_tensor.default
DQ_CHANNEL = _QD.dequantize_per_channel.default

# Where Arm's quantizer marks an operator as quantized (annotation_meta.ArmAnnotationInfo).
ARM_ANNOTATION_KEY = "_arm_annotation_info"



class MaterializeError(ValueError):
    """The plan cannot be materialised; the message names the node and the reason."""


@dataclass
class MaterializeStats:
    """What was inserted (for reports and tests)."""

    decodes: int = 0  # dq of an encoded value read by a plain use or the output
    encodes: int = 0
    transcodes: int = 0
    value_codes: int = 0  # q->dq pairs after encoded producer ports
    weights: int = 0
    biases: int = 0
    removed_constants: list[str] = field(default_factory=list)

    @property
    def codecs(self) -> int:
        """Codecs and encoded weights and biases inserted, in all."""
        return self.decodes + self.encodes + self.transcodes + self.value_codes + self.weights + self.biases


class MaterializeCodecsPass(CodecPass):
    """Insert the plan of `exported_program` (on its nodes' meta) as codecs and
    offline-encoded weights, in place (called on its graph module); `stats` says
    what was inserted, `count` how many codecs, weights and biases."""

    def __init__(self, exported_program: ExportedProgram) -> None:
        super().__init__()
        self.exported_program = exported_program
        self.stats = MaterializeStats()

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        ep = self.exported_program
        assert graph_module is ep.graph_module, "the pass rewrites the program it was made for"
        graph = PortGraph.from_fx(graph_module, program_constants(ep))
        ins, outs = read_port_codecs(graph)
        self.stats = stats = MaterializeStats()
        if not any(ins) and not any(outs):
            self.count = 0
            return PassResult(graph_module, False)
        _check_thetas(graph, ins, outs)
        m = _Materializer(ep, graph, ins, outs, stats)
        m.annotate_int8_ops()
        m.encode_weights()
        m.insert_activation_codecs()
        m.clean_up()  # recompiles
        self.count = stats.codecs
        return PassResult(graph_module, True)


class _Materializer:
    def __init__(self, ep: ExportedProgram, graph: PortGraph, ins: list[PortCodec | None],
                 outs: list[PortCodec | None], stats: MaterializeStats) -> None:
        self.ep = ep
        self.gm = ep.graph_module
        self.fx = ep.graph_module.graph
        self.g = graph
        self.ins = ins
        self.outs = outs
        self.stats = stats
        self._const_values: dict[int, torch.Tensor] = {}
        self._read_constants: list[torch.fx.Node] = []
        self.constants = ConstantInputs(ep)  # placeholders added and removed in linear time

    # ---- annotation -------------------------------------------------------
    def annotate_int8_ops(self) -> None:
        """Mark every operator with an encoded or weight port as quantized for Arm."""
        for op in range(self.g.num_ops):
            node = self.g.fx_op_node[op]
            int8 = any(self.ins[p] is not None for p in self.g.op_in[op]) or \
                any(self.outs[v] is not None for v in self.g.op_out[op])
            if node is None or not int8:
                continue
            facts = read_op_facts(self.g, op)
            if facts is not None and facts.refusal is not None:
                raise MaterializeError(f"node {node.name} ({self.g.op_target[op]}): {facts.refusal}")
            marked = [node]
            # a multi-output operator's encoded results are read through getitem
            # nodes; the q after each must fold into the getitem, as in PT2E
            marked += [self.g.fx_value_node[v] for v in self.g.op_out[op]
                       if self.outs[v] is not None and self.g.fx_value_node[v] not in (None, node)]
            for n in marked:
                # a plain mapping, as Arm's own `mark_node_as_annotated` stores it
                # (ArmAnnotationInfo accepts one): no import of Arm internals here
                n.meta.setdefault("custom", {})[ARM_ANNOTATION_KEY] = {"quantized": True}

    # ---- offline weights --------------------------------------------------
    def encode_weights(self) -> None:
        for op in range(self.g.num_ops):
            weight_ports = [p for p in self.g.op_in[op] if self.ins[p] is not None and self.ins[p].weight]
            if not weight_ports:
                continue
            facts = read_op_facts(self.g, op)
            if facts is None:
                raise MaterializeError(f"node {self.g.op_name[op]}: encoded weights but no operator "
                                       "facts in the plan")
            w_scales: torch.Tensor | None = None
            for p in weight_ports:
                w_scales = self._encode_weight(op, p, facts)
            if facts.bias is not None and len(weight_ports) == 1 and w_scales is not None:
                self._encode_bias(op, facts, w_scales)

    def _encode_weight(self, op: int, port: int, facts: OpFacts) -> torch.Tensor:
        """Replace the constant read at `port` by int8 codes + dequantize; return the scales."""
        value = self.g.in_value[port]
        constant = self._constant(value, port)
        w = constant.float()
        name = self.g.op_name[op]
        axis = facts.axis
        per_channel = axis is not None
        if axis not in (None, 0):
            raise MaterializeError(f"node {name}: per-channel weight scales on axis {axis}; "
                                   "the lowering takes axis 0 only")
        if per_channel and w.shape[0] != self._out_channels(op, facts):
            raise MaterializeError(
                f"node {name}: weight {tuple(w.shape)} does not have the {self._out_channels(op, facts)} "
                "output channels on axis 0")
        if per_channel:
            ct = DEFAULT_CODEC.learn_weight(w, axis=0)
        else:
            # one scale for the whole tensor (Arm's MATMUL rescale is per tensor)
            ct = DEFAULT_CODEC.learn_weight(w.reshape(1, -1), axis=0)
        codes = _quantize_symmetric(w, ct)
        codes_node = self._new_constant(f"{name}_{self.g.in_arg[port]}_int8", codes)
        if per_channel:
            scales = self._new_constant(f"{name}_{self.g.in_arg[port]}_scale", ct.scales.float())
            zps = self._new_constant(f"{name}_{self.g.in_arg[port]}_zp", torch.zeros(len(ct.scales), dtype=torch.int64))
            dq = self._call_after_constants(DQ_CHANNEL, (codes_node, scales, zps, 0, ct.qmin, ct.qmax, ct.dtype),
                                            codes_node.meta["val"].to(constant.dtype), self.g.fx_op_node[op],
                                            _dq_kwargs(constant.dtype))
        else:
            dq = self._call_after_constants(DQ_TENSOR, (codes_node, float(ct.scales[0]), 0, ct.qmin, ct.qmax, ct.dtype),
                                            codes_node.meta["val"].to(constant.dtype), self.g.fx_op_node[op],
                                            _dq_kwargs(constant.dtype))
        replace_fx_use(self._fx_use(port), dq)
        self.stats.weights += 1
        return ct.scales.float()

    def _encode_bias(self, op: int, facts: OpFacts, w_scales: torch.Tensor) -> None:
        """The bias as int32 codes at s_in * `w_scales`, read through a dequantize at that scale."""
        assert facts.bias is not None and facts.bias_scale_of is not None
        bias_port = self._port_by_arg(op, facts.bias)
        act_port = self._port_by_arg(op, facts.bias_scale_of)
        if bias_port is None:
            return  # Arm adds a zero int32 bias itself
        act = self.ins[act_port] if act_port is not None else None
        if act is None or act.theta is None:
            raise MaterializeError(
                f"node {self.g.op_name[op]}: weight is encoded but input {facts.bias_scale_of} is not; "
                "an INT8 compute operator needs an encoded activation to scale its int32 bias")
        constant = self._constant(self.g.in_value[bias_port], bias_port)
        bias = constant.float()
        coded = (act.theta.scale * w_scales).expand(bias.shape[-1]).contiguous().float()
        scales = coded
        exact = torch.round(bias / coded)
        name = self.g.op_name[op]
        if bool(((exact < _INT32_QMIN) | (exact > _INT32_QMAX)).any()):
            # a tiny input scale: the clamped bias makes the artefact wrong, so say so
            warnings.warn(f"node {name}: the int32 bias codes overflow at input scale "
                          f"{act.theta.scale:.3g} and are clamped; the bias loses accuracy", stacklevel=2)
        codes = torch.clamp(exact, _INT32_QMIN, _INT32_QMAX).to(torch.int32)
        codes_node = self._new_constant(f"{name}_bias_int32", codes)
        scales_node = self._new_constant(f"{name}_bias_scale", scales)
        zps = self._new_constant(f"{name}_bias_zp", torch.zeros(len(scales), dtype=torch.int32))
        dq = self._call_after_constants(
            DQ_CHANNEL, (codes_node, scales_node, zps, 0, _INT32_QMIN, _INT32_QMAX, torch.int32),
            codes_node.meta["val"].to(constant.dtype), self.g.fx_op_node[op], _dq_kwargs(constant.dtype))
        replace_fx_use(self._fx_use(bias_port), dq)
        self.stats.biases += 1

    # ---- activations ------------------------------------------------------
    def insert_activation_codecs(self) -> None:
        for v in range(self.g.num_values):
            uses = self.g.val_uses[v]
            src = self.outs[v]
            enc_uses = [u for u in uses if self.ins[u] is not None and not self.ins[u].weight]
            if src is None and not enc_uses:
                continue
            node = self.g.fx_value_node[v]
            if node is None and not uses:
                continue  # an unused output of a multi-output operator: nothing reads codes
            if node is None:
                raise MaterializeError(f"value {self.g.val_name[v]}: no FX node to attach codecs to")
            self._codecs_for_value(v, node, src, enc_uses)

    def _codecs_for_value(self, v: int, node: torch.fx.Node, src: PortCodec | None,
                          enc_uses: list[int]) -> None:
        at = self._insertion_point(node)
        base = node  # what plain uses and same-domain uses read
        # a constant is encoded offline (its codes stored, read through a dequantize,
        # as a weight is): a runtime encode of a constant would be folded by Arm's
        # constant folding, which evaluates the codec's CAST as a truncation
        constant = self.g.val_kind[v] == CONSTANT
        value = self._constant(v, self.g.val_uses[v][0]) if constant and self.g.val_uses[v] else None
        dtype = value.dtype if value is not None else _fake(node).dtype  # what every dequantize gives
        if src is not None:
            theta_s = _theta(src, self.g.val_name[v])
            if value is not None:
                value, base = self._offline_codes(value, theta_s, self.g.val_name[v], dtype)
            else:
                q = self._q(node, theta_s, at)
                base = self._dq(q, theta_s, q, dtype)
                at = base
            self.stats.value_codes += 1
        # the decode is a dequantize apart from the one INT8 readers fold (module docstring)
        decode = base
        if src is not None and value is None and self._read_as_codes_and_plain(v):
            decode = self._dq(base.args[0], theta_s, base, dtype)
        # one q->dq per target domain, shared by its uses (encode or transcode)
        into: dict[int, torch.fx.Node] = {}
        for u in enc_uses:
            c = self.ins[u]
            if src is not None and c.domain == src.domain:
                continue
            if c.domain not in into:
                theta_d = _theta(c, self.g.in_port_label(u))
                if value is not None:
                    into[c.domain] = self._offline_codes(value, theta_d, self.g.val_name[v], dtype)[1]
                else:
                    q = self._q(base, theta_d, at)
                    into[c.domain] = at = self._dq(q, theta_d, q, dtype)
                if src is None:
                    self.stats.encodes += 1
                else:
                    self.stats.transcodes += 1
        if src is not None and any(self.ins[u] is None for u in self.g.val_uses[v]):
            self.stats.decodes += 1
        for u in self.g.val_uses[v]:
            c = self.ins[u]
            if c is not None and c.weight:
                continue  # handled by encode_weights
            new = into.get(c.domain, base) if c is not None else decode
            if new is not node:
                replace_fx_use(self._fx_use(u), new)

    def _read_as_codes_and_plain(self, v: int) -> bool:
        """Whether `v` has a reader of its codes (an INT8 consumer or a transcode) and
        a plain one (an FP32 consumer or the graph output)."""
        codecs = [self.ins[u] for u in self.g.val_uses[v]]
        return any(c is None for c in codecs) and any(c is not None and not c.weight for c in codecs)

    def _offline_codes(self, value: torch.Tensor, theta: Theta, name: str,
                       dtype: torch.dtype) -> tuple[torch.Tensor, torch.fx.Node]:
        """`value` encoded at compile time with theta (quantize_per_tensor, the plan's
        rounding); returns the decoded values and the dequantize (to `dtype`) that reads the codes."""
        args = (theta.scale, theta.zero_point, theta.qmin, theta.qmax, theta.dtype)
        codes = torch.ops.quantized_decomposed.quantize_per_tensor(value.float(), *args)
        codes_node = self._new_constant(f"{name}_codes", codes)
        dq = self._call_after_constants(DQ_TENSOR, (codes_node, *args),
                                        codes_node.meta["val"].to(dtype), None, _dq_kwargs(dtype))
        return torch.ops.quantized_decomposed.dequantize_per_tensor(codes, *args), dq

    def _q(self, x: torch.fx.Node, theta: Theta, after: torch.fx.Node) -> torch.fx.Node:
        return self._call(Q_TENSOR, (x, theta.scale, theta.zero_point, theta.qmin, theta.qmax, theta.dtype),
                          _fake(x).to(theta.dtype), after, x)

    def _dq(self, q: torch.fx.Node, theta: Theta, after: torch.fx.Node, dtype: torch.dtype) -> torch.fx.Node:
        return self._call(DQ_TENSOR, (q, theta.scale, theta.zero_point, theta.qmin, theta.qmax, theta.dtype),
                          _fake(q).to(dtype), after, q, _dq_kwargs(dtype))

    # ---- FX helpers -------------------------------------------------------
    def _call(self, target: Any, args: tuple[Any, ...], val: torch.Tensor, after: torch.fx.Node,
              meta_from: torch.fx.Node, kwargs: dict[str, Any] | None = None) -> torch.fx.Node:
        with self.fx.inserting_after(after):
            node = self.fx.call_function(target, args, kwargs)
        self.constants.note(node)
        node.meta["val"] = val
        for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
            if key in meta_from.meta:
                node.meta[key] = meta_from.meta[key]
        return node

    def _call_after_constants(self, target: Any, args: tuple[Any, ...], val: torch.Tensor,
                              meta_from: torch.fx.Node | None,
                              kwargs: dict[str, Any] | None = None) -> torch.fx.Node:
        node = self._call(target, args, val, self._last_placeholder(), meta_from or args[0], kwargs)
        return node

    def _insertion_point(self, node: torch.fx.Node) -> torch.fx.Node:
        # placeholders must stay first: codecs on a graph input go after the last one
        return self._last_placeholder() if node.op == "placeholder" else node

    def _last_placeholder(self) -> torch.fx.Node:
        last = self.constants.last_placeholder
        assert last is not None
        return last

    def _fx_use(self, port: int) -> FxUse:
        use = self.g.fx_in[port]
        if use is None:
            raise MaterializeError(f"in-port {self.g.in_port_label(port)}: no FX location")
        return use

    def _out_channels(self, op: int, facts: OpFacts) -> int:
        # the table row's fact: NCHW conv output (axis 1), (..., features) linear output (-1)
        shape = self.g.val_shape[self.g.op_out[op][0]]
        return shape[facts.out_channel_axis if facts.out_channel_axis is not None else -1]

    def _port_by_arg(self, op: int, arg: str) -> int | None:
        return next((p for p in self.g.op_in[op] if self.g.in_arg[p] == arg), None)

    def _constant(self, value: int, port: int) -> torch.Tensor:
        """The tensor of a constant value: a lifted constant or a constant-folded chain of them."""
        if value in self._const_values:
            return self._const_values[value]
        if self.g.val_kind[value] != CONSTANT:
            raise MaterializeError(
                f"in-port {self.g.in_port_label(port)}: planned as an offline-encoded weight but "
                f"{self.g.val_name[value]} is not a constant")
        node = self.g.fx_value_node[value]
        if node is None:
            raise MaterializeError(f"value {self.g.val_name[value]}: no FX node")
        t = self._evaluate(node)
        self._const_values[value] = t
        return t

    def _evaluate(self, node: torch.fx.Node) -> torch.Tensor:
        if node.op == "get_attr":
            t = getattr(self.gm, str(node.target), None)
            if t is None:
                raise MaterializeError(f"constant {node.name}: no tensor in the program")
            return t.detach()
        if node.op == "placeholder":
            t = self.constants.tensor(node)
            if t is None:
                raise MaterializeError(f"constant {node.name}: no tensor in the program")
            self._read_constants.append(node)
            return t.detach()
        if node.op == "call_function":
            # a getitem reads one output of a multi-output chain (in_proj_weight
            # split into q, k, v): its source evaluates to the tuple
            args = torch.fx.node.map_arg(node.args, self._evaluate)
            kwargs = torch.fx.node.map_arg(node.kwargs, self._evaluate)
            with torch.no_grad():
                return node.target(*args, **kwargs)
        raise MaterializeError(f"constant {node.name}: cannot evaluate a {node.op} node offline")

    def _new_constant(self, name: str, data: torch.Tensor) -> torch.fx.Node:
        return self.constants.add(name, data)

    # ---- clean-up ---------------------------------------------------------
    def clean_up(self) -> None:
        """Drop constant-folded chains and FP weights nothing reads any more; fix the signature."""
        self.fx.eliminate_dead_code()
        for node in dict.fromkeys(self._read_constants):
            if node.op == "placeholder" and not node.users:
                self.stats.removed_constants.append(node.name)
                self.constants.remove(node)
        self.constants.commit(self._output_specs())
        self.fx.lint()
        self.gm.recompile()

    def _output_specs(self) -> list[OutputSpec]:
        returned = list(self.fx.output_node().args[0])
        specs = []
        for spec, node in zip(self.ep.graph_signature.output_specs, returned):
            if isinstance(spec.arg, TensorArgument) and isinstance(node, torch.fx.Node):
                spec = OutputSpec(spec.kind, TensorArgument(node.name), spec.target)
            specs.append(spec)
        return specs


def _check_thetas(graph: PortGraph, ins: list[PortCodec | None], outs: list[PortCodec | None]) -> None:
    """Fail before touching the graph when an encoded port has no codec parameters."""
    for p, c in enumerate(ins):
        if c is not None and not c.weight:
            _theta(c, graph.in_port_label(p))
    for v, c in enumerate(outs):
        if c is not None:
            _theta(c, graph.out_port_label(v))


def _theta(codec: PortCodec, where: str) -> Theta:
    if codec.theta is None:
        raise MaterializeError(f"{where}: encoded in domain {codec.domain} but the plan has no theta "
                               "(missing calibration)")
    return codec.theta


def _dq_kwargs(dtype: torch.dtype) -> dict[str, Any]:
    """A dequantize gives the dtype of the value it stands for: FP32 by default, so a
    float16 program's dequantizes say ``out_dtype`` (as PT2E's convert writes them),
    or every reader would take FP32 inputs where it returns float16, which ExecuTorch's
    verifier refuses ("mismatched dtypes") before Arm lowers anything."""
    return {} if dtype == torch.float32 else {"out_dtype": dtype}


def _fake(node: torch.fx.Node) -> torch.Tensor:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise MaterializeError(f"node {node.name}: no meta['val'] tensor")
    return val


def _quantize_symmetric(w: torch.Tensor, ct: ChannelTheta) -> torch.Tensor:
    """int8 codes of `w` with the per-channel (or single) scales of `ct` along axis 0."""
    scales = ct.scales if len(ct.scales) == w.shape[0] else ct.scales.expand(w.shape[0])
    shape = [-1] + [1] * (w.dim() - 1)
    return torch.clamp(torch.round(w / scales.reshape(shape)), ct.qmin, ct.qmax).to(ct.dtype)
