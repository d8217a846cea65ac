"""Module selection: which spec each operator's module asks of `CodecQuantizer`, with the
names and meaning of the stock PT2E quantizers' setters (docs/DESIGN.md, "Module selection").

`set_global`, `set_module_type` and `set_module_name` each take a `CodecSpec` or None.
None leaves the module's operators out of the plan: their ports are plain, so no
domain spans them, and the target runs them as it runs unquantized operators. As in
Arm's and torchao's quantizers, a module name takes precedence over a module type,
and a type over the global spec; among several names (or types) on one operator's
module stack, the innermost module's wins.

A selected module's spec may differ from the quantizer's only in its widths
(`precision` int8 or int16, `weights` int8 or int4): placement, target and
calibration are one for the whole program. A domain is INT16 where an operator
of a module asking int16 reads or writes its codes (and with it the domains that
must share its width, `precision.Groups`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from codec_tosa.spec import AUTO, INT4, INT8, INT16, CodecSpec

# the widths a selected module may choose for itself (the rest is the program's)
_WIDTH_FIELDS = ("precision", "weights")
_WIDTHS = {"precision": (INT8, INT16), "weights": (INT8, INT4)}
# the largest code of a 4-bit weight range (Arm's a8w4 config: -7..7)
_INT4_QMAX = 7
# torch.export's module paths start at the traced root
_ROOT_PREFIX = "L['self']."


@dataclass
class ModuleSelection:
    """The setters' record: the global spec (None: nothing selected but what a module
    setter selects), then specs by module type (``module.qualname``, as
    ``nn_module_stack`` records types) and by module name."""

    base: CodecSpec
    global_spec: CodecSpec | None
    by_type: dict[str, CodecSpec | None] = field(default_factory=dict)
    by_name: dict[str, CodecSpec | None] = field(default_factory=dict)
    types: dict[str, type] = field(default_factory=dict)  # the module classes by_type names

    @property
    def selective(self) -> bool:
        """Some operator's spec is not the quantizer's own."""
        return self.global_spec is not self.base or bool(self.by_type) or bool(self.by_name)

    def set_global(self, spec: CodecSpec | None) -> None:
        self.global_spec = self._checked(spec, "set_global")

    def set_module_type(self, module_type: type, spec: CodecSpec | None) -> None:
        key = f"{module_type.__module__}.{module_type.__qualname__}"
        self.by_type[key] = self._checked(spec, f"set_module_type({module_type.__qualname__})")
        self.types[key] = module_type

    def set_module_name(self, name: str, spec: CodecSpec | None) -> None:
        self.by_name[name] = self._checked(spec, f"set_module_name({name!r})")

    def spec_of(self, node: torch.fx.Node | None) -> CodecSpec | None:
        """The spec `node`'s module asks (module docstring); None: left out of the plan."""
        if node is None:
            return self.global_spec
        stack = list(node.meta.get("nn_module_stack", {}).values())
        for path, _ in reversed(stack):  # innermost first
            name = str(path).removeprefix(_ROOT_PREFIX)
            if name in self.by_name:
                return self.by_name[name]
        for _, module_type in reversed(stack):
            key = module_type if isinstance(module_type, str) else \
                f"{module_type.__module__}.{module_type.__qualname__}"
            if key in self.by_type:
                return self.by_type[key]
        return self.global_spec

    def where(self, node: torch.fx.Node | None) -> str:
        """The setter that chose `node`'s spec, in words (a precision's reason)."""
        if node is not None:
            stack = list(node.meta.get("nn_module_stack", {}).values())
            for path, _ in reversed(stack):
                name = str(path).removeprefix(_ROOT_PREFIX)
                if name in self.by_name:
                    return f"module {name}"
            for _, module_type in reversed(stack):
                if module_type in self.by_type:
                    return f"module type {str(module_type).rsplit('.', 1)[-1]}"
        return "the global spec"

    def _checked(self, spec: Any, setter: str) -> CodecSpec | None:
        if spec is None:
            return None
        if _is_stock_config(spec):
            spec = self._from_stock(spec)
        if not isinstance(spec, CodecSpec):
            raise TypeError(f"CodecQuantizer.{setter}: expected a CodecSpec, a stock QuantizationConfig or "
                            f"None, not {type(spec).__name__}")
        if spec == self.base:
            return self.base
        for name in _WIDTH_FIELDS:
            value = getattr(spec, name)
            if value != getattr(self.base, name) and (value not in _WIDTHS[name]
                                                      or getattr(self.base, name) == AUTO):
                raise ValueError(f"CodecQuantizer.{setter}: {name}={value!r} per module needs a fixed "
                                 f"width ({' or '.join(_WIDTHS[name])}) and a quantizer whose own {name} "
                                 f"is not 'auto' (it is {getattr(self.base, name)!r})")
        same_widths = dataclasses.replace(spec, **{n: getattr(self.base, n) for n in _WIDTH_FIELDS})
        differing = [f.name for f in dataclasses.fields(CodecSpec)
                     if getattr(same_widths, f.name) != getattr(self.base, f.name)]
        if differing:
            name = differing[0]
            raise ValueError(f"CodecQuantizer.{setter}: the spec's {name}={getattr(spec, name)!r} differs from "
                             f"the quantizer's ({getattr(self.base, name)!r}); a module may choose only its "
                             f"widths ({', '.join(_WIDTH_FIELDS)}): placement, target and calibration are "
                             "the program's")
        return spec

    def _from_stock(self, config: Any) -> CodecSpec:
        """The spec a stock quantizer's config asks, so that a pipeline's own setter lines
        keep working when only the quantizer is swapped: its modules are selected, at
        INT16 codes where its activations are int16 (Arm's a16w8) and INT4 weights where
        its weight range is 4-bit (Arm's a8w4), else at the quantizer's own widths. Its
        observers and ranges are not used: the plan's own calibrate each domain."""
        activation = getattr(config, "input_activation", None) or getattr(config, "output_activation", None)
        weight = getattr(config, "weight", None)
        precision = INT16 if getattr(activation, "dtype", None) == torch.int16 else self.base.precision
        weights = INT4 if weight is not None and getattr(weight, "quant_max", 127) <= _INT4_QMAX \
            else self.base.weights
        if precision == self.base.precision and weights == self.base.weights:
            return self.base
        return dataclasses.replace(self.base, precision=precision, weights=weights)

    def arm_configs(self) -> dict[str, Any]:
        """What to select on Arm's own quantizer: True (quantize) or None, per setter."""
        return {"global": self.global_spec is not None,
                "types": {self.types[k]: v is not None for k, v in self.by_type.items()},
                "names": {k: v is not None for k, v in self.by_name.items()}}


def _is_stock_config(config: Any) -> bool:
    """A PT2E quantization config of a stock quantizer (Arm's, XNNPACK's: torchao's
    `QuantizationConfig` shape), not one of ours."""
    return not isinstance(config, CodecSpec) and hasattr(config, "input_activation") and hasattr(config, "weight")


__all__ = ["ModuleSelection"]
