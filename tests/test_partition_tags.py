"""Partition tags after Arm's partitioner (`targets.tosa.tags`, issue 51): a tag a CPU
operator both reads from and feeds is split so that ExecuTorch can fuse every tag (F1:
a float KV cache's ``index_put`` between two parts of one INT partition), the parts
exchange codes rather than FP32 values, and a tag that computes nothing from the
program's inputs is not delegated (F7)."""

from __future__ import annotations

import torch
from torch import nn

from codec_tosa.targets.tosa.tags import DELEGATION_TAG, _contracted_acyclic, codes_at_boundaries, drop_constant_only, split_cycles

aten = torch.ops.aten
qd = torch.ops.quantized_decomposed


def _graph() -> tuple[torch.fx.GraphModule, dict[str, torch.fx.Node]]:
    """x -> q -> dq -> a --> q2 -> dq2 -> cpu -> q3 -> dq3 -> b(a's dq, cpu's dq) -> out,
    every operator but `cpu` in tag T: T -> cpu -> T, a cycle once T is one node."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed)

    g = torch.fx.Graph()
    x = g.placeholder("x")
    nodes: dict[str, torch.fx.Node] = {}

    def q(name: str, v: torch.fx.Node) -> torch.fx.Node:
        nodes[f"q_{name}"] = g.call_function(qd.quantize_per_tensor.default, (v, 0.1, 0, -128, 127, torch.int8))
        nodes[f"dq_{name}"] = g.call_function(qd.dequantize_per_tensor.default,
                                              (nodes[f"q_{name}"], 0.1, 0, -128, 127, torch.int8))
        return nodes[f"dq_{name}"]

    nodes["a"] = g.call_function(aten.relu.default, (q("x", x),))
    a_codes = nodes["q_a"] = g.call_function(qd.quantize_per_tensor.default, (nodes["a"], 0.1, 0, -128, 127, torch.int8))
    to_cpu = nodes["dq_cpu_in"] = g.call_function(qd.dequantize_per_tensor.default,
                                                  (a_codes, 0.1, 0, -128, 127, torch.int8))
    nodes["dq_b"] = g.call_function(qd.dequantize_per_tensor.default, (a_codes, 0.1, 0, -128, 127, torch.int8))
    nodes["cpu"] = g.call_function(aten.neg.default, (to_cpu,))
    nodes["b"] = g.call_function(aten.add.Tensor, (nodes["dq_b"], q("back", nodes["cpu"])))
    g.output(nodes["b"])
    gm = torch.fx.GraphModule(nn.Module(), g)
    for name, n in nodes.items():
        if name not in ("cpu", "dq_cpu_in", "q_back"):  # Arm leaves the boundary q/dq untagged
            n.meta[DELEGATION_TAG] = "T"
    return gm, nodes


def test_a_tag_a_cpu_operator_reads_and_feeds_is_split_into_acyclic_parts() -> None:
    gm, n = _graph()
    x = torch.randn(4)
    expected = gm(x)
    assert not _contracted_acyclic(gm)
    tags = split_cycles(gm, ["T"])
    assert tags == ["T", "T_split1"] and _contracted_acyclic(gm)
    assert n["a"].meta[DELEGATION_TAG] == "T" and n["b"].meta[DELEGATION_TAG] == "T_split1"
    # the dequantize that b reads from a's codes moved to b's part: the parts exchange int8 codes
    assert n["dq_b"].meta[DELEGATION_TAG] == "T_split1" and n["q_a"].meta[DELEGATION_TAG] == "T"
    for node in gm.graph.nodes:
        for arg in node.all_input_nodes:
            if node.meta.get(DELEGATION_TAG) and arg.meta.get(DELEGATION_TAG) and node.meta[DELEGATION_TAG] != arg.meta[DELEGATION_TAG]:
                assert arg.target == qd.quantize_per_tensor.default, (arg, node)
    assert torch.equal(gm(x), expected)


def test_tags_without_a_cycle_are_left_as_they_are() -> None:
    gm, n = _graph()
    n["cpu"].meta[DELEGATION_TAG] = "T"
    n["dq_cpu_in"].meta[DELEGATION_TAG] = "T"
    n["q_back"].meta[DELEGATION_TAG] = "T"
    assert split_cycles(gm, ["T"]) == ["T"]
    assert {node.meta.get(DELEGATION_TAG) for node in gm.graph.nodes if node.op == "call_function"} == {"T"}


def test_an_integer_delegate_takes_in_and_gives_out_codes() -> None:
    """A dequantize left in the tag though the CPU reads it (Arm checks it before it untags
    the reader) is untagged, and so is a quantize that reads the CPU: an unfolded
    dequantize would be FP32 arithmetic in an INT-only delegate."""
    gm, n = _graph()
    n["dq_cpu_in"].meta[DELEGATION_TAG] = "T"
    n["q_back"].meta[DELEGATION_TAG] = "T"
    codes_at_boundaries(gm, ["T"])
    assert DELEGATION_TAG not in n["dq_cpu_in"].meta and DELEGATION_TAG not in n["q_back"].meta
    assert n["dq_b"].meta[DELEGATION_TAG] == "T" and n["q_a"].meta[DELEGATION_TAG] == "T" and n["dq_back"].meta[DELEGATION_TAG] == "T"


class _ConstantBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("freqs", torch.linspace(0.0, 1.0, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.freqs.cos()


def test_a_tag_computing_only_from_constants_is_not_delegated() -> None:
    ep = torch.export.export(_ConstantBranch(), (torch.randn(8),))
    nodes = {n.target: n for n in ep.graph.nodes if n.op == "call_function"}
    nodes[aten.cos.default].meta[DELEGATION_TAG] = "constants"
    nodes[aten.mul.Tensor].meta[DELEGATION_TAG] = "compute"
    assert drop_constant_only(ep, ["constants", "compute"]) == ["compute"]
    assert DELEGATION_TAG not in nodes[aten.cos.default].meta and nodes[aten.mul.Tensor].meta[DELEGATION_TAG] == "compute"
