"""Rules that are instances of others (``programs.subsume``): which pairs are, which are not, what a rule set keeps,
that leaving an instance out keeps the e-graph, the generator's step, and the shipped generated set."""

import numpy as np
import pytest

from relsat.driver.search.runner import Limits, Runner
from relsat.programs import generate as gen
from relsat.programs.parser import parse_rules
from relsat.programs.subsume import instance, redundant
from relsat.relations.egraph import EGraph


def _rule(text: str):
    (r,) = parse_rules(f"r: {text}").rules
    return r


# (general rule a, rule b, whether b is an instance of a)
PAIRS = [
    ("(Add ?x ?y) => (Add ?y ?x)", "(Add ?a ?b) => (Add ?b ?a)", True),  # a renaming
    ("(Add ?x ?y) => (Add ?y ?x)", "(Add ?x ?x) => (Add ?x ?x)", True),  # a repeated variable
    ("(Add ?x ?x) => (Add ?x ?x)", "(Add ?x ?y) => (Add ?y ?x)", False),  # the other way round
    ("(Add ?x ?y) => (Add ?y ?x)", "(Add (Relu ?x) ?y) => (Add ?y (Relu ?x))", True),  # a variable as a term
    ("(Add ?x ?y) => (Add ?y ?x)", "(Add (Relu ?x) ?y) => (Add ?y ?x)", False),  # another right side
    ("(Add ?x ?y) => (Add ?y ?x)", "(Add ?x ?y) => (Add ?y ?x) if (const ?y)", True),  # a condition more
    ("(Add ?x ?y) => (Add ?y ?x) if (const ?y)", "(Add ?x ?y) => (Add ?y ?x)", False),  # a condition less
    ("(Add ?x ?y) => (Add ?y ?x) if (const ?y)", "(Add ?a ?b) => (Add ?b ?a) if (const ?b)", True),
    ("(Add ?x ?y) => (Add ?y ?x) if (const ?y)", "(Add ?a ?b) => (Add ?b ?a) if (const ?a)", False),
    ("(Concat :axis ?k ?x ?y) => (Concat :axis ?k ?x ?y)", "(Concat :axis 1 ?x ?y) => (Concat :axis 1 ?x ?y)", True),
    ("(Concat :axis ?k ?x ?y) => (Concat :axis ?k ?x ?y)", "(Concat :axis 1 ?x ?y) => (Concat :axis 0 ?x ?y)", False),
    ("(getitem 0 (Split :axis 0 :split (?n ?m) (Concat :axis 0 ?x ?y))) => ?x if (= ?n (dim ?x 0))",
     "(getitem 0 (Split :axis 0 :split (?n ?n) (Concat :axis 0 ?x ?x))) => ?x if (= ?n (dim ?x 0))", True),
    ("(getitem 0 (Split :axis 0 :split (?n ?m) (Concat :axis 0 ?x ?y))) => ?x if (= ?n (dim ?x 0))",
     "(getitem 1 (Split :axis 0 :split (?n ?m) (Concat :axis 0 ?x ?y))) => ?x if (= ?n (dim ?x 0))", False),
    ("(Relu ?x) => (Relu ?x)", "(Sigmoid ?x) => (Sigmoid ?x)", False),
    # a variable never stands for an absent input: Gemm without a bias is no instance of Gemm with one
    ("(Relu (Gemm ?x ?y ?c)) => (Relu (Relu (Gemm ?x ?y ?c)))", "(Relu (Gemm ?x ?y)) => (Relu (Relu (Gemm ?x ?y)))",
     False),
    # a variable met twice stands for a term only where the term's nodes are one e-class (every attribute given)
    ("(Mul (Add ?x ?x) ?z) => (Mul ?z (Add ?x ?x))",
     "(Mul (Add (Softmax ?y) (Softmax ?y)) ?z) => (Mul ?z (Add (Softmax ?y) (Softmax ?y)))", False),
    ("(Mul (Add ?x ?x) ?z) => (Mul ?z (Add ?x ?x))",
     "(Mul (Add (Softmax :axis 1 ?y) (Softmax :axis 1 ?y)) ?z) => (Mul ?z (Add (Softmax :axis 1 ?y) (Softmax :axis 1 ?y)))",
     True),
    ("(Reshape :shape ?s ?x) => ?x if (let ?n (dim ?x 0)) (= ?n 1)",  # a rule with let bindings is kept as it is
     "(Reshape :shape ?s ?x) => ?x if (let ?n (dim ?x 0)) (= ?n 1)", False),
]


@pytest.mark.parametrize("a, b, expected", PAIRS)
def test_instance(a, b, expected):
    assert instance(_rule(b), _rule(a)) is expected


def test_multi_pattern_rules_match_pattern_by_pattern():
    (a,) = parse_rules("a: (Relu ?x), (Sigmoid ?y) => (Relu ?x), (Sigmoid ?y)").rules
    (b,) = parse_rules("b: (Relu ?x), (Sigmoid ?x) => (Relu ?x), (Sigmoid ?x)").rules
    (c,) = parse_rules("c: (Sigmoid ?x), (Relu ?y) => (Sigmoid ?x), (Relu ?y)").rules
    assert instance(b, a) and not instance(a, b) and not instance(c, a)


def test_a_rule_matched_in_one_order_does_not_cover_one_matched_in_both():
    """A merge over two interchangeable patterns is matched in one order only (``compiler.mirrored``); a rule
    whose patterns are not interchangeable applies in both, so it adds what the mirrored one never builds."""
    split = "(Split :axis 0 :split (1 1) (Relu (Concat :axis 0 {} {})))"
    a = parse_rules(f"a: (Relu ?x), (Relu ?y) => (getitem 0 {split.format('?x', '?y')}), "
                    f"(getitem 1 {split.format('?x', '?y')})").rules[0]
    b = parse_rules(f"b: (Relu (Sigmoid ?z)), (Relu ?y) => (getitem 0 {split.format('(Sigmoid ?z)', '?y')}), "
                    f"(getitem 1 {split.format('(Sigmoid ?z)', '?y')})").rules[0]
    c = parse_rules(f"c: (Relu ?u), (Relu ?v) => (getitem 0 {split.format('?u', '?v')}), "
                    f"(getitem 1 {split.format('?u', '?v')})").rules[0]
    assert not instance(b, a) and instance(c, a) and instance(a, c)


def test_redundant_keeps_the_first_named_of_renamings_and_the_most_general():
    rules = parse_rules("""
        c: (Add ?a ?b) => (Add ?b ?a)
        b: (Add ?x ?y) => (Add ?y ?x)
        d: (Add ?x ?x) => (Add ?x ?x)
        e: (Add ?x ?y) => (Add ?y ?x) if (const ?y)
        f: (Mul ?x ?y) => (Mul ?y ?x)
    """).rules
    assert redundant(rules) == {"c": "b", "d": "b", "e": "b"}
    # every rule left out is covered by a rule kept, whatever the order the rules come in
    assert redundant(list(reversed(rules))) == {"c": "b", "d": "b", "e": "b"}


def test_a_chain_of_instances_is_covered_by_the_rule_kept():
    rules = parse_rules("""
        a3: (Add ?p ?q) => (Add ?q ?p)
        a1: (Add (Relu ?x) (Relu ?x)) => (Add (Relu ?x) (Relu ?x))
        a2: (Add (Relu ?x) ?y) => (Add ?y (Relu ?x))
        a0: (Add ?u ?v) => (Add ?v ?u)
    """).rules
    assert redundant(rules) == {"a1": "a0", "a2": "a0", "a3": "a0"}


def _chain() -> EGraph:
    """Mul(a, Add(b, b)), Mul(a, Add(b, c)) and Mul(c, Add(a, b)) over three inputs of shape [4]."""
    g = EGraph()
    x = g.add("Input", attrs={"name": np.array(["a", "b", "c"], dtype=object), "shape": [4], "dtype": 1})
    sums = g.add("Add", {"a": [x[1], x[1], x[0]], "b": [x[1], x[2], x[1]]})
    g.add("Mul", {"a": [x[0], x[0], x[2]], "b": sums})
    return g


def _by_op(g: EGraph) -> dict:
    return {**g.table_counts(), "eclasses": g.counts()["eclasses"]}


def test_leaving_an_instance_out_keeps_the_egraph():
    """The same e-graph (its size per op and e-classes, round by round) with the instance rule and without it."""
    general = "distrib: (Mul ?x (Add ?y ?z)) => (Add (Mul ?x ?y) (Mul ?x ?z))\ncomm: (Add ?x ?y) => (Add ?y ?x)\n"
    special = "distrib-same: (Mul ?x (Add ?y ?y)) => (Add (Mul ?x ?y) (Mul ?x ?y))\n"
    rules = parse_rules(general + special).rules
    assert redundant(rules) == {"distrib-same": "distrib"}
    seen = []
    for rs in (rules, [r for r in rules if r.name != "distrib-same"]):
        g = _chain()
        rep = Runner(g, rs, Limits(iterations=10, enodes=10_000, seconds=60), scheduler="simple").run()
        g.check_invariants()
        seen.append(([(i.enodes, i.eclasses) for i in rep.iterations], _by_op(g)))
    assert seen[0] == seen[1]
    assert seen[0][1]["Mul"] > 3  # the rules did rewrite


def test_the_generator_leaves_instances_out_and_writes_one_way_where_one_direction_is_one():
    texts = {"matrix-0001": "matrix-0001: (Add ?x (Add ?y ?z)) <=> (Add ?y (Add ?x ?z))",
             "matrix-0002": "matrix-0002: (Add ?x (Add ?y ?s)) <=> (Add ?y (Add ?x ?s))\n    if (const ?s)",
             "matrix-0003": "matrix-0003: (Relu (Mul ?x ?x)) => (Mul ?x ?x)",
             "image-0001": "image-0001: (Relu (Mul ?a ?a)) => (Mul ?a ?a)"}
    rules = [gen.Generated(n, t, n.split("-")[0], verdict="ok") for n, t in texts.items()]
    report = gen.Report("", 3, ["matrix", "image"], rules=rules)
    assert gen._mark_instances(rules) == 1
    by = {g.name: g for g in rules}
    # matrix-0001's reverse is a renaming of it: written one way; matrix-0002 restates it over a constant
    assert by["matrix-0001"].text == "matrix-0001: (Add ?x (Add ?y ?z)) => (Add ?y (Add ?x ?z))"
    assert by["matrix-0002"].instance_of == "matrix-0001"
    assert by["matrix-0003"].instance_of == "image-0001"  # a renaming of a rule named before it
    assert [g.name for g in report.kept] == ["matrix-0001", "image-0001"]
    written = parse_rules(gen.render(report).split("\n\n", 1)[1]).rules
    assert [r.name for r in written] == ["matrix-0001", "image-0001"] and not redundant(written)


def test_rules_check_names_a_rule_that_is_an_instance_of_another(tmp_path):
    """``relsat rules check`` checks every rule and then names the instances, across the files given; no failure."""
    from typer.testing import CliRunner

    from relsat.driver.app.cli import app

    (tmp_path / "a.rules").write_text("comm: (Add ?x ?y) => (Add ?y ?x)\n")
    (tmp_path / "b.rules").write_text("same: (Add ?x ?x) => (Add ?x ?x)\nrelu: (Relu (Relu ?x)) => (Relu ?x)\n")
    res = CliRunner().invoke(app, ["rules", "check", str(tmp_path / "a.rules"), str(tmp_path / "b.rules")])
    assert res.exit_code == 0, res.output
    assert "b:same: an instance of a:comm" in res.output and "relu: an instance" not in res.output
    assert "a:comm: ok" in res.output and "b:relu: ok" in res.output
