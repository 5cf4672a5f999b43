"""Tensor expressions kept as DuckDB tables beside the e-graph: one program per e-node that lowers.

``lower_egraph(con)`` lowers every e-node of the operators tensor_lower knows whose shapes are static
(its inputs named by e-class: ``c<id>``) and writes the programs into the tables below, replacing
what they held; ``load(con, enode_op, enode_id)`` reads one back as a ``Program`` (equal to the one
written). The tables, queryable with ``relsat query`` on a saved e-graph:

* ``texpr_program(op, enode, eclass, steps)``: the e-node (op table, id) and its e-class;
* ``texpr_input(op, enode, pos, tensor, shape)``: the program's inputs in order;
* ``texpr_step(op, enode, step, name, combine, body)``: each expression, its body as text
  (``Mul(#0, #1)``: ``#k`` is the step's k-th access);
* ``texpr_iter(op, enode, step, role, pos, name, extent)``: scope (``role = 'scope'``, one per output
  axis in order) and summation iterators;
* ``texpr_access(op, enode, step, access, tensor, pad)``, ``texpr_index(op, enode, step, access, axis,
  const, div, exact, modulus)`` and ``texpr_term(op, enode, step, access, axis, pos, iter, coeff,
  floor_div)``: every access, the index of each of its axes, and the index's terms
  (``coeff * floor(iter / floor_div)``; ``floor_div`` NULL for the iterator itself).
"""

from __future__ import annotations

import json
import re

import numpy as np

from .catalog import BY_TYPE
from .tensor_expr import Access, Call, Const, Expr, Index, Iter, Program, Term
from .tensor_lower import LOWERINGS, NotLowerable, lower

DDL = """
CREATE OR REPLACE TABLE texpr_program (op VARCHAR, enode BIGINT, eclass BIGINT, steps INTEGER);
CREATE OR REPLACE TABLE texpr_input (op VARCHAR, enode BIGINT, pos INTEGER, tensor VARCHAR, shape BIGINT[]);
CREATE OR REPLACE TABLE texpr_step (op VARCHAR, enode BIGINT, step INTEGER, name VARCHAR, combine VARCHAR,
    body VARCHAR);
CREATE OR REPLACE TABLE texpr_iter (op VARCHAR, enode BIGINT, step INTEGER, role VARCHAR, pos INTEGER,
    name VARCHAR, extent BIGINT);
CREATE OR REPLACE TABLE texpr_access (op VARCHAR, enode BIGINT, step INTEGER, access INTEGER, tensor VARCHAR,
    pad DOUBLE);
CREATE OR REPLACE TABLE texpr_index (op VARCHAR, enode BIGINT, step INTEGER, access INTEGER, axis INTEGER,
    "const" BIGINT, div BIGINT, exact BOOLEAN, modulus BIGINT);
CREATE OR REPLACE TABLE texpr_term (op VARCHAR, enode BIGINT, step INTEGER, access INTEGER, axis INTEGER,
    pos INTEGER, iter VARCHAR, coeff BIGINT, floor_div BIGINT);
"""
TABLES = ("texpr_program", "texpr_input", "texpr_step", "texpr_iter", "texpr_access", "texpr_index", "texpr_term")


# -- programs as rows -------------------------------------------------------------------------------------


def _body_text(t: Term, accs: list[Access]) -> str:
    if isinstance(t, Access):
        accs.append(t)
        return f"#{len(accs) - 1}"
    if isinstance(t, Const):
        return repr(float(t.value))
    return f"{t.op}({', '.join(_body_text(a, accs) for a in t.args)})"


def rows_of(op: str, enode: int, eclass: int, p: Program) -> dict[str, list[tuple]]:
    rows: dict[str, list[tuple]] = {t: [] for t in TABLES}
    rows["texpr_program"].append((op, enode, eclass, len(p.steps)))
    rows["texpr_input"] += [(op, enode, k, n, list(s)) for k, (n, s) in enumerate(p.inputs)]
    for k, (name, e) in enumerate(p.steps):
        accs: list[Access] = []
        rows["texpr_step"].append((op, enode, k, name, e.combine, _body_text(e.body, accs)))
        rows["texpr_iter"] += [(op, enode, k, role, j, i.name, i.extent)
                               for role, its in (("scope", e.scope), ("sum", e.sums)) for j, i in enumerate(its)]
        for a_id, a in enumerate(accs):
            rows["texpr_access"].append((op, enode, k, a_id, a.tensor, a.pad))
            for axis, ix in enumerate(a.index):
                rows["texpr_index"].append((op, enode, k, a_id, axis, ix.const, ix.div, ix.exact, ix.mod))
                rows["texpr_term"] += [(op, enode, k, a_id, axis, j, t[0], t[1], t[2] if len(t) == 3 else None)
                                       for j, t in enumerate(ix.terms)]
    return rows


def write(con, rows: dict[str, list[tuple]], replace: bool = True) -> None:
    """Write ``rows`` (table -> tuples) in one INSERT per table (``replace``: the tables made anew first)."""
    if replace:
        con.execute(DDL)
    for table, data in rows.items():
        if not data:
            continue
        types = con.execute(f"DESCRIBE {table}").fetchall()
        frame, select = {}, []
        for k, (col, sql_type, *_) in enumerate(types):
            values = [r[k] for r in data]
            if sql_type.endswith("[]"):
                frame[col] = np.array([json.dumps(v) for v in values], dtype=object)
                select.append(f'"{col}"::VARCHAR::{sql_type}')
            else:
                frame[col] = np.array(values, dtype=object)
                select.append(f'"{col}"::{sql_type}')
        con.register("texpr_rows", frame)
        try:
            con.execute(f"INSERT INTO {table} SELECT {', '.join(select)} FROM texpr_rows")
        finally:
            con.unregister("texpr_rows")


_TOKEN = re.compile(r"\s*(#\d+|[A-Za-z_]\w*|-?\d+(?:\.\d*)?(?:e-?\d+)?|[(),])")


def _parse_body(text: str, accs: list[Access]) -> Term:
    tokens = _TOKEN.findall(text)
    pos = 0

    def term():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok.startswith("#"):
            return accs[int(tok[1:])]
        if tokens[pos:pos + 1] == ["("]:
            pos += 1
            args = []
            while tokens[pos] != ")":
                args.append(term())
                if tokens[pos] == ",":
                    pos += 1
            pos += 1
            return Call(tok, tuple(args))
        return Const(float(tok))

    return term()


def load(con, op: str, enode: int) -> Program:
    """The program stored for e-node ``(op, enode)``."""
    key = [op, enode]
    inputs = tuple((n, tuple(s)) for n, s in con.execute(
        "SELECT tensor, shape FROM texpr_input WHERE op = ? AND enode = ? ORDER BY pos", key).fetchall())
    steps = []
    for k, name, combine, body in con.execute(
            "SELECT step, name, combine, body FROM texpr_step WHERE op = ? AND enode = ? ORDER BY step", key).fetchall():
        its = con.execute("SELECT role, name, extent FROM texpr_iter WHERE op = ? AND enode = ? AND step = ? "
                          "ORDER BY role DESC, pos", [*key, k]).fetchall()  # 'scope' before 'sum'
        accs = []
        for a_id, tensor, pad in con.execute("SELECT access, tensor, pad FROM texpr_access WHERE op = ? AND enode = ? "
                                             "AND step = ? ORDER BY access", [*key, k]).fetchall():
            index = []
            for axis, c, d, ex, m in con.execute(
                    'SELECT axis, "const", div, exact, modulus FROM texpr_index WHERE op = ? AND enode = ? '
                    "AND step = ? AND access = ? ORDER BY axis", [*key, k, a_id]).fetchall():
                terms = con.execute("SELECT iter, coeff, floor_div FROM texpr_term WHERE op = ? AND enode = ? AND step = ? "
                                    "AND access = ? AND axis = ? ORDER BY pos", [*key, k, a_id, axis]).fetchall()
                index.append(Index(tuple((n, c_) if fd is None else (n, c_, fd) for n, c_, fd in terms), c, d, ex, m))
            index = tuple(index)
            accs.append(Access(tensor, index, pad))
        scope = tuple(Iter(n, x) for r, n, x in its if r == "scope")
        sums = tuple(Iter(n, x) for r, n, x in its if r == "sum")
        steps.append((name, Expr(scope, sums, _parse_body(body, accs), combine)))
    return Program(inputs, tuple(steps))


# -- the e-graph's e-nodes ----------------------------------------------------------------------------------


def lower_egraph(con) -> dict[str, int]:
    """Lower every e-node that has a tensor expression (static shapes) into the ``texpr_*`` tables (made
    anew); returns the count per op type. Inputs are named by e-class (``c<id>``)."""
    rows: dict[str, list[tuple]] = {t: [] for t in TABLES}
    counts: dict[str, int] = {}
    shapes = dict(con.execute("SELECT id, shape FROM eclass").fetchall())
    for op_type in LOWERINGS:
        op = BY_TYPE.get(op_type)
        if op is None:
            continue
        children = [i.column for i in op.inputs]
        cols = ", ".join(f'"{c}"' for c in children + [a.name for a in op.attrs])
        for row in con.execute(f"SELECT id, out, {cols} FROM {op.table}").fetchall():
            enode, out, vals = row[0], row[1], row[2:]
            kids, attrs = vals[:len(children)], dict(zip([a.name for a in op.attrs], vals[len(children):]))
            inputs = [(f"c{k}", shapes.get(k)) for k in kids if k is not None and k != -1]
            consts = {}
            if op_type == "Reshape":  # the catalog lifts Reshape's shape into an attribute
                target = attrs.pop("shape")
                inputs.append(("shape", (len(target),)))
                consts["shape"] = target
            if any(s is None for _, s in inputs):
                continue
            try:
                p = lower(op_type, {k: v for k, v in attrs.items() if v is not None}, inputs, consts)
            except NotLowerable:
                continue
            for t, r in rows_of(op.table, enode, out, p).items():
                rows[t] += r
            counts[op_type] = counts.get(op_type, 0) + 1
    write(con, rows)
    return counts
