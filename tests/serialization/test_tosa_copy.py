"""Writing a TOSA graph again (serialization/tosa_copy): with nothing replaced and
no output added the copy is the original byte for byte, so a copy differs from
its artefact only where a replacement says."""

from __future__ import annotations

import numpy as np
import pytest
import tosa_serializer as ts

from codec_tosa.runtime.pte import delegates
from codec_tosa.serialization.tosa_copy import NotCopyable, attribute, rewritten
from codec_tosa.serialization.tosa_stats import entry_io_tensors, iter_operators
from codec_tosa.validation.reference_model import run_reference_model


def _payload(lowered, model: str, policy: str) -> bytes:
    return next(d.payload for d in delegates(lowered(model, policy).pte) if d.backend_id == "CodecTosaBackend")


@pytest.mark.parametrize("model, policy", [("linear_head", "I"), ("attention", "W"), ("conv_bn_relu6", "I"),
                                           ("mobile_block", "W")])
def test_a_graph_written_again_unchanged_is_byte_identical(lowered, model: str, policy: str) -> None:
    payload = _payload(lowered, model, policy)
    assert rewritten(payload) == payload


def test_a_replacement_changes_only_its_operator(lowered) -> None:
    """Each FP32 SUB written as the ADD of its negation (x + (0 - y)): the graph is no
    longer the same bytes, and computes the same outputs."""
    payload = _payload(lowered, "attention", "W")

    def sub_as_add(writer, op) -> bool:
        if op.op != ts.Op.SUB or writer.source.tensors[op.inputs[0]].dtype != ts.DType.FP32:
            return False
        y = writer.source.tensors[op.inputs[1]]
        zero = writer.const("zero", np.zeros([1] * len(y.shape), np.float32), ts.DType.FP32)
        negated = writer.tensor(op.inputs[1], y.shape, ts.DType.FP32)
        writer.operator(ts.Op.SUB, [zero, op.inputs[1]], [negated], attribute("SubAttribute"))
        writer.operator(ts.Op.ADD, [op.inputs[0], negated], op.outputs, attribute("AddAttribute"))
        return True

    copy = rewritten(payload, sub_as_add)
    before = [o.op for o in iter_operators(payload)]
    after = [o.op for o in iter_operators(copy)]
    subs = before.count("SUB")
    assert subs > 0 and after.count("ADD") == before.count("ADD") + subs and after.count("SUB") == subs
    assert len(after) == len(before) + 2 * subs  # a CONST and an ADD more per SUB
    rng = np.random.default_rng(3)
    for _ in range(2):
        x = [rng.standard_normal(s.shape).astype(np.float32) for s in entry_io_tensors(payload)[0]]
        a, b = run_reference_model(payload, x), run_reference_model(copy, x)
        assert len(a) == len(b)
        # x - y and x + (0 - y) are the same float (negation is exact)
        assert all(p.tobytes() == q.tobytes() for p, q in zip(a, b))


def test_added_outputs_come_after_the_graphs_own(lowered) -> None:
    payload = _payload(lowered, "linear_head", "I")
    inner = next(o.outputs[0] for o in iter_operators(payload) if o.op == "CONV2D")
    copy = rewritten(payload, outputs=[inner])
    own = entry_io_tensors(payload)[1]
    assert [t.name for t in entry_io_tensors(copy)[1]] == [t.name for t in own] + [inner]


def test_a_graph_of_several_blocks_is_refused() -> None:
    s = ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)
    s.addInputTensor(ts.TosaSerializerTensor("x", [1, 4], ts.DType.FP32))
    block = s.currRegion.currBasicBlock
    block.addTensor("y", [1, 4], ts.DType.FP32)
    s.addOperator(ts.Op.ADD, ["x", "x"], ["y"], attribute("AddAttribute"))
    s.addOutputTensor(block.tensors["y"])
    s.currRegion.addBasicBlock("branch")  # a control-flow operator's block
    with pytest.raises(NotCopyable, match="more than one basic block"):
        rewritten(bytes(s.serialize()))
