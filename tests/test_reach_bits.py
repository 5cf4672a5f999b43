"""The cycle filter's reachability search (``relations.reach._reaching``) against a breadth-first search in
Python, on random directed graphs with cycles and self-loops, for both ways of searching and with starts spread
over several bitstrings."""

import duckdb
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


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bits", [3, reach.BITS])
def test_reaching_matches_a_breadth_first_search(seed, bits, monkeypatch):
    monkeypatch.setattr(reach, "BITS", bits)
    rng = np.random.default_rng(seed)
    n = 40
    edges = sorted({(int(p), int(c)) for p, c in rng.integers(0, n, size=(70, 2))})  # cycles and self-loops
    pairs = [(mid, int(a), int(b)) for mid, (a, b) in enumerate(rng.integers(0, n + 5, size=(60, 2))) if a != b]
    con = duckdb.connect()
    con.execute("CREATE TABLE e (parent BIGINT, child BIGINT)")
    con.executemany("INSERT INTO e VALUES (?, ?)", edges)
    con.execute("CREATE TABLE p (mid BIGINT, a BIGINT, b BIGINT)")
    con.executemany("INSERT INTO p VALUES (?, ?, ?)", pairs)
    for x, y in (("a", "b"), ("b", "a")):
        want = {mid for mid, a, b in pairs if reaches(edges, *((a, b) if x == "a" else (b, a)))}
        assert want, "the draw has no reaching pair: nothing is tested"
        for nx, ny in ((1, 2), (2, 1)):  # start from the x side, then from the y side
            got = {m for (m,) in con.execute(reach._reaching(x, y, nx, ny, "p", "e")).fetchall()}
            assert got == want, (x, y, nx, ny)
