"""The saturation runner: rounds of match -> apply -> rebuild over compiled rules.

Like egg's Runner: ``Limits`` (iterations, e-nodes, seconds), a scheduler
(``simple`` or ``backoff``, which bans a rule whose matches exceed its threshold
for a few rounds, doubling each time), a separate budget of rounds for
multi-pattern rules (TENSAT's k_multi), semi-naive evaluation (a rule only sees
matches that use a row newer than its previous run; rows a rebuild rewrote count
as new), cycle filtering for multi-pattern rules (``cycle_filter``: an
application whose unions would make an e-class depend on itself is dropped, see
``relations.reach``), one ``Iteration`` record per round and a ``StopReason``.
Per round the number of SQL statements depends on the number of rules, never on
the number of matches; the e-node limit is honoured inside a round by capping
each rule's matches and each insert (a round that had to leave matches out stops
the run with ``node limit``).  Iterations and per-rule statistics are stored in
the ``iterations`` and ``rule_stats`` tables.  While it runs, DuckDB's
``preserve_insertion_order`` is off (no statement here depends on row order).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from relsat.programs.compiler import Compiled, compile_rule
from relsat.programs.ir import Rule
from relsat.relations.catalog import BY_TYPE
from relsat.relations.egraph import EGraph
from relsat.relations.reach import cyclic_matches


class StopReason(str, Enum):
    SATURATED = "saturated"
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    TIME_LIMIT = "time limit"


@dataclass
class Limits:
    iterations: int = 30
    enodes: int = 50_000
    seconds: float = 60.0
    multi_rounds: int = 1  # rounds in which multi-pattern rules run (the first ones)


@dataclass
class Iteration:
    round: int
    enodes: int
    eclasses: int
    match_s: float
    apply_s: float
    rebuild_s: float
    applied: int  # union pairs queued by rules, plus new nodes placed straight into a matched e-class
    unions: int  # e-class ids merged by the rebuild
    new_nodes: int


@dataclass
class RuleState:
    compiled: Compiled
    since: int = 0  # semi-naive: rows with ts >= since are new for this rule
    banned_until: int = -1
    times_banned: int = 0


@dataclass
class Report:
    iterations: list[Iteration] = field(default_factory=list)
    stop_reason: StopReason | None = None
    applied_by_rule: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    statements: list[int] = field(default_factory=list)  # SQL statements executed per round


@dataclass
class Runner:
    egraph: EGraph
    rules: list[Rule]
    limits: Limits = field(default_factory=Limits)
    scheduler: str = "backoff"  # simple | backoff
    match_limit: int = 20_000  # backoff threshold (scaled by 2**times_banned)
    ban_length: int = 2
    semi_naive: bool = True
    cycle_filter: bool = True  # drop multi-pattern applications whose unions would close a cycle
    on_round: object = None  # callback(Iteration) for progress display

    def run(self) -> Report:
        g = self.egraph
        order = g.con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
        g.con.execute("SET preserve_insertion_order = false")  # lets DuckDB number and insert rows in parallel
        try:
            return self._run()
        finally:
            g.con.execute(f"SET preserve_insertion_order = {str(order).lower()}")

    def _run(self) -> Report:
        g, lim = self.egraph, self.limits
        states = [RuleState(compile_rule(r)) for r in self.rules]
        report = Report()
        start = time.perf_counter()
        counter = _StatementCounter(g)
        first_round = g.con.execute("SELECT coalesce(max(round), 0) FROM iterations").fetchall()[0][0] + 1
        for rnd in range(first_round, first_round + lim.iterations):
            counter.reset()
            enodes = g.counts()["enodes"]
            if enodes >= lim.enodes:
                report.stop_reason = StopReason.NODE_LIMIT
                break
            if time.perf_counter() - start > lim.seconds:
                report.stop_reason = StopReason.TIME_LIMIT
                break
            it = Iteration(rnd, 0, 0, 0.0, 0.0, 0.0, 0, 0, 0)
            stats, any_banned, capped, node_budget = [], False, False, lim.enodes - enodes
            for st in states:
                c = st.compiled
                if c.multi and rnd - first_round >= lim.multi_rounds:
                    continue
                if self.scheduler == "backoff" and rnd <= st.banned_until:
                    any_banned = True
                    continue
                since = st.since if self.semi_naive else 0
                t0 = time.perf_counter()
                # a match builds at most len(builds) nodes: cap whole matches so the node budget is not
                # spent on partial right sides
                cap = max(node_budget, 0) // max(len(c.builds), 1) if c.builds else None
                g.con.execute(f"CREATE OR REPLACE TEMP TABLE _m AS SELECT row_number() OVER () AS mid, * FROM "
                              f"({c.match_sql.format(since=since)}){'' if cap is None else f' LIMIT {cap}'}")
                matches = g.con.execute("SELECT count(*) FROM _m").fetchall()[0][0]
                t1 = time.perf_counter()
                it.match_s += t1 - t0
                threshold = self.match_limit << st.times_banned
                if self.scheduler == "backoff" and matches > threshold:
                    st.banned_until = rnd + (self.ban_length << st.times_banned)
                    st.times_banned += 1
                    any_banned = True
                    stats.append((rnd, c.rule, matches, 0, 0, t1 - t0, True))
                    continue  # the matches are not applied, so `since` stays
                st.since = rnd
                capped |= cap is not None and matches >= cap  # (matches past the cap are lost)
                new_nodes = applied = 0
                if matches:
                    # with cycle filtering, right sides get e-classes of their own first, so the check
                    # sees what each union would join
                    filtering = self.cycle_filter and c.multi
                    for b in c.builds:
                        res = g.insert_from(BY_TYPE[b.op], b.source, ts=rnd, limit=max(node_budget, 0),
                                            result=b.name, target=None if filtering else b.target)
                        new_nodes += res.new_nodes
                        node_budget -= res.new_nodes
                        applied += res.targeted  # an application that needs no union
                    if filtering:
                        cyclic_matches(g, c.pairs)
                        for t in ("_m",) + c.results:  # the unions read these
                            g.con.execute(f"DELETE FROM {t} WHERE mid IN (SELECT mid FROM _cyc)")
                    before = g.con.execute("SELECT count(*) FROM pending").fetchall()[0][0]
                    for u in c.unions:
                        g.union_from(u)
                    applied += g.con.execute("SELECT count(*) FROM pending").fetchall()[0][0] - before
                    for b in c.builds:  # free the rule's intermediate tables before the next rule
                        g.con.execute(f"DROP TABLE IF EXISTS {b.name}")
                t2 = time.perf_counter()
                it.apply_s += t2 - t1
                it.applied += applied
                it.new_nodes += new_nodes
                report.applied_by_rule[c.rule] = report.applied_by_rule.get(c.rule, 0) + applied
                stats.append((rnd, c.rule, matches, applied, new_nodes, t2 - t0, False))
            t3 = time.perf_counter()
            rb = g.rebuild(ts=rnd)
            it.rebuild_s = time.perf_counter() - t3
            it.unions = rb.unions
            counts = g.counts()
            it.enodes, it.eclasses = counts["enodes"], counts["eclasses"]
            report.iterations.append(it)
            report.statements.append(counter.count)
            self._record(it, stats)
            if self.on_round:
                self.on_round(it)
            if node_budget <= 0 or capped:  # matches were left unapplied for want of nodes
                report.stop_reason = StopReason.NODE_LIMIT
                break
            if it.new_nodes == 0 and it.unions == 0 and not any_banned:
                report.stop_reason = StopReason.SATURATED
                break
        else:
            report.stop_reason = StopReason.ITERATION_LIMIT
        counter.restore()
        report.seconds = time.perf_counter() - start
        g.con.execute("UPDATE iterations SET stop_reason = ? WHERE round = (SELECT max(round) FROM iterations)",
                      [report.stop_reason.value])
        return report

    def _record(self, it: Iteration, stats: list[tuple]) -> None:
        g = self.egraph
        g.con.execute("INSERT INTO iterations VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                      [it.round, it.enodes, it.eclasses, it.match_s, it.apply_s, it.rebuild_s, it.applied, it.unions])
        if stats:
            cols = list(zip(*stats))
            frame = {"round": np.array(cols[0]), "rule": np.array(cols[1], dtype=object),
                     "matches": np.array(cols[2]), "applied": np.array(cols[3]), "new_nodes": np.array(cols[4]),
                     "seconds": np.array(cols[5], dtype=float), "banned": np.array(cols[6], dtype=bool)}
            g.con.register("_stats", frame)
            g.con.execute("INSERT INTO rule_stats SELECT * FROM _stats")
            g.con.unregister("_stats")


class _StatementCounter:
    """Counts SQL statements sent on the e-graph's connection (for the per-round statement test)."""

    def __init__(self, g: EGraph) -> None:
        self.g, self.real, self.count = g, g.con, 0
        counter = self

        class _Counting:
            def execute(self, *a, **k):
                counter.count += 1
                return counter.real.execute(*a, **k)

            def __getattr__(self, name):
                return getattr(counter.real, name)

        g.con = _Counting()

    def reset(self) -> None:
        self.count = 0

    def restore(self) -> None:
        self.g.con = self.real
