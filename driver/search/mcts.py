"""MCTS-guided e-graph construction: which rules build the e-graph when a node limit binds.

A node limit brings phase ordering back into equality saturation: the rules that run first can
fill the e-graph with rewrites that do not pay and crowd out the ones that do.  As in the MCTS
paper (seeds, 001), a Monte Carlo tree search chooses the order: a tree node is an e-graph
(a saved state, ``relsat.relations.states``), an action is one rule applied for one round to all
its matches under the node limit, plus ``saturate``, equality saturation as ``--search eqsat``
runs it from that e-graph (terminal).  The matching stays the compiled SQL of the runner: an
action is a ``Runner`` round over the chosen rules, never a Python matcher.

One iteration:

1. **select**: from the root, the child with the best UCT score while a node has no untried action;
   the score's exploitation term is the child's best cost seen below it, scaled to [0, 1] by the
   best and worst costs seen so far (single-player MCTS: a deterministic game keeps the best, not
   the mean), its exploration term ``c * sqrt(ln N / n)``;
2. **expand**: the node's next untried action (in a seeded random order, ``saturate`` first at the
   root so that eqsat's e-graph is the first candidate); an action that changes nothing is not an
   action of that node and the next one is tried; a node whose actions all change nothing, or
   whose e-graph is at the node limit, is terminal;
3. **roll out**: from the new node, up to ``rollout_depth`` random rule actions on a working copy;
4. **reward**: the rolled-out e-graph is priced (``Price``: the costs extraction will use) and its
   extracted DAG cost is the outcome; the improvement over the input graph,
   ``(c0 - c) / c0``, is backed up (visits, sum), the cost into each node's best.

Every e-graph reached (tree node or rollout end) is a candidate, known by its action path and
priced by the extraction the pipeline uses (the ILP, under ``extractor="ilp"``).  At the end the
cheapest is rebuilt from the root by its path (rounds are deterministic, so a path gives the same
e-graph every time; on a tie eqsat's e-graph wins, then the smaller one) and becomes the e-graph's
home tables (``States.adopt``).  The tree is stored in ``search_nodes`` (node, parent, action,
visits, value = mean improvement, plus depth, cost, best, enodes, terminal).  Budgets:
``iterations`` and ``seconds`` (checked between iterations); ``seed`` fixes every
random choice, so the same inputs and costs give the same search.

``_Env`` acts (an action on a state, its cost, a path rebuilt, states released), ``_Tree`` keeps the tree
and the candidates, ``Mcts.run`` the iterations.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from relsat.extract.analytic import problem_from
from relsat.extract.extraction import greedy_extract, ilp_extract
from relsat.programs.compiler import lhs_tables
from relsat.programs.ir import Rule
from relsat.relations.egraph import EGraph
from relsat.relations.states import State, States

from relsat.driver.search.runner import Limits, Report, Runner, StopReason
from relsat.driver.search.result import Price, SearchResult, store_search_nodes

SATURATE = -1  # the action "equality saturation from here"
ITERATIONS = 32  # default budget
ROLLOUT_DEPTH = 2
EXPLORATION = 0.7  # UCT's c, over costs scaled to [0, 1]
REWARD_ILP_S = 5.0  # the ILP's time limit when it prices an outcome


@dataclass
class _Node:
    id: int
    parent: _Node | None
    action: int | None  # None at the root
    path: tuple[int, ...]
    state: State | None  # released once every action of the node is tried
    cost: float
    enodes: int
    untried: list[int]
    terminal: bool = False
    done: bool = False  # nothing left to try at or below (terminal, or every action tried and every child done)
    visits: int = 0
    total: float = 0.0  # sum of rewards
    best: float = math.inf  # least cost seen at or below
    children: list[_Node] = field(default_factory=list)


@dataclass
class _Candidate:
    cost: float
    enodes: int
    path: tuple[int, ...]


class _Env:
    """What the search acts on: the e-graph's saved states, an action (one rule's round under the node
    limit, or saturation) applied to the current tables, the extracted cost of the result, a path rebuilt
    from the root; the rules that changed some e-graph and the rounds run."""

    def __init__(self, g: EGraph, rules: list[Rule], roots, price: Price, limits: Limits, scheduler: str,
                 extractor: str) -> None:
        self.g, self.rules, self.roots, self.price = g, list(rules), list(roots), price
        self.limits, self.scheduler, self.extractor = limits, scheduler, extractor
        self.states = States(g)
        self.productive: set[int] = set()  # rules that changed some e-graph of the search
        self.tables = [lhs_tables(r) for r in self.rules]  # the op tables each rule joins
        self.steps = 0

    def label(self, a: int | None) -> str:
        return "root" if a is None else "saturate" if a == SATURATE else self.rules[a].name

    def enodes(self) -> int:
        return self.g.counts()["enodes"]

    def can_match(self, a: int, state: State) -> bool:
        """Whether action ``a`` can match in ``state``: saturation always, a rule only where the e-graph
        has every operator its left side joins."""
        return a == SATURATE or set(self.tables[a]) <= state.live

    def act(self, a: int) -> tuple[bool, bool, Report]:
        """Apply action ``a`` to the current tables: (changed, full, report)."""
        self.steps += 1
        lim = self.limits
        if a == SATURATE:
            runner = Runner(self.g, self.rules, lim, scheduler=self.scheduler)
        else:
            runner = Runner(self.g, [self.rules[a]], Limits(1, lim.enodes, math.inf, 1), scheduler="simple")
        rep = runner.run()
        changed = any(it.new_nodes or it.unions for it in rep.iterations)
        if changed and a != SATURATE:
            self.productive.add(a)
        full = rep.stop_reason == StopReason.NODE_LIMIT or self.enodes() >= lim.enodes
        return changed, full, rep

    def cost(self) -> float:
        """The extracted DAG cost of the current tables under the run's prices: the ILP the pipeline
        extracts with (warm-started by greedy, at most ``REWARD_ILP_S``), or greedy alone."""
        self.price(self.g)
        problem, _ = problem_from(self.g, self.roots)
        greedy = greedy_extract(problem)
        if self.extractor != "ilp":
            return greedy.cost
        ilp = ilp_extract(problem, time_limit=REWARD_ILP_S, warm_start=greedy)
        return ilp.cost if ilp is not None else greedy.cost

    def release(self, node: _Node) -> None:
        """Drop the state of a node other than the root once every action of it is tried."""
        if not node.untried and node.state is not None and node.parent is not None:
            self.states.drop(node.state)
            node.state = None

    def rebuild(self, root: State, path: tuple[int, ...]) -> tuple[State, Report]:
        """The e-graph of ``path``, rebuilt from the root's state, and the rounds that built it."""
        self.states.checkout(root)
        report = Report(stop_reason=StopReason.SATURATED)
        for a in path:
            _, _, rep = self.act(a)
            report.iterations += rep.iterations
            report.statements += rep.statements
            report.seconds += rep.seconds
            report.stop_reason = rep.stop_reason
            for rule, n in rep.applied_by_rule.items():
                report.applied_by_rule[rule] = report.applied_by_rule.get(rule, 0) + n
            for rule, n in rep.conflicts.items():
                report.conflicts[rule] = report.conflicts.get(rule, 0) + n
        return self.states.freeze(), report


class _Tree:
    """The search tree: its nodes (each with its untried actions in a seeded random order), the actions
    known to change nothing, the candidates (every e-graph reached) and the range of their costs; selection
    by UCT, backup, the cheapest candidate, and the tree as ``search_nodes``."""

    def __init__(self, n_rules: int, rng: np.random.Generator, exploration: float) -> None:
        self.n_rules, self.rng, self.c = n_rules, rng, exploration
        self.nodes: list[_Node] = []
        self.candidates: list[_Candidate] = []
        self.useless: set[tuple[tuple[int, ...], int]] = set()  # (path, action) that changed nothing
        self.low = self.high = 0.0  # least and greatest cost seen

    def plant(self, state: State, cost: float, enodes: int) -> _Node:
        """The root: the input e-graph, its cost the first seen."""
        self.low = self.high = cost
        return self.add(None, None, state, cost, enodes, terminal=False)

    def add(self, parent: _Node | None, action: int | None, state: State, cost: float, enodes: int,
            terminal: bool) -> _Node:
        order = [int(i) for i in self.rng.permutation(self.n_rules)]
        # saturate is tried first at the root (eqsat's e-graph is the first candidate), last elsewhere
        untried = [] if terminal else [SATURATE] + order if parent is None else order + [SATURATE]
        path = (parent.path + (action,)) if parent else ()
        node = _Node(len(self.nodes), parent, action, path, state, cost, enodes, untried, terminal)
        self.nodes.append(node)
        if parent is not None:
            parent.children.append(node)
        self.record(cost, enodes, path)
        return node

    def record(self, cost: float, enodes: int, path: tuple[int, ...]) -> None:
        self.candidates.append(_Candidate(cost, enodes, path))
        self.low, self.high = min(self.low, cost), max(self.high, cost)

    def _score(self, parent: _Node, child: _Node) -> float:
        span = max(self.high - self.low, 1e-12)
        exploit = (self.high - child.best) / span
        return exploit + self.c * math.sqrt(math.log(max(parent.visits, 1)) / max(child.visits, 1))

    def select(self, node: _Node) -> _Node:
        """Down the tree by UCT, past subtrees with nothing left to try, to a node with an untried action."""
        while not node.untried and not node.terminal:
            open_ = [ch for ch in node.children if not ch.done]
            if not open_:
                break
            node = max(open_, key=lambda ch: (self._score(node, ch), -ch.id))
        return node

    @staticmethod
    def backup(node: _Node, cost: float, c0: float) -> None:
        reward = (c0 - cost) / c0 if c0 > 0 else 0.0
        while node is not None:
            node.visits += 1
            node.total += reward
            node.best = min(node.best, cost)
            node.done = node.terminal or not node.untried and all(ch.done for ch in node.children)
            node = node.parent

    def cheapest(self) -> _Candidate:
        """The cheapest candidate.  On a cost tie eqsat's e-graph (the root's ``saturate``), else the smaller
        e-graph, then the shorter path: a search that finds nothing cheaper hands on what saturation would
        have."""
        return min(self.candidates,
                   key=lambda c: (round(c.cost, 9), c.path != (SATURATE,), c.enodes, len(c.path), c.path))

    def store(self, g: EGraph, label: Callable[[int | None], str]) -> None:
        """The tree as ``search_nodes`` in ``g``'s current tables; ``label(action)`` names an action."""
        n = self.nodes
        store_search_nodes(g, {
            "node": np.array([x.id for x in n], dtype=np.int64),
            "parent": np.array([x.parent.id if x.parent else -1 for x in n], dtype=np.int64),
            "action": np.array([label(x.action) for x in n], dtype=object),
            "visits": np.array([x.visits for x in n], dtype=np.int64),
            "value": np.array([x.total / x.visits if x.visits else 0.0 for x in n], dtype=float),
            "depth": np.array([len(x.path) for x in n], dtype=np.int64),
            "cost": np.array([x.cost for x in n], dtype=float),
            "best": np.array([x.best for x in n], dtype=float),
            "enodes": np.array([x.enodes for x in n], dtype=np.int64),
            "terminal": np.array([x.terminal for x in n], dtype=bool)})


class Mcts:
    """One search (module docstring): the iterations (select, expand, roll out, back up) over the tree of
    ``_Tree`` and the actions of ``_Env``; ``run()`` returns the ``SearchResult``."""

    def __init__(self, g: EGraph, rules: list[Rule], roots, price: Price, *, limits: Limits,
                 scheduler: str = "backoff", iterations: int = ITERATIONS, seed: int = 0,
                 rollout_depth: int = ROLLOUT_DEPTH, exploration: float = EXPLORATION, extractor: str = "ilp",
                 on_step=None) -> None:
        self.rng = np.random.default_rng(seed)  # the tree's action orders and the rollouts' draws
        self.env = _Env(g, rules, roots, price, limits, scheduler, extractor)
        self.tree = _Tree(len(self.env.rules), self.rng, exploration)
        self.iterations, self.rollout_depth, self.on_step = iterations, rollout_depth, on_step
        self.noops = 0
        self.deadline = math.inf  # set by run(): the time limit, also checked between the actions of one expansion

    def _expand(self, node: _Node) -> _Node | None:
        """The node's next untried action that changes its e-graph, as a new child (None: none left, or the
        time limit passed while trying them: a node with hundreds of rules that change nothing, e.g. the
        generated set's, took 220 s of no-op actions under a 10 s limit before the limit was checked here)."""
        env, tree = self.env, self.tree
        while node.untried:
            if time.perf_counter() > self.deadline:
                return None  # the rest stay untried; run() stops at its next check
            a = node.untried.pop(0)
            if (node.path, a) in tree.useless or not env.can_match(a, node.state):
                continue  # known to change nothing, or joins an operator this e-graph does not have
            env.states.checkout(node.state)
            changed, full, _ = env.act(a)
            if not changed:
                self.noops += 1
                tree.useless.add((node.path, a))
                continue
            state = env.states.freeze()
            child = tree.add(node, a, state, env.cost(), env.enodes(), terminal=full or a == SATURATE)
            env.release(node)
            return child
        node.terminal = not node.children
        env.release(node)
        return None

    def _rollout(self, node: _Node) -> float:
        """Up to ``rollout_depth`` random rule actions from ``node`` on a working copy, drawn from the
        rules that have changed some e-graph of the search (all rules until one has): the outcome's
        cost."""
        if node.terminal or self.rollout_depth == 0:
            return node.cost
        env = self.env
        env.states.checkout(node.state)
        path = node.path
        pool = sorted(env.productive) or list(range(len(env.rules)))
        while len(path) - len(node.path) < self.rollout_depth and pool:
            a = pool.pop(int(self.rng.integers(len(pool))))
            changed, full, _ = env.act(a)
            if not changed:
                continue
            path = path + (a,)
            pool = sorted(env.productive)
            if full:
                break
        if path == node.path:
            return node.cost
        cost = env.cost()
        self.tree.record(cost, env.enodes(), path)
        return cost

    def run(self) -> SearchResult:
        t0 = time.perf_counter()
        env, tree = self.env, self.tree
        self.deadline = t0 + env.limits.seconds
        try:
            root_state = env.states.save()
            env.states.checkout(root_state)
            c0 = env.cost()
            root = tree.plant(root_state, c0, env.enodes())
            stop, done = "budget", 0
            while done < self.iterations:
                if time.perf_counter() - t0 > env.limits.seconds:
                    stop = "time limit"
                    break
                if root.done:
                    stop = "exhausted"  # every action of every e-graph in the tree was tried
                    break
                leaf = tree.select(root)
                child = None if leaf.terminal else self._expand(leaf)
                if child is None:  # a terminal e-graph: its own cost is the outcome
                    tree.backup(leaf, leaf.cost, c0)
                else:
                    tree.backup(child, min(child.cost, self._rollout(child)), c0)
                done += 1
                if self.on_step:
                    self.on_step(done, tree.low)
            chosen = tree.cheapest()
            state, report = env.rebuild(root.state, chosen.path)  # its state and the rounds that built it
            env.states.adopt(state)
            tree.store(env.g, env.label)
            return SearchResult(
                strategy="mcts", report=report, stop=stop, best_cost=chosen.cost, start_cost=c0,
                seconds=time.perf_counter() - t0,
                stats={"iterations": done, "budget": self.iterations, "time_limit": env.limits.seconds,
                       "tree_nodes": len(tree.nodes), "rounds_run": env.steps,
                       "noop_actions": self.noops, "candidates": len(tree.candidates),
                       "path": [env.label(a) for a in chosen.path]})
        finally:
            env.states.close()


def mcts(g: EGraph, rules: list[Rule], roots, price: Price, **options) -> SearchResult:
    """Build the e-graph by Monte Carlo tree search (module docstring); ``options`` as ``Mcts``."""
    return Mcts(g, rules, roots, price, **options).run()
