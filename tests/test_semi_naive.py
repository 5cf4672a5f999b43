"""Semi-naive matching sees rows that a rebuild rewrote (their children merged) as new."""

from relsat.driver.search.runner import Limits, Runner
from relsat.programs.parser import parse_rules
from relsat.relations.egraph import EGraph

# shape-correct, not sound: only the order of events matters here
RULES = list(parse_rules("""
    collapse: (Sigmoid ?a) => ?a
    self-sub: (Sub ?a ?a) => (Relu ?a)
""").rules)


def test_a_row_rewritten_by_rebuild_is_matched_again():
    g = EGraph()
    (x,) = g.add("Input", attrs={"name": "x", "shape": [4], "dtype": 1})
    (y,) = g.add("Sigmoid", {"x": [x]})
    (s,) = g.add("Sub", {"a": [x], "b": [y]})  # Sub(x, y) becomes Sub(x, x) once y = x, in round 1
    Runner(g, RULES, Limits(iterations=5, enodes=1000, seconds=60), scheduler="simple").run()
    g.check_invariants()
    (sc,) = g.find([s])
    assert g.sql("SELECT count(*) FROM op_relu WHERE out = ?", [int(sc)])[0][0] == 1
