"""codec_tosa's door to executorch's Arm backend: compile specs, partitioners,
quantizer, and Arm's TOSA lowering into a serializer of ours.

executorch 1.5.1 is pinned. Arm's pass pipeline gets codec_tosa's passes
through its own extension points (`arm_pipeline`); every private symbol that
is still needed is in `arm_private`, checked at import. The golden test
(tests/serialization/test_golden.py) tells whether the lowering still matches
stock Arm output byte for byte.
"""

from __future__ import annotations

import contextlib
import io
from contextlib import ExitStack
from typing import Any, Callable, Iterable

import tosa_serializer as ts
from executorch.backends.arm.common.arm_compile_spec import ArmCompileSpec
from executorch.backends.arm.common.debug import debug_tosa_dump
from executorch.backends.arm.common.pipeline_config import ArmPassPipelineConfig, SDPASafeSoftmaxGuardPolicy
from executorch.backends.arm.debug.schema import DebugHook
from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner, VelaExternalBlockPlacements
from executorch.backends.arm.quantizer import (
    EthosUQuantizer,
    TOSAQuantizer,
    get_symmetric_quantization_config,
)
from executorch.backends.arm.tosa.backend import TOSABackend, arm_get_first_delegation_tag
from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from codec_tosa.arm import private as arm_private
from codec_tosa.arm.pipeline import CodecArmPassManager, PipelineOptions
from codec_tosa.arm.private import (  # noqa: F401  (re-exported: the artefacts Arm's backends make)
    VelaRun,
    VgfConversion,
    install_payload_journal,
    install_vgf_tosa_lowering,
    lowering_tables_emptied,
    tosa_of_payload,
    vela_blocks,
    vela_runs_kept,
    vgf_conversions_kept,
)

SerializerFactory = Callable[..., ts.TosaSerializer]


def tosa_compile_spec(tosa_spec: str) -> TosaCompileSpec:
    """Arm's compile spec for a TOSA spec string such as ``TOSA-1.0+INT+FP``."""
    return TosaCompileSpec(tosa_spec)


def remove_safe_softmax_guards(compile_spec: ArmCompileSpec) -> None:
    """Tell Arm's pass pipeline to remove SDPA's safe-softmax guards (its
    `RemoveSafeSoftmaxGuardPass`), for a program where none can fire
    (`planning.safe_softmax`). The rest of the pipeline config is Arm's default,
    which is every mixed-precision spec's (only U55, integer-only, differs)."""
    compile_spec.set_pass_pipeline_config(
        ArmPassPipelineConfig(sdpa_safe_softmax_guard=SDPASafeSoftmaxGuardPolicy.REMOVE))


def compile_spec_from_list(compile_specs: Iterable[CompileSpec]) -> TosaCompileSpec:
    """Parse a delegate's compile-spec list; unknown (codec_tosa) keys are ignored by Arm."""
    return TosaCompileSpec._from_list(list(compile_specs))


def new_serializer(
    compile_spec: TosaCompileSpec, factory: SerializerFactory = ts.TosaSerializer
) -> ts.TosaSerializer:
    """A serializer set up exactly as `TOSABackend._preprocess` sets up its own,
    with its check that the serializer can write the compile spec's TOSA version."""
    version = compile_spec.tosa_spec.version
    if not (version.major == ts.TOSA_VERSION_MAJOR and version.minor <= ts.TOSA_VERSION_MINOR):
        raise RuntimeError(f"TOSA serializer version ({ts.TOSA_VERSION_MAJOR}.{ts.TOSA_VERSION_MINOR}) "
                           f"doesn't match specification {compile_spec.tosa_spec}")
    serializer = factory(
        compile_spec._get_intermediate_path() or "",
        targetMajor=version.major,
        targetMinor=version.minor,
        targetPatch=version.micro,
        targetDraft=version.minor > 0,
    )
    if compile_spec.tosa_dev_mode:
        serializer.setExperimentalDevVersion()
    return serializer


def lower_into(
    edge_program: ExportedProgram,
    compile_spec: TosaCompileSpec,
    serializer: ts.TosaSerializer,
    *,
    dedup_const_shapes: bool | None = None,
    lower_codecs: bool = False,
) -> bytes:
    """Run Arm's pass pipeline and node visitors into `serializer`; return the flatbuffer.

    Graph-owned constants (Arm's `process_node._add_const` and the CONST_SHAPE
    visitor) are added inside the serializer's `graph_owned_constants()`
    context when it has one (`MarkingTosaSerializer`, `PooledTosaSerializer`),
    so only helper constants are pooled and external weights know theirs.
    `dedup_const_shapes` merges identical static CONST_SHAPE FX nodes after
    Arm's pass pipeline (in every control-flow submodule too); None means "when
    the serializer pools", so a plain or merely marking serializer still gives
    stock bytes. `lower_codecs` (a program that carries a codec plan) runs
    `LowerCodecsPass` inside Arm's pipeline; off, the lowering is stock.

    As Arm's own backend does, a compile spec with an intermediate path
    (`dump_intermediate_artifacts_to`) gets the TOSA flatbuffer written there,
    and with a debug mode (`dump_debug_info`) Arm's node visitors record their
    debug information (``debug.json`` in JSON mode).
    """
    if dedup_const_shapes is None:
        dedup_const_shapes = hasattr(serializer, "record_const_shape_dedup")
    options = PipelineOptions(lower_codecs=lower_codecs, dedup_const_shapes=dedup_const_shapes,
                              record_dedup=getattr(serializer, "record_const_shape_dedup", None))
    debug_mode = compile_spec.tosa_debug_mode
    debug_hook = DebugHook(debug_mode) if debug_mode is not None else None
    with ExitStack() as patches:
        patches.enter_context(arm_private.pass_manager_handed_in(CodecArmPassManager.configured(options)))
        patches.enter_context(arm_private.graph_owned_constants_marked())
        TOSABackend._preprocess_module(
            edge_program.graph_module, edge_program, compile_spec, serializer, debug_hook
        )
    binary = bytes(serializer.serialize())
    _dump_intermediates(binary, edge_program, compile_spec, debug_hook)
    return binary


def _dump_intermediates(binary: bytes, edge_program: ExportedProgram, compile_spec: TosaCompileSpec,
                        debug_hook: Any) -> None:
    """What `TOSABackend._preprocess` writes to the intermediate path, named as it names them."""
    path = compile_spec._get_intermediate_path()
    if not path:
        return
    tag = arm_get_first_delegation_tag(edge_program.graph_module)
    debug_tosa_dump(binary, path, suffix=(f"_{tag}" if tag else "") + f"_{compile_spec.tosa_spec}")
    if debug_hook is not None and debug_hook.mode == ArmCompileSpec.DebugMode.JSON:
        with open(f"{path}/debug.json", "w") as f:
            f.write(debug_hook.serialize())


def arm_compile_spec_entries(compile_spec: TosaCompileSpec) -> list[CompileSpec]:
    """The compile-spec list Arm itself would put in a delegate."""
    return list(compile_spec._to_list())


def stock_partitioner(compile_spec: TosaCompileSpec, **kwargs: Any):
    """Arm's own TOSA partitioner (used for operator support and the stock baseline)."""
    return TOSAPartitioner(compile_spec, **kwargs)


ETHOS_U_BACKEND_ID = "EthosUBackend"
TOSA_BACKEND_ID = "TOSABackend"  # Arm's stock TOSA delegate: a TOSA flatbuffer, as ours


def arm_quantizer(tosa_spec: str, ethos_u_target: str | None = None,
                  selection: dict[str, Any] | None = None) -> Any:
    """Arm's stock PT2E quantizer for the target, with its symmetric INT8 config
    everywhere, or where `selection` selects (``{"global": bool, "types": {type: bool},
    "names": {name: bool}}``; False: None, the module left unquantized): `CodecQuantizer`
    asks it which operators Arm's INT flow takes."""
    quantizer = (EthosUQuantizer(ethos_u_compile_spec(ethos_u_target)) if ethos_u_target
                 else TOSAQuantizer(tosa_compile_spec(tosa_spec)))
    config = get_symmetric_quantization_config()
    if selection is None:
        quantizer.set_global(config)
        return quantizer
    quantizer.set_global(config if selection["global"] else None)
    for module_type, on in selection["types"].items():
        quantizer.set_module_type(module_type, config if on else None)
    for name, on in selection["names"].items():
        quantizer.set_module_name(name, config if on else None)
    return quantizer


def compile_spec_classes() -> tuple[type, type, type]:
    """Arm's Ethos-U and VGF compile specs, and the base every Arm compile spec derives
    from (TosaCompileSpec's): what `CodecQuantizer(compile_spec)` tells targets apart by."""
    return EthosUCompileSpec, VgfCompileSpec, ArmCompileSpec


def ethos_u_compile_spec(target: str, weights_tag: str | None = None) -> Any:
    """Arm's Ethos-U compile spec for `target` (``ethos-u55-128``, ``ethos-u85-256``, ...);
    with `weights_tag`, Vela's weight block goes to named data under that external tag
    (Arm's `external_block_placements`: a .ptd beside the .pte).

    Raises ValueError, one line, for a target Arm does not know."""
    placements = None if weights_tag is None else VelaExternalBlockPlacements(weight_data=weights_tag)
    try:
        return EthosUCompileSpec(target, external_block_placements=placements)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"unknown Ethos-U target {target!r}: {e} (expected e.g. ethos-u55-128, "
                         "ethos-u65-256, ethos-u85-256)") from None


def ethos_u_partitioner(compile_spec: Any, **kwargs: Any) -> Any:
    """Arm's stock Ethos-U partitioner (INT operator support for the target)."""
    return EthosUPartitioner(compile_spec, **kwargs)


def vela_available() -> bool:
    """Whether Arm's Vela wrapper could import Vela (`ethos-u-vela`)."""
    from executorch.backends.arm import arm_vela

    return bool(getattr(arm_vela, "has_vela", False))


def run_vela(tosa: bytes, compile_flags: str, directory: str) -> Any:
    """Vela on `tosa` with an Ethos-U delegate's own compile flags (as its .pte records
    them), as `EthosUBackend` runs it, its output kept in `directory`: a `VelaRun`
    (`vela_summary.read_vela_summary(run.directory)` reads its figures). Vela is
    deterministic, so these are the figures of the run that made the delegate."""
    from executorch.backends.arm.arm_vela import vela_compile

    printed = io.StringIO()
    run = VelaRun(bytes(tosa), directory)
    with contextlib.redirect_stdout(printed):
        vela_compile(bytes(tosa), compile_flags.split(), intermediate_path=directory)
    run.log = printed.getvalue()
    return run


# VgfBackend preprocesses every VGF delegate; its TOSA step runs ours for a
# planned partition (arm_private.install_vgf_tosa_lowering, docs/DESIGN.md, "The VGF target").
VGF_BACKEND_ID = "VgfBackend"


def vgf_partitioner() -> Any:
    """Arm's stock VGF partitioner at its default compile spec (TOSA-1.0+FP+INT, int16,
    int4): what lowers an integer VGF program `CodecQuantizer` made."""
    return VgfPartitioner(VgfCompileSpec())


def vgf_compile_spec_entries(tosa_spec: str, intermediates: str | None = None,
                             without_safe_softmax_guards: bool = False) -> list[CompileSpec]:
    """The compile-spec list Arm's VgfPartitioner would put in a delegate for `tosa_spec`.

    The VGF runtime ignores compile specs (the payload is self-describing);
    VgfBackend.preprocess needs them (its output format, TOSA spec, and the
    TOSA dev-mode flag VgfCompileSpec always sets in executorch 1.5.1).
    """
    spec = VgfCompileSpec(tosa_spec)
    spec.dump_intermediate_artifacts_to(intermediates)
    if without_safe_softmax_guards:
        remove_safe_softmax_guards(spec)
    return list(spec._to_list())
