"""Old models (issue 26, item 5): below opset 7, IR version 3, string tensors.

Every model ONNX Runtime runs is optimized or passed through unchanged; a model ONNX Runtime cannot run at
its old opset is upgraded (what ONNX's version converter trips on normalised first), checked against the
original under ONNX's reference evaluator and optimized; string outputs are compared exactly; a model no
conversion reaches that ONNX Runtime cannot run either is refused in one line naming the op.  Each case runs
the real CLI on a model built with onnx.helper, with real ONNX Runtime."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from relsat.relations.runtime import session

F = TensorProto.FLOAT


def relsat(*args, cwd, cache):
    env = dict(os.environ, RELSAT_COST_CACHE=str(cache), COLUMNS="250")
    return subprocess.run([sys.executable, "-c", "from relsat.driver.app.cli import main; main()", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def optimize(tmp_path, model: onnx.ModelProto, name: str, *extra):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}.out.onnx"
    onnx.save(model, str(src))
    r = relsat("optimize", src, "-o", out, "--cost-model", "analytic", "--no-measure", "--report",
               tmp_path / f"{name}.json", *extra, cwd=tmp_path, cache=tmp_path / "costs.duckdb")
    return r, src, out


def one_line(r) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def opset6(nodes, inputs, outputs, inits=(), name="old", ir=3) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)])
    m.ir_version = ir
    return m


def conv_bn6() -> onnx.ModelProto:
    """Conv then an opset-6 BatchNormalization with is_test and spatial (ONNX Runtime has no kernel for it)."""
    rng = np.random.default_rng(0)
    c = 4
    inits = [numpy_helper.from_array(rng.standard_normal((c, 3, 3, 3)).astype(np.float32), "w")] + [
        numpy_helper.from_array(v.astype(np.float32), n) for n, v in
        (("s", rng.uniform(0.5, 2, c)), ("b", rng.standard_normal(c)), ("m", rng.standard_normal(c)),
         ("v", rng.uniform(0.5, 2, c)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["y", "s", "b", "m", "v"], ["z"], is_test=1, spatial=1,
                              epsilon=1e-5),
             helper.make_node("Relu", ["z"], ["out"])]
    inputs = [helper.make_tensor_value_info("x", F, [1, 3, 8, 8])] + [
        helper.make_tensor_value_info(t.name, F, list(t.dims)) for t in inits]  # IR 3: initializers are inputs
    return opset6(nodes, inputs, [helper.make_tensor_value_info("out", F, [1, c, 8, 8])], inits, "bn6")


def add6_axis() -> onnx.ModelProto:
    """Add with the legacy broadcast=1 and axis=1: B's dims align with A's from axis 1, not from the end."""
    b = numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")
    nodes = [helper.make_node("Add", ["x", "b"], ["y"], broadcast=1, axis=1), helper.make_node("Relu", ["y"], ["out"])]
    return opset6(nodes, [helper.make_tensor_value_info("x", F, [2, 4, 3]), helper.make_tensor_value_info("b", F, [4])],
                  [helper.make_tensor_value_info("out", F, [2, 4, 3])], [b], "add6")


def ir3_hidden_initializer(opset: int = 6) -> onnx.ModelProto:
    """An old exporter's IR 3 model whose initializer is not listed as a graph input (ONNX Runtime runs it)."""
    w = numpy_helper.from_array(np.random.default_rng(1).standard_normal((3, 3)).astype(np.float32), "_v_4")
    nodes = [helper.make_node("MatMul", ["x", "_v_4"], ["y"]), helper.make_node("Relu", ["y"], ["r"]),
             helper.make_node("Relu", ["r"], ["out"])]
    m = opset6(nodes, [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("out", F, [2, 3])],
               [w], "ir3")
    m.opset_import[0].version = opset
    return m


def test_an_opset6_batchnorm_is_upgraded_checked_and_optimized(tmp_path):
    m = conv_bn6()
    r, src, out = optimize(tmp_path, m, "bn6")
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "bn6.json").read_text()
    assert "upgraded from opset 6" in report and "reference evaluator" in report
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    got = session(str(out)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert "BatchNormalization" not in {n.op_type for n in onnx.load(str(out)).graph.node}  # folded into the Conv


def test_a_legacy_broadcast_with_an_axis_is_upgraded_with_its_meaning(tmp_path):
    r, src, out = optimize(tmp_path, add6_axis(), "add6")
    assert r.returncode == 0, r.stderr
    x = np.random.default_rng(3).standard_normal((2, 4, 3)).astype(np.float32)
    got = session(str(out)).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, np.maximum(x + np.arange(4, dtype=np.float32)[None, :, None], 0), rtol=1e-6)


@pytest.mark.parametrize("opset", [6, 9])
def test_an_ir3_model_whose_initializers_are_not_inputs_is_read_as_onnx_runtime_reads_it(tmp_path, opset):
    m = ir3_hidden_initializer(opset)
    r, src, out = optimize(tmp_path, m, f"ir3_{opset}")
    assert r.returncode == 0, r.stderr
    x = np.random.default_rng(4).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(session(str(out)).run(None, {"x": x})[0], session(m).run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)
    assert len(onnx.load(str(out)).graph.node) == 2  # Relu(Relu(y)) = Relu(y): optimized, not only passed


def test_a_model_onnx_runtime_runs_but_no_conversion_reaches_is_passed_through_unchanged(tmp_path):
    # ScaledTanh (an experimental op of opsets 1 to 9): ONNX Runtime runs it, ONNX's converter has no schema
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ScaledTanh", ["r"], ["out"], alpha=1.5, beta=0.5)]
    m = opset6(nodes, [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("out", F, [2, 3])])
    r, src, out = optimize(tmp_path, m, "st6")
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == src.read_bytes()
    assert "passed through" in (tmp_path / "st6.json").read_text()


def test_a_model_no_conversion_reaches_and_onnx_runtime_cannot_run_is_refused_naming_the_op(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("ImageScaler", ["r"], ["out"], scale=2.0)]
    m = opset6(nodes, [helper.make_tensor_value_info("x", F, [1, 3, 2, 2])],
               [helper.make_tensor_value_info("out", F, [1, 3, 2, 2])])
    r, src, out = optimize(tmp_path, m, "is6")
    assert r.returncode == 1
    line = one_line(r)
    assert line.startswith("error: op ImageScaler:") and "opset 6" in line
    assert not out.exists()


def string_model(action: str = "LOWER") -> onnx.ModelProto:
    nodes = [helper.make_node("StringNormalizer", ["s"], ["t"], case_change_action=action, locale="C"),
             helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "strings", [helper.make_tensor_value_info("s", TensorProto.STRING, [1, 6]),
                                                 helper.make_tensor_value_info("x", F, [2, 4])],
                              [helper.make_tensor_value_info("t", TensorProto.STRING, [1, 6]),
                               helper.make_tensor_value_info("y", F, [2, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


# measured costs with -m slow: tests/test_dynamic.py::test_a_string_tensor_model_passes_its_string_nodes_through
# optimizes a string model with the default measured costs, and [extra0] keeps the strings
@pytest.mark.parametrize("extra", [(), pytest.param(("--cost-model", "measured"), marks=pytest.mark.slow)])
def test_a_string_tensor_model_is_optimized_and_its_strings_kept(tmp_path, extra):
    m = string_model()
    r, src, out = optimize(tmp_path, m, "strings", *extra)
    assert r.returncode == 0, r.stderr
    feeds = {"s": np.array([["Ab", "cD", "", "xyZ", "Q", "q"]], dtype=object), "x": np.ones((2, 4), np.float32)}
    got = session(str(out)).run(None, feeds)
    assert list(got[0].reshape(-1)) == ["ab", "cd", "", "xyz", "q", "q"]


def test_string_outputs_are_compared_exactly():
    from relsat.driver.boundary.verify import verify

    # lower-casing and leaving the case alone agree on lower-case text only: the inputs must show the difference
    result = verify(string_model("LOWER"), string_model("NONE"))
    assert not result.ok and "compared exactly" in result.message and "'t'" in result.message
    assert verify(string_model("LOWER"), string_model("LOWER")).ok
