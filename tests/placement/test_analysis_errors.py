"""Bad input to the analysis gets a clear error naming the thing and the reason."""

from __future__ import annotations

import json

import pytest
import torch

from codec_tosa import CommutationTable, Row, analyze
from codec_tosa.graph import GraphError

from graphs import G


def _graph():
    g = G()
    return g.output(g.conv("c1", g.input()))


def test_unknown_policy_names_the_letter():
    with pytest.raises(ValueError, match=r"unknown policy 'Q'.*Z, Y, X, W"):
        analyze(_graph(), "Q")


def test_unknown_placement_names_it():
    with pytest.raises(ValueError, match=r"unknown placement 'global'.*local, nonlocal"):
        analyze(_graph(), "W", "global")


def test_user_table_with_a_port_the_operator_lacks():
    with pytest.raises(ValueError, match=r"aten.cat.default has no port 'inputs'.*tensor inputs: tensors"):
        CommutationTable.from_rows([Row("aten.cat.default", "X", ("inputs", "out"), (("inputs", "out"),))])


def test_user_table_with_an_operator_that_does_not_exist(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"rows": [{"target": "aten.frobnicate.default", "policy": "Y"}]}))
    with pytest.raises(ValueError, match=r"operator aten.frobnicate.default does not exist"):
        CommutationTable.from_json(path)


def test_user_table_with_its_own_policies_is_used(tmp_path):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"policies": ["A", "B"], "rows": [
        {"target": "aten.convolution.default", "policy": "B", "encoded": ["input", "weight", "out"],
         "weights": ["weight"]}]}))
    table = CommutationTable.from_json(path)
    assert analyze(_graph(), "A", table=table).codecs == []
    assert len(analyze(_graph(), "B", table=table).domains) == 2


def test_graph_without_meta_val_names_the_node():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x)

    gm = torch.fx.symbolic_trace(M())  # no meta["val"]
    with pytest.raises(GraphError, match=r"node relu .*no meta\['val'\]"):
        analyze(gm, "W")


def test_dynamic_shapes_are_refused_with_the_node_named():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv2d(3, 4, 1)

        def forward(self, x):
            return self.c(x)

    batch = torch.export.Dim("batch", min=2, max=8)
    ep = torch.export.export(M(), (torch.randn(2, 3, 4, 4),), dynamic_shapes={"x": {0: batch}})
    with pytest.raises(GraphError, match=r"node x: dynamic \(symbolic\) shape"):
        analyze(ep, "W")


def test_unknown_operators_are_fp32_with_one_warning():
    from codec_tosa.graph import GraphBuilder

    b = GraphBuilder()
    x = b.placeholder("x", (4,))
    y = b.op("f", "aten.frobnicate.default", [("self", x)], (4,))[0]
    z = b.op("g", "aten.frobnicate.default", [("self", y)], (4,))[0]
    b.graph_output([z])
    with pytest.warns(UserWarning, match=r"not in the commutation table are FP32: aten.frobnicate.default$"):
        a = analyze(b.finish(), "W")
    assert a.codecs == []
