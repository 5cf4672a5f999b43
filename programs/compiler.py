"""Compile core rules (programs.ir) to SQL over the e-graph tables.

A rule's left side becomes one SELECT that joins the op tables of its pattern
terms (plus the ``eclass`` analysis table for shape/const conditions) and
materialises every match as a row of a temp table (``Compiled.matches``, ``_m``):
the variables it binds, the ``let`` values, and the root e-class of each
pattern.  The right side is a list of ``Build`` steps, one per distinct
right-side term in post-order; each step is a SELECT over the matches (joined
with the results of the steps it depends on) that ``EGraph.insert_from``
hash-conses into the step's result table (``Build.name``).  Unions pair each
pattern root with its right-side result.  The statements per rule are fixed by
the rule's text, never by the number of matches.

Every table name is a field: ``Compiled.tables`` (the op tables the left side
joins), ``Compiled.matches``, ``Build.name`` and ``Build.reads`` (the tables a
step's SELECT reads), ``Compiled.results``; the planner keeps its steps as
``_Step`` records and the left side's FROM items as ``_From`` records, so no
table name is ever recovered from SQL text.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from relsat.relations.catalog import BY_TABLE, BY_TYPE
from relsat.relations.schema import literal, q

from .ir import (FILLS, Absent, BinOp, Cmp, Dim, Len, ListExpr, ListOf, Lit, Numel, Pred, Rank, Rule, ShapeOf, Size,
                 Term, Var)


SNAPSHOT_ALL = 1 << 62  # ``until`` that lets a match see every row
MATCHES = "_m"  # a rule's matches, one row per match, ``mid`` its id: a view that numbers the rows of MATCH_ROWS
MATCH_ROWS = "_m_rows"  # the temp table the matches are materialised in (``driver.search.runner.fill_matches``)


# every weight and constant whose elements all have one value ``v`` (``weights.fill``, a Constant's value), with its
# e-class and round: what a value predicate reads (``_condition``) and the prefilter surveys (``driver.search.prefilter``)
FILLED = ("SELECT w.out, w.ts, x.fill AS v FROM op_weight w JOIN weights x ON x.ref = w.ref "
          "UNION ALL SELECT k.out, k.ts, k.value_float FROM op_constant k")


BUILD_ROW_ID = "mid"  # a build's source rows are named by their match: ``insert_from(..., rid=BUILD_ROW_ID)``


@dataclass(frozen=True)
class Build:
    """Insert one right-side term for every match: ``op`` rows from ``source`` into result ``name``."""

    name: str
    op: str
    source: str
    target: str | None = None  # source column with the pattern root a new top node goes into
    changed_only: bool = False  # only the unions read the result: it keeps the rows whose node is not in
    # their target e-class already (the others would queue no union)
    reads: tuple[str, ...] = ()  # the tables ``source`` reads: the matches or an earlier step's result,
    # then the results it joins by ``mid``


@dataclass(frozen=True)
class Compiled:
    rule: str
    match_sql: str  # SELECT ... with {since} and {until} placeholders: see ``match``
    builds: tuple[Build, ...]
    unions: tuple[str, ...]  # SELECT (a, b) pairs
    multi: bool
    pairs: str = ""  # SELECT (mid, a, b): every union pair with its match, for cycle filtering
    results: tuple[str, ...] = ()  # the build results the unions read (rows carry the match's mid)
    tables: tuple[str, ...] = ()  # the op tables the left side joins: no match while one is empty, and no
    # new match (semi-naive) while none has a row newer than the rule's last run
    matches: str = MATCHES  # the view of the rows ``match()`` gives (with a ``mid`` column): what the builds,
    # unions and pairs read
    parts: tuple[tuple[str, str], ...] = ()  # the semi-naive parts of ``match_sql``: (the op table whose rows
    # are new in it, its SELECT); part k reads new rows of its alias k, old rows of aliases before k
    joiner: str = " UNION ALL "  # how the parts are joined (" UNION " where two pattern rows can give one match row)
    edges: frozenset[tuple[str, str, int, str]] = frozenset()  # what the left side's joins need: (op table, child
    # column, list position (0: a plain column), op table of the child's e-node); no match while the e-graph has no
    # node of that table whose child holds a node of the other (``driver.search.prefilter``)
    kinds: frozenset[tuple[str, str]] = frozenset()  # the left side's terms with literal attributes: (op table,
    # the conditions on its columns alone); no match while no row of the table meets them
    witness_sql: str = ""  # SELECT (mid, nodes, ops, roots, classes, bindings, terms, class_ids) for the matches
    # whose mid is in {mids}: the e-nodes (least ids) the left side's terms matched, in term order, from rows of
    # rounds before {until}; the provenance of ``relsat explain`` (see ``witness``)
    carry: str = ""  # SELECT items a match row can carry so that its explanation needs no second join: each
    # term's e-node and e-class (``_n<k>``, ``_c<k>``); empty where one match row stands for several e-nodes
    # (an attribute left free: ``joiner`` is " UNION ")
    carried_sql: str = ""  # ``witness_sql`` over matches that carry them: a projection of the matches
    explain_ops: tuple[str, ...] = ()  # the left side's terms' op types (the witness's ``ops``)
    explain_vars: tuple[str, ...] = ()  # its e-class variables (``?var``), in the order of the witness's
    # ``class_ids`` (their e-classes as a list: ``classes`` as JSON)
    explain_values: bool = False  # whether the witness's ``bindings`` names anything (else it is ``{}``)
    values: frozenset[float] = frozenset()  # the fills its value predicates need (``(zeros ?c)``: 0.0): no match
    # while no weight or constant of the e-graph is all that value (``driver.search.prefilter``)
    shared: frozenset[tuple[str, str, str, str, bool]] = frozenset()  # a multi-pattern rule's roots sharing a child
    # (``_shared``): no match while no two rows have one e-class there (``driver.search.prefilter``)
    split: str = ""  # the first pattern's root e-class (a column of its table): ``match_live(part=(i, k))`` keeps
    # the matches whose root is i modulo k, so the k parts are disjoint and together are the whole match
    last_read: int = 0  # the last step that reads the matches: build i, or len(builds) where a union reads them
    # (a right side that is a variable); after it the matches table can go (``Runner._apply_matches``)
    whole_sql: str = ""  # the semi-naive match as one join (every alias older than {until}, the newest of them at
    # least {since}): the rows of the parts together, in one statement (``match_live(whole=True)``)

    def witness(self, mids: str, until: int, carried: bool = False) -> str:
        """The SELECT of the explanation rows of the matches whose ``mid`` is in the SELECT ``mids``: the
        left side's join again, bound to each match's variables and roots (a selective join from the matches),
        keeping the least ids of the e-nodes each term matched among the rows of rounds before ``until``.
        ``carried``: the matches carry their e-nodes (``match_live(carry=True)``); their rows are projected.
        Where a match row has one combination of e-nodes (every attribute of the left side bound), its e-nodes
        are that combination, so both give the same rows (``tests/test_prefilter.py``)."""
        if carried:
            return self.carried_sql.replace("{mids}", mids)
        return self.witness_sql.replace("{mids}", mids).replace("{until}", str(int(until)))

    def match(self, since: int = 0, until: int = SNAPSHOT_ALL) -> str:
        """The SELECT of the matches that use a row of round ``since`` or later (semi-naive) and
        only rows of rounds before ``until`` (the round's snapshot: nodes added in the round itself,
        by this or another rule, are not matched until the next round)."""
        return self.match_sql.format(since=int(since), until=int(until))

    def match_live(self, since: int, until: int, newest: dict[str, int], oldest: dict[str, int],
                   carry: bool = False, part: tuple[int, int] | None = None, whole: bool = False) -> str | None:
        """``match(since, until)`` without the semi-naive parts that are empty by the tables' ts ranges alone
        (``newest``/``oldest``: each op table's greatest and least ``ts``; an empty table absent): part k needs a
        row of its alias k's table with ts >= since and, for every alias before it, a row with ts < since (at
        ``since`` 0 only the first part is left).  The same rows as ``match``; None when no part is left.
        ``carry`` (where ``self.carry``): the rows also carry their e-nodes, for ``witness(carried=True)``.
        ``part`` ``(i, k)``: only the matches whose first root is ``i`` modulo ``k`` (a condition on a column of
        one table, which DuckDB applies as it scans it: a part costs about 1/k of the join); every match row is in
        exactly one part, since all its rows agree on the root (a ``UNION`` of parts removes the same repeats).
        ``whole``: where more than one part is left, the match as one join over all rows instead (``whole_sql``:
        the same rows; DuckDB plans each part anew, 3-5 ms for a join of eight tables, which on small tables is
        most of its cost)."""
        keep = []
        for k, (table, sql) in enumerate(self.parts):
            if newest.get(table, -1) < since:
                continue
            if any(oldest.get(t, since) >= since for t, _ in self.parts[:k]):
                continue
            keep.append(sql)
        if not keep:
            return None
        split = "true" if part is None else f"{self.split} % {int(part[1])} = {int(part[0])}"
        text = self.whole_sql if whole and len(keep) > 1 and self.whole_sql else self.joiner.join(keep)
        return text.format(since=int(since), until=int(until), carry=self.carry if carry else "", part=split)


@dataclass(frozen=True)
class _From:
    """One FROM item of a left side: ``table alias``; ``analysis``: the ``eclass`` table (a condition's
    shape or constness), not an op table."""

    table: str
    alias: str
    analysis: bool = False

    def sql(self) -> str:
        return f"{self.table} {self.alias}"


def literal_conditions(t: Term, alias: str = "") -> list[str]:
    """A term's literal attribute conditions (getitem's index, literal attributes, list lengths and literal items) as
    SQL over its table's columns, ``alias`` before each name: the left side's filters, ``Compiled.kinds`` (no
    alias) and the tree match's (``driver.search.treematch``)."""
    conds = [f"{alias}{q('index')} = {t.index}"] if t.op == "getitem" else []
    for name, val in t.attrs:
        col = alias + q(name)
        if isinstance(val, Lit):
            conds.append(f"{col} = {literal(val.value)}")
        elif isinstance(val, ListOf):
            conds.append(f"len({col}) = {len(val.items)}")
            conds += [f"{col}[{i + 1}] = {literal(item.value)}" for i, item in enumerate(val.items)
                      if isinstance(item, Lit)]
    return conds


class _Lhs:
    """Walks the patterns, allocating table aliases and collecting join conditions."""

    def __init__(self) -> None:
        self.froms: list[_From] = []
        self.where: list[str] = []
        self.binds: dict[str, str] = {}  # variable -> SQL expression
        self.eclass_vars: set[str] = set()
        self.aliases: list[str] = []
        self.analysis: dict[str, str] = {}  # e-class variable -> eclass alias
        self.edges: set[tuple[str, str, int, str]] = set()  # (table, child column, list position, child's table)
        self.kinds: set[tuple[str, str]] = set()  # (table, a term's literal attribute conditions over it)
        self.loose = False  # whether distinct pattern rows can project to the same match row

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
        self.froms.append(_From(op.table, alias))
        self.where += literal_conditions(t, f"{alias}.")
        for name, val in t.attrs:  # attribute variables
            col = f"{alias}.{q(name)}"
            if isinstance(val, Var):
                self.bind(val.name, col)
            elif isinstance(val, ListOf):
                for i, item in enumerate(val.items):
                    if isinstance(item, Var):
                        self.bind(item.name, f"{col}[{i + 1}]")
        if lits := literal_conditions(t):  # over its table alone
            self.kinds.add((op.table, " AND ".join(lits)))
        if op.variadic:
            col = f"{alias}.{q(op.inputs[0].column)}"
            self.where.append(f"len({col}) = {len(t.children)}")
            slots = [(f"{col}[{i + 1}]", False) for i in range(len(t.children))]
            edges = [(op.table, op.inputs[0].column, i + 1) for i in range(len(t.children))]
        else:
            slots = [(f"{alias}.{q(i.column)}", i.optional) for i in op.inputs]
            edges = [(op.table, i.column, 0) for i in op.inputs]
        if any(a.name not in dict(t.attrs) for a in op.attrs if not (t.op == "getitem" and a.name == "index")):
            self.loose = True  # an unconstrained attribute: two nodes may give the same match row
        for (slot, optional), edge, child in zip(slots, edges, t.children):
            if isinstance(child, Term):
                self.edges.add(edge + (BY_TYPE[child.op].table,))
            self.child(slot, child, optional)
        return f"{alias}.out"

    def child(self, slot: str, child, optional: bool = False) -> None:
        if isinstance(child, Absent):
            self.where.append(f"{slot} = -1")
        elif isinstance(child, Var):
            if optional:  # a variable stands for an e-class: it never matches an absent input
                self.where.append(f"{slot} <> -1")
            self.eclass_vars.add(child.name)
            self.bind(child.name, slot)
        else:
            self.where.append(f"{slot} = {self.term(child)}")

    def eclass(self, var: str) -> str:
        if var not in self.analysis:
            alias = f"e{len(self.analysis)}"
            self.analysis[var] = alias
            self.froms.append(_From("eclass", alias, analysis=True))
            self.where.append(f"{alias}.id = {self.binds[var]}")
        return self.analysis[var]


class _Lets(dict):
    """Each let variable's SQL by name; ``symbolic``: the lets computed from a ``size`` (a symbol where a dim is
    dynamic)."""

    def __init__(self):
        super().__init__()
        self.symbolic: set[str] = set()


def _symbolic(e, lets: _Lets) -> bool:
    """Whether ``e`` may be a symbol: a ``size``, a let computed from one, or arithmetic over them."""
    if isinstance(e, Size):
        return True
    if isinstance(e, Var):
        return e.name in lets.symbolic
    if isinstance(e, BinOp):
        return _symbolic(e.left, lets) or _symbolic(e.right, lets)
    return False


def _expr(e, lhs: _Lhs, lets: _Lets, raw: bool = False) -> str:
    """SQL for an expression. A dim is a number only when it is not a symbol (``cdim``: NULL for a
    dynamic dim, so arithmetic and orderings on it prove nothing); ``raw``: the dim as stored, for an
    equality between dims, where equal symbols are equal. A ``size`` is the dim as stored; arithmetic over
    one is a product dim for ``*`` of a symbol and a number (``dmul``), else NULL where a side is a symbol."""
    if isinstance(e, Lit):
        return literal(e.value)
    if isinstance(e, Var):
        return lets.get(e.name) or lhs.binds[e.name]
    if isinstance(e, Dim):
        idx = e.index + 1 if e.index >= 0 else e.index
        d = f"{lhs.eclass(e.var.name)}.shape[{idx}]"
        return d if raw or isinstance(e, Size) else f"cdim({d})"
    if isinstance(e, Rank):
        return f"len({lhs.eclass(e.var.name)}.shape)"
    if isinstance(e, Numel):
        return f"cprod({lhs.eclass(e.var.name)}.shape)"
    if isinstance(e, ShapeOf):
        return f"{lhs.eclass(e.var.name)}.shape"
    if isinstance(e, BinOp):
        a, b = _expr(e.left, lhs, lets), _expr(e.right, lhs, lets)
        if _symbolic(e, lets):
            if e.op == "*":
                return f"dmul({a}, {b})"
            a, b = f"cdim({a})", f"cdim({b})"
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


def _condition(c, lhs: _Lhs, lets: _Lets, linked: bool = True) -> str:
    """A condition's SQL; ``linked``: the left side's patterns share variables, so a comparison is only a filter."""
    if isinstance(c, Pred):
        alias = lhs.eclass(c.var.name)
        if c.kind in FILLS:
            v = FILLS[c.kind]
            # the e-classes (``out``) holding such a leaf: comparing the e-class with the leaf's e-node id matched
            # whatever class shared a number with a zero constant's e-node (found by the fuzzing campaign)
            return f"{alias}.id IN (SELECT out FROM ({FILLED}) WHERE v = {v})"
        return {"const": f"{alias}.is_const", "not-const": f"NOT {alias}.is_const",
                "dynamic": f"has_sym({alias}.shape)",
                "dtype": f"{alias}.dtype = {c.dtype}"}[c.kind]
    op = "<>" if c.op == "!=" else c.op
    raw = op == "="  # equal symbols prove equal dims; nothing proves a symbol unequal to another dim
    left, right = _expr(c.left, lhs, lets, raw), _expr(c.right, lhs, lets, raw)
    if not raw:  # a symbol (a size) is no number to order or tell apart
        left, right = (f"cdim({x})" if _symbolic(e, lets) else x for x, e in ((left, c.left), (right, c.right)))
    cmp = f"({left}) {op} ({right})"
    # a filter, never a join key: DuckDB's join order took ``e1.shape = e0.shape`` (two e-classes of the left side)
    # as the key of a join of ``eclass`` with itself before the ids, 10 million rows for 40 matches on NasRNN
    # (matrix-0405-rev: 1.0 s -> 20 ms).  Where the patterns are linked by variables every alias is joined to the
    # others by ids already (the patterns, and the e-classes of their variables); in a WHERE a NULL comparison is
    # false either way.  Patterns that share no variable keep the plain comparison: it may be their only link.
    return f"coalesce({cmp}, false)" if linked else cmp


def _linked(rule: Rule) -> bool:
    """Whether the left side's patterns are one join through shared variables (one pattern always is)."""
    groups = [_vars(p) for p in rule.patterns]
    reached, todo = set(groups[0]), groups[1:]
    while todo:
        joined = [g for g in todo if g & reached]
        if not joined:
            return False
        for g in joined:
            reached |= g
        todo = [g for g in todo if not g & reached]
    return True


def lhs_tables(rule: Rule) -> tuple[str, ...]:
    """The op tables a rule's left side joins, in the order ``compile_rule`` joins them (its ``Compiled.tables``),
    read off the patterns alone: whether a rule can match at all is known before it is compiled (a generated rule
    set is mostly rules over operators a model does not have; compiling all 2,624 cost 1.8 s a run)."""
    found: dict[str, None] = {}

    def walk(t: Term) -> None:
        found[BY_TYPE[t.op].table] = None
        for child in t.children:
            if isinstance(child, Term):
                walk(child)

    for p in rule.patterns:
        walk(p)
    return tuple(found)


@dataclass(frozen=True)
class Needs:
    """What a left side needs of the e-graph to match at all (``Compiled.edges``, ``Compiled.kinds``,
    ``Compiled.values`` and ``Compiled.shared``)."""

    edges: frozenset[tuple[str, str, int, str]]
    kinds: frozenset[tuple[str, str]]
    values: frozenset[float] = frozenset()
    shared: frozenset[tuple[str, str, str, str, bool]] = frozenset()


def lhs_needs(rule: Rule) -> Needs:
    """A rule's ``Compiled.edges``, ``Compiled.kinds``, ``Compiled.values`` and ``Compiled.shared`` from a walk of
    its patterns and conditions alone (a fifth of compiling it): whether the e-graph can hold a match is known
    before the rule is compiled."""
    lhs = _Lhs()
    for p in rule.patterns:
        lhs.term(p)
    return Needs(frozenset(lhs.edges), frozenset(lhs.kinds), _fills(rule), _shared(rule))


def _shared(rule: Rule) -> frozenset[tuple[str, str, str, str, bool]]:
    """What a multi-pattern rule's roots need of each other: for two roots with an e-class variable as a direct
    child of both, (table i, column, table j, column, distinct): a row of each whose child there is one e-class,
    two rows of different e-classes where the roots are of one op (``compile_rule`` keeps two patterns off one
    node). A merge over a shared weight, ``(Conv ?x ?w), (Conv ?y ?w)``, cannot match a model whose Convs share no
    weight (TENSAT's merges: 3-8 empty joins of 3-7 ms a zoo run)."""
    if len(rule.patterns) < 2:
        return frozenset()
    slots = []  # per root: e-class variable -> (table, column) where it is a direct child
    for p in rule.patterns:
        op = BY_TYPE[p.op]
        here = {}
        if not op.variadic:
            for inp, child in zip(op.inputs, p.children):
                if isinstance(child, Var):
                    here.setdefault(child.name, inp.column)
        slots.append((op.table, here))
    out = set()
    for i in range(len(slots)):
        for j in range(i + 1, len(slots)):
            (ti, ci), (tj, cj) = slots[i], slots[j]
            same = rule.patterns[i].op == rule.patterns[j].op
            for var in ci.keys() & cj.keys():
                out.add((ti, ci[var], tj, cj[var], same))
    return frozenset(out)


def _fills(rule: Rule) -> frozenset[float]:
    """The values the rule's value predicates need a constant of (``(zeros ?c)``: 0.0, ``(ones ?c)``: 1.0)."""
    return frozenset(FILLS[c.kind] for c in rule.conditions if isinstance(c, Pred) and c.kind in FILLS)


def compile_rule(rule: Rule) -> Compiled:
    lhs = _Lhs()
    roots = [lhs.term(p) for p in rule.patterns]
    for i in range(len(roots)):  # two patterns never match the same node; mirrored matches only once
        for j in range(i + 1, len(roots)):
            if mirrored(rule, i, j):
                lhs.where.append(f"{roots[i]} < {roots[j]}")
            elif rule.patterns[i].op == rule.patterns[j].op:
                lhs.where.append(f"{roots[i]} <> {roots[j]}")
    lets = _Lets()
    for let in rule.lets:
        lets[let.var.name] = f"({_expr(let.expr, lhs, lets)})"
        if _symbolic(let.expr, lets):
            lets.symbolic.add(let.var.name)
    linked = _linked(rule)
    conds = [_condition(c, lhs, lets, linked) for c in rule.conditions]
    conds += [f"{v} IS NOT NULL" for v in lets.values()]  # a let over a dynamic dim is no number
    cols = [f"{e} AS {q('v_' + v)}" for v, e in lhs.binds.items()]
    cols += [f"{e} AS {q('v_' + v)}" for v, e in lets.items()]
    cols += [f"{r} AS root{i}" for i, r in enumerate(roots)]
    # semi-naive: a match uses a row newer than {since}; split by the first alias whose row is new, so
    # the parts are disjoint and each joins the new rows of one alias with the rest; every row is older
    # than {until} (the rows of the round's snapshot)
    parts = []
    table = {f.alias: f.table for f in lhs.froms}
    for k, alias in enumerate(lhs.aliases):
        fresh = ([f"{alias}.ts >= {{since}}"] + [f"{a}.ts < {{since}}" for a in lhs.aliases[:k]]
                 + [f"{a}.ts < {{until}}" for a in lhs.aliases[k:]] + ["{part}"])
        parts.append((table[alias], f"SELECT {', '.join(cols)}{{carry}} FROM {', '.join(f.sql() for f in lhs.froms)} "
                                    f"WHERE {' AND '.join(lhs.where + conds + fresh)}"))
    # pattern rows are unique by key, so a match row repeats only when an attribute is left free
    joiner = " UNION " if lhs.loose else " UNION ALL "
    # the parts as one join (several aliases only: with one there is one part)
    ts = [f"{a}.ts" for a in lhs.aliases]
    window = [f"{t} < {{until}}" for t in ts] + [f"greatest({', '.join(ts)}) >= {{since}}", "{part}"]
    whole = (f"SELECT {'DISTINCT ' if lhs.loose else ''}{', '.join(cols)}{{carry}} FROM "
             f"{', '.join(f.sql() for f in lhs.froms)} WHERE {' AND '.join(lhs.where + conds + window)}"
             if len(ts) > 1 else "")
    match_sql = joiner.join(sql.replace("{carry}", "").replace("{part}", "true") for _, sql in parts)
    carry = "" if lhs.loose else "".join(f", {a}.id AS _n{k}, {a}.out AS _c{k}" for k, a in enumerate(lhs.aliases))
    plan: list[_Step] = []
    memo: dict[Term, str] = {}
    unions, pairs, results = [], [], []
    needs: dict[str, set[str]] = {}  # build -> match columns its result must carry for later readers
    for i, r in enumerate(rule.rhs):
        if isinstance(r, Var):
            unions.append(f"SELECT m.root{i}, m.{q('v_' + r.name)} FROM {MATCHES} m")
            pairs.append(f"SELECT m.mid, m.root{i}, m.{q('v_' + r.name)} FROM {MATCHES} m")
        else:
            res = _build(r, plan, memo, target=f"root{i}")
            needs.setdefault(res, set()).add(f"root{i}")
            unions.append(f"SELECT r.root{i}, r.out FROM {res} r")
            pairs.append(f"SELECT r.mid, r.root{i}, r.out FROM {res} r")
            results.append(res)
    builds = _sources(plan, needs)
    last_read = len(builds) if any(isinstance(r, Var) for r in rule.rhs) else max(
        (i for i, b in enumerate(builds) if MATCHES in b.reads), default=-1)
    tables = tuple(dict.fromkeys(f.table for f in lhs.froms if not f.analysis))
    return Compiled(rule.name, match_sql, builds, tuple(unions), len(rule.patterns) > 1,
                    " UNION ALL ".join(pairs), tuple(dict.fromkeys(results)), tables, parts=tuple(parts),
                    joiner=joiner, edges=frozenset(lhs.edges), kinds=frozenset(lhs.kinds),
                    witness_sql=_witness(lhs, conds, roots, lets),
                    carry=carry, carried_sql=_carried(lhs, roots, lets) if carry else "", split=roots[0],
                    whole_sql=whole, last_read=last_read, explain_ops=tuple(_op_names(lhs)),
                    explain_vars=tuple("?" + v for v in sorted(lhs.eclass_vars)),
                    explain_values=bool(_values(lhs, lets)), values=_fills(rule), shared=_shared(rule))


def _described(lhs: _Lhs, roots: list[str], lets: dict[str, str]) -> tuple[str, str, str, str, str]:
    """The explanation columns both witness forms take from a match row ``m``, per match: the terms' op types,
    the roots, the e-class variables' classes (JSON ``{"?var": e-class}``), the other bindings and ``let``
    values (JSON), and the e-class variables' classes as a list (``Compiled.explain_vars``' order)."""
    def obj(variables) -> str:
        return "json_object(" + ", ".join(f"{literal('?' + v)}, m.{q('v_' + v)}" for v in variables) + ")"

    variables = sorted(lhs.eclass_vars)
    ids = ", ".join(f"m.{q('v_' + v)}" for v in variables)
    return (f"{literal(_op_names(lhs))}::VARCHAR[]", f"[{', '.join(f'm.root{i}' for i in range(len(roots)))}]::BIGINT[]",
            obj(variables), obj(_values(lhs, lets)), f"[{ids}]::BIGINT[]")


def _op_names(lhs: _Lhs) -> list[str]:
    """The op types of the left side's terms, in term order."""
    table = {f.alias: f.table for f in lhs.froms if not f.analysis}
    return [BY_TABLE[table[a]].op_type for a in lhs.aliases]


def _values(lhs: _Lhs, lets: dict[str, str]) -> list[str]:
    """The bindings an explanation names besides the e-class variables: the other variables, then the lets."""
    return [v for v in sorted(lhs.binds) if v not in lhs.eclass_vars] + list(lets)


def _witness(lhs: _Lhs, conds: list[str], roots: list[str], lets: dict[str, str]) -> str:
    """``Compiled.witness_sql``: the left side's join restricted to the recorded matches (``{mids}``), each
    variable and root equal to the match row's, over rows of rounds before ``{until}``; one row per match
    with the least ids of the matched e-nodes (term order), the terms' op types, the roots, the e-class
    variables' classes and the other bindings and the ``let`` values (``_described``), and the e-class each
    term's e-node was in then (term order: what ``relsat explain`` follows to the unions that made a match
    possible)."""
    on = [f"{e} IS NOT DISTINCT FROM m.{q('v_' + v)}" for v, e in lhs.binds.items()]
    on += [f"{r} = m.root{i}" for i, r in enumerate(roots)]
    until = [f"{a}.ts < {{until}}" for a in lhs.aliases]
    ops, rts, classes, bindings, ids = _described(lhs, roots, lets)
    cols = ["m.mid", f"min([{', '.join(f'{a}.id' for a in lhs.aliases)}]) AS nodes", f"{ops} AS ops",
            f"any_value({rts}) AS roots", f"any_value({classes}) AS classes", f"any_value({bindings}) AS bindings",
            f"arg_min([{', '.join(f'{a}.out' for a in lhs.aliases)}]::BIGINT[], "
            f"[{', '.join(f'{a}.id' for a in lhs.aliases)}]) AS terms", f"any_value({ids}) AS class_ids"]
    froms = ", ".join([f"{MATCHES} m"] + [f.sql() for f in lhs.froms])
    where = lhs.where + conds + on + until + ["m.mid IN ({mids})"]
    return f"SELECT {', '.join(cols)} FROM {froms} WHERE {' AND '.join(where)} GROUP BY m.mid"


def _carried(lhs: _Lhs, roots: list[str], lets: dict[str, str]) -> str:
    """``Compiled.carried_sql``: ``_witness``'s columns projected from matches that carry each term's e-node
    (``_n<k>``) and e-class (``_c<k>``)."""
    k = range(len(lhs.aliases))
    ops, rts, classes, bindings, ids = _described(lhs, roots, lets)
    cols = ["m.mid", f"[{', '.join(f'm._n{i}' for i in k)}]::BIGINT[] AS nodes", f"{ops} AS ops", f"{rts} AS roots",
            f"{classes} AS classes", f"{bindings} AS bindings",
            f"[{', '.join(f'm._c{i}' for i in k)}]::BIGINT[] AS terms", f"{ids} AS class_ids"]
    return f"SELECT {', '.join(cols)} FROM {MATCHES} m WHERE m.mid IN ({{mids}})"


def _rename(x, sigma: dict[str, str]):
    """``x`` (IR) with its variables renamed by ``sigma``."""
    if isinstance(x, Var):
        return Var(sigma.get(x.name, x.name))
    if isinstance(x, tuple):
        return tuple(_rename(i, sigma) for i in x)
    if dataclasses.is_dataclass(x):
        return dataclasses.replace(x, **{f.name: _rename(getattr(x, f.name), sigma)
                                         for f in dataclasses.fields(x) if f.compare})
    return x


def _unify(a, b, sigma: dict[str, str]) -> bool:
    """Extend ``sigma`` (a swap of variables) so that it maps pattern ``a`` onto pattern ``b``."""
    if isinstance(a, Var) and isinstance(b, Var):
        if sigma.get(a.name, b.name) != b.name or sigma.get(b.name, a.name) != a.name:
            return False
        sigma[a.name], sigma[b.name] = b.name, a.name
        return True
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_unify(x, y, sigma) for x, y in zip(a, b))
    if isinstance(a, Term) and isinstance(b, Term):
        return (a.op == b.op and a.index == b.index and [n for n, _ in a.attrs] == [n for n, _ in b.attrs]
                and _unify(tuple(v for _, v in a.attrs), tuple(v for _, v in b.attrs), sigma)
                and _unify(a.children, b.children, sigma))
    if isinstance(a, ListOf) and isinstance(b, ListOf):
        return _unify(a.items, b.items, sigma)
    return type(a) is type(b) and a == b


def _norm(c):
    """A condition in a form where ``(= a b)`` equals ``(= b a)`` and ``(> a b)`` equals ``(< b a)``."""
    if isinstance(c, Cmp):
        if c.op in ("=", "!="):
            return (c.op, frozenset([c.left, c.right]))
        if c.op in (">", ">="):
            return ({">": "<", ">=": "<="}[c.op], c.right, c.left)
        return (c.op, c.left, c.right)
    return c


def _vars(x) -> set[str]:
    if isinstance(x, Var):
        return {x.name}
    if isinstance(x, tuple):
        return set().union(*(_vars(i) for i in x)) if x else set()
    if dataclasses.is_dataclass(x):
        return set().union(*(_vars(getattr(x, f.name)) for f in dataclasses.fields(x) if f.compare))
    return set()


def mirrored(rule: Rule, i: int, j: int) -> bool:
    """Whether matching patterns i and j the other way round only mirrors the application: the
    left side (patterns, lets, conditions) is invariant under swapping the two patterns and their
    variables, and every right side uses the variables of both, so the swapped match merges the
    same two nodes again (e.g. into Concat(w2, w1) instead of Concat(w1, w2)).  Such a pair is then
    matched in one order only."""
    pats = rule.patterns
    sigma: dict[str, str] = {}
    if not _unify(pats[i], pats[j], sigma):
        return False
    for let in rule.lets:  # a let whose expression maps onto another let's swaps with it
        image = _rename(let.expr, sigma)
        partner = [o for o in rule.lets if o.expr == image]
        if not partner or not _unify(let.var, partner[0].var, sigma):
            return False
    swapped = list(pats)
    swapped[i], swapped[j] = pats[j], pats[i]
    if tuple(_rename(p, sigma) for p in pats) != tuple(swapped):
        return False
    if {_norm(_rename(c, sigma)) for c in rule.conditions} != {_norm(c) for c in rule.conditions}:
        return False
    both = (_vars(pats[i]) | _vars(pats[j])) - _vars(tuple(p for k, p in enumerate(pats) if k not in (i, j)))
    return all(both <= _vars(r) for r in rule.rhs)


def _attr_sql(v, refs: set[str]) -> str:
    if isinstance(v, Lit):
        return literal(v.value)
    if isinstance(v, Var):
        refs.add(q("v_" + v.name))
        return f"m.{q('v_' + v.name)}"
    return "[" + ", ".join(_attr_sql(i, refs) for i in v.items) + "]"


@dataclass(frozen=True)
class _Join:
    """A built child's result joined into a step by ``mid``: ``JOIN table alias ON alias.mid = m.mid``."""

    table: str
    alias: str

    def sql(self) -> str:
        return f"JOIN {self.table} {self.alias} ON {self.alias}.mid = m.mid"


@dataclass(frozen=True)
class _Step:
    """One planned build step, before ``_sources`` decides which match columns it carries."""

    name: str  # its result table
    op: str
    base: str  # the table it reads as ``m``: the matches, or its first built child's result
    joins: tuple[_Join, ...]  # its other built children's results
    cols: tuple[str, ...]  # the SELECT items of the node's children and attributes
    refs: frozenset[str]  # the match columns (quoted) those items read from ``m``
    target: str | None  # the match column with the pattern root it is unioned with (a right side's top)


def _build(t: Term, plan: list[_Step], memo: dict, target: str | None = None) -> str:
    """Plan the build steps of right-side term ``t`` (children first); return its result table.

    A step over built children reads the first child's result as ``m`` and joins the others by
    ``mid``; ``insert_from`` carries source columns into the result, so no step joins back to
    the matches (``_sources`` decides which match columns each step carries)."""
    if t in memo:
        return memo[t]
    op = BY_TYPE[t.op]
    base, joins, children, refs = MATCHES, [], [], set()
    for child in t.children:
        if isinstance(child, Absent):
            children.append("-1")
        elif isinstance(child, Var):
            refs.add(q("v_" + child.name))
            children.append(f"m.{q('v_' + child.name)}")
        else:
            res = _build(child, plan, memo)
            if base == MATCHES:
                base = res
                children.append("m.out")
            else:
                join = _Join(res, f"j{len(joins)}")
                joins.append(join)
                children.append(f"{join.alias}.out")
    cols = []
    if op.variadic:
        cols.append(f"[{', '.join(children)}] AS {q(op.inputs[0].column)}")
    else:
        cols += [f"{c} AS {q(col)}" for c, col in zip(children, op.child_columns)]
    if t.op == "getitem":
        cols.append(f"{t.index} AS {q('index')}")
    cols += [f"{_attr_sql(v, refs)} AS {q(name)}" for name, v in t.attrs]
    name = f"_r{len(plan)}"
    plan.append(_Step(name, t.op, base, tuple(joins), tuple(cols), frozenset(refs), target))
    memo[t] = name
    return name


def _sources(plan: list[_Step], needs: dict[str, set[str]]) -> tuple[Build, ...]:
    """The SELECT of each planned step.  A result carries only the match columns that the steps
    reading it as their ``m`` (and the unions) still use, so wide matches stay narrow."""
    for step in reversed(plan):
        carried = needs.setdefault(step.name, set()) | ({step.target} if step.target else set())
        needs[step.name] = carried
        if step.base != MATCHES:
            needs.setdefault(step.base, set()).update(carried | step.refs)
    read = {step.base for step in plan} | {j.table for step in plan for j in step.joins}
    out = []
    for step in plan:
        carry = [f"m.{c}" for c in sorted(needs[step.name])]
        cols = ["m.mid"] + carry + list(step.cols)  # (``mid`` is the row id: ``insert_from(rid=BUILD_ROW_ID)``)
        source = f"SELECT {', '.join(cols)} FROM {step.base} m {' '.join(j.sql() for j in step.joins)}".rstrip()
        out.append(Build(step.name, step.op, source, step.target,
                         step.target is not None and step.name not in read,
                         (step.base,) + tuple(j.table for j in step.joins)))
    return tuple(out)
