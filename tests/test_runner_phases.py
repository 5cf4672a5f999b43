"""The runner's scheduler interface: custom schedulers, the backoff scheduler's bans, simple = default."""

from pathlib import Path

import numpy as np
import pytest

from relsat.driver.boundary import zoo
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.search.runner import (BackoffScheduler, Limits, Runner, Scheduler, SimpleScheduler,
                                  StopReason)
from relsat.programs.parser import load_rules
from relsat.relations.egraph import EGraph

RULES = Path(__file__).parent.parent / "programs" / "rules"
AC_ADD = list(load_rules(RULES / "ac-add.rules").rules)  # add-comm, add-assoc


def add_chain(n):
    g = EGraph()
    x = g.add("Input", attrs={"name": np.array([f"x{i}" for i in range(n)], dtype=object), "shape": [4],
                              "dtype": 1})
    acc = x[0]
    for i in range(1, n):
        acc = g.add("Add", {"a": [acc], "b": [x[i]]})[0]
    return g


def stats(g):
    """rule_stats without the timings."""
    return g.sql("SELECT round, rule, matches, applied, new_nodes, banned FROM rule_stats ORDER BY round, rule")


class Prefix(Scheduler):
    """Only the rules whose name starts with ``prefix``."""

    def __init__(self, prefix):
        self.prefix = prefix

    def select(self, round, rules):
        return [r for r in rules if r.rule.startswith(self.prefix)]


class RoundRobin(Scheduler):
    """One rule per round, in turn; a fixpoint only once every rule has had a quiet turn in a row."""

    def __init__(self):
        self.quiet = 0

    def select(self, round, rules):
        self.n = len(rules)
        return [rules[(round - 1) % len(rules)]]

    def matched(self, round, rule, matches):
        self.quiet = self.quiet + 1 if matches == 0 else 0
        return True

    def can_stop(self, round):
        return self.quiet >= self.n


class RefuseFirst(Scheduler):
    """Every rule, but round 1's matches are refused (banned)."""

    def select(self, round, rules):
        return list(rules)

    def matched(self, round, rule, matches):
        return round > 1

    def can_stop(self, round):
        return round > 1  # round 1 changed nothing only because its matches were refused


def test_a_custom_scheduler_picks_the_rules_that_fire():
    g = add_chain(5)
    report = Runner(g, AC_ADD, Limits(iterations=20, enodes=10**6, seconds=60), scheduler=Prefix("add-comm")).run()
    assert report.stop_reason == StopReason.SATURATED
    assert {r for (r,) in g.sql("SELECT DISTINCT rule FROM rule_stats")} == {"add-comm"}
    assert g.sql("SELECT sum(applied) FROM rule_stats")[0][0] > 0
    assert set(report.applied_by_rule) == {"add-comm"}
    # commutativity alone: each of the 4 Adds gets its mirror, nothing else
    assert g.sql("SELECT count(*) FROM enodes WHERE op = 'Add'")[0][0] == 8


def test_round_robin_runs_one_rule_per_round_until_all_are_quiet():
    g = add_chain(4)
    report = Runner(g, AC_ADD, Limits(iterations=100, enodes=10**6, seconds=60), scheduler=RoundRobin()).run()
    assert report.stop_reason == StopReason.SATURATED
    rows = g.sql("SELECT round, rule FROM rule_stats ORDER BY round")
    assert [r for r, _ in rows] == list(range(1, len(report.iterations) + 1))  # one row per round
    # the runner hands the rules over in name order, whatever their order in the file
    assert [name for _, name in rows] == [("add-assoc", "add-comm")[i % 2] for i in range(len(rows))]
    full = add_chain(4)
    Runner(full, AC_ADD, Limits(iterations=100, enodes=10**6, seconds=60), scheduler="simple").run()
    assert g.counts() == full.counts()  # the same fixpoint, reached differently
    assert len(report.iterations) > len(full.sql("SELECT * FROM iterations"))


def test_refused_matches_are_banned_and_seen_again():
    g = add_chain(5)
    Runner(g, AC_ADD, Limits(iterations=2, enodes=10**6, seconds=60), scheduler=RefuseFirst()).run()
    rows = stats(g)
    first = [r for r in rows if r[0] == 1]
    second = [r for r in rows if r[0] == 2]
    assert first and all(banned and applied == 0 and new == 0 for _, _, _, applied, new, banned in first)
    assert g.sql("SELECT new_nodes FROM rule_stats WHERE round = 1") == [(0,), (0,)]
    assert not any(banned for *_, banned in second)
    # semi-naive: the refused matches stay new (round 1 added no rows), so round 2 matches and applies them
    comm = {rnd: (m, applied) for rnd, rule, m, applied, *_ in rows if rule == "add-comm"}
    assert comm[1] == (4, 0) and comm[2] == (4, 4)


def test_backoff_bans_a_rule_with_many_matches():
    g = add_chain(8)
    report = Runner(g, AC_ADD, Limits(iterations=8, enodes=10**6, seconds=60),
                    scheduler=BackoffScheduler(match_limit=50, ban_length=2)).run()
    banned = g.sql("SELECT round, rule, matches FROM rule_stats WHERE banned ORDER BY round, rule")
    assert banned and all(m > 50 for _, _, m in banned)
    rnd, rule, _ = banned[0]
    # first ban: the rule sits out at most ban_length rounds (fewer when a round goes quiet: the ban is
    # fast-forwarded), then runs again with twice the threshold
    later = [r for (r,) in g.sql("SELECT round FROM rule_stats WHERE rule = ? AND round > ? ORDER BY round",
                                 [rule, rnd])]
    quiet = {it.round for it in report.iterations if it.new_nodes == 0 and it.unions == 0}
    assert later[0] == (rnd + 1 if rnd in quiet else rnd + 3)
    assert report.stop_reason == StopReason.ITERATION_LIMIT  # a round with a banned rule is no fixpoint
    # the same as naming the scheduler
    named = add_chain(8)
    Runner(named, AC_ADD, Limits(iterations=8, enodes=10**6, seconds=60), scheduler="backoff",
           match_limit=50).run()
    assert stats(named) == stats(g) and named.counts() == g.counts()


class MatchThenBan(BackoffScheduler):
    """The backoff scheduler without ``limit``: every rule's matches are stored before a ban drops them."""

    def limit(self, round, rule):
        return None


def test_a_ban_counted_past_the_limit_leaves_the_egraph_of_a_ban_after_matching():
    """A rule likely to pass the backoff threshold is counted only to one past it, and a ban stores none of its
    matches; the e-graph (ids included), the bans and every applied run's counts are those of matching first."""
    runs = {}
    for name, sched in (("counted", BackoffScheduler(match_limit=50, ban_length=2)),
                        ("matched", MatchThenBan(match_limit=50, ban_length=2))):
        g = add_chain(9)
        Runner(g, AC_ADD, Limits(iterations=14, enodes=10**6, seconds=60), scheduler=sched).run()
        runs[name] = (g.fingerprint(), stats(g))
        g.close()
    (fp, counted), (fp_matched, matched) = runs["counted"], runs["matched"]
    assert fp == fp_matched
    assert [r[:2] + r[3:] for r in counted if not r[5]] == [r[:2] + r[3:] for r in matched if not r[5]]
    assert [(r[0], r[1]) for r in counted if r[5]] == [(r[0], r[1]) for r in matched if r[5]]
    # some bans were decided on the count alone: one past the threshold (50 << bans), fewer than all the matches
    cut = [(c[2], m[2]) for c, m in zip(counted, matched) if c[5] and c[2] != m[2]]
    assert cut and all(c < m and c - 1 in {50 << k for k in range(8)} for c, m in cut)


def test_a_quiet_round_fast_forwards_the_bans():
    """egg's fast-forward: when a round changes nothing while rules are banned, the earliest ban ends
    at once, so no round waits a ban out doing nothing, and the run still saturates exactly."""
    g = add_chain(9)
    report = Runner(g, AC_ADD, Limits(iterations=30, enodes=10**8, seconds=120), scheduler="backoff",
                    match_limit=2000, ban_length=8).run()
    assert report.stop_reason == StopReason.SATURATED
    assert g.sql("SELECT count(*), count(DISTINCT out) FROM op_add")[0] == (3**9 - 2**10 + 1, 2**9 - 9 - 1)
    # no round idles with every rule banned: each one matched some rule (applied, or banned anew)
    matched = {r for (r,) in g.sql("SELECT DISTINCT round FROM rule_stats")}
    assert matched == {it.round for it in report.iterations}
    assert len(report.iterations) <= 24  # without fast-forward, bans of 8, 16, 32 ... rounds idle
    # a rule released by a fast-forward is not banned again at once: no ban in the round after a quiet one
    quiet = [it.round for it in report.iterations if it.new_nodes == 0 and it.unions == 0]
    after = g.sql("SELECT round, bool_or(banned) FROM rule_stats GROUP BY round")
    released = [banned for rnd, banned in after if rnd - 1 in quiet]
    assert len(released) >= 3 and not any(released)


# 5 to 8 with -m slow: 9 is the size where the default iteration limit matters, and
# tests/test_saturation.py::test_ac_add_exact_sizes checks 8 by default
@pytest.mark.parametrize("n", [2, 3, 4, *(pytest.param(n, marks=pytest.mark.slow) for n in (5, 6, 7, 8)), 9])
def test_ac_add_is_exact_with_the_default_scheduler_and_limits(n):
    """``relsat optimize --rules ac-add`` with default scheduler settings and iteration limit: the
    exact e-graph (2^n - n - 1 Add e-classes, 3^n - 2^(n+1) + 1 Add e-nodes), node limit raised only."""
    from relsat.driver.options import DEFAULTS

    g = add_chain(n)
    limits = Limits(DEFAULTS.iter_limit, 10**8, DEFAULTS.time_limit, DEFAULTS.multi_rounds)
    report = Runner(g, AC_ADD, limits, scheduler=DEFAULTS.scheduler).run()
    assert report.stop_reason == StopReason.SATURATED
    assert g.sql("SELECT count(*) FROM enodes WHERE op = 'Add'")[0][0] == 3**n - 2**(n + 1) + 1
    assert g.sql("SELECT count(DISTINCT eclass) FROM enodes WHERE op = 'Add'")[0][0] == 2**n - n - 1


def test_unknown_scheduler_name_is_refused_and_the_connection_is_restored():
    g = add_chain(3)
    con = g.con
    with pytest.raises(ValueError, match="scheduler"):
        Runner(g, AC_ADD, scheduler="fastest").run()

    class Broken(SimpleScheduler):
        def select(self, round, rules):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        Runner(g, AC_ADD, scheduler=Broken()).run()
    assert g.con is con
    assert g.sql("SELECT current_setting('preserve_insertion_order')")[0][0] is True


def test_simple_scheduler_is_the_default_on_a_zoo_model():
    rules = list(load_rules(RULES / "default.rules").rules)
    model = zoo.build("resnet50", small=True)
    graphs, reasons = [], []
    for sched in (SimpleScheduler(), None):
        g = import_model(model).egraph
        kw = {"scheduler": sched} if sched else {}
        reasons.append(Runner(g, rules, Limits(iterations=10, enodes=50_000, seconds=600), **kw).run().stop_reason)
        graphs.append(g)
    assert reasons[0] == reasons[1] != StopReason.TIME_LIMIT
    assert graphs[0].counts() == graphs[1].counts()
    assert graphs[0].sql("SELECT count(*) FROM rule_stats WHERE applied > 0")[0][0] > 0
    assert graphs[0].table_counts() == graphs[1].table_counts()
    assert stats(graphs[0]) == stats(graphs[1])


def test_memory_limit_and_temp_dir_reach_duckdb_and_saturation_stays_exact(tmp_path):
    """``--memory-limit`` / ``--temp-dir``: the e-graph's DuckDB runs under them (it spills to the
    folder past the limit) and ac-add still reaches the exact e-graph."""
    g = EGraph(tmp_path / "e.duckdb", memory_limit="200MB", temp_dir=tmp_path / "spill")
    assert g.sql("SELECT current_setting('memory_limit'), current_setting('temp_directory')") == [
        ("190.7 MiB", str(tmp_path / "spill"))]
    x = g.add("Input", attrs={"name": np.array([f"x{i}" for i in range(8)], dtype=object), "shape": [4], "dtype": 1})
    acc = x[0]
    for i in range(1, 8):
        acc = g.add("Add", {"a": [acc], "b": [x[i]]})[0]
    Runner(g, AC_ADD, Limits(30, 10**8, 120, 1)).run()
    assert g.sql("SELECT count(*), count(DISTINCT out) FROM op_add")[0] == (3**8 - 2**9 + 1, 2**8 - 8 - 1)
    g.close()


def test_optimize_runs_its_egraph_under_the_memory_limit(tmp_path):
    from relsat.driver.app.optimize import optimize

    model = zoo.build("squeezenet", small=True)
    res = optimize(model, memory_limit="300MB", temp_dir=tmp_path / "spill", cost_model="analytic", measure=False,
                   candidates=0, keep_egraph=True)
    assert res.report["verification"]["ok"]
    assert res.egraph.sql("SELECT current_setting('memory_limit')") == [("286.1 MiB",)]
    res.egraph.close()


def test_a_bad_memory_limit_is_a_one_line_error():
    from relsat.driver.errors import RelsatError
    from relsat.driver.options import DEFAULTS

    with pytest.raises(RelsatError, match="--memory-limit lots"):
        DEFAULTS.replace(memory_limit="lots").check()


# ~15 s. The memory limit and temp dir reaching DuckDB stay checked by default in
# test_memory_limit_and_temp_dir_reach_duckdb_and_saturation_stays_exact and
# test_optimize_runs_its_egraph_under_the_memory_limit; only the temp_mib figure is read only here
@pytest.mark.slow
def test_iterations_report_the_temp_files_of_a_round(tmp_path):
    """``iterations.temp_mib``: what DuckDB spilled to its temp directory, by round; nothing without a memory
    limit, something once the e-graph outgrows a small one (issue 30, item 3)."""
    free = add_chain(8)
    free_report = Runner(free, AC_ADD, Limits(iterations=50, enodes=10**7, seconds=600)).run()
    assert [it.temp_mib for it in free_report.iterations] == [0.0] * len(free_report.iterations)
    tight = add_chain(10)
    tight.con.execute(f"SET temp_directory = '{tmp_path}'")
    tight.con.execute("SET memory_limit = '60MB'")
    report = Runner(tight, AC_ADD, Limits(iterations=50, enodes=10**7, seconds=600)).run()
    stored = [m for (m,) in tight.sql("SELECT temp_mib FROM iterations ORDER BY round")]
    assert stored == [it.temp_mib for it in report.iterations]
    assert max(stored) > 0
