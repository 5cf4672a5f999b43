"""The optimize pipeline: a sequence of timed phases from a model to a verified model.

``optimize(model_or_path, options, **overrides)`` is the Python API behind ``relsat optimize``
(``from relsat import optimize``).  ``options`` is an ``Options`` (``relsat.driver.options``);
keyword overrides change single fields (``optimize(model, node_limit=500)``).  The phases, each
timed into ``Report.phases_s``:

- **prepare** (not timed): every output path checked (``relsat.driver.outputs``), the rule files
  resolved and, for a user's file, verified on random tensors; the cost cache opened;
- **import**: the model loaded and checked, then read into the e-graph (built beside ``db``);
- **saturate**: the rules run by the ``Runner`` under the options' limits;
- **profile**: every e-node's cost, measured per operator signature (through the persistent
  cost cache) or analytic;
- **extract**: greedy and (by default) ILP extraction, and the original graph inside the e-graph;
- **export**: the first usable extraction written as ONNX (ILP, then greedy, then the input model
  itself, with a notice: a valid model never makes ``optimize`` fail);
- **verify**: the written graph against the input, element by element (``relsat.driver.verify``);
- **latency**: the latency guard, which writes the input model unchanged unless the optimized one
  is faster beyond noise.

The result is an ``OptimizeResult`` with the model, the typed ``Report`` (``report.as_dict()`` is
the JSON report; ``report["key"]`` reads it too) and, when asked, the open e-graph.  Nothing is
written unless verification passes; the e-graph is renamed into ``db`` once extraction is done.
"""

from __future__ import annotations

import functools

import time
from collections import Counter
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from relsat import __version__
from relsat.extract.analytic import analytic_costs, problem_from
from relsat.extract.cost_cache import CostCache
from relsat.extract.extraction import greedy_extract, ilp_extract
from relsat.extract.measured import measured_costs
from relsat.extract.original import original_choice
from relsat.extract.profile import ProviderUnavailable, check_call_overhead
from relsat.programs import rulesets
from relsat.programs.ir import RuleError
from relsat.programs.parser import load_rules
from relsat.relations import runtime
from relsat.relations.backend import resolve
from relsat.relations.egraph import EGraph

from . import bindings, feeds, latency, torch_runtime
from .errors import RelsatError, error_line
from .onnx_export import export_model
from .candidates import Search
from .onnx_import import check_ort_loadable, import_model, load_model
from .options import DEFAULTS, Options
from .outputs import EGraphFile, check_outputs, open_cost_cache, protected_paths, save_model_atomic
from .outputs import _same as same_file
from .runner import Limits, Runner
from .verify import VerifyResult, verify


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


@dataclass
class Report(Mapping):
    """What one optimization did (module docstring); ``as_dict()`` is the JSON report, and the report
    reads like that dict too (``report["nodes_out"]``)."""

    producer: str
    input: str
    nodes_in: int
    nodes_out: int
    rules: int
    stop_reason: str
    iterations: list
    rules_applied: dict
    enodes: int
    eclasses: int
    cost_model: str
    cost_label: str  # what the costs are, honestly: "in context", "measured (one node each)", "analytic ..."
    binding: dict  # the input shapes costed and timed at, the second verification binding, symbol -> sizes
    provider: str
    threads: int
    profiled: int
    cached: int
    profile: dict | None
    cost_before: float
    cost_after: float
    extraction: dict
    candidates: list  # the original and every candidate graph: predicted and measured latency, status
    latency: dict | None
    extracted: dict  # the extracted graph, also when the input model was written instead
    written: str  # optimized | original
    verification: dict
    notices: list
    phases_s: dict
    search: dict  # how the e-graph was built: the strategy and, for a search, its budget, counts and best cost
    # the in-context prediction of the original against its fresh timing, the cached profiles found stale and
    # re-taken, and the call overhead's check (relsat.driver.candidates, step 4); None without the in-context search
    fidelity: dict | None = None
    extra: dict = field(default_factory=dict)  # keys callers add (the CLI: output)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(out.pop("extra"))
        return out

    def __getitem__(self, key):
        if key in self.__dataclass_fields__ and key != "extra":
            return getattr(self, key)
        return self.extra[key]

    def __setitem__(self, key, value):
        if key in self.__dataclass_fields__ and key != "extra":
            setattr(self, key, value)
        else:
            self.extra[key] = value

    def __iter__(self):
        return iter([k for k in self.__dataclass_fields__ if k != "extra"] + list(self.extra))

    def __len__(self) -> int:
        return len(self.__dataclass_fields__) - 1 + len(self.extra)


@dataclass
class OptimizeResult:
    model: onnx.ModelProto
    report: Report
    egraph: EGraph | None = None


def optimize(model_or_path, options: Options | None = None, *, db=None, output=None, keep_egraph=False,
             on_round=None, on_status=None, cost_cache=None, **overrides) -> OptimizeResult:
    """Optimize one model (module docstring). ``options``: an ``Options`` (default ``DEFAULTS``),
    ``overrides``: fields of it by keyword; ``db``: keep the e-graph in this DuckDB file; ``output``:
    write the model here; ``cost_cache``: the cache path or a ``CostCache`` (default
    ``$RELSAT_COST_CACHE`` or the user cache); ``on_round(iteration)`` and ``on_status(text)``
    receive progress."""
    try:
        opts = (options or DEFAULTS).replace(**overrides).check()
    except TypeError as e:
        raise RelsatError(str(e)) from None
    return _Pipeline(opts, db=db, output=output, keep_egraph=keep_egraph, on_round=on_round,
                     on_status=on_status, cost_cache=cost_cache).run(model_or_path)


class _Pipeline:
    """One run of ``optimize``: the phases as methods, sharing what they produce as attributes."""

    def __init__(self, opts: Options, *, db, output, keep_egraph, on_round, on_status, cost_cache):
        self.o, self.db, self.output, self.keep_egraph = opts, db, output, keep_egraph
        self.backend = resolve(opts.provider)  # what runs and times the model here (relsat.relations.backend)
        self.on_round, self.status, self.cost_cache = on_round, on_status or (lambda text: None), cost_cache
        self.notices: list[str] = []
        self.phases: dict[str, float] = {}
        self.latency_report: dict | None = None  # set by the guard when it times the models
        self.search: Search | None = None  # the in-context search, when it runs
        self.overhead_check: dict | None = None  # the call overhead against a fresh timing (check_overhead)
        self.fallbacks: list = []

    @contextmanager
    def phase(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - t

    def run(self, model_or_path) -> OptimizeResult:
        self.prepare(model_or_path)
        dbfile = g = None
        complete = False
        try:
            with self.phase("import"):
                self.load(model_or_path)
                dbfile = EGraphFile(self.db) if self.db is not None else None  # no folder made for a bad model
                g = self.g = EGraph(dbfile.path if dbfile else None, memory_limit=self.o.memory_limit,
                                    temp_dir=self.o.temp_dir)
                self.imported = import_model(self.model, input_shapes=self.o.input_shapes,
                                             fix_shapes=self.o.fix_shapes, egraph=g)
                self.roots = [cid for _, cid in self.imported.outputs]  # the output e-classes
                self.bind()
            with self.phase("profile"):
                self.check_overhead()
            with self.phase("saturate"):
                self.saturate()
            with self.phase("profile"):
                self.cost()
            with self.phase("extract"):
                self.extract()
            if self.in_context():
                with self.phase("context"):
                    self.search_candidates()
                complete = True
                with self.phase("choose"):
                    self.choose()
            else:
                with self.phase("export"):
                    self.export()
                complete = True
                with self.phase("verify"):
                    self.verify()
                if self.o.measure and self.written == "optimized":
                    self.guard()
            g.con.execute("INSERT OR REPLACE INTO meta VALUES ('written', ?), ('cost_model', ?), ('provider', ?)",
                          [self.written, self.o.cost_model, self.o.provider])
            report = self.report()
            if self.output is not None:
                Path(self.output).parent.mkdir(parents=True, exist_ok=True)
                save_model_atomic(self.optimized, self.output)
        finally:
            g = self.close(g, dbfile, complete)
        return OptimizeResult(self.optimized, report, g if self.keep_egraph else None)

    # ---------------------------------------------------------------- phases
    def prepare(self, model_or_path) -> None:
        o = self.o
        self.in_memory = isinstance(model_or_path, onnx.ModelProto)
        check_outputs(source=None if self.in_memory else model_or_path, output=self.output, db=self.db,
                      protected=protected_paths(self.cost_cache, o.costs))
        _, self.rules = resolve_rules(o.rules, check=o.check_rules, status=self.status)
        self.cache_only = False
        if not self.backend.here:
            why = self.backend.unavailable()
            if o.cost_model != "measured" or o.costs is None:
                raise RelsatError(why + "; to use CUDA costs measured elsewhere pass --costs FILE")
            self.cache_only = True
            self.notices.append(f"provider {self.backend.name} is not available here: costs come from the --costs "
                                "table only (missing signatures use scaled analytic costs)")
        self.cache = None
        if o.cost_model == "measured":  # a bad --costs file fails before any work
            c = self.cost_cache
            (_, where), *_ = protected_paths(c)
            if not self.in_memory and same_file(where, Path(model_or_path)):
                raise RelsatError(f"cost cache {where}: is the input model; relsat never writes it "
                                  f"(set RELSAT_COST_CACHE to another file)")
            self.cache = c if isinstance(c, CostCache) else open_cost_cache(c)  # refuses a file not a cost cache
            self.notices += self.cache.notices
            if o.costs is not None:
                try:
                    n = self.cache.import_(o.costs)
                except Exception as e:
                    raise RelsatError(f"--costs {o.costs}: cannot read it as a cost table: {error_line(e)}") from None
                self.notices.append(f"imported {n} cost rows from {o.costs} into {self.cache.path}")

    def load(self, model_or_path) -> None:
        self.source = "<model>" if self.in_memory else str(model_or_path)
        if self.in_memory:
            self.model = model_or_path
            check_ort_loadable(self.model)
        else:
            self.model = load_model(model_or_path)  # checks that ONNX Runtime can load it too

    def bind(self) -> None:
        """The sizes the dynamic dims are costed, timed and verified at (``relsat.driver.bindings``), and the
        user's verification input sets."""
        self.binding = bindings.choose(self.model, self.imported)
        self.input_sets = feeds.load_input_sets(self.o.inputs, feeds.graph_inputs(self.model)) if self.o.inputs else []

    def check_overhead(self) -> None:
        """The cached call overhead against a fresh timing of it, replaced when stale, before any cost uses it
        (``relsat.extract.profile.check_call_overhead``); with the in-context search only (it times models)."""
        self.overhead_check = None
        if self.cache is not None and self.in_context():
            self.overhead_check = check_call_overhead(self.backend, self.o.threads, self.cache)

    def saturate(self) -> None:
        """Build the e-graph: equality saturation, or one of the searches (``--search``)."""
        o = self.o
        limits = Limits(o.iter_limit, o.node_limit, o.time_limit, o.multi_rounds)
        self.searched = None
        if not self.rules:
            self.sat = None
        elif o.search == "eqsat":
            self.sat = Runner(self.g, self.rules, limits, scheduler=o.scheduler, on_round=self.on_round).run()
        else:
            step = lambda i, best: self.status(f"{o.search}: step {i}, best cost {best:.4f}")  # noqa: E731
            try:
                if o.search == "mcts":
                    from .mcts import ITERATIONS, mcts
                    self.searched = mcts(self.g, self.rules, self.roots, self.price, limits=limits, seed=o.seed,
                                         scheduler=o.scheduler,
                                         iterations=o.budget or ITERATIONS, extractor=o.extractor, on_step=step)
                else:
                    from .backtrack import BUDGET, backtrack
                    self.searched = backtrack(self.g, self.rules, self.roots, self.price, alpha=o.alpha,
                                              budget=o.budget or BUDGET, seconds=o.time_limit, on_step=step)
            except ProviderUnavailable as e:
                raise RelsatError(f"--provider {self.backend.name}: {e}") from None
            self.sat = self.searched.report

    def price(self, g: EGraph, progress=False):
        """The run's costs for every e-node of ``g``'s current tables: the profile phase's, and what
        the searches compare e-graphs by.  Returns the ``MeasuredReport`` (None for analytic costs)."""
        if self.o.cost_model == "measured":
            return measured_costs(g, self.imported.opset_imports, backend=self.backend, threads=self.o.threads,
                                  cache=self.cache, measure=not self.cache_only, progress=progress)
        analytic_costs(g)
        return None

    def cost(self) -> None:
        o, g = self.o, self.g
        if o.cost_model == "measured":
            self.status("profiling operators ...")
        try:
            self.profile_report = self.price(
                g, progress=lambda done, total: self.status(f"profiling operators: {done}/{total} new signatures"))
        except ProviderUnavailable as e:
            raise RelsatError(f"--provider {self.backend.name}: {e}") from None
        if self.profile_report is not None:
            p = self.profile_report
            self.notices += p.notices
            if p.failed:
                why = "are not in the cost table" if self.cache_only else "could not be timed alone"
                self.notices.append(f"{p.failed} of {p.signatures} operator signatures {why}; "
                                    f"their {p.fallback_nodes} e-nodes use scaled analytic costs")
        self.problem, self.node_ids = problem_from(g, self.roots)

    def extract(self) -> None:
        o = self.o
        self.status("extracting ...")
        self.greedy = greedy_extract(self.problem)
        self.best = (ilp_extract(self.problem, time_limit=o.ilp_time_limit, mip_gap=o.mip_gap, warm_start=self.greedy)
                     if o.extractor == "ilp" else self.greedy)
        self.orig = original_choice(self.g, self.roots)
        cost_of = dict(zip(self.node_ids.tolist(), self.problem.node_cost.tolist()))
        self.original_cost = sum(cost_of.get(n, 0.0) for n in set(self.orig.values()))
        if self._backtracked():  # the e-graph holds only the chosen graph: the input's cost is the search's start
            self.original_cost = self.searched.start_cost

    def _backtracked(self) -> bool:
        return self.searched is not None and self.searched.strategy == "backtrack"

    def in_context(self) -> bool:
        """Whether costs are refined in context and the final choice measured (``relsat.driver.candidates``):
        with measured costs, timing allowed, candidates asked for, and ONNX Runtime able to run the backend."""
        o = self.o
        return (o.cost_model == "measured" and o.measure and o.candidates > 0 and not self.cache_only
                and self.backend.profiles_graphs)  # in-context costs come from ONNX Runtime's profiler

    def search_candidates(self) -> None:
        o = self.o
        self.status("profiling whole graphs in context ...")
        shapes = self.binding.costed
        specs = [(n, shapes[n], runtime.np_dtype(dt)) for n, dt, _ in self.imported.inputs]
        fed = feeds.draw(specs, feeds.input_roles(self.model, shapes), 0)
        self.search = Search(self.imported, self.problem, self.node_ids, fed, self.backend, o.threads, self.cache,
                             o.ilp_time_limit, o.mip_gap)
        self.search.run(self.orig, self.best, rounds=o.context_rounds, candidates=o.candidates,
                        input_nodes=len(self.model.graph.node))
        for c in self.search.candidates:
            if c.model is None:
                self.fallbacks.append({"candidate": c.label, "reason": c.status})
        _store_costs(self.g, self.node_ids, self.search.costs(), np.isfinite(self.search.ctx))

    def choose(self) -> None:
        o, s = self.o, self.search
        picked, check, self.latency_report = s.choose(self.model, bindings=self.binding.all,
                                                      input_sets=self.input_sets,
                                                      threshold=o.guard_threshold, status=self.status)
        fid = s.fidelity
        if fid.get("first_pass") is not None:  # stale profiles were re-taken: the search ran again
            self.fallbacks = [{"candidate": c.label, "reason": c.status} for c in s.candidates if c.model is None]
            _store_costs(self.g, self.node_ids, s.costs(), np.isfinite(s.ctx))
            first = fid["first_pass"]
            self.notices.append(
                f"{len(fid['stale'])} cached whole-graph profile(s) disagreed with the fresh timing beyond the noise "
                f"(the original's prediction was {first.get('original_prediction_ratio') or float('nan'):.2f}x its "
                f"measured latency): re-taken, {fid['retaken']} cost row(s) replaced, and the candidates searched again")
        if fid.get("original_within_tolerance") is False:
            self.notices.append(
                f"the in-context prediction of the original is {fid['original_prediction_ratio']:.2f}x its measured "
                f"latency, beyond the noise ({fid['original_tolerance']:.0%}): the timings moved during this run")
        choice = picked.choice if picked is not None else self.orig
        _extraction_table(self.g, choice, self.orig)
        self.label = picked.label if picked is not None else "original"
        self.written = "optimized" if picked is not None else "original"
        self.optimized = picked.model if picked is not None else self.model
        if not self._backtracked():
            self.original_cost = s.predicted(self.orig) - s.call_overhead_ms
        self.cost_after = s.predicted(choice) - s.call_overhead_ms
        self.check = check or VerifyResult(True, 0.0, 0.0, {}, "the input model is written unchanged")
        fastest = s.fastest()
        shown = picked or fastest  # the extracted graph, also when the input model is written
        self.extracted = _op_counts(shown.model if shown is not None else self.model)
        if fastest is None:
            self.notices.append("no candidate graph differs from the original: the input model is written unchanged")
        elif picked is None and (held := next((c for c in s.candidates if c.confirm is not None), None)):
            self.notices.append(
                f"the {held.label} graph was faster beyond noise in the first timing but not when timed again "
                f"against the input model ({held.status.split('(', 1)[-1].rstrip(')')}, threshold "
                f"{o.guard_threshold:.0%}): the input model is written unchanged")
        elif picked is None:
            self.notices.append(
                f"no candidate graph is faster beyond noise (fastest: {fastest.label}, {fastest.measured_ms:.3f} ms vs "
                f"{s.original.measured_ms:.3f} ms, threshold {o.guard_threshold:.0%}): the input model is written "
                "unchanged")

    def export(self) -> None:
        self.label, self.used, choice, optimized, self.fallbacks = _export_first_usable(
            self.imported, [(self.best.method, self.best), ("greedy", self.greedy)], self.node_ids, self.orig,
            self.notices, len(self.model.graph.node))
        _extraction_table(self.g, choice, self.orig)
        self.written = "optimized" if optimized is not None else "original"
        self.optimized, self.session = optimized if optimized is not None else (self.model, None)
        self.extracted = _op_counts(self.optimized)
        self.cost_after = self.used.cost if self.used is not None else self.original_cost

    def verify(self) -> None:
        if self.written == "optimized":
            self.check = verify(self.model, self.session, bindings=self.binding.all, input_sets=self.input_sets)
            self.session = None
            if self.check.ok and self.backend.whole_graph == "torch":  # and where it will run
                gpu = verify(self.model, torch_runtime.session(self.optimized, "cuda"), bindings=self.binding.all,
                             input_sets=self.input_sets)
                gpu.message = f"on the GPU (PyTorch): {gpu.message}"
                self.check = gpu if not gpu.ok else self.check
                self.notices.append(f"verified under ONNX Runtime on the CPU and {gpu.message}")
        else:
            self.check = VerifyResult(True, 0.0, 0.0, {}, "the input model is written unchanged")
            if not self.fallbacks:
                self.notices.append("the extraction kept the original graph: the input model is written unchanged")
        if not self.check.ok:
            where = f"; the e-graph is in {self.db}" if self.db is not None else ""
            raise RelsatError(f"{self.source}: verification failed, no model written: {self.check.message}{where}")

    def guard(self) -> None:
        o = self.o
        if self.backend.whole_graph is None:
            self.notices.append("latency guard skipped: neither ONNX Runtime's CUDAExecutionProvider nor PyTorch "
                                "with CUDA is here to time whole models")
            return
        with self.phase("latency"):
            self.status("timing the original and the optimized model ...")
            res = latency.guard(self.model, self.optimized, threads=o.threads, backend=self.backend,
                                input_shapes=self.binding.costed, threshold=o.guard_threshold,
                                roles=feeds.input_roles(self.model, self.binding.costed))
            self.latency_report = res.as_dict()
            if not res.keep_optimized:
                self.written, self.optimized = "original", self.model
                a, b = ((res.original.cpu_ms, res.optimized.cpu_ms) if res.metric == "cpu"
                        else (res.original.median_ms, res.optimized.median_ms))
                self.notices.append(f"the optimized model is not faster beyond noise ({b:.3f} ms vs {a:.3f} ms "
                                    f"{'CPU time' if res.metric == 'cpu' else 'wall clock'}, threshold "
                                    f"{res.threshold:.0%}): the input model is written unchanged")

    def cost_label(self) -> str:
        p = self.profile_report
        if self.o.cost_model == "analytic":
            return "analytic"
        if p is not None and p.all_fallback:
            return "analytic (no operator could be timed or found in the cost table)"
        if self.search is not None:
            return "in context"
        return "measured, one node each" + (" (from the cost table)" if self.cache_only else "")

    def report(self) -> Report:
        o, sat, p, best = self.o, self.sat, self.profile_report, self.best
        counts = self.g.counts()
        return Report(
            producer=f"relsat {__version__}", input=self.source, nodes_in=len(self.model.graph.node),
            nodes_out=len(self.optimized.graph.node), rules=len(self.rules),
            stop_reason=(f"{self.searched.strategy}: {self.searched.stop}" if self.searched is not None
                         else sat.stop_reason.value if sat else "no rules"),
            iterations=[vars(i) for i in sat.iterations] if sat else [],
            rules_applied=dict(sorted(sat.applied_by_rule.items(), key=lambda kv: -kv[1])) if sat else {},
            enodes=counts["enodes"], eclasses=counts["eclasses"], cost_model=o.cost_model, provider=o.provider,
            threads=o.threads, profiled=p.measured if p else 0, cached=p.cached if p else 0,
            profile=p.as_dict() if p else None, cost_before=self.original_cost, cost_after=self.cost_after,
            cost_label=self.cost_label(), candidates=self.search.report() if self.search is not None else [],
            binding={"costed": self.binding.costed, "second": self.binding.second, "symbols": self.binding.symbols,
                     "fixed": self.o.fix_shapes},
            extraction={"method": best.method, "status": best.status, "objective": best.cost, "bound": best.bound,
                        "gap": best.gap, "seconds": best.seconds, "greedy_cost": self.greedy.cost,
                        "mip_gap": o.mip_gap, "time_limit": o.ilp_time_limit, "used": self.label,
                        "fallbacks": self.fallbacks},
            latency=self.latency_report, extracted=self.extracted, written=self.written,
            verification={"ok": self.check.ok, "max_abs_err": self.check.max_abs_err, "message": self.check.message,
                          "draws": self.check.draws},
            notices=list(self.imported.notices) + self.notices, phases_s=self.phases,
            search=self.searched.as_dict() if self.searched is not None else {"strategy": "eqsat"},
            fidelity=({**self.search.fidelity, "call_overhead": self.overhead_check}
                      if self.search is not None else None))

    def close(self, g, dbfile, complete: bool):
        """Close the e-graph; move a complete one into ``db`` (reopened there with ``keep_egraph``) or
        drop an incomplete one. Returns the e-graph the caller keeps, if any."""
        if g is None:
            return None
        if dbfile is None:
            if not self.keep_egraph or not complete:
                g.close()
            return g
        tensors = g.tensors
        g.close()
        if not complete:
            dbfile.discard()
            return None
        dbfile.commit()
        if not self.keep_egraph:
            return None
        g = EGraph(dbfile.final)
        g.tensors = tensors
        return g


def _export_first_usable(imported, candidates, node_ids, orig, notices, input_nodes=None):
    """Export the first candidate extraction that ONNX Runtime can load (with its optimizations on),
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
            session = runtime.session(candidate)  # loadable with ONNX Runtime's optimizations on
        except Exception as e:  # never fail a valid model: fall back to the next candidate
            fallbacks.append({"candidate": label, "reason": error_line(e)})
            notices.append(f"the {label} extraction cannot be used: {error_line(e)}")
            continue
        return label, res, choice, (candidate, session), fallbacks
    notices.append("no extracted graph could be used: the input model is written unchanged")
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
