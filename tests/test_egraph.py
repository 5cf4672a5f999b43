"""E-graph tables: hash-consing, union-find against a reference, congruence closure, invariants."""

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relsat.relations.egraph import EGraph, InvariantError, ShapeConflict


def inputs(g, n, shape=(4,)):
    names = np.array([f"x{i}" for i in range(n)], dtype=object)
    return g.add("Input", attrs={"name": names, "shape": list(shape), "dtype": 1})


def test_hash_consing_returns_existing_class():
    g = EGraph()
    a, b = inputs(g, 2)
    first = g.add("Add", {"a": [a, a], "b": [b, b]})
    again = g.add("Add", {"a": [a], "b": [b]})
    assert first[0] == first[1] == again[0]
    assert g.table_counts()["Add"] == 1


def test_attributes_are_part_of_the_key():
    g = EGraph()
    (x,) = inputs(g, 1, (2, 3))
    s1 = g.add("Softmax", {"x": [x]}, {"axis": 0})
    s2 = g.add("Softmax", {"x": [x]}, {"axis": 1})
    s3 = g.add("Softmax", {"x": [x]}, {"axis": -1})  # normalised to 1 on insert
    assert s1[0] != s2[0] and s2[0] == s3[0]


def test_congruence_one_level():
    g = EGraph()
    a, b = inputs(g, 2)
    fa, fb = g.add("Relu", {"x": [a, b]})
    assert fa != fb
    g.union([a], [b])
    report = g.rebuild()
    assert report.congruences >= 1
    assert g.find([fa])[0] == g.find([fb])[0]
    g.check_invariants()


def test_congruence_through_several_levels():
    g = EGraph()
    a, b, c = inputs(g, 3)
    chain_a, chain_b = [a], [b]
    for _ in range(5):
        chain_a.append(g.add("Add", {"a": [chain_a[-1]], "b": [c]})[0])
        chain_b.append(g.add("Add", {"a": [chain_b[-1]], "b": [c]})[0])
    top_a = g.add("Sigmoid", {"x": [chain_a[-1]]})[0]
    top_b = g.add("Sigmoid", {"x": [chain_b[-1]]})[0]
    classes_before = g.counts()["eclasses"]
    g.union([a], [b])
    g.rebuild()
    assert g.find([top_a])[0] == g.find([top_b])[0]
    assert g.counts()["eclasses"] == classes_before - 7  # a~b, five Adds, one Sigmoid
    assert g.counts()["enodes"] == g.counts()["eclasses"] + 1  # only the two inputs share a class
    g.check_invariants()


def test_congruence_through_variadic_and_tuple_nodes():
    g = EGraph()
    a, b, c = inputs(g, 3, (2, 4))
    cat1, cat2 = g.add("Concat", {"inputs": [[a, c], [b, c]]}, {"axis": 1})
    sp1, sp2 = g.add("Split", {"input": [cat1, cat2]}, {"axis": 1, "split": [3, 5]})
    gi = g.add("getitem", {"t": [sp1, sp2]}, {"index": 1})
    g.union([a], [b])
    g.rebuild()
    assert len(set(g.find([cat1, cat2]))) == 1
    assert len(set(g.find([sp1, sp2]))) == 1
    assert len(set(g.find(gi))) == 1
    g.check_invariants()


def test_shape_conflict_names_both_classes():
    g = EGraph()
    (a,) = inputs(g, 1, (2, 3))
    (b,) = g.add("Input", attrs={"name": "y", "shape": [3, 2], "dtype": 1})
    g.union([a], [b])
    with pytest.raises(ShapeConflict, match=rf"e-class {min(a, b)}.*e-class {max(a, b)}"):
        g.rebuild()


def test_constness_propagates_after_union():
    g = EGraph()
    (x,) = inputs(g, 1)
    (w,) = g.add("Weight", attrs={"ref": 0, "shape": [4], "dtype": 1})
    (r,) = g.add("Relu", {"x": [x]})
    (top,) = g.add("Tanh", {"x": [r]})
    assert not g.sql("SELECT is_const FROM eclass WHERE id = ?", [int(top)])[0][0]
    g.union([x], [w])
    g.rebuild()
    assert g.sql("SELECT is_const FROM eclass WHERE id = ?", [int(g.find([top])[0])])[0][0]


def test_rebuild_skipped_without_unions():
    g = EGraph()
    inputs(g, 2)
    assert g.rebuild().skipped


def test_check_invariants_detects_a_broken_table():
    g = EGraph()
    a, b = inputs(g, 2)
    g.add("Relu", {"x": [a, b]})
    g.con.execute("UPDATE op_relu SET x = ?", [int(a)])  # two rows with one key: not congruence closed
    with pytest.raises(InvariantError, match="share the key"):
        g.check_invariants()


def test_file_backed_database_persists(tmp_path):
    path = tmp_path / "g.duckdb"
    g = EGraph(path)
    a, b = inputs(g, 2)
    g.add("Mul", {"a": [a], "b": [b]})
    g.close()
    g2 = EGraph(path, read_only=True)
    assert g2.sql("SELECT op, count(*) FROM enodes GROUP BY op ORDER BY op") == [("Input", 2), ("Mul", 1)]
    assert g2.sql("SELECT count(*) FROM eclasses WHERE shape = [4]")[0][0] == 3


class RefUF:
    def __init__(self):
        self.parent = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            x = self.parent[x]
        return x

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def ref_closure(nodes, unions):
    """Congruence closure by brute force: nodes are (op, child, child) triples over leaf ids."""
    uf = RefUF()
    for a, b in unions:
        uf.union(a, b)
    while True:
        seen, changed = {}, False
        for out, key in nodes.items():
            k = (key[0],) + tuple(uf.find(c) for c in key[1:])
            if k in seen and uf.find(seen[k]) != uf.find(out):
                uf.union(seen[k], out)
                changed = True
            seen.setdefault(k, out)
        if not changed:
            return uf


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_adds_and_unions_match_reference(data):
    g = EGraph()
    n_leaves = data.draw(st.integers(2, 6))
    classes = list(inputs(g, n_leaves))
    nodes, user_pairs = {}, []
    for _ in range(data.draw(st.integers(1, 4))):  # levels of random binary nodes
        k = data.draw(st.integers(1, 6))
        op = data.draw(st.sampled_from(["Add", "Mul"]))
        a = np.array(data.draw(st.lists(st.sampled_from(classes), min_size=k, max_size=k)))
        b = np.array(data.draw(st.lists(st.sampled_from(classes), min_size=k, max_size=k)))
        a, b = g.find(a), g.find(b)
        out = g.add(op, {"a": a, "b": b})
        for x, y, o in zip(a, b, out):
            nodes.setdefault(int(o), (op, int(x), int(y)))
        classes += [int(o) for o in out]
        pairs = data.draw(st.lists(st.tuples(st.sampled_from(classes), st.sampled_from(classes)), max_size=4))
        user_pairs += pairs
        if pairs:
            g.union([p[0] for p in pairs], [p[1] for p in pairs])
            g.rebuild()
            g.check_invariants()
    all_pairs = g.sql("SELECT a, b FROM pending")
    assert all_pairs == []
    ref_all = ref_closure(nodes, user_pairs)
    # same partition: two classes are equal in relsat iff they are equal in the reference closure
    ids = sorted(set(classes))
    found = g.find(np.array(ids))
    for i, x in enumerate(ids):
        for j in range(i + 1, len(ids)):
            assert (found[i] == found[j]) == (ref_all.find(x) == ref_all.find(ids[j]))
    # and relsat is congruence-closed: no two rows of one table share a canonical key
    for op in ("Add", "Mul"):
        rows = g.sql(f"SELECT a, b, count(*) FROM op_{op.lower()} GROUP BY a, b HAVING count(*) > 1")
        assert rows == []


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs CPU affinity and 2 cores")
def test_a_process_pinned_to_one_core_runs_duckdb_on_one_thread():
    """DuckDB's default thread count is the machine's cores; the e-graph's connection takes the process's (its CPU
    affinity), so a run pinned with taskset does not run more threads than it has cores."""
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
            "from relsat.relations.egraph import EGraph; g = EGraph(); "
            "print(g.sql(\"SELECT current_setting('threads')\")[0][0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1"]
    assert EGraph().sql("SELECT current_setting('threads')")[0][0] == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("existing", [45, 4])  # most keys there (filled in place) / most keys new (copied)
def test_an_insert_result_holds_every_row_with_a_node_and_only_those(existing):
    """``insert_from``'s result: every source row whose node exists or was added (the limit cuts new keys, least
    first), with that node's e-class; whether it fills the few new rows in place or copies, the rows are the same."""
    from relsat.relations.catalog import BY_TYPE

    g = EGraph()
    x = g.add("Input", attrs={"name": np.array([f"x{i}" for i in range(12)], dtype=object), "shape": [4], "dtype": 1})
    pairs = [(int(x[i % 12]), int(x[i // 12 + 3])) for i in range(48)]  # 48 distinct keys
    keys = sorted(set(pairs))
    assert len(keys) == 48
    there = g.add("Add", {"a": [a for a, _ in keys[:existing]], "b": [b for _, b in keys[:existing]]})
    node = dict(zip(keys[:existing], there.tolist()))
    rows = [(rid, a, b) for rid, (a, b) in enumerate(pairs * 3)]  # every key wanted by three rows
    g.con.execute("CREATE TABLE src AS SELECT * FROM (VALUES " + ", ".join(f"({r}, {a}, {b})" for r, a, b in rows)
                  + ") v(rid, a, b)")
    limit = 2
    res = g.insert_from(BY_TYPE["Add"], "SELECT * FROM src", limit=limit, result="res")
    got = dict(g.sql("SELECT rid, out FROM res"))
    added = [k for k in keys[existing:]][:limit]  # the least new keys
    for k in added:
        node[k] = g.sql(f"SELECT out FROM op_add WHERE a = {k[0]} AND b = {k[1]}")[0][0]
    assert res.new_nodes == len(added)
    assert got == {rid: node[(a, b)] for rid, a, b in rows if (a, b) in node}
    assert len(got) < len(rows)  # (rows of keys the limit cut are left out)


@pytest.mark.parametrize("op_type", ["Add", "Concat"])  # a keyed op, and one whose keys need the shape rule first
def test_an_insert_numbers_its_rows_by_the_named_column(op_type):
    """``insert_from(rid=...)``: a source whose row id is another column (a rule's builds: ``mid``) gives the same
    nodes, ids and result rows as one with ``rid``, and its result carries that column."""
    from relsat.relations.catalog import BY_TYPE

    results = []
    for rid in ("rid", "mid"):
        g = EGraph()
        x = g.add("Input", attrs={"name": np.array([f"x{i}" for i in range(6)], dtype=object), "shape": [4],
                                  "dtype": 1})
        pairs = [(int(x[i % 6]), int(x[(i * 5) % 6])) for i in range(20)]
        cols = ("[a, b] AS inputs, 0 AS axis" if op_type == "Concat" else "a, b")
        g.con.execute("CREATE TABLE src AS SELECT * FROM (VALUES " + ", ".join(
            f"({r}, {a}, {b})" for r, (a, b) in enumerate(pairs)) + f") v({rid}, a, b)")
        g.insert_from(BY_TYPE[op_type], f"SELECT {rid}, {cols} FROM src", result="res", rid=rid, origin="r")
        results.append((g.fingerprint(), g.sql(f"SELECT {rid}, out FROM res ORDER BY ALL"),
                        g.sql("SELECT id, mid FROM explain_nodes ORDER BY ALL")))
        g.close()
    assert results[0] == results[1]
    assert len(results[0][1]) == 20 and len(results[0][2]) > 0


@pytest.mark.parametrize("changed_only", [False, True])
def test_an_insert_of_keys_that_all_exist_writes_nothing(changed_only):
    """An op whose keys are canonicalised before the lookup (Concat's axis) adds nothing when every row's key has a
    node: no statement numbers or inserts nodes (and none changes ``eclass``), and the result holds every row with
    its node's e-class (with ``changed_only``, the rows whose node is not in their target's)."""
    from relsat.relations.catalog import BY_TYPE

    g = EGraph()
    x = inputs(g, 4)
    made = g.add("Concat", {"inputs": [[x[0], x[1]], [x[2], x[3]]]}, {"axis": 0})
    g.con.execute(f"CREATE TABLE src AS SELECT * FROM (VALUES (0, {x[0]}, {x[1]}, {made[0]}), (1, {x[2]}, {x[3]}, "
                  f"{made[0]}), (2, {x[0]}, {x[1]}, {made[0]})) v(rid, a, b, t)")
    before = g.fingerprint()
    seen = []
    real = g.con

    class Recording:
        def execute(self, sql, *a, **k):
            seen.append(sql.strip().split()[0].upper())
            return real.execute(sql, *a, **k)

        def __getattr__(self, name):
            return getattr(real, name)

    g.con = Recording()
    try:  # axis -1: canonicalised to 0 by the shape rule, so the key is known only after it
        res = g.insert_from(BY_TYPE["Concat"], "SELECT rid, [a, b] AS inputs, -1 AS axis, t FROM src", result="res",
                            target="t", changed_only=changed_only)
    finally:
        g.con = real
    assert res.new_nodes == 0 and g.fingerprint() == before
    assert not {"INSERT", "UPDATE"} & set(seen), seen
    want = {0: made[0], 1: made[1], 2: made[0]}
    if changed_only:
        want = {r: n for r, n in want.items() if n != made[0]}
    assert dict(g.sql("SELECT rid, out FROM res")) == want
