"""Extraction algorithms: pick one e-node per needed e-class so the result is a cheap, acyclic DAG.

This module owns the storage-independent part of extraction. Its input is an
:class:`ExtractionProblem` (plain numpy arrays: the e-class and cost of every e-node and
each node's child e-classes in CSR form, plus the root classes); its output is an
:class:`Extraction` (class id -> chosen node index, DAG cost, solver status).

* :func:`greedy_extract` -- the bottom-up tree-cost fixpoint of egg / TENSAT, vectorised
  over the CSR arrays, followed by a sharing-aware local improvement of the DAG cost.
* :func:`ilp_extract` -- exact DAG-cost extraction as a 0/1 program solved with HiGHS,
  with topological-order constraints only on cyclic parts of the class graph; it never
  returns anything worse than its warm start (greedy by default).
* :func:`dag_cost`, :func:`validate_choice`, :func:`is_acyclic` -- checks on a choice.

The DAG cost of a choice is the sum of the costs of its chosen nodes, each counted once.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass

import highspy
import numpy as np

from relsat.relations.reach import csr, strong_components

_SHARE_ROUNDS = 8  # at most this many sharing-improvement passes after greedy
_MAX = np.finfo(np.float64).max  # greedy tree costs saturate here


@dataclass(frozen=True)
class ExtractionProblem:
    node_class: np.ndarray  # int64 (n,): the e-class id of each e-node (arbitrary ids)
    node_cost: np.ndarray  # float64 (n,): cost of each e-node, finite and >= 0
    child_ptr: np.ndarray  # int64 (n+1,): CSR offsets into child_class
    child_class: np.ndarray  # int64: child e-class ids of each node, in order (may repeat)
    roots: np.ndarray  # int64: e-classes that must be computed (graph outputs)


@dataclass
class Extraction:
    choice: dict[int, int]  # e-class id -> chosen node index, exactly the classes reachable from the roots
    cost: float  # DAG cost: sum of costs of chosen nodes, each counted once
    method: str  # "greedy" | "ilp"
    status: str  # "greedy", "optimal", "time_limit", "warm_start_kept", ...
    bound: float | None  # ILP dual bound (None for greedy)
    gap: float | None  # relative gap (cost - bound) / cost of the returned choice
    seconds: float


# ----------------------------------------------------------------------------- dense form


@dataclass(frozen=True)
class _Dense:
    """The problem over dense class indices, with each node's child classes deduplicated."""

    class_ids: np.ndarray  # (C,) sorted original class ids; dense class k is class_ids[k]
    ncls: np.ndarray  # (n,) dense class of each node
    cost: np.ndarray  # (n,)
    eptr: np.ndarray  # (n+1,) CSR offsets into echild
    enode: np.ndarray  # (E,) node of each distinct (node, child class) edge
    echild: np.ndarray  # (E,) dense child class of each edge, sorted within a node
    selfloop: np.ndarray  # (n,) bool: node has its own class as a child (never usable)
    roots: np.ndarray  # distinct dense root classes

    @property
    def num_classes(self) -> int:
        return len(self.class_ids)


def _dense(p: ExtractionProblem) -> _Dense:
    node_class = np.asarray(p.node_class, dtype=np.int64)
    cost = np.asarray(p.node_cost, dtype=np.float64)
    ptr = np.asarray(p.child_ptr, dtype=np.int64)
    child = np.asarray(p.child_class, dtype=np.int64)
    roots = np.asarray(p.roots, dtype=np.int64).ravel()
    n = len(node_class)
    if cost.shape != (n,) or ptr.shape != (n + 1,):
        raise ValueError("node_cost must have shape (n,) and child_ptr shape (n+1,)")
    if ptr[0] != 0 or ptr[-1] != len(child) or np.any(np.diff(ptr) < 0):
        raise ValueError("child_ptr must be non-decreasing from 0 to len(child_class)")
    if not np.all(np.isfinite(cost)) or np.any(cost < 0):
        raise ValueError("node costs must be finite and >= 0")
    class_ids = np.unique(np.concatenate([node_class, child, roots]))
    nc = len(class_ids)
    ncls = np.searchsorted(class_ids, node_class)
    raw_node = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
    key = np.unique(raw_node * nc + np.searchsorted(class_ids, child))
    enode, echild = key // max(nc, 1), key % max(nc, 1)
    eptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(enode, minlength=n), out=eptr[1:])
    selfloop = np.zeros(n, dtype=bool)
    selfloop[enode[echild == ncls[enode]]] = True
    return _Dense(class_ids, ncls, cost, eptr, enode, echild, selfloop,
                  np.unique(np.searchsorted(class_ids, roots)))


def _gather(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions ptr[r]:ptr[r+1] for each r in rows, concatenated; and the segment lengths."""
    starts = ptr[rows]
    lens = ptr[rows + 1] - starts
    ends = np.cumsum(lens)
    offsets = np.repeat(starts - ends + lens, lens)
    return offsets + np.arange(len(offsets), dtype=np.int64), lens


def _distinct(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values (np.unique without its fixed cost on small arrays)."""
    a = np.sort(a)
    first = np.ones(len(a), dtype=bool)
    np.not_equal(a[1:], a[:-1], out=first[1:])
    return a[first]


def _topo_order(ptr: np.ndarray, idx: np.ndarray, n: int) -> np.ndarray | None:
    """Kahn's order (parents first) of the graph v -> idx[ptr[v]:ptr[v+1]]; None if cyclic."""
    indeg = np.bincount(idx, minlength=n).tolist()
    ptr_l, idx_l = ptr.tolist(), idx.tolist()
    order = [v for v in range(n) if indeg[v] == 0]
    for v in order:  # `order` grows while we walk it
        for w in idx_l[ptr_l[v]:ptr_l[v + 1]]:
            indeg[w] -= 1
            if indeg[w] == 0:
                order.append(w)
    return np.array(order, dtype=np.int64) if len(order) == n else None


# ----------------------------------------------------------------------------- greedy


def _fixpoint(d: _Dense, usable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Best tree cost and chosen node (-1 if none) of every class, using only `usable` nodes.

    Jacobi sweeps: a node's total (cost + sum of its distinct child classes' current costs)
    is recomputed only when one of its children improved, and a class adopts a node only on
    a strict improvement. Since class costs only decrease and floating-point sums of
    non-negative terms are at least each term, a cycle of chosen nodes would force some
    class's cost to be strictly below itself, so the chosen nodes are acyclic. Tree costs
    can grow exponentially with depth, so totals saturate at the largest finite float
    (the argument survives the saturation) and infinity only means "not extractable".
    """
    usable = usable & ~d.selfloop
    nc = d.num_classes
    val = np.full(nc, np.inf)
    choice = np.full(nc, -1, dtype=np.int64)
    use_edge = usable[d.enode]
    rptr, rnode = csr(d.echild[use_edge], d.enode[use_edge], nc)  # class -> parent nodes
    nodes = np.flatnonzero(usable & (d.eptr[1:] == d.eptr[:-1]))  # leaves first
    totals = d.cost[nodes]
    with np.errstate(over="ignore"):
        while len(nodes):
            cls = d.ncls[nodes]
            before = val[cls]
            np.minimum.at(val, cls, totals)
            win = (totals < before) & (totals == val[cls])  # a strict improvement, the best one
            cls = cls[win]
            choice[cls] = nodes[win]
            nodes = _distinct(rnode[_gather(rptr, cls)[0]])  # parents of improved classes
            pos, lens = _gather(d.eptr, nodes)
            kid_val, seg = val[d.echild[pos]], np.cumsum(lens) - lens
            keep = ~np.logical_or.reduceat(np.isinf(kid_val), seg)
            totals = np.minimum(d.cost[nodes] + np.add.reduceat(kid_val, seg), _MAX)
            nodes, totals = nodes[keep], totals[keep]
    return val, choice


def _reached(d: _Dense, choice: np.ndarray) -> np.ndarray:
    """Boolean mask of the classes reachable from the roots through chosen nodes."""
    seen = np.zeros(d.num_classes, dtype=bool)
    frontier = d.roots
    while len(frontier):
        seen[frontier] = True
        kids = d.echild[_gather(d.eptr, choice[frontier])[0]]
        frontier = np.unique(kids[~seen[kids]])
    return seen


def _share(d: _Dense, choice: np.ndarray, alive: np.ndarray) -> None:
    """Sharing-aware local search on the chosen DAG (in place).

    Switches a class to another node whose children are all already chosen, when that
    lowers the DAG cost counting the nodes that become unreachable (reference counts track
    reachability) and creates no cycle. A topological order of the chosen DAG makes the
    cycle test free for children ranked after the class and bounds the search otherwise;
    a switch that breaks the order ends the round, and the next round recomputes it.
    """
    eptr, echild, cost, ncls = d.eptr.tolist(), d.echild.tolist(), d.cost.tolist(), d.ncls.tolist()
    everywhere = np.arange(len(d.cost))
    for _ in range(_SHARE_ROUNDS):
        cls = np.flatnonzero(alive)
        sub = np.full(d.num_classes, -1, dtype=np.int64)
        sub[cls] = np.arange(len(cls))
        pos, lens = _gather(d.eptr, choice[cls])
        order = _topo_order(np.concatenate([[0], np.cumsum(lens)]), sub[d.echild[pos]], len(cls))
        rank = np.full(d.num_classes, -1, dtype=np.int64)
        rank[cls[order]] = np.arange(len(cls))
        dead_kids = np.bincount(d.enode, weights=~alive[d.echild], minlength=len(d.cost))
        cand = np.flatnonzero(alive[d.ncls] & (dead_kids == 0) & ~d.selfloop & (choice[d.ncls] != everywhere))
        refs = np.bincount(d.echild[pos], minlength=d.num_classes)
        refs[d.roots] += 1
        refs, alive_l, choice_l, rank_l = refs.tolist(), alive.tolist(), choice.tolist(), rank.tolist()

        def reaches(starts: list[int], target: int) -> bool:
            """Whether `target` is reachable from `starts` through classes ranked before it."""
            seen, stack = set(starts), list(starts)
            while stack:
                m = choice_l[stack.pop()]
                for k in echild[eptr[m]:eptr[m + 1]]:
                    if k == target:
                        return True
                    if rank_l[k] < rank_l[target] and k not in seen:
                        seen.add(k)
                        stack.append(k)
            return False

        improved = False
        for n in cand.tolist():
            c = ncls[n]
            new_kids = echild[eptr[n]:eptr[n + 1]]
            if not alive_l[c] or not all(alive_l[k] for k in new_kids):
                continue
            back = [k for k in new_kids if rank_l[k] < rank_l[c]]
            if back and reaches(back, c):
                continue
            old = choice_l[c]
            for k in new_kids:
                refs[k] += 1
            freed, dropped, stack = 0.0, [], [old]
            while stack:  # release `old`'s children, cascading to classes left unreferenced
                m = stack.pop()
                for k in echild[eptr[m]:eptr[m + 1]]:
                    refs[k] -= 1
                    dropped.append(k)
                    if refs[k] == 0:
                        freed += cost[choice_l[k]]
                        stack.append(choice_l[k])
            if cost[n] - cost[old] - freed < -1e-12 * (cost[old] + freed):
                choice_l[c] = n
                for k in dropped:
                    if refs[k] == 0:
                        alive_l[k] = False
                improved = True
                if back:
                    break
            else:
                for k in dropped:
                    refs[k] += 1
                for k in new_kids:
                    refs[k] -= 1
        choice[:] = choice_l
        alive[:] = alive_l
        if not improved:
            return


def _extraction(d: _Dense, choice: np.ndarray, alive: np.ndarray, **kw) -> Extraction:
    cls = np.flatnonzero(alive)
    nodes = choice[cls]
    return Extraction(choice=dict(zip(d.class_ids[cls].tolist(), nodes.tolist())),
                      cost=float(d.cost[nodes].sum()), **kw)


def _check_roots(d: _Dense, val: np.ndarray) -> None:
    bad = d.roots[~np.isfinite(val[d.roots])]
    if len(bad):
        raise ValueError(f"root classes {d.class_ids[bad].tolist()} have no acyclic extraction")


def greedy_extract(problem: ExtractionProblem, *, share: bool = True) -> Extraction:
    """Greedy (tree-cost) extraction, then, if `share`, a sharing-aware DAG-cost improvement.

    Raises ValueError if a root class has no acyclic extraction.
    """
    t0 = time.perf_counter()
    d = _dense(problem)
    val, choice = _fixpoint(d, np.ones(len(d.cost), dtype=bool))
    _check_roots(d, val)
    alive = _reached(d, choice)
    if share:
        _share(d, choice, alive)
    return _extraction(d, choice, alive, method="greedy", status="greedy", bound=None,
                       gap=None, seconds=time.perf_counter() - t0)


# ----------------------------------------------------------------------------- ILP


def _prune(d: _Dense, val: np.ndarray) -> np.ndarray:
    """Nodes an acyclic extraction can use (not their own child, every child class
    extractable) that are reachable from the roots through such nodes."""
    n = len(d.cost)
    bad_child = np.bincount(d.enode, weights=~np.isfinite(val[d.echild]), minlength=n) > 0
    cand = ~d.selfloop & ~bad_child
    cptr, cnode = csr(d.ncls[cand], np.flatnonzero(cand), d.num_classes)
    reached = np.zeros(d.num_classes, dtype=bool)
    frontier = d.roots
    while len(frontier):
        reached[frontier] = True
        kids = d.echild[_gather(d.eptr, cnode[_gather(cptr, frontier)[0]])[0]]
        frontier = np.unique(kids[~reached[kids]])
    return np.flatnonzero(cand & reached[d.ncls])


@dataclass
class _Model:
    """The 0/1 program: columns are x for `nodes`, then t for `tcls`; rows in CSR."""

    nodes: np.ndarray  # x column j <-> node nodes[j]
    col: np.ndarray  # (n,) x column of each node, -1 if pruned
    comp: np.ndarray  # (C,) strongly connected component of each class
    size: np.ndarray  # size of each component
    tcls: np.ndarray  # classes in cyclic components, with t column tcol[c]
    tcol: np.ndarray  # (C,)
    row_len: np.ndarray
    a_index: np.ndarray
    a_value: np.ndarray
    row_lo: np.ndarray
    row_hi: np.ndarray


def _model(d: _Dense, nodes: np.ndarray) -> _Model:
    nx, nc = len(nodes), d.num_classes
    col = np.full(len(d.cost), -1, dtype=np.int64)
    col[nodes] = np.arange(nx)
    kptr, kcol = csr(d.ncls[nodes], np.arange(nx), nc)  # class -> its x columns
    # Root rows: sum of the class's x >= 1.
    pos, lens = _gather(kptr, d.roots)
    rows = [(lens, kcol[pos], np.ones(len(pos)), np.ones(len(lens)), np.full(len(lens), np.inf))]
    # Child rows, one per distinct (node, child class): x_n - sum_{m in child class} x_m <= 0.
    edge = np.flatnonzero(col[d.enode] >= 0)
    e_col, e_cls, e_par = col[d.enode[edge]], d.echild[edge], d.ncls[d.enode[edge]]
    pos, lens = _gather(kptr, e_cls)
    heads = np.cumsum(lens + 1) - lens - 1
    body = np.ones(len(pos) + len(edge), dtype=bool)
    body[heads] = False
    idx = np.empty(len(body), dtype=np.int64)
    idx[heads], idx[body] = e_col, kcol[pos]
    rows.append((lens + 1, idx, np.where(body, -1.0, 1.0), np.full(len(edge), -np.inf), np.zeros(len(edge))))
    # Order rows on class-graph edges inside cyclic components (self-loops are pruned):
    # t_a - t_b - (1 + eps) x_n >= -1, i.e. t_a - t_b >= eps when x_n = 1, eps = 1 / component size.
    gkey = np.unique(e_par * nc + e_cls)
    comp = strong_components(*csr(gkey // nc, gkey % nc, nc), nc)
    size = np.bincount(comp)
    tcls = np.flatnonzero(size[comp] > 1)
    tcol = np.full(nc, -1, dtype=np.int64)
    tcol[tcls] = nx + np.arange(len(tcls))
    cyc = comp[e_par] == comp[e_cls]
    m = int(cyc.sum())
    rows.append((np.full(m, 3), np.stack([tcol[e_par[cyc]], tcol[e_cls[cyc]], e_col[cyc]], 1).ravel(),
                 np.stack([np.ones(m), -np.ones(m), -1.0 - 1.0 / size[comp[e_par[cyc]]]], 1).ravel(),
                 np.full(m, -1.0), np.full(m, np.inf)))
    return _Model(nodes, col, comp, size, tcls, tcol, *(np.concatenate(z) for z in zip(*rows)))


def _start(d: _Dense, mdl: _Model, choice: dict[int, int]) -> np.ndarray:
    """Column values of a valid choice: x from the choice, t decreasing by 1/size along a
    topological order of the chosen classes within each cyclic component."""
    cls = np.searchsorted(d.class_ids, np.fromiter(choice, np.int64, len(choice)))
    node = np.fromiter(choice.values(), np.int64, len(choice))
    sub = np.full(d.num_classes, -1, dtype=np.int64)
    sub[cls] = np.arange(len(cls))
    pos, lens = _gather(d.eptr, node)
    order = _topo_order(np.concatenate([[0], np.cumsum(lens)]), sub[d.echild[pos]], len(cls))
    rank = np.full(d.num_classes, d.num_classes, dtype=np.int64)  # unchosen classes last
    rank[cls[order]] = np.arange(len(cls))
    start = np.zeros(len(mdl.nodes) + len(mdl.tcls))
    start[mdl.col[node]] = 1.0
    tc = mdl.tcls[np.lexsort((rank[mdl.tcls], mdl.comp[mdl.tcls]))]
    within = np.arange(len(tc)) - np.searchsorted(mdl.comp[tc], mdl.comp[tc])
    start[mdl.tcol[tc]] = 1.0 - within / mdl.size[mdl.comp[tc]]
    return start


_quiet = False


def _highs() -> highspy.Highs:
    """A HiGHS instance with its output off; the first one made in a process prints a banner on the
    standard output, which is sent to /dev/null (the CLI's output is a report)."""
    global _quiet
    if _quiet:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, 1)
            h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            os.close(null)
        _quiet = True
    h.setOptionValue("output_flag", False)
    return h


def _relative_gap(cost: float, bound: float | None) -> float | None:
    if bound is None:
        return None
    return max(0.0, cost - bound) / cost if cost > 0 else 0.0


def ilp_extract(problem: ExtractionProblem, *, time_limit: float = 60.0, mip_gap: float = 1e-4,
                warm_start: Extraction | None = None, threads: int = 1, exclude=()) -> Extraction | None:
    """Minimum DAG-cost extraction as a 0/1 program solved by HiGHS.

    Variables: x_n in {0,1} per node, and t_c in [0,1] per class in a cyclic strongly
    connected component of the class graph. Constraints: each root class has a chosen node;
    every child class of a chosen node has a chosen node; and for a chosen node of class a
    with child class b in the same component, t_a - t_b >= eps, so chosen nodes are acyclic.
    Objective: total cost of the chosen nodes. Nodes that are their own child, have a child
    class with no acyclic extraction, or are unreachable from the roots are dropped first.

    `time_limit` (seconds) bounds the whole call; HiGHS gets what preprocessing left (HiGHS
    itself may overrun it in phases that do not check the clock). The warm start (a valid
    choice; greedy_extract's result if None) is passed to HiGHS and returned, with status
    "warm_start_kept", whenever the ILP yields no solution or a costlier one. If HiGHS's reported
    objective disagrees with its solution's cost (it can misjudge a MIP start after presolve),
    the solve is redone without the start; should that happen without one, the status is
    "inconsistent" and the bound None. `threads` is
    HiGHS's thread count; HiGHS fixes it per process at the first solve, so later calls
    with another value keep the first one. Raises ValueError if a root class has no
    acyclic extraction or the warm start is invalid.

    ``exclude``: no-good cuts, each an array of node indices that the choice must not contain all
    of (``sum x_n <= |S| - 1``), to find a next-best choice unlike earlier ones. A warm start that
    contains one is not used; with cuts the result is None when no choice is found in time.
    """
    t0 = time.perf_counter()
    d = _dense(problem)
    val, _ = _fixpoint(d, np.ones(len(d.cost), dtype=bool))
    _check_roots(d, val)
    if warm_start is None:
        warm_start = greedy_extract(problem)
    else:
        validate_choice(problem, warm_start.choice)

    def finish(ext: Extraction, status: str, bound: float | None) -> Extraction:
        return Extraction(choice=ext.choice, cost=ext.cost, method="ilp", status=status, bound=bound,
                          gap=_relative_gap(ext.cost, bound), seconds=time.perf_counter() - t0)

    if not len(d.roots):
        return finish(warm_start, "optimal", 0.0)
    mdl = _model(d, _prune(d, val))
    cuts = [np.unique(np.asarray(c, dtype=np.int64)) for c in exclude]
    cuts = [c for c in cuts if len(c) and np.all(mdl.col[c] >= 0)]  # a pruned node is never chosen anyway
    start_nodes = np.fromiter(warm_start.choice.values(), np.int64, len(warm_start.choice))
    usable_start = not any(np.isin(c, start_nodes).all() for c in cuts)
    if cuts:
        mdl.row_len = np.concatenate([mdl.row_len, [len(c) for c in cuts]])
        mdl.a_index = np.concatenate([mdl.a_index, *(mdl.col[c] for c in cuts)])
        mdl.a_value = np.concatenate([mdl.a_value, np.ones(sum(len(c) for c in cuts))])
        mdl.row_lo = np.concatenate([mdl.row_lo, np.full(len(cuts), -np.inf)])
        mdl.row_hi = np.concatenate([mdl.row_hi, [len(c) - 1.0 for c in cuts]])
    nx, ncol = len(mdl.nodes), len(mdl.nodes) + len(mdl.tcls)
    col_cost = np.concatenate([d.cost[mdl.nodes], np.zeros(len(mdl.tcls))])

    def solve(start: np.ndarray | None) -> tuple[str, float | None, np.ndarray | None, bool]:
        """Run HiGHS (with `start` as its MIP start if given): status, dual bound, x of the
        incumbent (None if none), and whether HiGHS's objective matches the incumbent's cost."""
        h = _highs()
        h.setOptionValue("mip_rel_gap", float(mip_gap))
        h.setOptionValue("threads", int(threads))
        h.setOptionValue("time_limit", max(1e-3, time_limit - (time.perf_counter() - t0)))
        h.passModel(ncol, len(mdl.row_len), len(mdl.a_index), int(highspy.MatrixFormat.kRowwise),
                    int(highspy.ObjSense.kMinimize), 0.0, col_cost, np.zeros(ncol), np.ones(ncol),
                    mdl.row_lo, mdl.row_hi, (np.cumsum(mdl.row_len) - mdl.row_len).astype(np.int32),
                    mdl.a_index.astype(np.int32), mdl.a_value,
                    (np.arange(ncol) < nx).astype(np.int32))  # x integer, t continuous
        if start is not None:
            h.setSolution(ncol, np.arange(ncol, dtype=np.int32), start)
        h.run()
        info, model_status = h.getInfo(), h.getModelStatus()
        status = {highspy.HighsModelStatus.kOptimal: "optimal",
                  highspy.HighsModelStatus.kTimeLimit: "time_limit"}.get(
            model_status, h.modelStatusToString(model_status).lower().replace(" ", "_"))
        bound = float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else None
        if info.primal_solution_status != 2:  # kSolutionStatusFeasible: an incumbent exists
            return status, bound, None, True
        x = np.asarray(h.getSolution().col_value)
        obj, true = float(info.objective_function_value), float(col_cost @ x)
        return status, bound, x[:nx], obj == true or abs(obj - true) <= 1e-6 * max(1.0, abs(true))

    # HiGHS (seen in 1.16) can mis-evaluate a MIP start after presolve: the start is judged in
    # the reduced space, where presolve's dominance reductions may have fixed columns to values
    # other than the start's, and gets an objective below its true cost. HiGHS then prunes with
    # that wrong incumbent value and reports the start as "optimal" with a dual bound below the
    # true optimum. The objective HiGHS reports for its incumbent then differs from the
    # incumbent's cost; when it does, the solve is discarded and run again without the start.
    status, bound, x, consistent = solve(_start(d, mdl, warm_start.choice) if usable_start else None)
    if not consistent and usable_start:
        status, bound, x, consistent = solve(None)
    if not consistent:  # nothing HiGHS reported about this solve can be trusted
        status, bound = "inconsistent", None
    if x is not None:
        used = np.zeros(len(d.cost), dtype=bool)
        used[mdl.nodes[x > 0.5]] = True
        sval, schoice = _fixpoint(d, used)  # an acyclic extraction among the chosen nodes
        if np.all(np.isfinite(sval[d.roots])):
            ext = _extraction(d, schoice, _reached(d, schoice), method="ilp", status=status,
                              bound=bound, gap=None, seconds=0.0)
            if ext.cost <= warm_start.cost or not usable_start:
                return finish(ext, status, bound)
    return finish(warm_start, "warm_start_kept", bound) if usable_start else None


# ----------------------------------------------------------------------------- checks


def dag_cost(problem: ExtractionProblem, choice: dict[int, int]) -> float:
    """Sum of the costs of the chosen nodes, each counted once."""
    nodes = np.unique(np.fromiter(choice.values(), np.int64, len(choice)))
    return float(np.asarray(problem.node_cost, dtype=np.float64)[nodes].sum())


def _choice_graph(problem: ExtractionProblem, choice: dict[int, int]):
    """Chosen classes (sorted), their nodes, CSR ptr over those nodes' child classes, the
    child classes, and each child's position in the class array (-1 if not chosen)."""
    cls = np.fromiter(choice, np.int64, len(choice))
    node = np.fromiter(choice.values(), np.int64, len(choice))
    order = np.argsort(cls)
    cls, node = cls[order], node[order]
    out = (node < 0) | (node >= len(problem.node_class))
    if out.any():
        raise ValueError(f"chosen node indices {node[out].tolist()} are out of range")
    pos, lens = _gather(np.asarray(problem.child_ptr, dtype=np.int64), node)
    kids = np.asarray(problem.child_class, dtype=np.int64)[pos]
    at = np.searchsorted(cls, kids)
    found = at < len(cls)
    found[found] = cls[at[found]] == kids[found]
    return cls, node, np.concatenate([[0], np.cumsum(lens)]), kids, np.where(found, at, -1)


def is_acyclic(problem: ExtractionProblem, choice: dict[int, int]) -> bool:
    """Whether the graph of chosen classes (class -> child classes of its chosen node) is acyclic."""
    cls, _, ptr, _, kpos = _choice_graph(problem, choice)
    inner = kpos >= 0
    seg = np.repeat(np.arange(len(cls)), np.diff(ptr))
    sptr = np.zeros(len(cls) + 1, dtype=np.int64)
    np.cumsum(np.bincount(seg[inner], minlength=len(cls)), out=sptr[1:])
    return _topo_order(sptr, kpos[inner], len(cls)) is not None


def validate_choice(problem: ExtractionProblem, choice: dict[int, int]) -> None:
    """Raise ValueError unless `choice` is a valid extraction: every root chosen, each chosen
    node in its class, every child class of a chosen node chosen, only classes reachable from
    the roots chosen, and no cycle."""
    cls, node, ptr, kids, kpos = _choice_graph(problem, choice)
    roots = np.unique(np.asarray(problem.roots, dtype=np.int64))
    missing = roots[~np.isin(roots, cls)]
    if len(missing):
        raise ValueError(f"root classes {missing.tolist()} are not chosen")
    actual = np.asarray(problem.node_class, dtype=np.int64)[node]
    wrong = actual != cls
    if wrong.any():
        i = int(np.argmax(wrong))
        raise ValueError(f"node {node[i]} chosen for class {cls[i]} belongs to class {actual[i]}")
    if np.any(kpos < 0):
        i = int(np.argmax(kpos < 0))
        owner = int(np.searchsorted(ptr, i, side="right") - 1)
        raise ValueError(f"child class {kids[i]} of node {node[owner]} (class {cls[owner]}) is not chosen")
    seen = np.zeros(len(cls), dtype=bool)
    frontier = np.searchsorted(cls, roots)
    while len(frontier):
        seen[frontier] = True
        kids = kpos[_gather(ptr, frontier)[0]]
        frontier = np.unique(kids[~seen[kids]])
    if not seen.all():
        raise ValueError(f"classes {cls[~seen].tolist()} are chosen but unreachable from the roots")
    if not is_acyclic(problem, choice):
        raise ValueError("the chosen nodes form a cycle")
