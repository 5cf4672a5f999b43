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

    Only e-classes that reach some queried e-class can lie on such a path, so the search from
    every queried e-class runs over the edges among those ancestors.  Returns the matches found."""
    c = g.con
    c.execute(f"CREATE OR REPLACE TEMP TABLE _cpairs AS SELECT DISTINCT mid, a, b FROM ({pairs}) p(mid, a, b) "
              f"WHERE a <> b")
    c.execute(f"CREATE OR REPLACE TEMP TABLE _cedges AS {class_edges_sql(g)}")
    c.execute(
        "CREATE OR REPLACE TEMP TABLE _creach AS WITH RECURSIVE "
        "anc(c) AS (SELECT a FROM _cpairs UNION SELECT b FROM _cpairs "
        "           UNION SELECT e.parent FROM anc JOIN _cedges e ON e.child = anc.c), "
        "sub AS MATERIALIZED (SELECT e.parent, e.child FROM _cedges e WHERE e.parent IN (SELECT c FROM anc) "
        "                     AND e.child IN (SELECT c FROM anc)), "
        "r(s, c) AS (SELECT a, a FROM _cpairs UNION SELECT b, b FROM _cpairs "
        "            UNION SELECT r.s, e.child FROM r JOIN sub e ON e.parent = r.c) "
        "SELECT s, c FROM r WHERE s <> c")
    c.execute(
        f"CREATE OR REPLACE TEMP TABLE {result} AS SELECT DISTINCT mid FROM ("
        f"SELECT p.mid FROM _cpairs p JOIN _creach r ON r.s = p.a AND r.c = p.b UNION ALL "
        f"SELECT p.mid FROM _cpairs p JOIN _creach r ON r.s = p.b AND r.c = p.a)")
    return c.execute(f"SELECT count(*) FROM {result}").fetchall()[0][0]


def cyclic_classes(g) -> list[int]:
    """The e-classes that lie on a cycle of the e-class graph (an e-class that reaches itself)."""
    rows = g.con.execute(
        f"WITH RECURSIVE e AS MATERIALIZED ({class_edges_sql(g, with_pending=False)}), "
        "r(s, c) AS (SELECT parent, child FROM e UNION SELECT r.s, e.child FROM r JOIN e ON e.parent = r.c) "
        "SELECT DISTINCT s FROM r WHERE s = c ORDER BY s").fetchall()
    return [x for (x,) in rows]
