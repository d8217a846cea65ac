"""The `codec-tosa` command line."""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from codec_tosa.commutation.policy import DEFAULT_ORDER
from codec_tosa.commutation.table import CommutationTable
from codec_tosa.placement.domains import PLACEMENTS
from codec_tosa.planning.analysis import analyze, port_graph
from codec_tosa.quiet import quiet
from codec_tosa.spec import CodecSpec
from codec_tosa.units import MIB

DEFAULT_MODEL = "tiny_shufflenet"
# each command imports what it runs where it starts (compile and validate load
# executorch's Arm backend and runtime): `analyze`, `--help` and an error stay quick
DEFAULT_SAMPLES = 16  # as codec_tosa.validation.samples (not imported here: it loads executorch)


def _decibels(text: str) -> float:
    """An SQNR budget: ``30``, ``30dB`` or ``30 dB``."""
    try:
        return float(text.strip().removesuffix("dB").removesuffix("db").strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an SQNR in dB such as 30dB, got {text!r}") from None


def _domains(text: str) -> tuple[int, ...]:
    """``3,7,12``: domain ids (report.json's precision.domains)."""
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated domain ids such as 3,7, got {text!r}") from None


def _count(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {n}")
    return n


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(c) for c in header]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c: object) -> str:
    return f"{c:.4g}" if isinstance(c, float) else str(c)


def cmd_analyze(args: argparse.Namespace) -> int:
    from codec_tosa.tools.loading import load_and_export

    table = CommutationTable.from_json(args.table) if args.table else CommutationTable.default()
    policies = [args.policy] if args.policy else list(table.order.letters)
    placements = [args.placement] if args.placement else list(PLACEMENTS)
    for p in policies:
        table.order.rank(p)
    loaded = load_and_export(args.model)
    graph = port_graph(loaded.program, args.fold_bn)  # one port view for every variant
    results = [analyze(graph, p, pl, args.fused_transcode, table=table)
               for p in policies for pl in placements]
    print(f"model {args.model}: {graph.num_ops} operators, {graph.num_values} values")
    rows = [(a.policy, a.placement, a.storage_mib, a.traffic_mib, a.lower_bound_mib,
             a.codec_items_m, len(a.domains), a.codec_counts()["encode"],
             a.codec_counts()["decode"], a.codec_counts()["transcode"]) for a in results]
    print(_table(["policy", "placement", "storage MiB", "traffic MiB", "lower bound MiB",
                  "codec items M", "domains", "enc", "dec", "trans"], rows))
    if len(results) == 1 or args.top:
        a = results[-1]
        print(f"\ntop {args.top or 10} operators by traffic ({a.policy}, {a.placement}):")
        print(_table(["node", "target", "read MiB", "written MiB"],
                     [(r.node, r.target, r.bytes_read / MIB, r.bytes_written / MIB)
                      for r in a.top_ops(args.top or 10)]))
    if args.json:
        payload = [json.loads(a.to_json()) for a in results]
        _write_atomic(Path(args.json), json.dumps({"model": args.model, "analyses": payload}, indent=1))
        print(f"wrote {args.json}")
    return 0


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _spec(args: argparse.Namespace):
    table = CommutationTable.from_json(args.table) if args.table else None
    return CodecSpec(policy=args.policy, placement=args.placement, tosa=args.tosa,
                     fused_transcode=args.fused_transcode, pool_constants=False if args.no_pool else None,
                     table=table, symmetric_activations=getattr(args, "symmetric_activations", False),
                     target=getattr(args, "target", "tosa"), observer=getattr(args, "observer", None),
                     precision=getattr(args, "precision", "int8"), budget=getattr(args, "budget", None),
                     int16_domains=getattr(args, "int16_domains", ()) or (),
                     weights=getattr(args, "weights", "int8"),
                     weight_rounding=getattr(args, "weight_rounding", "nearest"),
                     split_chains=getattr(args, "split_chains", False),
                     external_weights=getattr(args, "external_weights", False))


def cmd_compile(args: argparse.Namespace) -> int:
    from codec_tosa.tools.compiler import compile_model

    result = compile_model(args.model, _spec(args), args.out,
                           samples=getattr(args, "samples", None),
                           on_stage=lambda name: _STAGE.__setitem__("compile", name),
                           calibration=getattr(args, "calibration", None), inputs=getattr(args, "inputs", None))
    extra = "".join(f", {result.out_dir / name}" for name in result.files)
    print(f"wrote {result.pte} ({result.report['pte_bytes']} bytes), "
          f"{result.out_dir / 'report.json'}, {result.out_dir / 'reference_io.npz'}{extra}")
    for w in result.warnings:
        print(f"codec-tosa compile: warning: {w}", file=sys.stderr)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from codec_tosa.tools.input_files import load_input_tuples
    from codec_tosa.validation.validate import validate

    cases = module = None
    example: Any = None
    if args.model:
        from codec_tosa.tools.loading import load_and_export

        loaded = load_and_export(args.model)
        module, example = loaded.module, loaded.inputs
    if args.inputs:
        if example is None:  # shaped as the program's inputs
            from codec_tosa.runtime.pte import inspect_pte, read_pte

            specs = inspect_pte(read_pte(args.pte)).input_specs
            example = tuple(torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for s in specs if s is not None)
        cases = load_input_tuples(args.inputs, example, "--inputs")
    elif example is not None:
        cases = [tuple(example)]
    v = validate(args.pte, inputs=cases, samples=getattr(args, "samples", None), module=module,
                 ptd=getattr(args, "ptd", None))
    print("\n".join(v.lines()))
    return v.exit_status


def cmd_report(args: argparse.Namespace) -> int:
    from codec_tosa.tools.report import report_lines

    print("\n".join(report_lines(args.pte, _table, getattr(args, "ptd", None))))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    print(f"== codec-tosa analyze {DEFAULT_MODEL} (every policy and placement)")
    ns = argparse.Namespace(model=DEFAULT_MODEL, policy=None, placement=None, fused_transcode=False,
                            json=None, table=None, top=10, fold_bn=True)
    cmd_analyze(ns)
    out = Path(args.out or tempfile.mkdtemp(prefix="codec-tosa-demo-"))
    print(f"\n== codec-tosa compile {DEFAULT_MODEL} --policy W -o {out}")
    cmd_compile(argparse.Namespace(model=DEFAULT_MODEL, policy="W", placement="nonlocal+coalesce",
                                   tosa=None, fused_transcode=False, no_pool=False, table=None, out=out,
                                   target="tosa", symmetric_activations=False, samples=None))
    print(f"\n== codec-tosa validate {out / 'model.pte'}")
    status = cmd_validate(argparse.Namespace(pte=str(out / "model.pte"), inputs=None, model=None,
                                             samples=None))
    print(f"\n== codec-tosa report {out / 'model.pte'}")
    cmd_report(argparse.Namespace(pte=str(out / "model.pte")))
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="codec-tosa", description=__doc__)
    parser.add_argument("--verbose", action="store_true",
                        help="show other packages' known-harmless warnings and notes too")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("analyze", help="place codecs and report storage/traffic/codec items")
    p.add_argument("model", help="built-in model name or path/to/file.py:function")
    # no argparse choices: a user table (--table) may define its own policy letters
    p.add_argument("--policy", help=f"one of {', '.join(DEFAULT_ORDER)} or a --table's letters "
                   "(default: every policy)")
    p.add_argument("--placement", choices=PLACEMENTS, help="default: every placement")
    p.add_argument("--fused-transcode", action="store_true",
                   help="count a transcode as one int8->int8 RESCALE")
    p.add_argument("--table", help="a user commutation table (JSON)")
    p.add_argument("--top", type=int, default=0, help="print the N operators with most traffic")
    p.add_argument("--fold-bn", action="store_true",
                   help="fold batch norms into convolutions first, as the compiler does "
                        "(default: the exported graph, as the published figures count it)")
    p.add_argument("--json", help="write the full analyses to this JSON file")
    p.set_defaults(func=cmd_analyze)

    c = sub.add_parser("compile", help="compile a model to a .pte with a CodecTosaBackend delegate")
    c.add_argument("model", help="built-in model name or path/to/file.py:function")
    c.add_argument("--policy", default="W", help=f"one of {', '.join(DEFAULT_ORDER)} or a --table's letters")
    c.add_argument("--placement", choices=PLACEMENTS,
                   help="default: nonlocal+share at policy I, nonlocal+coalesce otherwise")
    c.add_argument("--tosa", help="TOSA spec (default TOSA-1.0+INT+FP; TOSA-1.0+FP for policy Z)")
    c.add_argument("--fused-transcode", action="store_true")
    c.add_argument("--no-pool", action="store_true", help="do not pool helper constants")
    c.add_argument("--symmetric-activations", action="store_true",
                   help="activation codecs with zero point 0 (fewer codec operators, coarser steps)")
    # calibration.OBSERVERS (not imported here: it loads torch)
    c.add_argument("--observer", choices=("minmax", "histogram"),
                   help="how calibration picks each domain's range (default: histogram, the range "
                        "Arm's INT8 quantizer's observer picks)")
    c.add_argument("--table", help="a user commutation table (JSON)")
    c.add_argument("--target", default="tosa",
                   help="tosa (default): a CodecTosaBackend delegate (TOSA flatbuffer); vgf: Arm's "
                        "VgfBackend (ML SDK for Vulkan), with model.vgf and model.tosa beside the .pte; "
                        "an Ethos-U accelerator (ethos-u55-128, ethos-u85-256, ...): Arm's EthosUBackend "
                        "(Vela), with model.tosa beside the .pte; needs --policy I; xnnpack: ExecuTorch's "
                        "XnnpackBackend for CPUs (--policy I; validate holds it to eager by SQNR)")
    c.add_argument("--precision", choices=("int8", "int16", "auto"), default="int8",
                   help="activation codes per domain at --policy I: int8 (default); int16 wherever Arm "
                        "lowers it (as Arm's a16w8); auto: each domain's width, the least traffic that "
                        "meets --budget (report.json lists each domain's width and why)")
    c.add_argument("--weights", choices=("int8", "int4", "auto"), default="int8",
                   help="convolution and linear weights at --policy I: int8 (default); int4 wherever Arm "
                        "lowers it (as Arm's a8w4; weights read by an int16 domain stay int8); auto: each "
                        "weight's width, searched with the domains' under --budget")
    c.add_argument("--weight-rounding", choices=("nearest", "gptq"), default="nearest",
                   help="how weight codes are picked at --policy I: nearest (default, as Arm's quantizers); "
                        "gptq: in the order that cuts each convolution's and linear's output error on the "
                        "calibration data (same scales, same bytes)")
    c.add_argument("--split-chains", action="store_true",
                   help="with --precision auto: let a chain of convolutions change width at a convolution's "
                        "input, through one RESCALE where the widths differ (else a chain is one width)")
    c.add_argument("--budget", type=_decibels,
                   help="with --precision auto or --weights auto: the SQNR floor against FP32, e.g. 30dB")
    c.add_argument("--int16-domains", type=_domains,
                   help="these domain ids at int16, the rest int8 (ids as report.json lists them)")
    c.add_argument("--samples", type=_count, default=None,
                   help="seeded held-out inputs stored with their eager and simulated outputs for validate "
                        f"(default: up to {DEFAULT_SAMPLES}, as many as keep this stage within a quarter of "
                        "the compile, at least 4; 0: no simulation, validate then compares with eager by "
                        "SQNR only)")
    c.add_argument("--calibration", metavar="FILE",
                   help="calibrate on your data: an .npz of input_0, input_1, ... (one input, or N stacked "
                        "on a new first axis) or path/to/file.py:function returning an iterable of input "
                        "tuples (default: the example and 3 seeded random inputs)")
    c.add_argument("--inputs", metavar="FILE",
                   help="held-out inputs stored for validate, in --calibration's format (default: seeded "
                        "random ones)")
    c.add_argument("--external-weights", action="store_true",
                   help="keep the delegates' weights in model.ptd beside model.pte (ExecuTorch named data, "
                        "loaded with the .pte; refused for vgf)")
    c.add_argument("-o", "--out", default="out", help="output directory")
    c.set_defaults(func=cmd_compile)

    v = sub.add_parser("validate", help="run a .pte on the TOSA reference model and in the runtime")
    v.add_argument("pte")
    v.add_argument("--model", help="rebuild the model (built-in name or file.py:function): its example and "
                   "held-out samples, compared with FP32 eager")
    v.add_argument("--inputs", metavar="FILE",
                   help="inputs to check on, in compile --calibration's format (with --model: the first is "
                        "the example, the rest its held-out samples)")
    v.add_argument("--samples", type=_count, default=None,
                   help="held-out samples besides the example (default: all that compile stored, "
                        f"or {DEFAULT_SAMPLES} drawn)")
    v.add_argument("--ptd", metavar="FILE",
                   help="the program's named data (default: the .ptd beside the .pte, if there is one)")
    v.epilog = "exit status: 0 PASS, 1 FAIL, 3 INCOMPLETE (something could not be compared), 2 error"
    v.set_defaults(func=cmd_validate)

    r = sub.add_parser("report", help="operators, constants and traffic of a .pte's TOSA delegates (any backend)")
    r.add_argument("pte")
    r.add_argument("--ptd", metavar="FILE",
                   help="the program's named data (default: the .ptd beside the .pte, if there is one)")
    r.set_defaults(func=cmd_report)

    d = sub.add_parser("demo", help="analyze, compile, validate and report the built-in default model")
    d.add_argument("-o", "--out", help="output directory (default: a temporary one)")
    d.set_defaults(func=cmd_demo)
    for register in _extensions():
        register(sub)
    return parser


def _extensions() -> list[Callable[[argparse._SubParsersAction], None]]:
    """Subcommands defined next to the code they drive."""
    regs: list[Callable[[argparse._SubParsersAction], None]] = []
    try:
        from codec_tosa.tools.tables.command import add_tables_parser
    except ImportError:
        pass
    else:
        regs.append(add_tables_parser)
    return regs


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with quiet(verbose=args.verbose):  # errors are printed below, after it
            return int(args.func(args) or 0)
    except Exception as e:  # every error is one line; --verbose shows its traceback too
        if args.verbose:
            traceback.print_exception(e, file=sys.stderr)
        print(f"codec-tosa {args.command}: error: {error_line(e, _STAGE.get(args.command))}", file=sys.stderr)
        return 2


# the last stage `compile` reported, named in an error that is not ours
_STAGE: dict[str, str] = {}
_PACKAGE = Path(__file__).resolve().parents[1]
# what codec_tosa raises on purpose, with a message written for the user
_INTENDED = (CliError, ValueError, RuntimeError, OSError)


def _origin(e: BaseException) -> Path:
    """The file the exception was raised in."""
    frames = traceback.extract_tb(e.__traceback__)
    return Path(frames[-1].filename).resolve() if frames else _PACKAGE


def error_kind(e: BaseException) -> str:
    """``refused`` (one of our own errors, worded for the user), ``internal`` (an
    unexpected error in our code: a bug) or ``library`` (raised by a library)."""
    if _PACKAGE in _origin(e).parents:
        return "refused" if isinstance(e, _INTENDED) else "internal"
    return "library"


def error_line(e: BaseException, stage: str | None = None) -> str:
    """`e` as one line: our own errors as they are worded; an error raised by a
    library (Arm's backend, torch.export, ...) with its type, where it came from
    and the stage it stopped; an unexpected error of ours as an internal one."""
    kind = error_kind(e)
    if kind == "library":
        # ExecuTorch's pass manager wraps a pass's error in one that lists every pass
        # run before it: the cause is what the user needs, unless it says nothing (the
        # verifier's bare StopIteration under "While executing %node ...")
        while (e.__cause__ is not None and error_kind(e.__cause__) == "library"
               and str(e.__cause__).strip()):
            e = e.__cause__
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    if kind == "refused":
        return as_flags(first)
    if kind == "internal":
        return (f"internal error ({type(e).__name__}: {first}); please report it with the traceback "
                "--verbose shows")
    origin = _origin(e)
    library = next((p for p in reversed(origin.parts[:-1]) if p in _LIBRARIES), origin.stem)
    where = f" during {stage}" if stage else ""
    source = _model_source(text)
    return f"{_LIBRARIES.get(library, library)} failed{where}: {type(e).__name__}: {first}{source}"


# CodecSpec's arguments that are flags here: an error names them as Python does
_FLAGGED = ("policy", "placement", "tosa", "target", "observer", "precision", "weights", "budget",
            "weight_rounding", "split_chains", "fused_transcode", "symmetric_activations", "external_weights")
_ARGUMENT = re.compile(rf"`({'|'.join(_FLAGGED)})`|\b({'|'.join(_FLAGGED)})=('([^']*)'|True|[-\d.]+)")


def as_flags(message: str) -> str:
    """A spec error as this CLI's flags say it: ``policy='I'`` -> ``--policy I``,
    ``split_chains=True`` -> ``--split-chains``, `` `budget` `` -> ``--budget``."""
    def flag(m: re.Match[str]) -> str:
        name = m[1] or m[2]
        option = "--" + name.replace("_", "-")
        if m[1] or m[3] == "True":
            return option
        return f"{option} {m[4] if m[4] is not None else m[3]}"
    return _ARGUMENT.sub(flag, message)


# torch.fx's "While executing %node" errors quote the stack the node was traced
# from, the model's line first (after our own input wrapper's, tools/loading.py)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \w+\s*\n\s*(\S[^\n]*)')


def _model_source(text: str) -> str:
    """", from the model's FILE:LINE: CODE" where a library's message quotes the
    model line its failing node was traced from, else ""."""
    _, found, stack = text.partition("Original traceback:")
    frames = _FRAME.finditer(stack if found else "")
    m = next((f for f in frames if _PACKAGE not in Path(f[1]).resolve().parents), None)
    return f", from the model's {Path(m[1]).name}:{m[2]}: {m[3].strip()}" if m else ""


_LIBRARIES = {"arm": "Arm's backend", "executorch": "ExecuTorch", "torch": "PyTorch", "torchao": "torchao",
              "tosa_serializer": "the TOSA serializer", "ethosu": "Vela"}


if __name__ == "__main__":
    sys.exit(main())
