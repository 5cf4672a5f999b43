"""A runner compiles a rule only once it can match (``Runner._ready``): what decides that is read off the rule's
patterns (``lhs_tables``, ``lhs_needs``) and must be what compiling it gives; and compiling every rule up front
gives the same e-graph, ids included."""

from relsat.driver.boundary import zoo
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.search.runner import Limits, Runner
from relsat.programs.compiler import compile_rule, lhs_needs, lhs_tables
from relsat.programs.rulesets import load_rule_list
from test_determinism import fingerprint

RULES = load_rule_list(["default", "generated"])


def test_tables_and_needs_from_the_patterns_are_the_compiled_ones():
    assert len(RULES) > 1000
    for r in RULES:
        c = compile_rule(r)
        needs = lhs_needs(r)
        assert lhs_tables(r) == c.tables, r.name
        assert (needs.edges, needs.kinds) == (c.edges, c.kinds), r.name


def saturate(eager: bool) -> tuple[dict, int]:
    g = import_model(zoo.build("squeezenet")).egraph
    runner = Runner(g, RULES, Limits(iterations=4, enodes=5_000, seconds=120))
    compiled = set()
    ready = runner._ready

    def readying(eligible):
        if eager:  # every rule compiled in its first round (``_live`` still skips what cannot match)
            for st in eligible:
                st.compiled = st.compiled or compile_rule(st.ir)
        ready(eligible)
        compiled.update(st.rule for st in eligible if st.compiled is not None)

    runner._ready = readying
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
