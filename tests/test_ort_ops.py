"""benchmarks/ort_ops.py: the op histogram of the graph ONNX Runtime runs shows its fusions (as ONNX
Runtime 1.32 does them on the CPU provider, found by running it)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from relsat.benchmarks import ort_ops

RNG = np.random.default_rng(0)


def _w(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    f = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    g = helper.make_graph(nodes, "g", [f(*i) for i in inputs], [f(*o) for o in outputs], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(m)
    return m


def conv_relu_and_linear(linear_shape=(2, 16)) -> onnx.ModelProto:
    """Conv -> Relu on an image, and MatMul -> Add (a Linear layer) on ``linear_shape``."""
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("MatMul", ["a", "M"], ["m"]),
             helper.make_node("Add", ["m", "C"], ["z"])]
    lin = list(linear_shape)
    return _model(nodes, [("x", [1, 3, 8, 8]), ("a", lin)], [("y", [1, 8, 8, 8]), ("z", lin[:-1] + [4])],
                  [_w("W", 8, 3, 3, 3), _w("B", 8), _w("M", 16, 4), _w("C", 4)])


def test_fusions_show_in_the_histogram(tmp_path):
    m = conv_relu_and_linear()
    before = ort_ops.histogram(m.graph)
    assert before == Counter({"Conv": 1, "Relu": 1, "MatMul": 1, "Add": 1})
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    for given in (m, path):  # a ModelProto or a path
        after = ort_ops.ort_histogram(given, threads=1)
        # Conv + Relu: one convolution with the activation inside (NCHWc on x86 with AVX2, else FusedConv)
        assert after["Relu"] == 0 and after["Conv"] == 0
        assert after["com.microsoft.nchwc.Conv"] + after["com.microsoft.FusedConv"] == 1
        # MatMul + Add with static 2-D shapes: one Gemm
        assert after["MatMul"] == after["Add"] == 0 and after["Gemm"] == 1
        text = ort_ops.diff(before, after)
        assert text.startswith(f"nodes 4->{sum(after.values())}: ")
        for part in ("Add 1->0", "Conv 1->0", "Gemm 0->1", "MatMul 1->0", "Relu 1->0"):
            assert part in text
        assert text.index("Relu 1->0") < text.index("com.microsoft.")  # default domain first


def test_dynamic_linear_is_not_fused():
    """MatMul + Add over [batch, seq, 16]: ONNX Runtime's MatMulAddFusion needs the shapes; the Conv still fuses."""
    after = ort_ops.ort_histogram(conv_relu_and_linear(("batch", "seq", 16)))
    assert after["MatMul"] == after["Add"] == 1 and after["Gemm"] == 0
    assert after["Relu"] == 0


def test_diff_format():
    before = Counter({"Conv": 52, "Mul": 40, "Add": 3})
    after = Counter({"Conv": 52, "Mul": 12, "HardSigmoid": 12, "com.microsoft.FusedConv": 4, "Add": 3})
    assert ort_ops.diff(before, after) == (
        "nodes 95->83: HardSigmoid 0->12, Mul 40->12, com.microsoft.FusedConv 0->4")
    assert ort_ops.diff(before, after, changed_only=False) == (
        "nodes 95->83: Add 3->3, Conv 52->52, HardSigmoid 0->12, Mul 40->12, com.microsoft.FusedConv 0->4")
    assert ort_ops.diff(before, before) == "nodes 95->95: same ops"


def test_subgraphs_are_counted():
    branch = lambda op: helper.make_graph([helper.make_node(op, ["x"], ["o"])], op, [],
                                          [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2])])
    node = helper.make_node("If", ["cond"], ["o"], then_branch=branch("Relu"), else_branch=branch("Sigmoid"))
    ms = helper.make_node("Mish", ["x"], ["y"], domain="com.example")
    g = helper.make_graph([node, ms], "g", [], [])
    assert ort_ops.histogram(g) == Counter({"If": 1, "Relu": 1, "Sigmoid": 1, "com.example.Mish": 1})
