"""The value predicates ``(zeros ?c)`` and ``(ones ?c)`` (a constant every element of which is 0, resp. 1)
and fold.rules' identities over them (x + 0 = x, x * 1 = x): parsed, compiled to SQL over ``weights.fill``,
checked on random tensors with the constant drawn as that value (a wrong rule is caught), out of the
prover's fragment, and applied to a model whose bias is zero and whose scale is one (an untrained export's),
written and compared under ONNX Runtime; the same model with a bias that is not zero keeps its Add."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.app.optimize import optimize
from relsat.driver.boundary.onnx_import import _fill, import_model
from relsat.programs.ir import Pred
from relsat.programs.parser import parse_rules
from relsat.programs.prove import prove_rule
from relsat.programs.verify import check_rule
from relsat.relations.runtime import session

F = TensorProto.FLOAT


def linear(bias: np.ndarray, scale: np.ndarray, dims=("batch", 5, 8)):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
             numpy_helper.from_array(bias.astype(np.float32), "b"),
             numpy_helper.from_array(scale.astype(np.float32), "s")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["b", "m"], ["a"]),
             helper.make_node("Mul", ["a", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", F, list(dims))],
                              [helper.make_tensor_value_info("y", F, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def rule(text):
    return parse_rules(text).rules[0]


def test_fill_is_the_one_value_of_a_tensor_or_nothing():
    assert _fill(np.zeros((3, 4), np.float32)) == 0.0 and _fill(np.ones(5, np.int64)) == 1.0
    assert np.isnan(_fill(np.array([0.0, 1.0]))) and np.isnan(_fill(np.zeros(0)))
    assert np.isnan(_fill(np.array(["a", "a"])))


def test_the_predicates_parse_and_are_outside_the_prover():
    r = rule("add-zero: (Add ?x ?c) => ?x if (zeros ?c) (same-shape ?x ?c)")
    assert Pred("zeros", r.conditions[0].var) == r.conditions[0]
    proof = prove_rule(r)
    assert proof.status == "tested" and "zeros" in proof.reason


def test_a_wrong_rule_over_a_value_predicate_is_caught():
    good = check_rule(rule("m: (Mul ?x ?c) => ?x if (ones ?c) (same-shape ?x ?c)"))
    bad = check_rule(rule("m: (Mul ?x ?c) => ?x if (zeros ?c) (same-shape ?x ?c)"))  # x * 0 is not x
    assert good.ok and not bad.ok and bad.skipped is None and "differ" in bad.message, (good, bad)


def test_weights_record_their_fill():
    imported = import_model(linear(np.zeros(8), np.ones(8)))
    fills = dict(imported.egraph.sql("SELECT name, fill FROM weights"))
    assert fills["b"] == 0.0 and fills["s"] == 1.0 and fills["w"] is None


@pytest.mark.parametrize("bias_shape, dims", [((8,), ("batch", 5, 8)), ((1,), ("batch", 5, 8)), ((1, 5, 8), (1, 5, 8))])
def test_a_zero_bias_and_a_unit_scale_go(bias_shape, dims):
    m = linear(np.zeros(bias_shape), np.ones(8), dims)
    r = optimize(m, cost_model="analytic", measure=False)
    assert r.report["written"] == "optimized"
    assert set(r.report["extracted"]["ops"]) == {"MatMul", "Relu"}, r.report["extracted"]["ops"]
    applied = {k for k, v in r.report["rules_applied"].items() if v}
    assert {"mul-one-vector"} <= applied and applied & {"add-zero-vector", "add-zero-one", "add-zero-same"}
    ref, got = session(m), session(r.model)
    for n in (1, 3) if dims[0] == "batch" else (1,):
        x = np.random.default_rng(n).standard_normal((n, 5, 8)).astype(np.float32)
        np.testing.assert_array_equal(got.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])


def test_a_bias_that_is_not_zero_stays():
    bias = np.zeros(8)
    bias[3] = 1e-3
    m = linear(bias, np.ones(8))
    r = optimize(m, cost_model="analytic", measure=False)
    ops = r.report["extracted"]["ops"]
    # the bias stays: an Add, or the C input of a Gemm (over a dynamic batch, matmul-add-gemm-dynamic)
    assert ("Add" in ops or "Gemm" in ops) and "Mul" not in ops, ops
    assert not r.report["rules_applied"].get("add-zero-vector")
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    np.testing.assert_allclose(session(r.model).run(None, {"x": x})[0], session(m).run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)


def test_a_bias_that_broadcasts_x_to_a_larger_shape_stays():
    # x [batch, 5, 8] + zeros [2, 5, 8] is [2, 5, 8] at batch 1: not x
    r = optimize(linear(np.zeros((2, 5, 8)), np.ones(8), dims=(1, 5, 8)), cost_model="analytic", measure=False)
    assert "Add" in r.report["extracted"]["ops"]


def rnn(h0: np.ndarray):
    """Two steps of h = tanh(x_t wx + h wh) from the initial state ``h0`` (NasRNN's form, 2-D)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "wx"),
             numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "wh"),
             numpy_helper.from_array(h0.astype(np.float32), "h0")]
    nodes, h = [], "h0"
    for t in range(2):
        nodes += [helper.make_node("MatMul", [f"x{t}", "wx"], [f"a{t}"]),
                  helper.make_node("MatMul", [h, "wh"], [f"b{t}"]),
                  helper.make_node("Add", [f"a{t}", f"b{t}"] if t else [f"b{t}", f"a{t}"], [f"s{t}"]),
                  helper.make_node("Tanh", [f"s{t}"], [f"h{t + 1}"])]
        h = f"h{t + 1}"
    graph = helper.make_graph(nodes, "rnn", [helper.make_tensor_value_info(f"x{t}", F, [1, 8]) for t in range(2)],
                              [helper.make_tensor_value_info(h, F, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_a_product_of_the_zero_initial_state_goes():
    m = rnn(np.zeros((1, 8)))
    r = optimize(m, cost_model="analytic", measure=False)
    assert r.report["written"] == "optimized"
    assert {"matmul-zero-add", "add-matmul-zero"} & {k for k, v in r.report["rules_applied"].items() if v}
    products = [n for n in r.model.graph.node if n.op_type in ("MatMul", "Gemm")]
    assert len(products) == 3 and all("h0" not in n.input for n in r.model.graph.node), products
    rng = np.random.default_rng(2)
    for _ in range(3):
        feed = {f"x{t}": rng.standard_normal((1, 8)).astype(np.float32) for t in range(2)}
        np.testing.assert_allclose(session(r.model).run(None, feed)[0], session(m).run(None, feed)[0],
                                   rtol=1e-6, atol=1e-6)


def test_a_product_of_a_state_that_is_not_zero_stays():
    h0 = np.zeros((1, 8))
    h0[0, 5] = 0.5
    r = optimize(rnn(h0), cost_model="analytic", measure=False)
    assert not {"matmul-zero-add", "add-matmul-zero"} & {k for k, v in r.report["rules_applied"].items() if v}


@pytest.mark.parametrize("zero", [True, False])
def test_the_prefilter_runs_a_value_predicate_only_where_a_constant_has_the_value(zero):
    """A rule whose value predicate no weight or constant of the e-graph meets (``(zeros ?c)`` where every bias is
    trained) has no match: the prefilter's survey (``Compiled.values``) skips its statement. With it and without it,
    saturation gives the same e-graph, ids included, and the same rule statistics; with no zero constant, fewer
    statements."""
    from relsat.driver.search.prefilter import Survey
    from relsat.driver.search.runner import Limits, Runner
    from relsat.programs.compiler import compile_rule, lhs_needs
    from relsat.programs.rulesets import load_rule_list
    from test_determinism import fingerprint

    bias = np.zeros(8) if zero else np.full(8, 0.5)
    model = linear(bias, np.full(8, 2.0))  # (a scale that is not one: mul-one-* have no match either way)
    r = rule("add-zero: (Add ?x ?c) => ?x if (zeros ?c) (rank ?c 1) (= (dim ?c 0) (dim ?x -1))")
    assert compile_rule(r).values == lhs_needs(r).values == {0.0}
    g = import_model(model).egraph
    s = Survey([lhs_needs(r)])
    s.update(g.con, 1, ["op_add"])
    assert s.allows(lhs_needs(r)) == zero
    g.close()
    runs = {}
    for prefilter in (False, True):
        g = import_model(model).egraph
        report = Runner(g, load_rule_list(["default"]), Limits(iterations=5, enodes=5000, seconds=600),
                        prefilter=prefilter).run()
        stats = g.sql("SELECT round, rule, matches, applied, new_nodes, banned FROM rule_stats ORDER BY ALL")
        runs[prefilter] = (fingerprint(g), stats, sum(report.statements))
        g.close()
    assert runs[True][:2] == runs[False][:2]
    applied = {rule for _, rule, _, n, _, _ in runs[True][1] if n}
    assert ("add-zero-vector" in applied) == zero, applied


def test_a_constant_a_rule_puts_into_an_existing_class_reaches_a_value_predicate_in_the_same_round():
    """The survey reads the values as a round begins; a rule that puts a zero constant into an existing e-class
    (``x - x => 0``) makes a later rule's ``(zeros ?c)`` hold in the same round, as it does without the prefilter:
    the same rounds, rule statistics and e-graph either way."""
    from relsat.driver.search.runner import Limits, Runner
    from relsat.programs.parser import parse_rules
    from test_determinism import fingerprint

    rules = parse_rules("sub-self: (Sub ?x ?x) => (Constant :value_float 0.0) if (rank ?x 0)\n"
                        "zz-add-zero: (Add ?y ?c) => ?y if (zeros ?c) (rank ?c 0) (rank ?y 0)\n", "t.rules").rules
    nodes = [helper.make_node("Sub", ["x", "x"], ["s"]), helper.make_node("Add", ["a", "s"], ["y"])]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("a", F, []),
                                           helper.make_tensor_value_info("x", F, [])],
                              [helper.make_tensor_value_info("y", F, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    runs = {}
    for prefilter in (False, True):
        g = import_model(model).egraph
        Runner(g, list(rules), Limits(iterations=5, enodes=1000, seconds=600), prefilter=prefilter).run()
        runs[prefilter] = (fingerprint(g), g.sql("SELECT round, rule, matches, applied, new_nodes, banned FROM "
                                                 "rule_stats ORDER BY ALL"))
        g.close()
    assert (1, "zz-add-zero", 1, 1, 0, False) in runs[False][1]  # the zero reached it in round 1
    assert runs[True] == runs[False]
