"""`codec_tosa.save`: a program lowered through the Python API, with what validate needs.

`codec-tosa compile` writes model.pte, reference_io.npz (the plan's reference
inputs and outputs) and report.json; a user who lowers with the public API
(`CodecTosaPartitioner`, or `CodecQuantizer` and a stock partitioner) gets only
the program. `save` writes the same three files for it, from the partitioner
or quantizer that made it, and for a VgfBackend or EthosUBackend delegate the
TOSA it was compiled from (model.tosa; the payload holds only the VGF or Vela's
command stream), so that `codec-tosa validate` can check it to a PASS. A program
whose weights are external (`CodecSpec(external_weights=True)`) gets its named
data beside the .pte, model.ptd.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch

from codec_tosa.arm import adapter as arm_adapter
from codec_tosa.quantizer.codec_quantizer import CodecQuantizer
from codec_tosa.runtime.pte import ProgramFiles, delegates, inspect_pte, program_files
from codec_tosa.targets import target_in, target_of
from codec_tosa.targets.artefacts import delegate_file
from codec_tosa.targets.named_data import external_keys
from codec_tosa.targets.ethosu.vela_figures import vela_figures
from codec_tosa.targets.tosa.partitioner import CodecTosaPartitioner
from codec_tosa.tools.compiler import build_report, write_artefacts
from codec_tosa.validation.artefact_rounding import askable
from codec_tosa.validation.reference_io import reference_outputs
from codec_tosa.validation.samples import DEFAULT_SAMPLES, inputs_for_specs


def save(program: Any, source: Any, path: str | Path, *, samples: int = DEFAULT_SAMPLES,
         inputs: Sequence[Sequence[torch.Tensor]] | None = None, model: Any = None) -> Path:
    """Write `program` (an ExecuTorch program manager, or .pte bytes) to
    ``path/model.pte`` with ``reference_io.npz`` and ``report.json`` beside it, and
    ``model.ptd`` when the program keeps weights in named data (pass the manager:
    .pte bytes do not hold the .ptd).

    `source` is what planned it: the `CodecTosaPartitioner` it was lowered with,
    or the calibrated `CodecQuantizer` it was quantized with (whose spec names
    the target). `model` is your FP32 model, the reference validate holds the
    outputs and the plan's FP32 graph to; without it that reference is the
    plan's own FP32 graph, which checks the codecs but not the structure.
    `inputs` are input tuples to check on (the first is the example; default:
    `1 + samples` seeded inputs drawn like calibration's). For an Ethos-U delegate,
    report.json also holds Vela's figures (cycles, operators, SRAM, off-chip bytes, per
    delegate, with its Vela flags), as `codec-tosa compile` writes them. Returns the
    .pte's path.
    """
    files = ProgramFiles(bytes(program)) if isinstance(program, (bytes, bytearray)) else program_files(program)
    pte = files.pte
    info = inspect_pte(pte)
    if inputs:
        cases = [tuple(c) for c in inputs]
    else:  # drawn per program input, then nested as the model takes them
        in_spec = _in_spec(source)
        cases = [_nested(c, in_spec) for c in inputs_for_specs(info.input_specs, 1 + samples)]
    if isinstance(source, CodecQuantizer):
        spec = source.spec
        target = target_of(spec.target)
        quantized = torch.export.export(source.converted(), cases[0])
        # the partitioner the integer program is lowered with decomposes it
        partitioner = target.integer_partitioner(spec)
        planned = source.planned(quantized, partitioner)
    elif isinstance(source, CodecTosaPartitioner):
        spec, planned = source.codec_spec, source.planned
        target = target_of(spec.target)
        if planned is None:
            raise ValueError("codec_tosa.save: the partitioner planned nothing yet; lower the program "
                             "with it (to_edge_transform_and_lower) first")
    else:
        raise TypeError(f"codec_tosa.save: source must be the CodecTosaPartitioner or CodecQuantizer "
                        f"the program was made with, not {type(source).__name__}")
    if files.ptd is None and external_keys(pte):
        raise ValueError("codec_tosa.save: the program keeps its weights in named data that .pte bytes do not "
                         "hold: pass the program manager to_executorch() returned, which holds the .ptd")
    assert planned.program is not None
    signature = planned.program.graph_signature
    fp32 = model.eval() if model is not None else planned.program.module()
    ref = reference_outputs(planned, fp32, cases[0], cases[1:], spec, signature,
                            artefact=askable(files, target))
    if model is None:
        for s in ref.io.sets:
            s.planned = None  # the reference is that graph itself: nothing independent to hold it to
    tosa = _delegate_tosa(pte)
    target_report: dict[str, Any] = {}
    vela = vela_figures(delegates(pte), {index: (name, data) for index, (name, data) in tosa.items()},
                        sorted(set(info.operators)))
    if vela is not None:  # Vela re-run on the TOSA it compiled, with the delegate's own flags
        target_report["vela"] = vela
    written, files_report = target.data_files(files)
    target_report.update(files_report)
    report = build_report("python", spec, target, files, planned, {}, target_report, ref, dict(tosa.values()))
    write_artefacts(path, pte, ref.io, report, {**written, **dict(tosa.values())})
    return Path(path) / "model.pte"


def _in_spec(source: Any) -> Any:
    """The pytree spec of the model's (args, kwargs), as torch.export recorded it, or None."""
    if isinstance(source, CodecQuantizer):
        return getattr(source.fp32_module(), "_in_spec", None)
    planned = getattr(source, "planned", None)
    program = getattr(planned, "program", None)
    return program.call_spec.in_spec if program is not None else None


def _nested(flat: Sequence[torch.Tensor], in_spec: Any) -> tuple[Any, ...]:
    """Flat program inputs as the model's positional arguments (an LSTM's (x, (h0, c0)))."""
    if in_spec is None or in_spec.num_leaves != len(flat):
        return tuple(flat)
    args, kwargs = torch.utils._pytree.tree_unflatten(list(flat), in_spec)
    return tuple(args) if not kwargs else tuple(flat)


def _delegate_tosa(pte: bytes) -> dict[int, tuple[str, bytes]]:
    """model.tosa (model_1.tosa, ...) for each VgfBackend or EthosUBackend delegate, by
    delegate index: the TOSA this process compiled it from (`arm_adapter.tosa_of_payload`)."""
    files: dict[int, tuple[str, bytes]] = {}
    compiled = [d for d in delegates(pte) if (t := target_in([d.backend_id])) is not None and t.tosa_beside]
    for k, d in enumerate(compiled):
        tosa = arm_adapter.tosa_of_payload(d.payload)
        if tosa is None:
            raise ValueError(f"codec_tosa.save: delegate {d.index} ({d.backend_id}) was not lowered in "
                             "this process, so the TOSA it was compiled from is unknown; save the "
                             "program right after lowering it")
        files[d.index] = (delegate_file(k, "tosa"), tosa)
    return files


__all__ = ["save"]
