"""Reachability over the e-class graph, in SQL: cycle filtering and cycle detection.

The e-class graph has an edge from an e-class to each child e-class of each of its
e-nodes.  A union of two e-classes a and b closes a cycle exactly when one reaches
the other; multi-pattern rules can do that (TENSAT's cycle problem), and
``cyclic_matches`` finds the matches whose unions would, so the runner can drop them
before they are applied.  Everything is set-oriented: recursive CTEs (``UNION``, so
existing cycles terminate) over all queried e-classes at once, never a loop per match.
"""

from __future__ import annotations

from .catalog import OPS
from .schema import q


def class_edges_sql(g, with_pending: bool = True) -> str:
    """A SELECT of (parent, child) e-class edges over the live op tables; pending unions (queued in
    this round, not yet rebuilt) count as edges both ways, as their e-classes are already one."""
    parts = []
    for op in OPS:
        if op.table not in g.live:
            continue
        for inp in op.inputs:
            col = q(inp.column)
            if inp.variadic:
                parts.append(f"SELECT out AS parent, unnest({col}) AS child FROM {op.table}")
            else:
                parts.append(f"SELECT out AS parent, {col} AS child FROM {op.table} WHERE {col} <> -1")
    if "op_opaque" in g.live:
        parts.append("SELECT out, unnest(inputs) FROM op_opaque")
    if with_pending:
        parts.append("SELECT a, b FROM pending UNION ALL SELECT b, a FROM pending")
    return " UNION ALL ".join(parts) or "SELECT NULL::BIGINT AS parent, NULL::BIGINT AS child WHERE false"


def cyclic_matches(g, pairs: str, result: str = "_cyc") -> int:
    """Create temp table ``result(mid)``: the matches of ``pairs`` (a SELECT of (mid, a, b) union
    pairs) with a pair whose union would close a cycle (a reaches b or b reaches a, a <> b).

    Each direction is one search, started from whichever side has fewer distinct e-classes
    (typically the few matched roots, not the many new right sides) and confined to the classes
    the other side can reach (or be reached from), so it stays near the matches.  Returns the
    matches found."""
    c = g.con
    c.execute(f"CREATE OR REPLACE TEMP TABLE _cpairs AS SELECT DISTINCT mid, a, b FROM ({pairs}) p(mid, a, b) "
              f"WHERE a <> b")
    c.execute(f"CREATE OR REPLACE TEMP TABLE _cedges AS {class_edges_sql(g)}")
    na, nb = c.execute("SELECT count(DISTINCT a), count(DISTINCT b) FROM _cpairs").fetchall()[0]
    c.execute(f"CREATE OR REPLACE TEMP TABLE {result} AS SELECT DISTINCT mid FROM ("
              f"{_reaching('b', 'a', nb, na)} UNION ALL {_reaching('a', 'b', na, nb)})")
    return c.execute(f"SELECT count(*) FROM {result}").fetchall()[0][0]


def _reaching(x: str, y: str, nx: int, ny: int) -> str:
    """A SELECT of the ``mid`` of ``_cpairs`` rows whose class ``x`` reaches their class ``y``.

    Searched down from the x side within the ancestors of the y side, or, when the y side has
    fewer classes, up from the y side within the descendants of the x side."""
    if ny <= nx:
        start, other, fwd, back, hit = y, x, "parent", "child", f"r.s = p.{y} AND r.c = p.{x}"
    else:
        start, other, fwd, back, hit = x, y, "child", "parent", f"r.s = p.{x} AND r.c = p.{y}"
    # `near`: the classes the other side reaches going the opposite way; the search stays inside
    return (
        f"SELECT p.mid FROM _cpairs p JOIN (WITH RECURSIVE "
        f"near(c) AS (SELECT {other} FROM _cpairs UNION SELECT e.{back} FROM near JOIN _cedges e ON e.{fwd} = near.c), "
        f"r(s, c) AS (SELECT DISTINCT {start}, {start} FROM _cpairs UNION SELECT r.s, e.{fwd} FROM r "
        f"JOIN _cedges e ON e.{back} = r.c WHERE e.{fwd} IN (SELECT c FROM near)) "
        f"SELECT s, c FROM r WHERE s <> c) r ON {hit}"
    )


def cyclic_classes(g) -> list[int]:
    """The e-classes that lie on a cycle of the e-class graph (an e-class that reaches itself)."""
    rows = g.con.execute(
        f"WITH RECURSIVE e AS MATERIALIZED ({class_edges_sql(g, with_pending=False)}), "
        "r(s, c) AS (SELECT parent, child FROM e UNION SELECT r.s, e.child FROM r JOIN e ON e.parent = r.c) "
        "SELECT DISTINCT s FROM r WHERE s = c ORDER BY s").fetchall()
    return [x for (x,) in rows]
