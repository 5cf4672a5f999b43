"""A runner compiles a rule only once it can match (``Runner._ready``): what decides that is read off the rule's
patterns (``lhs_tables``, ``lhs_needs``) and must be what compiling it gives; the survey finds the needs of rules
that become ready mid-run among old rows too; and compiling every rule up front, with every need surveyed from
the first round (as before), gives the same e-graph, ids included."""

from pathlib import Path

import numpy as np

from relsat.driver.boundary import zoo
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.search.prefilter import Survey
from relsat.driver.search.runner import Limits, Runner
from relsat.programs.compiler import compile_rule, lhs_needs, lhs_tables
from relsat.programs.parser import load_rules, parse_rules
from relsat.programs.rulesets import load_rule_list
from relsat.relations.egraph import EGraph
from test_determinism import fingerprint

RULES = load_rule_list(["default", "generated"])
SHIPPED = [r for f in sorted((Path(__file__).parent.parent / "programs" / "rules").glob("*.rules"))
           for r in load_rules(f).rules]


def test_tables_and_needs_from_the_patterns_are_the_compiled_ones():
    assert len(SHIPPED) > 1000
    for r in SHIPPED:
        c = compile_rule(r)
        needs = lhs_needs(r)
        assert lhs_tables(r) == c.tables, r.name
        assert (needs.edges, needs.kinds) == (c.edges, c.kinds), r.name


def test_needs_added_late_are_found_among_old_rows():
    """A rule that becomes ready after several surveys: the edge it needs exists only among rows older than the last
    survey, and is found (its needs are surveyed over every row once)."""
    mul = lhs_needs(parse_rules("m: (Mul (Add ?x ?y) ?z) => (Mul (Add ?y ?x) ?z)\n", "t.rules").rules[0])
    g = EGraph()
    x, y = g.add("Input", attrs={"name": np.array(["x", "y"], dtype=object), "shape": [4], "dtype": 1})
    add = g.add("Add", {"a": [x], "b": [y]})[0]
    g.add("Mul", {"a": [add], "b": [y]})  # the edge, at ts 0
    tables = ["op_add", "op_mul", "op_input"]
    s = Survey()
    s.update(g.con, 1, tables)
    s.update(g.con, 2, tables)
    s.add([mul])
    assert not s.allows(mul)
    s.update(g.con, 3, tables)
    assert s.allows(mul)
    g.close()


def test_counts_of_an_empty_egraph():
    assert EGraph().counts() == {"enodes": 0, "eclasses": 0}


def saturate(eager: bool) -> tuple[dict, int]:
    g = import_model(zoo.build("squeezenet")).egraph
    runner = Runner(g, RULES, Limits(iterations=4, enodes=5_000, seconds=120))
    compiled = set()
    begin, ready = runner._begin, runner._ready

    def beginning(tmp):
        run = begin(tmp)
        if eager:  # as before: every rule compiled and every need surveyed from the first round
            for st in run.rules:
                st.needs, st.compiled = lhs_needs(st.ir), compile_rule(st.ir)
            run.survey.add(st.compiled for st in run.rules)
        return run

    def readying(r, eligible):
        ready(r, eligible)
        compiled.update(st.rule for st in eligible if st.compiled is not None)

    runner._begin, runner._ready = beginning, readying
    report = runner.run()
    g.check_invariants()
    rules = g.sql("SELECT round, rule, matches, applied, new_nodes, banned FROM rule_stats ORDER BY ALL")
    return {"tables": fingerprint(g), "rules": rules, "stop": report.stop_reason,
            "rounds": [(it.enodes, it.unions) for it in report.iterations]}, len(compiled)


def test_compiling_only_what_can_match_gives_the_same_egraph():
    lazy, n_lazy = saturate(eager=False)
    eager, n_eager = saturate(eager=True)
    assert lazy == eager
    assert any(matches for _, _, matches, *_ in lazy["rules"])
    assert n_eager == len(RULES) and n_lazy < len(RULES) // 4  # most generated rules cannot match on SqueezeNet


def test_a_condition_is_a_join_key_only_where_the_patterns_share_no_variable():
    linked, apart = (compile_rule(parse_rules(text, "t.rules").rules[0]) for text in (
        "l: (Relu ?x), (Sigmoid ?x) => (Relu (Relu ?x)), (Sigmoid ?x) if (= (shape ?x) (shape ?x))\n",
        "u: (Relu ?x), (Sigmoid ?y) => (Relu (Relu ?x)), (Sigmoid ?y) if (= (shape ?x) (shape ?y))\n"))
    assert "coalesce((e0.shape) = (e0.shape), false)" in linked.match_sql
    assert "coalesce" not in apart.match_sql and "(e0.shape) = (e1.shape)" in apart.match_sql
