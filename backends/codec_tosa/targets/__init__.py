"""The targets a plan is lowered for, one folder each, each one `Target`
(`base`): `tosa/` (our delegate, and Arm's stock TOSA delegate), `ethosu/`
(Vela), `vgf/` (ML SDK for Vulkan) and `xnnpack/`. The compiler, `save`,
`report`, `validate` and the quantizer find a target here and ask it."""

from __future__ import annotations

from typing import Any, Iterable

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.spec import ETHOS_U_PREFIX
from codec_tosa.targets.base import Target
from codec_tosa.targets.ethosu.target import EthosUTarget
from codec_tosa.targets.tosa.target import StockTosaTarget, TosaTarget
from codec_tosa.targets.vgf.target import VgfTarget
from codec_tosa.targets.xnnpack.target import XnnpackTarget

_NAMED: dict[str, Target] = {t.name: t for t in (TosaTarget(), VgfTarget(), XnnpackTarget())}
# the delegates validate checks in a .pte, in order of preference: ours first, Arm's
# stock TOSA delegate (which our runtime can run) last
_BY_BACKEND: tuple[Target, ...] = (_NAMED["tosa"], _NAMED["vgf"], EthosUTarget(), _NAMED["xnnpack"],
                                   StockTosaTarget())


def target_of(name: str) -> Target:
    """The target `CodecSpec(target=name)` names (the spec has checked the name)."""
    if name.startswith(ETHOS_U_PREFIX):
        return EthosUTarget(name)
    return _NAMED[name]


def target_in(backend_ids: Iterable[str]) -> Target | None:
    """The target whose delegates a program holds (the first, in order of preference), or None."""
    ids = set(backend_ids)
    return next((t for t in _BY_BACKEND if t.backend_id in ids), None)


def target_of_compile_spec(compile_spec: Any) -> Target:
    """The target an Arm compile spec lowers for, so that `CodecQuantizer(compile_spec)`
    stands where Arm's quantizers take one. Raises TypeError, one line, for anything
    that is not an Arm compile spec."""
    ethos_u, vgf, arm = arm_adapter.compile_spec_classes()
    if isinstance(compile_spec, ethos_u):
        return EthosUTarget(str(compile_spec.target))
    if isinstance(compile_spec, (vgf, arm)):
        return _NAMED["vgf" if isinstance(compile_spec, vgf) else "tosa"]
    raise TypeError(f"expected a CodecSpec or an Arm compile spec (TosaCompileSpec, EthosUCompileSpec, "
                    f"VgfCompileSpec), not {type(compile_spec).__name__}")


__all__ = ["Target", "target_in", "target_of", "target_of_compile_spec"]
