"""The phases of the optimize pipeline (``relsat.driver.app.optimize``), each a function from what it needs to
a typed result.

``relsat.driver.app.optimize`` runs them in this order, times them and builds the ``Report`` from their
results; its module docstring says what each does.  A phase reads the run's settings (:class:`Run`) and
the results of the phases before it, and returns its own result: nothing is shared through attributes.
Every notice a phase gives travels in its result (``notices``), in the order the phases ran.

- prepare: :func:`prepare` -> :class:`Prepared` (the rules, the cost cache);
- import: :func:`load` -> :class:`Loaded`, then :func:`read` -> :class:`Imported` (the model in the
  e-graph, its binding and input sets);
- profile: :func:`check_overhead` -> the call overhead's check (a dict, or None); :func:`price_input` ->
  :class:`InputPriced` (the input graph's predicted cost, before any rule runs);
- saturate: :func:`saturate` -> :class:`Saturated` (the runner's or a search's report);
- profile: :func:`profile` -> :class:`Priced` (every e-node's cost, the extraction problem);
- extract: :func:`extract` -> :class:`Extracted` (greedy, best, the original graph);
- context: :func:`search_candidates` -> :class:`Candidates` (the in-context ``Search``);
- choose: :func:`choose` -> :class:`Chosen` (the measured choice, verified);
- export: :func:`export` -> :class:`Exported` (the first usable extraction);
- verify: :func:`verify_export` -> :class:`Verified`;
- latency: :func:`guard` -> :class:`Timed` (the latency guard);
- decide: :func:`decide` -> :class:`Outcome` (what is written, and why).

``context`` and ``choose`` run instead of ``export``, ``verify`` and ``latency`` when the final choice
is measured in context (:func:`in_context`).  :func:`decide` is the one step that says what is written:
the extraction's fallbacks, a failed verification (nothing is written), the latency guard and the
in-context measured choice all reach it as results.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from relsat.extract.analytic import analytic_costs, problem_from
from relsat.extract.cost_cache import CostCache
from relsat.extract.extraction import Extraction, ExtractionProblem, greedy_extract, ilp_extract
from relsat.extract.measured import MeasuredReport, measured_costs
from relsat.extract.original import original_choice
from relsat.extract.profile import ProviderUnavailable, check_call_overhead
from relsat.programs import rulesets
from relsat.programs.ir import RuleError
from relsat.programs.parser import load_rules
from relsat.relations import runtime
from relsat.relations.backend import Backend
from relsat.relations.egraph import EGraph

from relsat.driver.boundary import bindings, feeds, latency, torch_runtime
from relsat.driver.boundary.bindings import Binding
from relsat.driver.search.candidate import SLOWER_SIMPLIFIED, Candidate
from relsat.driver.search.candidates import Search
from relsat.driver.search.recall import REOPENED_MOST
from relsat.driver.errors import RelsatError, error_line
from relsat.driver.boundary.onnx_export import export_model, in_order, node_positions
from relsat.driver.boundary.onnx_import import ImportResult, check_ort_loadable, import_model, read_model
from relsat.driver.options import Options
from relsat.driver.boundary.outputs import check_outputs, open_cost_cache, protected_paths
from relsat.driver.boundary.outputs import _same as same_file
from relsat.driver.search.runner import Limits, Runner
from relsat.driver.search.runner import Report as RunnerReport
from relsat.driver.search.result import SearchResult
from relsat.driver.boundary.verify import VerifyResult, verify
from relsat.driver.app.explain import record_written

UNCHANGED = "the input model is written unchanged"


def resolve_rules(names, *, check: bool, status=lambda text: None) -> tuple[list[Path], list]:
    """``--rules`` values as (files, rules) through ``relsat.programs.rulesets``; ``check``: verify user
    rule files on random tensors first. Rule-file problems become one-line RelsatErrors."""
    try:
        files = rulesets.rule_files(names) if names else []
        if check and not all(rulesets.is_shipped(f) for f in files):
            status("checking the user rules on random tensors ...")
            rulesets.check_rule_files(files)
        return files, [r for f in files for r in (_shipped(f) if rulesets.is_shipped(f) else load_rules(f)).rules]
    except (rulesets.RuleSetError, RuleError, OSError) as e:
        raise RelsatError(error_line(e)) from None


@functools.lru_cache(maxsize=None)
def _shipped(path: Path):
    """A shipped rule set, parsed once per process (its files do not change; the IR is immutable): a batch
    or a fuzzing campaign parses generated.rules' 1,548 rules once, not once a model (0.4 s each)."""
    return load_rules(path)


@dataclass(frozen=True)
class Run:
    """What every phase of one run may read: the checked options, the backend they resolve to (what runs and
    times the model here, ``relsat.relations.backend``) and the progress callbacks."""

    opts: Options
    backend: Backend
    status: Callable[[str], None]
    on_round: Callable | None = None
    on_progress: Callable[[int, int | None], None] | None = None  # the current phase's steps: done, total
    started: dt.datetime = field(default_factory=dt.datetime.now)  # what this run's own cache rows are dated after

    def tick(self, done: int, total: int | None) -> None:
        """``done`` of ``total`` steps of the current phase (rounds, signatures, search steps) to the caller."""
        if self.on_progress is not None:
            self.on_progress(done, total)


# ---------------------------------------------------------------- prepare, import
@dataclass(frozen=True)
class Prepared:
    in_memory: bool  # the model came as a ModelProto, not a path
    rules: list
    cache: CostCache | None  # the cost cache, with measured costs
    cache_only: bool  # the backend is not here: costs come from the --costs table only
    notices: tuple[str, ...] = ()


def prepare(run: Run, model_or_path, *, output, db, cost_cache) -> Prepared:
    """Every output path checked, the rules resolved (a user's file verified), the cost cache opened and a
    ``--costs`` table imported into it: everything that can fail before any work."""
    o, backend, notices = run.opts, run.backend, []
    in_memory = isinstance(model_or_path, onnx.ModelProto)
    check_outputs(source=None if in_memory else model_or_path, output=output, db=db,
                  protected=protected_paths(cost_cache, o.costs))
    _, rules = resolve_rules(o.rules, check=o.check_rules, status=run.status)
    cache_only = False
    if not backend.here:
        why = backend.unavailable()
        if o.cost_model != "measured" or o.costs is None:
            raise RelsatError(why + "; to use CUDA costs measured elsewhere pass --costs FILE")
        cache_only = True
        notices.append(f"provider {backend.name} is not available here: costs come from the --costs "
                       "table only (missing signatures use scaled analytic costs)")
    cache = None
    if o.cost_model == "measured":  # a bad --costs file fails before any work
        (_, where), *_ = protected_paths(cost_cache)
        if not in_memory and same_file(where, Path(model_or_path)):
            raise RelsatError(f"cost cache {where}: is the input model; relsat never writes it "
                              f"(set RELSAT_COST_CACHE to another file)")
        # open_cost_cache refuses a file that is not a cost cache
        cache = cost_cache if isinstance(cost_cache, CostCache) else open_cost_cache(cost_cache)
        notices += cache.notices
        if o.costs is not None:
            try:
                n = cache.import_(o.costs)
            except Exception as e:
                raise RelsatError(f"--costs {o.costs}: cannot read it as a cost table: {error_line(e)}") from None
            notices.append(f"imported {n} cost rows from {o.costs} into {cache.path}")
    return Prepared(in_memory, rules, cache, cache_only, tuple(notices))


@dataclass(frozen=True)
class Loaded:
    source: str  # the input's path, or "<model>"
    model: onnx.ModelProto
    load_check: Future  # ONNX Runtime's load check, running beside the import (``load``)

    def checked(self) -> None:
        """Wait for the load check: its RelsatError when ONNX Runtime cannot load the model."""
        self.load_check.result()


def load(prepared: Prepared, model_or_path, once: ExitStack) -> Loaded:
    """The input model, its ONNX Runtime load check started. From here on the run serializes it once and shares
    its unoptimized session (``relations.runtime.serialize_once``, entered on ``once``): the load check's session is
    the one the bindings and verification use.  A model read whole from a file is not serialized (the file's bytes
    are its serialization) and its check runs in a thread of its own while ``read`` imports the model (ONNX Runtime
    builds a session without Python's lock: GPT-2's took 2.5-3 s); ``read`` waits for it before anything runs the
    model, and ``once`` when the run stops earlier.  Any other model (given in memory, with external data, in a
    text format) is checked here, before the import, as its serialization would hold Python's lock anyway."""
    path = None if prepared.in_memory else model_or_path
    model, blob = (model_or_path, None) if path is None else read_model(path)
    once.enter_context(runtime.serialize_once(model, blob))
    check: Future = Future()
    if blob is None:
        check_ort_loadable(model, label=path)  # (None: the graph's name)
        check.set_result(None)
    else:
        pool = ThreadPoolExecutor(1, thread_name_prefix="relsat-load-check")
        check = pool.submit(check_ort_loadable, model, label=path)
        once.callback(pool.shutdown, wait=True)  # (runs before serialize_once's block ends: last in, first out)
    return Loaded("<model>" if path is None else str(path), model, check)


@dataclass(frozen=True)
class Imported:
    source: str
    model: onnx.ModelProto  # the input model
    graph: ImportResult  # the model as the e-graph holds it
    roots: list[int]  # the output e-classes
    binding: Binding  # the sizes the dynamic dims are costed, timed and verified at
    input_sets: list  # the user's verification input sets

    @property
    def g(self) -> EGraph:
        return self.graph.egraph


def read(run: Run, loaded: Loaded, g: EGraph) -> Imported:
    """The model read into ``g``, and the sizes its dynamic dims are costed, timed and verified at
    (``relsat.driver.boundary.bindings``), with the user's verification input sets."""
    o, model = run.opts, loaded.model
    run.status(f"importing {len(model.graph.node)} nodes ...")
    try:
        graph = import_model(model, input_shapes=o.input_shapes, fix_shapes=o.fix_shapes, egraph=g)
    except Exception:  # (an interrupt goes on at once)
        loaded.checked()  # a model ONNX Runtime cannot load fails on that first, as it did before the import
        raise
    loaded.checked()
    binding = bindings.choose(model, graph)
    input_sets = feeds.load_input_sets(o.inputs, feeds.graph_inputs(model)) if o.inputs else []
    return Imported(loaded.source, model, graph, [cid for _, cid in graph.outputs], binding, input_sets)


def in_context(run: Run, prepared: Prepared) -> bool:
    """Whether costs are refined in context and the final choice measured (``relsat.driver.search.candidates``):
    with measured costs, timing allowed, candidates asked for, and ONNX Runtime able to run the backend."""
    o = run.opts
    return (o.cost_model == "measured" and o.measure and o.candidates > 0 and not prepared.cache_only
            and run.backend.profiles_graphs)  # in-context costs come from ONNX Runtime's profiler


def check_overhead(run: Run, prepared: Prepared, priced: "InputPriced") -> dict | None:
    """The cached call overhead against a fresh timing of it, replaced when stale and material to the input
    graph as ``priced`` with it (``relsat.extract.profile.check_call_overhead``: its nodes' one-node costs all
    move by the difference), not timed again when this run took it (a cold cache); with the in-context search
    only (it times models)."""
    if prepared.cache is not None and in_context(run, prepared):
        return check_call_overhead(run.backend, run.opts.threads, prepared.cache, nodes=priced.nodes,
                                   cost_ms=priced.cost, taken_since=run.started)
    return None


# ---------------------------------------------------------------- saturate, profile, extract
def pricer(run: Run, prepared: Prepared, imported: Imported) -> Callable:
    """The run's costs for every e-node of an e-graph's current tables (``price(g, progress=False)``): the
    profile phase's, and what the searches compare e-graphs by.  It returns the ``MeasuredReport`` (None
    for analytic costs)."""

    def price(g: EGraph, progress=False) -> MeasuredReport | None:
        if run.opts.cost_model == "measured":
            return measured_costs(g, imported.graph.opset_imports, backend=run.backend, threads=run.opts.threads,
                                  cache=prepared.cache, measure=not prepared.cache_only, progress=progress)
        analytic_costs(g)
        return None

    return price


@dataclass(frozen=True)
class InputPriced:
    cost: float  # the input graph's predicted cost under the run's costs
    report: MeasuredReport | None  # what pricing it measured (None for analytic costs)
    nodes: int = 0  # the input graph's e-nodes (one per e-class the outputs reach)


def price_input(run: Run, imported: Imported, price: Callable) -> InputPriced:
    """The input graph's predicted cost, before any rule runs: its e-nodes (what the outputs reach, one per
    e-class) priced by the run's costs and summed exactly (``fsum`` over the sorted costs).  After saturation
    the input graph cannot be read back whole: rewritten nodes share e-classes with their rewrites (five Relus
    in a chain are one e-class once ``relu-idempotent`` ran), so the report's predicted cost of the input is
    taken here, the same in every strategy."""
    g = imported.g
    try:
        report = price(g)
    except ProviderUnavailable as e:
        raise RelsatError(f"--provider {run.backend.name}: {e}") from None
    nodes = sorted(set(original_choice(g, imported.roots).values()))
    if not nodes:
        return InputPriced(0.0, report, 0)
    g.con.register("_input_nodes", {"node": np.asarray(nodes, dtype=np.int64)})
    try:
        ms = [m for (m,) in g.con.execute("SELECT coalesce(k.ms, 0.0) FROM _input_nodes i "
                                          "LEFT JOIN costs k ON k.node = i.node").fetchall()]
    finally:
        g.con.unregister("_input_nodes")
    return InputPriced(math.fsum(sorted(ms)), report, len(nodes))


def merged(report: MeasuredReport | None, before: MeasuredReport | None) -> MeasuredReport | None:
    """``report`` counting what an earlier pricing of the same run (``before``) measured as measured in this run,
    not as found in the cache (it stored them there)."""
    if report is not None and before is not None:
        report.measured += before.measured
        report.cached = max(0, report.cached - before.measured)
        report.seconds += before.seconds
    return report


@dataclass(frozen=True)
class Saturated:
    sat: RunnerReport | None  # the rounds that built the e-graph (None: no rules)
    searched: SearchResult | None = None  # the search that built it (--search mcts|backtrack)
    node_limit: int | None = None  # the e-node limit it ran under (``Options.node_limit_for``)

    @property
    def backtracked(self) -> bool:
        """The e-graph holds only the chosen graph (the input's cost is the search's start)."""
        return self.searched is not None and self.searched.strategy == "backtrack"


@dataclass(frozen=True)
class Derived:
    applied: tuple = ()  # derive.Derivation, each added to the e-graph
    skipped: tuple = ()  # (root, why) of the chains found but not derived
    notices: tuple = ()
    search: dict | None = None  # --derive-search: its roots and rounds (derive_search.search's figures)

    def as_dict(self) -> dict:
        out = {"applied": [d.as_dict() for d in self.applied],
               "skipped": [{"root": r, "why": w} for r, w in self.skipped]}
        if self.search is not None:
            out["search"] = self.search
        return out


def derive(run: Run, imported: Imported) -> Derived:
    """EinNet-style derivations (``relsat.driver.app.derive``): each derived subgraph checked, the derived
    model imported into the e-graph and its subgraphs' results unioned with the originals' (``--no-derive``:
    none)."""
    if not run.opts.derive:
        return Derived()
    try:
        return _derive(run, imported)
    except RelsatError:
        raise
    except Exception as e:  # a derivation is an optional alternative: its failure never stops the run
        return Derived(skipped=(("(all)", f"derivations failed: {error_line(e)}"),),
                       notices=(f"derivations skipped: {error_line(e)}",))


def _derive(run: Run, imported: Imported) -> Derived:
    from relsat.driver.app import derive as dv
    from relsat.driver.app import derive_blocks as db

    model = imported.model
    chains = dv.find_chains(model)
    convs = dv.find_convs(model)
    blocks = db.find_blocks(model)
    searched = _derive_search(run, imported) if run.opts.derive_search > 0 else None
    if not chains and not convs and not blocks and not searched:
        return Derived()
    run.status(f"deriving {len(chains) + len({c.root for c in convs + blocks})} subgraph(s) ...")
    skipped, applied = [], []
    types = imported.graph.types
    ok = [c for c in chains if dv.static(types, [*c.inputs, *c.consts])]
    skipped += [(c.root, "its inputs have dynamic dims (derived forms fix sizes)") for c in chains if c not in ok]
    weights = dv.model_values(model, [c.consts[0] for c in convs + blocks], {}, run.opts.threads)
    # zero-block weights (exact zeros that make a weight block-diagonal over channels): the weights alone decide,
    # cheaply; a convolution split so is not tried for low rank
    forms = {}
    for c in blocks:
        form = db.block_form(c, weights)
        if form is not None:
            forms[c.root] = form
            ok.append(c)
    convs = [c for c in convs if c.root not in forms]
    # low-rank kernels: the weights alone decide (SVDs within a budget, the largest kernels first); only the
    # convolutions that factor need their input's value
    # the SVD budget goes to the largest kernels first: a 3x3 kernel only splits at a rank below 1.5x its
    # channels, which trained weights never have
    convs.sort(key=lambda c: -int(np.prod(weights[c.consts[0]].shape[2:])))
    svd_s, untried = 0.0, 0
    for c in convs:
        if svd_s > dv.SVD_SECONDS or dv.svd_work(c, weights) > dv.SVD_WORK:
            untried += 1
            continue
        t0 = time.perf_counter()
        form = dv.low_rank_form(c, weights)
        svd_s += time.perf_counter() - t0
        if form is not None:
            forms[c.root] = form
            ok.append(c)
    if untried:
        skipped.append(("(convolutions)", f"{untried} weight(s) not tried for low rank (SVD too large, or past "
                                          f"{dv.SVD_SECONDS:g} s of SVDs in this run)"))
    if ok:
        values = dv.model_values(model, [n for c in ok for n in (*c.inputs, *c.consts)],
                                 imported.binding.costed, run.opts.threads)
        for c in ok:
            d = (db.derive_zero_blocks(c, values, run.opts.threads, form=forms[c.root]) if c.kind == db.KIND
                 else dv.derive(c, values, run.opts.threads, form=forms.get(c.root)))
            if isinstance(d, dv.Derivation):
                applied.append((c, d))
            elif d is not None:
                skipped.append((c.root, d))
    found: list = []  # --derive-search: the alternatives by rank, nodes the derivations above replace left out
    if searched:
        taken = {n.output[0] for c, _ in applied for n in c.nodes}
        found = [[(c, d) for c, d in rank if c.root not in taken] for rank in searched[0]]
        skipped += searched[1]
    notices = [f"derivation skipped at {r}: {w}" for r, w in skipped if r != "(convolutions)"]  # that one: report
    # the derivations above in one derived model, then each rank of the search's in one more (a node is replaced
    # once per model); each imported into the e-graph with its results unioned with the originals'
    for pairs in [applied, *(r for r in found if r)]:
        if pairs and not _import_derived(run, imported, pairs):
            notices.append("derived model's outputs did not join the input's e-classes after the union")
    applied += [p for r in found for p in r]
    notices += [f"derived at {d.root}: {d.detail}; {sum(d.ops.values())} nodes "
                f"({', '.join(f'{k} x{v}' for k, v in sorted(d.ops.items()))}) for {len(d.replaced)}; checked "
                f"under ONNX Runtime, max abs error {d.max_error:.1e}; {d.seconds:.1f} s" for _, d in applied]
    return Derived(tuple(d for _, d in applied), tuple(skipped), tuple(notices),
                   searched[2] if searched else None)


def _import_derived(run: Run, imported: Imported, pairs) -> bool:
    """The input model with each (chain, derivation) of ``pairs`` replaced, imported into the e-graph (hash-consed)
    and each derived result unioned with the original's; whether the outputs' e-classes joined the input's."""
    from relsat.driver.app import derive as dv

    derived_model = imported.model
    for c, d in pairs:
        derived_model = dv.derived_model(derived_model, c, d)
    g, o = imported.g, run.opts
    res = import_model(derived_model, input_shapes=o.input_shapes, fix_shapes=o.fix_shapes, egraph=g)
    g.union([imported.graph.values[c.root] for c, _ in pairs], [res.values[c.root] for c, _ in pairs])
    g.rebuild()
    return g.find(imported.roots).tolist() == g.find([cid for _, cid in res.outputs]).tolist()


def _derive_search(run: Run, imported: Imported):
    """``--derive-search``: derive_search.search over the model's contraction nodes (None: none to search)."""
    from relsat.driver.app import derive as dv
    from relsat.driver.app import derive_search as dsr

    model, types = imported.model, imported.graph.types
    sites = dsr.sites(model, types)
    if not sites:
        return None
    run.status(f"derivation search from {len(sites)} node(s), {run.opts.derive_search} round(s) ...")
    names = sorted({n for s in sites for n in (*s.chain.inputs, *s.chain.consts)})
    values = dv.model_values(model, names, imported.binding.costed, run.opts.threads)
    return dsr.search(imported.g.con, model, types, imported.graph.values, values, run.opts.derive_search,
                      run.opts.threads)


def saturate(run: Run, prepared: Prepared, imported: Imported, price: Callable, *, explain: bool = True) -> Saturated:
    """Build the e-graph: equality saturation, or one of the searches (``--search``). ``explain``: record why
    each e-node exists (the explanation tables), which only an e-graph kept after the run can show."""
    o, g = run.opts, imported.g
    if not prepared.rules:
        return Saturated(None)
    node_limit = o.node_limit_for(g.counts()["enodes"])
    limits = Limits(o.iter_limit, node_limit, o.time_limit, o.multi_rounds, o.slow_rounds)
    run.status(f"saturating with {len(prepared.rules)} rules ..." if o.search == "eqsat"
               else f"{o.search}: searching ...")
    if o.search == "eqsat":
        done = []

        def on_round(it) -> None:
            done.append(it)
            run.tick(len(done), o.iter_limit)
            if run.on_round is not None:
                run.on_round(it)

        return Saturated(Runner(g, prepared.rules, limits, scheduler=o.scheduler, on_round=on_round,
                                explain=explain).run(), node_limit=node_limit)

    def step(i, best) -> None:
        run.tick(i, o.budget or (ITERATIONS if o.search == "mcts" else BUDGET))
        run.status(f"{o.search}: step {i}, best cost {best:.4f}")

    from relsat.driver.search.backtrack import BUDGET
    from relsat.driver.search.mcts import ITERATIONS
    try:
        if o.search == "mcts":
            from relsat.driver.search.mcts import mcts
            searched = mcts(g, prepared.rules, imported.roots, price, limits=limits, seed=o.seed,
                            scheduler=o.scheduler, iterations=o.budget or ITERATIONS, extractor=o.extractor,
                            on_step=step)
        else:
            from relsat.driver.search.backtrack import backtrack
            searched = backtrack(g, prepared.rules, imported.roots, price, alpha=o.alpha,
                                 budget=o.budget or BUDGET, seconds=o.time_limit, on_step=step)
    except ProviderUnavailable as e:
        raise RelsatError(f"--provider {run.backend.name}: {e}") from None
    return Saturated(searched.report, searched, node_limit)


@dataclass(frozen=True)
class Priced:
    profile: MeasuredReport | None  # None for analytic costs
    problem: ExtractionProblem
    node_ids: np.ndarray  # e-node id of each problem index
    notices: tuple[str, ...] = ()


def profile(run: Run, prepared: Prepared, imported: Imported, price: Callable,
            before: MeasuredReport | None = None) -> Priced:
    """Every e-node's cost (measured per operator signature through the cost cache, or analytic) and the
    extraction problem over them.  ``before``: what pricing the input graph (:func:`price_input`) measured:
    its signatures, timed then, count as timed in this run (not as found in the cache)."""
    notices = []
    if run.opts.cost_model == "measured":
        run.status("profiling operators ...")
    try:
        p = price(imported.g,
                  progress=lambda done, total: (run.tick(done, total),
                                                run.status(f"profiling operators: {done}/{total} new signatures")))
    except ProviderUnavailable as e:
        raise RelsatError(f"--provider {run.backend.name}: {e}") from None
    p = merged(p, before)
    if p is not None:
        notices += p.notices
        if p.failed:
            why = "are not in the cost table" if prepared.cache_only else "could not be timed alone"
            notices.append(f"{p.failed} of {p.signatures} operator signatures {why}; "
                           f"their {p.fallback_nodes} e-nodes use scaled analytic costs")
    problem, node_ids = problem_from(imported.g, imported.roots)
    return Priced(p, problem, node_ids, tuple(notices))


@dataclass(frozen=True)
class Extracted:
    greedy: Extraction
    best: Extraction  # the ILP's (the greedy one with --extractor greedy)
    orig: dict[int, int]  # the original graph inside the e-graph: e-class -> e-node
    original_cost: float  # its cost (a backtracking search's start cost)


def extract(run: Run, imported: Imported, saturated: Saturated, priced: Priced) -> Extracted:
    """Greedy and (by default) ILP extraction, and the original graph inside the e-graph with its cost."""
    o = run.opts
    run.status("extracting ...")
    greedy = greedy_extract(priced.problem)
    best = (ilp_extract(priced.problem, time_limit=o.ilp_time_limit, mip_gap=o.mip_gap, warm_start=greedy)
            if o.extractor == "ilp" else greedy)
    orig = original_choice(imported.g, imported.roots)
    cost_of = dict(zip(priced.node_ids.tolist(), priced.problem.node_cost.tolist()))
    original_cost = sum(cost_of.get(n, 0.0) for n in set(orig.values()))
    if saturated.backtracked:  # the e-graph holds only the chosen graph: the input's cost is the search's start
        original_cost = saturated.searched.start_cost
    return Extracted(greedy, best, orig, original_cost)


# ---------------------------------------------------------------- in context: context, choose
@dataclass(frozen=True)
class Candidates:
    search: Search  # the refined costs and the candidate graphs


def _fallbacks(search: Search) -> list:
    return [{"candidate": c.label, "reason": c.status} for c in search.candidates if c.model is None]


def search_candidates(run: Run, prepared: Prepared, imported: Imported, priced: Priced,
                      extracted: Extracted) -> Candidates:
    """Costs refined in context and the candidate graphs found with them (``relsat.driver.search.candidates``,
    steps 1 to 3); the refined costs stored in ``costs``."""
    o, model = run.opts, imported.model
    run.status("profiling whole graphs in context ...")
    shapes = imported.binding.costed
    specs = [(n, shapes[n], runtime.np_dtype(dt)) for n, dt, _ in imported.graph.inputs]
    fed = feeds.draw(specs, feeds.input_roles(model, shapes), 0)
    s = Search(imported.graph, priced.problem, priced.node_ids, fed, run.backend, o.threads, prepared.cache,
               o.ilp_time_limit, o.mip_gap)
    s.on_graph = lambda n: (run.tick(n, None), run.status(f"profiling whole graphs in context: graph {n}"))
    s.simplify, s.shape_notes, s.positions = o.simplify, o.shape_notes, node_positions(model)
    s.run(extracted.orig, extracted.best, rounds=o.context_rounds, candidates=o.candidates,
          input_nodes=len(model.graph.node))
    _store_costs(imported.g, priced.node_ids, s.costs(), np.isfinite(s.ctx))
    return Candidates(s)


@dataclass(frozen=True)
class Chosen:
    """The in-context choice: the candidates timed against the input model, confirmed and verified fastest first."""

    search: Search
    picked: Candidate | None  # the candidate to write (None: the input model)
    label: str  # its label, or "original"
    check: VerifyResult  # its verification
    latency: dict | None  # the input model against the written (or fastest) candidate
    fallbacks: list
    extracted: dict  # op counts of the extracted graph (the fastest candidate when none is picked)
    cost_before: float | None  # the original's in-context prediction (None after a backtracking search)
    cost_after: float
    notices: tuple[str, ...] = ()
    choice: dict | None = None  # the extracted graph shown (written, or the fastest candidate): e-class -> e-node

    @property
    def model(self) -> onnx.ModelProto | None:
        return self.picked.model if self.picked is not None else None


def choose(run: Run, imported: Imported, saturated: Saturated, priced: Priced, extracted: Extracted,
           candidates: Candidates) -> Chosen:
    """Steps 4 to 6 of ``relsat.driver.search.candidates``: the candidates timed against the input model (stale
    profiles re-taken), the fastest that verifies picked when it beats the input model beyond noise, else one that
    does less and is not slower (a simplified graph) where there is one."""
    o, s, model, notices = run.opts, candidates.search, imported.model, []
    picked, check, latency_report = s.choose(model, bindings=imported.binding.all, input_sets=imported.input_sets,
                                             threshold=o.guard_threshold, status=run.status)
    fid, fallbacks = s.fidelity, _fallbacks(s)  # (as the choice left them: a graph that cannot load is dropped there)
    if fid.get("first_pass") is not None:  # stale profiles were re-taken: the search ran again
        _store_costs(imported.g, priced.node_ids, s.costs(), np.isfinite(s.ctx))
        first = fid["first_pass"]
        notices.append(
            f"{len(fid['stale'])} cached whole-graph profile(s) disagreed with the fresh timing beyond the noise "
            f"(the original's prediction was {first.get('original_prediction_ratio') or float('nan'):.2f}x its "
            f"measured latency): re-taken, {fid['retaken']} cost row(s) replaced, and the candidates searched again")
    found = fid.get("comparison_found") or {}
    if fid.get("comparison_recalled") and picked is not None:
        how = ("it found faster by the medians but not in every block was given its second timing now: faster, "
               "and verified" if found.get("second_chance") else
               "it wrote was timed again against the input model now and verified")
        if found.get("fell_back"):
            how = ("it wrote was timed again against the input model now and was not faster beyond the noise, but it "
                   "does less and was not slower timed once more: written simplified, verified")
        if found.get("reopened"):
            how = (f"was a close miss when last timed again (faster by the medians, not in every block): timed again "
                   f"now (recall {found['reopened']} of at most {REOPENED_MOST} that do), faster, and verified")
        notices.append(
            f"the candidate graphs are those a measured comparison of {fid['comparison_recalled']} timed (cached: the "
            f"same input model and graphs); the {picked.label} graph {how}, the other candidates were not timed again")
    elif fid.get("comparison_recalled") and found.get("written") and found.get("simplified"):
        notices.append(
            f"the candidate graphs are those a measured comparison of {fid['comparison_recalled']} timed (cached: the "
            f"same input model and graphs); the {found['written']} graph it wrote simplified (fewer kernels, no more "
            f"work) was timed again against the input model now and was slower, so the input model is kept; the "
            f"other candidates were not timed again")
    elif fid.get("comparison_recalled") and found.get("written"):
        what = ("it found fastest (a close miss when last timed, timed again by at most "
                f"{REOPENED_MOST} recalls)" if found.get("reopened") else
                "it found fastest" if found.get("second_chance") else "it wrote")
        notices.append(
            f"the candidate graphs are those a measured comparison of {fid['comparison_recalled']} timed (cached: the "
            f"same input model and graphs); the {found['written']} graph {what} was timed again against the input "
            f"model now and was not faster beyond the noise, so the input model is kept; the other candidates, slower "
            f"than it then, were not timed again")
    elif fid.get("comparison_recalled"):
        notices.append(
            f"the candidate graphs are those a measured comparison of {fid['comparison_recalled']} found no faster "
            f"than the input model (cached: the same input model and graphs); the input model was timed now and "
            f"the original's profile checked against it, the candidates were not timed again")
    if restated := [h for h in fid.get("restated") or () if h.get("restated")]:
        changes = ", ".join(f"{h['label']} {h['cached_ms']:.3f} -> {h['fresh_ms']:.3f} ms" for h in restated)
        notices.append(
            f"{len(restated)} whole-graph profile(s) this run took disagreed with the fresh timing and with a "
            f"measurement again ({changes}): their cached latency restated, so the next run prices them as measured now")
    if fid.get("confirmed"):
        held = fid["confirmed"]
        ratios = ", ".join(f"{h['ratio']:.2f}x" for h in held)  # of the median of the bursts
        moved = ", ".join(f"{h['label']} {h['cached_ms']:.3f} -> {h['fresh_ms']:.3f} ms"
                          for h in held if h.get("restated"))
        notices.append(
            f"{len(held)} cached whole-graph profile(s) disagreed with the fresh timing beyond the noise, but measured "
            f"again as they were taken they held ({ratios} of the new measurement): the timing moved, not the "
            f"profile, and the candidates were not searched again"
            + (f"; those nearer the timing when measured again restated as measured now ({moved})" if moved else ""))
    if fid.get("original_within_tolerance") is False:
        notices.append(
            f"the in-context prediction of the original is {fid['original_prediction_ratio']:.2f}x its measured "
            f"latency, beyond the noise ({fid['original_tolerance']:.0%}): the timings moved during this run")
    if picked is not None and (latency_report or {}).get("simplified"):
        notices.append(simplified_notice(picked.label, latency_report["simplified"], latency_report))
    elif rejected := next((c for c in s.candidates if (c.confirm or {}).get("simplified")
                           and c.status.startswith(SLOWER_SIMPLIFIED)), None):
        notices.append(f"the {rejected.label} graph {rejected.status}: not written simplified")
    if picked is not None and s.notes is not None:
        notices.append(notes_notice(s.notes, len(picked.model.graph.value_info)))
    orig = extracted.orig
    choice = picked.choice if picked is not None else orig
    _extraction_table(imported.g, choice, orig)
    record_written(imported.graph, choice)  # with --db: the written nodes and the e-nodes they came from
    fastest = s.fastest()
    shown = picked or fastest  # the extracted graph, also when the input model is written
    if fastest is None:
        notices.append("no candidate graph differs from the original: " + UNCHANGED)
    elif picked is None and (held := next((c for c in s.candidates if c.confirm is not None
                                           and not c.confirm.get("simplified")), None)):
        notices.append(
            f"the {held.label} graph was faster beyond noise in the first timing but not when timed again "
            f"against the input model ({held.status.split('(', 1)[-1].rstrip(')')}, threshold "
            f"{o.guard_threshold:.0%}): " + UNCHANGED)
    elif picked is None:
        noise = _noise((latency_report or {}).get("spread"))
        before, after = s.paired(fastest)  # (the runs of the same minutes, as the comparison judged them)
        notices.append(
            f"no candidate graph is faster beyond noise (fastest: {fastest.label}, {after:.3f} ms vs "
            f"{before:.3f} ms{noise}, threshold {o.guard_threshold:.0%}): " + UNCHANGED)
    return Chosen(
        s, picked, picked.label if picked is not None else "original",
        check or VerifyResult(True, 0.0, 0.0, {}, UNCHANGED), latency_report, fallbacks,
        _op_counts(shown.model if shown is not None else model),
        None if saturated.backtracked else s.predicted(orig) - s.call_overhead_ms,
        s.predicted(choice) - s.call_overhead_ms, tuple(notices), shown.choice if shown is not None else None)


def simplified_notice(label: str, less: dict, guard: dict) -> str:
    """What a simplified graph (``Search._simplified``) is and is not: the kernels it leaves out, and its timing
    within the noise."""
    k0, k1 = less["kernels"]
    fewer = ", ".join(f"{c} {a}->{b}" for c, (a, b) in less["fewer"].items())
    if less.get("instead"):  # classes that run in place of fewer of another (``ort_graph.STANDS_IN``)
        fewer += "; in their place " + ", ".join(f"{c} {a}->{b}" for c, (a, b) in less["instead"].items())
    a, b = guard["paired_ms"][guard["metric"]]
    return (f"the {label} graph is written simplified: ONNX Runtime runs it with {k0 - k1} fewer kernels ({k0}->{k1}: "
            f"{fewer}) and no more of any kind; timed again it was not slower ({b:.3f} ms vs {a:.3f} ms), but not "
            f"faster beyond noise (threshold {guard['threshold']:.0%} in every block): not claimed faster")


def notes_notice(notes: dict, written: int) -> str:
    """Whether the written graph names its values' shapes (``shape_notes.decide``'s report, made on the original
    choice's graph; ``written``: the values the written graph names) and why."""
    def ops(d: dict) -> str:
        return ", ".join(f"{op} {a}->{b}" for op, (a, b) in d.items())
    if notes["named"] and written:
        fewer = f"; with them ONNX Runtime runs {ops(notes['fewer'])}" if notes["fewer"] else ""
        return (f"the written graph names the inferred shapes of {written} values (value_info), so that ONNX "
                f"Runtime's memory planner can prove buffers of one size{fewer}; no op runs more often")
    if notes["more"]:
        return ("the written graph does not name its values' shapes: with them ONNX Runtime would run "
                + ops(notes["more"]))
    return "the written graph does not name its values' shapes: " + notes.get("why", "ONNX's inference names none")


# ---------------------------------------------------------------- otherwise: export, verify, latency
@dataclass(frozen=True)
class Exported:
    """The first usable extraction, exported (:func:`_export_first_usable`)."""

    label: str  # ilp | greedy | original
    used: Extraction | None  # the extraction it came from (None: none could be used)
    model: onnx.ModelProto | None  # the optimized model (None: the choice is the original graph)
    session: object | None  # its ONNX Runtime session, for verification
    fallbacks: list  # the extractions passed over: {"candidate", "reason"}
    extracted: dict  # op counts of the model this proposes (the input model when ``model`` is None)
    cost_after: float
    notices: tuple[str, ...] = ()
    choice: dict | None = None  # the exported choice: e-class -> e-node (None: the input model is the choice)


def export(imported: Imported, priced: Priced, extracted: Extracted) -> Exported:
    """The first usable extraction written as ONNX: ILP, then greedy, then the input model itself, with a
    notice (a valid model never makes ``optimize`` fail)."""
    notices, best = [], extracted.best
    label, used, choice, optimized, fallbacks = _export_first_usable(
        imported.graph, [(best.method, best), ("greedy", extracted.greedy)], priced.node_ids, extracted.orig,
        notices, len(imported.model.graph.node), node_positions(imported.model))
    _extraction_table(imported.g, choice, extracted.orig)
    record_written(imported.graph, choice)  # with --db: the written nodes and the e-nodes they came from
    model, session = optimized if optimized is not None else (None, None)
    return Exported(label, used, model, session, fallbacks, _op_counts(model if model is not None else imported.model),
                    used.cost if used is not None else extracted.original_cost, tuple(notices),
                    choice if used is not None and optimized is not None else None)


@dataclass(frozen=True)
class Verified:
    check: VerifyResult  # ok: the exported model computes what the input model does
    notices: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.check.ok


def verify_export(run: Run, imported: Imported, exported: Exported) -> Verified:
    """The exported model against the input, element by element at every binding (``relsat.driver.boundary.verify``),
    under ONNX Runtime and, where the backend runs whole graphs with PyTorch, on the GPU too."""
    if exported.model is None:
        return Verified(VerifyResult(True, 0.0, 0.0, {}, UNCHANGED))
    model, how = imported.model, dict(bindings=imported.binding.all, input_sets=imported.input_sets)
    check = verify(model, exported.session, **how)
    if not (check.ok and run.backend.whole_graph == "torch"):
        return Verified(check)
    gpu = verify(model, torch_runtime.session(exported.model, "cuda"), **how)  # and where it will run
    gpu.message = f"on the GPU (PyTorch): {gpu.message}"
    return Verified(gpu if not gpu.ok else check, (f"verified under ONNX Runtime on the CPU and {gpu.message}",))


@dataclass(frozen=True)
class Timed:
    """The latency guard: the input model and the optimized one timed as whole models."""

    latency: dict | None  # ``relsat.driver.boundary.latency.guard``'s report (None: not timed)
    faster: bool  # the optimized model is faster beyond noise (or could not be timed)
    notices: tuple[str, ...] = ()


def guard_skipped() -> Timed:
    return Timed(None, True, ("latency guard skipped: neither ONNX Runtime's CUDAExecutionProvider nor PyTorch "
                              "with CUDA is here to time whole models",))


def guard(run: Run, imported: Imported, optimized: onnx.ModelProto) -> Timed:
    """Time the input and the optimized model (``relsat.driver.boundary.latency.guard``); ``faster`` when the optimized
    one beats the input model beyond noise."""
    o, model, shapes = run.opts, imported.model, imported.binding.costed
    run.status("timing the original and the optimized model ...")
    res = latency.guard(model, optimized, threads=o.threads, backend=run.backend, input_shapes=shapes,
                        threshold=o.guard_threshold, roles=feeds.input_roles(model, shapes))
    if res.keep_optimized:
        return Timed(res.as_dict(), True)
    a, b = ((res.original.cpu_ms, res.optimized.cpu_ms) if res.metric == "cpu"
            else (res.original.median_ms, res.optimized.median_ms))
    return Timed(res.as_dict(), False, (
        f"the optimized model is not faster beyond noise ({b:.3f} ms vs {a:.3f} ms "
        f"{'CPU time' if res.metric == 'cpu' else 'wall clock'}{_noise(res.spread)}, threshold {res.threshold:.0%}): "
        + UNCHANGED,))


def _noise(spread: dict) -> str:
    """``, noise x %, by block a-b x`` from a guard's spread (``relsat.driver.boundary.latency.spread``: the
    width of the block medians, the paired ratios the decision compared), when it has them."""
    if not spread or spread.get("noise") is None:
        return ""
    ratios = spread.get("ratios")
    by_block = f", by block {block_range(ratios)}" if ratios else ""
    return f", noise {spread['noise']:.1%}{by_block}"


def block_range(ratios) -> str:
    """``a-b x``: the least and greatest of a guard's per-block ratios (``spread``'s ``ratios``, the report's
    ``block_ratios``), as the guard's notice, the verdict and the CLI summary print them."""
    return f"{min(ratios):.3f}x-{max(ratios):.3f}x"


# ---------------------------------------------------------------- decide
@dataclass(frozen=True)
class Outcome:
    """What is written, and what the last phases report about it."""

    written: str  # optimized | original
    model: onnx.ModelProto  # the model written: the optimized one or the input model
    label: str  # the extraction or candidate used (original: none)
    fallbacks: list
    extracted: dict  # the extracted graph's op counts, also when the input model is written
    cost_before: float | None  # the in-context prediction of the original (None: the extraction's cost of it)
    cost_after: float
    check: VerifyResult
    latency: dict | None
    notices: tuple[str, ...]  # the last phases', in the order they ran
    choice: dict | None = None  # the extracted graph (also when the input model is written): e-class -> e-node


def decide(imported: Imported, offered: Exported | Chosen, verified: Verified | None = None,
           timed: Timed | None = None, *, db=None) -> Outcome:
    """The one step that says what is written.  ``offered``: the exported extraction (then ``verified`` is its
    verification and ``timed`` the latency guard, None when it did not run) or the in-context choice (which
    verified and timed its candidate itself).  The input model is written when nothing else is offered (the
    extraction kept the original graph or none could be used; no candidate beat it) or when the guard found
    the optimized model not faster; a failed verification writes nothing: a RelsatError."""
    if isinstance(offered, Chosen):
        check, timing, cost_before = offered.check, offered.latency, offered.cost_before
    else:
        check, timing, cost_before = verified.check, timed.latency if timed is not None else None, None
    if not check.ok:
        where = f"; the e-graph is in {db}" if db is not None else ""
        raise RelsatError(f"{imported.source}: verification failed, no model written: {check.message}{where}")
    notices = [*offered.notices, *(verified.notices if verified is not None else ())]
    if offered.model is None:
        if isinstance(offered, Exported) and not offered.fallbacks:
            notices.append("the extraction kept the original graph: " + UNCHANGED)
        written = "original"
    else:
        written = "optimized" if timed is None or timed.faster else "original"
    notices += timed.notices if timed is not None else ()
    return Outcome(written, offered.model if written == "optimized" else imported.model, offered.label,
                   offered.fallbacks, offered.extracted, cost_before, offered.cost_after, check, timing,
                   tuple(notices), offered.choice)


# ---------------------------------------------------------------- helpers
def _export_first_usable(imported, candidates, node_ids, orig, notices, input_nodes=None, positions=None):
    """Export the first candidate extraction that ONNX Runtime can load (with its optimizations on), its nodes in
    the input model's order where ``positions`` are given (``in_order``, as the search's candidates are),
    so that a valid model never makes ``optimize`` fail: ``(label, result, choice, model, fallbacks)``,
    ``model`` being (ModelProto, its ONNX Runtime session, reused by verification), or None when the
    choice is the original graph; the label is ``original`` (result None) when no candidate could be
    used. Each candidate passed over adds a notice and a fallback entry."""
    fallbacks, seen = [], []
    for label, res in candidates:
        choice = {int(c): int(node_ids[i]) for c, i in res.choice.items()}
        if choice in seen:
            continue
        seen.append(choice)
        try:
            candidate = export_model(imported, choice)
            if choice == orig and (input_nodes is None or len(candidate.graph.node) >= input_nodes):
                return label, res, choice, None, fallbacks  # the input model itself, unchanged
            if positions:
                in_order(candidate, positions)
            session = runtime.session(candidate)  # loadable with ONNX Runtime's optimizations on
        except Exception as e:  # never fail a valid model: fall back to the next candidate
            fallbacks.append({"candidate": label, "reason": error_line(e)})
            notices.append(f"the {label} extraction cannot be used: {error_line(e)}")
            continue
        return label, res, choice, (candidate, session), fallbacks
    notices.append("no extracted graph could be used: " + UNCHANGED)
    return "original", None, orig, None, fallbacks


def _op_counts(model: onnx.ModelProto) -> dict:
    return {"nodes": len(model.graph.node), "ops": dict(sorted(Counter(n.op_type for n in model.graph.node).items()))}


def _store_costs(g: EGraph, node_ids: np.ndarray, ms: np.ndarray, in_context: np.ndarray) -> None:
    """The refined costs into ``costs``: ``ms`` what extraction used, ``alone_ms`` the one-node cost before
    (kept when the refined costs are stored again), ``source`` 'context' for e-nodes priced inside a profiled
    whole graph."""
    g.con.execute("ALTER TABLE costs ADD COLUMN IF NOT EXISTS alone_ms DOUBLE")
    g.con.register("_refined", {"node": node_ids, "ms": ms, "ctx": in_context})
    try:
        g.con.execute("UPDATE costs SET alone_ms = coalesce(costs.alone_ms, costs.ms), ms = r.ms, "
                      "source = CASE WHEN r.ctx THEN 'context' ELSE costs.source END "
                      "FROM _refined r WHERE costs.node = r.node")
    finally:
        g.con.unregister("_refined")


def _extraction_table(g: EGraph, choice: dict[int, int], orig: dict[int, int]) -> None:
    """``extraction``: one row per chosen e-class: its node, op and cost, the node the original graph
    uses for that e-class (NULL if the original does not compute it) and whether they differ."""
    g.con.register("_choice", {"eclass": np.fromiter(choice, dtype=np.int64, count=len(choice)),
                               "node": np.fromiter(choice.values(), dtype=np.int64, count=len(choice))})
    g.con.register("_orig", {"eclass": np.fromiter(orig, dtype=np.int64, count=len(orig)),
                             "node": np.fromiter(orig.values(), dtype=np.int64, count=len(orig))})
    try:
        g.con.execute(
            "CREATE OR REPLACE TABLE extraction AS SELECT c.eclass, c.node, k.op, k.ms AS cost, "
            "o.node AS original_node, o.node IS DISTINCT FROM c.node AS changed "
            "FROM _choice c LEFT JOIN _orig o USING (eclass) LEFT JOIN costs k ON k.node = c.node ORDER BY c.eclass")
    finally:
        g.con.unregister("_choice")
        g.con.unregister("_orig")
