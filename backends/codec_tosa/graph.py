"""Port-level view of a dataflow graph: values (output ports) and uses (input ports).

This is the only code in codec_tosa that interprets FX argument layouts. Every
pass (placement, traffic, calibration, materialisation) works on `PortGraph`,
which is flat integer arrays so that a graph of 10^6 operators fits in memory
and is walked in linear time. `PortGraph.from_fx` builds it from a core-ATen or
edge-dialect `torch.fx.GraphModule`; `GraphBuilder` builds hand-made and
synthetic graphs without FX (tests, benchmarks).

Vocabulary (docs/DESIGN.md, "Objects"):
* operator: a `call_function` node other than `getitem`;
* value: an output port of an operator or a placeholder;
* use: an input port of an operator (variadic list arguments expanded, one
  port per element) or of the graph output.
* constant: a parameter, buffer or lifted constant, or the result of an
  operator whose tensor inputs are all constants (folded offline, so it moves
  nothing at run time).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.fx

# Value kinds.
ACTIVATION = 0
INPUT = 1
CONSTANT = 2

OUTPUT_OP = -1  # the `op` of a use that is the graph output


class GraphError(ValueError):
    """The graph cannot be analysed; the message names the node and the reason."""


def target_key(target: Any) -> str:
    """Canonical operator name, e.g. ``aten.convolution.default``, for ATen and edge ops."""
    schema = getattr(target, "_schema", None)
    if schema is not None:
        overload = schema.overload_name or "default"
        return f"{schema.name.replace('::', '.')}.{overload}"
    return getattr(target, "__name__", str(target))


@dataclass(frozen=True)
class FxUse:
    """Where an input port sits in FX: ``node.args[arg]`` or ``node.args[arg][item]``."""

    node: torch.fx.Node
    arg: int | str
    item: int | None


class PortGraph:
    """Operators, values and uses as flat arrays; build with `GraphBuilder` or `from_fx`."""

    def __init__(self) -> None:
        # operators (in topological order)
        self.op_name: list[str] = []
        self.op_target: list[str] = []
        self.op_in: list[list[int]] = []  # in-port ids of each operator
        self.op_out: list[list[int]] = []  # value ids of each operator's outputs
        self.op_const: list[bool] = []  # folded offline: all tensor inputs constant
        # values
        self.val_name: list[str] = []
        self.val_op: list[int] = []  # producer operator, -1 for placeholders
        self.val_slot: list[int] = []  # output index at the producer
        self.val_shape: list[tuple[int, ...]] = []
        self.val_dtype: list[torch.dtype] = []
        self.val_kind: list[int] = []
        self.val_uses: list[list[int]] = []  # in-port ids reading the value
        # in-ports (uses)
        self.in_op: list[int] = []  # consumer operator, OUTPUT_OP for the graph output
        self.in_value: list[int] = []
        self.in_arg: list[str] = []  # schema argument name ("tensors", "input", ...)
        self.in_item: list[int] = []  # index inside a list argument, else 0
        # FX back-references (None for hand-built graphs)
        self.fx_value_node: list[torch.fx.Node | None] = []
        self.fx_op_node: list[torch.fx.Node | None] = []
        self.fx_in: list[FxUse | None] = []

    # ---- sizes ---------------------------------------------------------
    @property
    def num_ops(self) -> int:
        return len(self.op_name)

    @property
    def num_values(self) -> int:
        return len(self.val_name)

    @property
    def num_in_ports(self) -> int:
        return len(self.in_op)

    def numel(self, value: int) -> int:
        n = 1
        for d in self.val_shape[value]:
            n *= d
        return n

    def itemsize(self, value: int) -> int:
        return self.val_dtype[value].itemsize

    def is_float(self, value: int) -> bool:
        return self.val_dtype[value].is_floating_point

    def in_port_label(self, port: int) -> str:
        op = self.in_op[port]
        owner = "output" if op == OUTPUT_OP else self.op_name[op]
        return f"{owner}.{self.in_arg[port]}[{self.in_item[port]}]"

    def out_port_label(self, value: int) -> str:
        op = self.val_op[value]
        if op < 0:
            return self.val_name[value]
        return f"{self.op_name[op]}.out[{self.val_slot[value]}]"

    def op_argument(self, op: int, name: str) -> Any:
        """A non-port argument of an FX operator by schema name (its default if not given)."""
        node = self.fx_op_node[op]
        if node is None:
            raise GraphError(f"operator {self.op_name[op]}: not from an FX graph")
        schema = getattr(node.target, "_schema", None)
        if schema is None:
            raise GraphError(f"node {node.name}: no schema to look up argument {name!r}")
        for i, a in enumerate(schema.arguments):
            if a.name == name:
                if i < len(node.args):
                    return node.args[i]
                return node.kwargs.get(name, a.default_value)
        raise GraphError(f"node {node.name}: {self.op_target[op]} has no argument {name!r}")

    # ---- construction from FX -----------------------------------------
    @classmethod
    def from_program(cls, ep: Any) -> "PortGraph":
        """View an ExportedProgram's graph as it is (no decomposition)."""
        return cls.from_fx(ep.graph_module, program_constants(ep))

    @classmethod
    def from_fx(
        cls,
        gm: torch.fx.GraphModule,
        constant_names: Sequence[str] = (),
    ) -> "PortGraph":
        """View an FX graph; `constant_names` are placeholders that hold parameters/buffers/constants.

        Every tensor-carrying node needs ``meta["val"]`` with static shapes.
        """
        b = GraphBuilder()
        consts = set(constant_names)
        value_of: dict[torch.fx.Node, int] = {}  # single-output node -> value
        multi_of: dict[torch.fx.Node, list[int]] = {}  # multi-output node -> values

        for node in gm.graph.nodes:
            if node.op == "placeholder":
                shape, dtype = _tensor_meta(node, node.meta.get("val"))
                if shape is None:
                    continue  # a non-tensor input (symbolic int etc.): no port
                kind = CONSTANT if node.name in consts else INPUT
                value_of[node] = b.placeholder(node.name, shape, dtype, kind, fx_node=node)
            elif node.op == "get_attr":
                val = node.meta.get("val")
                if isinstance(val, torch.Tensor):
                    shape, dtype = _tensor_meta(node, val)
                    value_of[node] = b.placeholder(node.name, shape, dtype, CONSTANT, fx_node=node)
            elif node.op == "call_function" and node.target is operator.getitem:
                src, idx = node.args
                if src not in multi_of:
                    raise GraphError(f"node {node.name}: getitem of {src} which is not a multi-output operator")
                value_of[node] = multi_of[src][idx]
                b.set_value_node(multi_of[src][idx], node)
            elif node.op == "call_function":
                value_of, multi_of = cls._add_fx_op(b, node, value_of, multi_of)
            elif node.op == "output":
                uses = [
                    (FxUse(node, 0, i), value_of[a])
                    for i, a in enumerate(_flatten_output(node.args[0]))
                    if isinstance(a, torch.fx.Node) and a in value_of
                ]
                b.graph_output([v for _, v in uses], fx_uses=[u for u, _ in uses])
            elif node.op == "call_module" and not node.users:
                continue  # torch.export's input guard (`.module()`'s `_guards_fn`): no ports
            elif node.op == "call_module":
                raise GraphError(f"node {node.name}: call_module is not supported; export the model first")
        return b.finish()

    @staticmethod
    def _add_fx_op(
        b: "GraphBuilder",
        node: torch.fx.Node,
        value_of: dict[torch.fx.Node, int],
        multi_of: dict[torch.fx.Node, list[int]],
    ) -> tuple[dict[torch.fx.Node, int], dict[torch.fx.Node, list[int]]]:
        inputs: list[tuple[str, int, FxUse]] = []
        names = _argument_names(node)
        for pos, arg in enumerate(node.args):
            name = names[pos] if pos < len(names) else f"arg{pos}"
            if isinstance(arg, torch.fx.Node):
                if arg in value_of:
                    inputs.append((name, value_of[arg], FxUse(node, pos, None)))
            elif isinstance(arg, (list, tuple)):
                for i, a in enumerate(arg):
                    if isinstance(a, torch.fx.Node) and a in value_of:
                        inputs.append((name, value_of[a], FxUse(node, pos, i)))
        for key, arg in node.kwargs.items():
            if isinstance(arg, torch.fx.Node) and arg in value_of:
                inputs.append((key, value_of[arg], FxUse(node, key, None)))

        val = node.meta.get("val")
        schema = getattr(node.target, "_schema", None)
        if schema is not None and not schema.returns:
            return value_of, multi_of  # an assertion or other side effect: no ports, no traffic
        if isinstance(val, (list, tuple)):
            outs = [_tensor_meta(node, v) for v in val]
            if any(s is None for s, _ in outs):
                raise GraphError(f"node {node.name}: an output has no tensor meta['val']")
            ids = b.op(node.name, target_key(node.target), inputs=[(n, v) for n, v, _ in inputs],
                       outputs=outs, fx_node=node, fx_uses=[u for _, _, u in inputs])
            multi_of[node] = ids
        else:
            shape, dtype = _tensor_meta(node, val)
            if shape is None:
                raise GraphError(
                    f"node {node.name} ({target_key(node.target)}): no meta['val'] tensor; "
                    "analyse an exported program or run FakeTensor propagation first")
            (vid,) = b.op(node.name, target_key(node.target), inputs=[(n, v) for n, v, _ in inputs],
                          outputs=[(shape, dtype)], fx_node=node, fx_uses=[u for _, _, u in inputs])
            value_of[node] = vid
        return value_of, multi_of


def has_empty_tensor(node: torch.fx.Node) -> bool:
    """True when `node` reads or produces a tensor with no elements (a zero-size dim).

    Of a multi-output node only the results something reads count: an
    inference batch norm's saved mean and variance are empty and unused."""
    def empty(v: Any) -> bool:
        return isinstance(v, torch.Tensor) and v.numel() == 0

    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        read = {u.args[1] for u in node.users if u.target is operator.getitem}
        produces_empty = any(empty(v) for i, v in enumerate(val) if i in read)
    else:
        produces_empty = empty(val)
    return produces_empty or any(empty(a.meta.get("val")) for a in node.all_input_nodes)


def user_input_nodes(ep: Any) -> list[torch.fx.Node]:
    """The placeholders of an ExportedProgram that are user inputs, in order (the
    signature's `user_inputs` is rebuilt on each access: read it once)."""
    names = set(ep.graph_signature.user_inputs)
    return [n for n in ep.graph.nodes if n.op == "placeholder" and n.name in names]


def program_constants(ep: Any) -> list[str]:
    """Placeholders of an ExportedProgram holding parameters, buffers and lifted constants."""
    sig = ep.graph_signature
    return [*sig.inputs_to_parameters, *sig.inputs_to_buffers, *sig.inputs_to_lifted_tensor_constants]


def _argument_names(node: torch.fx.Node) -> list[str]:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return [f"arg{i}" for i in range(len(node.args))]
    return [a.name for a in schema.arguments]


def _flatten_output(arg: Any) -> list[Any]:
    if isinstance(arg, (list, tuple)):
        out: list[Any] = []
        for a in arg:
            out.extend(_flatten_output(a))
        return out
    return [arg]


def _tensor_meta(node: torch.fx.Node, val: Any) -> tuple[tuple[int, ...] | None, torch.dtype | None]:
    if not isinstance(val, torch.Tensor):
        return None, None
    if any(isinstance(d, torch.SymInt) for d in val.shape):
        raise GraphError(
            f"node {node.name}: dynamic (symbolic) shape {tuple(val.shape)}; "
            "codec placement needs static shapes")
    return tuple(int(d) for d in val.shape), val.dtype


class GraphBuilder:
    """Builds a `PortGraph` operator by operator (in topological order)."""

    def __init__(self) -> None:
        self.g = PortGraph()

    def placeholder(
        self,
        name: str,
        shape: Sequence[int],
        dtype: torch.dtype = torch.float32,
        kind: int = INPUT,
        fx_node: torch.fx.Node | None = None,
    ) -> int:
        return self._value(name, -1, 0, tuple(shape), dtype, kind, fx_node)

    def constant(self, name: str, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> int:
        return self.placeholder(name, shape, dtype, CONSTANT)

    def op(
        self,
        name: str,
        target: str,
        inputs: Sequence[tuple[str, int]],
        outputs: Sequence[tuple[Sequence[int], torch.dtype]] | Sequence[int] = (),
        fx_node: torch.fx.Node | None = None,
        fx_uses: Sequence[FxUse] | None = None,
    ) -> list[int]:
        """Add an operator; `inputs` are (argument name, value id); returns output value ids.

        `outputs` is a list of (shape, dtype), or a single shape for one FP32 output.
        """
        g = self.g
        op = len(g.op_name)
        g.op_name.append(name)
        g.op_target.append(target)
        g.fx_op_node.append(fx_node)
        ports: list[int] = []
        item_count: dict[str, int] = {}
        for k, (arg, value) in enumerate(inputs):
            item = item_count.get(arg, 0)
            item_count[arg] = item + 1
            ports.append(self._in_port(op, value, arg, item, fx_uses[k] if fx_uses else None))
        g.op_in.append(ports)
        # constant folding: an operator with only constant tensor inputs (or none,
        # like arange/full) is computed offline and moves nothing at run time
        const = all(g.val_kind[v] == CONSTANT for _, v in inputs)
        g.op_const.append(const)
        if outputs and isinstance(outputs[0], int):
            outputs = [(tuple(outputs), torch.float32)]  # type: ignore[list-item]
        outs = [
            self._value(name if len(outputs) == 1 else f"{name}.{i}", op, i, tuple(shape),
                        dtype, CONSTANT if const else ACTIVATION, fx_node if len(outputs) == 1 else None)
            for i, (shape, dtype) in enumerate(outputs)  # type: ignore[misc]
        ]
        g.op_out.append(outs)
        return outs

    def graph_output(self, values: Sequence[int], fx_uses: Sequence[FxUse] | None = None) -> None:
        for k, v in enumerate(values):
            self._in_port(OUTPUT_OP, v, "output", k, fx_uses[k] if fx_uses else None)

    def set_value_node(self, value: int, node: torch.fx.Node) -> None:
        self.g.fx_value_node[value] = node
        self.g.val_name[value] = node.name

    def finish(self) -> PortGraph:
        return self.g

    def _value(self, name: str, op: int, slot: int, shape: tuple[int, ...], dtype: torch.dtype,
               kind: int, fx_node: torch.fx.Node | None) -> int:
        g = self.g
        g.val_name.append(name)
        g.val_op.append(op)
        g.val_slot.append(slot)
        g.val_shape.append(shape)
        g.val_dtype.append(dtype)
        g.val_kind.append(kind)
        g.val_uses.append([])
        g.fx_value_node.append(fx_node)
        return len(g.val_name) - 1

    def _in_port(self, op: int, value: int, arg: str, item: int, fx_use: FxUse | None) -> int:
        g = self.g
        if not 0 <= value < len(g.val_name):
            raise GraphError(f"operator {g.op_name[op] if op >= 0 else 'output'}: unknown value id {value}")
        port = len(g.in_op)
        g.in_op.append(op)
        g.in_value.append(value)
        g.in_arg.append(arg)
        g.in_item.append(item)
        g.fx_in.append(fx_use)
        g.val_uses[value].append(port)
        return port


def replace_fx_use(use: FxUse, new: torch.fx.Node) -> None:
    """Make one FX input port read `new` instead of its current value."""
    node = use.node
    if isinstance(use.arg, str):
        node.update_kwarg(use.arg, new)
    elif use.item is None:
        node.update_arg(use.arg, new)
    else:
        seq = list(node.args[use.arg])
        seq[use.item] = new
        node.update_arg(use.arg, type(node.args[use.arg])(seq) if isinstance(node.args[use.arg], tuple) else seq)
