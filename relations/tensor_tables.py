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
* ``texpr_access(op, enode, step, access, tensor, pad, path)``, ``texpr_index(op, enode, step, access, axis,
  const, div, exact, modulus)`` and ``texpr_term(op, enode, step, access, axis, pos, iter, coeff,
  floor_div)``: every access, the index of each of its axes, and the index's terms
  (``coeff * floor(iter / floor_div)``; ``floor_div`` NULL for the iterator itself); an access's ``path``
  names the calls from the body's root down to it (``'Mul/Add'``; ``''`` for the body itself), so a rule
  written in SQL sees whether an access is a factor of a product (relations/tensor_rounds.py).

Derived programs (relations/tensor_rounds.py) live in the same tables under ``op = 'derived'``.
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
    pad DOUBLE, path VARCHAR);
CREATE OR REPLACE TABLE texpr_index (op VARCHAR, enode BIGINT, step INTEGER, access INTEGER, axis INTEGER,
    "const" BIGINT, div BIGINT, exact BOOLEAN, modulus BIGINT);
CREATE OR REPLACE TABLE texpr_term (op VARCHAR, enode BIGINT, step INTEGER, access INTEGER, axis INTEGER,
    pos INTEGER, iter VARCHAR, coeff BIGINT, floor_div BIGINT);
"""
TABLES = ("texpr_program", "texpr_input", "texpr_step", "texpr_iter", "texpr_access", "texpr_index", "texpr_term")


# -- programs as rows -------------------------------------------------------------------------------------


def _body_text(t: Term, accs: list[tuple[Access, str]], path: str = "") -> str:
    if isinstance(t, Access):
        accs.append((t, path))
        return f"#{len(accs) - 1}"
    if isinstance(t, Const):
        return repr(float(t.value))
    inner = f"{path}/{t.op}" if path else t.op
    return f"{t.op}({', '.join(_body_text(a, accs, inner) for a in t.args)})"


def rows_of(op: str, enode: int, eclass: int, p: Program) -> dict[str, list[tuple]]:
    rows: dict[str, list[tuple]] = {t: [] for t in TABLES}
    rows["texpr_program"].append((op, enode, eclass, len(p.steps)))
    rows["texpr_input"] += [(op, enode, k, n, list(s)) for k, (n, s) in enumerate(p.inputs)]
    for k, (name, e) in enumerate(p.steps):
        accs: list[tuple[Access, str]] = []
        rows["texpr_step"].append((op, enode, k, name, e.combine, _body_text(e.body, accs)))
        rows["texpr_iter"] += [(op, enode, k, role, j, i.name, i.extent)
                               for role, its in (("scope", e.scope), ("sum", e.sums)) for j, i in enumerate(its)]
        for a_id, (a, path) in enumerate(accs):
            rows["texpr_access"].append((op, enode, k, a_id, a.tensor, a.pad, path))
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
    return load_many(con, [(op, enode)])[(op, enode)]


def load_many(con, keys) -> dict[tuple[str, int], Program]:
    """The programs stored for ``keys`` ((op, enode) pairs), read in one query per table."""
    keys = list(dict.fromkeys((str(o), int(e)) for o, e in keys))
    if not keys:
        return {}
    con = con.cursor()  # its own result set: a caller's unfinished one is left alone
    con.register("texpr_keys", {"op": np.array([k[0] for k in keys], dtype=object),
                                "enode": np.array([k[1] for k in keys], dtype=np.int64)})
    try:
        def rows(sql):
            return con.execute(sql.replace(" t ", " JOIN texpr_keys USING (op, enode) ", 1)).fetchall()

        inputs = rows("SELECT op, enode, tensor, shape FROM texpr_input t ORDER BY op, enode, pos")
        steps = rows("SELECT op, enode, step, name, combine, body FROM texpr_step t ORDER BY op, enode, step")
        iters = rows("SELECT op, enode, step, role, name, extent FROM texpr_iter t ORDER BY op, enode, step, "
                     "role DESC, pos")  # 'scope' before 'sum'
        accs = rows("SELECT op, enode, step, access, tensor, pad FROM texpr_access t ORDER BY ALL")
        index = rows('SELECT op, enode, step, access, axis, "const", div, exact, modulus FROM texpr_index t '
                     "ORDER BY op, enode, step, access, axis")
        terms = rows("SELECT op, enode, step, access, axis, iter, coeff, floor_div FROM texpr_term t "
                     "ORDER BY op, enode, step, access, axis, pos")
    finally:
        con.unregister("texpr_keys")
    term_of: dict = {}
    for o, e, k, a, ax, n, c, fd in terms:
        term_of.setdefault((o, e, k, a, ax), []).append((n, c) if fd is None else (n, c, fd))
    index_of: dict = {}
    for o, e, k, a, ax, c, d, ex, m in index:
        index_of.setdefault((o, e, k, a), []).append(Index(tuple(term_of.get((o, e, k, a, ax), ())), c, d, ex, m))
    acc_of: dict = {}
    for o, e, k, a, tensor, pad in accs:
        acc_of.setdefault((o, e, k), []).append(Access(tensor, tuple(index_of.get((o, e, k, a), ())), pad))
    iter_of: dict = {}
    for o, e, k, role, n, x in iters:
        iter_of.setdefault((o, e, k, role), []).append(Iter(n, x))
    input_of: dict = {}
    for o, e, n, shape in inputs:
        input_of.setdefault((o, e), []).append((n, tuple(shape)))
    step_of: dict = {}
    for o, e, k, name, combine, body in steps:
        expr = Expr(tuple(iter_of.get((o, e, k, "scope"), ())), tuple(iter_of.get((o, e, k, "sum"), ())),
                    _parse_body(body, acc_of.get((o, e, k), [])), combine)
        step_of.setdefault((o, e), []).append((name, expr))
    return {k: Program(tuple(input_of.get(k, ())), tuple(step_of.get(k, ()))) for k in keys if k in step_of}


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
