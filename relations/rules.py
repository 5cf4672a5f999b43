"""The catalog's SQL rules of one operator evaluated over a source of rows: built here and nowhere else.

``rule_select(op, source, ...)`` is the one SELECT that gives every row of ``source`` its
children's analyses (shape ``s_<c>``, dtype ``d_<c>``, constness ``k_<c>``, tuple shapes and
dtypes ``ts_<c>``/``td_<c>``, joined from ``eclass``, or given by the source), its attributes
(cast, defaults filled in, canonicalised by the catalog's ``canon`` rules) and the node's own
``o_shape``, ``o_dtype``, ``o_const``, ``o_tshapes``, ``o_tdtypes`` from the catalog's rules.
Its users: ``EGraph.insert_from`` and ``check_invariants`` (relations/egraph.py), the bulk
writer's check of imported rows (relations/bulk.py), the analytic cost model (extract/analytic.py,
FLOP rules as extra expressions) and, without an e-graph, ``evaluate``/``shape_rule``: one node's
rules over given shapes and dtypes (``given_source``), for rule verification (programs/verify.py)
and for typing the outputs of other domains' operators at ONNX import (driver/boundary/onnx_import.py).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable, Mapping

import duckdb

from .catalog import REQUIRED, SQL_MACROS, OpDef
from .schema import key_columns, literal, q

OUTPUTS = ("o_shape", "o_dtype", "o_const", "o_tshapes", "o_tdtypes")


def attr_columns(op: OpDef, given: Iterable[str], alias: str = "b") -> list[str]:
    """The attribute columns of ``op``: those in ``given`` cast from the source, the rest their
    defaults (ValueError for an attribute without a default that is not given)."""
    given = set(given)
    cols = []
    for a in op.attrs:
        if a.name in given:
            cols.append(f"{alias}.{q(a.name)}::{a.sql_type} AS {q(a.name)}")
        elif a.default is REQUIRED:
            raise ValueError(f"{op.op_type}: attribute {a.name!r} has no default and was not given")
        else:
            cols.append(f"{literal(a.default)}::{a.sql_type} AS {q(a.name)}")
    return cols


def _is_sourced_leaf(op: OpDef) -> bool:
    return op.leaf and op.op_type != "Constant"  # Input and Weight: shape and dtype come with the row


def rule_select(op: OpDef, source: str, *, given: Iterable[str], carry: Iterable[str] = (),
                exprs: Mapping[str, str] | None = None, analyses: str = "eclass", check_canon: bool = False,
                valid_only: bool = False) -> str:
    if analyses not in ("eclass", "eclass_bound", "bound", "given"):
        raise ValueError(f"analyses={analyses!r}")
    """A SELECT of (rid, the key columns with canonical attributes, o_shape, o_dtype, o_const,
    o_tshapes, o_tdtypes[, canon_ok], the ``carry`` columns[, the ``exprs``]) over ``source``.

    ``source`` is a SELECT or table with ``rid``, the op's child columns, the attribute columns
    named in ``given`` (others take their defaults) and, for Input/Weight leaves, ``shape`` and
    ``dtype``.  ``analyses="eclass"`` joins each child's analyses from ``eclass`` (``"eclass_bound"``:
    with symbols replaced by their costed binding, for costs); ``"given"``
    reads them from the source's ``s_/d_/k_/ts_/td_`` columns (see ``given_source``).
    ``exprs`` maps output names to SQL over the same names as the catalog's rules (plus the
    carried columns); ``check_canon`` adds ``canon_ok``: whether the source's attributes are
    already canonical; ``valid_only`` keeps only the rows whose shape rule accepts them."""
    carry = tuple(carry)
    joins, cols = [], ["b.rid"] + [f"b.{q(x)}" for x in carry]
    for inp in op.inputs:
        c, col = inp.column, q(inp.column)
        cols.append(f"b.{col}")
        if analyses == "given":
            cols += [f"b.s_{c}", f"b.d_{c}", f"b.k_{c}"] + ([] if inp.variadic else [f"b.ts_{c}", f"b.td_{c}"])
        elif inp.variadic:
            joins.append(
                f"JOIN (SELECT u.rid, list(e.shape ORDER BY u.pos) AS s, list(e.dtype ORDER BY u.pos) AS d, "
                f"bool_and(e.is_const) AS k FROM (SELECT rid, unnest({col}) AS cid, generate_subscripts({col}, 1) AS pos "
                f"FROM ({source})) u JOIN {analyses} e ON e.id = u.cid GROUP BY u.rid) v_{c} ON v_{c}.rid = b.rid")
            cols += [f"v_{c}.s AS s_{c}", f"v_{c}.d AS d_{c}", f"v_{c}.k AS k_{c}"]
        else:
            alias = f"e_{c}"
            joins.append(f"{'LEFT JOIN' if inp.optional else 'JOIN'} {analyses} {alias} ON {alias}.id = b.{col}")
            cols += [f"{alias}.shape AS s_{c}", f"{alias}.dtype AS d_{c}",
                     f"coalesce({alias}.is_const, b.{col} = -1) AS k_{c}",
                     f"{alias}.tuple_shapes AS ts_{c}", f"{alias}.tuple_dtypes AS td_{c}"]
    cols += attr_columns(op, given)
    if _is_sourced_leaf(op):
        cols += ["b.shape::BIGINT[] AS s_leaf", "b.dtype::INTEGER AS d_leaf"]
    base = f"SELECT {', '.join(cols)} FROM ({source}) b {' '.join(joins)}"
    if op.canon:
        canon = dict(op.canon)
        sel = [f"{canon[a.name]} AS {q(a.name)}" for a in op.attrs if a.name in canon]
        if check_canon:
            sel.append(" AND ".join(f"(({e}) IS NOT DISTINCT FROM {q(a)})" for a, e in op.canon) + " AS canon_ok")
        level2 = f"SELECT * EXCLUDE ({', '.join(q(a) for a in canon)}), {', '.join(sel)} FROM ({base})"
    else:
        level2 = f"SELECT *{', true AS canon_ok' if check_canon else ''} FROM ({base})"
    if _is_sourced_leaf(op):
        shape, dtype, const = "s_leaf", "d_leaf", ("false" if op.op_type == "Input" else "true")
    else:
        shape, dtype = op.shape, op.dtype or f"d_{op.child_columns[0]}"
        const = " AND ".join(f"k_{c}" for c in op.child_columns) or "true"
    out = [f"({shape})::BIGINT[] AS o_shape", f"({dtype})::INTEGER AS o_dtype", f"({const}) AS o_const",
           f"({op.tuple_shapes or 'NULL'})::BIGINT[][] AS o_tshapes",
           f"({op.tuple_dtypes or 'NULL'})::INTEGER[] AS o_tdtypes"]
    out += ["canon_ok"] if check_canon else []
    out += [q(x) for x in carry] + [f"({e}) AS {q(name)}" for name, e in (exprs or {}).items()]
    sql = f"SELECT rid, {', '.join(q(k) for k in key_columns(op))}, {', '.join(out)} FROM ({level2})"
    if valid_only:
        sql = f"SELECT * FROM ({sql}) WHERE {'o_tshapes' if op.is_tuple else 'o_shape'} IS NOT NULL"
    return sql


def given_source(op: OpDef, *, dtypes: bool = False) -> str:
    """A one-row source of ``?`` parameters for ``rule_select(..., analyses="given")``: per input its
    child id (-1 when absent) and shape, or for a tuple-valued child its tuple shapes (a variadic input:
    its list of shapes), with ``dtypes`` its ONNX dtype (a list for a variadic input) after the shape,
    then the attributes in catalog order.  Without ``dtypes`` they are float; children are not constant."""
    cols = ["0 AS rid"]
    for inp in op.inputs:
        c = inp.column
        if inp.variadic:
            cols += [f"[]::BIGINT[] AS {q(c)}", f"?::BIGINT[][] AS s_{c}",
                     f"{'?' if dtypes else 'NULL'}::INTEGER[] AS d_{c}", f"false AS k_{c}"]
        else:
            cols += [f"?::BIGINT AS {q(c)}", f"?::BIGINT[] AS s_{c}", f"{'?::INTEGER' if dtypes else '1'} AS d_{c}",
                     f"false AS k_{c}", f"?::BIGINT[][] AS ts_{c}", f"NULL::INTEGER[] AS td_{c}"]
    cols += [f"?::{a.sql_type} AS {q(a.name)}" for a in op.attrs]
    return "SELECT " + ", ".join(cols)


_LOCAL = threading.local()  # one DuckDB connection with the catalog's macros per thread


def _con() -> duckdb.DuckDBPyConnection:
    con = getattr(_LOCAL, "con", None)
    if con is None:
        con = _LOCAL.con = duckdb.connect()
        for stmt in SQL_MACROS.split(";\n"):
            if stmt.strip():
                con.execute(stmt)
    return con


@functools.cache
def _given_sql(op: OpDef, dtypes: bool) -> str:
    out = ["o_tshapes", "o_tdtypes"] if op.is_tuple else ["o_shape", "o_dtype"]
    return (f"SELECT {', '.join(out + [q(a.name) for a in op.attrs])} FROM "
            f"({rule_select(op, given_source(op, dtypes=dtypes), given=[a.name for a in op.attrs], analyses='given')})")


def evaluate(op: OpDef, kids: list, attrs: dict, dtypes: list | None = None) -> tuple[object, object, dict]:
    """One node's rules without an e-graph, as ``insert_from`` evaluates them: (its shape, or list of
    shapes for a tuple op, None when the node is invalid; its dtype (a list for a tuple op); the attributes
    as the e-graph stores them, canonicalised).

    ``kids`` has one entry per catalog input: None (absent), a shape (a tuple), or a list of shapes (a
    variadic input, or the tuple-valued child of getitem); ``dtypes`` likewise their ONNX dtypes (None:
    all float)."""
    params = []
    for k, (inp, kid) in enumerate(zip(op.inputs, kids)):
        dtype = [dtypes[k]] if dtypes is not None else []
        if inp.variadic:
            params += [[list(s) for s in kid]] + dtype
        elif isinstance(kid, list):
            params += [0, None] + dtype + [[list(s) for s in kid]]
        else:
            params += [-1 if kid is None else 0, None if kid is None else list(kid)] + dtype + [None]
    params += [attrs[a.name] for a in op.attrs]
    row = _con().execute(_given_sql(op, dtypes is not None), params).fetchall()[0]
    shape = row[0]
    if shape is not None:
        shape = [tuple(s) for s in shape] if op.is_tuple else tuple(shape)
    return shape, row[1], {a.name: v for a, v in zip(op.attrs, row[2:])}


def shape_rule(op: OpDef, kids: list, attrs: dict) -> tuple[object, dict]:
    """``evaluate`` over float inputs: (shape, or list of shapes for a tuple op, None when invalid; the
    attributes as the e-graph stores them)."""
    shape, _, stored = evaluate(op, kids, attrs)
    return shape, stored
