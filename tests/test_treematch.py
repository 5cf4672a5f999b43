"""Rules' left sides as data (``driver.search.treematch``): a rule is skipped only when its match is empty.

Three ways: fixture rules over a hand-built e-graph (a tree absent though each of its edges is there, literal
attributes, a variadic arity, absent and present optional inputs, the semi-naive bound); every rule of the
default and generated sets that the tree match rules out has an empty match on zoo e-graphs after rounds of
saturation; and saturation with and without it gives the same e-graph, ids included, the same matches per rule and
round, with fewer statements (issue 30, item 1)."""

import numpy as np
import pytest

from relsat.driver.boundary import zoo
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.search.runner import Limits, Runner
from relsat.driver.search import treematch
from relsat.driver.search.treematch import TreeFilter
from relsat.programs.compiler import compile_rule, lhs_tables
from relsat.programs.parser import parse_rules
from relsat.programs.rulesets import load_rule_list
from relsat.relations.catalog import OPS
from relsat.relations.egraph import EGraph
from test_determinism import fingerprint

GENERATED = load_rule_list(["default", "generated"])


def small_egraph() -> EGraph:
    """x, y: [2, 3]; Relu(x); Add(Relu(x), y); Add(y, y); Mul(Add(y, y), y); Relu(Concat axis 1 (x, x));
    Concat axis 0 (x, y); Relu(Gemm(x, w)) with no C; everything at ts 0."""
    g = EGraph()
    x, y = g.add("Input", attrs={"name": np.array(["x", "y"], dtype=object), "shape": [2, 3], "dtype": 1})
    w = g.add("Input", attrs={"name": "w", "shape": [3, 4], "dtype": 1})[0]
    r = g.add("Relu", {"x": [x]})[0]
    g.add("Add", {"a": [r], "b": [y]})
    a2 = g.add("Add", {"a": [y], "b": [y]})[0]
    g.add("Mul", {"a": [a2], "b": [y]})
    c1 = g.add("Concat", {"inputs": [[x, x]]}, {"axis": 1})[0]
    g.add("Relu", {"x": [c1]})
    g.add("Concat", {"inputs": [[x, y]]}, {"axis": 0})
    gemm = g.add("Gemm", {"a": [x], "b": [w], "c": [-1]})[0]
    g.add("Relu", {"x": [gemm]})
    return g


# (rule, its last run (since), whether the tree match lets it run)
CASES = [
    ("(Add (Relu ?x) ?y) => ?y", 0, True),
    ("(Mul (Add ?a ?b) ?z) => ?z", 0, True),
    # Mul over Add and Add over Relu both exist, the tree does not
    ("(Mul (Add (Relu ?x) ?y) ?z) => ?z", 0, False),
    ("(Relu (Concat :axis 1 ?a ?b)) => ?a", 0, True),
    # a Concat of axis 0 exists, but none under a Relu
    ("(Relu (Concat :axis 0 ?a ?b)) => ?a", 0, False),
    ("(Relu (Concat :axis 1 ?a ?b ?c)) => ?a", 0, False),  # no three-input Concat
    ("(Relu (Gemm ?a ?b _)) => ?a", 0, True),
    ("(Relu (Gemm ?a ?b ?c)) => ?a", 0, False),  # C absent
    ("(Add (Relu ?x) ?y) => ?y", 1, False),  # every row older than the rule's last run
    ("(Add ?a ?a) => ?a", 0, True),  # Add(y, y)
    ("(Mul (Add ?a ?a) ?a) => ?a", 0, True),  # (a variable repeated across terms is not checked)
    ("(Mul ?a ?a) => ?a", 0, False),  # only Mul(Add(y, y), y)
    ("(Add (Relu ?x) ?x) => ?x", 0, True),  # no such Add, but a variable shared by two terms is not checked
    ("(Add (Relu ?x) ?y) => ?y if (not-const ?y)", 0, True),
    ("(Add (Relu ?x) ?y) => ?y if (const ?y)", 0, False),  # y is an input
    ("(Add (Relu ?x) ?y) => ?y if (zeros ?y)", 0, False),
    # two patterns: each must have a match (their links are not checked)
    ("(Relu ?x), (Mul ?a ?b) => ?x, ?a", 0, True),
    ("(Relu ?x), (Mul (Relu ?a) ?b) => ?x, ?b", 0, False),
]


@pytest.mark.parametrize("text, since, expected", CASES)
def test_fixture_rules(text, since, expected):
    g = small_egraph()
    rule = parse_rules(f"r: {text}\n".replace(" if ", "\n    if "), "t.rules").rules[0]
    tree = TreeFilter("_terms", "_matched")
    tree.add(rule)
    rows = {op.table: g.sql(f"SELECT count(*) FROM {op.table}")[0][0] for op in OPS}
    got = tree.possible(g.con, 1, {rule.name: since}, rows, min_rules=0)
    assert (rule.name in got) is expected
    if not expected and since == 0:  # the compiled match agrees: nothing
        assert not g.sql(f"SELECT count(*) FROM ({compile_rule(rule).match(0, 1)})")[0][0]


@pytest.mark.parametrize("model", [pytest.param("nasnet_a", marks=pytest.mark.slow),
                                   pytest.param("resnext50", marks=pytest.mark.slow), "bert"])
def test_ruled_out_rules_match_nothing(model):
    """After two and three rounds of default + generated rules, every rule the tree match rules out, for every
    rule's last run in 0 .. the round, has an empty match in the next round; and it rules out some."""
    g = import_model(zoo.build(model, small=True)).egraph
    rules = [r for r in GENERATED if all(
        g.sql(f"SELECT count(*) FROM {t}")[0][0] for t in lhs_tables(r))]
    tree = TreeFilter("_terms", "_matched")
    for r in rules:
        tree.add(r)
    ruled_out = 0
    for rounds in (2, 1):  # 2 rounds, then one more
        Runner(g, GENERATED, Limits(iterations=rounds, enodes=50_000, seconds=600), tree_match=False).run()
        rnd = g.sql("SELECT max(round) FROM iterations")[0][0] + 1
        rows = {op.table: g.sql(f"SELECT count(*) FROM {op.table}")[0][0] for op in OPS}
        for since in (0, rnd - 1):
            possible = tree.possible(g.con, rnd, {r.name: since for r in rules}, rows, min_rules=0)
            out = [r for r in rules if r.name not in possible]
            ruled_out += len(out)
            for r in out:
                assert not g.sql(f"SELECT count(*) FROM ({compile_rule(r).match(since, rnd)})")[0][0], r.name
    assert ruled_out


CONST_RULES = parse_rules("""
a-const: (Add ?x (Sub ?w ?w)) => (Add ?w ?w)
b-needs-const: (Relu ?v) => (Sigmoid ?v)
    if (const ?v)
""", "t.rules").rules


def test_a_class_made_constant_in_the_round_lets_the_rules_that_need_it_run(monkeypatch):
    """``a-const`` puts a constant node into the non-constant class of ``x + (w - w)`` (w a weight) in round 1;
    ``b-needs-const``, after it in the round, then matches the Relu over that class, which the tree match, taken
    as the round began, had ruled out: it runs, as rule-at-a-time evaluation runs it."""
    monkeypatch.setattr(treematch, "MIN_RULES", 0)
    runs = {}
    for tree in (False, True):
        g = EGraph()
        x = g.add("Input", attrs={"name": "x", "shape": [3], "dtype": 1})[0]
        w = g.add("Weight", attrs={"ref": 1, "shape": [3], "dtype": 1})[0]
        s = g.add("Add", {"a": [x], "b": [g.add("Sub", {"a": [w], "b": [w]})[0]]})[0]
        g.add("Relu", {"x": [s]})
        Runner(g, CONST_RULES, Limits(iterations=1, enodes=1000, seconds=60), tree_match=tree).run()
        runs[tree] = (fingerprint(g), g.sql("SELECT rule, matches, applied FROM rule_stats ORDER BY ALL"))
    assert runs[True] == runs[False]
    assert ("b-needs-const", 1, 1) in runs[True][1]


def saturate(g: EGraph, tree: bool) -> dict:
    report = Runner(g, GENERATED, Limits(iterations=4, enodes=50_000, seconds=600), tree_match=tree).run()
    g.check_invariants()
    return {"stop": report.stop_reason, "rounds": [(it.enodes, it.eclasses, it.unions) for it in report.iterations],
            "rules": g.sql("SELECT round, rule, matches, applied, new_nodes, banned FROM rule_stats ORDER BY ALL"),
            "tables": fingerprint(g), "statements": sum(report.statements),
            "ran": g.sql("SELECT count(*) FROM rule_stats WHERE seconds > 0")[0][0]}


# all -m slow (resnext50 ~7 s): by default test_the_benchmark_alternates_without_and_with_it compares the e-graphs
# with and without the tree match on full-size MobileNetV2 with the default rules (and fewer empty joins),
# and test_ac_add_same_egraph_with_and_without_tree_match[5] compares them rule_stats included
@pytest.mark.parametrize("model", [pytest.param("resnext50", marks=pytest.mark.slow),
                                   pytest.param("nasnet_a", marks=pytest.mark.slow),
                                   pytest.param("mobilenet_v2", marks=pytest.mark.slow)])
def test_same_egraph_with_and_without_tree_match(model):
    onnx_model = zoo.build(model, small=True)
    runs = {}
    for tree in (False, True):
        g = import_model(onnx_model).egraph
        runs[tree] = saturate(g, tree)
        g.close()
    for key in ("stop", "rounds", "rules", "tables"):
        assert runs[True][key] == runs[False][key], key
    assert runs[True]["ran"] < runs[False]["ran"]  # what it is for: fewer rules' joins run


# n = 7 (~6 s) with -m slow: n = 5 gives the same comparison by default
@pytest.mark.parametrize("n", [5, pytest.param(7, marks=pytest.mark.slow)])
def test_ac_add_same_egraph_with_and_without_tree_match(monkeypatch, n):
    """ac-add's two rules are below ``MIN_RULES``: forced on, the tree match gives the same e-graph."""
    from pathlib import Path

    from relsat.programs.parser import load_rules
    from test_runner_phases import add_chain

    monkeypatch.setattr(treematch, "MIN_RULES", 0)
    rules = list(load_rules(Path(__file__).parent.parent / "programs" / "rules" / "ac-add.rules").rules)
    runs = {}
    for tree in (False, True):
        g = add_chain(n)
        report = Runner(g, rules, Limits(iterations=50, enodes=10**6, seconds=600), tree_match=tree).run()
        runs[tree] = (report.stop_reason, fingerprint(g),
                      g.sql("SELECT round, rule, matches, applied, new_nodes, banned FROM rule_stats ORDER BY ALL"))
        g.close()
    assert runs[True] == runs[False]
    assert runs[True][0].value == "saturated"


def test_the_benchmark_alternates_without_and_with_it():
    """``bench_saturation --tree-ab``, the command RESULTS cites: each side timed, the e-graphs compared."""
    from relsat.benchmarks.bench_saturation import tree_ab

    # (SqueezeNet with the generated rules, before: its empty joins are merges over a shared weight that the prefilter
    # now rules out, and the few rules left are below ``MIN_RULES``)
    row = tree_ab("mobilenet_v2", 50_000, 10, 120.0, "default", 1)
    assert row["same_egraph"] and len(row["without_s"]) == len(row["with_s"]) == 1
    assert row["with_empty"] < row["without_empty"]
