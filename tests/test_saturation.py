"""The saturation runner: exact e-graph sizes, semi-naive = naive, statements per round, limits."""

import numpy as np
import pytest

from relsat.driver.search.runner import Limits, Runner, StopReason
from relsat.programs.parser import load_rules, parse_rules
from relsat.relations.egraph import EGraph

from pathlib import Path

AC_ADD = list(load_rules(Path(__file__).parent.parent / "programs" / "rules" / "ac-add.rules").rules)


def add_chain(n, path=None, shape=(4,)):
    g = EGraph(path)
    x = g.add("Input", attrs={"name": np.array([f"x{i}" for i in range(n)], dtype=object), "shape": list(shape),
                              "dtype": 1})
    acc = x[0]
    for i in range(1, n):
        acc = g.add("Add", {"a": [acc], "b": [x[i]]})[0]
    return g


def saturate(g, rules=AC_ADD, **kw):
    limits = Limits(iterations=kw.pop("iterations", 100), enodes=kw.pop("enodes", 10**7), seconds=600)
    return Runner(g, rules, limits, **kw).run()


# n = 5..7 and 9 (~3-5 s each): -m slow; n = 2..4 and 8 check the exact sizes by default (and
# tests/test_runner_phases.py::test_ac_add_is_exact_with_the_default_scheduler_and_limits checks 9)
@pytest.mark.parametrize("n", [2, 3, 4, *(pytest.param(n, marks=pytest.mark.slow) for n in (5, 6, 7)), 8,
                               pytest.param(9, marks=pytest.mark.slow)])
def test_ac_add_exact_sizes(n, tmp_path):
    path = tmp_path / "g.duckdb"
    g = add_chain(n, path)
    report = saturate(g, scheduler="simple")
    assert report.stop_reason == StopReason.SATURATED
    g.check_invariants()
    g.close()
    saved = EGraph(path, read_only=True)  # counted through the user-facing view of the saved file
    classes, nodes = saved.sql("SELECT count(DISTINCT eclass), count(*) FROM enodes WHERE op = 'Add'")[0]
    assert classes == 2**n - n - 1
    assert nodes == 3**n - 2 ** (n + 1) + 1
    assert saved.sql("SELECT max(round) FROM iterations")[0][0] == len(report.iterations)


def test_invariants_hold_after_every_round():
    g = add_chain(5)
    rounds = []
    Runner(g, AC_ADD, Limits(iterations=50, enodes=10**6, seconds=60),
           on_round=lambda it: (g.check_invariants(), rounds.append(it.round))).run()
    assert len(rounds) >= 3


def test_semi_naive_reaches_the_same_egraph_as_naive():
    sizes = []
    for semi in (True, False):
        g = add_chain(6)
        saturate(g, scheduler="simple", semi_naive=semi)
        sizes.append(g.counts())
    assert sizes[0] == sizes[1]


def test_statements_per_round_do_not_grow_with_the_graph():
    """Same rules on a graph ~10x larger: the SQL statements per round stay the same."""
    small = add_chain(5)
    big = EGraph()
    for k in range(10):  # ten independent chains in one e-graph
        x = big.add("Input", attrs={"name": np.array([f"c{k}x{i}" for i in range(5)], dtype=object),
                                    "shape": [4], "dtype": 1})
        acc = x[0]
        for i in range(1, 5):
            acc = big.add("Add", {"a": [acc], "b": [x[i]]})[0]
    r_small = saturate(small, scheduler="simple", iterations=3)
    r_big = saturate(big, scheduler="simple", iterations=3)
    assert big.counts()["enodes"] >= 9 * small.counts()["enodes"]
    assert r_small.statements == r_big.statements


def test_node_limit_is_honoured_within_a_round():
    g = add_chain(8)
    report = saturate(g, enodes=200, scheduler="simple")
    assert report.stop_reason == StopReason.NODE_LIMIT
    assert g.counts()["enodes"] <= 200 + 2  # inserts stop at the limit inside the round
    g.check_invariants()


# a subset of tests/test_runner_phases.py::test_backoff_bans_a_rule_with_many_matches (the same chain, banned rows
# and stop reason, plus the ban lengths), which runs by default
@pytest.mark.slow
def test_backoff_bans_a_rule_with_too_many_matches():
    g = add_chain(8)
    report = Runner(g, AC_ADD, Limits(iterations=4, enodes=10**6, seconds=60), scheduler="backoff",
                    match_limit=50).run()
    banned = g.sql("SELECT count(*) FROM rule_stats WHERE banned")[0][0]
    assert banned >= 1
    assert report.stop_reason == StopReason.ITERATION_LIMIT


def test_rule_with_attributes_and_conditions():
    rules = list(parse_rules("""
        relu-idem: (Relu (Relu ?x)) => (Relu ?x)
        flat-id: (Flatten :axis 1 ?x) => ?x if (rank ?x 2)
    """).rules)
    g = EGraph()
    (x,) = g.add("Input", attrs={"name": "x", "shape": [2, 3], "dtype": 1})
    (r1,) = g.add("Relu", {"x": [x]})
    (r2,) = g.add("Relu", {"x": [r1]})
    (f,) = g.add("Flatten", {"input": [x]}, {"axis": 1})
    saturate(g, rules)
    assert g.find([r2])[0] == g.find([r1])[0]
    assert g.find([f])[0] == g.find([x])[0]
    g.check_invariants()


def test_the_matches_view_numbers_the_rows_of_a_parallel_write_one_to_n():
    """``fill_matches``: the view numbers a table's rows by row id; written by two threads in any order, the ids are
    still offset + 1 ... offset + n, each once, and a row deleted (the cycle filter) leaves the others' ids."""
    import duckdb

    from relsat.driver.search.runner import fill_matches
    from relsat.programs.compiler import MATCH_ROWS, MATCHES

    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute("SET preserve_insertion_order = false")
    con.execute("CREATE TABLE t AS SELECT i AS id, hash(i) % 5000 AS a, hash(i * 7) % 5000 AS b FROM range(100000) r(i)")
    rows = "SELECT x.id AS p, y.id AS q FROM t x JOIN t y ON x.a = y.b WHERE x.id % 3 = 0"
    for offset in (0, 12345):
        n = fill_matches(con, rows, offset)
        assert n > 250_000  # (past two row groups of 122,880: the threads write several)
        assert con.execute(f"SELECT count(*), count(DISTINCT mid), min(mid), max(mid) FROM {MATCHES}").fetchall() == [
            (n, n, offset + 1, offset + n)]
    pairs = dict(con.execute(f"SELECT mid, p * 1000000 + q FROM {MATCHES}").fetchall())
    con.execute(f"DELETE FROM {MATCH_ROWS} WHERE rowid IN (SELECT mid - {offset + 1} FROM {MATCHES} WHERE mid % 7 = 0)")
    after = dict(con.execute(f"SELECT mid, p * 1000000 + q FROM {MATCHES}").fetchall())
    assert after == {m: v for m, v in pairs.items() if m % 7}
    fill_matches(con, "SELECT 7 AS mid, 1 AS p UNION ALL SELECT 9, 2", offset=None)  # rows that carry their ids
    assert sorted(con.execute(f"SELECT mid, p FROM {MATCHES}").fetchall()) == [(7, 1), (9, 2)]


def test_the_last_step_that_reads_the_matches():
    """``Compiled.last_read``: a right side built over its built children reads the matches only in its first
    build; a right side that is a variable is unioned from the matches themselves."""
    from relsat.programs.compiler import MATCHES, compile_rule

    rules = {r.name: r for r in parse_rules(
        "assoc: (Add ?a (Add ?b ?c)) => (Add (Add ?a ?b) ?c)\n"
        "dist: (Mul ?a (Add ?b ?c)) => (Add (Mul ?a ?b) (Mul ?a ?c))\n"
        "back: (Add ?a (Sub ?b ?a)) => ?b\n").rules}
    assoc, dist, back = (compile_rule(rules[k]) for k in ("assoc", "dist", "back"))
    assert assoc.last_read == 0 and len(assoc.builds) == 2 and MATCHES not in assoc.builds[1].reads
    assert dist.last_read == 1 and MATCHES in dist.builds[1].reads and MATCHES not in dist.builds[2].reads
    assert back.last_read == len(back.builds) == 0


def test_matches_dropped_after_their_last_reader_leave_the_same_egraph():
    """A large application drops its matches once no build, union, cycle filter or explanation reads them again
    (``Runner._apply_matches``); the e-graph, ids included, is the one a run that keeps them (explanations on)
    builds, and no temp table of the run is left behind."""
    prints = []
    for explain in (False, True):
        g = add_chain(9)
        saturate(g, explain=explain)
        assert g.sql("SELECT max(matches) FROM rule_stats WHERE NOT banned")[0][0] >= 10_000  # (drops happened)
        prints.append(g.fingerprint())
        assert not g.sql("SELECT table_name FROM duckdb_tables() WHERE temporary")
        g.close()
    assert prints[0] == prints[1]
