"""Compile core rules (programs.ir) to SQL over the e-graph tables.

A rule's left side becomes one SELECT that joins the op tables of its pattern
terms (plus the ``eclass`` analysis table for shape/const conditions) and
materialises every match as a row of a temp table ``_m``: the variables it
binds, the ``let`` values, and the root e-class of each pattern.  The right
side is a list of ``Build`` steps, one per distinct right-side term in
post-order; each step is a SELECT over ``_m`` (joined with the results of the
steps it depends on) that ``EGraph.insert_from`` hash-conses.  Unions pair each
pattern root with its right-side result.  The statements per rule are fixed by
the rule's text, never by the number of matches.
"""

from __future__ import annotations

from dataclasses import dataclass

from relsat.relations.catalog import BY_TYPE
from relsat.relations.schema import q

from .ir import (Absent, BinOp, Cmp, Dim, Len, ListExpr, ListOf, Lit, Numel, Pred, Rank, Rule, ShapeOf,
                 Term, Var)


@dataclass(frozen=True)
class Build:
    """Insert one right-side term for every match: ``op`` rows from ``source`` into result ``name``."""

    name: str
    op: str
    source: str


@dataclass(frozen=True)
class Compiled:
    rule: str
    match_sql: str  # SELECT ... with a {since} placeholder for semi-naive evaluation
    builds: tuple[Build, ...]
    unions: tuple[str, ...]  # SELECT (a, b) pairs
    multi: bool


def _lit(v) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, float):
        if v in (float("inf"), float("-inf")):
            return f"'{v}'::DOUBLE"
        return f"{v!r}::DOUBLE"
    return str(int(v))


class _Lhs:
    """Walks the patterns, allocating table aliases and collecting join conditions."""

    def __init__(self) -> None:
        self.froms: list[str] = []
        self.where: list[str] = []
        self.binds: dict[str, str] = {}  # variable -> SQL expression
        self.eclass_vars: set[str] = set()
        self.aliases: list[str] = []
        self.analysis: dict[str, str] = {}  # e-class variable -> eclass alias

    def bind(self, var: str, expr: str) -> None:
        if var in self.binds:
            self.where.append(f"{self.binds[var]} = {expr}")
        else:
            self.binds[var] = expr

    def term(self, t: Term) -> str:
        """Add ``t`` to the join; return the SQL expression of its e-class."""
        op = BY_TYPE[t.op]
        alias = f"t{len(self.aliases)}"
        self.aliases.append(alias)
        self.froms.append(f"{op.table} {alias}")
        if t.op == "getitem":
            self.where.append(f"{alias}.{q('index')} = {t.index}")
        for name, val in t.attrs:
            col = f"{alias}.{q(name)}"
            if isinstance(val, Lit):
                self.where.append(f"{col} = {_lit(val.value)}")
            elif isinstance(val, Var):
                self.bind(val.name, col)
            else:  # ListOf
                self.where.append(f"len({col}) = {len(val.items)}")
                for i, item in enumerate(val.items):
                    if isinstance(item, Lit):
                        self.where.append(f"{col}[{i + 1}] = {_lit(item.value)}")
                    else:
                        self.bind(item.name, f"{col}[{i + 1}]")
        if op.variadic:
            col = f"{alias}.{q(op.inputs[0].column)}"
            self.where.append(f"len({col}) = {len(t.children)}")
            slots = [f"{col}[{i + 1}]" for i in range(len(t.children))]
        else:
            slots = [f"{alias}.{q(c)}" for c in op.child_columns]
        for slot, child in zip(slots, t.children):
            self.child(slot, child)
        return f"{alias}.out"

    def child(self, slot: str, child) -> None:
        if isinstance(child, Absent):
            self.where.append(f"{slot} = -1")
        elif isinstance(child, Var):
            self.eclass_vars.add(child.name)
            self.bind(child.name, slot)
        else:
            self.where.append(f"{slot} = {self.term(child)}")

    def eclass(self, var: str) -> str:
        if var not in self.analysis:
            alias = f"e{len(self.analysis)}"
            self.analysis[var] = alias
            self.froms.append(f"eclass {alias}")
            self.where.append(f"{alias}.id = {self.binds[var]}")
        return self.analysis[var]


def _expr(e, lhs: _Lhs, lets: dict[str, str]) -> str:
    if isinstance(e, Lit):
        return _lit(e.value)
    if isinstance(e, Var):
        return lets.get(e.name) or lhs.binds[e.name]
    if isinstance(e, Dim):
        idx = e.index + 1 if e.index >= 0 else e.index
        return f"{lhs.eclass(e.var.name)}.shape[{idx}]"
    if isinstance(e, Rank):
        return f"len({lhs.eclass(e.var.name)}.shape)"
    if isinstance(e, Numel):
        return f"prod({lhs.eclass(e.var.name)}.shape)"
    if isinstance(e, ShapeOf):
        return f"{lhs.eclass(e.var.name)}.shape"
    if isinstance(e, BinOp):
        a, b = _expr(e.left, lhs, lets), _expr(e.right, lhs, lets)
        if e.op == "/":
            return f"floor(({a}) / ({b}))::BIGINT"
        if e.op == "%":
            return f"((({a}) % ({b})) + ({b})) % ({b})"
        return f"({a} {e.op} {b})"
    if isinstance(e, ListExpr):
        return "[" + ", ".join(_expr(i, lhs, lets) for i in e.items) + "]"
    if isinstance(e, Len):
        return f"len({_expr(e.expr, lhs, lets)})"
    raise TypeError(f"unknown expression {e!r}")


def _condition(c, lhs: _Lhs, lets: dict[str, str]) -> str:
    if isinstance(c, Pred):
        alias = lhs.eclass(c.var.name)
        return {"const": f"{alias}.is_const", "not-const": f"NOT {alias}.is_const",
                "dtype": f"{alias}.dtype = {c.dtype}"}[c.kind]
    op = "<>" if c.op == "!=" else c.op
    return f"({_expr(c.left, lhs, lets)}) {op} ({_expr(c.right, lhs, lets)})"


def compile_rule(rule: Rule) -> Compiled:
    lhs = _Lhs()
    roots = [lhs.term(p) for p in rule.patterns]
    if len(rule.patterns) > 1:  # two patterns never match the same node
        for i in range(len(roots)):
            for j in range(i + 1, len(roots)):
                if rule.patterns[i].op == rule.patterns[j].op:
                    lhs.where.append(f"{roots[i]} <> {roots[j]}")
    lets: dict[str, str] = {}
    for let in rule.lets:
        lets[let.var.name] = f"({_expr(let.expr, lhs, lets)})"
    conds = [_condition(c, lhs, lets) for c in rule.conditions]
    fresh = " OR ".join(f"{a}.ts >= {{since}}" for a in lhs.aliases)
    cols = [f"{e} AS {q('v_' + v)}" for v, e in lhs.binds.items()]
    cols += [f"{e} AS {q('v_' + v)}" for v, e in lets.items()]
    cols += [f"{r} AS root{i}" for i, r in enumerate(roots)]
    where = lhs.where + conds + [f"({fresh})"]
    match_sql = (f"SELECT DISTINCT {', '.join(cols)} FROM {', '.join(lhs.froms)} "
                 f"WHERE {' AND '.join(where)}")
    builds: list[Build] = []
    memo: dict[Term, str] = {}
    unions = []
    for i, r in enumerate(rule.rhs):
        if isinstance(r, Var):
            unions.append(f"SELECT m.root{i}, m.{q('v_' + r.name)} FROM _m m")
        else:
            res = _build(r, builds, memo, rule.name)
            unions.append(f"SELECT m.root{i}, r.out FROM _m m JOIN {res} r ON r.rid = m.mid")
    return Compiled(rule.name, match_sql, tuple(builds), tuple(unions), len(rule.patterns) > 1)


def _attr_sql(v) -> str:
    if isinstance(v, Lit):
        return _lit(v.value)
    if isinstance(v, Var):
        return f"m.{q('v_' + v.name)}"
    return "[" + ", ".join(_attr_sql(i) for i in v.items) + "]"


def _build(t: Term, builds: list[Build], memo: dict, rule: str) -> str:
    if t in memo:
        return memo[t]
    op = BY_TYPE[t.op]
    joins, children = [], []
    for child in t.children:
        if isinstance(child, Absent):
            children.append("-1")
        elif isinstance(child, Var):
            children.append(f"m.{q('v_' + child.name)}")
        else:
            res = _build(child, builds, memo, rule)
            alias = f"j{len(joins)}"
            joins.append(f"JOIN {res} {alias} ON {alias}.rid = m.mid")
            children.append(f"{alias}.out")
    cols = ["m.mid AS rid"]
    if op.variadic:
        cols.append(f"[{', '.join(children)}] AS {q(op.inputs[0].column)}")
    else:
        cols += [f"{c} AS {q(col)}" for c, col in zip(children, op.child_columns)]
    if t.op == "getitem":
        cols.append(f"{t.index} AS {q('index')}")
    cols += [f"{_attr_sql(v)} AS {q(name)}" for name, v in t.attrs]
    name = f"_r{len(builds)}"
    builds.append(Build(name, t.op, f"SELECT {', '.join(cols)} FROM _m m {' '.join(joins)}"))
    memo[t] = name
    return name
