"""Saved e-graph states: copies of the e-graph's tables that a search can return to.

A search over e-graphs (MCTS over rule applications, backtracking over single rewrites) needs
to branch: apply something to a state, and later apply something else to the same state.
``States`` keeps each saved state as an in-memory database attached to the e-graph's own
connection, copied with one ``COPY FROM DATABASE`` (tables, views, macros and sequences, ids
included), and makes a state current with ``USE``: every statement of ``EGraph``, the runner
and the cost models then reads and writes that copy, unqualified, as it would the home
database.  The home database (in memory, or the ``--db`` file) is untouched until ``adopt``
copies a chosen state into it.

- ``save()``: the current tables as a new state (the current database stays current);
- ``checkout(state)``: a fresh working copy of ``state`` becomes current (the state itself stays
  as it was, so it can be checked out again);
- ``freeze()``: the current working copy becomes a state without a copy;
- ``adopt(state)``: the home database takes the state's contents, and becomes current;
- ``drop(state)`` / ``close()``: detach states (``close`` all of them, back home).

The e-graph's Python-side fields (live tables, rebuild pass, constness flag) travel with each
state.  A copy costs a few ms per table whatever the search does with it; a state's memory is
that of its tables (``States.saved`` counts them).
"""

from __future__ import annotations

from dataclasses import dataclass

from .egraph import EGraph
from .schema import q


@dataclass(frozen=True)
class State:
    name: str  # the attached database holding it
    live: frozenset
    pass_no: int
    const_dirty: bool


class States:
    """The saved states of one e-graph (module docstring)."""

    def __init__(self, g: EGraph) -> None:
        self.g = g
        self.home = g.con.execute("SELECT current_database()").fetchall()[0][0]
        self._n = 0
        self._work: str | None = None  # the current working copy, when not home and not a saved state
        self._saved: set[str] = set()
        self._home = self._state(self.home)  # the home database's Python-side fields

    @property
    def saved(self) -> int:
        return len(self._saved)

    def _current(self) -> str:
        return self.g.con.execute("SELECT current_database()").fetchall()[0][0]

    def _copy(self, source: str) -> str:
        self._n += 1
        name = f"_state{self._n}"
        self.g.con.execute(f"ATTACH ':memory:' AS {name}")
        self.g.con.execute(f"COPY FROM DATABASE {q(source)} TO {name}")
        return name

    def _state(self, name: str) -> State:
        g = self.g
        return State(name, frozenset(g.live), g.pass_no, g.const_dirty)

    def _use(self, state: State | None, name: str) -> None:
        g = self.g
        g.con.execute(f"USE {q(name)}")
        if state is not None:
            g.live, g.pass_no, g.const_dirty = set(state.live), state.pass_no, state.const_dirty

    def _release_work(self) -> None:
        if self._work is not None and self._work not in self._saved:
            self.g.con.execute(f"DETACH {self._work}")
        self._work = None

    def save(self) -> State:
        """The current tables as a new saved state; the current database stays current."""
        name = self._copy(self._current())
        self._saved.add(name)
        return self._state(name)

    def checkout(self, state: State) -> None:
        """Make a fresh copy of ``state`` current (the previous working copy is dropped)."""
        work = self._copy(state.name)
        self._use(state, work)
        self._release_work()
        self._work = work

    def freeze(self) -> State:
        """The current working copy becomes a saved state (no copy).  It stays current: check out a
        state before changing anything again."""
        if self._work is None:
            return self.save()
        name, self._work = self._work, None
        self._saved.add(name)
        return self._state(name)

    def drop(self, state: State) -> None:
        if state.name in self._saved:
            if self._current() == state.name:
                self.g.con.execute(f"USE {q(self.home)}")
            self._saved.discard(state.name)
            self.g.con.execute(f"DETACH {state.name}")

    def adopt(self, state: State) -> None:
        """The home database takes ``state``'s tables and sequences and becomes current.  A table
        in both keeps the home's definition (its defaults and keys); one only in the state is
        created; one only at home is emptied.  Views and macros read the tables by name."""
        con, home = self.g.con, q(self.home)
        con.execute(f"USE {home}")
        tables = lambda db: {r[0] for r in con.execute(  # noqa: E731
            "SELECT table_name FROM duckdb_tables() WHERE database_name = ? AND schema_name = 'main'", [db]).fetchall()}
        theirs, ours = tables(state.name), tables(self.home)
        for t in sorted(ours):
            con.execute(f"DELETE FROM {home}.main.{q(t)}")
            if t in theirs:
                con.execute(f"INSERT INTO {home}.main.{q(t)} BY NAME SELECT * FROM {state.name}.main.{q(t)}")
        for t in sorted(theirs - ours):
            con.execute(f"CREATE TABLE {home}.main.{q(t)} AS SELECT * FROM {state.name}.main.{q(t)}")
        for seq, start in con.execute(
                "SELECT sequence_name, coalesce(last_value, start_value - increment_by) + increment_by "
                "FROM duckdb_sequences() WHERE database_name = ?", [state.name]).fetchall():
            con.execute(f"DROP SEQUENCE IF EXISTS {home}.main.{q(seq)}")
            con.execute(f"CREATE SEQUENCE {home}.main.{q(seq)} START {int(start)}")
        self._use(state, self.home)
        self._home = self._state(self.home)

    def close(self) -> None:
        """Detach every state and working copy; the home database is current again."""
        con = self.g.con
        self._use(self._home, self.home)
        self._release_work()
        for name in sorted(self._saved):
            con.execute(f"DETACH {name}")
        self._saved.clear()
