"""Rules' left sides as data: which rules have a structural match in a round, for the whole rule set in a
handful of statements whatever the number of rules (issue 30, item 1).

The survey (``prefilter``) lets a rule run once the e-graph has every edge type its left side joins along; a
generated rule set still runs many joins that find nothing, and each is a DuckDB statement of 3-20 ms (planning
an eight-table join), whatever the e-graph's size.  Here every term of every ready rule's left side is a row of a
table (``TreeFilter.terms_table``): its op table, its height, its literal attributes (a kind number) and, per child
slot, what the slot must hold: any e-class (a variable: NULL), an absent input, a present one (a variable at an
optional input), a constant or a non-constant e-class (a variable under ``const``, ``zeros``, ``ones`` /
``not-const``), the e-class of an earlier slot of the same term (a repeated variable), or an e-class that matches
another term (that term's id).  Equal terms of different rules are one row.  Each round the terms are matched
bottom-up, one statement per height (one UNION ALL branch per op table with terms of that height: the statements
grow with the operators the rules use, not with the rules): ``TreeFilter.matched`` gets a row ``(term, cls, ts)``
for every e-class holding a node whose tree matches the term, with the newest ``ts`` of any such match's nodes.  A
rule can match only when each of its patterns' roots has a row and one of them is at least the rule's last run
(semi-naive); one more statement reads the roots' newest ``ts``, and the runner skips the others as rules that
matched nothing.

What is left out only loosens the test, so it skips statements that would return no rows and nothing else: a
variable shared by two terms, the links between a multi-pattern rule's patterns, shape and other conditions.  The
rows read are those a match of the round reads, the round's snapshot (ts below the round): the rules of a round
insert rows of the round's ts, and only a rebuild rewrites rows.  Of the e-class analyses only constness can change
within a round, from false to true (an insert into an existing e-class): a variable that must be non-constant is
safe to check as the round begins, one that must be constant is not once an e-class has become constant
(``sensitive``: ``Runner._tree``).  The same e-graph, ids included, with and without it: ``tests/test_treematch.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from relsat.programs.compiler import literal_conditions
from relsat.programs.ir import FILLS, Absent, Pred, Rule, Term, Var
from relsat.relations.catalog import BY_TABLE, BY_TYPE
from relsat.relations.schema import literal, q

# what a child slot of a term must hold, besides another term's id: any e-class, no input, an e-class, a constant
# e-class (a variable with ``(const ?v)``, ``(zeros ?v)`` or ``(ones ?v)``), a non-constant one (``(not-const ?v)``)
# ``(Add ?x ?x)``: a variable repeated among one term's children is SAME - j at every slot after its first, slot j
ANY, ABSENT, PRESENT, CONST, NONCONST, SAME = None, -1, -2, -3, -4, -10
MIN_RULES = 8  # fewer rules that would run than this: no tree match (its statements cost about as much as theirs;
# 8 rather than 12: the zoo at node limit 50,000 ran 1,146 statements with the default set against 1,203, the same e-graphs)
MAX_PAIRS = 4_000_000  # rows times terms of one op table and height: past this, no tree match this round


@dataclass(frozen=True)
class _Term:
    id: int
    table: str
    height: int
    kind: int  # 0: no literal attribute; else its literal conditions' number in ``TreeFilter.kinds``
    arity: int  # a variadic op's number of children (0: not variadic)
    slots: tuple[int | None, ...]  # per child slot: ANY, ABSENT, PRESENT, CONST, NONCONST, SAME - j or a term's id


class TreeFilter:
    """The terms of the rules' left sides as data, and the rules that can match in a round (module docstring)."""

    def __init__(self, terms: str, matched: str) -> None:
        self.terms_table, self.matched = terms, matched  # table names (the run's scratch)
        self.ids: dict[tuple, _Term] = {}
        self.by_id: dict[int, _Term] = {}
        self.kinds: dict[tuple[str, str], int] = {}  # (op table, SQL over its columns as ``n``) -> kind number
        self.roots: dict[str, tuple[int, ...]] = {}  # rule -> its patterns' root terms
        self.sensitive: set[str] = set()  # rules with a CONST slot: see ``Runner._tree``
        self.pending: list[_Term] = []  # terms not yet written to the table
        self.created, self.width = False, 0  # whether the table exists; its slot columns

    def add(self, rule: Rule) -> None:
        """The terms of one rule's left side (once: the runner adds a rule when it first asks about it)."""
        if rule.name in self.roots:
            return
        wants = {}
        for c in rule.conditions:
            if isinstance(c, Pred) and (c.kind == "const" or c.kind in FILLS):
                wants[c.var.name] = CONST
            elif isinstance(c, Pred) and c.kind == "not-const":
                wants.setdefault(c.var.name, NONCONST)
        self.roots[rule.name] = tuple(self._term(p, wants).id for p in rule.patterns)
        if CONST in wants.values():
            self.sensitive.add(rule.name)

    def _term(self, t: Term, wants: dict[str, int]) -> _Term:
        op = BY_TYPE[t.op]
        slots, first = [], {}
        for i, child in enumerate(t.children):
            optional = not op.variadic and i < len(op.inputs) and op.inputs[i].optional
            if isinstance(child, Term):
                slots.append(self._term(child, wants))
            elif isinstance(child, Absent):
                slots.append(ABSENT)
            elif isinstance(child, Var) and child.name in first:
                slots.append(SAME - first[child.name])
            elif isinstance(child, Var):
                first[child.name] = i + 1
                slots.append(wants.get(child.name, PRESENT if optional else ANY))
        height = 1 + max((s.height for s in slots if isinstance(s, _Term)), default=0)
        codes = tuple(s.id if isinstance(s, _Term) else s for s in slots)
        lits = " AND ".join(literal_conditions(t, "n."))
        kind = self.kinds.setdefault((op.table, lits), len(self.kinds) + 1) if lits else 0
        key = (op.table, kind, codes, len(t.children) if op.variadic else 0)
        if key not in self.ids:
            term = _Term(len(self.ids), op.table, height, kind, key[3], codes)
            self.ids[key] = self.by_id[term.id] = term
            self.pending.append(term)
        return self.ids[key]

    def _columns(self) -> int:
        return max((len(t.slots) for t in self.ids.values()), default=0)

    def _write(self, con) -> None:
        """The terms added since the last round into the terms table (re-created when they need more slots)."""
        width = self._columns()
        if self.created and width > self.width:
            con.execute(f"DROP TABLE IF EXISTS {self.terms_table}")
            self.created, self.pending = False, list(self.ids.values())
        if not self.created:
            self.width = width
            slots = "".join(f", c{i} BIGINT" for i in range(1, width + 1))
            con.execute(f"CREATE OR REPLACE TEMP TABLE {self.terms_table} (term BIGINT, tbl VARCHAR, height INTEGER, "
                        f"kind INTEGER, arity INTEGER{slots})")
            self.created = True
        if self.pending:
            rows = ", ".join(
                f"({t.id}, {literal(t.table)}, {t.height}, {t.kind}, {t.arity}"
                + "".join(f", {'NULL' if s is None else s}" for s in t.slots + (None,) * (self.width - len(t.slots)))
                + ")" for t in self.pending)
            con.execute(f"INSERT INTO {self.terms_table} VALUES {rows}")
            self.pending = []

    def possible(self, con, rnd: int, rules: dict[str, int], rows: dict[str, int],
                 min_rules: int | None = None) -> set[str] | None:
        """Of ``rules`` (name -> its last run, ``since``; every one added), those that may have a match in round
        ``rnd``; None where the tree match is not run (too few rules, or too many rows: ``MIN_RULES``,
        ``MAX_PAIRS``; the rules it could not rule out, one operator over variables, are not counted).  ``rows``: each
        op table's rows this round."""
        plain = {name for name in rules if self._plain(name)}
        rules = {name: since for name, since in rules.items() if name not in plain}
        if len(rules) < (MIN_RULES if min_rules is None else min_rules):
            return None
        if not rules:
            return plain
        levels: dict[int, set[str]] = {}  # height -> the op tables of the terms under the rules' roots
        for t in self._wanted(rules):
            levels.setdefault(t.height, set()).add(t.table)
        if any(rows.get(tbl, 0) * len(self._level(tbl, h)) > MAX_PAIRS for h, tables in levels.items() for tbl in tables):
            return None
        self._write(con)
        con.execute(f"CREATE OR REPLACE TEMP TABLE {self.matched} (term BIGINT, cls BIGINT, ts INTEGER)")
        for h in sorted(levels):  # (a branch matches every term of its table and height: simpler to plan)
            branches = [self._branch(tbl, h, self._level(tbl, h), rnd) for tbl in sorted(levels[h]) if rows.get(tbl, 0)]
            if branches:
                con.execute(f"INSERT INTO {self.matched} {' UNION ALL '.join(branches)}")
        roots = sorted({r for name in rules for r in self.roots[name]})
        newest = dict(con.execute(f"SELECT term, max(ts) FROM {self.matched} WHERE term IN "
                                  f"({', '.join(map(str, roots))}) GROUP BY term").fetchall())
        return plain | {name for name, since in rules.items()
                        if all(r in newest for r in self.roots[name]) and max(newest[r] for r in self.roots[name]) >= since}

    def _plain(self, rule: str) -> bool:
        """Whether each of the rule's patterns is one operator over variables, with no literal attribute and no
        constness: it matches wherever the runner would run it (its tables hold a row since its last run)."""
        return all(t.height == 1 and not t.kind and all(s is None for s in t.slots)
                   for t in (self.by_id[r] for r in self.roots[rule]))

    def _wanted(self, rules: dict[str, int]) -> list[_Term]:
        """The terms under the roots of ``rules``."""
        by_id = self.by_id
        seen: set[int] = set()
        todo = [r for name in rules for r in self.roots[name]]
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                todo.extend(s for s in by_id[i].slots if s is not None and s >= 0)
        return [by_id[i] for i in sorted(seen)]

    def _level(self, tbl: str, height: int) -> list[_Term]:
        return [t for t in self.ids.values() if t.table == tbl and t.height == height]

    def _branch(self, tbl: str, height: int, terms: list[_Term], rnd: int) -> str:
        """The matches of the terms of one op table and height: a SELECT of (term, cls, ts)."""
        op = BY_TABLE[tbl]
        width = max((len(t.slots) for t in terms), default=0)
        if op.variadic:
            col = q(op.inputs[0].column)
            exprs = [f"n.{col}[{i}]" for i in range(1, width + 1)]
        else:
            exprs = [f"n.{q(i.column)}" for i in op.inputs][:width]
        joins, conds, newest = [], [f"n.ts < {int(rnd)}"], ["n.ts"]
        for i, x in enumerate(exprs, 1):
            codes = {t.slots[i - 1] for t in terms if i <= len(t.slots)} - {ANY}
            if not codes:
                continue
            slot, alts = f"p.c{i}", [f"p.c{i} IS NULL"]
            if ABSENT in codes:
                alts.append(f"({slot} = {ABSENT} AND {x} = -1)")
            if PRESENT in codes:
                alts.append(f"({slot} = {PRESENT} AND {x} <> -1)")
            alts += [f"({slot} = {c} AND {x} = {exprs[SAME - c - 1]})" for c in sorted(codes - {None}) if c <= SAME]
            if CONST in codes or NONCONST in codes:
                joins.append(f"LEFT JOIN eclass e{i} ON e{i}.id = {x}")
                alts += [f"({slot} = {CONST} AND e{i}.is_const)", f"({slot} = {NONCONST} AND NOT e{i}.is_const)"]
            if any(c >= 0 for c in codes):
                joins.append(f"LEFT JOIN {self.matched} k{i} ON k{i}.term = {slot} AND k{i}.cls = {x}")
                alts.append(f"k{i}.term IS NOT NULL")
                newest.append(f"coalesce(k{i}.ts, -1)")
            conds.append(f"({' OR '.join(alts)})")
        if op.variadic:
            conds.append(f"len(n.{q(op.inputs[0].column)}) = p.arity")
        kinds = sorted({t.kind for t in terms if t.kind})
        if kinds:
            by_kind = {k: sql for (t, sql), k in self.kinds.items() if t == tbl}
            cases = " ".join(f"WHEN {k} THEN ({by_kind[k]})" for k in kinds)
            conds.append(f"(p.kind = 0 OR CASE p.kind {cases} ELSE false END)")
        return (f"SELECT p.term, n.out AS cls, max(greatest({', '.join(newest)})) AS ts FROM {tbl} n "
                f"JOIN {self.terms_table} p ON p.tbl = {literal(tbl)} AND p.height = {int(height)} "
                f"{' '.join(joins)} WHERE {' AND '.join(conds)} GROUP BY p.term, n.out")
