"""The PyTorch mapping of every catalog operator (``OpDef.torch``, evaluated by extract/torch_cuda.py):
each operator's catalog example, a one-node model, run by the PyTorch runtime on PyTorch's CPU device
and compared with ONNX Runtime element by element (driver/boundary/verify.py: several seeded input draws,
wide-range and negative values), and the mapping's bookkeeping derived from the catalog."""

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")

from catalog_cases import IDS, OPERATORS, example_model  # noqa: E402

from relsat.driver.boundary.torch_runtime import TorchSession  # noqa: E402
from relsat.driver.boundary.verify import verify  # noqa: E402
from relsat.extract import torch_cuda, torch_opaque  # noqa: E402
from relsat.relations.catalog import BY_ONNX, OPS  # noqa: E402
from relsat.relations.runtime import session  # noqa: E402


def test_every_catalog_operator_is_mapped_by_domain_and_op():
    """The catalog's operators and the opaque ones of extract/torch_opaque.py (tests/test_torch_opaque.py)."""
    assert set(torch_cuda.MAPPED) == set(BY_ONNX) | {(op.domain, op.op_type) for op in torch_opaque.OPAQUE}
    assert all(op.torch and op.example for op in BY_ONNX.values())
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft")
    assert torch_cuda.mapped(node)
    node.domain = ""  # the same name in another domain is another operator
    assert not torch_cuda.mapped(node)


def test_expressions_compile_and_see_the_helpers():
    """Every expression compiles, and no catalog input or attribute name hides a helper or the per-node names."""
    reserved = set(torch_cuda.HELPERS) | set(torch_cuda.NODE_NAMES)
    for op in torch_cuda.MAPPED.values():
        compile(op.torch, op.op_type, "eval")
        names = {i.column for i in op.inputs} | {a.name for a in op.attrs} | {n for _, n in op.host}
        assert not names & reserved, (op.op_type, names & reserved)


def test_host_inputs_are_the_catalogs_parameter_inputs():
    def node(op_type, domain=""):
        return helper.make_node(op_type, [], [], domain=domain)

    for op in OPS:
        if torch_cuda.mapped(node(op.op_type, op.domain)):
            assert torch_cuda.host_inputs(node(op.op_type, op.domain)) == {
                lf.input_index for lf in op.lifted if lf.host} | {i for i, _ in op.host}
    assert torch_cuda.host_inputs(node("Reshape")) == {1} and torch_cuda.host_inputs(node("Pad")) == {1, 2, 3}
    assert torch_cuda.host_inputs(node("Gather")) == set()  # its index tensor stays on the device


@pytest.mark.parametrize("op", OPERATORS, ids=IDS)
def test_operator_matches_onnx_runtime(op):
    model = example_model(op)
    assert [(n.domain, n.op_type) for n in model.graph.node] == [(op.domain, op.op_type)]
    res = verify(model, TorchSession(model, "cpu"))
    assert res.ok, res.message


@pytest.mark.parametrize("op", OPERATORS, ids=IDS)
def test_one_node_timing_path_matches_onnx_runtime(op):
    """``torch_cuda.build``, what CUDA operator timing runs (here on the CPU): parameter inputs on the host,
    data inputs copied to the device, the node's outputs as ONNX Runtime computes them."""
    model = example_model(op)
    rng = np.random.default_rng(3)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    if 0 in op.positive:
        feeds = {k: np.abs(v) + 0.5 for k, v in feeds.items()}
    values = {**feeds, **{t.name: numpy_helper.to_array(t) for t in model.graph.initializer}}
    sample = SimpleNamespace(node=model.graph.node[0], opset=20)
    got = torch_cuda.build(sample, values, device="cpu")()
    got = [t.numpy() for t in (got if isinstance(got, list) else [got])]
    want = session(model).run(None, feeds)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with PyTorch CUDA")
@pytest.mark.parametrize("op", OPERATORS, ids=IDS)
def test_operator_matches_onnx_runtime_on_cuda(op):
    model = example_model(op)
    res = verify(model, TorchSession(model, "cuda"))
    assert res.ok, res.message


def _one(node, inputs, outputs, inits=(), opset=18):
    return helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                                             for n, s in inputs],
                                               [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
                                                for n, s in outputs], list(inits)),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@pytest.mark.parametrize("model", [
    # opset 18 Pad with an axes input: pads for the last axis only
    _one(helper.make_node("Pad", ["x", "p", "", "axes"], ["y"]), [("x", [2, 3])], [("y", [2, 6])],
         [numpy_helper.from_array(np.array([1, 2], np.int64), "p"),
          numpy_helper.from_array(np.array([-1], np.int64), "axes")]),
    # Softmax before opset 13 normalises over the input flattened at its axis
    _one(helper.make_node("Softmax", ["x"], ["y"], axis=1), [("x", [2, 3, 4])], [("y", [2, 3, 4])], opset=11),
    _one(helper.make_node("Softmax", ["x"], ["y"]), [("x", [2, 3, 4])], [("y", [2, 3, 4])], opset=11),
    # Gather of an index tensor (not what the catalog imports, but the runtime runs it)
    _one(helper.make_node("Gather", ["x", "i"], ["y"], axis=1), [("x", [2, 5, 3])], [("y", [2, 2, 2, 3])],
         [numpy_helper.from_array(np.array([[0, -1], [3, 2]], np.int64), "i")]),
    # Clip with a max only, Split into equal parts without sizes
    _one(helper.make_node("Clip", ["x", "", "hi"], ["y"]), [("x", [2, 3])], [("y", [2, 3])],
         [numpy_helper.from_array(np.array(0.25, np.float32), "hi")]),
    _one(helper.make_node("Split", ["x"], ["y"], axis=1, num_outputs=2), [("x", [2, 7])], [("y", [2, 4])]),
    # Slice with negative steps (Swin's reversals), to the start (INT64_MIN) and between clamped bounds
    _one(helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"]), [("x", [4, 5, 6])], [("y", [4, 2, 3])],
         [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
          [("s", [-1, 9, 4]), ("e", [-2 ** 63, 1, -9]), ("a", [0, 1, 2]), ("st", [-1, -2, -2])]]),
    # ConvTranspose: symmetric pads with output_padding and a bias (one torch call), asymmetric pads (cropped)
    _one(helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1],
                          output_padding=[1, 1], kernel_shape=[4, 4]), [("x", [1, 3, 5, 5])], [("y", [1, 2, 11, 11])],
         [numpy_helper.from_array(np.random.default_rng(0).standard_normal((3, 2, 4, 4)).astype(np.float32), "w"),
          numpy_helper.from_array(np.array([0.5, -1.0], np.float32), "b")]),
    _one(helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[0, 1, 2, 1],
                          kernel_shape=[3, 3]), [("x", [1, 3, 4, 4])], [("y", [1, 2, 7, 7])],
         [numpy_helper.from_array(np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32), "w"),
          numpy_helper.from_array(np.array([0.25, 2.0], np.float32), "b")]),
], ids=["pad-axes", "softmax-opset11-axis1", "softmax-opset11-default", "gather-index-tensor", "clip-max-only",
        "split-num-outputs", "slice-negative-steps", "convtranspose-symmetric-output-padding",
        "convtranspose-asymmetric-pads"])
def test_onnx_spellings(model):
    if model.graph.node[0].op_type == "Split":
        model.graph.node[0].output.append("z")
        model.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3]))
    onnx.checker.check_model(model)
    res = verify(model, TorchSession(model, "cpu"))
    assert res.ok, res.message


@pytest.mark.parametrize("op, attrs", [("AveragePool", {}), ("MaxPool", {}), ("AveragePool", {"ceil_mode": 1})])
@pytest.mark.parametrize("height", [1, 2, 4])
def test_a_pool_window_longer_than_its_input_gives_what_onnx_runtime_gives(op, attrs, height):
    """ONNX Runtime sizes a pool's output with C++ integer division (truncated toward zero), so a [3, 2]
    window over height 1 or 2 still makes one output row over the rows there are (PP-OCRv4 rec at height
    32); torch refuses such a window: the runtime pads the axis and averages over the cells covered."""
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 2], strides=[3, 2], pads=[0, 0, 0, 0], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, height, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = {"x": np.random.default_rng(height).standard_normal((2, 4, height, 8)).astype(np.float32)}
    want = session(model).run(None, x)[0]
    got = TorchSession(model, "cpu").run(None, x)[0]
    assert got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-6)
