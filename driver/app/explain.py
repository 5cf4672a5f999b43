"""Why each rewrite happened: the derivation of every written node that is not in the input graph.

This module owns the explanations of a saved e-graph (``relsat optimize --db``) and ``relsat explain``.

What saturation records (the runner, in the SQL that applies a rule, two statements per rule and round
plus one per right-side term; nothing loops over matches):

- ``explain_nodes(op, id, eclass, fresh, rule, round, mid)``: every e-node a rule added, the e-class it
  went into then (``fresh``: an e-class it made), the rule, the round and the match (``mid``);
- ``explain_matches(rule, round, mid, nodes, ops, roots, classes, bindings, terms)``: every match that added
  an e-node or queued a union: the e-nodes its left side's terms matched (least ids, term order), their op
  types, the pattern roots, the e-classes its e-class variables bound, every binding as JSON and the e-class
  each matched e-node was in then (term order; NULL in e-graphs saved before it was recorded);
- ``explain_unions(rule, round, mid, a, b)``: the unions those matches queued;
- the view ``explanations``: ``explain_nodes`` with its match and the node's e-class now.

An e-node without an ``explain_nodes`` row was imported: the input graph.  What the pipeline records here
(:func:`record_written`, with ``--db``): ``written_nodes(name, op_type, domain, inputs, outputs, node)``, the
nodes of the extracted graph as ONNX writes them and the e-node each came from, and
``input_values(name, eclass)``, every value name of the input model and the e-class it was imported as.

The chain of a node (:func:`chain`) is the set of applications it needs: the one that added it, then, for
every e-node that application matched and every e-class it bound that a rule made, the application that
added that e-node or made that e-class, down to imported e-nodes and e-classes; and for every e-class the
application saw (its roots, its e-class variables, the e-classes of the e-nodes it matched) that unions of
earlier rounds had made (``explain_unions``: an e-node can be in a matched e-class only because another
rule's union brought it there, ``x * 1`` with ``x``), the applications that queued those unions: the unions of
earlier rounds connected to that e-class.  Every step is from an earlier round than the one that needs it,
so a chain is finite and replays in round order.  (A merge that congruence made while rebuilding, with no
rule's union of its own, is not recorded: its e-class is followed only through recorded unions.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import typer

from relsat.driver.errors import RelsatError, error_line

# the tables a saved e-graph with explanations holds (the first two: any relsat e-graph)
_EGRAPH_TABLES = ("eclass", "uf", "explain_nodes", "explain_matches", "written_nodes", "input_values")


# ---------------------------------------------------------------- recording (the pipeline, with --db)
def record_written(graph, choice: dict[int, int]) -> None:
    """Store the written graph of ``choice`` (e-class -> e-node) in ``graph``'s e-graph: the nodes ONNX
    export writes for it, each with the e-node it came from (``written_nodes``), and the input's value
    names (``input_values``).  Only for an e-graph kept in a file (``--db``): an in-memory one is not kept."""
    from relsat.driver.boundary.onnx_export import export_graph

    g = graph.egraph
    if g.path is None:
        return
    model, origins = export_graph(graph, choice)[:2]
    nodes = list(model.graph.node)
    frame = {"name": np.array([n.name or (n.output[0] if n.output else "") for n in nodes], dtype=object),
             "op_type": np.array([n.op_type for n in nodes], dtype=object),
             "domain": np.array([n.domain for n in nodes], dtype=object),
             "inputs": np.array([json.dumps(list(n.input)) for n in nodes], dtype=object),
             "outputs": np.array([json.dumps(list(n.output)) for n in nodes], dtype=object),
             "node": np.asarray(origins, dtype=np.int64)}
    names = list(graph.values)
    values = {"name": np.array(names, dtype=object),
              "eclass": np.array([int(graph.values[n]) for n in names], dtype=np.int64)}
    with g.scratch("written") as tmp:
        w, v = tmp.register("nodes", frame), tmp.register("values", values)
        g.con.execute(f"CREATE OR REPLACE TABLE written_nodes AS SELECT name, op_type, domain, "
                      f"inputs::JSON::VARCHAR[] AS inputs, outputs::JSON::VARCHAR[] AS outputs, "
                      f"CASE WHEN node >= 0 THEN node END AS node FROM {w}")
        g.con.execute(f"CREATE OR REPLACE TABLE input_values AS SELECT name, eclass FROM {v}")


# ---------------------------------------------------------------- reading
@dataclass(frozen=True)
class Application:
    """One rule application of a chain: ``rule`` at match ``mid`` of ``round``."""

    rule: str
    round: int
    mid: int
    nodes: tuple[int, ...]  # the e-nodes its left side matched (term order)
    ops: tuple[str, ...]  # their op types
    roots: tuple[int, ...]  # the pattern roots' e-classes then
    classes: dict  # its e-class variables: ``?name`` -> the e-class bound then
    bindings: dict  # its other variables and lets: ``?name`` -> value
    added: tuple[tuple[str, int, int, bool], ...]  # the e-nodes it added: (op, id, e-class then, made it)
    terms: tuple[int, ...] = ()  # the e-class of each matched e-node then (term order; () if not recorded)


@dataclass
class Explanations:
    """The explanation tables of one saved e-graph, read once (a chain reads them many times)."""

    node_rows: dict  # e-node id -> (op, eclass, fresh, rule, round, mid)
    creator: dict  # e-class a rule made -> the e-node that made it
    apps: dict  # (rule, round, mid) -> Application
    imported: dict  # imported e-node id -> its op
    values: dict  # e-class at import -> the input's value names
    written: list  # (name, op_type, outputs, node)
    find: dict = field(default_factory=dict)  # displaced e-class -> its root
    unions: dict = field(default_factory=dict)  # e-class -> [(other e-class, round, (rule, round, mid))]

    @classmethod
    def read(cls, con) -> Explanations:
        node_rows, creator = {}, {}
        for op, nid, ec, fresh, rule, rnd, mid in con.execute(
                "SELECT op, id, eclass, fresh, rule, round, mid FROM explain_nodes").fetchall():
            node_rows[nid] = (op, ec, fresh, rule, rnd, mid)
            if fresh:
                creator[ec] = nid
        added: dict = {}
        for nid, (op, ec, fresh, rule, rnd, mid) in sorted(node_rows.items()):
            added.setdefault((rule, rnd, mid), []).append((op, nid, ec, fresh))
        apps = {}
        cols = {r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = "
                                          "'explain_matches' AND database_name = current_database()").fetchall()}
        terms = "terms" if "terms" in cols else "NULL::BIGINT[]"  # (not recorded by an older relsat)
        for rule, rnd, mid, nodes, ops, roots, classes, bindings, ts in con.execute(
                f"SELECT rule, round, mid, nodes, ops, roots, classes, bindings, {terms} FROM explain_matches"
                ).fetchall():
            apps[(rule, rnd, mid)] = Application(rule, rnd, mid, tuple(nodes), tuple(ops), tuple(roots),
                                                 _classes(classes), json.loads(bindings),
                                                 tuple(added.get((rule, rnd, mid), ())), tuple(ts or ()))
        unions: dict = {}
        for rule, rnd, mid, a, b in con.execute("SELECT rule, round, mid, a, b FROM explain_unions").fetchall():
            unions.setdefault(a, []).append((b, rnd, (rule, rnd, mid)))
            unions.setdefault(b, []).append((a, rnd, (rule, rnd, mid)))
        imported = dict(con.execute("SELECT id, op FROM enodes WHERE id NOT IN (SELECT id FROM explain_nodes)"
                                    ).fetchall())
        values: dict = {}
        for name, ec in con.execute("SELECT name, eclass FROM input_values ORDER BY name").fetchall():
            values.setdefault(ec, []).append(name)
        written = con.execute("SELECT name, op_type, outputs, node FROM written_nodes").fetchall()
        return cls(node_rows, creator, apps, imported, values, written,
                   dict(con.execute("SELECT id, root FROM uf").fetchall()), unions)

    def derived(self, node: int | None) -> bool:
        """Whether e-node ``node`` was added by a rule (not imported)."""
        return node is not None and node in self.node_rows

    def app_of(self, node: int) -> Application:
        """The application that added e-node ``node``."""
        op, ec, fresh, rule, rnd, mid = self.node_rows[node]
        return self.app_at((rule, rnd, mid))

    def union_apps(self, eclass: int, before: int) -> list[tuple]:
        """The applications (keys) whose unions, queued in rounds before ``before``, made e-class
        ``eclass`` what it was in round ``before``: every recorded union of those rounds connected to it."""
        keys, seen, stack = [], {eclass}, [eclass]
        while stack:
            for other, rnd, key in self.unions.get(stack.pop(), ()):
                if rnd < before:
                    keys.append(key)
                    if other not in seen:
                        seen.add(other)
                        stack.append(other)
        return keys

    def app_at(self, key: tuple) -> Application:
        """The application ``(rule, round, mid)``; one without a recorded match (a multi-pattern application
        the cycle filter dropped after its nodes were built) has no matched e-nodes."""
        app = self.apps.get(key)
        if app is None:
            added = sorted((r[0], n, r[1], r[2]) for n, r in self.node_rows.items() if r[3:] == key)
            app = Application(*key, (), (), (), {}, {}, tuple(sorted(added, key=lambda a: a[1])))
        return app

    def chain(self, node: int) -> list[Application]:
        """The applications that derive e-node ``node`` from the input, in the order they replay (round,
        rule, match): the one that added it, and recursively those that added the e-nodes it matched or
        made the e-classes it bound, and those whose unions made the e-classes it matched in (each
        application once: no loops)."""
        seen: dict = {}
        stack = [self.app_of(node)] if self.derived(node) else []
        while stack:
            app = stack.pop()
            key = (app.rule, app.round, app.mid)
            if key in seen:
                continue
            seen[key] = app
            stack += [self.app_of(m) for m in app.nodes if self.derived(m)]
            classes = app.roots + tuple(app.classes.values())
            stack += [self.app_of(self.creator[c]) for c in classes if c in self.creator]
            for c in dict.fromkeys(classes + app.terms):
                stack += [self.app_at(k) for k in self.union_apps(c, app.round) if k not in seen]
        return sorted(seen.values(), key=lambda a: (a.round, a.rule, a.mid))

    def name_class(self, c: int) -> str:
        """An e-class as recorded in a match: the input value it was imported as, or the e-node that made it."""
        if c in self.values:
            return f"e-class {c} (input {', '.join(repr(v) for v in self.values[c][:3])})"
        if c in self.creator:
            n = self.creator[c]
            return f"e-class {c} (made by {self.node_rows[n][0]}#{n})"
        return f"e-class {c}"

    def name_node(self, n: int) -> str:
        if self.derived(n):
            op, _, _, rule, rnd, _ = self.node_rows[n]
            return f"{op}#{n} (round {rnd}, {rule})"
        return f"{self.imported.get(n, '?')}#{n} (input)"


def explain_text(ex: Explanations, node: str | None = None, *, db: str = "the e-graph") -> str:
    """The chains of the written nodes that are not in the input graph (or of the one named ``node``:
    a written node's name or one of its output names), as text."""
    written = ex.written
    if node is not None:
        written = [w for w in written if w[0] == node or node in (w[2] or [])]
        if not written:
            raise RelsatError(f"{db}: no written node is named {node!r} (relsat query {db} "
                              "\"SELECT name, op_type FROM written_nodes\" lists them)")
    lines, shown = [], 0
    for name, op_type, outputs, nid in written:
        if not ex.derived(nid):
            if node is not None:
                what = "an output name (Identity)" if nid is None else f"{ex.name_node(nid)}"
                lines.append(f"{name} ({op_type}): in the input graph: {what}; no rewrite derived it")
            continue
        shown += 1
        steps = ex.chain(nid)
        op, ec, *_ = ex.node_rows[nid]
        lines.append(f"{name} ({op_type}, e-node {op}#{nid}): derived from the input in {len(steps)} "
                     f"rule application{'s' if len(steps) != 1 else ''}:")
        for i, a in enumerate(steps, 1):
            lines.append(f"  {i}. round {a.round}, rule {a.rule}, match {a.mid}: roots "
                         f"{', '.join(ex.name_class(c) for c in a.roots)}")
            lines.append(f"     matched {', '.join(ex.name_node(m) for m in a.nodes) or '(not recorded)'}")
            if a.classes:
                lines.append(f"     e-classes {'; '.join(f'{k} = {ex.name_class(c)}' for k, c in a.classes.items())}")
            if a.bindings:
                lines.append(f"     values {' '.join(f'{k}={json.dumps(v)}' for k, v in a.bindings.items())}")
            adds = [f"{o}#{n} into e-class {c}{' (new)' if f else ''}" for o, n, c, f in a.added]
            lines.append(f"     added {', '.join(adds) if adds else 'nothing new (a union)'}")
    if not lines:
        lines.append("every written node is in the input graph: no rewrite derived any of them")
    elif node is None:
        lines.append(f"{shown} of {len(written)} written node(s) are not in the input graph")
    return "\n".join(lines)


def open_explanations(db: Path) -> Explanations:
    """The explanations of the saved e-graph ``db``, read through a read-only connection that can read
    nothing else; a file that is not a relsat e-graph with explanations is a one-line RelsatError."""
    import duckdb

    from relsat.driver.boundary.outputs import open_egraph_readonly

    db = Path(db)
    con = open_egraph_readonly(db)
    try:
        have = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'egraph' "
                                          "UNION ALL SELECT view_name FROM duckdb_views() "
                                          "WHERE database_name = 'egraph'").fetchall()}
        if not {"eclass", "uf", "enodes"} <= have:
            raise RelsatError(f"{db}: not a relsat e-graph (relsat optimize --db writes one)")
        missing = [t for t in _EGRAPH_TABLES if t not in have]
        if missing:
            raise RelsatError(f"{db}: this e-graph has no explanations ({', '.join(missing)} missing): it was saved "
                              "by an older relsat or before a graph was extracted; run relsat optimize --db again")
        try:
            return Explanations.read(con)
        except duckdb.Error as e:
            raise RelsatError(f"{db}: cannot read its explanations: {error_line(e)}") from None
    finally:
        con.close()


def explain(egraph: Path = typer.Argument(..., help="a saved e-graph (relsat optimize --db)"),
            node: Optional[str] = typer.Option(None, "--node", help="a written node's name (or one of its outputs)"),
            ) -> None:
    """Why each rewrite happened: the rule applications that derived each written node not in the input.

    For every written node that is not in the input graph (or the one named), the chain of rule
    applications (rule, round, matched e-classes and e-nodes) that derived it from the input."""
    try:
        text = explain_text(open_explanations(egraph), node, db=str(egraph))
    except RelsatError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(text)


def _classes(value) -> dict:
    """``explain_matches.classes``: JSON ``{"?var": e-class}`` (a MAP in databases of an older relsat)."""
    return json.loads(value) if isinstance(value, str) else dict(value or {})
