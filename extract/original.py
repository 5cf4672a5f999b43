"""The original graph inside a saturated e-graph.

``original_choice`` picks, for every e-class the roots need, its e-node with the smallest id:
the import order, always acyclic, since a node's children existed before it. It is the graph
the pipeline compares the extraction with (``extraction.original_node``) and the cost it
reports before optimizing.
"""

from __future__ import annotations

from relsat.relations.egraph import EGraph


def original_choice(egraph: EGraph, roots) -> dict[int, int]:
    """For every e-class needed by ``roots``, its node with the smallest id (the import order:
    always acyclic, since a node's children existed before it)."""
    best = {c: (n, ch) for c, n, ch in egraph.sql(
        "SELECT eclass, min(id), arg_min(children, id) FROM enodes GROUP BY eclass")}
    choice: dict[int, int] = {}
    stack = [int(c) for c in egraph.find(list(roots))] if len(roots) else []
    while stack:
        c = stack.pop()
        if c not in choice:
            if c not in best:
                raise ValueError(f"e-class {c} has no e-node")
            choice[c] = best[c][0]
            stack.extend(best[c][1])
    return choice
