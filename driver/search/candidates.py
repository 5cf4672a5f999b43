"""The measured final choice: costs refined in context, a few candidate graphs, the fastest as measured.

Owns :class:`Search`, which the optimize pipeline runs after one-node costs and the first
extraction when it may time models (``measure``, measured costs, a backend ONNX Runtime runs
here):

1. **In context.** The original graph (as the e-graph holds it) is exported and profiled as a whole
   (:mod:`relsat.extract.context`); its e-nodes take their in-context costs. An e-node profiled in
   several graphs takes its mean share, corrected (least squares, relative to the share) so that every
   profiled graph's e-nodes add up to its measured latency. Every other e-node keeps its one-node cost
   times the ratio of in-context to one-node cost over all e-nodes priced in context so far, so that
   both kinds of cost are in one currency.
2. **Rounds.** The first extraction (one-node costs) is exported and profiled; then, up to
   ``rounds`` times, the ILP extracts the cheapest graph under the refined costs; a graph profiled
   before means the costs have settled, a new one is exported and profiled in turn. Each distinct
   graph is a candidate.
3. **More candidates.** The graph that runs the fewest nodes (ties broken by the refined costs) is one: a
   rewrite that folds a bias, a scale and a shift into a Conv (PP-LCNetV3's learnable affine blocks) leaves
   the Conv's output as it was and removes three element-wise passes, but prices it by another Conv signature
   (with a bias), whose one-node cost can differ by more than those passes cost (PP-OCRv5 det's depthwise
   Conv: 0.106 ms without, 0.132 ms with a bias, from two profiling runs; 0.032 ms for both timed side by
   side), so the cost-based extractions kept 23 of them unfolded.
   Until there are ``candidates`` of them, the ILP is solved again with no-good
   cuts against every graph seen (each must drop at least one of the rewritten e-nodes of every
   earlier one, and one of the original's). These are exported, not profiled: their predicted cost
   is what the refined costs say.
4. to 6. **Timing, check and choice** (``relsat.driver.search.choice``): the input model and the candidates timed
   as whole models, the profiles the prices came from checked against those timings (``relsat.driver.search.fidelity``:
   a stale one is re-taken and steps 1 to 3 run again, ``_retake``), and the fastest candidate that verifies written
   where it is faster beyond the noise, else one that does less where it is not slower; a later run that reaches
   the same graphs recalls the choice (``relsat.driver.search.recall``).

``Search`` is steps 1 to 3 and the state of the whole search; ``Choice``, ``ProfileChecks`` and ``Recall`` (one
module each) are its other parts. A graph's predicted latency is the sum of its e-nodes' costs plus the call overhead of
``session.run``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relsat.extract.context import graph_key, profile_graph
from relsat.extract.extraction import Extraction, ExtractionProblem, ilp_extract
from relsat.relations.backend import Backend

from relsat.driver.boundary import shape_notes
from relsat.driver.errors import error_line
from relsat.driver.boundary.onnx_export import ExportMemo, export_graph, fill_weights, in_order
from relsat.driver.search.candidate import Candidate
from relsat.driver.search.choice import Choice
from relsat.driver.search.fidelity import FIDELITY_FLOOR, ProfileChecks
from relsat.driver.search.recall import Recall

FEWEST = "fewest nodes"  # the candidate whose graph runs the fewest nodes (``Search._problem``)


@dataclass
class Search(Choice, ProfileChecks, Recall):
    """The refined costs of one e-graph and the candidates found with them (module docstring)."""

    imported: object  # ImportResult
    problem: ExtractionProblem
    node_ids: np.ndarray  # e-node id of each problem index (sorted)
    feeds: dict
    backend: Backend
    threads: int
    cache: object  # CostCache or None
    ilp_time_limit: float
    mip_gap: float
    ctx: np.ndarray = field(init=False)  # in-context cost per problem index (NaN: not profiled)
    candidates: list = field(default_factory=list)
    original: Candidate | None = None
    call_overhead_ms: float = 0.0
    fidelity_floor: float = FIDELITY_FLOOR
    fidelity: dict = field(default_factory=dict)  # step 4's report (:meth:`choose`)
    on_graph: object = None  # callback(n): the n-th graph (the original first) found and priced, for progress
    simplify: bool = False  # write a graph that does less and is not slower (``_simplified``; Options.simplify)
    shape_notes: bool = False  # name the shapes of the exported graphs' values where harmless (``_export``;
    # Options.shape_notes)
    positions: dict | None = None  # the input model's node positions (``onnx_export.node_positions``): the exported
    # graphs' nodes are put in its order (``onnx_export.in_order``)

    def __post_init__(self) -> None:
        self.alone = np.asarray(self.problem.node_cost, dtype=np.float64).copy()
        self._reset_prices()
        self._refresh = False  # which profiles profile_graph re-takes (see :meth:`_retake`)
        self._run_args: tuple | None = None
        self._measured_keys: set[str] = set()  # profiles taken in this search
        self._stale: set[str] = set()  # profiles the check found stale (their rows removed)
        self._redo: set[str] | None = None  # profiles taken since the search started again (None: it did not)
        self._retaken: set[str] = set()  # profiles taken again after the check that replace a row
        self.profiles_measured = self.profiles_cached = 0
        self._drift = 0.0  # how far the input model's two fresh timings differ (after a re-take)
        self._serialized: dict[int, tuple] = {}  # id -> (model, its bytes) during :meth:`choose`
        self._input_sha256: tuple | None = None  # (the input model, the SHA-256 of its bytes) during :meth:`choose`
        self._memo = ExportMemo()  # what the graphs exported share: folded constants, weights and their digests
        self._found_comparison: dict | None = None  # the cached comparison of these graphs, and its check
        self.notes: dict | None = None  # whether the exported graphs carry their inferred shapes (``_export``)

    def _reset_prices(self) -> None:
        self.ctx = np.full(len(self.alone), np.nan)
        self._shares = np.zeros(len(self.alone))  # summed in-context shares over the profiles of each e-node
        self._seen = np.zeros(len(self.alone))  # profiles each e-node was charged in
        self._graphs: list[tuple[np.ndarray, float]] = []  # per profiled graph: its kernel e-nodes, latency - overhead

    def _reconcile(self) -> None:
        """``ctx`` from every profile so far: each e-node's mean share, corrected as little as possible
        (relative to the share) so that every profiled graph's e-nodes add up to its measured latency less
        the call overhead. An e-node shared by two graphs is charged differently in each (another fusion,
        another split of a group); taking the latest profile's share moved the sums of the earlier graphs
        (ResNet-50 at 2 threads: its own profile 28.9 ms, its prediction 32.1 ms after three more)."""
        priced = self._seen > 0
        ctx = np.where(priced, self._shares / np.maximum(self._seen, 1), np.nan)
        if self._graphs:
            w = np.maximum(np.nan_to_num(ctx), 1e-9)
            rows = [nodes for nodes, _ in self._graphs]
            a = np.zeros((len(rows), len(ctx)))
            for g, nodes in enumerate(rows):
                a[g, nodes] = 1.0
            residual = np.array([target for _, target in self._graphs]) - a @ np.nan_to_num(ctx)
            y = np.linalg.lstsq((a * w) @ a.T, residual, rcond=None)[0]
            ctx = np.where(priced, np.maximum(np.nan_to_num(ctx) + w * (a.T @ y), 0.0), np.nan)
        self.ctx = ctx

    # ------------------------------------------------------------------ costs
    def costs(self) -> np.ndarray:
        """Per problem index: in-context cost where profiled, else the scaled one-node cost."""
        seen = np.isfinite(self.ctx)
        base = self.alone[seen].sum()
        scale = self.ctx[seen].sum() / base if seen.any() and base > 0 else 1.0
        return np.where(seen, self.ctx, self.alone * scale)

    def ids(self, ext) -> dict[int, int]:
        """An extraction's choice as e-class -> e-node id."""
        return {int(c): int(self.node_ids[i]) for c, i in ext.choice.items()}

    def index(self, choice: dict[int, int]) -> np.ndarray:
        return np.searchsorted(self.node_ids, np.fromiter(set(choice.values()), np.int64))

    def predicted(self, choice: dict[int, int]) -> float:
        return float(self.costs()[self.index(choice)].sum()) + self.call_overhead_ms

    def _problem(self, *, fewest: bool = False) -> ExtractionProblem:
        """The ILP under the refined costs; ``fewest``: under the count of the nodes that run (an e-node of a
        non-zero one-node cost counts 1; constants fold at export), the refined costs breaking ties (their sum
        over any graph weighs less than one node): step 3's structural candidate (``FEWEST``)."""
        p, costs = self.problem, self.costs()
        if fewest:
            costs = (self.alone > 0) + 0.5 * costs / max(float(costs.sum()), 1e-12)
        return ExtractionProblem(p.node_class, costs, p.child_ptr, p.child_class, p.roots)

    # ------------------------------------------------------------------ graphs
    def _export(self, cand: Candidate) -> list[int] | None:
        try:
            cand.model, origins, cand.digests, cand.weights = export_graph(self.imported, cand.choice,
                                                                           memo=self._memo)
        except Exception as e:  # never fail a valid model: this candidate is dropped
            cand.status, cand.model = f"cannot export: {error_line(e)}", None
            return None
        cand.nodes = len(cand.model.graph.node)
        if self.positions:  # the origins follow their nodes
            origins = [origins[i] for i in in_order(cand.model, self.positions)]
        if self.shape_notes:
            if self.notes is None and cand.label == "original":  # the original choice's graph decides for all
                self.notes = self._decide_notes(cand)
            if self.notes and self.notes["named"]:
                shape_notes.annotated(cand.model, shape_notes.notes(cand.model, self.notes.get("data_prop", False)))
        return origins

    def _decide_notes(self, cand: Candidate) -> dict:
        """``shape_notes.decide`` on ``cand``'s graph (module docstring there); not named where ONNX Runtime does not
        run the graphs here or cannot load this one."""
        if not self.backend.ort_providers:
            return {"named": False, "values": 0, "more": {}, "fewer": {}, "why": "not run by ONNX Runtime here"}
        try:
            key = graph_key(cand.model, self.feeds, backend=self.backend, threads=self.threads, digests=cand.digests)
            return shape_notes.decided(self.cache, key, cand.model, cand.weights, threads=self.threads,
                                       backend=self.backend)
        except Exception as e:  # the candidate's own load reports it; the graphs go without notes
            return {"named": False, "values": 0, "more": {}, "fewer": {}, "why": error_line(e)}

    @staticmethod
    def _fill(c: Candidate | None) -> None:
        """``c``'s graph with its weights (exported as shells: ``ExportMemo``), for the graph :meth:`choose` gives
        back to be written. A graph that is only run is not filled: its sessions take the arrays themselves
        (:meth:`_blobs`); filling ViT-B/16's 346 MB into each candidate and reading them back out to run it cost
        2-3 s a graph here."""
        if c is not None and c.model is not None and c.weights:
            fill_weights(c.model, c.weights)
            c.weights = None

    def profile(self, cand: Candidate) -> Candidate:
        """Export ``cand`` and price its e-nodes in context."""
        origins = self._export(cand)
        if origins is None:
            return cand
        origins = np.asarray(origins, dtype=np.int64)
        idx = np.where(origins >= 0, np.searchsorted(self.node_ids, np.maximum(origins, 0)), -1)
        weights = np.where(idx >= 0, self.alone[np.maximum(idx, 0)], 0.0)
        try:
            prof = profile_graph(cand.model, self.feeds, weights, backend=self.backend, threads=self.threads,
                                 cache=self.cache, refresh=self._refresh, digests=cand.digests,
                                 arrays=cand.weights)
        except Exception as e:  # a graph ONNX Runtime cannot load or run: not a candidate
            cand.status, cand.model = f"cannot run: {error_line(e)}", None
            return cand
        cand.profile_key, cand.blob = prof.key, prof.blob
        if prof.cached:
            self.profiles_cached += 1
            cand.profile_source = "cache"
        else:
            self.profiles_measured += 1
            retaken = self._redo is not None and (prof.replaced or prof.key in self._stale)
            cand.profile_source = "re-taken" if retaken else "measured"
            if retaken:
                self._retaken.add(prof.key)
            if self._redo is not None:
                self._redo.add(prof.key)
            self._measured_keys.add(prof.key)
        self.call_overhead_ms = prof.call_overhead_ms
        keep = idx >= 0
        kernels = np.unique(idx[keep])
        total = np.bincount(idx[keep], weights=prof.node_ms[keep], minlength=len(self.ctx))
        # the nodes of the choice that wrote no ONNX node (weights, inputs, folded constants) cost nothing here
        chosen = np.union1d(self.index(cand.choice), kernels)
        self._shares[chosen] += total[chosen]
        self._seen[chosen] += 1
        self._graphs.append((kernels, prof.latency_ms - prof.call_overhead_ms))
        self._reconcile()
        cand.profiled_ms = prof.latency_ms
        return cand

    def _found(self) -> None:
        if self.on_graph is not None:
            self.on_graph(1 + len(self.candidates))

    def _cut(self, choice: dict[int, int]) -> np.ndarray:
        nodes = self.index(choice)
        orig = self.index(self.original.choice)
        changed = np.setdiff1d(nodes, orig)
        return changed if len(changed) else nodes

    def run(self, original: dict[int, int], first: Extraction, *, rounds: int, candidates: int,
            input_nodes: int | None = None) -> None:
        """Steps 1 to 3 of the module docstring; ``first`` is the one-node-cost extraction. ``input_nodes``:
        the input model's node count; when the original choice exports to fewer nodes (a rewrite proved a
        node equal to an older value, so the original e-classes already skip it; identical nodes shared;
        constants folded), or where its shape notes name dims ONNX Runtime leaves unnamed or let it take kernels away
        (``shape_notes.decide``: YOLOv8n's graph with them ran 1.057x the input model at 2 threads, Faster R-CNN's
        shape chains fold), that graph is a candidate too."""
        if self._run_args is None:
            self._run_args = (original, first, rounds, candidates, input_nodes)
        first = self.ids(first)
        self.original = self.profile(Candidate("original", original, float("nan"), status="input"))
        self.original.predicted_ms = self.predicted(original)
        self._found()
        seen = [original]
        o = self.original
        n = self.notes or {}
        notes_help = bool(n.get("named") and (n.get("fewer") or n.get("unknown_dims")))
        if o.model is not None and input_nodes is not None and (len(o.model.graph.node) < input_nodes or notes_help):
            self.candidates.append(Candidate("original, simplified", original, o.predicted_ms, model=o.model,
                                             nodes=o.nodes, profiled_ms=o.profiled_ms, profile_key=o.profile_key,
                                             profile_source=o.profile_source, blob=o.blob, digests=o.digests,
                                             weights=o.weights))

        def add(label: str, choice: dict[int, int], profile: bool) -> None:
            seen.append(choice)
            cand = Candidate(label, choice, self.predicted(choice))
            if profile:
                self.profile(cand)
            else:  # filled in and loaded in ONNX Runtime when it is to be timed (``_ready``)
                self._export(cand)
            twin = self._twin(cand)
            if twin is not None:  # two choices that export to one graph (unused classes aside) are timed once
                cand.status, cand.model, cand.blob, cand.weights = f"the same graph as {twin.label}", None, None, None
            self.candidates.append(cand)
            self._found()

        if first != original:
            add("one-node", first, True)
        for r in range(rounds):
            choice = self.ids(ilp_extract(self._problem(), time_limit=self.ilp_time_limit, mip_gap=self.mip_gap))
            if choice in seen:
                break
            add(f"round {r + 1}", choice, True)
        if candidates > 0:
            fewest = ilp_extract(self._problem(fewest=True), time_limit=self.ilp_time_limit, mip_gap=self.mip_gap)
            if fewest is not None and self.ids(fewest) not in seen:
                add(FEWEST, self.ids(fewest), False)
        while len(self.usable()) < candidates:
            ext = ilp_extract(self._problem(), time_limit=self.ilp_time_limit, mip_gap=self.mip_gap,
                              exclude=[self._cut(c) for c in seen])
            if ext is None:
                break
            choice = self.ids(ext)
            if choice in seen:
                break
            add(f"next-best {len(self.candidates) + 1}", choice, False)

    def _twin(self, cand: Candidate) -> Candidate | None:
        """The usable candidate whose graph ``cand``'s exported graph is (by their keys: ``_name``), or None."""
        if cand.model is None:
            return None
        return next((c for c in self.usable() if c is not cand and self._name(c) == self._name(cand)), None)

    def usable(self) -> list[Candidate]:
        return [c for c in self.candidates if c.model is not None]

    # ------------------------------------------------------------------ steps 1 to 3 again
    def _retake(self, checks: list[dict], status) -> int:
        """Remove the stale rows from the cache and run steps 1 to 3 again, re-taking every profile the
        check did not confirm (a profile taken in this run and not contradicted stands); returns the
        number of rows removed."""
        stale = {r["key"] for r in checks if r["stale"]}
        self._stale |= stale
        trusted = {r["key"] for r in checks if not r["stale"]} | (self._measured_keys - stale)
        removed = self.cache.delete(stale) if self.cache is not None else 0
        status(f"re-taking {len(stale)} stale whole-graph profile(s) and the prices made from them ...")
        self._redo = set()
        self._refresh = lambda key: key not in trusted and key not in self._redo
        original, first, rounds, candidates, input_nodes = self._run_args
        self._reset_prices()
        self.candidates, self.original = [], None
        try:
            self.run(original, first, rounds=rounds, candidates=candidates, input_nodes=input_nodes)
        finally:
            self._refresh = False
        return removed

    def report(self) -> list[dict]:
        """The original and every candidate, with predicted and measured latencies."""
        return [c.as_dict() for c in [self.original, *self.candidates] if c is not None]
