"""Cycle filtering of multi-pattern rule applications, mirrored multi-pattern matches, and
variables in optional child slots."""

import numpy as np

from relsat.driver.search.runner import Limits, Runner
from relsat.programs.compiler import compile_rule
from relsat.programs.parser import parse_rules
from relsat.relations.egraph import EGraph
from relsat.relations.reach import cyclic_classes

# Matched as (Relu r1 = Relu x, Relu r2 = Relu r1) it adds Relu(Add(x, r1)) to r2's e-class (no
# cycle); matched the other way round it adds Relu(Add(r1, x)) to r1's e-class, which then
# depends on itself.  (Not a sound rule: it only has to be shape-correct to build a cycle.)
CYCLIC = list(parse_rules("pair: (Relu ?a), (Relu ?b) => (Relu ?a), (Relu (Add ?a ?b))").rules)


def relu_chain():
    g = EGraph()
    (x,) = g.add("Input", attrs={"name": "x", "shape": [4], "dtype": 1})
    (r1,) = g.add("Relu", {"x": [x]})
    (r2,) = g.add("Relu", {"x": [r1]})
    return g, x, r1, r2


def run(g, rules, **kw):
    # multi-pattern rules in the first round only: the applications below are those of one round
    return Runner(g, rules, Limits(iterations=3, enodes=10_000, seconds=60, multi_rounds=1), scheduler="simple",
                  **kw).run()


def test_cycle_filter_drops_cycle_closing_applications():
    g, x, r1, r2 = relu_chain()
    assert cyclic_classes(g) == []
    report = run(g, CYCLIC)
    g.check_invariants()
    assert cyclic_classes(g) == []
    # the acyclic application went through: r2's e-class gained Relu(Add(x, r1))
    assert report.applied_by_rule["pair"] >= 1
    (r2c,) = g.find([r2])
    assert g.sql("SELECT count(*) FROM op_relu r JOIN op_add a ON a.out = r.x WHERE r.out = ?", [int(r2c)])[0][0] == 1


def test_without_the_filter_the_rule_makes_a_cycle():
    g, x, r1, r2 = relu_chain()
    run(g, CYCLIC, cycle_filter=False)
    g.check_invariants()
    (r1c,) = g.find([r1])
    assert int(r1c) in cyclic_classes(g)


def test_pending_unions_of_the_round_count_as_edges():
    """join queues r1 = r2 earlier in the round; pair's (r1, r2) application, acyclic on its own,
    would then put Relu(Add(x, r1)) into the e-class of r1 = r2 and is dropped as well."""
    rules = list(parse_rules("""
        join: (Relu (Relu ?x)) => (Relu ?x)
        pair: (Relu ?a), (Relu ?b) => (Relu ?a), (Relu (Add ?a ?b))
    """).rules)
    g, x, r1, r2 = relu_chain()
    run(g, rules)
    g.check_invariants()
    (r1c,) = g.find([r1])
    assert cyclic_classes(g) == [int(r1c)]  # join's own (sound) cycle: Relu(r1) is in r1's e-class
    assert not g.sql("SELECT r.out FROM op_relu r JOIN op_add a ON a.out = r.x WHERE r.out = ?", [int(r1c)])


def test_mirrored_multi_pattern_matches_only_once():
    merge = parse_rules("""
        m: (MatMul ?x ?w1), (MatMul ?x ?w2)
           => (getitem 0 (Split :axis -1 :split (?n1 ?n2) (MatMul ?x (Concat :axis 1 ?w1 ?w2)))),
              (getitem 1 (Split :axis -1 :split (?n1 ?n2) (MatMul ?x (Concat :axis 1 ?w1 ?w2))))
           if (const ?w1) (const ?w2) (let ?n1 (dim ?w1 1)) (let ?n2 (dim ?w2 1))
    """).rules[0]
    assert "t0.out < t1.out" in compile_rule(merge).match_sql
    # a rule whose swapped application adds a different fact keeps both orders
    assert "t0.out <> t1.out" in compile_rule(CYCLIC[0]).match_sql

    g = EGraph()
    (x,) = g.add("Input", attrs={"name": "x", "shape": [2, 3], "dtype": 1})
    w = g.add("Weight", attrs={"ref": np.arange(3), "shape": [3, 5], "dtype": 1})
    g.add("MatMul", {"a": [x, x, x], "b": w})
    rows = g.sql(f"SELECT count(*) FROM ({compile_rule(merge).match()})")[0][0]
    assert rows == 3  # one per unordered pair of the three MatMuls


def test_variable_in_an_optional_slot_needs_the_input():
    conv = "(Conv :kernel_shape ?k :strides ?s :pads ?p :dilations ?d ?x ?w ?b)"
    rule = parse_rules(f"c: {conv} => {conv}").rules[0]
    g = EGraph()
    (x,) = g.add("Input", attrs={"name": "x", "shape": [1, 3, 8, 8], "dtype": 1})
    (w,) = g.add("Weight", attrs={"ref": 1, "shape": [4, 3, 3, 3], "dtype": 1})
    (b,) = g.add("Weight", attrs={"ref": 2, "shape": [4], "dtype": 1})
    window = {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1]}
    g.add("Conv", {"x": [x, x], "w": [w, w], "b": [-1, b]}, window)
    rows = g.sql(f"SELECT v_b FROM ({compile_rule(rule).match()})")
    assert rows == [(b,)]
