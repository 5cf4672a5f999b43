"""A rule that does not hold for some operands (generated or a user's, checked on random draws only) cannot end a
run: a match whose right side's shape or dtype is not its left side's is left out, counted per rule, and reported;
a hand-written shipped rule's conflict is still a bug, raised (``Runner``, ``EGraph.union_agreeing``,
``insert_from(conflicts="drop")``)."""

import pytest
from onnx import TensorProto, helper

from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.search.runner import Limits, Runner
from relsat.programs.ir import SourceLoc
from relsat.programs.parser import parse_rules
from relsat.programs.rulesets import RULES_DIR, hand_written, load_rule_list
from relsat.relations.egraph import ShapeConflict

F = TensorProto.FLOAT
# matrix-1009 as it was once shipped, without its conditions: with ?y of a lower rank than ?x (broadcast) axis 1
# is another dim of each, and the right side is a valid graph of another shape (the fuzzer's crash, seed 2032);
# and a rule wrong for any operand whose two dims differ: its right side, a new node, goes into the left's e-class
BAD = ("matrix-1009: (Concat :axis 1 (Add ?x ?y) (Add ?x ?y)) => (Add (Concat :axis 1 ?x ?x) (Concat :axis 1 ?y ?y))\n"
       "transpose-as-relu: (Transpose :perm (1 0) ?x) => (Relu ?x)\n")


def _model():
    nodes = [helper.make_node("Add", ["x", "y"], ["a"]), helper.make_node("Concat", ["a", "a"], ["c"], axis=1),
             helper.make_node("Transpose", ["m"], ["t"], perm=[1, 0]), helper.make_node("Relu", ["t"], ["r"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, [2, 1, 1, 1]), helper.make_tensor_value_info("y", F, [1, 1, 1]),
                     helper.make_tensor_value_info("m", F, [2, 3])],
        [helper.make_tensor_value_info("c", F, [2, 2, 1, 1]), helper.make_tensor_value_info("r", F, [3, 2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _user_rules(tmp_path):
    path = tmp_path / "mine.rules"
    path.write_text(BAD)
    return list(parse_rules(BAD, str(path)).rules)


def test_a_match_a_user_rule_does_not_hold_for_is_left_out_and_reported(tmp_path):
    rules = _user_rules(tmp_path)
    assert not any(hand_written(r) for r in rules)
    g = import_model(_model()).egraph
    shapes = dict(g.sql("SELECT id, shape FROM eclass"))
    report = Runner(g, rules, Limits(iterations=4, enodes=10_000, seconds=60)).run()
    g.check_invariants()
    # both rules matched, and every one of their matches was left out: the union path (matrix-1009's right side is a
    # valid Add of another shape, in an e-class of its own) and the target path (the Relu would go into the
    # Transpose's e-class)
    assert report.conflicts == {"matrix-1009": 1, "transpose-as-relu": 1}
    assert all(g.sql(f"SELECT shape FROM eclass WHERE id = {cid}")[0][0] == s for cid, s in shapes.items()
               if g.sql(f"SELECT count(*) FROM eclass WHERE id = {cid}")[0][0])
    # no e-class of the Transpose holds a Relu of its input
    relu_in_transpose = g.sql("SELECT count(*) FROM op_relu r JOIN op_transpose t ON r.out = t.out")[0][0]
    assert relu_in_transpose == 0


def test_the_same_conflict_from_a_hand_written_rule_is_raised(tmp_path):
    """A rule of a shipped hand-written set is trusted: a conflict there is a bug in the set, not bad input."""
    rule = _user_rules(tmp_path)[0]
    shipped = type(rule)(rule.name, rule.patterns, rule.rhs, rule.conditions, rule.lets,
                         SourceLoc(str(RULES_DIR / "default.rules"), 1, 1))
    assert hand_written(shipped) and hand_written(load_rule_list(["default"])[0])
    assert not any(hand_written(r) for r in load_rule_list(["generated"])[:5])
    g = import_model(_model()).egraph
    with pytest.raises(ShapeConflict):
        Runner(g, [shipped], Limits(iterations=4, enodes=10_000, seconds=60)).run()


def test_the_report_of_optimize_names_each_rule_and_its_left_out_matches(tmp_path):
    """``optimize`` checks a user's rule file on random draws first (transpose-as-relu is refused there); what its
    notices say of a run whose rule passed that check and still conflicted: one line per rule."""
    from relsat.driver.app.optimize import _conflicts
    g = import_model(_model()).egraph
    report = Runner(g, _user_rules(tmp_path), Limits(iterations=4, enodes=10_000, seconds=60)).run()
    lines = _conflicts(report)
    assert len(lines) == 2 and lines[0].startswith("rule matrix-1009: 1 match(es) left out")
    assert "transpose-as-relu" in lines[1] and _conflicts(None) == []


def test_explanations_record_no_union_that_was_left_out(tmp_path):
    g = import_model(_model()).egraph
    report = Runner(g, _user_rules(tmp_path), Limits(iterations=4, enodes=10_000, seconds=60), explain=True).run()
    assert report.conflicts["matrix-1009"] == 1
    assert g.sql("SELECT count(*) FROM explain_unions WHERE rule = 'matrix-1009'")[0][0] == 0


def test_backtracking_materialises_such_a_match_without_its_union(tmp_path):
    """Backtracking applies each match as a child graph of its own: a child of a match that does not hold is
    materialised without the union (it raised a ShapeConflict before), and the search ends."""
    from relsat.driver.search.backtrack import backtrack
    from relsat.extract.analytic import analytic_costs
    imp = import_model(_model())
    g, roots = imp.egraph, [c for _, c in imp.outputs]
    res = backtrack(g, _user_rules(tmp_path), roots, analytic_costs, alpha=10.0, budget=20)
    # both children (one per rule's match) were materialised, each the root graph again (a duplicate), and the
    # search ran out of graphs
    assert res.stop == "exhausted" and res.stats["materialised"] == 2 and res.stats["duplicates"] == 2
    g.check_invariants()


def test_monte_carlo_search_reports_the_left_out_matches_of_the_graph_it_chose(tmp_path):
    """The report of the rounds that built the chosen e-graph carries the conflicts too (``optimize``'s notices
    read it), as it carries the applications per rule."""
    from relsat.driver.search.mcts import mcts
    from relsat.extract.analytic import analytic_costs
    imp = import_model(_model())
    g, roots = imp.egraph, [c for _, c in imp.outputs]
    res = mcts(g, _user_rules(tmp_path), roots, analytic_costs, limits=Limits(iterations=4, enodes=10_000, seconds=60),
               iterations=10, seed=0, extractor="greedy")
    assert res.report.conflicts and set(res.report.conflicts) <= {"matrix-1009", "transpose-as-relu"}
    g.check_invariants()
