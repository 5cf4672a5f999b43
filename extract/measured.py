"""Measured costs for every e-node of an e-graph: from the tables to ``costs`` and back.

Owns :func:`measured_costs`. It first fills ``costs`` analytically
(:func:`relsat.extract.analytic.analytic_costs`: leaves and weight-only e-classes cost
zero, everything else gets its FLOP/byte estimate), then, for every catalog and opaque
e-node whose e-class is not constant:

1. one SQL query per op table groups the nodes by signature (child shapes and dtypes,
   which children are the same e-class, attributes; opaque nodes also by their
   NodeProto) and writes ``node -> signature`` into a temp table;
2. Python builds one :class:`~relsat.extract.profile.OpSample` per distinct signature,
   with the node written exactly as export writes it
   (:func:`relsat.relations.onnx_form.enode_proto`: lifted attributes become initializer
   inputs, opaque NodeProtos are used verbatim);
3. :func:`~relsat.extract.profile.profile` answers from the cost cache (rows of another
   onnxruntime version included, used as they are) or times the rest under ONNX Runtime;
   the fixed cost of a ``session.run`` call
   (:func:`~relsat.extract.profile.calibrated_call_overhead_ms`, calibrated once per cache,
   so that all-cached runs predict the same costs) is subtracted, since an operator inside a
   model does not pay it; for PyTorch's runtime (timing kind ``cuda-torch``) the per-node cost of that
   runtime (:func:`~relsat.extract.profile.calibrated_node_overhead_ms`, calibrated once per cache),
   which every node pays in a whole-graph run and a one-node timing does not see, is then added, so
   that a graph of one node fewer is cheaper by about that much (ONNX Runtime's costs have none);
4. one bulk UPDATE joins the per-signature costs back onto ``costs``
   (``source`` 'measured' or 'cache'). A signature that could not be built or run keeps
   its analytic cost scaled by the median measured/analytic ratio of its operator (of all
   operators if none of its kind was measured), at least the per-node cost: ``source``
   'analytic-fallback'.

Projections (``getitem``) cost zero: their tuple's node carries the cost. What a caller should
tell the user (costs from another onnxruntime version; no cost measured or found at all) is in
``MeasuredReport.notices``, and the first is also a warning.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from relsat.relations.backend import CPU, Backend
from relsat.relations.catalog import BY_TYPE, OPS
from relsat.relations.egraph import EGraph
from relsat.relations.onnx_form import enode_proto
from relsat.relations.schema import q

from .analytic import analytic_costs
from .cost_cache import CostCache
from .profile import (OpSample, ProfileReport, ProviderUnavailable, timing_kind, calibrated_call_overhead_ms,
                      calibrated_node_overhead_ms, lookup, profile)

MIN_COST_MS = 1e-4  # floor of a measured cost after the call overhead is subtracted (0.1 us)
SAMPLE_BUDGET_S = 0.25  # at most about this long timing one (slow) signature
FAILURE_EXAMPLES = 5  # failure reasons kept in the report


@dataclass
class MeasuredReport:
    """What :func:`measured_costs` did: counts of signatures and nodes, and the time it took."""

    provider: str
    threads: int
    signatures: int = 0  # distinct operator signatures among non-constant e-nodes
    nodes: int = 0  # e-nodes with a measured or cached cost
    measured: int = 0  # signatures timed now
    cached: int = 0  # signatures answered by the cost cache
    failed: int = 0  # signatures that fell back to a scaled analytic cost
    fallback_nodes: int = 0  # e-nodes with a scaled analytic cost
    call_overhead_ms: float = 0.0  # subtracted from every measured cost
    node_overhead_ms: float = 0.0  # then added to every operator's cost (PyTorch's runtime only; 0 on ONNX Runtime)
    fallback_scale: float | None = None  # the all-operator median measured/analytic ratio
    failures: list[str] = field(default_factory=list)  # a few "op: reason" examples
    other_version: int = 0  # signatures whose cost comes from rows of another onnxruntime version
    other_versions: list[str] = field(default_factory=list)  # those versions
    all_fallback: bool = False  # there were signatures, and every one fell back to a scaled analytic cost
    notices: list[str] = field(default_factory=list)  # one line each, for the user
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(vars(self))


def _signature_sql(op) -> str:
    """Distinct signatures of the non-constant nodes of a catalog op table: one row each, with a
    representative's children, the child shapes/dtypes, the attributes and the node ids."""
    if op.variadic:
        kids = f"n.{q(op.inputs[0].column)}"
    else:
        kids = "[" + ", ".join(f"n.{q(c)}" for c in op.child_columns) + "]"
    attrs = [q(a.name) for a in op.attrs]
    cols = [f"bind(n.{q(a.name)}) AS {q(a.name)}" if a.dims else f"n.{q(a.name)}" for a in op.attrs]
    return _grouped(f"SELECT n.id, {kids} AS kids{''.join(', ' + c for c in cols)} FROM {op.table} n "
                    "JOIN eclass o ON o.id = n.out WHERE NOT coalesce(o.is_const, false)", attrs)


def _grouped(base: str, extra: list[str]) -> str:
    extra_cols = "".join(", " + c for c in extra)
    return f"""
        WITH b AS ({base}),
        k AS (SELECT b.id, list(e.shape ORDER BY u.pos) AS shapes, list(e.dtype ORDER BY u.pos) AS dtypes
              FROM b, unnest(b.kids) WITH ORDINALITY AS u(c, pos) LEFT JOIN eclass_bound e ON e.id = u.c
              GROUP BY b.id)
        SELECT min(b.id) AS rep, arg_min(b.kids, b.id) AS kids, k.shapes, k.dtypes{extra_cols},
               list(b.id) AS ids
        FROM b JOIN k USING (id)
        GROUP BY k.shapes, k.dtypes, list_transform(b.kids, lambda c: list_position(b.kids, c)){extra_cols}"""


def _rows(g: EGraph, sql: str) -> list[dict]:
    cur = g.con.execute(sql)
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def _sample(op: str, kids, shapes, dtypes, attrs: dict, opset: int, domains) -> OpSample:
    info = {c: (s, d) for c, s, d in zip(kids, shapes, dtypes) if c != -1}
    if any(s is None or d is None for s, d in info.values()):
        raise ValueError("an input has an unknown shape or dtype")
    entry = BY_TYPE.get(op)
    if entry is not None and entry.domain and entry.domain not in domains:  # a rule brought the op in
        domains = {**domains, entry.domain: entry.since}
    node, inits, names = enode_proto(op, list(kids), attrs, info, opset, domains)
    inputs = tuple((names[c], int(d), tuple(int(x) for x in s)) for c, (s, d) in info.items())
    outputs = tuple(o for o in node.output if o)
    return OpSample(node, inputs, tuple(inits), outputs, opset, tuple(sorted(domains.items())))


def collect_samples(g: EGraph, opset_imports: dict[str, int]) -> tuple[list, list[str]]:
    """One sample per distinct signature (an Exception where it cannot be built), the op name of
    each, and the temp table ``_sig_nodes(node, sig)`` mapping every profiled e-node to its
    signature's position in that list."""
    opset = opset_imports.get("", 17)
    domains = {d: v for d, v in opset_imports.items() if d not in ("", "ai.onnx")}
    g.con.execute("CREATE OR REPLACE TEMP TABLE _sig_nodes (node BIGINT, sig BIGINT)")
    samples: list = []
    ops: list[str] = []

    def add(sql, op_name, build):
        """Group the nodes of one table by ``sql``; map them to new signature numbers; build samples."""
        g.con.execute(f"CREATE OR REPLACE TEMP TABLE _sig_groups AS SELECT row_number() OVER (ORDER BY rep) - 1 "
                      f"+ {len(samples)} AS sig, * FROM ({sql})")
        g.con.execute("INSERT INTO _sig_nodes SELECT unnest(ids), sig FROM _sig_groups")
        for r in _rows(g, "SELECT * EXCLUDE (ids) FROM _sig_groups ORDER BY sig"):
            try:
                samples.append(build(r))
            except Exception as exc:  # reported as this signature's failure; never the whole run
                samples.append(exc)
            ops.append(op_name(r))

    for op in OPS:
        if op.table not in g.live or op.leaf or op.op_type == "getitem":
            continue
        add(_signature_sql(op), lambda r, op=op: op.op_type,
            lambda r, op=op: _sample(op.op_type, r["kids"], r["shapes"], r["dtypes"],
                                     {a.name: r[a.name] for a in op.attrs}, opset, domains))
    if "op_opaque" in g.live:
        add(_grouped("SELECT n.id, n.inputs AS kids, n.proto, p.op_type, p.node FROM op_opaque n "
                     "JOIN opaque_nodes p USING (proto) JOIN eclass o ON o.id = n.out "
                     "WHERE NOT coalesce(o.is_const, false)", ["proto", "op_type", "node"]),
            lambda r: r["op_type"],
            lambda r: _sample("opaque", r["kids"], r["shapes"], r["dtypes"], {"node": bytes(r["node"])},
                              opset, domains))
    return samples, ops


def measured_costs(g: EGraph, opset_imports: dict[str, int], *, backend: Backend = CPU, threads: int = 1,
                   cache: CostCache | None = None, measure: bool = True,
                   progress: bool | Callable[[int, int], None] = False,
                   sample_budget_s: float | None = SAMPLE_BUDGET_S) -> MeasuredReport:
    """Fill ``costs`` with measured costs (see the module docstring). ``measure=False`` takes
    costs from ``cache`` only, timing nothing (a cost table measured on another machine);
    absent signatures fall back like failures. Raises ProviderUnavailable when ``measure`` and
    ``backend`` cannot run here."""
    t0 = time.perf_counter()
    rep = MeasuredReport(backend.name, threads)
    if measure:
        timing_kind(backend)  # fail before any work when the backend cannot run here
    elif cache is None:
        raise ValueError("measure=False needs a cost cache to read costs from")
    analytic_costs(g)
    g.con.execute("UPDATE costs SET ms = 0, source = 'projection' WHERE op = 'getitem'")
    samples, ops = collect_samples(g, opset_imports)
    ok = [i for i, s in enumerate(samples) if isinstance(s, OpSample)]
    good = [samples[i] for i in ok]
    rep.signatures = len(samples)
    if measure:
        prof = profile(good, backend=backend, threads=threads, cache=cache, progress=progress,
                       sample_budget_s=sample_budget_s)
    else:
        prof = lookup(good, backend=backend, threads=threads, cache=cache) if good else \
            ProfileReport(np.zeros(0), [])
    rep.measured, rep.cached = prof.measured, prof.cached
    rep.other_version, rep.other_versions = sum(prof.other_versions.values()), sorted(prof.other_versions)
    if rep.other_version:
        msg = (f"{rep.other_version} operator costs come from ONNX Runtime {', '.join(rep.other_versions)} rows of "
               f"the cost cache (this is {ort.__version__}): used as they are")
        rep.notices.append(msg)
        warnings.warn(msg, stacklevel=2)
    ms = np.full(len(samples), np.nan)
    keys = np.full(len(samples), None, dtype=object)
    ms[ok], keys[ok] = prof.ms, prof.keys
    fresh = np.zeros(len(samples), dtype=bool)
    fresh[ok] = [k in prof.new_keys for k in prof.keys]
    if len(ok):
        try:
            rep.call_overhead_ms = calibrated_call_overhead_ms(backend, threads, cache)
        except ProviderUnavailable:  # costs read from a table measured elsewhere: keep them as they are
            rep.call_overhead_ms = 0.0
        rep.node_overhead_ms = calibrated_node_overhead_ms(backend, threads, cache)
        ms = np.where(np.isfinite(ms), np.maximum(ms - rep.call_overhead_ms, MIN_COST_MS) + rep.node_overhead_ms, ms)
    reasons = {i: repr(s) for i, s in enumerate(samples) if not isinstance(s, OpSample)}
    for i, k in zip(ok, prof.keys):
        if not np.isfinite(ms[i]):
            reasons[i] = prof.failures.get(k, "no cost")
    rep.failed = len(reasons)
    rep.failures = [f"{ops[i]}: {reasons[i]}" for i in sorted(reasons)[:FAILURE_EXAMPLES]]
    _write_back(g, ms, keys, fresh, rep)
    rep.all_fallback = rep.signatures > 0 and rep.nodes == 0
    if rep.all_fallback:
        rep.notices.append("no operator cost could be measured or found in the cost table: every e-node uses a "
                           "scaled analytic cost")
    rep.seconds = time.perf_counter() - t0
    return rep


def _write_back(g: EGraph, ms: np.ndarray, keys: np.ndarray, fresh: np.ndarray, rep: MeasuredReport) -> None:
    """Bulk-update ``costs`` from the per-signature results (NaN: failed, scaled analytic instead)."""
    ok = np.isfinite(ms)
    g.con.register("_sig_costs", {"sig": np.arange(len(ms), dtype=np.int64), "ms": np.where(ok, ms, 0.0),
                                  "ok": ok, "fresh": fresh, "key": keys})
    try:
        g.con.execute("""
            UPDATE costs SET ms = f.ms, source = CASE WHEN f.fresh THEN 'measured' ELSE 'cache' END, key = f.key
            FROM (SELECT m.node, s.ms, s.fresh, s.key FROM _sig_nodes m JOIN _sig_costs s USING (sig)
                  WHERE s.ok) f WHERE costs.node = f.node""")
        g.con.execute("""
            CREATE OR REPLACE TEMP TABLE _ratios AS SELECT op, median(ms / analytic_ms) AS ratio FROM costs
            WHERE source IN ('measured', 'cache') AND analytic_ms > 0 GROUP BY ROLLUP (op)""")
        rep.fallback_scale = g.con.execute("SELECT ratio FROM _ratios WHERE op IS NULL").fetchone()[0]
        g.con.execute("""
            UPDATE costs SET ms = costs.analytic_ms * f.scale, source = 'analytic-fallback'
            FROM (SELECT m.node, coalesce(r.ratio, (SELECT ratio FROM _ratios WHERE op IS NULL), 1.0) AS scale
                  FROM _sig_nodes m JOIN _sig_costs s USING (sig) JOIN costs c ON c.node = m.node
                  LEFT JOIN _ratios r ON r.op = c.op WHERE NOT s.ok) f WHERE costs.node = f.node""")
        if rep.node_overhead_ms > 0:  # a node the runtime runs costs it at least its per-node cost
            g.con.execute("UPDATE costs SET ms = greatest(ms, ?) WHERE source = 'analytic-fallback'",
                          [rep.node_overhead_ms])
    finally:
        g.con.unregister("_sig_costs")
    g.con.execute("""
        UPDATE costs SET source = 'const' FROM enodes n JOIN eclass e ON e.id = n.eclass
        WHERE costs.node = n.id AND e.is_const AND costs.source = 'analytic'""")
    counts = dict(g.sql("SELECT source, count(*) FROM costs GROUP BY source"))
    rep.nodes = counts.get("measured", 0) + counts.get("cache", 0)
    rep.fallback_nodes = counts.get("analytic-fallback", 0)
