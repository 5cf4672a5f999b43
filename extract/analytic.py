"""Analytic costs and the bridge from the e-graph tables to an ExtractionProblem.

``analytic_costs(g)`` fills the ``costs`` table (node id, op, cost in ms) from
the catalog's FLOP rules and the bytes each node moves, in one INSERT per live
op table: ``ms = flops / FLOPS_PER_MS + bytes / BYTES_PER_MS``.  Nodes whose
e-class is computable from weights alone cost zero (they are folded at export).
Opaque nodes get their output volume as bytes moved plus a fixed launch cost.
``problem_from(g, roots)`` reads nodes, children and costs into numpy arrays.
"""

from __future__ import annotations

import numpy as np

from relsat.relations.catalog import OPS
from relsat.relations.egraph import EGraph
from relsat.relations.rules import rule_select

from .extraction import ExtractionProblem

FLOPS_PER_MS = 2e7  # ~20 GFLOP/s: one core of this class of CPU on dense kernels
BYTES_PER_MS = 5e6  # ~5 GB/s effective memory bandwidth for elementwise traffic
LAUNCH_MS = 0.002  # per-node overhead in ONNX Runtime's executor
ELEM_BYTES = 4

# One row per e-node: the cost extraction uses (ms) and where it came from (source: 'analytic',
# 'leaf', or from relsat.extract.measured 'measured', 'cache', 'analytic-fallback', 'const',
# 'projection'), the analytic estimate beside it, and the cost-cache key of a measured one.
COSTS_DDL = ("CREATE OR REPLACE TABLE costs (node BIGINT, op VARCHAR, ms DOUBLE, source VARCHAR, "
             "analytic_ms DOUBLE, key VARCHAR)")
_INSERT = "INSERT INTO costs (node, op, ms, source, analytic_ms) SELECT *, ms FROM"


def analytic_costs(g: EGraph) -> None:
    """Fill ``costs`` (module docstring) in one INSERT over every live op table (one per table cost about
    45 ms of DuckDB's planning each: a second of every pricing of Swin-T's e-graph)."""
    g.con.execute(COSTS_DDL)
    parts = []
    for op in OPS:
        if op.table not in g.live or op.leaf:
            continue
        bytes_in = [f"list_sum(list_transform(s_{i.column}, lambda s: prod(s)))" if i.variadic
                    else f"coalesce(prod(s_{i.column}), 0)" for i in op.inputs]
        src = (f"SELECT n.id AS rid, n.*, o.shape AS s_out, o.tuple_shapes AS ts_out, o.is_const AS const_out "
               f"FROM {op.table} n JOIN bound o ON o.id = n.out")
        rows = rule_select(op, src, given=[a.name for a in op.attrs], carry=("s_out", "ts_out", "const_out"),
                           analyses="bound", exprs={
            "flops": op.flops, "bytes": f"{' + '.join(bytes_in) or '0'}", "out_elems":
            "coalesce(prod(s_out), list_sum(list_transform(ts_out, lambda s: prod(s))), 0)"})
        parts.append(
            f"SELECT rid, '{op.op_type}', CASE WHEN const_out THEN 0 ELSE "
            f"flops / {FLOPS_PER_MS} + (bytes + out_elems) * {ELEM_BYTES} / {BYTES_PER_MS}"
            f" + CASE WHEN flops > 0 THEN {LAUNCH_MS} ELSE 0 END END::DOUBLE AS ms, 'analytic' FROM ({rows})")
    if "op_opaque" in g.live:
        parts.append(
            f"SELECT n.id, p.op_type, CASE WHEN o.is_const THEN 0 ELSE {LAUNCH_MS} + "
            f"coalesce(list_sum(list_transform(p.output_shapes, lambda s: prod(bind(s)))), 0) * {ELEM_BYTES} / {BYTES_PER_MS}"
            f" END::DOUBLE AS ms, 'analytic' FROM op_opaque n JOIN opaque_nodes p USING (proto) JOIN eclass o ON o.id = n.out")
    parts += [f"SELECT id, '{leaf[3:]}', 0.0::DOUBLE AS ms, 'leaf' FROM {leaf}" for leaf in ("op_input", "op_weight", "op_constant")]
    g.con.execute(f"{_INSERT} (WITH bound AS MATERIALIZED (SELECT * FROM eclass_bound) "
                  + " UNION ALL ".join(f"({p})" for p in parts) + ")")


def problem_from(g: EGraph, roots) -> tuple[ExtractionProblem, np.ndarray]:
    """The extraction problem over every e-node, and the node ids in problem order."""
    nodes = g.con.execute(
        "SELECT n.id, n.eclass, coalesce(c.ms, 0) AS ms, len(n.children) AS k FROM enodes n "
        "LEFT JOIN costs c ON c.node = n.id ORDER BY n.id").fetchnumpy()
    kids = g.con.execute("SELECT c FROM (SELECT id, unnest(children) AS c, generate_subscripts(children, 1) AS pos "
                         "FROM enodes) ORDER BY id, pos").fetchnumpy()
    ptr = np.zeros(len(nodes["id"]) + 1, dtype=np.int64)
    np.cumsum(nodes["k"], out=ptr[1:])
    problem = ExtractionProblem(
        node_class=nodes["eclass"].astype(np.int64),
        node_cost=np.nan_to_num(nodes["ms"].astype(np.float64), nan=0.0),
        child_ptr=ptr,
        child_class=kids["c"].astype(np.int64) if len(kids["c"]) else np.zeros(0, dtype=np.int64),
        roots=np.asarray(g.find(np.asarray(roots, dtype=np.int64)), dtype=np.int64),
    )
    return problem, nodes["id"].astype(np.int64)
