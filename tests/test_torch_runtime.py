"""The PyTorch whole-graph runtime (driver/boundary/torch_runtime.py): its outputs match ONNX Runtime's on
every zoo model (EinNet's seed models too) and on a model relsat wrote, element by element under verify's tolerance, on
PyTorch's CPU device here and on CUDA where a GPU is; nodes it cannot run are refused by name."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

torch = pytest.importorskip("torch")

from relsat.driver.boundary import zoo  # noqa: E402
from relsat.driver.boundary import latency  # noqa: E402
from relsat.driver.errors import RelsatError  # noqa: E402
from relsat.driver.app.optimize import optimize  # noqa: E402
from relsat.driver.boundary.torch_runtime import TorchSession  # noqa: E402
from relsat.relations.backend import CPU, resolve  # noqa: E402
from relsat.driver.boundary.verify import verify  # noqa: E402

CUDA = torch.cuda.is_available()


@pytest.mark.parametrize("name", zoo.ALL_NAMES)
def test_zoo_model_matches_onnx_runtime_on_cpu(name):
    model = zoo.build(name, small=True)
    res = verify(model, TorchSession(model, "cpu"))
    assert res.ok, res.message
    assert res.draws == 3 and res.per_output


@pytest.mark.parametrize("name", ["inception_v3", "bert"])
def test_a_written_model_matches_on_cpu(name, tmp_path):
    """Graphs relsat rewrote (Inception-v3: BatchNormalization folded, convs merged and Split; BERT:
    merged MatMuls) run under the PyTorch runtime as the original does under ONNX Runtime."""
    model = zoo.build(name, small=True)
    out = tmp_path / "o.onnx"
    assert optimize(model, output=out, cost_model="analytic", measure=False).report["written"] == "optimized"
    written = onnx.load(str(out))
    assert [n.op_type for n in written.graph.node] != [n.op_type for n in model.graph.node]
    res = verify(model, TorchSession(written, "cpu"))
    assert res.ok, res.message


def test_a_wrong_model_is_caught():
    """The comparison can fail: a model whose Relu became Sigmoid differs under the PyTorch runtime."""
    model = zoo.build("squeezenet", small=True)
    wrong = onnx.ModelProto()
    wrong.CopyFrom(model)
    relu = next(n for n in wrong.graph.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"
    assert not verify(model, TorchSession(wrong, "cpu")).ok


def test_a_node_without_a_mapping_is_refused_by_name():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    model = helper.make_model(helper.make_graph([helper.make_node("Cos", ["x"], ["y"], name="cosine")], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(RelsatError, match=r"node cosine \(ai.onnx::Cos\)"):
        TorchSession(model, "cpu")


def test_constant_nodes_are_weights():
    """Constant nodes (common in exported models; relsat's writer folds them) run as weights."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])
    nodes = [helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.FLOAT, [2, 3],
                                                                              [1, 2, 3, 4, 5, 6])),
             helper.make_node("Constant", [], ["shape"], value_ints=[3, 2]),
             helper.make_node("Mul", ["x", "c"], ["m"]),
             helper.make_node("Reshape", ["m", "shape"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=10)
    res = verify(model, TorchSession(model, "cpu"))
    assert res.ok, res.message


def test_a_contrib_matmul_runs():
    """com.microsoft FusedMatMul (alpha * A @ B^T here), which relsat rewrites into, matches ONNX Runtime."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 5, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", alpha=0.5, transB=1)
    model = helper.make_model(helper.make_graph([node], "g", [a, b], [y]), ir_version=10,
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    res = verify(model, TorchSession(model, "cpu"))
    assert res.ok, res.message
    model.graph.node[0].domain = ""  # the same name in the default domain is another operator: refused
    with pytest.raises(RelsatError, match="no mapping"):
        TorchSession(model, "cpu")


def test_which_runtime_times_whole_models():
    assert CPU.whole_graph == "onnxruntime" and CPU.profiles_graphs and CPU.here
    import onnxruntime as ort

    cuda = resolve("cuda")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert cuda.whole_graph == "onnxruntime" and cuda.timing == "cuda"
    else:
        assert cuda.whole_graph == ("torch" if CUDA else None) and not cuda.profiles_graphs
        assert cuda.timing == ("cuda-torch" if CUDA else None) and cuda.here == CUDA


def test_session_interface_matches_onnx_runtime():
    model = zoo.build("nasrnn", small=True)
    from relsat.relations import runtime

    ref, ours = runtime.session(model), TorchSession(model, "cpu")
    assert [(i.name, i.shape, i.type) for i in ref.get_inputs()] == [(i.name, i.shape, i.type) for i in ours.get_inputs()]
    assert [o.name for o in ref.get_outputs()] == [o.name for o in ours.get_outputs()]
    feeds = {i.name: np.ones(i.shape, np.float32) for i in ref.get_inputs()}
    name = ref.get_outputs()[0].name
    np.testing.assert_allclose(ours.run([name], feeds)[0], ref.run([name], feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs an NVIDIA GPU with PyTorch CUDA")
@pytest.mark.parametrize("name", zoo.ALL_NAMES)
def test_zoo_model_matches_onnx_runtime_on_cuda(name):
    model = zoo.build(name, small=True)
    res = verify(model, TorchSession(model, "cuda"))
    assert res.ok, res.message


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA or resolve("cuda").whole_graph != "torch",
                    reason="needs PyTorch CUDA without onnxruntime-gpu")
def test_the_guard_times_whole_models_on_the_gpu_with_pytorch():
    model = zoo.build("squeezenet", small=True)
    orig, again = latency.time_models([model, model], backend=resolve("cuda"), budget_s=1.0)
    assert orig.runs >= 2 and orig.median_ms > 0 and again.median_ms > 0
