"""Mask-aware derivation (relations/tensor_mask.py): the Longformer-style encoder's attention, written as full
QK^T plus a band mask, derived into block-banded attention -- by the band found in the mask's values, variable
substitution and boundary relaxing, no banded-attention rule -- matched back to ONNX and equal under ONNX
Runtime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.boundary import zoo
from relsat.relations.tensor_derive import equivalent
from relsat.relations.tensor_lower import lower_graph
from relsat.relations.tensor_mask import band, band_blocks, gathers_apart
from relsat.relations.tensor_match import match

ATTENTION = ["transpose_1", "transpose_2", "transpose_3"]  # Q, K^T, V of the first layer


def values(model, names, x):
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for n in names:
        probe.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, None))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(["output", *names], sess.run(None, {"input": x})))


@pytest.fixture(scope="module")
def layer():
    """The small Longformer-style model's first attention (MatMul, Mul, Add mask, Softmax, MatMul) as a program."""
    m = zoo.build("longformer", small=True)
    x = np.random.default_rng(0).standard_normal((1, 128, 32)).astype(np.float32)
    vals = values(m, ["where_1", *ATTENTION, "matmul_5"], x)
    nodes = {n.output[0]: n for n in m.graph.node}
    chain = [nodes[n] for n in ("matmul_4", "mul_1", "add_4", "softmax_1", "matmul_5")]
    scale = numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "inv_sqrt_dk"))
    consts = {"where_1": vals["where_1"], "inv_sqrt_dk": scale}
    shapes = {n: vals[n].shape for n in [*ATTENTION, "where_1"]} | {"inv_sqrt_dk": ()}
    return lower_graph(chain, shapes, consts), consts, vals


def test_the_band_is_read_from_the_mask():
    i, j = np.indices((64, 64))
    mask = np.where(np.abs(i - j) <= 5, 0.0, np.finfo(np.float32).min)
    assert band(mask, 8) == (5, 5)
    causal = np.where(j <= i, 0.0, -1e9)
    assert band(causal, 8) == (56, 0)  # the last block reads everything before it
    assert band(np.zeros((64, 64)), 8) == (56, 56)  # no mask: every column of every block
    assert band(np.full((4, 4), -1e9), 2) is None  # a row that keeps nothing


def test_banded_attention_is_derived_matched_and_equal_under_onnx_runtime(layer):
    program, consts, vals = layer
    derived = band_blocks(program, "where_1", consts["where_1"], 16)
    assert derived is not None
    shapes = dict((n, e.shape) for n, e in derived.steps)
    assert shapes["matmul_4"] == (1, 2, 8, 16, 48)  # scores over 8 blocks x 16 rows x a window of 48, not 128 x 128
    assert equivalent(program, derived, fixed={"where_1": consts["where_1"]})
    nodes, inits = match(gathers_apart(derived), "matmul_5", consts)
    ops = [n.op_type for n in nodes]
    assert ops.count("MatMul") == 2 and "Softmax" in ops and "Concat" in ops
    graph = helper.make_graph(nodes, "band", [helper.make_tensor_value_info(n, TensorProto.FLOAT, vals[n].shape)
                                             for n in ATTENTION],
                              [helper.make_tensor_value_info("matmul_5", TensorProto.FLOAT, None)],
                              [*inits, numpy_helper.from_array(consts["inv_sqrt_dk"], "inv_sqrt_dk")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {n: vals[n] for n in ATTENTION})[0]
    np.testing.assert_allclose(got, vals["matmul_5"], rtol=1e-5, atol=1e-6)


def test_no_derivation_where_the_mask_keeps_everything(layer):
    program, consts, _ = layer
    assert band_blocks(program, "where_1", np.zeros_like(consts["where_1"]), 16) is None
    # a mask whose band is wider than claimed by a wrong threshold is caught by the numeric check
    loose = np.where(consts["where_1"] < 0, -3.0, 0.0).astype(np.float32)
    assert band_blocks(program, "where_1", loose, 16, threshold=-1.0) is None


def test_the_band_benchmark_runs_and_compares_equal_outputs():
    import re

    from relsat.benchmarks import bench_band

    line = bench_band.one(128, 16, runs=2)
    assert float(re.search(r"max \|diff\| ([0-9.e+-]+)", line).group(1)) < 1e-5
    assert "speedup" in line
