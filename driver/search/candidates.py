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
4. **Check** (:meth:`Search.choose`): the input model and every candidate are timed as whole models,
   interleaved (:func:`relsat.driver.boundary.latency.time_models`); the input model is timed alone when there
   is no candidate. Every whole-graph profile used so far, from the cost cache or taken in this run, is
   checked against the fresh timing of its graph (the original's against the input model's): it agrees
   within the noise (``FIDELITY_FLOOR``, or the fresh runs' interquartile range or their block medians'
   range over the median where wider: ``Search._agreement``) on either side, and one
   that does not is stale when its ratio to the timing is also off the other profiles' ratio (their median)
   by more than that noise, or off by more than ``GROSS_DRIFT``. Cached profiles taken while other jobs
   shared the machine predicted squeezenet at 5.7x and Inception-v3 at 2.3x their latency in every later
   run; a speed the machine took since moves every profile alike and changes no price's proportion to
   another, so no choice of the ILP (:meth:`Search.check`). A cached one that is stale is first measured
   again as it was taken (a session, runs back to back, ``REMEASURE_BURSTS`` times: ``_remeasure``); when
   those bursts' range, widened by the noise, holds the row, the row holds (the timing moved, not the profile)
   and nothing is searched again; a held row off the timing beyond the floor whose re-measure lies within it is
   restated as measured now (``_restate_held``).
   When one is stale, its row is removed from the cache and steps 1 to 3 run again, re-taking every profile the
   check found stale or did not check (their rows replaced), so the prices and the candidates come from fresh
   numbers; the candidates are timed again (unless they are the graphs just timed: those timings stand)
   and checked again, the noise widened by how far the input model's fresh timings moved apart. A cached
   row that is stale now (it passed the first check inside a wider noise band) is re-taken the same way,
   up to ``RETAKES`` searches in all, then only removed. Only cached rows can be stale: a profile taken
   in this run that disagrees is the noise of the machine between it and the timing, and stands for this
   run; it is measured again, and where that contradicts it too its cached latency is restated as measured
   now (``_restate``), so that the next run does not find it stale and search twice. A measured choice is
   stored and recalled by a later run that reaches the same graphs (``relsat.driver.search.comparisons``):
   the candidates that lost are not timed again; one it wrote is timed again and verified, and written only
   when it is faster now, else the input model is kept (``_recall``). One that kept the input model over a
   candidate whose second timing was a close miss (faster beyond the threshold by the medians, not in every
   block) times that candidate again, in at most ``REOPENED_MOST`` later runs (``_chance_in``).
   ``Search.fidelity`` reports the prediction of the original against its measured latency, what was
   stale and what was re-taken.
5. **Choice**: the candidates are verified fastest first; the fastest that verifies is written when it
   beats the input model by more than the guard threshold and beyond the spread of the timing (every block
   median below every one of the input model's: :func:`relsat.driver.boundary.latency.judge`), and again in a
   second timing of the two
   alone (:meth:`Search._confirmed`: the fastest of several candidates beats the threshold by noise now
   and then; a second timing that is faster in every block but not by the threshold in all is taken once
   more, judged alone by the same rule), else the input model is.

6. **Simplified** (:meth:`Search._simplified`, ``Options.simplify``): where none is written so, the fastest
   candidate not slower beyond the threshold in the first timing that ONNX Runtime runs with fewer kernels and no more work of any kind
   than the input model (:func:`relsat.driver.boundary.ort_graph.does_less`, on the graphs the runtime itself
   optimized) is verified and timed against the input model again; not slower there (by the medians, and in no
   block beyond the threshold: :func:`relsat.driver.boundary.latency.not_slower`), it is written, and reported as
   simplified, not faster.

A graph's predicted latency is the sum of its e-nodes' costs plus the call overhead of
``session.run``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import onnx

from relsat.extract.context import graph_key, graph_latency, profile_graph, restate_latency
from relsat.extract.profile import timing_kind
from relsat.extract.extraction import Extraction, ExtractionProblem, ilp_extract
from relsat.relations import runtime
from relsat.relations.backend import Backend

from relsat.driver.boundary import feeds, ort_graph, shape_notes
from relsat.driver.search import comparisons
from relsat.driver.errors import error_line
from relsat.driver.boundary.latency import (BUDGET_S, MIN_RUNS, GuardResult, Latency, gain, judge, judged_ms, not_slower,
                                            paired_ms, promising, relative_range, second_chance,
                                            slower_in_a_block_only, time_models, undecided)
from relsat.driver.boundary.onnx_export import ExportMemo, export_graph, fill_weights, in_order
from relsat.driver.boundary.verify import VerifyResult, verify


FIDELITY_FLOOR = 0.10  # a profile is stale when its latency and the fresh timing differ by more than this
# (or more than the fresh timing's spread, where that is larger), on either side
GROSS_DRIFT = 0.5  # a cached profile off its fresh timing by more than this, alone or with every other, is stale
# (a row taken while other jobs shared the machine: squeezenet 5.7x, Inception-v3 2.3x); within it, only a row off
# the others' ratio is (``Search.check``): this machine's speed moved 1.27x within minutes (ViT-B/16's input
# model 158 -> 200 ms) and moves every row alike
RETAKES = 2  # times the search runs again on re-taken profiles; after the first, only for cached rows that
# still disagree (a cached row passed the first check inside a wide noise band and failed a narrower one)


REMEASURE_BURSTS = 3  # a disagreeing cached profile is measured again this many times (``Search._remeasure``)


CONFIRM_MIN_RUNS = 2 * MIN_RUNS  # runs per model in the second timing of the candidate to write, at least
CONFIRM_TIMINGS = 2  # second timings at most, the next only after a promising one (``Search._confirmed``), with
# twice the runs and budget of the one before: a close call gets its block medians from more runs
REOPENED_MOST = 2  # later runs that time again a candidate whose second timing was a close miss (``Search._chance_in``)
FEWEST = "fewest nodes"  # the candidate whose graph runs the fewest nodes (``Search._problem``)
NOT_HELD = "not faster when timed again"  # the status of a candidate its second timing kept out (``Search._confirmed``)
CLOSE_MISS = NOT_HELD + ", close"  # ... where that timing was a close miss
SIMPLIFIED = "simplified"  # the status of a candidate written for doing less, not faster beyond noise (``_simplified``)
SLOWER_SIMPLIFIED = "runs fewer kernels, but was slower when timed again"  # ... of one its second timing kept out


@dataclass
class Candidate:
    """One graph the search considered (``as_dict()`` is its row of the report)."""

    label: str  # original | original, simplified | one-node | round N | fewest nodes | next-best N
    choice: dict[int, int]  # e-class -> e-node id
    predicted_ms: float  # predicted latency when it was chosen (before it was profiled or timed)
    model: onnx.ModelProto | None = None
    profiled_ms: float | None = None  # its whole-graph latency in the profiling session
    measured_ms: float | None = None  # median in the final interleaved timing (the guard's metric)
    wall_ms: float | None = None
    timing: Latency | None = None
    status: str = "candidate"  # candidate | timed | written | simplified | slower | not verified: ... | ...
    nodes: int = 0
    profile_key: str | None = None  # the cost cache key of its whole-graph profile
    profile_source: str | None = None  # cache | measured | re-taken (None: not profiled)
    confirm: dict | None = None  # the second timing against the input model of the candidate picked
    blob: object = None  # the graph as its profile made it runnable (bytes or a ``runtime.Runnable``; node names aside)
    digests: dict | None = None  # its weights' digests, as the export hashed them (``export_graph``)
    loaded: bool = False  # an unprofiled graph loaded in ONNX Runtime this run (``Search._ready``)
    weights: dict | None = None  # its weights' arrays while the model holds them as shells (``Search._fill``): runs
    # take them as they are (``Search._blobs``), and only the graph written is filled
    graph_key: str | None = None  # its profile's cache key, or the key it would have (a cached comparison names it)
    verified: VerifyResult | None = None  # its verification in this choice (``Search._verify``: made once)

    def as_dict(self) -> dict:
        return {"label": self.label, "predicted_ms": self.predicted_ms, "profiled_ms": self.profiled_ms,
                "measured_ms": self.measured_ms, "wall_ms": self.wall_ms, "status": self.status, "nodes": self.nodes,
                "profile": self.profile_source, "confirm": self.confirm, "graph_key": self.graph_key}


@dataclass
class Search:
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

    def _ready(self, status) -> None:
        """Each candidate graph that was not profiled (next-best graphs) loaded in ONNX Runtime with its
        optimizations on; one that
        cannot load is dropped (``cannot load: ...``). Done by :meth:`choose` after the cached comparison was
        looked up: one recalled runs none of these graphs (it named them by their keys; each loaded then), and a
        session of BERT-base made only to check it cost 2-3 s a graph of a warm run. The graph is serialized
        once for the check and the timing after it."""
        todo = [c for c in self.candidates if c.model is not None and c.profile_key is None and not c.loaded]
        if todo:
            status(f"loading {len(todo)} candidate graph(s) in ONNX Runtime ...")
        for c in todo:
            self._name(c)  # (named in the comparison stored after the choice, loaded or not)
            try:
                runtime.session(self._blobs([c.model])[0])
                c.loaded = True
            except Exception as e:  # never fail a valid model: this candidate is dropped
                c.status, c.model = f"cannot load: {error_line(e)}", None

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

    # ------------------------------------------------------------------ check and choice
    def _time(self, input_model: onnx.ModelProto, cands: list[Candidate], bindings, threshold: float) -> None:
        """Time the input model and ``cands`` interleaved (the input model alone when there are none). A
        candidate whose first block already overlaps the input model's is not run in the second
        (:func:`~relsat.driver.boundary.latency.undecided`: it cannot be written whatever that block gives),
        unless its profile disagrees with its first block: the first block alone is biased (the sessions made
        first in it run slower, the reason for the second, reversed one) and the check (:meth:`check`) would
        then find a profile stale and search again, which costs far more than the block."""
        shapes = bindings[0]  # timed at the costed binding
        decided = undecided(threads=self.threads, backend=self.backend, threshold=threshold)
        orig = self.original
        same = next((c for c in cands if c.model is orig.model), None)

        def disagrees(c: Candidate | None, t: Latency) -> bool:
            return (c is not None and c.profile_key is not None and c.profiled_ms is not None
                    and not self._agreement(c.profiled_ms, t)["agrees"])

        def race(t: list[Latency]) -> list[bool]:
            # the original's profile is checked against its own exported graph's timing where that is a
            # candidate (which carries the same profile), else against the input model's (:meth:`check`)
            return [same is None and disagrees(orig, t[0])] + [
                n or disagrees(c, x) for n, c, x in zip(decided(t)[1:], cands, t[1:])]

        res = time_models(self._blobs([input_model] + [c.model for c in cands]), threads=self.threads,
                          backend=self.backend, input_shapes=shapes, roles=feeds.input_roles(input_model, shapes),
                          race=race)
        orig.timing, orig.measured_ms, orig.wall_ms = res[0], judged_ms(res[0], self.threads, self.backend), \
            res[0].median_ms
        for c, t in zip(cands, res[1:]):
            c.timing, c.measured_ms, c.wall_ms, c.status = t, judged_ms(t, self.threads, self.backend), t.median_ms, \
                "timed"

    def _blobs(self, models: list[onnx.ModelProto]) -> list:
        """Each model made runnable once per :meth:`choose` (``runtime.runnable``: every timing makes two sessions of
        each model, and serializing DistilBERT took 0.6 s a time: 17 of the 53 s the choice took); a candidate's
        profile has made its graph runnable already (:attr:`Candidate.blob`); one over 2 GiB stays a model."""
        done = {id(c.model): c.blob for c in self.usable() if c.blob is not None}
        shells = {id(c.model): c.weights for c in [self.original, *self.candidates]
                  if c is not None and c.model is not None and c.weights}
        for m in models:
            if id(m) not in self._serialized:  # the model is kept too, so that its id is not reused
                blob = done.get(id(m))
                if blob is None:
                    blob = runtime.runnable(m, shells.get(id(m)))
                self._serialized[id(m)] = (m, blob)
        return [self._serialized[id(m)][1] for m in models]

    def _agreement(self, profiled_ms: float, timing: Latency) -> dict:
        """A profile's latency against the fresh timing of its graph: the ratio, the tolerance and whether
        they agree. The tolerance is the noise: the floor, or where larger the fresh runs' interquartile range
        over their median, or how far the timing's own block medians lie apart over their median (ViT-B/16's
        moved 16-31 % within one timing here: a profile inside that range cannot be told off it), widened after
        a re-take by how far the input model's two fresh timings moved apart (this machine, shared, swung
        between 0.13 and 0.22 ms on small SqueezeNet within seconds)."""
        measured = judged_ms(timing, self.threads, self.backend)
        spread = max((timing.q3_ms - timing.q1_ms) / timing.median_ms if timing.median_ms > 0 else 0.0,
                     relative_range(timing.blocks(self.backend.metric(self.threads))))
        tolerance = (1 + max(self.fidelity_floor, spread)) * (1 + self._drift) - 1
        ratio = profiled_ms / measured if measured > 0 else math.inf
        return {"profiled_ms": profiled_ms, "measured_ms": measured, "ratio": ratio, "spread": spread,
                "drift": self._drift, "tolerance": tolerance, "agrees": 1 / (1 + tolerance) <= ratio <= 1 + tolerance}

    def check(self) -> list[dict]:
        """Step 4's check: every profiled graph with a fresh timing, one row per profile (cache key). The
        original's profile is checked against the timing of the same exported graph where it is a
        candidate ("original, simplified"), else against the input model's.

        Each row says whether its profile ``agrees`` with the fresh timing (within the noise) and whether it is
        ``stale``: it does not, and its ratio is off the other rows' (their median) beyond the same noise, or off
        by more than ``GROSS_DRIFT`` (the only test of a row alone). A speed the machine took since the profiles
        (all of them, or all that came from the cache with nothing measured now) moves every row alike: the
        prices keep their proportions, the ILP makes the same choices, and a second search finds the same
        candidates."""
        o = self.original
        rows, seen = [], set()
        same = next((c for c in self.usable() if c.model is o.model and c.timing is not None), None)
        graphs = [(o, (same or o).timing)] + [(c, c.timing) for c in self.usable()]
        for c, timing in graphs:
            if c.profile_key is None or c.profiled_ms is None or timing is None or c.profile_key in seen:
                continue
            seen.add(c.profile_key)
            rows.append({"label": c.label, "key": c.profile_key, "profile": c.profile_source,
                         **self._agreement(c.profiled_ms, timing)})
        for i, r in enumerate(rows):
            others = [x["ratio"] for j, x in enumerate(rows) if j != i and math.isfinite(x["ratio"]) and x["ratio"] > 0]
            common = float(np.median(others)) if others else r["ratio"]  # alone: only a gross drift tells
            relative = r["ratio"] / common if common > 0 else math.inf
            gross = not 1 / (1 + GROSS_DRIFT) <= r["ratio"] <= 1 + GROSS_DRIFT
            r.update(others_ratio=common, relative=relative, stale=not r["agrees"] and (
                gross or not 1 / (1 + r["tolerance"]) <= relative <= 1 + r["tolerance"]))
        return rows

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

    def choose(self, input_model: onnx.ModelProto, *, bindings, threshold: float, input_sets=(),
               status=lambda text: None) -> tuple[Candidate | None, VerifyResult | None, dict | None]:
        """Steps 4 and 5: time the input model and the usable candidates interleaved, check the profiles
        (re-taking stale ones: see :data:`RETAKES`), verify fastest first. Returns the candidate to write
        (None: the input model), its verification, and the guard's report (the input model against the
        written or, if none, the fastest candidate; None without candidates)."""
        self._serialized = {}
        try:
            picked, check, guard = self._choose(input_model, bindings, threshold, input_sets, status)
            self._fill(picked)  # (written: the only graph whose weights go into its model)
            return picked, check, guard
        finally:
            self._serialized, self._input_sha256 = {}, None

    def _choose(self, input_model, bindings, threshold, input_sets, status):
        self._found_comparison, self._drift = None, 0.0
        recalled = self._recall(input_model, bindings, threshold, input_sets, status) if self.usable() else None
        if recalled is not None:
            return recalled
        t_retake, removed, measured, first, stale_all, reused, remeasured = None, 0, [], None, [], 0, []
        timed = None  # the last timing: the original and the candidates it timed
        for attempt in range(RETAKES + 1):
            self._ready(status)
            cands = self.usable()
            if timed is not None and self._reuse(timed, cands):
                reused += 1  # the search on re-taken prices found the graphs already timed
            else:
                status(("timing the input model" + (f" and {len(cands)} candidate graph(s)" if cands else "")
                        + (" again" if attempt else "") + " ..."))
                self._time(input_model, cands, bindings, threshold)
                measured.append(self.original.measured_ms)
            timed = (self.original, list(cands))
            lo, hi = min(measured), max(measured)
            self._drift = hi / lo - 1 if lo > 0 else 0.0
            checks = self.check()
            if attempt == 0:
                first = {**self._original_fidelity(), "checked": checks}
            # only a cached profile can be stale: one taken in this run disagrees by the noise (the machine moved
            # between the profile and the timing), and re-taking it measures that noise again (ViT-B/16 at 2
            # threads with a test suite beside it: a re-take of its fresh profile cost 79 s and left it 12 % off)
            stale = [r for r in checks if r["stale"] and r["profile"] == "cache"]
            if stale:  # a row that a fresh measurement of its own kind confirms is not stale: the timing moved
                again = self._remeasure(stale, status)
                self._restate_held(again)
                remeasured += again
                stale = [r for r in stale if r["key"] not in {h["key"] for h in again if h["held"]}]
            stale_all += [{**r, "search": attempt + 1} for r in stale]
            if not stale or self._run_args is None:
                break
            if attempt == RETAKES:  # out of re-takes: the stale rows go, the next run measures them
                removed += self.cache.delete({r["key"] for r in stale}) if self.cache is not None else 0
                break
            t_retake = t_retake or time.perf_counter()
            removed += self._retake(checks, status)
        restated = self._restate(checks, status)
        retaken = attempt > 0
        self.fidelity = self._fidelity(
            checks, timings_of_input_ms=measured, stale=stale_all, searches=attempt + 1 if retaken else 1,
            retaken=len(self._retaken), stale_rows_removed=removed,
            stale_rows_replaced=len(self._stale & self._retaken),
            retake_s=time.perf_counter() - t_retake if t_retake else 0.0, timings_reused=reused,
            remeasured=remeasured, first_pass=first if retaken else None, restated=restated)
        if not cands:
            return None, None, None
        picked, check, guard = self._pick(input_model, cands, bindings, threshold, input_sets, status)
        less = None
        if picked is None and self.simplify:
            simpler = self._simplified(input_model, cands, bindings, threshold, input_sets, status)
            if simpler is not None:
                picked, check, guard, less = simpler
        report = {**guard.as_dict(), **({"simplified": less} if less is not None else {})}
        orig = self.original
        if self.cache is not None:  # (a written one is confirmed again when recalled: ``_recall``)
            # under the key a later run computes before loading its graphs: with those the choice could not load
            named = [c for c in self.candidates if c.model is not None or c.status.startswith("cannot load")]
            comparisons.remember(self.cache, self._comparison_key(input_model, named, bindings, threshold),
                                 timing_kind(self.backend), self.threads, orig.timing,
                                 [(c.label, c.timing, c.status) for c in named], report)
        return picked, check, report

    def _pick(self, input_model, cands: list[Candidate], bindings, threshold: float, input_sets, status):
        """Step 5 on the timed candidates: verify fastest first, write the first that verifies and is faster
        beyond the noise, here and again in its second timing (``_confirmed``). Returns the candidate (None: the
        input model), its verification and the guard (the input model against it, or the fastest).

        The fastest candidate is also given its second timing when it is faster beyond the threshold by the
        medians but not in every block (``second_chance``): on a machine whose speed moves 10-50 % within a
        timing, Swin-T's 1.14x faster graph (onnxsim's output is as fast: 1.11x) lost one block of four at 0.89x and
        was not written. The second timing alone then decides, by the same every-block rule, and the guard
        reported is its own."""
        orig = self.original
        picked, check, confirmed = None, None, None
        for i, c in enumerate(sorted(cands, key=self._gain, reverse=True)):
            held = judge(orig.timing, c.timing, threads=self.threads, backend=self.backend, threshold=threshold)
            chance = i == 0 and not held.keep_optimized and second_chance(held)
            if not held.keep_optimized and not chance:
                c.status = "slower" if self._gain(c) <= 1.0 else "not faster beyond noise"
            elif picked is None:
                result = self._verify(input_model, c, bindings, input_sets, status)
                if not result.ok:
                    continue
                ok, o_t, c_t = self._confirmed(input_model, c, bindings, threshold, status)
                if ok:
                    picked, check, c.status = c, result, "written"
                    confirmed = (o_t, c_t) if chance else None
                    if chance:
                        c.confirm = dict(c.confirm or {}, second_chance=True)
                else:
                    picked = False  # the fastest verified candidate did not hold: none is written
        picked = picked or None
        best = picked or self.fastest()
        first, second = confirmed or (orig.timing, best.timing)
        guard = judge(first, second, threads=self.threads, backend=self.backend, threshold=threshold)
        guard.keep_optimized = picked is not None  # a faster candidate that failed verification is not kept
        return picked, check, guard

    def _simplified(self, input_model, cands: list[Candidate], bindings, threshold: float, input_sets, status):
        """Step 6, where no candidate was faster beyond the noise (``_pick`` wrote none): the fastest candidate that
        was not slower beyond the threshold in the first timing (by the medians of the blocks it shared with the input
        model; the second timing decides: DistilHuBERT's "original, simplified" graph, 28 kernels fewer, ran 0.99x
        there in a timing whose blocks moved by 26 %) and that
        ONNX Runtime runs with fewer kernels and no more of any class of work than the input model
        (``ort_graph.does_less``: its graph as the runtime optimizes it, at these threads, on this backend) is
        verified and timed against the input model again (``_not_slower``); not slower there, it is written as a
        *simplified* graph (status ``SIMPLIFIED``), not called faster. Only the first candidate that does less is
        timed: trying the next ones until one is not slower would fish in the noise.

        Why: a gain under the guard's threshold is below what this machine can tell (A/A pairs of one model move by
        3-11 %), yet the work a graph leaves out is known without timing it. onnxsim and onnxslim write their folded
        graphs whatever they gain; relsat reached theirs or more (GPT-2: ONNX Runtime runs 739 kernels of relsat's
        graph against onnxslim's 857 and the input model's 971; Whisper-tiny 95 against 114 and 146) and wrote the
        input model, 1-3.5 % behind them when that gain was real. Returns ``(candidate, verification, guard, what it
        does less)`` or None."""
        if not self.backend.ort_providers:  # (a graph ONNX Runtime does not run here has no optimized graph to read)
            return None
        order = [c for c in sorted(cands, key=self._gain, reverse=True)  # (not slower beyond the threshold)
                 if self._gain(c) * (1.0 + threshold) >= 1.0 and c.model is not None
                 and not c.status.startswith("not verified")]
        if not order:
            return None
        status("reading the graphs ONNX Runtime runs for the input model and the candidates ...")
        before = self._runtime_graph(input_model)
        if before is None:
            return None
        for c in order:
            less = self._does_less(input_model, c, before)
            if less is None:
                continue
            result = self._verify(input_model, c, bindings, input_sets, status)
            if not result.ok:
                continue
            ok, held = self._not_slower(input_model, c, bindings, threshold, status)
            if not ok:
                return None
            c.status = SIMPLIFIED
            return c, result, held, less
        return None

    def _verify(self, input_model: onnx.ModelProto, c: Candidate, bindings, input_sets, status) -> VerifyResult:
        """``c`` verified against the input model, once a choice (``_pick`` verifies the fastest; ``_simplified`` may
        take the same candidate after its second timing failed); a failure is its status."""
        if c.verified is None:
            status(f"verifying the {c.label} graph ...")
            c.verified = verify(input_model, self._blobs([c.model])[0], bindings=bindings, input_sets=input_sets)
            if not c.verified.ok:
                c.status = f"not verified: {c.verified.message}"
        return c.verified

    def _runtime_graph(self, model: onnx.ModelProto) -> onnx.GraphProto | None:
        """The graph ONNX Runtime runs for ``model`` here (``ort_graph.optimized_graph``), None where it cannot be
        read."""
        try:
            return ort_graph.optimized_graph(self._blobs([model])[0], threads=self.threads, backend=self.backend)
        except Exception:
            return None

    def _does_less(self, input_model: onnx.ModelProto, c: Candidate, before=None) -> dict | None:
        """What ``c`` leaves out of the input model's work as ONNX Runtime runs both (``ort_graph.does_less``;
        ``before``: the input model's graph, read already), or None."""
        before = before if before is not None else self._runtime_graph(input_model)
        after = self._runtime_graph(c.model) if before is not None else None
        return ort_graph.does_less(before, after) if after is not None else None

    def _not_slower(self, input_model: onnx.ModelProto, c: Candidate, bindings, threshold: float,
                    status) -> tuple[bool, GuardResult]:
        """Time the input model and ``c`` again, by themselves, as the first timing did (``MIN_RUNS`` at least: the
        claim is not slower, and a recalled one is timed so again in every warm run): whether ``c`` is not slower
        there (``latency.not_slower``; if not, ``c``'s status says so), and the guard of that timing
        (``keep_optimized`` set where it is not slower). A close call (slower only by a block:
        ``latency.slower_in_a_block_only``) is timed once more, as ``_confirmed`` times a promising one: with
        ``CONFIRM_MIN_RUNS`` runs and twice the budget, judged alone; any other timing ends it."""
        shapes = bindings[0]
        earlier = [c.confirm] if c.confirm else []  # (a second timing ``_confirmed`` gave it as a faster graph)
        for k in range(CONFIRM_TIMINGS):
            status(f"timing the {c.label} graph against the input model again (it runs fewer kernels) ...")
            more = {"min_runs": CONFIRM_MIN_RUNS, "budget_s": BUDGET_S * 2} if k else {}
            held = self._timed_again(input_model, c, shapes, threshold, seed=1 + k, **more)
            c.confirm = dict(held.as_dict(), timings=1 + k, simplified=True, earlier=list(earlier))
            if not_slower(held):
                held.keep_optimized = True
                return True, held
            if not slower_in_a_block_only(held):
                break
            earlier.append(c.confirm)
        c.status = (f"{SLOWER_SIMPLIFIED} ({judged_ms(held.optimized, self.threads, self.backend):.3f} ms vs "
                    f"{judged_ms(held.original, self.threads, self.backend):.3f} ms"
                    + (f"; {c.confirm['timings']} timings" if c.confirm["timings"] > 1 else "") + ")")
        return False, held

    def _timed_again(self, input_model: onnx.ModelProto, c: Candidate, shapes, threshold: float, *, seed: int,
                     **runs) -> GuardResult:
        """The input model and ``c`` timed again, by themselves, in fresh sessions at ``shapes``
        (``time_models``; ``runs``: its min_runs, budget_s, race), and judged (``judge``): what ``_confirmed`` and
        ``_not_slower`` decide on."""
        orig, again = time_models(self._blobs([input_model, c.model]), threads=self.threads, backend=self.backend,
                                  input_shapes=shapes, roles=feeds.input_roles(input_model, shapes), seed=seed,
                                  **runs)
        return judge(orig, again, threads=self.threads, backend=self.backend, threshold=threshold)

    def _fidelity(self, checks: list[dict], *, timings_of_input_ms: list, stale=(), searches: int = 1,
                  retaken: int = 0, stale_rows_removed: int = 0, stale_rows_replaced: int = 0, retake_s: float = 0.0,
                  timings_reused: int = 0, remeasured=(), first_pass=None, restated=(),
                  comparison_recalled=None) -> dict:
        """Step 4's report (``Search.fidelity``): the original's prediction against its fresh timing, the
        checks, what was stale, re-taken, re-measured, restated, and the cached comparison found or recalled."""
        return {**self._original_fidelity(), "metric": self.backend.metric(self.threads),
                "floor": self.fidelity_floor, "timing_drift": self._drift, "timings_of_input_ms": timings_of_input_ms,
                "checked": checks, "stale": list(stale), "searches": searches,
                "profiles_measured": self.profiles_measured, "profiles_from_cache": self.profiles_cached,
                "retaken": retaken, "stale_rows_removed": stale_rows_removed,
                "stale_rows_replaced": stale_rows_replaced, "retake_s": retake_s, "timings_reused": timings_reused,
                "remeasured": list(remeasured), "confirmed": [h for h in remeasured if h["held"]],
                "first_pass": first_pass, "comparison_recalled": comparison_recalled,
                "comparison_found": self._found_comparison, "restated": list(restated)}

    # ------------------------------------------------------------------ cached comparisons
    def _comparison_key(self, input_model: onnx.ModelProto, cands: list[Candidate], bindings, threshold) -> str:
        """The key of the comparison of the input model with ``cands``: each candidate named by its profile's
        cache key, or for one that was not profiled (next-best graphs) the key its profile would have."""
        if self._input_sha256 is None or self._input_sha256[0] is not input_model:  # hashed once a choice
            self._input_sha256 = (input_model, comparisons.input_sha256(self._blobs([input_model])[0], input_model))
        return comparisons.comparison_key(self._input_sha256[1], [self._name(c) for c in cands],
                                          timing_kind(self.backend), self.threads, threshold, bindings[0],
                                          simplify=self.simplify)

    def _name(self, c: Candidate) -> str:
        """``c.graph_key``, set once: its profile's cache key, or the key its profile would have."""
        if c.graph_key is None:
            c.graph_key = c.profile_key or graph_key(c.model, self.feeds, backend=self.backend,
                                                     threads=self.threads, digests=c.digests)
        return c.graph_key

    def _recall(self, input_model: onnx.ModelProto, bindings, threshold: float, input_sets, status) -> tuple | None:
        """The choice a cached comparison of the same input model and candidate graphs made
        (``relsat.driver.search.comparisons``) as ``_choose`` returns it, or None: then everything is timed.

        One that kept the input model: the input model is timed alone and the original's cached profile checked
        against it; a stale one (the check's rules, the original's row alone) recalls nothing. One that wrote a
        candidate: that candidate and the input model are timed again by themselves (``_confirmed``, the
        confirmation every written model gets), the original's profile and the candidate's checked against those
        timings, and the candidate verified; it is written only if all of that holds now, so a model is still
        written on a fresh timing (the other candidates', which lost, come from the row). When that candidate is
        not faster beyond the noise now, the input model is kept and nothing else is timed: the others were slower
        than it in the stored comparison, and timing them all again cost ViT-B/16's warm runs 57-102 s for a choice
        that the noise of one timing decided; the row stays, so the next run confirms that candidate afresh. Unless
        it does less (``_simplified``, as ``_choose`` goes on after ``_pick``): then it is timed once more and
        written simplified where it is not slower (Silero VAD 16k's graph, 37 kernels fewer, written by the run
        that made the comparison, was not faster beyond the noise when the corpus run recalled it, and the input
        model was written: ``fell_back`` in the found comparison). One
        that kept the input model while its fastest candidate was faster by the medians but not in every block
        (stored before ``_pick`` gave such a candidate its second timing) gives it that timing now, as if the
        comparison had written it, and the row is stored again with what that timing gave, so that it is not given
        again. A stale profile (one that its own measurement, ``_remeasure``, does not hold either) or a failed
        verification recalls nothing. One that wrote a simplified graph (``SIMPLIFIED``, ``_simplified``) times it
        again as that choice did (``_not_slower``) and writes it, verified, where it is not slower now. Recalled, the
        candidates carry the stored timings and statuses, the report the guard's (``recalled``: when the comparison
        was measured)."""
        cands = self.usable()
        self._found_comparison = None
        if self.cache is None:
            return None
        key = self._comparison_key(input_model, cands, bindings, threshold)
        record = comparisons.recall(self.cache, key)
        if record is None or [r["label"] for r in record["candidates"]] != [c.label for c in cands]:
            return None
        when = record["conditions"].get("measured_at")
        orig = self.original
        written = next((c for c, r in zip(cands, record["candidates"]) if r["status"] == "written"), None)
        simple = None if written is not None else next(
            (c for c, r in zip(cands, record["candidates"]) if r["status"] == SIMPLIFIED), None)
        chance = written is None and simple is None and self._chance_in(record, cands, threshold)
        # a close miss timed again: the row counts it (``REOPENED_MOST``)
        reopen = bool(chance) and self._reopens(record, next(r for c, r in zip(cands, record["candidates"])
                                                             if c is chance))
        if chance:  # its fastest candidate was not given its second timing (``_pick``): given now, as a written one
            written = chance
        written = written or simple
        less = None  # what a simplified one leaves out (``_not_slower``'s timing below)
        fell_back = False  # a written one not faster now, written simplified instead
        if written is None:
            status("timing the input model (the candidates' comparison is cached) ...")
            self._time(input_model, [], bindings, threshold)
            held = True
        else:
            try:
                if simple is not None:  # written for doing less: written again where it is not slower now and
                    # still does less (as the row stored it; read again from the runtime's graphs where it did not)
                    held, timed = self._not_slower(input_model, simple, bindings, threshold, status)
                    orig.timing, written.timing = timed.original, timed.optimized
                    less = (record["guard"] or {}).get("simplified") or self._does_less(input_model, simple)
                    held = held and less is not None
                else:
                    held, orig.timing, written.timing = self._confirmed(input_model, written, bindings, threshold,
                                                                        status)
                    if not held and self.simplify:  # as ``_choose`` after ``_pick``: written simplified if it does
                        # less and is not slower timed again (Silero VAD 16k's graph, 37 kernels fewer, faster when
                        # the comparison was made, not beyond the noise when recalled: the input model was written)
                        simpler = self._simplified(input_model, [written], bindings, threshold, input_sets, status)
                        if simpler is not None:
                            simple, (_, _, timed, less), held, fell_back = written, simpler, True, True
                            orig.timing, written.timing = timed.original, timed.optimized
            except Exception:  # (it loaded and ran when the comparison was made): time everything, ``_choose``
                self._missed(written)
                return None
            for c in (orig, written):
                c.measured_ms, c.wall_ms = judged_ms(c.timing, self.threads, self.backend), c.timing.median_ms
        checks = self.check()
        stale = [r for r in checks if r["stale"] and r["profile"] == "cache"]
        # as in ``_choose``: a row that a fresh measurement of its own kind confirms is not stale, the timing moved
        # (ViT-B/16's warm run: the input model 1.33x its profile in the confirmation, 87 s of choice timing all
        # candidates again for a profile that held)
        again = self._remeasure(stale, status) if stale else []
        self._restate_held(again)
        stale = [r for r in stale if r["key"] not in {h["key"] for h in again if h["held"]}]
        self._found_comparison = {"key": key, "measured_at": when, "checked": checks, "recalled": not stale,
                                  **({"remeasured": again} if again else {}),
                                  **({"written": written.label, "held": held} if written is not None else {}),
                                  **({"simplified": True} if simple is not None else {}),
                                  **({"fell_back": True} if fell_back else {}),
                                  **({"second_chance": True} if chance else {}),
                                  **({"reopened": record.get("reopened", 0) + 1} if reopen else {})}
        if stale:  # the prices may be poisoned: time everything (``_choose``)
            self._missed(written)
            return None
        check = None
        if written is not None and held:
            check = self._verify(input_model, written, bindings, input_sets, status)  # (once: ``_simplified`` may have)
            if not check.ok:
                self._found_comparison.update(recalled=False, verified=check.message)
                self._missed(written)
                return None
        self._drift = 0.0
        self.fidelity = self._fidelity(checks, timings_of_input_ms=[orig.measured_ms], comparison_recalled=when,
                                       remeasured=again)
        if written is None:  # the stored timings from here: the candidates were timed against that one
            orig.timing = record["original"]
            orig.measured_ms, orig.wall_ms = judged_ms(orig.timing, self.threads, self.backend), orig.timing.median_ms
        for c, r in zip(cands, record["candidates"]):
            if c is written:
                if held:  # (the report's notice says how: timed again now, the others cached)
                    c.status = SIMPLIFIED if c is simple else "written"
                continue
            if r["status"].startswith("cannot load"):  # dropped by the choice that made the comparison
                c.model = None
            c.timing = r["timing"]
            if c.timing is not None:
                c.measured_ms, c.wall_ms = judged_ms(c.timing, self.threads, self.backend), c.timing.median_ms
            c.status = f"{r['status']} (the comparison of {when}, cached)"
        if written is None:
            return None, None, {**(record["guard"] or {}), "recalled": when}
        guard = judge(orig.timing, written.timing, threads=self.threads, backend=self.backend, threshold=threshold)
        # (the last timing ``_confirmed`` judged: ``guard.keep_optimized`` is ``held``; not held, its status says so)
        if simple is not None:  # written for doing less: kept where not slower (``_not_slower``)
            guard.keep_optimized = held
        if chance:  # the row says what its second timing gave: a later run recalls it as written, or not again
            comparisons.remember(
                self.cache, key, timing_kind(self.backend), self.threads, record["original"],
                [(r["label"], r["timing"], (written.status if not held or fell_back else "written") if c is written
                 else r["status"])
                 for c, r in zip(cands, record["candidates"])],
                {**guard.as_dict(), **({"simplified": less} if fell_back else {})},  # (as ``_choose`` stores it)
                reopened=record.get("reopened", 0) + reopen)
        report = {**guard.as_dict(), "recalled": when, **({"simplified": less} if simple is not None and held else {})}
        if not held:
            return None, None, report
        return written, check, report

    def _chance_in(self, record: dict, cands: list[Candidate], threshold: float) -> Candidate | None:
        """The candidate of a recalled comparison that kept the input model which ``_pick`` now gives a second
        timing: the fastest of its timings, faster beyond the threshold by the medians but not in every block, or
        one that ``judge`` keeps now (stored before the medians were the blocks': BERT-base's candidate, faster in
        every block by 3.7-6.3 %, was kept out at "0.766x" by overall medians and called slower), and either never
        timed a second time (its status is the first timing's) or a close miss in its last second timing
        (``CLOSE_MISS``) that fewer than ``REOPENED_MOST`` recalls have timed again (``reopened`` in the row).
        Whisper-tiny at 2 threads: its graph, 1.06-1.10x the input model's speed whenever every candidate was
        timed afresh, missed one block of its second timing in one run (130.2 vs 140.6 ms by the medians), and
        every later run recalled that verdict and wrote the input model, while onnxslim's output ran 1.076x.
        None otherwise."""
        timed = [(c, r) for c, r in zip(cands, record["candidates"]) if r["timing"] is not None and c.model is not None]
        if not timed:
            return None
        metric = self.backend.metric(self.threads)
        c, r = max(timed, key=lambda x: gain(record["original"], x[1]["timing"], metric))  # (as ``_gain``, stored)
        held = judge(record["original"], r["timing"], threads=self.threads, backend=self.backend, threshold=threshold)
        judged = r["status"] in ("not faster beyond noise", "slower")  # (not timed again, not failed to load)
        return c if (judged or self._reopens(record, r)) and (held.keep_optimized or second_chance(held)) else None

    @staticmethod
    def _reopens(record: dict, row: dict) -> bool:
        """Whether a recall times the candidate of ``row`` again after its second timing: a close miss there
        (``CLOSE_MISS``) while fewer than ``REOPENED_MOST`` recalls have, or any candidate timed again in a row
        stored before close misses were told apart (no ``reopened`` in it), once."""
        if row["status"].startswith(CLOSE_MISS):
            return record.get("reopened", 0) < REOPENED_MOST
        return row["status"].startswith(NOT_HELD) and "reopened" not in record

    @staticmethod
    def _missed(written: Candidate | None) -> None:
        """A recalled comparison's written candidate as it was before the recall (its confirmation undone)."""
        if written is not None:
            written.confirm, written.status, written.timing, written.measured_ms = None, "candidate", None, None

    def _remeasure(self, rows: list[dict], status) -> list[dict]:
        """Each row of ``rows`` (cached profiles the check found off the fresh timing) measured again, as its
        profile measured it (``graph_latency``: a session, warm-up, runs back to back), in ``REMEASURE_BURSTS``
        bursts taken in turn over the rows; ``held`` where the cached latency lies within the bursts' range
        widened by the noise (the floor, or where larger the bursts' runs' spread): then the row is not stale,
        the timing moved, and a second search on a re-taken row would price from one more draw of the same
        noise. One burst was the test before, and this machine's speed moves more from one burst to the next
        than within one (ConvNeXt V2-T alone on a quiet machine, 33 bursts of 5 runs in a minute: 175-233 ms,
        the runs of one burst 1-8 % apart), so a single burst called rows stale that a second burst would
        have matched, and each cost a second search (40-150 s of a warm run)."""
        graphs = []
        for r in rows:
            c = next((x for x in [self.original, *self.usable()] if x is not None and x.profile_key == r["key"]
                      and x.model is not None), None)
            if c is not None:
                graphs.append((r, c, []))
        if graphs:
            status(f"measuring {len(graphs)} graph(s) again to check their cached profiles ...")
        blobs = self._blobs([c.model for _, c, _ in graphs])
        for _ in range(REMEASURE_BURSTS):
            for (r, c, bursts), blob in zip(graphs, blobs):
                try:
                    bursts.append(graph_latency(blob, self.feeds, backend=self.backend, threads=self.threads))
                except Exception:  # (it ran when it was profiled and timed; a failure here decides nothing)
                    continue
        again = []
        for r, c, bursts in graphs:
            valid = sorted((b for b in bursts if b[0] > 0), key=lambda b: b[0])
            if not valid:
                continue
            medians = [b[0] for b in bursts if b[0] > 0]
            ms, q1, q3, runs = valid[(len(valid) - 1) // 2]  # the middle burst (the median of an odd count)
            spread = max([(hi - lo) / m for m, lo, hi, _ in valid], default=0.0)
            tolerance = max(self.fidelity_floor, spread)
            low, high = min(medians) / (1 + tolerance), max(medians) * (1 + tolerance)
            again.append({"label": r["label"], "key": r["key"], "cached_ms": r["profiled_ms"], "fresh_ms": ms,
                          "bursts_ms": medians, "quartiles_ms": [q1, q3], "runs": runs,
                          "range_ms": [low, high], "ratio": r["profiled_ms"] / ms,
                          "tolerance": tolerance, "timed_ms": r["measured_ms"],
                          "held": low <= r["profiled_ms"] <= high})
        return again

    def _restate_held(self, again: list[dict]) -> None:
        """Cached rows that their re-measure (``_remeasure``) held only by the width of its band: off this run's
        timing by more than the floor, while the re-measure's middle burst lies within the floor of it. Each is
        restated as measured now (``restate_latency``, ``restated`` in its entry), without a second search: the
        band (the bursts' range widened by the noise) held DistilHuBERT's original at 1 thread, cached at 9.91 ms,
        against bursts of 8.75-10.74 (middle 9.60) and a timing of 8.99 ms, and every later run priced it 1.10-1.34x
        its latency. A re-measure as far from the timing as the row (a timing the machine slowed) changes nothing."""
        if self.cache is None:
            return
        for h in again:
            if not h["held"] or not h["timed_ms"] or h["fresh_ms"] <= 0:
                continue
            off = lambda ms: abs(math.log(ms / h["timed_ms"]))
            if off(h["fresh_ms"]) <= math.log1p(self.fidelity_floor) < off(h["cached_ms"]):
                h["restated"] = self._restate_as_measured(h)

    def _restate_as_measured(self, h: dict) -> bool:
        """Row ``h["key"]``'s cached latency restated as its re-measure (``_remeasure``'s entry ``h``) found it."""
        return restate_latency(self.cache, h["key"], h["fresh_ms"], h["bursts_ms"], quartiles_ms=h["quartiles_ms"],
                               runs=h["runs"], backend=self.backend, threads=self.threads)

    def _restate(self, checks: list[dict], status) -> list[dict]:
        """The profiles this run took that disagree with the fresh timing, measured again (``_remeasure``); where
        that does not hold the profile either, its cached latency is restated as the new measurement
        (``relsat.extract.context.restate_latency``), so that the next run does not find it stale and search
        twice. This run's prices stand (its candidates are timed). Returns the re-measures, ``restated`` marking
        the rows changed."""
        own = [r for r in checks if not r["agrees"] and r["profile"] != "cache"]
        if not own or self.cache is None:
            return []
        again = self._remeasure(own, status)
        for h in again:
            h["restated"] = not h["held"] and self._restate_as_measured(h)
        return again

    @staticmethod
    def _key(c: Candidate) -> tuple:
        return c.label == "original, simplified", tuple(sorted(c.choice.items()))

    def _reuse(self, timed: tuple, cands: list[Candidate]) -> bool:
        """After a re-take: when the search on the fresh prices found exactly the graphs of the last timing,
        their timings stand (a graph's latency does not depend on the prices that found it, and timing them
        again cost as much as the first timing). Only all or none: the timing pairs every candidate's
        blocks with the input model's of the same timing. Returns whether it took the timings."""
        orig, before = timed
        old = {self._key(c): c for c in before}
        if len(old) != len(cands) or any(self._key(c) not in old for c in cands):
            return False
        o = self.original
        o.timing, o.measured_ms, o.wall_ms = orig.timing, orig.measured_ms, orig.wall_ms
        for c in cands:
            t = old[self._key(c)]
            c.timing, c.measured_ms, c.wall_ms, c.status = t.timing, t.measured_ms, t.wall_ms, t.status
        return True

    def _confirmed(self, input_model: onnx.ModelProto, c: Candidate, bindings, threshold: float,
                   status) -> tuple[bool, Latency, Latency]:
        """Time the input model and ``c`` again, by themselves, in fresh sessions: ``c`` is written only if it
        is faster beyond ``threshold`` in such a timing too (by the medians and in every block, ``judge``). With
        several candidates, the fastest of them in one timing is faster than the input model by more than the
        threshold now and then by noise alone (MobileNetV3 and RegNetY: written at 0.975-0.994x of the input
        model's speed, the same kernels).

        A slow model gets ``CONFIRM_MIN_RUNS`` runs here: with ``MIN_RUNS`` a block of a 100 ms model is four
        runs, and two slow ones among them (ConvNeXt V2 at 2 threads: a 1.15x faster graph's block at 103-109 ms
        beside blocks of 83-92) failed the every-block rule in one timing of three. A timing that does not pass
        but is *promising* (faster beyond the threshold by the medians and faster in every block, only not by
        the threshold in all of them) is taken once more, up to ``CONFIRM_TIMINGS`` in all, each judged alone by
        the same rule: ViT-B/16's 1.10x faster graph was timed again at block ratios 1.12, 1.10, 1.03, 1.14
        while the machine's speed moved 30 % between the blocks. That next timing makes twice the runs (and
        spends twice the budget) of the one before: a block median of more runs moves less with the machine,
        so the same every-block rule tells a real gain of a few percent from the noise more often either way
        (Whisper-tiny's graph at 2 threads was kept out by its second timing: 130.2 vs 140.6 ms by the medians,
        not in every block). A timing where the candidate is slower in any block ends it. Returns whether it held,
        and the last timing of the input model and of ``c``."""
        shapes = bindings[0]
        tries = []
        for k in range(CONFIRM_TIMINGS):
            status(f"timing the {c.label} graph against the input model again ...")
            held = self._timed_again(input_model, c, shapes, threshold, seed=1 + k,
                                     min_runs=CONFIRM_MIN_RUNS * 2**k, budget_s=BUDGET_S * 2**k,
                                     race=undecided(threads=self.threads, backend=self.backend, threshold=threshold))
            orig, again = held.original, held.optimized
            tries.append(held.as_dict())
            c.confirm = dict(tries[-1], timings=len(tries), earlier=tries[:-1])
            if held.keep_optimized:
                return True, orig, again
            if not promising(held):
                break
        head = CLOSE_MISS if second_chance(held) else NOT_HELD
        c.status = (f"{head} ({judged_ms(again, self.threads, self.backend):.3f} ms vs "
                    f"{judged_ms(orig, self.threads, self.backend):.3f} ms"
                    + (f"; {len(tries)} timings" if len(tries) > 1 else "") + ")")
        return False, orig, again

    def _original_fidelity(self) -> dict:
        """The in-context prediction of the original (the sum of its e-nodes' costs plus the call overhead)
        and its profile against the input model's fresh timing."""
        o = self.original
        if o is None or o.timing is None:
            return {}
        measured = o.measured_ms
        predicted = self.predicted(o.choice) if o.model is not None else None
        agreement = self._agreement(predicted, o.timing) if predicted is not None else {}
        return {"original_predicted_ms": predicted, "original_profiled_ms": o.profiled_ms,
                "original_measured_ms": measured,
                "original_prediction_ratio": predicted / measured if predicted is not None and measured > 0 else None,
                "original_profile_ratio": o.profiled_ms / measured if o.profiled_ms is not None and measured > 0
                else None,
                "original_tolerance": agreement.get("tolerance"),
                "original_within_tolerance": agreement.get("agrees")}

    def fastest(self) -> Candidate | None:
        """The usable candidate measured fastest against the input model (``_gain``; None before :meth:`choose`,
        or without candidates)."""
        timed = [c for c in self.usable() if c.measured_ms is not None]
        return max(timed, key=self._gain, default=None)

    def paired(self, c: Candidate) -> tuple[float | None, float | None]:
        """The input model's and ``c``'s medians (ms), by the figure the guard compares, over the runs the two made
        in the same minutes (``paired_ms``: a candidate the race left out of the second session is ranked on the
        first, not against the input model's runs of other minutes); their overall medians where a timing is
        missing. What a report says of ``c`` against the input model: the overall medians of runs in other
        minutes can disagree with the comparison made (BERT-base's recalled one: 101.4 against 76.8 ms overall,
        1.016x faster paired)."""
        o = self.original
        if o is not None and o.timing is not None and c.timing is not None:
            return paired_ms(o.timing, c.timing, self.backend.metric(self.threads))
        return (o.measured_ms if o is not None else None), c.measured_ms

    def _gain(self, c: Candidate) -> float:
        """How many times faster ``c`` ran than the input model over the runs they made in the same minutes
        (``paired``); 0 where a figure is missing."""
        a, b = self.paired(c)
        return a / b if a and b else 0.0

    def report(self) -> list[dict]:
        """The original and every candidate, with predicted and measured latencies."""
        return [c.as_dict() for c in [self.original, *self.candidates] if c is not None]
