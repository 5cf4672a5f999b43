"""What the search strategies share: their result, the ``search_nodes`` table, the price callback.

``relsat optimize --search eqsat|mcts|backtrack`` picks how the e-graph is built before extraction:
equality saturation (``relsat.driver.search.runner``), Monte Carlo tree search over rule applications
(``relsat.driver.search.mcts``), or TASO's sequential backtracking over single rewrites
(``relsat.driver.search.backtrack``).  The two searches price e-graphs with a ``Price``: a callable that
fills the ``costs`` table (``node, op, ms, source``) of the e-graph's current tables, measured through
the cost cache or analytic, the same costs extraction uses afterwards.  Each stores its search
tree in ``search_nodes`` (one row per tree node or graph: ``node, parent, action, visits, value``
plus strategy columns), so that a saved e-graph shows what was explored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from relsat.relations.egraph import EGraph

from relsat.driver.search.runner import Report

Price = Callable[[EGraph], None]  # fills ``costs`` for every e-node of the e-graph's current tables


@dataclass
class SearchResult:
    """What a search did; the chosen e-graph is in the e-graph's home tables when it returns."""

    strategy: str
    report: Report  # the rounds that built the chosen e-graph (for the optimize report)
    stop: str  # why the search ended: "budget", "time limit", "exhausted", ...
    best_cost: float  # the search's own estimate of its best graph (extracted DAG cost under its prices)
    start_cost: float  # the same estimate for the input graph
    seconds: float
    stats: dict = field(default_factory=dict)  # strategy counters (iterations, expanded, pruned, ...)

    def as_dict(self) -> dict:
        return {"strategy": self.strategy, "stop": self.stop, "best_cost": self.best_cost,
                "start_cost": self.start_cost, "seconds": self.seconds, **self.stats}


def store_search_nodes(g: EGraph, columns: dict[str, np.ndarray]) -> None:
    """(Re)create ``search_nodes`` in the e-graph's current tables from numpy columns (``node``,
    ``parent`` (-1 for a root), ``action``, ``visits``, ``value`` first, then any others)."""
    first = ("node", "parent", "action", "visits", "value")
    missing = [c for c in first if c not in columns]
    if missing:
        raise ValueError(f"search_nodes needs columns {', '.join(missing)}")
    order = list(first) + [c for c in columns if c not in first]
    frame = {c: np.asarray(columns[c]) for c in order}
    g.con.register("_search_nodes", frame)
    try:
        g.con.execute("CREATE OR REPLACE TABLE search_nodes AS SELECT "
                      + ", ".join(f'"{c}"' for c in order) + " FROM _search_nodes ORDER BY node")
    finally:
        g.con.unregister("_search_nodes")
