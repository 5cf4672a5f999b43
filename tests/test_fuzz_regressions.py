"""Regressions found by the differential fuzzer (relsat.benchmarks.fuzz, issue 26).

Each test is the smallest model (built with onnx.helper) that reproduces one finding, asserting the
correct behaviour; a finding not yet fixed is ``xfail(strict=True)`` so that its fix is noticed.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.optimize import optimize

F = TensorProto.FLOAT
CHEAP = dict(cost_model="analytic", measure=False, candidates=0, node_limit=400, iter_limit=8, time_limit=10.0,
             threads=1)


def _run(model: onnx.ModelProto, feeds: dict) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.mark.xfail(strict=True, reason="an initializer also listed as a graph input (IR >= 4: an overridable "
                   "default) is imported as a constant: driver/onnx_import.py drops it from the inputs "
                   "(real_inputs excludes initializer names) and the rules fold it")
def test_initializer_listed_as_input_stays_an_input():
    """Fuzzer: ``Gen.exposed`` models (e.g. ``python -m relsat.benchmarks.fuzz`` seed 2026, model 3), any rule
    set that rewrites next to the weight.  Here y = (x * a) * b with ``a`` an initializer that is also a graph
    input: ``--rules taso`` folds a * b into one constant and writes a model without the input ``a``, so a
    caller that feeds ``a`` gets "Invalid input name: a" (and a caller's ``a`` would be ignored)."""
    a = numpy_helper.from_array(np.full((4,), 2.0, np.float32), "a")
    b = numpy_helper.from_array(np.full((4,), 3.0, np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "a"], ["h"]), helper.make_node("Mul", ["h", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F, [2, 4]), helper.make_tensor_value_info("a", F, [4])],
        [helper.make_tensor_value_info("y", F, [2, 4])], [a, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    written = optimize(model, rules=["taso"], **CHEAP).model
    assert [i.name for i in written.graph.input] == ["x", "a"]
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32),
             "a": np.full((4,), 5.0, np.float32)}
    np.testing.assert_allclose(_run(written, feeds)[0], _run(model, feeds)[0], rtol=1e-5)
