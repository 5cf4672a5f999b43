"""Sequential backtracking over single rewrites, as in TASO and MetaFlow (relaxed graph substitutions).

A graph is an e-graph with one e-node per e-class, every node reachable from the outputs, kept as a
saved state (``relsat.relations.states``), so the same compiled SQL rules match it.  A priority queue
holds graphs by cost; each step takes the cheapest, applies each match of each rule to it on its own
(one child graph per match), and keeps the children cheaper than ``alpha`` times the best cost found
(TASO's relaxation: ``alpha`` = 1 is greedy descent, TASO's default 1.05 lets a rewrite that costs a
little open a cheaper one later).  ``budget`` graphs are expanded at most, within ``seconds``.

Set-oriented, so that the statements per expansion grow with the rules, not with the matches:

1. **expand** (on a scratch copy of the graph): every rule's matches (its compiled join, numbered in
   row order) first, then every match's right side inserted, hash-consed, each into its own e-class,
   and its unions recorded as ``(rule, mid, a, b)`` instead of applied;
2. the scratch copy is priced (``Price``) and one recursive query computes every child's cost at once:
   the classes reachable from the outputs when each of the match's classes ``a`` is replaced by ``b``,
   each class costing its one node (and the graph's own cost, with nothing replaced: a graph is
   priced once, when it is expanded);
3. the children become one sorted batch; the queue holds batches (a k-way merge), so Python touches
   only the children it takes;
4. **materialise** a child when it is taken: the parent checked out, that rule's match re-run and
   kept to the one match, applied and rebuilt as saturation does, then reduced to a graph (in each
   e-class the node the rewrite added, else the old one; only what the outputs reach).  A cyclic
   result is dropped; a graph seen before (structural hash from the outputs, so two paths to the
   same graph agree whatever their ids) is not expanded again.

At the end the best graph becomes the e-graph's home tables (``States.adopt``) and every graph
generated is a row of ``search_nodes`` (node, parent, action = ``rule#match``, visits = expanded or
not, value = its cost as predicted, cost = as priced once built; ``status``: root, expanded,
materialised (built when the budget ran out), duplicate, cyclic, pruned, queued).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import numpy as np

from relsat.programs.compiler import Compiled, compile_rule
from relsat.programs.ir import Rule
from relsat.relations.catalog import BY_TYPE, OPS
from relsat.relations.egraph import EGraph
from relsat.relations.states import State, States

from relsat.driver.search.runner import Report, StopReason
from relsat.driver.search.result import Price, SearchResult, store_search_nodes

BUDGET = 100  # graphs expanded
ALPHA = 1.05  # TASO's default
_TABLES = [op.table for op in OPS] + ["op_opaque"]
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _splitmix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * np.uint64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> np.uint64(27))
        x = x * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


# every child's cost (and the graph's own, as rule -1), summed exactly so that children of equal cost
# tie exactly and go by (rule, match): a search repeats run to run
_CHILD_COSTS = """
WITH RECURSIVE
  node AS (SELECT e.eclass AS c, e.children, coalesce(k.ms, 0.0) AS ms FROM enodes e LEFT JOIN costs k ON k.node = e.id),
  edge AS (SELECT c, unnest(children) AS ch FROM node),
  kid AS (SELECT DISTINCT rule, mid FROM _bt_pairs WHERE a <> b UNION ALL SELECT -1, 0),  -- the graph itself
  reach(rule, mid, c) AS (
    SELECT k.rule, k.mid, coalesce(r.b, x.c) FROM kid k CROSS JOIN _bt_roots x
      LEFT JOIN _bt_pairs r ON r.rule = k.rule AND r.mid = k.mid AND r.a = x.c
    UNION
    SELECT p.rule, p.mid, coalesce(r.b, e.ch) FROM reach p JOIN edge e ON e.c = p.c
      LEFT JOIN _bt_pairs r ON r.rule = p.rule AND r.mid = p.mid AND r.a = e.ch)
SELECT p.rule, p.mid, sum(n.ms::DECIMAL(38, 12))::DOUBLE AS cost FROM reach p JOIN node n ON n.c = p.c
GROUP BY ALL ORDER BY cost, rule, mid
"""


@dataclass
class _Graph:
    id: int
    state: State
    cost: float = float("nan")  # set when priced (on expansion)
    pending: int = 0  # children of it not yet taken or dropped (its state is kept for them)


@dataclass(order=True)
class _Batch:
    """One expansion's children, cheapest first; ``at`` is the next one to take."""

    head: float
    seq: int
    parent: _Graph = field(compare=False)
    rule: np.ndarray = field(compare=False)
    mid: np.ndarray = field(compare=False)
    cost: np.ndarray = field(compare=False)
    first: int = field(compare=False)  # the search-node id of its first child
    at: int = field(default=0, compare=False)


class Backtrack:
    """One search (module docstring); ``run()`` returns the ``SearchResult``."""

    def __init__(self, g: EGraph, rules: list[Rule], roots, price: Price, *, alpha: float = ALPHA,
                 budget: int = BUDGET, seconds: float = 60.0, on_step=None) -> None:
        self.g, self.roots, self.price = g, list(roots), price
        self.compiled: list[Compiled] = [compile_rule(r) for r in rules]
        self.alpha, self.budget, self.seconds, self.on_step = alpha, budget, seconds, on_step
        self.states = States(g)
        self.ts = 0
        self.seen: set[int] = set()
        # the search nodes: parallel lists, one entry per graph generated (children in batches)
        self.parent: list[np.ndarray] = []
        self.action: list[np.ndarray] = []
        self.value: list[np.ndarray] = []
        self.status: dict[int, str] = {}  # search node -> status other than 'queued'/'pruned'
        self.queued: list[tuple[int, int]] = []  # search-node ranges still queued at the end
        self.actual: dict[int, float] = {}  # search node -> its cost once materialised and priced
        self.size = 0
        self.counts = {"expanded": 0, "generated": 0, "materialised": 0, "duplicates": 0, "cyclic": 0,
                       "pruned": 0}

    # ------------------------------------------------------------------ graphs
    def _sql(self, query: str, params=None):
        return self.g.con.execute(query, params or []).fetchall()

    def _roots(self) -> None:
        roots = self.g.find(np.asarray(self.roots, dtype=np.int64))
        self.g.con.register("_bt_roots_np", {"c": np.unique(roots)})
        self.g.con.execute("CREATE OR REPLACE TEMP TABLE _bt_roots AS SELECT c FROM _bt_roots_np")
        self.g.con.unregister("_bt_roots_np")

    def _reduce(self, old: str | None = None) -> None:
        """The current tables down to one graph: in each e-class the node a rewrite added (any node but
        those in ``old``, newest first), only what the outputs reach."""
        con = self.g.con
        self._roots()
        avoid = f"e.id NOT IN (SELECT node FROM {old})" if old else "true"
        con.execute(f"CREATE OR REPLACE TEMP TABLE _bt_pick AS SELECT e.eclass AS c, "
                    f"arg_max(e.id, ({avoid}, e.id)) AS node FROM enodes e GROUP BY e.eclass")
        con.execute("CREATE OR REPLACE TEMP TABLE _bt_keep AS WITH RECURSIVE r(c) AS (SELECT c FROM _bt_roots UNION "
                    "SELECT unnest(e.children) FROM r JOIN _bt_pick p ON p.c = r.c JOIN enodes e ON e.id = p.node) "
                    "SELECT p.node, p.c FROM r JOIN _bt_pick p ON p.c = r.c")
        for t in sorted(set(_TABLES) & self.g.live):
            con.execute(f"DELETE FROM {t} WHERE id NOT IN (SELECT node FROM _bt_keep)")
        con.execute("DELETE FROM eclass WHERE id NOT IN (SELECT c FROM _bt_keep)")

    def _cost(self, graph: _Graph) -> float:
        """The cost of a graph not expanded (expansion prices it otherwise)."""
        if graph.cost != graph.cost:  # nan: not priced yet
            self.states.checkout(graph.state)
            self.price(self.g)
            graph.cost = float(self._sql("SELECT coalesce(sum(k.ms), 0) FROM enodes e "
                                         "JOIN costs k ON k.node = e.id")[0][0])
        return graph.cost

    def _fingerprint(self) -> int | None:
        """A structural hash of the current graph from its outputs (ids do not enter it: two paths to
        the same graph agree), or None when the graph has a cycle.  Nodes are hashed level by level
        from the leaves (Python loops over levels, numpy over the nodes of a level)."""
        con = self.g.con
        nodes = con.execute("SELECT id, eclass, hash(op, attrs::VARCHAR) AS h FROM enodes ORDER BY id").fetchnumpy()
        edges = con.execute("SELECT id, unnest(children) AS c, generate_subscripts(children, 1) AS pos "
                            "FROM enodes").fetchnumpy()
        cls = nodes["eclass"].astype(np.int64)
        by_cls = np.argsort(cls)
        node_of = lambda c: by_cls[np.searchsorted(cls[by_cls], c)]  # noqa: E731  (one node per class)
        src = np.searchsorted(nodes["id"], edges["id"])
        dst = node_of(edges["c"].astype(np.int64))
        weight = edges["pos"].astype(np.uint64) * np.uint64(2) + np.uint64(1)  # argument order matters
        h = nodes["h"].astype(np.uint64)
        waiting = np.bincount(src, minlength=len(h))
        done = np.zeros(len(h), dtype=bool)
        with np.errstate(over="ignore"):
            while not done.all():
                ready = ~done & (waiting == 0)
                if not ready.any():
                    return None  # what is left waits on itself
                h[ready] = _splitmix(h[ready])
                done |= ready
                e = np.flatnonzero(ready[dst])
                np.add.at(h, src[e], h[dst[e]] * weight[e] * _MIX)
                np.subtract.at(waiting, src[e], 1)
            roots = node_of(np.unique(self.g.find(np.asarray(self.roots, dtype=np.int64))))
            return int(_splitmix(np.sort(h[roots]) * _MIX).sum())

    # ------------------------------------------------------------------ steps
    def _match_sql(self, c: Compiled) -> str:
        rows = c.match()
        return f"SELECT row_number() OVER () AS mid, * FROM (SELECT * FROM ({rows}) ORDER BY ALL)"

    def _expand(self, graph: _Graph) -> _Batch | None:
        """Every child of ``graph`` and its cost (module docstring, steps 1-3), as one sorted batch;
        sets ``graph.cost``."""
        g, con = self.g, self.g.con
        self.states.checkout(graph.state)
        self.ts += 1
        con.execute("CREATE OR REPLACE TEMP TABLE _bt_pairs (rule INTEGER, mid BIGINT, a BIGINT, b BIGINT)")
        matched = []
        for i, c in enumerate(self.compiled):  # every match on the graph itself, before any right side
            if set(c.tables) <= g.live:
                con.execute(f"CREATE OR REPLACE TEMP TABLE _bt_m{i} AS {self._match_sql(c)}")
                if self._sql(f"SELECT count(*) FROM _bt_m{i}")[0][0]:
                    matched.append(i)
                else:
                    con.execute(f"DROP TABLE _bt_m{i}")
        for i in matched:
            c = self.compiled[i]
            con.execute(f"CREATE OR REPLACE TEMP TABLE {c.matches} AS SELECT * FROM _bt_m{i}")
            for b in c.builds:
                g.insert_from(BY_TYPE[b.op], b.source, ts=self.ts, result=b.name, target=None)
            con.execute(f"INSERT INTO _bt_pairs SELECT {i}, * FROM ({c.pairs})")
            for t in {b.name for b in c.builds} | {f"_bt_m{i}"}:
                con.execute(f"DROP TABLE IF EXISTS {t}")
        self.price(g)
        self._roots()
        kids = con.execute(_CHILD_COSTS).fetchnumpy()
        own = kids["rule"] < 0
        graph.cost = float(kids["cost"][own][0]) if own.any() else 0.0  # no row: the outputs are all leaves
        kids = {k: v[~own] for k, v in kids.items()}
        if not len(kids["rule"]):
            return None
        first = self._add_nodes(np.full(len(kids["rule"]), graph.id), kids["rule"], kids["mid"], kids["cost"])
        self.counts["generated"] += len(kids["rule"])
        return _Batch(float(kids["cost"][0]), first, graph, kids["rule"].astype(np.int64),
                      kids["mid"].astype(np.int64), kids["cost"].astype(float), first)

    def _materialise(self, parent: _Graph, rule: int, mid: int) -> None:
        """The child ``(rule, mid)`` of ``parent`` as the current tables (step 4)."""
        g, con, c = self.g, self.g.con, self.compiled[rule]
        self.states.checkout(parent.state)
        self.ts += 1
        con.execute(f"CREATE OR REPLACE TEMP TABLE {c.matches} AS SELECT * FROM ({self._match_sql(c)}) "
                    f"WHERE mid = {int(mid)}")
        for b in c.builds:
            g.insert_from(BY_TYPE[b.op], b.source, ts=self.ts, result=b.name, target=None)
        # the matched classes' nodes from before the rewrite: the reduction keeps what replaced them
        con.execute(f"CREATE OR REPLACE TEMP TABLE _bt_old AS SELECT e.id AS node FROM enodes e "
                    f"WHERE e.eclass IN (SELECT a FROM ({c.pairs}) p(mid, a, b)) AND e.ts < {self.ts}")
        for u in c.unions:
            g.union_from(u)
        for b in c.builds:
            con.execute(f"DROP TABLE IF EXISTS {b.name}")
        g.rebuild(ts=self.ts)
        self._reduce("_bt_old")

    # ------------------------------------------------------------------ search nodes
    def _add_nodes(self, parent, rule, mid, cost) -> int:
        first = self.size
        names = np.array([self.compiled[int(r)].rule if r >= 0 else "root" for r in rule], dtype=object)
        self.parent.append(np.asarray(parent, dtype=np.int64))
        self.action.append(np.where(np.asarray(rule) >= 0, names + "#" + np.asarray(mid).astype(str), names))
        self.value.append(np.asarray(cost, dtype=float))
        self.size += len(rule)
        return first

    def _store(self) -> None:
        status = np.full(self.size, "pruned", dtype=object)
        for a, b in self.queued:
            status[a:b] = "queued"
        for i, s in self.status.items():
            status[i] = s
        cost = np.full(self.size, np.nan)
        cost[list(self.actual)] = list(self.actual.values())
        store_search_nodes(self.g, {
            "node": np.arange(self.size, dtype=np.int64), "parent": np.concatenate(self.parent),
            "action": np.concatenate(self.action).astype(object),
            "visits": (status == "expanded").astype(np.int64) + (status == "root"),
            "value": np.concatenate(self.value), "status": status, "cost": cost})

    # ------------------------------------------------------------------ the loop
    def _improves(self, graph: _Graph, best: _Graph) -> _Graph:
        """The best graph once ``graph`` (just priced) is known; the old best's state is dropped when
        nothing waits on it."""
        self.actual[graph.id] = graph.cost
        if best.cost == best.cost and not graph.cost < best.cost:  # best priced and no dearer
            return best
        if best is not graph:
            self._release(best, graph)
        return graph

    def _release(self, graph: _Graph, best: _Graph) -> None:
        if graph.pending == 0 and graph is not best:
            self.states.drop(graph.state)

    def run(self) -> SearchResult:
        t0 = time.perf_counter()
        try:
            start = self.states.save()
            self.states.checkout(start)
            self._reduce()
            root = _Graph(self._add_nodes([-1], [-1], [0], [np.nan]), self.states.freeze())
            self.status[root.id] = "root"
            self.seen.add(self._fingerprint())
            best, queue, stop = root, [], "exhausted"
            todo: _Graph | None = root
            while True:
                if todo is not None:  # expand it
                    if self.counts["expanded"] >= self.budget:
                        stop = "budget"
                        self._cost(todo)  # taken and built, not expanded
                        best = self._improves(todo, best)
                        if todo is not root:
                            self.status[todo.id] = "materialised"
                        break
                    if todo is not root:
                        self.status[todo.id] = "expanded"
                    batch = self._expand(todo)
                    self.counts["expanded"] += 1
                    best = self._improves(todo, best)
                    if self.on_step:
                        self.on_step(self.counts["expanded"], best.cost)
                    if batch is not None:
                        todo.pending = len(batch.cost)
                        heapq.heappush(queue, batch)
                    self._release(todo, best)
                    todo = None
                if time.perf_counter() - t0 > self.seconds:
                    stop = "time limit"
                    break
                if not queue:
                    break
                batch = heapq.heappop(queue)
                k = batch.at
                cost = batch.cost[k]
                parent = batch.parent
                if not cost < self.alpha * best.cost - 1e-12 * abs(best.cost):
                    # the rest of the batch is dearer still, and best only falls: drop it all
                    self.counts["pruned"] += len(batch.cost) - k
                    parent.pending = 0
                    self._release(parent, best)
                    continue
                batch.at += 1
                parent.pending -= 1
                if batch.at < len(batch.cost):
                    batch.head = float(batch.cost[batch.at])
                    heapq.heappush(queue, batch)
                node = batch.first + k
                self._materialise(parent, int(batch.rule[k]), int(batch.mid[k]))
                self._release(parent, best)
                self.counts["materialised"] += 1
                fp = self._fingerprint()
                if fp is None or fp in self.seen:
                    self.status[node] = "cyclic" if fp is None else "duplicate"
                    self.counts["cyclic" if fp is None else "duplicates"] += 1
                    continue
                self.seen.add(fp)
                todo = _Graph(node, self.states.freeze())
            for b in queue:  # children still queued when the search stopped
                self.queued.append((b.first + b.at, b.first + len(b.cost)))
            self.value[0][0] = root.cost
            self.states.adopt(best.state)
            self._store()
            return SearchResult(
                strategy="backtrack", report=Report(stop_reason=StopReason.SATURATED), stop=stop,
                best_cost=best.cost, start_cost=root.cost, seconds=time.perf_counter() - t0,
                stats={**self.counts, "alpha": self.alpha, "budget": self.budget, "graphs": self.size,
                       "best_node": best.id})
        finally:
            self.states.close()


def backtrack(g: EGraph, rules: list[Rule], roots, price: Price, **options) -> SearchResult:
    """TASO's backtracking search from the graph in ``g`` (module docstring); ``options`` as ``Backtrack``."""
    return Backtrack(g, rules, roots, price, **options).run()
