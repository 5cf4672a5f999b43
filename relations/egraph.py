"""The e-graph: DuckDB tables plus set-oriented insertion, union and rebuild.

``EGraph`` owns a DuckDB connection (in memory, or a file the user keeps).
Every operation is a fixed number of SQL statements per operator table:

* ``insert_from(op, source_sql)`` hash-conses a batch of nodes: every candidate
  row is looked up by key first (one left join), only missing keys get their
  shape, dtype and constness from the catalog's SQL rules, invalid ones are
  dropped, new keys get fresh node ids and either a fresh e-class or, with
  ``target``, the e-class a rule's match says they equal; the result table
  carries the source's columns and each row's e-class.  What is inserted and the
  ids it gets do not depend on row order or threads: a LIMIT keeps the least
  keys, ids are given in key order.
* ``union(a, b)`` queues pairs (``union_agreeing``: only those whose e-classes
  agree in shape and dtype, a rule's matches that hold; ``insert_from(...,
  conflicts="drop")`` likewise leaves out a new node whose target disagrees);
  ``rebuild()`` merges them: connected components
  by min-label propagation (one recursive CTE keyed by node), analyses merged (a
  shape conflict is an error naming both e-classes), the union-find table
  (displaced ids only) extended, and in each op table that holds a row over a
  displaced id (one statement finds them) those rows rewritten and regrouped by key (congruent rows collapse to the oldest, their
  e-classes queued for union), the whole table when most rows move, repeated
  until nothing new is unioned.  Nothing runs when nothing was unioned.

Python never loops over rows or e-nodes here.

Temp tables: a method's working tables (and the numpy frames it registers) are
named for its call (``_Scratch``: ``_insert12_keys``, ``_rebuild3_map``) and
dropped when it returns or raises, so a method called while another's tables
exist (a nested call, a hook, a second user of the connection) neither reads
nor overwrites them.  What one method hands another is passed by name: the new
nodes ``insert_from`` checks (``_check_targets(fresh, target)``), the displaced-id map a
rebuild pass reads (``_components``, ``_merge_analyses``, ``_touched``,
``_recanonicalize``: ``mapping``); a rebuild hands its scratch to the helpers
it calls, so their tables are the rebuild's, replaced from pass to pass and
dropped once.  The one table that outlives its call is ``insert_from``'s result
(``InsertResult.table``), which the caller names or gets named and drops.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np

from .catalog import OPS, BY_TYPE, OpDef
from .rules import attr_columns, rule_select
from .schema import key_columns, literal, q, tables_ddl, views_ddl


def usable_cpus() -> int:
    """The cores this process may run on: its CPU affinity where the system has one (``taskset``, a cpuset), else
    the machine's. DuckDB's default thread count is the machine's, so a process pinned to one core (``taskset``) ran
    as many threads on it as the machine has cores (on 2 cores, ac-add n = 12 took as long either way: measured)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


IN_PLACE_SHARE = 8  # a build whose looked-up rows lack a node on at most one in this many fills those in place


class InvariantError(AssertionError):
    """An e-graph invariant (canonical children, congruence, one shape per e-class) is broken."""


def classes_agree(a: str, b: str) -> str:
    """SQL: whether e-class rows ``a`` and ``b`` (aliases of ``eclass``, LEFT JOINed: a missing one agrees) have one
    shape, dtype and tuple shapes: what a union of the two needs (else a ShapeConflict)."""
    return (f"({a}.id IS NULL OR {b}.id IS NULL OR {a}.shape IS NOT DISTINCT FROM {b}.shape AND {a}.dtype IS NOT "
            f"DISTINCT FROM {b}.dtype AND {a}.tuple_shapes IS NOT DISTINCT FROM {b}.tuple_shapes)")


class ShapeConflict(ValueError):
    """Two e-classes with different shapes or dtypes were unioned."""


@dataclass
class RebuildReport:
    passes: int = 0
    unions: int = 0  # distinct ids displaced
    congruences: int = 0  # union pairs found by congruence
    seconds: float = 0.0
    skipped: bool = False


class _Scratch:
    """The temp tables of one call of an ``EGraph`` method: names unique to the call
    (``_<call><n>_<part>``), dropped on leaving the ``with`` block (also when it raises).

    ``create`` makes (or, called again with the same part, replaces) a table; ``claim`` only names
    one that a callee is told to create; ``keep`` adds a table named elsewhere to those dropped;
    ``register`` registers a numpy frame as a view.  A call may hand its scratch to the methods it
    calls: their tables are then the call's, replaced from one use to the next and dropped once."""

    def __init__(self, g: EGraph, call: str) -> None:
        self.g = g
        self.prefix = f"_{call}{next(g._calls)}_"
        self.made: list[str] = []
        self.frames: list[str] = []

    def name(self, part: str) -> str:
        """A name in this call's namespace that is not dropped on exit (a result for the caller)."""
        return self.prefix + part

    def claim(self, part: str) -> str:
        t = self.prefix + part
        self.keep(t)
        return t

    def keep(self, table: str) -> None:
        if table not in self.made:
            self.made.append(table)

    def create(self, part: str, sql: str) -> str:
        return self.counted(part, sql)[0]

    def counted(self, part: str, sql: str) -> tuple[str, int]:
        """``create``, and the table's row count (DuckDB answers a CREATE ... AS with it: no count query)."""
        t = self.claim(part)
        return t, self.g.con.execute(f"CREATE OR REPLACE TEMP TABLE {t} AS {sql}").fetchall()[0][0]

    def register(self, part: str, frame) -> str:
        name = self.prefix + part
        self.g.con.register(name, frame)
        self.frames.append(name)
        return name

    def __enter__(self) -> _Scratch:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        con = self.g.con
        try:
            for name in self.frames:
                con.unregister(name)
            for t in self.made:
                con.execute(f"DROP TABLE IF EXISTS {t}")
        except duckdb.Error:
            if kind is None:  # on the way out of an error, that error is the one to see
                raise


@dataclass
class InsertResult:
    table: str  # temp table (rid, out, the carried source columns) for every source row that has a node;
    # the caller's to drop
    new_nodes: int = 0
    targeted: int = 0  # new nodes placed straight into their target e-class
    conflicts: int = 0  # rows left out (``conflicts="drop"``): their node's shape or dtype is not their target's


@dataclass
class EGraph:
    """An e-graph kept as DuckDB tables; ``path=None`` keeps it in memory."""

    path: str | Path | None = None
    read_only: bool = False
    memory_limit: str | None = None  # DuckDB's memory_limit ('16GB'); past it, operators spill to temp_dir
    temp_dir: str | Path | None = None  # where DuckDB spills (default: beside the file, or none in memory)
    con: duckdb.DuckDBPyConnection = field(init=False, repr=False)
    tensors: dict = field(init=False, repr=False, default_factory=dict)  # weight ref -> np.ndarray
    live: set = field(init=False, default_factory=set)  # op tables that hold rows
    pass_no: int = field(init=False, default=0)
    _columns: dict = field(init=False, repr=False, default_factory=dict)  # insert source SQL -> its column names
    const_dirty: bool = field(init=False, default=False)  # constness changed outside a rebuild
    _calls: itertools.count = field(init=False, repr=False, default_factory=itertools.count)  # numbers the
    # calls' temp tables (``_Scratch``)

    def __post_init__(self) -> None:
        config = {"threads": usable_cpus()}  # (DuckDB's default counts the machine's cores, not the process's)
        if self.memory_limit is not None:
            config["memory_limit"] = str(self.memory_limit)
        if self.temp_dir is not None:
            config["temp_directory"] = str(self.temp_dir)
        self.con = duckdb.connect(str(self.path) if self.path else ":memory:", read_only=self.read_only,
                                  config=config)
        if not self.read_only:
            for stmt in tables_ddl():
                self.con.execute(stmt)
            self._migrate()
            for stmt in views_ddl():
                self.con.execute(stmt)
        tables = [op.table for op in OPS] + ["op_opaque"]
        counts = self.con.execute(
            " UNION ALL ".join(f"SELECT '{t}', count(*), coalesce(max(touched), 0) FROM {t}" for t in tables)
        ).fetchall()
        self.live = {t for t, n, _ in counts if n}
        self.pass_no = max(p for _, _, p in counts)

    def _migrate(self) -> None:
        """A database saved by an older relsat, opened for writing: its ``explain_matches`` table (``classes`` a
        MAP in the oldest, no ``terms`` in older ones) goes into ``explain_match_rows`` as it was (``ops`` and
        ``classes`` in every row), so the view of that name reads its rows and the new ones alike."""
        c = self.con
        cols = dict(c.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'explain_matches' "
                              "AND database_name = current_database() AND table_name IN (SELECT "
                              "table_name FROM duckdb_tables() WHERE database_name = current_database())").fetchall())
        if not cols:
            return
        classes = "to_json(classes)" if cols.get("classes", "").startswith("MAP") else "classes"
        terms = "terms" if "terms" in cols else "NULL"
        c.execute("BEGIN TRANSACTION")  # (all or nothing: a migration cut short leaves the old table as it was)
        try:
            c.execute("INSERT INTO explain_match_rows (rule, round, mid, nodes, roots, bindings, terms, ops, classes) "
                      f"SELECT rule, round, mid, nodes, roots, bindings, {terms}, ops, {classes} FROM explain_matches")
            c.execute("DROP VIEW IF EXISTS explanations")
            c.execute("DROP TABLE explain_matches")
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.con.close()

    def sql(self, query: str, params=None):
        return self.con.execute(query, params or []).fetchall()

    def scratch(self, call: str) -> _Scratch:
        """Temp tables for one call on this e-graph's connection (``with g.scratch("name") as tmp``):
        named for the call, dropped at the end of the block."""
        return _Scratch(self, call)

    # ---------------------------------------------------------------- insert
    def insert_from(self, op: OpDef, source: str, *, ts: int = 0, limit: int | None = None,
                    result: str | None = None, target: str | None = None, changed_only: bool = False,
                    columns: list[str] | None = None, origin: str | None = None, rid: str = "rid",
                    conflicts: str = "raise") -> InsertResult:
        """Hash-cons the nodes described by ``source`` (a SELECT or table with ``rid``, the op's
        child columns and any attribute columns; omitted attributes take their defaults; leaves
        also give ``shape`` and ``dtype``).  At most ``limit`` new nodes are added.

        The result table (``result``, or a name of this call's: ``InsertResult.table``, which the
        caller drops) holds, for every source row that has a node, the row's other source
        columns (carried through, so a later step needs no join back by ``rid``), its key columns
        (attributes canonicalised) and ``out``, the node's e-class.  ``source`` must not have an
        ``out`` column; ``columns``: its column names, when the caller knows them (else they are
        looked up once per source text).

        ``target`` names a source column holding an existing canonical e-class that the row's node
        is known to equal (the root of a rule's match): a new node goes straight into that e-class
        instead of a fresh one, which saves an e-class and a union per new node.  Its shape must
        agree with the e-class's (else ShapeConflict; with ``conflicts="drop"`` such a new node is left out, like one
        the shape rule rejects, and counted in ``InsertResult.conflicts``: a rule's match it does not hold for);
        a constant node makes the e-class constant.
        ``changed_only`` (with ``target``): the result keeps only the rows whose node is not in their
        target e-class (the rows a union still has to join), most rows of a late round dropped unwritten.

        Every row is looked up by key first (one left join); only keys not found pay for the shape
        rule's joins with ``eclass`` (except ops whose key canonicalisation needs shapes, and leaves).
        The statements run are the same whatever the data, so their number per round stays fixed.

        Deterministic: the ``limit`` keeps the new keys that sort first, a new key wanted by several
        rows goes into the least of their targets, and new nodes (and new e-classes) are numbered
        in key order, so the same input gives the same rows and ids whatever DuckDB's threads do.

        ``origin`` (a rule's name): every new node is recorded in ``explain_nodes`` as added by that rule in
        round ``ts``, with its e-class, whether it made that e-class, and its source row's ``rid`` (a match).

        ``rid``: the name of the source's row-id column, where it is not ``rid`` (a rule's builds number their rows
        by ``mid``, which the result carries: one column of every match row less to write: 15-27 % of an
        11-million-row key lookup, synthetic).

        An op whose keys are canonicalised first (``canon`` attributes, leaves) and whose keys all exist adds nothing:
        then no statement numbers or inserts nodes (five statements less, as for the other ops)."""
        with self.scratch("insert") as tmp:
            result = result or tmp.name("result")
            return self._insert(op, source, tmp, ts=ts, limit=limit, result=result, target=target,
                                changed_only=changed_only, columns=columns, origin=origin, rid=rid,
                                conflicts=conflicts)

    def _insert(self, op: OpDef, source: str, tmp: _Scratch, *, ts: int, limit: int | None, result: str,
                target: str | None, changed_only: bool, columns: list[str] | None,
                origin: str | None = None, rid: str = "rid", conflicts: str = "raise") -> InsertResult:
        """``insert_from`` with its working tables in ``tmp``."""
        c = self.con
        src = columns or self._columns.get(source)
        if src is None:  # the sources (a compiled build) name their columns: same text, same names
            src = self._columns[source] = [r[0] for r in c.execute(f"DESCRIBE SELECT * FROM ({source})").fetchall()]
        keys = key_columns(op)
        keysel = ", ".join(q(k) for k in keys)
        on = " AND ".join(f"o.{q(k)} IS NOT DISTINCT FROM c.{q(k)}" for k in keys)
        # the same nodes and ids whatever the threads: rows sharing a new key are represented by the
        # one with the least target, the LIMIT keeps the least keys, and ids follow the key order
        pick = f" ORDER BY {keysel}, {q(target)}" if target else ""
        extra = (target,) if target else ()
        # changed_only: the result rows a union needs (node not in its target e-class)
        moved = (lambda node, row: f" AND {node}out <> {row}{q(target)}") if target and changed_only else \
            (lambda node, row: "")
        lookup = not op.canon and not op.leaf  # keys known before the shape rule: looked up first
        if lookup:
            given = [a for a in op.attrs if a.name in src]
            repl = f" REPLACE ({', '.join(f'b.{q(a.name)}::{a.sql_type} AS {q(a.name)}' for a in given)})" if given else ""
            defaults = [x for x in attr_columns(op, src) if not x.startswith("b.")]
            cols = ", ".join([f"b.*{repl}"] + defaults)
            # changed_only: a row whose node is there already in its target e-class is of no use (most rows of a
            # late round), so it is not kept
            unused = f" WHERE o.out IS NULL OR o.out <> c.{q(target)}" if target and changed_only else ""
            looked, rows = tmp.counted("keys", f"SELECT c.*, o.out FROM (SELECT {cols} FROM ({source}) b) c "
                                               f"LEFT JOIN {op.table} o ON {on}{unused}")
            missing_rows = c.execute(f"SELECT count(*) FROM {looked} WHERE out IS NULL").fetchall()[0][0]
            # where every looked-up row with a node is a result row (no ``moved`` filter) and few rows lack one, those
            # few get their node in place and the table becomes the result (copying 16.7M rows to give 181 of them
            # their node took 0.8 s at ac-add n = 13)
            in_place = not (target and changed_only) and missing_rows * IN_PLACE_SHARE <= rows
            if not missing_rows:
                # every row's node is there already (common in late rounds): no shape rules to run
                if in_place:
                    self._rename(looked, result)
                else:
                    c.execute(f"CREATE OR REPLACE TEMP TABLE {result} AS SELECT * FROM {looked} WHERE true"
                              f"{moved('', '')}")
                return InsertResult(result)
            # one row per missing key (hashed, not sorted): any rid, the least target, and whether rows of the
            # key name other targets (``_split``: only those rows can be in another e-class than the key's node)
            least = f", min({q(target)}) AS {q(target)}, min({q(target)}) <> max({q(target)}) AS _split" \
                if target else ""
            missing = f"SELECT {keysel}, min({q(rid)}) AS rid{least} FROM {looked} WHERE out IS NULL GROUP BY ALL"
            fresh, fresh_rows = tmp.counted("cand", rule_select(op, missing, given=set(keys),
                                                                carry=extra + (("_split",) if target else ()),
                                                                valid_only=True))
        else:
            if rid != "rid":  # (the shape rules read ``rid``: these ops' rows are few)
                source, src = f"SELECT *, {q(rid)} AS rid FROM ({source})", [*src, "rid"]
            carried = tuple(x for x in src if x not in keys and x != "rid")
            cand = tmp.create("cand", rule_select(op, source, given=src, carry=carried, valid_only=True))
            fresh, fresh_rows = tmp.counted("fresh", f"SELECT DISTINCT ON ({keysel}) * FROM {cand} c "
                                                     f"WHERE NOT EXISTS (SELECT 1 FROM {op.table} o WHERE {on}){pick}")
            if not fresh_rows:  # every key's node is there already: nothing to number or insert
                self._found(op, cand, result, on, moved)
                return InsertResult(result)
        if limit is not None and fresh_rows > limit:
            # the least keys (sorted for only when the limit cuts)
            fresh = tmp.create("fresh", f"SELECT * FROM {fresh} ORDER BY {keysel} LIMIT {int(limit)}")
        # new nodes numbered in key order (those with a fresh e-class first); a statement takes one
        # contiguous block of each sequence, so the block's least value plus that number is an id
        # that does not depend on the order in which threads happened to draw the values
        tgt = f"{q(target)} IS NOT NULL" if target else "false"
        cls = "min(_cid) OVER () + _k - 1"
        out = f"coalesce({q(target)}, {cls})" if target else cls
        # with a target, the rows numbered carry no analysis (a rule's nodes go into their targets: the sort that
        # numbers them then moves keys, not shape lists; the few that make an e-class take theirs from ``fresh``)
        analysis = "" if target else "o_shape, o_dtype, o_const, o_tshapes, o_tdtypes, "
        split = "_split, " if target and lookup else ""
        dropped = self._check_targets(fresh, q(target), drop=conflicts == "drop") if target else 0
        new, added = tmp.counted(
            "new", f"SELECT min(_nid) OVER () + _k - 1 AS id, {keysel}, {out} AS out, "
            f"tgt, {split}{analysis}rid FROM (SELECT nextval('node_seq') AS _nid, "
            f"CASE WHEN NOT tgt THEN nextval('class_seq') END AS _cid, * FROM (SELECT row_number() OVER "
            f"(ORDER BY {tgt}, {keysel}) AS _k, {tgt} AS tgt, {keysel}, {q(target) + ', ' if target else ''}"
            f"{split}{analysis}rid FROM {fresh}))")
        c.execute(f"INSERT INTO {op.table} (id, {keysel}, out, ts) SELECT id, {keysel}, out, {int(ts)} FROM {new}")
        if origin is not None and added:
            c.execute(f"INSERT INTO explain_nodes SELECT {literal(op.op_type)}, id, out, NOT tgt, {literal(origin)}, "
                      f"{int(ts)}, rid FROM {new}")
        if not target:
            classes = c.execute(f"INSERT INTO eclass SELECT out, o_shape, o_dtype, o_const, o_tshapes, o_tdtypes, "
                                f"{int(ts)} FROM {new} WHERE NOT tgt").fetchall()[0][0]
        else:  # (the join's build side, the new nodes without a target, is empty in a rule's root build)
            same = " AND ".join(f"n.{q(k)} IS NOT DISTINCT FROM f.{q(k)}" for k in keys)
            classes = c.execute(f"INSERT INTO eclass SELECT n.out, f.o_shape, f.o_dtype, f.o_const, f.o_tshapes, "
                                f"f.o_tdtypes, {int(ts)} FROM {new} n JOIN {fresh} f ON {same} "
                                "WHERE NOT n.tgt").fetchall()[0][0]
        targeted = added - classes  # the new nodes that went into their target e-class (no e-class of their own)
        if added:
            self.live.add(op.table)
        if lookup and in_place:
            c.execute(f"UPDATE {looked} c SET out = o.out FROM {new} o WHERE c.out IS NULL AND {on}")
            c.execute(f"DELETE FROM {looked} WHERE out IS NULL")  # (keys the limit or the shape rule left out)
            self._rename(looked, result)
        elif lookup:
            # (changed_only: a row whose node is new is in another e-class only where its key was split)
            only = " AND o._split" if split and changed_only else ""
            c.execute(f"CREATE OR REPLACE TEMP TABLE {result} AS SELECT * FROM {looked} WHERE out IS NOT NULL"
                      f"{moved('', '')} UNION ALL SELECT c.* REPLACE (o.out AS out) FROM {looked} c JOIN {new} o ON {on} "
                      f"WHERE c.out IS NULL{only}{moved('o.', 'c.')}")
        else:
            self._found(op, cand, result, on, moved)
        return InsertResult(result, added, targeted, dropped)  # (the working tables, large in big rounds, go now)

    def _found(self, op: OpDef, cand: str, result: str, on: str, moved) -> None:
        """The result of an insert whose rows were canonicalised first (``cand``): each valid row with its
        node's e-class, found by key (``moved``: the filter of ``changed_only``)."""
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {result} AS SELECT c.* EXCLUDE (o_shape, o_dtype, o_const, "
                         f"o_tshapes, o_tdtypes), o.out FROM {cand} c JOIN {op.table} o ON {on} WHERE true"
                         f"{moved('o.', 'c.')}")

    def _rename(self, table: str, name: str) -> None:
        """Temp table ``table`` renamed ``name`` (one of that name replaced): a working table that is the result."""
        self.con.execute(f"DROP TABLE IF EXISTS {name}")
        self.con.execute(f"ALTER TABLE {table} RENAME TO {name}")

    def _check_targets(self, fresh: str, target: str, drop: bool = False) -> int:
        """New nodes to be placed into existing e-classes (rows of table ``fresh`` with column ``target`` set):
        their shapes must agree (``drop``: the rows that do not are deleted, and counted); constness spreads."""
        c = self.con
        differ = (f"e.id = n.{target} AND (n.o_shape IS DISTINCT FROM e.shape OR n.o_dtype IS DISTINCT FROM e.dtype "
                  "OR n.o_tshapes IS DISTINCT FROM e.tuple_shapes)")
        dropped = 0
        if drop:  # (one statement, as the check it replaces)
            dropped = c.execute(f"DELETE FROM {fresh} n USING eclass e WHERE {differ}").fetchall()[0][0]
            bad = []
        else:
            bad = c.execute(f"SELECT n.{target}, n.o_shape, e.shape, n.o_dtype, e.dtype FROM {fresh} n, eclass e "
                            f"WHERE {differ} LIMIT 1").fetchall()
        if bad:
            cid, s, es, d, ed = bad[0]
            raise ShapeConflict(f"a node of shape {s} (dtype {d}) was derived equal to e-class {cid} "
                                f"(shape {es}, dtype {ed}); nodes {self._describe_class(cid)}")
        made = c.execute(f"UPDATE eclass SET is_const = true FROM (SELECT DISTINCT {target} AS out FROM {fresh} "
                         "WHERE o_const) k WHERE eclass.id = k.out AND NOT eclass.is_const").fetchall()[0][0]
        if made:
            self.const_dirty = True
        return dropped

    def add(self, op_type: str, children: dict | None = None, attrs: dict | None = None, *,
            n: int | None = None, ts: int = 0) -> np.ndarray:
        """Batch-add nodes of one operator from numpy columns; returns each row's e-class id.

        ``children`` maps child columns to int64 arrays (-1 = absent optional input);
        ``attrs`` maps attribute names to arrays or to one literal shared by all rows
        (list attributes: a literal list, or an array of JSON strings); leaves (Input,
        Weight) also take ``shape`` (literal or JSON strings) and ``dtype``."""
        op = BY_TYPE[op_type]
        children, attrs = dict(children or {}), dict(attrs or {})
        if n is None:
            sizes = [len(v) for v in children.values()] + [
                len(v) for v in attrs.values() if isinstance(v, np.ndarray)]
            n = sizes[0] if sizes else 1
        frame = {"rid": np.arange(n, dtype=np.int64)}
        select = ["rid"]
        for name, col in children.items():
            if op.variadic and name == op.inputs[0].column:  # one sequence of child ids per row
                lens = [len(r) for r in col]
                flat = self.find(np.concatenate([np.asarray(r, dtype=np.int64) for r in col]))
                rows = np.split(flat, np.cumsum(lens)[:-1])
                frame[name] = np.array([json.dumps(r.tolist()) for r in rows], dtype=object)
                select.append(f"{q(name)}::VARCHAR::BIGINT[] AS {q(name)}")
                continue
            col = np.asarray(col, dtype=np.int64)
            frame[name] = np.where(col == -1, col, self.find(col))
            select.append(q(name))
        leaf_kinds = {"shape": "ints", "dtype": "int"} if op.leaf else {}
        for name, val in attrs.items():
            kind = leaf_kinds[name] if name in leaf_kinds else op.attr(name).kind
            if isinstance(val, np.ndarray):
                frame[name] = val
                expr = f"{q(name)}::VARCHAR::{'BIGINT[]' if kind == 'ints' else 'DOUBLE[]'}" \
                    if kind in ("ints", "floats") else q(name)
                select.append(f"{expr} AS {q(name)}")
            else:
                select.append(f"{literal(val)} AS {q(name)}")
        with self.scratch("add") as tmp:
            batch = tmp.register("batch", frame)
            res = self.insert_from(op, f"SELECT {', '.join(select)} FROM {batch}", ts=ts, result=tmp.claim("result"),
                                   columns=["rid", *children, *attrs])
            out = self.con.execute(f"SELECT rid, out FROM {res.table} ORDER BY rid").fetchnumpy()
        result = np.full(n, -1, dtype=np.int64)
        result[out["rid"]] = out["out"]
        if (result < 0).any():
            bad = int(np.flatnonzero(result < 0)[0])
            raise ShapeConflict(f"{op_type} row {bad}: the shape rule rejects its inputs or attributes")
        return result

    # ------------------------------------------------------------------ union
    def union(self, a, b) -> None:
        """Queue unions of e-class pairs (arrays); ``rebuild()`` applies them."""
        frame = {"a": np.asarray(a, dtype=np.int64), "b": np.asarray(b, dtype=np.int64)}
        with self.scratch("union") as tmp:
            self.con.execute(f"INSERT INTO pending SELECT a, b FROM {tmp.register('pairs', frame)} WHERE a <> b")

    def union_from(self, source: str) -> int:
        """Queue unions from a SELECT of (a, b) pairs; returns the pairs queued."""
        return self.con.execute(f"INSERT INTO pending SELECT * FROM ({source}) p(a, b) WHERE a <> b").fetchall()[0][0]

    def union_agreeing(self, source: str) -> tuple[int, int]:
        """Queue the unions of a SELECT of (a, b) pairs whose e-classes agree in shape and dtype; the others, which
        would be a ShapeConflict at the next ``rebuild``, are left out: (pairs queued, pairs left out). A pair with
        an id that is no e-class now (displaced since it was read) is queued, as ``union_from`` queues it. Two
        statements where ``union_from`` takes one."""
        with self.scratch("agree") as tmp:
            pairs, n = tmp.counted("pairs", f"SELECT p.a, p.b, {classes_agree('ea', 'eb')} AS ok FROM ({source}) p(a, b) "
                                            "LEFT JOIN eclass ea ON ea.id = p.a LEFT JOIN eclass eb ON eb.id = p.b "
                                            "WHERE p.a <> p.b")
            if not n:
                return 0, 0
            queued = self.con.execute(f"INSERT INTO pending SELECT a, b FROM {pairs} WHERE ok").fetchall()[0][0]
            return queued, n - queued

    def find(self, ids) -> np.ndarray:
        frame = {"i": np.arange(len(ids), dtype=np.int64), "x": np.asarray(ids, dtype=np.int64)}
        with self.scratch("find") as tmp:
            r = self.con.execute(f"SELECT coalesce(u.root, x) AS r FROM {tmp.register('ids', frame)} "
                                 "LEFT JOIN uf u ON u.id = x ORDER BY i").fetchnumpy()
        return r["r"].astype(np.int64)

    # ---------------------------------------------------------------- rebuild
    def _components(self, tmp: _Scratch) -> tuple[str, int]:
        """Turn pending pairs into a table (id, root) of ``tmp`` for every id that stops being
        canonical; returns its name and rows.

        Min-label propagation in one recursive CTE keyed by node (``USING KEY``): each step only
        revisits the neighbours of the labels that dropped in the step before."""
        c = self.con
        adj = tmp.create(
            "adj", "SELECT unnest([x, y]) AS n, unnest([y, x]) AS k FROM ("
            "SELECT DISTINCT least(x, y) AS x, greatest(x, y) AS y FROM (SELECT coalesce(ua.root, p.a) AS x, "
            "coalesce(ub.root, p.b) AS y FROM pending p LEFT JOIN uf ua ON ua.id = p.a LEFT JOIN uf ub "
            "ON ub.id = p.b) WHERE x <> y)")
        c.execute("DELETE FROM pending")
        mapping = tmp.create(
            "map", f"WITH RECURSIVE cc(n, l) USING KEY (n) AS ("
            f"SELECT n, least(n, min(k)) FROM {adj} GROUP BY n UNION "
            f"SELECT e.k, min(c.l) FROM cc c JOIN {adj} e ON e.n = c.n JOIN recurring.cc r ON r.n = e.k "
            "WHERE c.l < r.l GROUP BY e.k) "
            "SELECT n AS id, l AS root FROM cc WHERE n <> l")
        return mapping, c.execute(f"SELECT count(*) FROM {mapping}").fetchall()[0][0]

    def _merge_analyses(self, mapping: str) -> bool:
        """Fold the analyses of the e-classes displaced by ``mapping`` (a table of (id, root)) into
        their roots and extend the union-find; returns whether a displaced e-class differed from its
        root in constness."""
        c = self.con
        const_diff, bad = c.execute(
            "SELECT count(*) FILTER (e.is_const <> r.is_const), min(m.id) FILTER (r.shape IS DISTINCT FROM e.shape "
            "OR r.dtype IS DISTINCT FROM e.dtype OR r.tuple_shapes IS DISTINCT FROM e.tuple_shapes) "
            f"FROM {mapping} m JOIN eclass e ON e.id = m.id JOIN eclass r ON r.id = m.root").fetchall()[0]
        if bad is not None:
            r, i, rs, es, rd, ed = c.execute(
                f"SELECT m.root, m.id, r.shape, e.shape, r.dtype, e.dtype FROM {mapping} m JOIN eclass e ON e.id = m.id "
                "JOIN eclass r ON r.id = m.root WHERE m.id = ?", [bad]).fetchall()[0]
            raise ShapeConflict(
                f"union of e-class {r} (shape {rs}, dtype {rd}) and e-class {i} (shape {es}, dtype {ed}): "
                f"shapes or dtypes differ; nodes {self._describe_class(r)} and {self._describe_class(i)}")
        c.execute(f"UPDATE eclass SET is_const = true FROM (SELECT m.root FROM {mapping} m JOIN eclass e ON e.id = m.id "
                  "WHERE e.is_const) k WHERE eclass.id = k.root AND NOT eclass.is_const")
        c.execute(f"DELETE FROM eclass WHERE id IN (SELECT id FROM {mapping})")
        c.execute(f"UPDATE uf SET root = m.root FROM {mapping} m WHERE uf.root = m.id")
        c.execute(f"INSERT INTO uf SELECT id, root FROM {mapping}")
        return bool(const_diff)

    def _describe_class(self, cid: int) -> str:
        rows = self.con.execute("SELECT op, id FROM enodes WHERE eclass = ? LIMIT 3", [cid]).fetchall()
        return ", ".join(f"{op}#{nid}" for op, nid in rows) or f"class {cid}"

    def _recanonicalize(self, table: str, fixed: tuple[str, ...], var: tuple[str, ...],
                        keys: tuple[str, ...], mapping: str, tmp: _Scratch, ts: int | None = None) -> int:
        """Rewrite the rows of ``table`` that touch an id displaced by ``mapping`` (a table of
        (id, root)) and restore congruence among them.

        The touched rows, canonicalised, move to a working table (in ``tmp``, the rebuild's scratch,
        replaced table by table); rows there sharing a key collapse to the oldest, and a key that an
        untouched row already holds (untouched rows are unique by key) keeps that row; every other
        e-class of a collapsed key is queued for union.  When most rows are touched the table is
        rebuilt from the working table whole (cheaper than deleting most of it).
        Rewritten rows get round ``ts`` when given: they may match patterns they did not match
        before, so semi-naive evaluation must see them as new.  Returns the rows rewritten."""
        c, p = self.con, self.pass_no
        joins, exprs, hit = [], {}, []
        for col in fixed + ("out",):
            alias = f"m_{col}"
            joins.append(f"LEFT JOIN {mapping} {alias} ON {alias}.id = o.{q(col)}")
            exprs[col] = f"coalesce({alias}.root, o.{q(col)})"
            hit.append(f"{alias}.id IS NOT NULL")
        for col in var:
            fix = tmp.create(
                f"fix_{col}", f"SELECT u.id, list(coalesce(m.root, u.cid) ORDER BY u.pos) "
                f"AS v FROM (SELECT id, unnest({q(col)}) AS cid, generate_subscripts({q(col)}, 1) AS pos FROM {table}) u "
                f"LEFT JOIN {mapping} m ON m.id = u.cid GROUP BY u.id HAVING count(m.id) > 0")
            joins.append(f"LEFT JOIN {fix} f_{col} ON f_{col}.id = o.id")
            exprs[col] = f"coalesce(f_{col}.v, o.{q(col)})"
            hit.append(f"f_{col}.id IS NOT NULL")
        cols = ", ".join(exprs.get(k, f"o.{q(k)}") + f" AS {q(k)}" for k in keys)
        hits = " OR ".join(hit)
        stamp = "o.ts" if ts is None else f"CASE WHEN {hits} THEN {int(ts)} ELSE o.ts END"
        rows = tmp.create("rows", f"SELECT o.id, {cols}, {exprs['out']} AS out, {stamp} AS ts, "
                                  f"({hits}) AS hit FROM {table} o {' '.join(joins)}")
        touched, total = c.execute(f"SELECT count(*) FILTER (hit), count(*) FROM {rows}").fetchall()[0]
        full = 2 * touched > total  # most rows move: rebuild the table from the rows (same statements either way)
        c.execute(f"DELETE FROM {rows} WHERE NOT hit AND NOT {str(full).lower()}")
        c.execute(f"DELETE FROM {table}" + ("" if full else f" WHERE id IN (SELECT id FROM {rows})"))
        keysel = ", ".join(q(k) for k in keys)
        on = " AND ".join(f"o.{q(k)} IS NOT DISTINCT FROM g.{q(k)}" for k in keys)
        groups = tmp.create(
            "groups", f"SELECT g.*, o.out AS old FROM (SELECT {keysel}, min(id) AS id, "
            f"arg_min(out, id) AS out, arg_min(ts, id) AS ts, CASE WHEN count(*) > 1 THEN list(out) END AS outs "
            f"FROM {rows} GROUP BY {keysel}) g LEFT JOIN {table} o ON {on}")
        c.execute("INSERT INTO pending SELECT x, k FROM (SELECT unnest(coalesce(outs, [out])) AS x, coalesce(old, out) "
                  f"AS k FROM {groups} WHERE outs IS NOT NULL OR old IS NOT NULL) WHERE x <> k")
        c.execute(f"INSERT INTO {table} (id, {keysel}, out, ts, touched) SELECT id, {keysel}, out, ts, {p} "
                  f"FROM {groups} WHERE old IS NULL")
        return touched

    def _tables(self):
        """Live tables to canonicalise: (table, child columns, list columns, key). Leaves have only
        ``out`` to rewrite, and their duplicates (same name/ref) are congruent too."""
        for op in OPS:
            if op.table in self.live:
                fixed = tuple(i.column for i in op.inputs if not i.variadic)
                var = tuple(i.column for i in op.inputs if i.variadic)
                yield op.table, fixed, var, key_columns(op)
        if "op_opaque" in self.live:
            yield "op_opaque", (), ("inputs",), ("proto", "inputs")

    def _touched(self, tables: list[tuple], mapping: str) -> list[tuple]:
        """The tables (of ``_tables()``) with a row over an id displaced by ``mapping``, found in one
        statement: the others need no rewriting."""
        if not tables:
            return []
        parts = []
        for table, fixed, var, _ in tables:
            cols = [q(col) for col in fixed + ("out",)] + [f"unnest({q(col)})" for col in var]
            ids = " UNION ALL ".join(f"SELECT {col} AS x FROM {table}" for col in cols)
            parts.append(f"SELECT '{table}' AS t WHERE EXISTS (SELECT 1 FROM ({ids}) WHERE x IN (SELECT id FROM {mapping}))")
        hit = {t for (t,) in self.con.execute(" UNION ALL ".join(parts)).fetchall()}
        return [entry for entry in tables if entry[0] in hit]

    def rebuild(self, ts: int | None = None) -> RebuildReport:
        """Apply pending unions and restore congruence, to a fixpoint; rows rewritten get round
        ``ts`` (when given) so that semi-naive matching treats them as new."""
        t0 = time.perf_counter()
        report = RebuildReport()
        if not self.con.execute("SELECT count(*) FROM pending").fetchall()[0][0]:
            if self.const_dirty:
                self.const_dirty = False
                self.propagate_const()
            report.skipped = True
            return report
        displaced_const, self.const_dirty = self.const_dirty, False
        with self.scratch("rebuild") as tmp:  # the working tables of every pass, dropped at the end
            while True:
                mapping, merged = self._components(tmp)  # this pass's displaced ids (id, root)
                if not merged:
                    break
                report.passes += 1
                report.unions += merged
                self.pass_no += 1
                displaced_const |= self._merge_analyses(mapping)
                before = self.con.execute("SELECT count(*) FROM pending").fetchall()[0][0]
                for table, fixed, var, keys in self._touched(list(self._tables()), mapping):
                    self._recanonicalize(table, fixed, var, keys, mapping, tmp, ts)
                report.congruences += self.con.execute("SELECT count(*) FROM pending").fetchall()[0][0] - before
        if displaced_const:
            self.propagate_const()
        report.seconds = time.perf_counter() - t0
        return report

    def propagate_const(self) -> int:
        """Mark e-classes computable from weights alone (an e-class is constant when one of its catalog
        nodes has only constant children), to a fixpoint, in one recursive statement: each step looks
        only at the nodes over the e-classes that became constant in the step before.  Returns the
        e-classes marked."""
        parts = []
        for op in OPS:
            if op.table in self.live and not op.leaf:
                kids = q(op.inputs[0].column) if op.variadic else (
                    "list_filter([" + ", ".join(q(c) for c in op.child_columns) + "], lambda c: c <> -1)")
                parts.append(f"SELECT id AS node, out, unnest({kids}) AS child FROM {op.table}")
        if not parts:
            return 0
        return self.con.execute(
            f"WITH RECURSIVE edges AS MATERIALIZED ({' UNION ALL '.join(parts)}), "
            "k(id) USING KEY (id) AS (SELECT id FROM eclass WHERE is_const UNION "
            "SELECT c.out FROM (SELECT DISTINCT e.node FROM k JOIN edges e ON e.child = k.id) m "
            "JOIN edges c ON c.node = m.node LEFT JOIN recurring.k r ON r.id = c.child "
            "WHERE c.out NOT IN (SELECT id FROM recurring.k) GROUP BY c.node, c.out HAVING count(r.id) = count(*)) "
            "UPDATE eclass SET is_const = true FROM k WHERE eclass.id = k.id AND NOT eclass.is_const"
        ).fetchall()[0][0]

    # ------------------------------------------------------------------ facts
    def fingerprint(self) -> str:
        """Every row of every e-graph table (ids, rounds and rebuild passes included), hashed: two runs built the
        same e-graph exactly when their fingerprints agree (the determinism tests, ``bench_saturation --tree-ab``)."""
        h = hashlib.sha256()
        for table in [op.table for op in OPS] + ["op_opaque", "eclass", "uf"]:
            h.update(repr(self.sql(f"SELECT * FROM {table} ORDER BY id")).encode())
        return h.hexdigest()

    def counts(self) -> dict:
        """E-nodes and e-classes, in one statement over the op tables that hold rows (counting the ``enodes``
        view built every node's row, children lists and attributes: 15 ms a call on ViT-B/16, twice a round; a sum
        of scalar subqueries, one per table, 49 ms on BERT's nine tables against 2 ms for this UNION ALL)."""
        parts = ["SELECT true AS c, count(*) AS n FROM eclass"] + [f"SELECT false, count(*) FROM {t}"
                                                                   for t in sorted(self.live)]
        enodes, eclasses = self.con.execute(
            "SELECT coalesce(sum(n) FILTER (WHERE NOT c), 0), sum(n) FILTER (WHERE c) FROM ("
            + " UNION ALL ".join(parts) + ")").fetchall()[0]
        return {"enodes": int(enodes), "eclasses": int(eclasses)}

    def table_counts(self) -> dict[str, int]:
        rows = self.con.execute("SELECT op, count(*) FROM enodes GROUP BY op ORDER BY op").fetchall()
        return dict(rows)

    def check_invariants(self) -> None:
        """Raise InvariantError unless: every child and out id is canonical and has an analysis
        row, no two rows of a table share a key (congruence closed), and every node's shape rule
        agrees with its e-class's shape."""
        c = self.con
        if c.execute("SELECT count(*) FROM pending").fetchall()[0][0]:
            raise InvariantError("unions are pending: call rebuild() first")
        for op in OPS:
            cols = list(op.child_columns) + ["out"]
            for col in cols:
                expr = f"unnest({q(col)})" if col != "out" and op.variadic else q(col)
                bad = c.execute(
                    f"SELECT x FROM (SELECT {expr} AS x FROM {op.table}) WHERE x <> -1 AND (x IN (SELECT id FROM uf) "
                    f"OR x NOT IN (SELECT id FROM eclass)) LIMIT 1").fetchall()
                if bad:
                    raise InvariantError(f"{op.table}.{col} holds non-canonical or unknown e-class {bad[0][0]}")
            keys = ", ".join(q(k) for k in key_columns(op))
            dup = c.execute(f"SELECT {keys}, count(*) FROM {op.table} GROUP BY ALL HAVING count(*) > 1 LIMIT 1").fetchall()
            if dup:
                raise InvariantError(f"{op.table}: {dup[0][-1]} rows share the key {dup[0][:-1]} (not congruence closed)")
            if op.table in self.live and not op.leaf:
                self._check_shapes(op)
        bad = c.execute("SELECT x FROM (SELECT unnest(inputs) AS x FROM op_opaque UNION ALL SELECT out FROM op_opaque) "
                        "WHERE x IN (SELECT id FROM uf) OR x NOT IN (SELECT id FROM eclass) LIMIT 1").fetchall()
        if bad:
            raise InvariantError(f"op_opaque holds non-canonical or unknown e-class {bad[0][0]}")
        dup = c.execute("SELECT count(*) FROM (SELECT id FROM eclass GROUP BY id HAVING count(*) > 1)").fetchall()[0][0]
        if dup:
            raise InvariantError(f"{dup} e-classes have more than one analysis row")

    def _check_shapes(self, op: OpDef) -> None:
        """Every node of ``op``'s table computes (by the catalog's shape rule) its e-class's shape."""
        cols = ", ".join(["id AS rid"] + [q(c) for c in key_columns(op)])
        src = f"SELECT {cols} FROM {op.table}"
        with self.scratch("shapes") as tmp:
            computed = tmp.create("cand", rule_select(op, src, given=key_columns(op), valid_only=True))
            bad = self.con.execute(
                f"SELECT n.id, n.out, c.o_shape, e.shape FROM {op.table} n LEFT JOIN {computed} c ON c.rid = n.id "
                f"JOIN eclass e ON e.id = n.out WHERE c.rid IS NULL OR c.o_shape IS DISTINCT FROM e.shape "
                f"OR c.o_dtype IS DISTINCT FROM e.dtype OR c.o_tshapes IS DISTINCT FROM e.tuple_shapes LIMIT 1"
            ).fetchall()
        if bad:
            nid, cid, got, want = bad[0]
            raise InvariantError(f"{op.op_type} node {nid} computes shape {got} but its e-class {cid} has shape {want}")
