"""Constant placeholders of an ExportedProgram added and removed in bulk, in linear time.

executorch's `create_constant_placeholder` and `delete_constant_placeholder`
rescan the graph and rebuild the signature's name maps on every call, which
made materialising a plan quadratic in its encoded weights (1,000 Linear
blocks: 49 s). Here the first user input, the last placeholder, the node names
and the tensor behind each existing constant are read once; new constants are
placed as those helpers place them (before the first user input); and the
graph signature is rebuilt once, in placeholder order, by `commit`.

ExportedProgram has no public setter for its signature (executorch's helpers and
Arm's pass adapter write the private `_graph_signature`): its specs are replaced
in place instead, in the lists of the signature the program holds.
"""

from __future__ import annotations

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, InputSpec, OutputSpec, TensorArgument


class ConstantInputs:
    """The constant placeholders of one program while a pass rewrites it."""

    def __init__(self, ep: ExportedProgram) -> None:
        self.ep = ep
        self.fx = ep.graph_module.graph
        placeholders = [n for n in self.fx.nodes if n.op == "placeholder"]
        specs = ep.graph_signature.input_specs
        assert len(placeholders) == len(specs), "an ExportedProgram has one input spec per placeholder"
        self._spec: dict[torch.fx.Node, InputSpec] = dict(zip(placeholders, specs))
        user = [n for n, s in self._spec.items() if s.kind == InputKind.USER_INPUT]
        self._first_user_input = user[0] if user else None
        self.last_placeholder = placeholders[-1] if placeholders else None
        self._names = {n.name for n in self.fx.nodes}
        self._removed: list[torch.fx.Node] = []
        self._fake_mode = next((n.meta["val"].fake_mode for n in placeholders
                                if isinstance(n.meta.get("val"), FakeTensor)), None)

    def tensor(self, node: torch.fx.Node) -> torch.Tensor | None:
        """The tensor behind an existing parameter, buffer or lifted constant placeholder."""
        spec = self._spec.get(node)
        if spec is None or spec.target is None:
            return None
        if spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent):
            return self.ep.state_dict.get(spec.target)
        if spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            return self.ep.constants.get(spec.target)
        return None

    def unique_name(self, name: str) -> str:
        """`name`, or `name_<i>` for the first i that no node has."""
        if name not in self._names:
            return name
        i = 1
        while f"{name}_{i}" in self._names:
            i += 1
        return f"{name}_{i}"

    def note(self, node: torch.fx.Node) -> None:
        """A node the pass created, so that no later constant takes its name."""
        self._names.add(node.name)

    def add(self, name: str, data: torch.Tensor) -> torch.fx.Node:
        """A new lifted constant holding `data`, before the user inputs."""
        name = self.unique_name(name)
        if self._first_user_input is not None:
            context = self.fx.inserting_before(self._first_user_input)
        elif self.last_placeholder is not None:
            context = self.fx.inserting_after(self.last_placeholder)
        else:
            context = self.fx.inserting_before(next(iter(self.fx.nodes)))
        with context:
            node = self.fx.placeholder(name)
        node.target = node.name
        node.meta["val"] = (self._fake_mode.from_tensor(data, static_shapes=True)
                            if self._fake_mode is not None else data)
        self.ep.constants[node.name] = data
        self._spec[node] = InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(node.name), node.name)
        self.note(node)
        if self._first_user_input is None:
            self.last_placeholder = node
        return node

    def remove(self, node: torch.fx.Node) -> None:
        """Drop a constant placeholder nothing reads any more (its data too), at `commit`."""
        if node.users:
            raise RuntimeError(f"constant {node.name} still has readers")
        self._removed.append(node)

    def commit(self, outputs: list[OutputSpec] | None = None) -> None:
        """Erase the removed constants and write the signature once (with `outputs` if given)."""
        for node in dict.fromkeys(self._removed):
            spec = self._spec.pop(node)
            in_state_dict = spec.kind == InputKind.PARAMETER or (spec.kind == InputKind.BUFFER and spec.persistent)
            if spec.target is not None:
                (self.ep.state_dict if in_state_dict else self.ep.constants).pop(spec.target, None)
            if node is self.last_placeholder:
                self.last_placeholder = node.prev if node.prev.op == "placeholder" else None
            self.fx.erase_node(node)
        self._removed.clear()
        sig = self.ep.graph_signature
        sig.input_specs[:] = [self._spec[n] for n in self.fx.nodes if n.op == "placeholder"]
        if outputs is not None:
            sig.output_specs[:] = outputs
