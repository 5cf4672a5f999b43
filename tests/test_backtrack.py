"""Sequential backtracking (TASO's relaxed search): alpha > 1 escapes a local minimum that greedy
(alpha = 1) cannot; batch child costs equal the materialised graphs' costs; the same graph is not
expanded twice; budgets hold; the best graph is a valid one-node-per-class graph that computes the same."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.search.backtrack import Backtrack, backtrack
from relsat.driver.boundary.onnx_export import export_model
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.boundary.verify import verify
from relsat.extract.analytic import analytic_costs
from relsat.extract.original import original_choice
from relsat.programs.parser import load_rules, parse_rules
from relsat.relations.egraph import EGraph

RULES = Path(__file__).parent.parent / "programs" / "rules"
FOLD = {r.name: r for r in load_rules(RULES / "fold.rules").rules}
# a sound rule whose first use costs an Identity: Relu moved out of a Transpose, behind an Identity
DETOUR = parse_rules("relu-out: (Transpose :perm ?p (Relu ?x)) => (Identity (Relu (Transpose :perm ?p ?x)))").rules
RULE_LIST = list(DETOUR) + [FOLD["transpose-inverse-2"], FOLD["identity"]]


def model():
    """out1 = Transpose(Relu(Transpose(x))) on 64 x 64, out2 = y @ w on 256 x 256 (so that one
    Identity is a small fraction of the cost)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w")
    nodes = [helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0]), helper.make_node("Relu", ["t1"], ["r"]),
             helper.make_node("Transpose", ["r"], ["out1"], perm=[1, 0]), helper.make_node("MatMul", ["y", "w"], ["out2"])]
    graph = helper.make_graph(
        nodes, "detour", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64]),
                          helper.make_tensor_value_info("y", TensorProto.FLOAT, [256, 256])],
        [helper.make_tensor_value_info("out1", TensorProto.FLOAT, [64, 64]),
         helper.make_tensor_value_info("out2", TensorProto.FLOAT, [256, 256])], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def imported():
    g = EGraph()
    imp = import_model(model(), egraph=g)
    return g, imp, [c for _, c in imp.outputs]


def written(g, imp, roots):
    return export_model(imp, original_choice(g, roots))


def test_alpha_above_one_escapes_the_local_minimum_greedy_cannot():
    g, imp, roots = imported()
    greedy = backtrack(g, RULE_LIST, roots, analytic_costs, alpha=1.0, budget=20)
    assert greedy.best_cost == greedy.start_cost  # the only first step raises the cost
    assert g.table_counts().get("Transpose", 0) == 2

    g, imp, roots = imported()
    relaxed = backtrack(g, RULE_LIST, roots, analytic_costs, alpha=1.05, budget=20)
    assert relaxed.best_cost < relaxed.start_cost
    counts = g.table_counts()
    assert counts.get("Transpose", 0) == 0 and counts.get("Identity", 0) == 0 and counts["Relu"] == 1
    g.check_invariants()
    assert g.sql("SELECT count(*) FROM enodes")[0][0] == g.sql("SELECT count(*) FROM eclass")[0][0]
    out = written(g, imp, roots)
    assert [n.op_type for n in out.graph.node].count("Transpose") == 0
    assert verify(model(), out).ok
    rows = g.sql("SELECT node, parent, action, visits, value, status FROM search_nodes ORDER BY node")
    assert rows[0][1] == -1 and rows[0][5] == "root"
    assert {r[5] for r in rows} <= {"root", "expanded", "materialised", "duplicate", "cyclic", "pruned", "queued"}
    assert sum(r[3] for r in rows) == relaxed.stats["expanded"]


def test_batch_costs_are_the_materialised_graphs_costs():
    g, imp, roots = imported()
    res = backtrack(g, RULE_LIST, roots, analytic_costs, alpha=10.0, budget=50)
    rows = g.sql("SELECT value, cost FROM search_nodes WHERE cost IS NOT NULL AND NOT isnan(cost)")
    assert len(rows) >= 4  # root and every graph materialised on the way to Relu(x)
    for predicted, actual in rows:
        assert actual == pytest.approx(predicted, rel=1e-9)
    assert res.stop == "exhausted"
    assert dag_cost(g) == pytest.approx(res.best_cost, rel=1e-9)  # the adopted graph, priced afresh


def dag_cost(g):
    """The home graph's cost: every node once (the e-graph holds one graph)."""
    analytic_costs(g)
    return g.sql("SELECT sum(k.ms) FROM enodes e JOIN costs k ON k.node = e.id")[0][0]


def parallel_matmuls():
    """Relu(x @ w_i) for three const weights sharing x: merge-matmul (a multi-pattern rule, two unions
    per match) and merge-matmul-3 (three)."""
    rng = np.random.default_rng(0)
    ws = [numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), f"w{i}") for i in range(3)]
    nodes = [n for i in range(3) for n in (helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"]),
                                           helper.make_node("Relu", [f"m{i}"], [f"out{i}"]))]
    graph = helper.make_graph(
        nodes, "parallel", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, [8, 32]) for i in range(3)], ws)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def test_multi_pattern_matches_redirect_all_their_classes():
    merge = {r.name: r for r in load_rules(RULES / "merge.rules").rules}
    g = EGraph()
    imp = import_model(parallel_matmuls(), egraph=g)
    roots = [c for _, c in imp.outputs]
    res = backtrack(g, [merge["merge-matmul"], merge["merge-matmul-3"]], roots, analytic_costs, alpha=100.0,
                    budget=100)
    assert res.stop == "exhausted" and res.best_cost < res.start_cost
    rows = g.sql("SELECT action, value, cost FROM search_nodes WHERE parent = 0")
    assert sorted(a.split("#")[0] for a, _, _ in rows) == ["merge-matmul"] * 3 + ["merge-matmul-3"]
    for _, predicted, actual in rows:  # every child was built: its batch cost is its cost
        assert actual == pytest.approx(predicted, rel=1e-9)
    assert g.table_counts()["MatMul"] == 1 and g.table_counts()["Split"] == 1
    g.check_invariants()
    assert dag_cost(g) == pytest.approx(res.best_cost, rel=1e-9)
    out = export_model(imp, original_choice(g, roots))
    assert [n.op_type for n in out.graph.node].count("MatMul") == 1
    assert verify(parallel_matmuls(), out).ok


def test_the_same_graph_is_not_expanded_twice():
    """Relu(Relu(Relu(Relu(x)))): relu-idempotent has three matches; different orders reach the same
    graphs, which are counted as duplicates and not expanded again."""
    g = EGraph()
    x = g.add("Input", attrs={"name": np.array(["x"], dtype=object), "shape": [8], "dtype": 1})[0]
    for _ in range(4):
        x = g.add("Relu", {"x": [x]})[0]
    res = backtrack(g, [FOLD["relu-idempotent"]], [int(x)], analytic_costs, alpha=10.0, budget=100)
    assert res.stats["duplicates"] >= 1
    assert res.stats["expanded"] == 4  # Relu^4, Relu^3, Relu^2, Relu: one graph each
    assert g.table_counts()["Relu"] == 1


def test_budget_and_time_limit_stop_the_search():
    g, imp, roots = imported()
    res = backtrack(g, RULE_LIST, roots, analytic_costs, alpha=10.0, budget=1)
    assert res.stop == "budget" and res.stats["expanded"] == 1
    g, imp, roots = imported()
    res = Backtrack(g, RULE_LIST, roots, analytic_costs, alpha=10.0, budget=100, seconds=0.0).run()
    assert res.stop == "time limit"
    assert verify(model(), written(g, imp, roots)).ok


def test_optimize_with_backtrack_reports_the_input_cost_and_writes_a_verified_model(tmp_path):
    """The pipeline path, with the rules as a user's rule file (checked on random tensors first)."""
    import duckdb

    from relsat.driver.app.optimize import optimize

    rules = tmp_path / "detour.rules"
    rules.write_text("relu-out: (Transpose :perm ?p (Relu ?x)) => (Identity (Relu (Transpose :perm ?p ?x)))\n"
                     "include fold: transpose-inverse-2 identity\n")
    db = tmp_path / "e.duckdb"
    res = optimize(model(), rules=[str(rules)], search="backtrack", alpha=1.05, budget=20, cost_model="analytic",
                   measure=False, candidates=0, db=db, output=tmp_path / "o.onnx")
    r = res.report
    assert r["search"]["strategy"] == "backtrack" and r["stop_reason"] == "backtrack: exhausted"
    assert r["cost_before"] == pytest.approx(r["search"]["start_cost"])
    assert r["cost_after"] < r["cost_before"]
    assert r["verification"]["ok"] and r["written"] == "optimized"
    out = onnx.load(tmp_path / "o.onnx")
    assert [n.op_type for n in out.graph.node].count("Transpose") == 0
    assert verify(model(), out).ok
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM search_nodes WHERE status = 'expanded'").fetchall()[0][0] >= 3


def test_a_search_repeats_run_to_run():
    """The three pairwise merges cost the same: ties go by rule and match, never by summation order."""
    merge = {r.name: r for r in load_rules(RULES / "merge.rules").rules}
    runs = []
    for _ in range(2):
        g = EGraph()
        imp = import_model(parallel_matmuls(), egraph=g)
        backtrack(g, [merge["merge-matmul"]], [c for _, c in imp.outputs], analytic_costs, alpha=1.0, budget=3)
        runs.append(g.sql("SELECT node, parent, action, value, status FROM search_nodes ORDER BY node"))
    assert runs[0] == runs[1]
