"""Saved e-graph states: a checked-out copy changes without touching its state or home, and adopt
moves a state's tables and id sequences into the home database (in memory and in a file)."""

import numpy as np

from relsat.relations.egraph import EGraph
from relsat.relations.states import States


def _inputs(g, n):
    return g.add("Input", attrs={"name": np.array([f"x{i}" for i in range(n)], dtype=object),
                                 "shape": [4], "dtype": 1})


def test_checkout_changes_a_copy_only():
    g = EGraph()
    a, b = _inputs(g, 2)
    states = States(g)
    s0 = states.save()
    states.checkout(s0)
    g.add("Add", {"a": [a], "b": [b]})
    assert g.counts()["enodes"] == 3
    s1 = states.freeze()
    states.checkout(s0)  # the saved state is as it was
    assert g.counts()["enodes"] == 2
    g.add("Mul", {"a": [a], "b": [b]})
    g.add("Relu", {"x": [a]})
    assert g.counts()["enodes"] == 4
    states.checkout(s1)
    assert g.counts()["enodes"] == 3
    states.close()
    assert g.counts()["enodes"] == 2  # home untouched
    assert g.table_counts().get("Add", 0) == 0


def test_adopt_moves_tables_and_sequences_home(tmp_path):
    path = tmp_path / "e.duckdb"
    g = EGraph(path)
    a, b = _inputs(g, 2)
    states = States(g)
    states.checkout(states.save())
    add = g.add("Add", {"a": [a], "b": [b]})[0]
    g.con.execute("CREATE TABLE extra AS SELECT 7 AS x")  # a table only the state has
    g.union([add], [a])
    g.rebuild()
    chosen = states.freeze()
    states.adopt(chosen)
    states.close()
    assert g.counts() == {"enodes": 3, "eclasses": 2}
    g.check_invariants()
    assert g.sql("SELECT x FROM extra") == [(7,)]
    # new ids continue after the state's, not after the home's old sequence
    mul = g.add("Mul", {"a": [a], "b": [b]})[0]
    assert mul > add
    ids = [r[0] for r in g.sql("SELECT id FROM enodes")]
    assert len(ids) == len(set(ids)) == 4
    g.close()
    g = EGraph(path)  # it is in the file
    assert g.counts()["enodes"] == 4
    g.close()
