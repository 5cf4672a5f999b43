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

``_Graphs`` does the steps on saved states, ``_Tree`` keeps the search nodes and ``Backtrack.run`` the
queue.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import numpy as np

from relsat.programs.compiler import BUILD_ROW_ID, Compiled, compile_rule
from relsat.programs.rulesets import checked_rules
from relsat.programs.ir import Rule
from relsat.relations.catalog import BY_TYPE, OPS
from relsat.relations.egraph import EGraph
from relsat.relations.states import State, States

from relsat.driver.search.runner import Report, StopReason, fill_matches
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


class _Graphs:
    """The graph operations on saved states (module docstring, steps 1, 2 and 4): the input reduced to a
    graph, a graph's children priced on a scratch copy, a child materialised, a graph's cost and its
    fingerprint.  Owns the saved states and the round counter the rewrites are stamped with."""

    def __init__(self, g: EGraph, compiled: list[Compiled], roots, price: Price,
                 checked: frozenset = frozenset()) -> None:
        self.g, self.compiled, self.roots, self.price = g, compiled, list(roots), price
        self.checked = checked  # rules whose unions are checked (``rulesets.checked_rules``): a child that does not
        # hold is materialised without them, as ``Runner`` leaves such a match out
        self.states = States(g)
        self.ts = 0

    def _sql(self, query: str, params=None):
        return self.g.con.execute(query, params or []).fetchall()

    def _roots(self) -> None:
        roots = self.g.find(np.asarray(self.roots, dtype=np.int64))
        self.g.con.register("_bt_roots_np", {"c": np.unique(roots)})
        self.g.con.execute("CREATE OR REPLACE TEMP TABLE _bt_roots AS SELECT c FROM _bt_roots_np")
        self.g.con.unregister("_bt_roots_np")

    def start(self) -> State:
        """The input e-graph reduced to one graph, as a saved state (the root)."""
        self.states.checkout(self.states.save())
        self._reduce()
        return self.states.freeze()

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

    def cost(self, graph: _Graph) -> float:
        """The cost of a graph not expanded (expansion prices it otherwise)."""
        if graph.cost != graph.cost:  # nan: not priced yet
            self.states.checkout(graph.state)
            self.price(self.g)
            graph.cost = float(self._sql("SELECT coalesce(sum(k.ms), 0) FROM enodes e "
                                         "JOIN costs k ON k.node = e.id")[0][0])
        return graph.cost

    def fingerprint(self) -> int | None:
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

    @staticmethod
    def _match_sql(c: Compiled) -> str:
        rows = c.match()
        return f"SELECT row_number() OVER () AS mid, * FROM (SELECT * FROM ({rows}) ORDER BY ALL)"

    def expand(self, graph: _Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Every child of ``graph`` as ``(rule, mid, cost)``, cheapest first (module docstring, steps 1-2),
        or None when it has none; sets ``graph.cost``."""
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
            fill_matches(con, f"SELECT * FROM _bt_m{i}", offset=None)
            for b in c.builds:
                g.insert_from(BY_TYPE[b.op], b.source, ts=self.ts, result=b.name, target=None, rid=BUILD_ROW_ID)
            con.execute(f"INSERT INTO _bt_pairs SELECT {i}, * FROM ({c.pairs})")
            for t in {b.name for b in c.builds} | {f"_bt_m{i}"}:
                con.execute(f"DROP TABLE IF EXISTS {t}")
        self.price(g)
        self._roots()
        kids = con.execute(_CHILD_COSTS).fetchnumpy()
        own = kids["rule"] < 0
        graph.cost = float(kids["cost"][own][0]) if own.any() else 0.0  # no row: the outputs are all leaves
        if own.all():
            return None
        return kids["rule"][~own], kids["mid"][~own], kids["cost"][~own]

    def materialise(self, parent: _Graph, rule: int, mid: int) -> None:
        """The child ``(rule, mid)`` of ``parent`` as the current tables (step 4)."""
        g, con, c = self.g, self.g.con, self.compiled[rule]
        self.states.checkout(parent.state)
        self.ts += 1
        fill_matches(con, f"SELECT * FROM ({self._match_sql(c)}) WHERE mid = {int(mid)}", offset=None)
        for b in c.builds:
            g.insert_from(BY_TYPE[b.op], b.source, ts=self.ts, result=b.name, target=None, rid=BUILD_ROW_ID)
        # the matched classes' nodes from before the rewrite: the reduction keeps what replaced them
        con.execute(f"CREATE OR REPLACE TEMP TABLE _bt_old AS SELECT e.id AS node FROM enodes e "
                    f"WHERE e.eclass IN (SELECT a FROM ({c.pairs}) p(mid, a, b)) AND e.ts < {self.ts}")
        for u in c.unions:
            g.union_agreeing(u) if c.rule in self.checked else g.union_from(u)
        for b in c.builds:
            con.execute(f"DROP TABLE IF EXISTS {b.name}")
        g.rebuild(ts=self.ts)
        self._reduce("_bt_old")


class _Tree:
    """The search tree as ``search_nodes`` stores it: one entry per graph generated (children added a batch
    at a time), its parent, action (``rule#match``), predicted value, status and cost once built; the
    search's counts."""

    def __init__(self, names: list[str]) -> None:
        self.names = names  # rule index -> rule name
        self.parent: list[np.ndarray] = []
        self.action: list[np.ndarray] = []
        self.value: list[np.ndarray] = []
        self.status: dict[int, str] = {}  # search node -> status other than 'queued'/'pruned'
        self.actual: dict[int, float] = {}  # search node -> its cost once materialised and priced
        self.size = 0
        self.counts = {"expanded": 0, "generated": 0, "materialised": 0, "duplicates": 0, "cyclic": 0,
                       "pruned": 0}

    def add(self, parent, rule, mid, cost) -> int:
        """Search nodes for ``(rule, mid)`` children of ``parent`` (rule -1: the root) valued ``cost``; the
        id of the first."""
        first = self.size
        names = np.array([self.names[int(r)] if r >= 0 else "root" for r in rule], dtype=object)
        self.parent.append(np.asarray(parent, dtype=np.int64))
        self.action.append(np.where(np.asarray(rule) >= 0, names + "#" + np.asarray(mid).astype(str), names))
        self.value.append(np.asarray(cost, dtype=float))
        self.size += len(rule)
        return first

    def applied(self, node: int) -> dict[str, int]:
        """The rewrites on the path from the root to search node ``node``, counted by rule."""
        parent, action = np.concatenate(self.parent), np.concatenate(self.action)
        out: dict[str, int] = {}
        while node > 0 and parent[node] >= 0:
            rule = str(action[node]).rsplit("#", 1)[0]
            out[rule] = out.get(rule, 0) + 1
            node = int(parent[node])
        return out

    def store(self, g: EGraph, root_cost: float, queued: list[tuple[int, int]]) -> None:
        """``search_nodes`` in ``g``'s current tables; ``queued``: the search-node ranges still queued."""
        self.value[0][0] = root_cost
        status = np.full(self.size, "pruned", dtype=object)
        for a, b in queued:
            status[a:b] = "queued"
        for i, s in self.status.items():
            status[i] = s
        cost = np.full(self.size, np.nan)
        cost[list(self.actual)] = list(self.actual.values())
        store_search_nodes(g, {
            "node": np.arange(self.size, dtype=np.int64), "parent": np.concatenate(self.parent),
            "action": np.concatenate(self.action).astype(object),
            "visits": (status == "expanded").astype(np.int64) + (status == "root"),
            "value": np.concatenate(self.value), "status": status, "cost": cost})


class Backtrack:
    """One search (module docstring): the queue of batches and the relaxed choice, over the graph
    operations of ``_Graphs`` and the tree of ``_Tree``; ``run()`` returns the ``SearchResult``."""

    def __init__(self, g: EGraph, rules: list[Rule], roots, price: Price, *, alpha: float = ALPHA,
                 budget: int = BUDGET, seconds: float = 60.0, on_step=None) -> None:
        compiled: list[Compiled] = [compile_rule(r) for r in rules]
        self.graphs = _Graphs(g, compiled, roots, price, checked_rules(rules))
        self.tree = _Tree([c.rule for c in compiled])
        self.alpha, self.budget, self.seconds, self.on_step = alpha, budget, seconds, on_step
        self.seen: set[int] = set()  # the fingerprints of the graphs materialised

    def _expand(self, graph: _Graph) -> _Batch | None:
        """Every child of ``graph`` and its cost (module docstring, steps 1-3), as search nodes and one
        sorted batch; sets ``graph.cost``."""
        kids = self.graphs.expand(graph)
        if kids is None:
            return None
        rule, mid, cost = kids
        first = self.tree.add(np.full(len(rule), graph.id), rule, mid, cost)
        self.tree.counts["generated"] += len(rule)
        return _Batch(float(cost[0]), first, graph, rule.astype(np.int64), mid.astype(np.int64),
                      cost.astype(float), first)

    def _improves(self, graph: _Graph, best: _Graph) -> _Graph:
        """The best graph once ``graph`` (just priced) is known; the old best's state is dropped when
        nothing waits on it."""
        self.tree.actual[graph.id] = graph.cost
        if best.cost == best.cost and not graph.cost < best.cost:  # best priced and no dearer
            return best
        if best is not graph:
            self._release(best, graph)
        return graph

    def _release(self, graph: _Graph, best: _Graph) -> None:
        if graph.pending == 0 and graph is not best:
            self.graphs.states.drop(graph.state)

    def run(self) -> SearchResult:
        t0 = time.perf_counter()
        graphs, tree, counts = self.graphs, self.tree, self.tree.counts
        try:
            root = _Graph(tree.add([-1], [-1], [0], [np.nan]), graphs.start())
            tree.status[root.id] = "root"
            self.seen.add(graphs.fingerprint())
            best, queue, stop = root, [], "exhausted"
            todo: _Graph | None = root
            while True:
                if todo is not None:  # expand it
                    if counts["expanded"] >= self.budget:
                        stop = "budget"
                        graphs.cost(todo)  # taken and built, not expanded
                        best = self._improves(todo, best)
                        if todo is not root:
                            tree.status[todo.id] = "materialised"
                        break
                    if todo is not root:
                        tree.status[todo.id] = "expanded"
                    batch = self._expand(todo)
                    counts["expanded"] += 1
                    best = self._improves(todo, best)
                    if self.on_step:
                        self.on_step(counts["expanded"], best.cost)
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
                    counts["pruned"] += len(batch.cost) - k
                    parent.pending = 0
                    self._release(parent, best)
                    continue
                batch.at += 1
                parent.pending -= 1
                if batch.at < len(batch.cost):
                    batch.head = float(batch.cost[batch.at])
                    heapq.heappush(queue, batch)
                node = batch.first + k
                graphs.materialise(parent, int(batch.rule[k]), int(batch.mid[k]))
                self._release(parent, best)
                counts["materialised"] += 1
                fp = graphs.fingerprint()
                if fp is None or fp in self.seen:
                    tree.status[node] = "cyclic" if fp is None else "duplicate"
                    counts["cyclic" if fp is None else "duplicates"] += 1
                    continue
                self.seen.add(fp)
                todo = _Graph(node, graphs.states.freeze())
            graphs.states.adopt(best.state)
            tree.store(graphs.g, root.cost, [(b.first + b.at, b.first + len(b.cost)) for b in queue])
            report = Report(stop_reason=StopReason.SATURATED, applied_by_rule=tree.applied(best.id))
            return SearchResult(
                strategy="backtrack", report=report, stop=stop,
                best_cost=best.cost, start_cost=root.cost, seconds=time.perf_counter() - t0,
                stats={**counts, "alpha": self.alpha, "budget": self.budget, "graphs": tree.size,
                       "best_node": best.id, "time_limit": self.seconds})
        finally:
            graphs.states.close()


def backtrack(g: EGraph, rules: list[Rule], roots, price: Price, **options) -> SearchResult:
    """TASO's backtracking search from the graph in ``g`` (module docstring); ``options`` as ``Backtrack``."""
    return Backtrack(g, rules, roots, price, **options).run()
