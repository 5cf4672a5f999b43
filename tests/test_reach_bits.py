"""The cycle filter's reachability search (``relations.reach.reaching``) against a breadth-first search in
Python, on random directed graphs with cycles and self-loops, for both ways of searching and with starts spread
over several groups; and ``cyclic_matches`` over an e-graph's tables against the same search."""

import numpy as np
import pytest

from relsat.relations import reach


def reaches(edges: list[tuple[int, int]], x: int, y: int) -> bool:
    """Whether x reaches y by one edge or more."""
    kids: dict[int, list[int]] = {}
    for p, c in edges:
        kids.setdefault(p, []).append(c)
    seen, todo = set(), list(kids.get(x, []))
    while todo:
        v = todo.pop()
        if v == y:
            return True
        if v not in seen:
            seen.add(v)
            todo.extend(kids.get(v, []))
    return False


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("group", [3, 64, reach.GROUP])
def test_reaching_matches_a_breadth_first_search(seed, group, monkeypatch):
    monkeypatch.setattr(reach, "GROUP", group)
    rng = np.random.default_rng(seed)
    n = 40
    edges = sorted({(int(p), int(c)) for p, c in rng.integers(0, n, size=(70, 2))})  # cycles and self-loops
    pairs = [(int(a), int(b)) for a, b in rng.integers(0, n + 5, size=(60, 2)) if a != b]
    parent, child = (np.array(v, dtype=np.int64) for v in zip(*edges))
    a, b = (np.array(v, dtype=np.int64) for v in zip(*pairs))
    for x, y in ((a, b), (b, a)):  # the start side is the one with fewer distinct e-classes: each way once
        want = np.array([reaches(edges, int(i), int(j)) for i, j in zip(x, y)])
        assert want.any() and not want.all(), "the draw tests nothing"
        assert (reach.reaching(x, y, parent, child) == want).all()
    # the same pairs with one side's e-classes repeated, so the other side is the start
    for x, y in ((a[:4].repeat(15)[:len(b)], b), (a, b[:4].repeat(15)[:len(a)])):
        x, y = x[x != y], y[x != y]
        want = np.array([reaches(edges, int(i), int(j)) for i, j in zip(x, y)])
        assert (reach.reaching(x, y, parent, child) == want).all()


def test_cyclic_matches_reads_the_egraph_and_its_pending_unions():
    """``cyclic_matches`` over an e-graph: the matches with a pair one side of which reaches the other along the
    e-class edges of every op table, and of the pending unions (both ways) once one is queued."""
    from relsat.relations.egraph import EGraph

    g = EGraph()
    x0, x1, z = (int(v) for v in g.add("Input", attrs={"name": np.array(["x0", "x1", "z"], dtype=object),
                                                        "shape": [4], "dtype": 1}))
    s = int(g.add("Add", {"a": [x0], "b": [x1]})[0])
    t = int(g.add("Relu", {"X": [s]})[0])
    u = int(g.add("Mul", {"a": [t], "b": [x1]})[0])
    w = int(g.add("Relu", {"X": [z]})[0])
    g.con.execute("CREATE TEMP TABLE p (mid BIGINT, a BIGINT, b BIGINT)")
    g.con.executemany("INSERT INTO p VALUES (?, ?, ?)", [(1, t, s), (2, x1, t), (3, w, t), (4, x0, x1), (5, x1, x0)])
    found = lambda: (reach.cyclic_matches(g, "SELECT mid, a, b FROM p", "hits"),
                     sorted(m for (m,) in g.sql("SELECT mid FROM hits")))
    assert found() == (2, [1, 2])  # t reaches s and x1; w, x0 and x1 reach nothing of theirs
    g.union([x0], [u])  # pending: x0 ~ u, so x0 reaches x1 through u's node (and x1 is reached from x0)
    assert found() == (4, [1, 2, 4, 5])
