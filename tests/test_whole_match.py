"""A rule's semi-naive match as one join (``Compiled.match_live(whole=True)``, what the runner uses on small
tables) gives the rows of its semi-naive parts, as a multiset, with and without carried e-nodes, at every
``since``; and saturation with it gives the e-graph the parts give, ids included. Real DuckDB e-graphs."""

import pytest

from relsat.driver.boundary import zoo
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.search import runner as runner_module
from relsat.driver.search.runner import Limits, Runner
from relsat.programs.rulesets import load_rule_list
from test_determinism import fingerprint
from test_prefilter import surveyed_nasrnn


# ~12 s. By default the one-join path runs end to end in test_saturation_with_one_join_equals_the_parts[bert] (the
# same e-graph, ids included, with and without it)
@pytest.mark.slow
def test_one_join_gives_the_rows_of_the_parts():
    g, compiled, newest, oldest = surveyed_nasrnn()
    several = found = 0
    for c in compiled:
        if not all(t in newest for t in c.tables):
            continue
        for since in (1, 2):  # (at since 0 only the first part is left: nothing to join as one)
            for carry in (False, bool(c.carry)):
                parts = c.match_live(since, 2, newest, oldest, carry=carry)
                one = c.match_live(since, 2, newest, oldest, carry=carry, whole=True)
                if parts is None:
                    assert one is None
                    continue
                rows = sorted(g.sql(f"SELECT * FROM ({parts})"), key=repr)
                assert sorted(g.sql(f"SELECT * FROM ({one})"), key=repr) == rows, (c.rule, since, carry)
                several += one != parts
                found += bool(rows)
    assert several >= 5 and found >= 3  # the one-join form was taken, and on rules that match
    g.close()


# nasrnn (~7 s) with -m slow: bert shows the same by default
@pytest.mark.parametrize("name", [pytest.param("nasrnn", marks=pytest.mark.slow), "bert"])
def test_saturation_with_one_join_equals_the_parts(name, monkeypatch):
    prints = []
    for whole_rows in (0, runner_module.WHOLE_ROWS):  # 0: never one join
        monkeypatch.setattr(runner_module, "WHOLE_ROWS", whole_rows)
        g = import_model(zoo.build(name, small=True)).egraph
        Runner(g, load_rule_list(["default", "merge"]), Limits(iterations=4, enodes=5000, seconds=600)).run()
        prints.append(fingerprint(g))
        g.close()
    assert prints[0] == prints[1]
