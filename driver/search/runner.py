"""The saturation runner: rounds of match -> apply -> rebuild over compiled rules.

This module owns the loop that saturates an ``EGraph`` with a list of rules: it
compiles them (``programs.compiler``), runs them in rounds, decides when to stop,
and stores what happened in the ``iterations`` and ``rule_stats`` tables.  Like
egg's ``Runner``: ``Limits`` (iterations, e-nodes, seconds, plus TENSAT's
``multi_rounds``: multi-pattern rules run only in the first rounds), a
``Scheduler``, one ``Iteration`` record per round and a ``StopReason``.

The phases of a round, one method each:

- ``_check_limits``: before the round, the e-node and time limits.
- ``_eligible``: the rules of this round (multi-pattern rules past their round
  budget left out); the scheduler chooses among them.
- ``_survey`` and ``_ready``: the op tables' ts ranges, the edge types and attribute kinds the rules
  need (``driver.search.prefilter``), and the rules that can now match compiled: a rule is compiled
  the first round it can match, and until then runs as a rule that matched nothing, without SQL.
- ``_match``: one rule's matches into its temp table (``Compiled.matches``); semi-naive (only
  matches that use a row newer than the rule's previous run; rows a rebuild
  rewrote count as new), capped so whole matches fit the round's e-node budget
  (the least match rows are kept: the cap keeps the same matches every run).  A
  rule whose matches pass the chunk budget is counted, then matched and applied in
  parts (``_parts``); under a cap that cuts, whole parts are applied in their order
  while the cap allows and the part where it runs out keeps its least rows (a sort of
  one part, not of every match): as deterministic, but not the same matches as the
  cut of the whole (the same number of them).
- ``_apply``: that rule's right sides inserted (hash-consed) and its unions
  queued; for multi-pattern rules with ``cycle_filter``, an application whose
  unions would make an e-class depend on itself is dropped (``relations.reach``);
  then the rule's build results are dropped.  A rule that is not ``rulesets.hand_written``
  (generated, a user's: checked on random draws only) has each match checked: one
  whose right side's shape or dtype is not its left side's is left out, not a
  ShapeConflict that ends the run, and counted in ``Report.conflicts`` (a notice
  of ``relsat optimize``); a hand-written rule's conflict is a bug, raised.
  The matches table (replaced rule by
  rule) and the cycle filter's tables belong to the run (``EGraph.scratch``) and
  are dropped when it ends: a run leaves no temp table behind.
  Rules are matched and applied one after the other, in name order, but every
  rule matches the e-graph as it stood at the start of the round (rows of earlier
  rounds only, by their ``ts``: one snapshot, as in egg and egglog), so a round's
  result does not depend on the order of the rules in a file; at a node limit the
  budget goes to the rules in name order, so the cut is the same too.
- ``_rebuild``: the queued unions merged and congruence restored.
- ``_record``: the ``Iteration`` and the rules' statistics stored.
- ``_check_stop``: after the round, ``node limit`` (matches were left out for want
  of e-nodes), ``saturated`` (nothing changed and the scheduler agrees) or ``slow growth``
  (``Limits.slow_rounds`` rounds in a row each added under ``SLOW_GROWTH`` e-nodes and merged nothing).

The scheduler interface (``Scheduler``): ``select(round, rules)`` gives the rules
that run this round; ``matched(round, rule, matches)`` sees each rule's match
count and says whether they are applied (not applied: the rule is banned, shown as
``rule_stats.banned``, and its matches stay new for its next run);
``limit(round, rule)`` says how many it would apply at most (a rule likely to pass that is counted only to
one past it, and not matched, when it does: ``rule_stats.matches`` of such a ban is that count);
``can_stop(round)`` says whether a round that changed nothing is a fixpoint.
``SimpleScheduler`` runs every rule every round; ``BackoffScheduler`` (the
default) bans a rule whose matches exceed its threshold for a few rounds, both
doubling each time, and fast-forwards the bans when a round changes nothing (the
earliest ban ends at once, and the rule it held is not banned again at once), so no
round idles waiting for a ban to run out.
``Runner(scheduler=...)`` takes ``"simple"``, ``"backoff"`` (built from
``match_limit`` and ``ban_length``) or a ``Scheduler``.

Python iterates over rules only, never over matches or e-nodes: the SQL statements
per round depend on the number of rules, never on the number of matches.  The
e-node limit is honoured inside a round by capping each rule's matches and each
insert.  While it runs, DuckDB's ``preserve_insertion_order`` is off: no statement
here depends on row order, and saturation is deterministic (the same model, rules
and limits give the same tables, ids included, every run and at any number of
DuckDB threads) because every choice is made by an order on the data: a cap keeps
the least match rows (in parts: the first parts whole, then the least rows of one),
an insert's LIMIT the least keys, new ids follow the key order
(``EGraph.insert_from``), and a union's root is the least id (``rebuild``).
"""

from __future__ import annotations

import abc
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

import numpy as np

from relsat.programs.compiler import (BUILD_ROW_ID, MATCH_ROWS, MATCHES, SNAPSHOT_ALL, Compiled, Needs, compile_rule,
                                     lhs_needs, lhs_tables)
from relsat.programs.ir import Rule
from relsat.programs.rulesets import checked_rules
from relsat.relations.catalog import BY_TYPE
from relsat.relations.egraph import EGraph, classes_agree
from relsat.relations.schema import literal
from relsat.relations.reach import cyclic_matches

from relsat.driver.options import DEFAULTS, NODE_LIMIT, SLOW_GROWTH
from relsat.driver.search.prefilter import Survey
from relsat.driver.search.treematch import TreeFilter


WHOLE_ROWS = 20_000  # a rule whose tables hold at most this many rows in all is matched as one join over all of them
# (``Compiled.match_live(whole=True)``) rather than one join per semi-naive part: planning the parts cost more than
# reading the old rows again (ViT-B/16's default rules at round 10: 0.61 -> 0.33 s over 81 rules, GELU's 8-part
# pattern 33 -> 7 ms)
GROWTH = 8  # a rule whose last matches times this reach the chunk budget is counted before it is matched
SAMPLE_ROWS = 10_000  # an application of this many matches or more is followed by a look at DuckDB's temp files
# (``Iteration.temp_mib``); a smaller one spills nothing of its own, and the look costs a statement (1 ms)
ROW_BYTES = 1000  # memory per match row of one application (the matches, the build tables, the lookups and
# the new rows each holds): ``--memory-limit`` over this is the most rows applied at once (``Runner.chunk_budget``)
CHUNK_FLOOR = 4_000_000  # where the memory limit allows more, one application holds at most this many match rows
CHUNK_PER_ENODE = 8  # or, in a larger e-graph, this many per e-node (``Runner._chunk``): a round's working tables
# stay near the e-graph's own size instead of its largest rule's matches (ac-add n = 12 through ``relsat optimize``:
# peak RSS 1.4 -> 0.7 GB, 11.3 million matches applied in three parts)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40, "bytes": 1}


def fill_matches(con, rows: str, offset: int | None = 0) -> int:
    """The rows of the SELECT ``rows`` as the matches: written to the table ``MATCH_ROWS``, read through the view
    ``MATCHES``, which numbers them ``mid`` = ``offset`` + 1, + 2, ... by row id (a table just written holds row
    ids 0 to n - 1: ``tests/test_saturation.py``), so that no window runs over every match (``row_number() OVER
    ()`` cost a fifth to a third of the statement, on one thread); ``offset=None``: the rows carry their own
    ``mid``. Returns the rows written."""
    n = con.execute(f"CREATE OR REPLACE TEMP TABLE {MATCH_ROWS} AS {rows}").fetchall()[0][0]
    number = "" if offset is None else f"rowid + {int(offset) + 1} AS mid, "
    con.execute(f"CREATE OR REPLACE TEMP VIEW {MATCHES} AS SELECT {number}* FROM {MATCH_ROWS}")
    return n


def parse_size(text: str) -> float:
    """Bytes of a DuckDB size setting such as ``'3.7 GiB'`` or ``'512MB'``."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS | {"": 1}:
        raise ValueError(f"not a size: {text!r}")
    return float(m.group(1)) * _UNITS.get(m.group(2).lower(), 1)


class StopReason(str, Enum):
    SATURATED = "saturated"
    ITERATION_LIMIT = "iteration limit"
    NODE_LIMIT = "node limit"
    TIME_LIMIT = "time limit"
    SLOW_GROWTH = "slow growth"


@dataclass
class Limits:
    iterations: int = DEFAULTS.iter_limit
    enodes: int = NODE_LIMIT
    seconds: float = DEFAULTS.time_limit
    multi_rounds: int = DEFAULTS.multi_rounds  # rounds in which multi-pattern rules run (the first ones)
    slow_rounds: int = DEFAULTS.slow_rounds  # stop after this many slow rounds in a row (0: never; ``_check_stop``)


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
    temp_mib: float = 0.0  # the largest size of DuckDB's temp files (what spilled past --memory-limit), sampled
    # after each application of at least ``SAMPLE_ROWS`` matches and after the rebuild


@dataclass
class Report:
    iterations: list[Iteration] = field(default_factory=list)
    stop_reason: StopReason | None = None
    applied_by_rule: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    statements: list[int] = field(default_factory=list)  # SQL statements executed per round
    dropped: int = 0  # matches left unapplied because the node limit cut them (how much the limit cut)
    conflicts: dict[str, int] = field(default_factory=dict)  # per rule, matches left out whose right side's shape
    # or dtype is not their left side's: the rule does not hold for those operands (``Runner._apply_matches``)
    in_parts: int = 0  # rule runs whose matches were applied in parts (``Runner._parts``)


# --- schedulers ---------------------------------------------------------------------------------


class Scheduler(abc.ABC):
    """Decides which rules run in each round (egg's ``RewriteScheduler``).

    ``rules`` are the run's rules (``RuleState``: ``rule`` its name, ``multi``), the same objects in every round
    of a run (a scheduler may key its state on them by identity).  A scheduler object keeps its state across runs.
    """

    @abc.abstractmethod
    def select(self, round: int, rules: Sequence[RuleState]) -> list[RuleState]:
        """The rules (of ``rules``) to match in this round, in the order they run."""

    def matched(self, round: int, rule: RuleState, matches: int) -> bool:
        """``rule`` found ``matches`` matches: apply them (True) or ban the rule for now (False)."""
        return True

    def limit(self, round: int, rule: RuleState) -> int | None:
        """The most matches of ``rule`` that ``matched`` would apply now (None: any number).  A rule likely to
        pass it is counted only up to one past it first (``Runner._past_limit``), and ``matched`` is then handed
        that count: its matches are not stored for a ban."""
        return None

    def can_stop(self, round: int) -> bool:
        """This round changed nothing: whether that is saturation (False while rules are held back)."""
        return True


class SimpleScheduler(Scheduler):
    """Every rule, every round."""

    def select(self, round: int, rules: Sequence[RuleState]) -> list[RuleState]:
        return list(rules)


@dataclass
class _Ban:
    until: int = -1  # banned through this round
    times: int = 0  # bans so far
    forced: bool = False  # released by a fast-forward: its next matches are applied whatever their count


class BackoffScheduler(Scheduler):
    """Bans a rule whose matches exceed ``match_limit << times_banned`` for
    ``ban_length << times_banned`` rounds (egg's ``BackoffScheduler``).  A round in which a rule
    was banned or held back by a ban is not saturation."""

    def __init__(self, match_limit: int = 20_000, ban_length: int = 2) -> None:
        self.match_limit, self.ban_length = match_limit, ban_length
        self._bans: dict[int, _Ban] = {}  # id(rule) -> its bans
        self._held: dict[int, bool] = {}  # round -> a rule was banned in it

    def _ban(self, rule: RuleState) -> _Ban:
        return self._bans.setdefault(id(rule), _Ban())

    def select(self, round: int, rules: Sequence[RuleState]) -> list[RuleState]:
        chosen = [r for r in rules if round > self._ban(r).until]
        self._held[round] = len(chosen) < len(rules)
        return chosen

    def matched(self, round: int, rule: RuleState, matches: int) -> bool:
        ban = self._ban(rule)
        if matches <= self.match_limit << ban.times or ban.forced:
            ban.forced = False
            return True
        ban.until = round + (self.ban_length << ban.times)
        ban.times += 1
        self._held[round] = True
        return False

    def limit(self, round: int, rule: RuleState) -> int | None:
        ban = self._ban(rule)
        return None if ban.forced else self.match_limit << ban.times

    def can_stop(self, round: int) -> bool:
        """A quiet round is saturation only when no rule is banned; otherwise the bans are
        fast-forwarded (egg's ``can_stop``): the earliest still running ends now and the others are
        shortened by as much, so the next round runs that rule instead of waiting quiet rounds out.
        A rule released so is not banned again at once (unlike egg): with nothing else left to do, a
        ban would only cost another quiet round and another match of the same rows."""
        pending = [b for b in self._bans.values() if b.until > round]
        if not pending:
            return not self._held.get(round, False)
        skip = min(b.until for b in pending) - round
        for b in pending:
            b.until -= skip
            b.forced = b.until == round
        return False


SCHEDULERS = {"simple": SimpleScheduler, "backoff": BackoffScheduler}


# --- the runner ---------------------------------------------------------------------------------


@dataclass(eq=False)
class RuleState:
    """One rule of a run, what a ``Scheduler`` is handed: its name (``rule``), ``multi``, and its compiled SQL once
    it can match (``Runner._ready``)."""

    ir: Rule
    tables: tuple[str, ...]  # the op tables its left side joins (``lhs_tables``)
    needs: Needs | None = None  # read once its op tables all hold rows, with the prefilter (``Runner._survey``)
    compiled: Compiled | None = None  # compiled once the e-graph has what it needs (``Runner._ready``)
    since: int = 0  # semi-naive: rows with ts >= since are new for this rule
    last: int = 0  # its matches when it last matched something (whether the next run counts them first: ``_parts``)
    past: bool = False  # its last run was banned on a count that stopped past the scheduler's limit: ``last`` is
    # less than its matches then, so its next application counts them first (``_parts``)

    @property
    def rule(self) -> str:
        return self.ir.name

    @property
    def multi(self) -> bool:
        return len(self.ir.patterns) > 1


@dataclass
class _Run:
    """What one ``run()`` carries from round to round."""

    rules: list[RuleState]
    scheduler: Scheduler
    first_round: int
    start: float
    scratch: object  # the run's temp tables (``EGraph.scratch``): matches, cycle filter; dropped at its end
    survey: Survey  # the edge types the rules' left sides need that the e-graph has
    tree: TreeFilter  # the ready rules' left sides as data: which can match in a round (``_tree``)
    chunk: int = 0  # the most match rows applied at once (``Runner.chunk_budget``; 0: never in parts)
    report: Report = field(default_factory=Report)
    slow: int = 0  # slow rounds in a row, up to the last (``_check_stop``)
    lean: dict = field(default_factory=dict)  # rule -> whether its explanations store only what varies (``_lean``)
    mid_base: int = 1  # the ``mid`` of the matches table's first row (``fill_matches``)
    checked: frozenset = frozenset()  # the rules whose matches are checked one by one (``checked_rules``)


class RuleStat(NamedTuple):
    """One row of ``rule_stats``: a rule in a round (its columns, in their order)."""

    round: int
    rule: str
    matches: int
    applied: int
    new_nodes: int
    seconds: float
    banned: bool


@dataclass
class _Round:
    """What the phases of one round hand on to each other."""

    it: Iteration
    budget: int  # e-nodes that may still be added in this round
    enodes: int  # e-nodes as it began
    stats: list[RuleStat] = field(default_factory=list)  # rule_stats rows
    capped: bool = False  # a rule's matches were cut to fit the budget
    newest: dict = field(default_factory=dict)  # op table -> its newest row's ts (absent: the table is empty)
    oldest: dict = field(default_factory=dict)  # op table -> its oldest row's ts
    rows: dict = field(default_factory=dict)  # op table -> its rows
    blocked: set = field(default_factory=set)  # rules without a structural match this round (``Runner._tree``)
    values_dirty: bool = False  # a leaf (a constant) went into an existing e-class this round: the survey's
    # values, read as the round began, no longer tell which value predicates can hold (``Runner._live``)


@dataclass
class _Matches:
    """One rule's matches, in the temp table ``rule.compiled.matches``."""

    rule: RuleState
    count: int  # the matches to apply: after the cap
    cap: int | None  # the LIMIT put on them, if any
    seconds: float
    parts: list[str] = field(default_factory=list)  # chunked: the SELECTs of its parts, matched and applied one at a
    # time by ``_apply`` (the table is then empty until then); empty: the table holds all the matches
    cut: bool = False  # the cap cut them (``count`` is the cap): in parts, the part where it runs out keeps its least
    # rows and the parts after it are not matched


@dataclass
class _Parts:
    """A rule's matches split into parts (``Runner._parts``)."""

    count: int  # all its matches (before any cap)
    selects: list[str]  # part i: the matches whose first root is i modulo len(selects), in this order


@dataclass
class Runner:
    egraph: EGraph
    rules: list[Rule]
    limits: Limits = field(default_factory=Limits)
    scheduler: str | Scheduler = "backoff"  # "simple" | "backoff" | a Scheduler
    match_limit: int = 20_000  # backoff threshold (scaled by 2**times_banned)
    ban_length: int = 2
    semi_naive: bool = True
    cycle_filter: bool = True  # drop multi-pattern applications whose unions would close a cycle
    on_round: object = None  # callback(Iteration) for progress display
    prefilter: bool = True  # skip the rules and semi-naive parts that cannot match (``_live``); False: every
    # statement as compiled (the same e-graph, ids included: tests/test_prefilter.py)
    tree_match: bool = True  # with the prefilter: skip the rules whose left sides have no structural match in the
    # round, decided for all rules at once (``driver.search.treematch``; the same e-graph: tests/test_treematch.py)
    explain: bool = True  # record why each e-node exists (``explain_nodes``, ``explain_matches``, ``explain_unions``)
    chunk_rows: int | None = None  # the most match rows applied at once (``_parts``): None derives it from DuckDB's
    # memory_limit and the e-graph's size (``_chunk``), 0 never chunks
    _state: _Run | None = field(default=None, init=False, repr=False, compare=False)

    def run(self) -> Report:
        g = self.egraph
        order = g.con.execute("SELECT current_setting('preserve_insertion_order')").fetchall()[0][0]
        g.con.execute("SET preserve_insertion_order = false")  # lets DuckDB number and insert rows in parallel
        try:
            with g.scratch("run") as tmp:
                return self._saturate(tmp)
        finally:
            self._state = None
            g.con.execute(f"DROP VIEW IF EXISTS {MATCHES}")  # (its table went with the run's scratch)
            g.con.execute(f"SET preserve_insertion_order = {str(order).lower()}")

    def _saturate(self, tmp) -> Report:
        s = self._state = self._begin(tmp)
        counter = _StatementCounter(self.egraph)
        stop = StopReason.ITERATION_LIMIT
        try:
            for rnd in range(s.first_round, s.first_round + self.limits.iterations):
                counter.reset()
                enodes = self.egraph.counts()["enodes"]
                if (reason := self._check_limits(enodes)) is not None:
                    stop = reason
                    break
                r = _Round(Iteration(rnd, 0, 0, 0.0, 0.0, 0.0, 0, 0, 0), self.limits.enodes - enodes, enodes)
                eligible = self._eligible(rnd)
                self._survey(r, eligible)
                selected = s.scheduler.select(rnd, eligible)
                self._tree(r, selected)
                for st in selected:
                    if r.blocked and self.egraph.const_dirty:  # a class became constant: see ``_tree``
                        r.blocked -= s.tree.sensitive
                    # not compiled: it cannot match (``_ready``); blocked: no structural match (``_tree``)
                    sql = self._live(r, st) if st.compiled is not None and st.rule not in r.blocked else None
                    if sql is None:  # as a run that matched nothing, without its statements
                        banned = not s.scheduler.matched(rnd, st, 0)
                        if not banned:
                            st.since = rnd
                        r.stats.append(RuleStat(rnd, st.rule, 0, 0, 0, 0.0, banned))
                        continue
                    past = self._past_limit(r, st, sql)  # (count, seconds): more matches than the scheduler takes
                    if past is not None and not s.scheduler.matched(rnd, st, past[0]):
                        r.stats.append(RuleStat(rnd, st.rule, past[0], 0, 0, past[1], True))  # (none stored)
                        continue
                    m = self._match(r, st, sql)
                    if past is not None or s.scheduler.matched(rnd, st, m.count):
                        self._apply(r, m)
                    else:  # banned: the matches are not applied, so the rule's `since` stays
                        r.stats.append(RuleStat(rnd, st.rule, m.count, 0, 0, m.seconds, True))
                self._rebuild(r)
                s.report.statements.append(counter.count)
                self._record(r)
                if (reason := self._check_stop(r)) is not None:
                    stop = reason
                    break
        finally:
            counter.restore()
        return self._finish(stop)

    def _begin(self, tmp) -> _Run:
        """The rules' states (compiled later: ``_ready``), the scheduler, the clock; rounds go on from the stored
        ones.  ``tmp``: the run's scratch, which drops the matches table at the end."""
        # applied in name order: a round's result, ids and node-limit cut included, does not depend on
        # the order of the rules in a file
        rules = [RuleState(r, lhs_tables(r)) for r in sorted(self.rules, key=lambda r: r.name)]
        sched = self.scheduler
        if isinstance(sched, str):
            if sched not in SCHEDULERS:
                raise ValueError(f"unknown scheduler {sched!r} (one of {', '.join(SCHEDULERS)})")
            sched = (BackoffScheduler(self.match_limit, self.ban_length) if sched == "backoff"
                     else SCHEDULERS[sched]())
        start = time.perf_counter()
        last = self.egraph.con.execute("SELECT coalesce(max(round), 0) FROM iterations").fetchall()[0][0]
        tmp.keep(MATCH_ROWS)  # (the view MATCHES over it goes with it: ``_saturate``)
        tree = TreeFilter(tmp.claim("tree_terms"), tmp.claim("tree_matched"))
        return _Run(rules, sched, last + 1, start, tmp, Survey(), tree, self.chunk_budget(),
                    checked=checked_rules(self.rules))

    def _check_limits(self, enodes: int) -> StopReason | None:
        """Before a round: the e-node limit (``enodes`` now) and the time limit."""
        if enodes >= self.limits.enodes:
            return StopReason.NODE_LIMIT
        if time.perf_counter() - self._state.start > self.limits.seconds:
            return StopReason.TIME_LIMIT
        return None

    def _eligible(self, rnd: int) -> list[RuleState]:
        """The rules that may run in round ``rnd``, in name order, before the scheduler's choice: multi-pattern ones
        only in the first ``multi_rounds``."""
        s = self._state
        multi_done = rnd - s.first_round >= self.limits.multi_rounds
        return [st for st in s.rules if not (st.multi and multi_done)]

    def _survey(self, r: _Round, eligible: list[RuleState]) -> None:
        """The newest and oldest row's ts and the rows of every op table the eligible rules join (one statement;
        empty tables left out); then the edge types and literal-attribute kinds the rules need that are new since the
        last round (``Survey``: at most two statements, four in a round that adds needs); then the rules that can
        match compiled (``_ready``)."""
        tables = sorted({t for st in eligible for t in st.tables})
        if tables:
            sql = " UNION ALL ".join(f"SELECT '{t}', max(ts), min(ts), count(*) FROM {t}" for t in tables)
            for t, new, old, rows in self.egraph.con.execute(sql).fetchall():
                if new is not None:
                    r.newest[t], r.oldest[t], r.rows[t] = new, old, rows
        if self.prefilter:
            survey = self._state.survey
            fresh = [st for st in eligible if st.needs is None and all(t in r.newest for t in st.tables)]
            for st in fresh:
                st.needs = lhs_needs(st.ir)
            survey.add(st.needs for st in fresh)
            if tables:  # (what multi-pattern roots share: looked for while such a rule is eligible)
                shared = {n for st in eligible if st.needs is not None for n in st.needs.shared}
                survey.update(self.egraph.con, r.it.round, r.newest, shared)
        self._ready(r, eligible)

    def _ready(self, r: _Round, eligible: list[RuleState]) -> None:
        """Compile the eligible rules that can match now: their op tables all hold rows and (with the prefilter)
        the e-graph has the edge types and attribute kinds they need (a rule's needs are read once its tables hold
        rows: ``_survey``).  A generated rule set is mostly rules over operators, edges or shapes a model does not
        have: compiling all 2,624 of them cost 1.8 s a run (BERT), more than the statements of those that run.
        Until then a rule runs as one that matched nothing (as it would)."""
        survey = self._state.survey
        for st in eligible:
            if st.compiled is not None:
                continue
            if self.prefilter:
                ready = st.needs is not None and survey.allows(st.needs, values=False)
            else:
                ready = all(t in r.newest for t in st.tables)
            if ready:
                st.compiled = compile_rule(st.ir)

    def _tree(self, r: _Round, selected: Sequence[RuleState]) -> None:
        """The selected rules that would run a statement this round (``_live``'s checks short of the statement)
        but have no structural match, as ``r.blocked`` (``TreeFilter``: a handful of statements for all of
        them; none where too few rules would run).  The match reads constness as the round begins; an insert of
        the round can make an e-class constant (``EGraph.const_dirty``, never the other way before the rebuild),
        so from then on the rules that need a constant e-class run whatever it said (``TreeFilter.sensitive``)."""
        if not (self.prefilter and self.tree_match):
            return
        since = {}
        for st in selected:
            c = st.compiled
            if c is None or not c.tables or not all(t in r.newest for t in c.tables):
                continue
            first = st.since if self.semi_naive else 0
            if self._state.survey.allows(c) and any(r.newest[t] >= first for t in c.tables):
                since[st.rule] = first
                self._state.tree.add(st.ir)  # (once)
        possible = self._state.tree.possible(self.egraph.con, r.it.round, since, r.rows)
        if possible is not None:
            r.blocked = set(since) - possible

    def _live(self, r: _Round, st: RuleState, part: tuple[int, int] | None = None) -> str | None:
        """The SELECT of the rule's matches this round, or None when it is empty without running it: one of
        its tables is empty, an edge type its left side joins along is not in the e-graph (``Survey``), or
        (semi-naive) no table has a row newer than the rule's last run.  Semi-naive parts that are empty by
        the tables' ts ranges are left out (``Compiled.match_live``).  A generated rule set joins operators
        and shapes a model does not have; those statements are skipped, not their matches.  ``part``: one
        part of the matches (``Compiled.match_live``; ``_parts``)."""
        c = st.compiled
        since = st.since if self.semi_naive else 0
        if not c.tables:
            return c.match(since, r.it.round)
        if not all(t in r.newest for t in c.tables):
            return None
        if not self.prefilter:
            if not any(r.newest[t] >= since for t in c.tables):
                return None
            if part is None:
                return c.match(since, r.it.round)
            every = dict.fromkeys(c.tables, SNAPSHOT_ALL)  # every semi-naive part kept, as ``match`` does
            return c.match_live(since, r.it.round, every, dict.fromkeys(c.tables, -1), part=part)
        if not self._state.survey.allows(c, values=not r.values_dirty):
            return None
        whole = sum(r.rows[t] for t in c.tables) <= WHOLE_ROWS
        return c.match_live(since, r.it.round, r.newest, r.oldest, carry=self._carried(c), part=part, whole=whole)

    def _carried(self, c: Compiled) -> bool:
        """Whether the rule's match rows carry their e-nodes for its explanations (``Compiled.carry``)."""
        return bool(self.explain and self.prefilter and c.carry)

    def _past_limit(self, r: _Round, st: RuleState, rows: str) -> tuple[int, float] | None:
        """Where the scheduler applies at most ``limit`` matches of the rule now (``Scheduler.limit``) and its last
        matches times ``GROWTH`` pass that, its matches (``rows``) counted up to ``limit`` + 1 (a LIMIT: the join
        stops there); more than ``limit``: (that count, seconds), and the rule's matches are not stored, else None.
        A ban used to store every match first and drop them: at ac-add n = 12, 22 of the 44 million match rows
        stored, the largest round's 11.9 million among them."""
        limit = self._state.scheduler.limit(r.it.round, st)
        if limit is None or st.last * GROWTH <= limit:
            return None
        t0 = time.perf_counter()
        seen = self.egraph.con.execute(f"SELECT count(*) FROM (SELECT 1 FROM ({rows}) LIMIT {int(limit) + 1})"
                                       ).fetchall()[0][0]
        seconds = time.perf_counter() - t0
        r.it.match_s += seconds
        if seen <= limit:
            return None
        st.last, st.past = max(st.last, seen), True
        return seen, seconds

    def _match(self, r: _Round, st: RuleState, rows: str) -> _Matches:
        """The rule's matches (``rows``, from ``_live``: semi-naive, using a row newer than its last run)
        into ``c.matches``; or, where they would pass the chunk budget, only counted (``_parts``)."""
        c = st.compiled
        t0 = time.perf_counter()
        # a match builds at most len(builds) nodes: cap whole matches so the node budget is not
        # spent on partial right sides
        cap = max(r.budget, 0) // max(len(c.builds), 1) if c.builds else None
        parts = self._parts(r, st, rows)
        count = parts.count if parts is not None else self._fill(c, rows)
        cut = cap is not None and count > cap
        if cut:  # the same matches survive the cap whatever the threads (``_least``); in parts, ``_apply`` cuts
            if parts is None:
                self._least(c, cap)
            self._state.report.dropped += count - cap
            count = cap
        seconds = time.perf_counter() - t0
        r.it.match_s += seconds
        st.last, st.past = count or st.last, False
        return _Matches(st, count, cap, seconds, parts.selects if parts is not None else [], cut)

    def _fill(self, c: Compiled, rows: str, offset: int = 0) -> int:
        """``rows`` into the matches table, numbered from ``offset`` + 1 (``mid``); their count."""
        self._state.mid_base = offset + 1
        return fill_matches(self.egraph.con, rows, offset)

    def _least(self, c: Compiled, keep: int, offset: int = 0) -> None:
        """Only the least ``keep`` rows of the matches table kept, numbered from ``offset`` + 1: what a cap keeps
        (the same rows whatever the threads; sorted only when the cap cuts: a sort of every match costs more than
        the match)."""
        fill_matches(self.egraph.con, f"SELECT * FROM {MATCH_ROWS} ORDER BY ALL LIMIT {int(keep)}", offset)

    def _parts(self, r: _Round, st: RuleState, rows: str) -> _Parts | None:
        """Chunked application (bounded rounds): where the rule's matches may pass the chunk budget
        (``chunk_budget``: its last matches times ``GROWTH``, or the rows of its first pattern's table, reach it),
        they are counted first (one aggregate over the join, nothing stored); more than the budget are split into
        ``k`` parts by their first root modulo ``k`` (``Compiled.match_live``), each matched and applied in turn, in
        the order of ``i``, so the matches table and the build tables of one application stay near the budget
        however large the round.  Under a node-limit cap that cuts, whole parts are applied while the cap allows,
        the part where it runs out keeps its least rows (a sort of one part) and the parts after it are not
        matched (``_apply``): deterministic (the same tables, ids included, every run and at any thread count),
        the same number of matches as the cut of the whole, but not the same matches (that cut keeps the least
        of all of them, a sort of every match: at ac-add n = 15, 490 million rows spilled 75 GB).
        Returns the count and the parts' SELECTs, or None for one table: fewer matches, or a multi-pattern
        rule whose cycle filter checks its unions together."""
        c, budget = st.compiled, self._chunk(r)
        likely = max(st.last * GROWTH, r.rows.get(c.tables[0], 0) if c.tables else 0, budget if st.past else 0)
        if not budget or likely < budget or (self.cycle_filter and c.multi):
            return None
        count = self.egraph.con.execute(f"SELECT count(*) FROM ({rows})").fetchall()[0][0]
        if count <= budget:
            return None
        k = -(-count // budget)
        return _Parts(count, [self._live(r, st, part=(i, k)) for i in range(k)])

    def _chunk(self, r: _Round) -> int:
        """The most match rows applied at once in this round: ``chunk_rows`` where given, else the memory limit's
        budget (``chunk_budget``) or ``CHUNK_PER_ENODE`` per e-node (at least ``CHUNK_FLOOR``), the less."""
        chunk = self._state.chunk
        if self.chunk_rows is not None or not chunk:
            return chunk
        return min(chunk, max(CHUNK_FLOOR, CHUNK_PER_ENODE * r.enodes))

    def chunk_budget(self) -> int:
        """The most match rows applied at once by the memory limit: ``chunk_rows``, or DuckDB's memory_limit over
        ``ROW_BYTES`` (``_chunk`` may take fewer in a round)."""
        if self.chunk_rows is not None:
            return self.chunk_rows
        limit = self.egraph.con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0]
        return int(parse_size(limit) // ROW_BYTES)

    def _apply(self, r: _Round, m: _Matches) -> None:
        """Insert the rule's right sides for its matches and queue its unions (part by part where chunked)."""
        c, rnd = m.rule.compiled, r.it.round
        t1 = time.perf_counter()
        m.rule.since = rnd
        r.capped |= m.cap is not None and m.count >= m.cap  # (matches past the cap are lost)
        new_nodes = applied = 0
        if m.parts and m.count:  # (a cap of 0 applies no part)
            self._state.report.in_parts += 1
            offset = 0
            for rows in m.parts:  # each part's matches numbered on from the last's: mids unique in the round
                if m.cut and offset >= m.count:  # the cap ran out: the parts left are not matched
                    break
                t = time.perf_counter()
                count = self._fill(c, rows, offset)
                if m.cut and offset + count > m.count:  # the part where the cap runs out: its least rows
                    self._least(c, m.count - offset, offset)
                    count = m.count - offset
                spent = time.perf_counter() - t
                r.it.match_s += spent
                m.seconds += spent
                t1 += spent  # (matching, not application)
                offset += count
                if count:
                    n, a = self._apply_matches(r, c, count)
                    new_nodes, applied = new_nodes + n, applied + a
            if offset != m.count:
                raise AssertionError(f"rule {c.rule}: its {len(m.parts)} parts applied {offset} rows, not {m.count}")
        elif m.count:
            new_nodes, applied = self._apply_matches(r, c, m.count)
        t2 = time.perf_counter()
        r.it.apply_s += t2 - t1
        r.it.applied += applied
        r.it.new_nodes += new_nodes
        if m.count >= SAMPLE_ROWS:
            self._sample_temp(r)
        by_rule = self._state.report.applied_by_rule
        by_rule[c.rule] = by_rule.get(c.rule, 0) + applied
        r.stats.append(RuleStat(rnd, c.rule, m.count, applied, new_nodes, m.seconds + t2 - t1, False))

    def _apply_matches(self, r: _Round, c: Compiled, count: int) -> tuple[int, int]:
        """The right sides of the ``count`` matches in ``c.matches`` inserted, their unions queued, their
        explanations recorded, the build results dropped: (new e-nodes, applications)."""
        g, rnd = self.egraph, r.it.round
        new_nodes = applied = queued = conflicts = 0
        # with cycle filtering, right sides get e-classes of their own first, so the check
        # sees what each union would join
        filtering = self.cycle_filter and c.multi
        # many matches that nothing reads again (not the unions, the cycle filter or the explanations) go before the
        # next build, which then has their memory
        free = -1 if filtering or self.explain or count < SAMPLE_ROWS else c.last_read + 1
        for i, b in enumerate(c.builds):
            if i == free:
                g.con.execute(f"DROP TABLE IF EXISTS {MATCH_ROWS}")
            res = g.insert_from(BY_TYPE[b.op], b.source, ts=rnd, limit=max(r.budget, 0),
                                result=b.name, target=None if filtering else b.target,
                                changed_only=b.changed_only, origin=c.rule if self.explain else None,
                                rid=BUILD_ROW_ID, conflicts="drop" if c.rule in self._state.checked else "raise")
            conflicts += res.conflicts
            new_nodes += res.new_nodes
            r.budget -= res.new_nodes
            applied += res.targeted  # an application that needs no union
            r.values_dirty |= bool(res.targeted) and BY_TYPE[b.op].leaf
        if filtering:
            tmp = self._state.scratch
            cyclic = tmp.claim("cyclic")
            cyclic_matches(g, c.pairs, cyclic, tmp)
            # the unions read these (a match's row is found by its row id: ``fill_matches``)
            g.con.execute(f"DELETE FROM {MATCH_ROWS} WHERE rowid IN (SELECT mid - {self._state.mid_base} "
                          f"FROM {cyclic})")
            for t in c.results:
                g.con.execute(f"DELETE FROM {t} WHERE mid IN (SELECT mid FROM {cyclic})")
        for u in c.unions:  # (a hand-written rule's unions unchecked: one statement each, not two)
            q, left_out = g.union_agreeing(u) if c.rule in self._state.checked else (g.union_from(u), 0)
            queued, conflicts = queued + q, conflicts + left_out
        applied += queued
        if conflicts:
            report = self._state.report
            report.conflicts[c.rule] = report.conflicts.get(c.rule, 0) + conflicts
        if self.explain and (new_nodes or queued):
            self._explain(c, rnd, queued)
        for b in c.builds:  # free the rule's intermediate tables before the next rule (or part)
            g.con.execute(f"DROP TABLE IF EXISTS {b.name}")
        return new_nodes, applied

    def _explain(self, c: Compiled, rnd: int, queued: int) -> None:
        """Record the rule's productive applications of this round (two statements; its new e-nodes were
        recorded by ``insert_from``): the ``queued`` unions (``explain_unions``), and for every match that
        added an e-node or queued a union, the e-nodes its left side matched and its bindings
        (``explain_match_rows``, read as ``explain_matches``, from ``Compiled.witness``)."""
        g, rule = self.egraph, literal(c.rule)
        if queued:
            # (a checked rule's pairs whose e-classes differ in shape were left out: ``EGraph.union_agreeing``)
            joins, agree = ("", "") if c.rule not in self._state.checked else (
                " LEFT JOIN eclass ea ON ea.id = p.a LEFT JOIN eclass eb ON eb.id = p.b",
                f" AND {classes_agree('ea', 'eb')}")
            g.con.execute(f"INSERT INTO explain_unions SELECT {rule}, {int(rnd)}, p.mid, p.a, p.b FROM ({c.pairs}) "
                          f"p(mid, a, b){joins} WHERE p.a <> p.b{agree}")
        mids = (f"SELECT mid FROM explain_nodes WHERE round = {int(rnd)} AND rule = {rule} UNION "
                f"SELECT mid FROM explain_unions WHERE round = {int(rnd)} AND rule = {rule}")
        if self._lean(c):  # what is the rule's is in ``explain_rules``; the view ``explain_matches`` joins it
            cols = f"NULL, NULL, class_ids, {'bindings' if c.explain_values else 'NULL'}"
        else:
            cols = "ops, classes, NULL, bindings"
        g.con.execute("INSERT INTO explain_match_rows (rule, round, mid, nodes, roots, terms, ops, classes, class_ids, "
                      f"bindings) SELECT {rule}, {int(rnd)}, mid, nodes, roots, terms, {cols} "
                      f"FROM ({c.witness(mids, rnd, carried=self._carried(c))})")

    def _lean(self, c: Compiled) -> bool:
        """Whether the rule's explanation rows leave its ops and variables' names to ``explain_rules`` (stored
        there once, with the first rule of its name): not where a rule of that name with other ones is there."""
        lean = self._state.lean
        if c.rule not in lean:  # (with every compiled rule not yet asked about: two statements, not two a rule)
            todo = {c.rule: c} | {r.rule: r.compiled for r in self._state.rules
                                  if r.compiled is not None and r.rule not in lean}
            mine = {name: ([*x.explain_ops], [*x.explain_vars]) for name, x in todo.items()}
            con = self.egraph.con
            con.execute("INSERT INTO explain_rules SELECT * FROM (VALUES "
                        + ", ".join(f"({literal(name)}, {literal(o)}::VARCHAR[], {literal(v)}::VARCHAR[])"
                                    for name, (o, v) in mine.items()) + ") ON CONFLICT DO NOTHING")
            names = ", ".join(literal(name) for name in mine)
            for name, ops, variables in con.execute(f"SELECT rule, ops, vars FROM explain_rules WHERE rule IN ({names})"
                                                    ).fetchall():
                lean[name] = (list(ops), list(variables)) == mine[name]
        return lean[c.rule]

    def _rebuild(self, r: _Round) -> None:
        """Merge the queued unions, restore congruence; the e-graph's size after it."""
        g = self.egraph
        t3 = time.perf_counter()
        rb = g.rebuild(ts=r.it.round)
        r.it.rebuild_s = time.perf_counter() - t3
        r.it.unions = rb.unions
        counts = g.counts()
        r.it.enodes, r.it.eclasses = counts["enodes"], counts["eclasses"]
        self._sample_temp(r)

    def _sample_temp(self, r: _Round) -> None:
        """The round's largest size of DuckDB's temp files so far (``Iteration.temp_mib``)."""
        size = self.egraph.con.execute("SELECT coalesce(sum(size), 0) FROM duckdb_temporary_files()").fetchall()[0][0]
        r.it.temp_mib = max(r.it.temp_mib, round(size / 2**20, 1))

    def _record(self, r: _Round) -> None:
        """Store the round's ``Iteration`` and rule statistics; report it to ``on_round``."""
        g, it, stats = self.egraph, r.it, r.stats
        self._state.report.iterations.append(it)
        g.con.execute("INSERT INTO iterations (round, enodes, eclasses, match_s, apply_s, rebuild_s, applied, unions, "
                      "temp_mib) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      [it.round, it.enodes, it.eclasses, it.match_s, it.apply_s, it.rebuild_s, it.applied, it.unions,
                       it.temp_mib])
        if stats:
            cols = RuleStat(*zip(*stats))
            frame = {"round": np.array(cols.round), "rule": np.array(cols.rule, dtype=object),
                     "matches": np.array(cols.matches), "applied": np.array(cols.applied),
                     "new_nodes": np.array(cols.new_nodes), "seconds": np.array(cols.seconds, dtype=float),
                     "banned": np.array(cols.banned, dtype=bool)}
            g.con.register("_stats", frame)
            g.con.execute("INSERT INTO rule_stats SELECT * FROM _stats")
            g.con.unregister("_stats")
        if self.on_round:
            self.on_round(it)

    def _check_stop(self, r: _Round) -> StopReason | None:
        """After a round: matches left unapplied for want of e-nodes, a fixpoint, or ``Limits.slow_rounds`` slow
        rounds in a row: each added fewer e-nodes than ``SLOW_GROWTH`` of the e-graph, merged no e-classes and
        banned no rule (a ban holds matches back). Such rounds only grow alternatives one step at a time, as
        ViT-B/16's gather rules carry its classifier's token-0 Gather back through the residual stream, a layer
        every few rounds, to values every layer needs whole (rounds 4-30 added 1-2 % each and merged nothing;
        the model written at 6, 10 and 30 rounds was the same to the byte, and the 24 rounds cost 20 s)."""
        if r.budget <= 0 or r.capped:
            return StopReason.NODE_LIMIT
        it, s = r.it, self._state
        if it.new_nodes == 0 and it.unions == 0 and s.scheduler.can_stop(it.round):
            return StopReason.SATURATED
        banned = any(row.banned for row in r.stats)
        slow = it.unions == 0 and not banned and it.new_nodes < SLOW_GROWTH * max(it.enodes - it.new_nodes, 1)
        s.slow = s.slow + 1 if slow else 0
        if self.limits.slow_rounds and s.slow >= self.limits.slow_rounds:
            return StopReason.SLOW_GROWTH
        return None

    def _finish(self, stop: StopReason) -> Report:
        report = self._state.report
        report.stop_reason = stop
        report.seconds = time.perf_counter() - self._state.start
        self.egraph.con.execute("UPDATE iterations SET stop_reason = ? "
                                "WHERE round = (SELECT max(round) FROM iterations)", [stop.value])
        return report


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
