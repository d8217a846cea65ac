"""Bad input (issue 6): a one-line error naming the node, file or option and the
reason, a non-zero CLI exit and no partial artefact; and degenerate graphs that
must compile and run correctly rather than fail."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from codec_tosa.tools.cli import main
from codec_tosa.planning.calibration import CalibrationError, learn_thetas
from codec_tosa.codecs.int8 import DEFAULT_CODEC
from codec_tosa.commutation.table import CommutationTable
from codec_tosa.tools.compiler import lower_program
from codec_tosa.validation.reference_io import one_ulp_away
from codec_tosa.graph import GraphError, PortGraph
from codec_tosa.validation.simulation import simulate
from codec_tosa.placement import place
from codec_tosa.placement.semantics import CODE
from codec_tosa.runtime.executorch_runner import run_pte
from codec_tosa.runtime.pte import inspect_pte
from codec_tosa.runtime.pte import delegate_payload, read_pte
from codec_tosa.validation.reference_model import ReferenceModelError, run_reference_model
from codec_tosa.validation.validate import validate
from codec_tosa.spec import CodecSpec
import small_models
from model_files import SMALL_MODEL_FILE

# the small model file, and one whose input overflows to inf inside the graph
MODEL_FILE = SMALL_MODEL_FILE + '''

class Overflows(Small):
    def forward(self, x):
        return self.b(torch.relu(self.a(x * 1e30 * 1e30)))  # inf in float32


def build_overflow():
    torch.manual_seed(0)
    return Overflows().eval(), (torch.randn(1, 3, 8, 8),)
'''


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run the CLI in-process; return its exit status and its stderr's error line."""
    try:
        rc = main(list(argv))
    except SystemExit as e:  # argparse rejects options itself
        rc = int(e.code or 0)
    # splitlines also splits at "\r": a progress bar must not share the error's line
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    return rc, "\n".join(err)


def one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2, err
    assert len(err.splitlines()) == 1, err
    for n in needles:
        assert n in err, err


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def small() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return Small().eval(), (torch.randn(1, 3, 8, 8),)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A compiled .pte (CLI) plus bad variants of it."""
    d = tmp_path_factory.mktemp("errors")
    model = d / "model.py"
    model.write_text(MODEL_FILE)
    assert main(["compile", f"{model}:build", "--policy", "W", "-o", str(d / "good")]) == 0
    good = (d / "good" / "model.pte").read_bytes()
    (d / "truncated.pte").write_bytes(good[: len(good) // 2])
    (d / "text.pte").write_text("not a program\n")
    (d / "empty.pte").write_bytes(b"")
    # a stock Arm .pte: a TOSABackend delegate, no CodecTosaBackend one
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir import to_edge_transform_and_lower

    m, x = small()
    stock = to_edge_transform_and_lower(torch.export.export(m, x), partitioner=[
        TOSAPartitioner(TosaCompileSpec("TOSA-1.0+FP"))]).to_executorch().buffer
    (d / "stock.pte").write_bytes(stock)
    # our delegate with a bad payload, beside the good reference_io.npz: garbage
    # after a TOSA file identifier, and a well-formed TOSA graph of an unknown
    # TOSA version, which the reference model rejects
    payload = delegate_payload(good)
    for name, bad in (("garbage", b"\x1c\x00\x00\x00TOSA" + b"\xff" * 64),
                      ("rejected", _with_tosa_major_version(payload, 99))):
        (d / name).mkdir()
        (d / name / "model.pte").write_bytes(_with_payload(good, bad))
        (d / name / "reference_io.npz").write_bytes((d / "good" / "reference_io.npz").read_bytes())
    return {"dir": d, "model": model, "good": d / "good" / "model.pte", "truncated": d / "truncated.pte",
            "text": d / "text.pte", "empty": d / "empty.pte", "stock": d / "stock.pte",
            "garbage": d / "garbage" / "model.pte", "rejected": d / "rejected" / "model.pte",
            "missing": d / "missing.pte"}


def _with_tosa_major_version(payload: bytes, major: int) -> bytes:
    import flatbuffers
    from tosa.TosaGraph import TosaGraph

    buf = bytearray(payload)
    version = TosaGraph.GetRootAs(buf, 0).Version()
    field = version._tab.Offset(4)  # Version._Major
    assert field
    flatbuffers.encode.Write(flatbuffers.packer.int32, buf, version._tab.Pos + field, major)
    return bytes(buf)


def _with_payload(pte: bytes, payload: bytes) -> bytes:
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte_file = deserialize_pte_binary(pte)
    program = pte_file.program
    for plan in program.execution_plan:
        for delegate in plan.delegates:
            program.backend_delegate_data[delegate.processed.index].data = payload
    return bytes(serialize_pte_binary(pte_file, extract_delegate_segments=True))


# ------------------------------------------------------------------ .pte files


@pytest.mark.parametrize("command", ["validate", "report"])
@pytest.mark.parametrize("name,reason", [
    ("truncated", "truncated or corrupt"),
    ("text", "not a valid ExecuTorch program"),
    ("empty", "not a valid ExecuTorch program"),
    ("missing", "cannot read"),
])
def test_bad_pte_is_one_line_naming_the_file(files, capsys, command: str, name: str, reason: str) -> None:
    rc, err = cli(capsys, command, str(files[name]))
    one_line_error(rc, err, f"codec-tosa {command}: error: {files[name]}:", reason)


def test_a_stock_pte_is_validated_on_our_runtime_and_reported(files, capsys) -> None:
    # a stock TOSABackend delegate holds a TOSA flatbuffer too: validate runs it on our
    # runtime backend against the reference model (no reference_io.npz: INCOMPLETE)
    assert main(["validate", str(files["stock"])]) == 3
    assert "delegate 0 (TOSABackend): reference model vs runtime" in capsys.readouterr().out
    assert cli(capsys, "report", str(files["stock"]))[0] == 0


def test_payload_that_is_not_tosa(files, capsys) -> None:
    # refused before the reference model sees it (it can crash on such bytes)
    for command in ("validate", "report"):
        rc, err = cli(capsys, command, str(files["garbage"]))
        one_line_error(rc, err, str(files["garbage"]), "not a TOSA flatbuffer (72 bytes)")


def test_payload_the_reference_model_rejects(files, capsys) -> None:
    rc, err = cli(capsys, "validate", str(files["rejected"]))
    one_line_error(rc, err, str(files["rejected"]), "the TOSA reference model rejects the delegate")
    with pytest.raises(ReferenceModelError, match="rejects the delegate"):
        run_reference_model(delegate_payload(read_pte(files["rejected"])), [np.zeros((1, 3, 8, 8), np.float32)],
                            files["rejected"])


def test_good_pte_validates_and_reports(files, capsys) -> None:
    rc, _ = cli(capsys, "validate", str(files["good"]))
    assert rc == 0
    assert cli(capsys, "report", str(files["good"]))[0] == 0


def test_validate_reports_the_simulation_rounding_sensitivity(files, tmp_path) -> None:
    """compile (W) records how far the simulation moves under a one-ulp input change;
    validate still fails an output off by more than one step, and says when the
    deviation is within that sensitivity (a model that amplifies rounding)."""
    io = dict(np.load(files["dir"] / "good" / "reference_io.npz"))
    assert "sensitivity_0" in io and 0.0 <= float(io["sensitivity_0"]) < np.inf
    step = float(io["step_0"])
    for sensitivity, note in ((0.0, False), (10 * step, True)):
        d = tmp_path / f"s{note}"
        d.mkdir()
        (d / "model.pte").write_bytes(files["good"].read_bytes())
        np.savez(d / "reference_io.npz", **{**io, "simulated_0": io["simulated_0"] + 3 * step,
                                             "sensitivity_0": np.float64(sensitivity)})
        v = validate(d / "model.pte")
        assert v.verdict.value == "FAIL"
        assert v.outputs[0].within_rounding_sensitivity == note
        assert any("moves by up to" in line for line in v.lines()) == note


def test_one_ulp_away_moves_every_float_element_by_one_ulp() -> None:
    x = torch.randn(1000)
    idx = torch.arange(3)
    (y, j) = one_ulp_away((x, idx))
    assert torch.equal(j, idx)
    up = torch.nextafter(x, torch.full_like(x, torch.inf))
    down = torch.nextafter(x, torch.full_like(x, -torch.inf))
    assert bool(((y == up) | (y == down)).all())
    assert 0 < int((y > x).sum()) < 1000


# ------------------------------------------------------------------ options, tables


def test_unknown_policy_and_placement(files, capsys) -> None:
    with pytest.raises(ValueError, match="unknown policy 'Q': expected one of Z, Y, X, W"):
        CodecSpec(policy="Q")
    with pytest.raises(ValueError, match="unknown placement 'global'"):
        CodecSpec(placement="global")
    out = files["dir"] / "never"
    rc, err = cli(capsys, "compile", f"{files['model']}:build", "--policy", "Q", "-o", str(out))
    one_line_error(rc, err, "unknown policy 'Q'")
    rc, err = cli(capsys, "analyze", f"{files['model']}:build", "--policy", "Q")
    one_line_error(rc, err, "unknown policy 'Q'")
    rc, err = cli(capsys, "compile", f"{files['model']}:build", "--placement", "global", "-o", str(out))
    one_line_error(rc, err, "--placement", "'global'")
    assert not out.exists()


@pytest.mark.parametrize("table,reason", [
    ({"rows": [{"target": "aten.frobnicate.default", "policy": "W", "encoded": ["self", "out"]}]},
     "operator aten.frobnicate.default does not exist"),
    ({"rows": [{"target": "aten.convolution.default", "policy": "Y", "encoded": ["input", "kernel", "out"]}]},
     "operator aten.convolution.default has no port 'kernel' (tensor inputs: input, weight, bias"),
    ({"rows": [{"target": "aten.cat.default", "policy": "X", "encoded": ["tensors", "out.3"]}]},
     "has no port 'out.3'"),
    ({"rows": [{"target": "aten.relu.default", "policy": "Q", "encoded": ["self"]}]}, "unknown policy 'Q'"),
    ({"policies": ["Z", "W"]}, "expected {"),
    ({"rows": [{"policy": "W"}]}, 'every row needs a "target"'),
])
def test_bad_user_table_names_file_operator_and_port(files, capsys, table, reason) -> None:
    path = files["dir"] / "table.json"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match=f"commutation table {path}: ") as info:
        CommutationTable.from_json(path)
    assert reason in str(info.value)
    rc, err = cli(capsys, "analyze", f"{files['model']}:build", "--table", str(path))
    one_line_error(rc, err, str(path), reason)
    out = files["dir"] / "never"
    rc, err = cli(capsys, "compile", f"{files['model']}:build", "--table", str(path), "-o", str(out))
    one_line_error(rc, err, str(path), reason)
    assert not out.exists()


def test_user_table_with_its_own_policy_letters(files, capsys) -> None:
    path = files["dir"] / "letters.json"
    path.write_text(json.dumps({"policies": ["A", "B"], "rows": [
        {"target": "aten.convolution.default", "policy": "B", "encoded": ["input", "weight", "out"],
         "weights": ["weight"]}]}))
    rc = main(["analyze", f"{files['model']}:build", "--table", str(path), "--policy", "B",
               "--placement", "nonlocal+coalesce"])
    assert rc == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["B", "nonlocal+coalesce"] in [r[:2] for r in rows]


# ------------------------------------------------------------------ compile failures


def test_failed_compile_leaves_no_artefact(files, capsys) -> None:
    out = files["dir"] / "overflow"
    rc, err = cli(capsys, "compile", f"{files['model']}:build_overflow", "-o", str(out))
    # the domain, its dominator and the FX node where the inf was observed
    one_line_error(rc, err, "codec-tosa compile: error: domain 0 (dominator encode(aten_mul_tensor_1), "
                   "node aten_mul_tensor_1): calibration produced no finite value, only infinities or NaNs")
    assert not out.exists()
    assert not list(files["dir"].glob(".codec-tosa-*"))  # the temporary directory is gone


def test_dynamic_shapes_are_refused_naming_the_node() -> None:
    m, x = small()
    x2 = torch.randn(2, 3, 8, 8)
    ep = torch.export.export(m, (x2,), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=8)}})
    with pytest.raises(GraphError, match=r"node x: dynamic \(symbolic\) shape \(s\d+, 3, 8, 8\)"):
        lower_program(ep, CodecSpec(policy="W"), [(x2,)])


def _planned(policy: str = "W"):
    m, x = small()
    ep = torch.export.export(m, x).run_decompositions()
    graph = PortGraph.from_program(ep)
    return ep, graph, place(graph, CommutationTable.default(), policy).plan, x


@pytest.mark.parametrize("calibration,reason", [
    ([], "no input tuples given"),
    ([(torch.randn(1, 3, 8, 8), torch.randn(1, 3, 8, 8))], "calibration input 0: 2 tensors, the program takes 1"),
    ([(torch.randn(1, 3, 8, 8),), (torch.randn(1, 3, 4, 4),)],
     "calibration input 1, tensor 0: shape (1, 3, 4, 4), expected (1, 3, 8, 8)"),
    ([("not a tensor",)], "calibration input 0, tensor 0: shape str"),
])
def test_bad_calibration_inputs(calibration, reason) -> None:
    ep, graph, plan, _ = _planned()
    with pytest.raises(CalibrationError) as info:
        learn_thetas(ep, graph, plan, calibration)
    assert reason in str(info.value)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_values_are_left_out_of_the_range(bad: float) -> None:
    # an INT8 code cannot hold them: atanh at +-1 in a calibration set must not cost the domain its scale
    ep, graph, plan, x = _planned()
    y = x[0].clone()
    y[0, 1, 2, 3] = bad
    finite = y.clone()
    finite[0, 1, 2, 3] = 0.0  # inside the range the rest spans
    assert learn_thetas(ep, graph, plan, [x, (y,)]) == learn_thetas(ep, graph, plan, [x, (finite,)])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_domain_with_no_finite_value_names_domain_and_node(bad: float) -> None:
    ep, graph, plan, x = _planned()
    y = torch.full_like(x[0], bad)
    with pytest.raises(CalibrationError, match=r"domain \d+ \(dominator encode\(x\), node x\): calibration "
                                               r"produced no finite value"):
        learn_thetas(ep, graph, plan, [(y,)])
    # through the product path too: the partitioner raises it, nothing is lowered
    m, _ = small()
    with pytest.raises(CalibrationError, match="node x"):
        lower_program(torch.export.export(m, x), CodecSpec(policy="W"), [(y,)])


def test_zero_range_gets_a_usable_codec() -> None:
    theta = DEFAULT_CODEC.learn(0.0, 0.0)
    assert theta.scale == 1.0 and theta.zero_point == -128  # zero is exact, no division by zero
    w = torch.randn(3, 2, 1, 1)
    w[1] = 0.0  # a pruned output channel
    ct = DEFAULT_CODEC.learn_weight(w)
    assert ct.scales[1] == 1.0 and bool(torch.all(ct.scales > 0))
    with pytest.raises(ValueError, match="not finite"):
        DEFAULT_CODEC.learn(float("nan"), 1.0)


# ------------------------------------------------------------------ graphs that must compile


def _lower_and_run(m: nn.Module, x: tuple[torch.Tensor, ...], policy: str = "W"):
    lowered = lower_program(torch.export.export(m, x), CodecSpec(policy=policy), [x])
    outs = run_pte(lowered.pte, list(x))
    with torch.no_grad():
        eager = m(*x)
    eager = [eager] if isinstance(eager, torch.Tensor) else list(eager)
    return lowered, outs, eager, simulate(lowered.planned, x)


def test_operator_without_tosa_lowering_stays_on_the_cpu() -> None:
    m, x = small_models.conv_topk_conv()
    lowered, outs, eager, sim = _lower_and_run(m, x)
    info = inspect_pte(lowered.pte)
    assert set(info.operators) == {"aten::topk"}
    assert info.delegate_ids == ("CodecTosaBackend", "CodecTosaBackend")  # before and after it
    part = lowered.planned
    topk = [op for op in range(part.graph.num_ops)
            if "topk" in part.graph.op_target[op]]
    assert len(topk) == 1 and not part.placement.semantics.int8_ops[topk[0]]
    # the output is decoded from the second conv's domain: within one step of the plan
    step = max(t.scale for t in part.thetas.values())
    assert float((outs[0] - sim[0]).abs().max()) <= step
    assert float((outs[0] - eager[0]).abs().max()) <= 0.1 * float(eager[0].abs().max())


class IntBool(nn.Module):
    """int64 and bool tensors through cat / view / permute (encodable operators)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.a(x)
        mask = torch.cat([y > 0, y > 0], 1).reshape(1, -1)
        ids = torch.cat([idx, idx], 0).reshape(2, -1).permute(1, 0)
        return y, mask, ids + 1


def test_int64_and_bool_tensors_are_never_encoded() -> None:
    torch.manual_seed(0)
    m, x = IntBool().eval(), (torch.randn(1, 3, 4, 4), torch.arange(6))
    lowered, outs, eager, sim = _lower_and_run(m, x)
    part = lowered.planned
    g, sem = part.graph, part.placement.semantics
    encoded = [v for v in range(g.num_values) if sem.out_code[v]]
    encoded += [g.in_value[p] for p in range(g.num_in_ports) if sem.in_sem[p] == CODE]
    assert encoded and all(g.is_float(v) for v in encoded)
    assert any(g.val_dtype[v] in (torch.bool, torch.int64) for v in range(g.num_values))
    # the mask compares decoded values (as planned), the indices are untouched
    assert torch.equal(outs[1], sim[1]) and torch.equal(outs[2], eager[2])
    assert outs[2].dtype == torch.int64 and outs[1].dtype == torch.bool


class Degenerate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.convs = nn.ModuleList(nn.Conv2d(4, 4, 1) for _ in range(4))
        self.register_buffer("table", torch.arange(6.0).reshape(2, 3))

    def forward(self, x: torch.Tensor, empty: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.a(x)
        # a value read by encoded (conv, reshape) and plain (relu, add) operators many times
        parts = []
        for c in self.convs:
            parts += [c(y).flatten(1), (torch.relu(y) + 1).flatten(1), y.reshape(1, -1)]
        twice = torch.cat([y, y], 1)  # cat of the same tensor twice
        return (x,  # an output equal to an input
                self.table * 2,  # a constant output
                torch.cat(parts, 1), twice,
                torch.cat([empty, empty], 1))  # zero-size tensors


@pytest.mark.parametrize("policy", ["Z", "W"])
def test_degenerate_graphs_compile_and_run(policy: str) -> None:
    torch.manual_seed(0)
    m, x = Degenerate().eval(), (torch.randn(1, 3, 4, 4), torch.randn(2, 0))
    lowered, outs, eager, sim = _lower_and_run(m, x, policy)
    assert [tuple(o.shape) for o in outs] == [tuple(e.shape) for e in eager]
    assert torch.equal(outs[0], x[0]) and torch.equal(outs[1], eager[1]) and outs[4].numel() == 0
    for o, e, s in zip(outs[2:4], eager[2:4], sim[2:4]):
        if policy == "Z":
            assert float((o - e).abs().max()) <= 1e-4 * float(e.abs().max())
        else:
            step = max(t.scale for t in lowered.planned.thetas.values())
            assert float((o - s).abs().max()) <= step
            assert float((o - e).abs().max()) <= 0.05 * float(e.abs().max())


class ZeroRange(nn.Module):
    """conv(x * 0): its input domain observes only zeros."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x * 0))


def test_zero_range_domain_compiles_to_the_right_numbers() -> None:
    torch.manual_seed(0)
    m, x = ZeroRange().eval(), (torch.randn(1, 3, 4, 4),)
    lowered, outs, eager, _ = _lower_and_run(m, x)
    scales = sorted(t.scale for t in lowered.planned.thetas.values())
    assert scales[-1] == 1.0  # the all-zero domain
    # with a 1e-8 scale the int32 bias overflowed and was clamped: errors ~0.5
    out_step = scales[-2]
    assert float((outs[0] - eager[0]).abs().max()) <= 2 * out_step
