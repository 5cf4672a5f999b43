"""Which rules can match at all this round, decided for the whole rule set in at most two statements (four
in a round that adds the needs of rules just become ready).

A rule's left side joins op tables along child edges: ``(Mul (Add ?x ?y) ?z)`` needs a ``Mul`` node
whose first child's e-class holds an ``Add`` node.  ``Compiled.edges`` lists these needs as
``(op table, child column, list position, child's op table)``.  ``Survey`` keeps the set of such edge
types the e-graph has (``seen``) and, at the start of each round, looks for the ones some rule needs and
that have not been seen yet, in one SELECT over the op tables involved; likewise its terms' literal
attributes (``Compiled.kinds``: ``(Concat :axis 1 ...)`` needs a Concat row with axis 1), in one more; and
the values its value predicates need (``Compiled.values``: ``(zeros ?c)`` needs a weight or a constant that is all
zeros, which a trained model's biases seldom are: fold.rules' eight such rules matched every Add and Mul of
ResNeXt-50 for nothing, 3-6 ms each), in one more; and what a multi-pattern rule's roots share (``Compiled.shared``:
``(Conv ?x ?w), (Conv ?y ?w)`` needs two Conv nodes of different e-classes over one weight), in the kinds' statement.
A rule whose needs are not all seen has no match in the round's snapshot and costs no statement.  A
generated rule set (thousands of rules over a model that has a dozen operators) is mostly such rules:
their tables are present but their shapes are not (on ResNeXt-50, 63 of the 801 rules whose tables are
present).

Edge types only appear: a rebuild's merge gives an e-class more nodes, never fewer, a collapsed row
repeats another row's key, and a row whose children or e-class a rebuild rewrote gets the round's ``ts``
(as does every inserted row), and a row's attributes never change.  So a survey reads only the rows of
rounds since the previous survey on one side of each edge (the other side whole), and stops reading once
every needed edge type has been seen.
The filter only skips statements that would return no rows: the rules that run, their matches and the
e-graph are the same as without it (``tests/test_prefilter.py``).
"""

from __future__ import annotations

from collections.abc import Iterable

from relsat.programs.compiler import FILLED, Compiled, Needs
from relsat.relations.schema import literal, q

Edge = tuple[str, str, int, str]  # (op table, child column, list position (0: a plain column), child's op table)
Kind = tuple[str, str]  # (op table, a term's literal attribute conditions on its columns)
Shared = tuple[str, str, str, str, bool]  # (op table, child column, op table, child column, of different e-classes)


class Survey:
    """The edge types the e-graph has, among those the rules need (see the module docstring)."""

    def __init__(self, rules: Iterable[Compiled | Needs] = ()) -> None:
        self.need: set[Edge] = set()
        self.seen: set[Edge] = set()
        self.need_kinds: set[Kind] = set()
        self.seen_kinds: set[Kind] = set()
        self.need_values: set[float] = set()
        self.seen_values: set[float] = set()
        self.need_shared: set[Shared] = set()
        self.seen_shared: set[Shared] = set()
        self.added: set[Edge | Kind] = set()  # needs added since the previous survey: their rows of every round
        # are read once (the older rows were not read for them)
        self.last = 0  # the round of the previous survey: rows older than it were read then
        self.add(rules)

    def add(self, rules: Iterable[Compiled | Needs]) -> None:
        """The needs of more rules (a runner reads a rule's needs once its op tables hold rows)."""
        for c in rules:
            self.added |= (c.edges - self.need) | (c.kinds - self.need_kinds) | (c.values - self.need_values)
            self.need |= c.edges
            self.need_kinds |= c.kinds
            self.need_values |= c.values
            self.need_shared |= c.shared

    def update(self, con, round: int, present: Iterable[str], shared: Iterable[Shared] | None = None) -> None:
        """Look for the needed, unseen edge types among the rows of tables in ``present`` (the non-empty op
        tables) that are of rounds ``self.last`` .. ``round - 1`` on at least one side of the edge, and for the
        needed, unseen kinds among that table's rows of those rounds; needs added since the previous survey
        among all rows. ``shared``: the shared children to look for, among all rows (a pair can be an old row and
        a new one; the multi-pattern rules that need them run in the first rounds only), default every one
        needed; they go into the kinds' statement."""
        present = set(present)
        todo = [e for e in self.need - self.seen if e[0] in present and e[3] in present]
        for group, since in self._since(todo):
            self.seen |= self._find(con, group, since)
        kinds = sorted(k for k in self.need_kinds - self.seen_kinds if k[0] in present)
        pairs = sorted(n for n in (self.need_shared if shared is None else set(shared)) - self.seen_shared
                       if n[0] in present and n[2] in present)
        groups = self._since(kinds) or ([([], 0)] if pairs else [])
        for k, (group, since) in enumerate(groups):  # (the pairs with the last group: one statement for both)
            kinds_seen, shared_seen = self._find_kinds(con, group, since, pairs if k == len(groups) - 1 else [])
            self.seen_kinds |= kinds_seen
            self.seen_shared |= shared_seen
        for group, since in self._since(sorted(self.need_values - self.seen_values)):
            values = ", ".join(literal(float(v)) for v in group)
            sql = f"SELECT DISTINCT v FROM ({FILLED}) WHERE ts >= {int(since)} AND v IN ({values})"
            self.seen_values |= {v for (v,) in con.execute(sql).fetchall()}
        self.added = set()
        self.last = round

    def _since(self, needs: list) -> list[tuple[list, int]]:
        """``needs`` split by the round from which their rows are read: the previous survey's, or every round for
        those added since it; empty groups left out."""
        fresh = self.added if self.last else set()
        groups = ([n for n in needs if n not in fresh], self.last), ([n for n in needs if n in fresh], 0)
        return [(g, since) for g, since in groups if g]

    def allows(self, c: Compiled | Needs, values: bool = True) -> bool:
        """Whether the e-graph has what ``c`` needs; ``values=False``: its edges and kinds only. The values are
        read as a round begins; a constant that a rule inserts into an existing e-class in the round gives that
        e-class a value its matches read at once (``Runner._live`` then asks without them)."""
        return (c.edges <= self.seen and c.kinds <= self.seen_kinds and c.shared <= self.seen_shared
                and (not values or c.values <= self.seen_values))

    def _find_kinds(self, con, kinds: list[Kind], since: int, shared: list[Shared] = ()
                    ) -> tuple[set[Kind], set[Shared]]:
        """The kinds (rows of rounds from ``since``) and the shared children (any rows) that the e-graph has, in one
        statement."""
        parts = [f"SELECT {i} AS k FROM (SELECT 1 FROM {t} WHERE ts >= {int(since)} AND ({w}) LIMIT 1)"
                 for i, (t, w) in enumerate(kinds)]
        for i, (ta, ca, tb, cb, distinct) in enumerate(shared, start=len(kinds)):
            other = " AND a.out <> b.out" if distinct else ""
            parts.append(f"SELECT {i} AS k FROM (SELECT 1 FROM {ta} a JOIN {tb} b ON a.{q(ca)} = b.{q(cb)}{other} "
                         f"WHERE a.{q(ca)} <> -1 LIMIT 1)")
        found = {i for (i,) in con.execute(" UNION ALL ".join(parts)).fetchall()}
        return ({kinds[i] for i in found if i < len(kinds)},
                {shared[i - len(kinds)] for i in found if i >= len(kinds)})

    def _find(self, con, todo: list[Edge], since: int) -> set[Edge]:
        slots = sorted({(t, col, pos) for t, col, pos, _ in todo})
        kids = sorted({child for *_, child in todo})
        parents = " UNION ALL ".join(
            f"SELECT {literal(t)} AS p, {literal(col)} AS c, {pos} AS k, "
            f"{q(col) + f'[{pos}]' if pos else q(col)} AS ch, ts FROM {t}" for t, col, pos in slots)
        children = " UNION ALL ".join(f"SELECT {literal(t)} AS t, out, ts FROM {t}" for t in kids)
        since = int(since)
        join = "SELECT a.p, a.c, a.k, b.t FROM ({}) a JOIN ({}) b ON b.out = a.ch"
        if since == 0:
            sql = join.format(parents, children)
        else:  # new parents with every child, every parent with new children
            new = "SELECT * FROM ({}) WHERE ts >= " + str(since)
            sql = f"{join.format(new.format(parents), children)} UNION ALL {join.format(parents, new.format(children))}"
        rows = con.execute(f"SELECT DISTINCT * FROM ({sql})").fetchall()
        wanted = set(todo)
        return {e for e in ((p, c, k, t) for p, c, k, t in rows) if e in wanted}
