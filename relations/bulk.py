"""Writing the e-graph in bulk: a planned batch of e-classes and e-nodes in one transaction.

A ``Plan`` holds new e-classes (provisional ids from ``P0`` on, with the analyses the caller
knows: shape, dtype, constness, tuple shapes/dtypes; None = unknown) and ``Row``s (catalog
nodes, or opaque nodes with their NodeProto), children before parents.  ``write`` gives them
real ids from the sequences, inserts every table with one statement, then evaluates the
catalog's rules (``relations.rules.rule_select``, as ``EGraph.insert_from`` does) on the rows
that asked to be checked: an unknown analysis takes the rule's, a row its rule rejects or that
disagrees with the plan rolls the batch back and is reported.  The number of statements does not
grow with the depth of the graph.  ONNX import (driver/boundary/onnx_import.py) plans; this module writes.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from .catalog import BY_TYPE, OPS, OpDef
from .egraph import EGraph
from .rules import rule_select
from .schema import q

GETITEM = BY_TYPE["getitem"]
P0 = 1 << 60  # provisional e-class ids while a batch is planned; real ids come from class_seq when written


@dataclass
class Row:
    """One e-node to write: a catalog node (``op``), or an opaque one (``op`` None, ``attrs["node"]``
    its NodeProto, ``children["inputs"]`` its input e-classes)."""

    op: OpDef | None
    children: dict  # child column -> e-class (a list for a variadic input); -1 = absent
    attrs: dict
    out: int
    src: list = field(default_factory=list)  # positions of the ONNX nodes it stands for; empty: not checked


class Plan:
    """E-classes and e-nodes to write in one batch (``write``), children before parents; new
    e-classes have provisional ids (>= P0) until written."""

    def __init__(self):
        self.classes: list[tuple] = []  # (shape, dtype, is_const, tuple_shapes, tuple_dtypes); None = unknown
        self.rows: list[Row] = []

    def new_class(self, shape, dtype, const, tuple_shapes=None, tuple_dtypes=None) -> int:
        self.classes.append((shape, dtype, bool(const), tuple_shapes, tuple_dtypes))
        return P0 + len(self.classes) - 1


def _json(v):
    return None if v is None else json.dumps(v)


def write(g: EGraph, plan: Plan, *, ts: int = 0) -> tuple[set[int], np.ndarray]:
    """Write a plan in one transaction with a fixed number of statements per operator table,
    whatever the depth of the graph: new e-classes and their analyses, catalog rows, opaque rows.
    Then the catalog's rules are evaluated on the rows with a ``src``: an e-class whose shape or
    dtype the plan left unknown takes the rule's, and a row that its rule rejects or that disagrees
    with the plan's shape or dtype (ONNX shape inference) rolls the whole batch back.  Returns the
    positions in ``plan.rows`` of those rows (empty: written) and the real e-class id of each
    provisional one."""
    con = g.con
    if not plan.rows and not plan.classes:
        return set(), np.zeros(0, dtype=np.int64)
    con.execute("BEGIN TRANSACTION")
    try:
        bad, classes, tables = _write_rows(g, plan, ts)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    if bad:
        con.execute("ROLLBACK")
        return bad, classes
    con.execute("COMMIT")
    g.live.update(tables)
    return set(), classes


def _write_rows(g: EGraph, plan: Plan, ts: int):
    con = g.con
    fetch = "SELECT nextval('{}') AS i FROM range(?)"
    classes = np.sort(con.execute(fetch.format("class_seq"), [len(plan.classes)]).fetchnumpy()["i"]).astype(np.int64)
    node_ids = np.sort(con.execute(fetch.format("node_seq"), [len(plan.rows)]).fetchnumpy()["i"]).astype(np.int64)

    def real(ids) -> np.ndarray:
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        new = a >= P0
        return np.where(new, classes[np.where(new, a - P0, 0)] if len(classes) else a, a)

    def lists(col) -> np.ndarray:
        return np.array([json.dumps(real(v).tolist()) for v in col], dtype=object)

    if plan.classes:
        shape, dtype, const, tshapes, tdtypes = zip(*plan.classes)
        con.register("_imp_classes", {
            "id": classes, "shape": np.array([_json(s) for s in shape], dtype=object),
            "dtype": np.array(dtype, dtype=object), "is_const": np.array(const, dtype=bool),
            "tshapes": np.array([_json(s) for s in tshapes], dtype=object),
            "tdtypes": np.array([_json(d) for d in tdtypes], dtype=object)})
        try:
            con.execute("INSERT INTO eclass (id, shape, dtype, is_const, tuple_shapes, tuple_dtypes, ts) SELECT id, "
                        "shape::VARCHAR::BIGINT[], dtype::INTEGER, is_const, tshapes::VARCHAR::BIGINT[][], "
                        f"tdtypes::VARCHAR::INTEGER[], {int(ts)} FROM _imp_classes")
        finally:
            con.unregister("_imp_classes")
    groups: dict = defaultdict(list)
    for k, r in enumerate(plan.rows):
        groups[r.op.op_type if r.op else None].append(k)
    tables = set()
    for op_type, ks in groups.items():
        rows = [plan.rows[k] for k in ks]
        ids, outs = node_ids[ks], real([r.out for r in rows])
        if op_type is None:
            _write_opaque(con, ids, outs, [real(r.children["inputs"]).tolist() for r in rows], rows, ts)
            tables.add("op_opaque")
            continue
        op = BY_TYPE[op_type]
        frame, select = {"id": ids, "out": outs}, ["id"]
        for inp in op.inputs:
            col = [r.children[inp.column] for r in rows]
            if inp.variadic:
                frame[inp.column] = lists(col)
                select.append(f"{q(inp.column)}::VARCHAR::BIGINT[]")
            else:
                frame[inp.column] = real(col)
                select.append(q(inp.column))
        for a in op.attrs:
            col = [r.attrs[a.name] for r in rows]
            if a.kind in ("ints", "floats"):
                frame[a.name] = np.array([json.dumps(list(v)) for v in col], dtype=object)
                select.append(f"{q(a.name)}::VARCHAR::{a.sql_type}")
            else:
                frame[a.name] = np.array(col, dtype={"int": np.int64, "float": np.float64}.get(a.kind, object))
                select.append(f"{q(a.name)}::{a.sql_type}")
        names = ", ".join(q(c) for c in [*op.child_columns, *(a.name for a in op.attrs)])
        con.register("_imp_rows", frame)
        try:
            con.execute(f"INSERT INTO {op.table} (id, {names}, out, ts) SELECT {', '.join(select)}, out, {int(ts)} "
                        f"FROM _imp_rows")
        finally:
            con.unregister("_imp_rows")
        tables.add(op.table)
    checked = [k for k, r in enumerate(plan.rows) if r.src]
    if not checked:
        return set(), classes, tables
    con.register("_imp_check", {"id": node_ids[checked]})
    bad_ids: set[int] = set()
    try:
        ops = [op for op in OPS if op.op_type in groups and any(plan.rows[k].src for k in groups[op.op_type])]
        # getitem reads the tuple shapes that its tuple's rule may have filled in
        for batch in ([op for op in ops if op.op_type != "getitem"], [op for op in ops if op.op_type == "getitem"]):
            if not batch:
                continue
            con.execute("CREATE OR REPLACE TEMP TABLE _imp_rule AS " + " UNION ALL ".join(map(_check_sql, batch)))
            con.execute(
                "UPDATE eclass SET shape = coalesce(eclass.shape, r.o_shape), dtype = coalesce(eclass.dtype, r.o_dtype), "
                "tuple_shapes = coalesce(eclass.tuple_shapes, r.o_tshapes), tuple_dtypes = coalesce(eclass.tuple_dtypes, "
                "r.o_tdtypes) FROM _imp_rule r WHERE eclass.id = r.out AND (eclass.shape IS NULL OR eclass.dtype IS NULL)")
            bad_ids.update(i for (i,) in con.execute(
                "SELECT r.rid FROM _imp_rule r JOIN eclass e ON e.id = r.out WHERE NOT r.canon_ok "
                "OR (r.o_shape IS NULL AND r.o_tshapes IS NULL) OR e.shape IS DISTINCT FROM r.o_shape "
                "OR e.dtype IS DISTINCT FROM r.o_dtype OR e.tuple_shapes IS DISTINCT FROM r.o_tshapes "
                "OR e.tuple_dtypes IS DISTINCT FROM r.o_tdtypes").fetchall())
    finally:
        con.unregister("_imp_check")
    position = {int(i): k for k, i in enumerate(node_ids)}
    return {position[i] for i in bad_ids}, classes, tables


def _write_opaque(con, ids, outs, inputs, rows: list[Row], ts: int) -> None:
    nodes = [r.attrs["node"] for r in rows]
    frame = {
        "id": ids, "out": outs, "rid": np.arange(len(rows), dtype=np.int64),
        "node": np.array([n.SerializeToString() for n in nodes], dtype=object),
        "op_type": np.array([n.op_type for n in nodes], dtype=object),
        "domain": np.array([n.domain for n in nodes], dtype=object),
        "n_outputs": np.array([len(n.output) for n in nodes], dtype=np.int32),
        "inputs": np.array([json.dumps(ins) for ins in inputs], dtype=object),
        "shapes": np.array([json.dumps(r.attrs["shapes"]) for r in rows], dtype=object),
        "dtypes": np.array([json.dumps(r.attrs["dtypes"]) for r in rows], dtype=object),
    }
    con.register("_imp_opaque", frame)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _imp_opq AS SELECT id, out, (SELECT coalesce(max(proto), 0) FROM "
                    "opaque_nodes) + rid + 1 AS proto, node, op_type, domain, n_outputs, inputs::VARCHAR::BIGINT[] AS "
                    "inputs, shapes::VARCHAR::BIGINT[][] AS shapes, dtypes::VARCHAR::INTEGER[] AS dtypes FROM _imp_opaque")
    finally:
        con.unregister("_imp_opaque")
    con.execute("INSERT INTO opaque_nodes (proto, op_type, domain, node, n_outputs, output_shapes, output_dtypes) "
                "SELECT proto, op_type, domain, node, n_outputs, shapes, dtypes FROM _imp_opq")
    con.execute(f"INSERT INTO op_opaque (id, proto, inputs, out, ts) SELECT id, proto, inputs, out, {int(ts)} FROM _imp_opq")


# ---------------------------------------------------------- opaque nodes
def plan_opaque(plan: Plan, node, inputs, shapes, dtypes, const: bool) -> list[int]:
    """Plan an opaque node: its e-class per output position (-1 where the output is omitted).  A
    single-output node's e-class is a tensor; a multi-output node's is a tuple whose outputs get
    getitem nodes."""
    shapes, dtypes = list(shapes), list(dtypes)
    single = len(node.output) == 1
    out = plan.new_class(shapes[0], dtypes[0], const) if single else plan.new_class(None, None, const, shapes, dtypes)
    plan.rows.append(Row(None, {"inputs": list(inputs)}, {"node": node, "shapes": shapes, "dtypes": dtypes}, out))
    if single:
        return [out]
    result = [-1] * len(node.output)
    for i, o in enumerate(node.output):
        if o:
            result[i] = plan.new_class(shapes[i], dtypes[i], const)
            plan.rows.append(Row(GETITEM, {"t": out}, {"index": i}, result[i]))
    return result


def _check_sql(op: OpDef) -> str:
    """The catalog's rules on the rows of ``op``'s table listed in ``_imp_check``: (rid, ..., o_shape,
    o_dtype, o_const, o_tshapes, o_tdtypes, canon_ok, out)."""
    src = f"SELECT id AS rid, * FROM {op.table} WHERE id IN (SELECT id FROM _imp_check)"
    rows = rule_select(op, src, given=[a.name for a in op.attrs], carry=("out",), check_canon=True)
    return f"SELECT rid, out, o_shape, o_dtype, o_tshapes, o_tdtypes, canon_ok FROM ({rows})"


def real_id(classes: np.ndarray, c: int) -> int:
    """The e-class id ``write`` gave a provisional id (other ids unchanged)."""
    return int(classes[c - P0]) if c >= P0 else c
