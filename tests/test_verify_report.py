"""The report records the verification completely (issue 29, item 2): the tolerance as used, the draws,
bindings and input sets compared, each input's distribution as the feeds drew it, and the worst element
(output, index, draw, both values, absolute and relative error)."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.app.optimize import optimize
from relsat.driver.boundary import zoo
from relsat.driver.boundary.verify import ATOL, FLOOR_ULPS, INPUT_DRAWS, NOISE_FACTOR, RTOL, verify

F = TensorProto.FLOAT
KEYS = {"ok", "max_abs_err", "max_rel_err", "message", "draws", "bindings", "random_draws", "input_sets",
        "tolerance", "inputs", "worst"}
WORST = {"output", "index", "draw", "draw_label", "abs_err", "rel_err", "got", "expected", "tolerance", "floor",
         "tolerance_used"}


def add_model(w: np.ndarray, batch="n") -> onnx.ModelProto:
    """r = Relu(x), y = x + w: element [i, j] of y depends on w[i, j] alone."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F, list(w.shape))],
        [helper.make_tensor_value_info("r", F, list(w.shape)), helper.make_tensor_value_info("y", F, list(w.shape))],
        [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


W = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)


def perturbed(delta: float, at=(2, 5)) -> onnx.ModelProto:
    w = W.copy()
    w[at] += np.float32(delta)
    return add_model(w)


def test_a_perturbed_weight_is_the_worst_element():
    """One weight moved by 0.5: the worst element is the output element it feeds, in the first draw
    (verification stops there), with both values and its errors."""
    result = verify(add_model(W), perturbed(0.5))
    assert not result.ok
    rep = json.loads(json.dumps(result.as_report()))  # JSON-ready
    assert set(rep) == KEYS and set(rep["worst"]) == WORST
    worst = rep["worst"]
    assert worst["output"] == "y" and worst["index"] == [2, 5] and worst["draw"] == 1
    assert worst["draw_label"] == "(seed 0, scale 1)"
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)  # the first draw's x
    expected = float(x[2, 5] + W[2, 5])
    assert worst["expected"] == pytest.approx(expected, abs=1e-6)
    assert worst["got"] == pytest.approx(expected + 0.5, abs=1e-5)
    assert worst["abs_err"] == pytest.approx(0.5, abs=1e-5)
    assert worst["rel_err"] == pytest.approx(0.5 / abs(expected), rel=1e-4)
    assert worst["tolerance"] == pytest.approx(ATOL + RTOL * abs(expected) + worst["floor"], rel=1e-6)
    assert worst["tolerance_used"] == pytest.approx(worst["abs_err"] / worst["tolerance"], rel=1e-6)
    assert worst["tolerance_used"] > 1
    assert rep["draws"] == 1 and rep["bindings"] == 1 and "input draw 1 of 3" in rep["message"]


def test_a_passing_verification_records_what_it_compared():
    """A move below the tolerance passes; the report still names that element as the worst, and lists
    the tolerance, the three draws and the input's distribution."""
    result = verify(add_model(W), perturbed(2e-5))
    assert result.ok
    rep = result.as_report()
    assert rep["worst"]["output"] == "y" and rep["worst"]["index"] == [2, 5]
    assert 0 < rep["worst"]["tolerance_used"] <= 1 and rep["worst"]["abs_err"] == pytest.approx(2e-5, rel=0.1)
    assert rep["tolerance"]["rtol"] == RTOL and rep["tolerance"]["atol"] == ATOL
    assert rep["tolerance"]["floor_ulps"] == FLOOR_ULPS and rep["tolerance"]["noise_factor"] == NOISE_FACTOR
    assert rep["draws"] == 3 and rep["bindings"] == 1 and rep["input_sets"] == 0
    assert rep["random_draws"] == [{"seed": s, "scale": c} for s, c in INPUT_DRAWS]
    x = rep["inputs"]["x"]
    assert x["dtype"] == "float32" and x["shapes"] == [[4, 8]]
    assert x["distribution"] == "normal" and x["mean"] == 0.0 and x["std"] == [1.0, 1.0, 10.0]
    assert x["min"] < -3 and x["max"] > 3  # the wide draw


def test_the_tolerance_recorded_is_the_one_used():
    loose = verify(add_model(W), perturbed(0.5), rtol=0.5, atol=1.0)
    assert loose.ok and loose.as_report()["tolerance"]["rtol"] == 0.5 and loose.as_report()["tolerance"]["atol"] == 1.0


def test_bindings_and_input_sets_are_counted():
    """Two bindings of a dynamic dim and one user input set: 7 draws, the shapes per binding."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, ["n", 8])],
                              [helper.make_tensor_value_info("y", F, ["n", 8])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    given = {"x": np.ones((5, 8), np.float32)}
    rep = verify(m, m, bindings=[{"x": [2, 8]}, {"x": [3, 8]}], input_sets=[given]).as_report()
    assert rep["ok"] and rep["draws"] == 7 and rep["bindings"] == 2 and rep["input_sets"] == 1
    assert rep["inputs"]["x"]["shapes"] == [[2, 8], [3, 8]] and rep["inputs"]["x"]["distribution"] == "normal"
    assert rep["worst"]["abs_err"] == 0.0 and rep["worst"]["tolerance_used"] == 0.0


def test_integer_inputs_record_the_range_their_use_allows():
    """Gather indices into a 10-row table are drawn in [0, 10), with the use that says so."""
    table = numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "t")
    graph = helper.make_graph([helper.make_node("Gather", ["t", "idx"], ["y"], axis=0)], "g",
                              [helper.make_tensor_value_info("idx", TensorProto.INT64, [6])],
                              [helper.make_tensor_value_info("y", F, [6, 4])], [table])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    idx = verify(m, m).as_report()["inputs"]["idx"]
    assert idx["dtype"] == "int64" and idx["shapes"] == [[6]]
    assert idx["distribution"] == "uniform integers" and (idx["low"], idx["high"]) == (0, 10)
    assert "Gather" in idx["why"] and 0 <= idx["min"] <= idx["max"] < 10


def test_the_optimize_report_records_the_verification():
    """A zoo model optimized end to end (BatchNormalization folded into Conv): the report's ``verification``
    has every field, the worst element names an output of the model with an index of its rank, and it
    survives the JSON report."""
    model = zoo.build("resnet50", small=True)
    r = optimize(model, cost_model="analytic", measure=False)
    assert r.report.written == "optimized"
    v = json.loads(json.dumps(r.report.as_dict(), default=str))["verification"]
    assert set(v) == KEYS and v["ok"] and v["draws"] == 3 and v["bindings"] == 1 and v["input_sets"] == 0
    assert v["tolerance"]["rtol"] == RTOL and v["tolerance"]["atol"] == ATOL
    (name, spec), = v["inputs"].items()
    assert name == model.graph.input[0].name and spec["distribution"] == "normal" and spec["std"] == [1.0, 1.0, 10.0]
    assert spec["shapes"] == [[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]]
    worst = v["worst"]
    outputs = {o.name: len(o.type.tensor_type.shape.dim) for o in model.graph.output}
    assert worst["output"] in outputs and len(worst["index"]) == outputs[worst["output"]]
    assert 0 <= worst["tolerance_used"] <= 1 and worst["abs_err"] <= v["max_abs_err"]
    assert worst["abs_err"] == pytest.approx(abs(worst["got"] - worst["expected"]), rel=1e-6, abs=1e-12)


def test_nothing_compared_when_the_input_graph_is_kept():
    """SqueezeNet (small, analytic costs): the extraction keeps the input graph, so the input model is
    written and nothing is compared; the entry says so rather than inventing a worst element."""
    r = optimize(zoo.build("squeezenet", small=True), cost_model="analytic", measure=False)
    assert r.report.written == "original"
    v = r.report["verification"]
    assert set(v) == KEYS and v["ok"] and v["draws"] == 0 and v["bindings"] == 0 and v["worst"] is None
    assert v["inputs"] == {} and v["tolerance"]["rtol"] == RTOL


class _Counted:
    """An ONNX Runtime session that counts its runs (the real session runs them)."""

    def __init__(self, sess, runs: list):
        self._sess, self._runs = sess, runs

    def run(self, *a, **k):
        self._runs.append(1)
        return self._sess.run(*a, **k)

    def __getattr__(self, name):
        return getattr(self._sess, name)


@pytest.mark.parametrize("delta, ok, plain_runs", [(2e-5, True, 0), (0.5, False, 1)])
def test_the_unoptimized_original_runs_only_where_a_draw_fails_without_its_floor(monkeypatch, delta, ok, plain_runs):
    """The noise floor (how far ONNX Runtime's own optimizations move the original) only widens the tolerance, so
    it is measured only for a draw that fails without it: a candidate that matches never runs the unoptimized
    original; one that differs runs it once, for the draw that fails, and still fails with the floor."""
    from relsat.relations import runtime

    real, runs = runtime.session, []

    def session(model, **k):
        s = real(model, **k)
        return _Counted(s, runs) if k.get("optimize") is False else s

    monkeypatch.setattr(runtime, "session", session)
    result = verify(add_model(W), perturbed(delta))
    assert result.ok is ok and len(runs) == plain_runs
    assert result.draws == (len(INPUT_DRAWS) if ok else 1) and result.noise_floor
