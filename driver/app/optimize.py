"""The optimize pipeline: timed phases from a model to a verified model, then one decision of what is written.

``optimize(model_or_path, options, **overrides)`` is the Python API behind ``relsat optimize``
(``from relsat import optimize``).  ``options`` is an ``Options`` (``relsat.driver.options``);
keyword overrides change single fields (``optimize(model, node_limit=500)``).

The phases, in the order they run.  Each is a function of ``relsat.driver.app.phases`` that takes the
results it needs and returns its own typed result (named after the arrow); the timed ones are timed
into ``Report.phases_s`` under their name:

1. **prepare** (not timed) -> ``Prepared``: every output path checked (``relsat.driver.boundary.outputs``), the
   rule files resolved and, for a user's file, verified on random tensors; the cost cache opened;
2. **import** -> ``Loaded``, then ``Imported``: the model loaded and checked, then read into the e-graph
   (built beside ``db``), with the sizes its dynamic dims are costed, timed and verified at;
3. **profile** -> ``InputPriced``: the input graph priced before any rule runs (the report's predicted cost
   of the input, the same in every strategy); then the call overhead's check (a dict; with the in-context
   search only): the cached call overhead against a fresh timing, replaced when stale and material to that
   prediction (the input graph then priced again);
4. **saturate** -> ``Saturated``: the rules run by the ``Runner`` under the options' limits (or a
   ``--search``);
5. **profile** -> ``Priced``: every e-node's cost, measured per operator signature (through the
   persistent cost cache) or analytic;
6. **extract** -> ``Extracted``: greedy and (by default) ILP extraction, and the original graph inside
   the e-graph;

then, when the final choice is measured in context (measured costs, ``measure``, ``candidates`` > 0, a
backend whose whole graphs ONNX Runtime profiles here; ``relsat.driver.search.candidates``):

7. **context** -> ``Candidates``: costs refined in whole-graph profiles, and the candidate graphs;
8. **choose** -> ``Chosen``: the input model and the candidates timed, the fastest that verifies
   picked when it beats the input model beyond noise;

or else:

7. **export** -> ``Exported``: the first usable extraction written as ONNX (ILP, then greedy, then the
   input model itself, with a notice: a valid model never makes ``optimize`` fail);
8. **verify** -> ``Verified``: the exported graph against the input, element by element
   (``relsat.driver.boundary.verify``);
9. **latency** -> ``Timed``: the latency guard (with ``measure``, once an optimized model verified; a
   notice instead where nothing here times whole models);

and last, not timed:

10. **decide** -> ``Outcome``: the one step that says what is written (``phases.decide``): the optimized
    model, or the input model unchanged when the extraction kept the original graph or fell back to
    it, no candidate beat it, or the guard found it not faster beyond noise; a failed verification
    writes nothing (a ``RelsatError``);
11. **write**: the ``Report`` built from the results, ``written`` stored in the e-graph's ``meta``
    table, and the model saved to ``output`` (atomically).

The result is an ``OptimizeResult`` with the model, the typed ``Report`` (``report.as_dict()`` is
the JSON report; ``report["key"]`` reads it too) and, when asked, the open e-graph.  Nothing is
written unless verification passes; the e-graph is renamed into ``db`` once extraction is done
(the export, or the in-context search), and dropped when a phase before fails.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import onnx

from relsat.relations.egraph import EGraph

from relsat.driver.app import phases
from relsat.driver.errors import RelsatError
from relsat.driver.options import DEFAULTS, SLOW_GROWTH, Options
from relsat.driver.boundary.latency import Latency, paired_ms
from relsat.driver.boundary.outputs import EGraphFile, save_model_atomic
from relsat.driver.version import __version__


@dataclass
class Report(Mapping):
    """What one optimization did (module docstring); ``as_dict()`` is the JSON report, and the report
    reads like that dict too (``report["nodes_out"]``).

    Example::

        report = optimize("model.onnx", cost_model="analytic", measure=False).report
        report.written, report["nodes_out"], report["verification"]["tolerance"]["rtol"]
        json.dumps(report.as_dict(), default=str)
    """

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
    verification: dict  # VerifyResult.as_report(): ok, errors, message, draws, bindings, tolerance, inputs, worst
    notices: list
    phases_s: dict
    search: dict  # how the e-graph was built: the strategy and, for a search, its budget, counts and best cost
    # the in-context prediction of the original against its fresh timing, the cached profiles found stale and
    # re-taken, and the call overhead's check (relsat.driver.search.candidates, step 4); None without the in-context search
    fidelity: dict | None = None
    # whether the candidate graphs name their values' inferred shapes (value_info), and what that changes in ONNX
    # Runtime's graph (relsat.driver.boundary.shape_notes.decide); None with --no-shape-notes, or where the original
    # choice was not exported (no in-context search)
    shape_notes: dict | None = None
    # what was predicted, kept apart from what was measured: the input and the extracted graph priced by the one
    # cost table of the run (the same figure for the same graph in every run and strategy), and the in-context
    # prediction where the final choice was measured (``_predicted``)
    predicted: dict = field(default_factory=dict)
    measured: dict | None = None  # the input model and the written (or fastest) graph timed: medians, spread
    limits: list = field(default_factory=list)  # every limit that cut the run: which, its value, how much it cut
    verdict: str = ""  # what was written and why, in one line (the summary's "result")
    # derived subgraphs added to the e-graph as alternatives before saturation (driver/app/derive.py): where,
    # how, the ops they became, how they were checked; and the chains found but not derived, with why
    derivations: dict = field(default_factory=dict)
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
    """What ``optimize`` returns: ``model``, the ONNX model written to ``output`` (or that would be: the
    optimized model, or the input model unchanged when nothing beat it); ``report``, the typed ``Report``
    (``report.as_dict()`` is the JSON report of ``--report``); ``egraph``, the open e-graph with
    ``keep_egraph=True`` (else None; the caller closes it).

    Example::

        from relsat import optimize
        result = optimize("model.onnx", cost_model="analytic", measure=False, keep_egraph=True)
        result.report.written                      # "optimized" or "original"
        len(result.model.graph.node), result.report["verification"]["worst"]
        result.egraph.con.execute("SELECT count(*) FROM eclass").fetchone()
        result.egraph.close()
    """

    model: onnx.ModelProto
    report: Report
    egraph: EGraph | None = None


def optimize(model_or_path, options: Options | None = None, *, db=None, output=None, keep_egraph=False,
             on_round=None, on_status=None, on_progress=None, on_phase=None, cost_cache=None,
             **overrides) -> OptimizeResult:
    """Optimize one model (module docstring): ``model_or_path`` is a path or an ``onnx.ModelProto``.
    ``options``: an ``Options`` (default ``DEFAULTS``), ``overrides``: fields of it by keyword; ``db``: keep
    the e-graph in this DuckDB file; ``output``: write the model here; ``keep_egraph``: return the open
    e-graph in the result; ``cost_cache``: the cache path or a ``CostCache`` (default
    ``$RELSAT_COST_CACHE`` or the user cache); ``on_round(iteration)`` and ``on_status(text)`` receive
    progress, ``on_progress(done, total)`` the current phase's steps (saturation rounds, signatures profiled,
    search steps, graphs profiled in context; ``total`` None when unknown) and ``on_phase(name, seconds)``
    each timed phase as it ends.  Returns an ``OptimizeResult``; a model or option it cannot use, or a failed
    verification (nothing written), is a ``RelsatError`` with a one-line message.

    Example::

        from relsat import Options, optimize
        result = optimize("model.onnx", output="fast.onnx", node_limit=5000)   # the CLI's defaults otherwise
        from relsat.driver.boundary import zoo
        result = optimize(zoo.build("squeezenet", small=True), Options(cost_model="analytic", measure=False),
                          on_status=print)
        result.report.written, result.report["nodes_in"], result.report["nodes_out"]
    """
    try:
        opts = (options or DEFAULTS).replace(**overrides).check()
    except TypeError as e:
        raise RelsatError(str(e)) from None
    run = phases.Run(opts, opts.backend, on_status or (lambda text: None), on_round, on_progress)
    return _pipeline(run, model_or_path, db=db, output=output, keep_egraph=keep_egraph, cost_cache=cost_cache,
                     on_phase=on_phase)


class _Timer:
    """Seconds per phase (``Report.phases_s``), summed over the times a phase runs; ``on_phase(name, seconds)``
    hears of each phase as it ends (a phase that fails is not reported)."""

    def __init__(self, on_phase=None):
        self.seconds: dict[str, float] = {}
        self.on_phase = on_phase

    @contextmanager
    def __call__(self, name: str, label: str | None = None):
        """Time a phase ``name``; ``label``: what ``on_phase`` hears it as (default ``name``)."""
        t = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - t
            self.seconds[name] = self.seconds.get(name, 0.0) + took
        if self.on_phase is not None:
            self.on_phase(label or name, took)


def _pipeline(run: phases.Run, model_or_path, *, db, output, keep_egraph, cost_cache, on_phase=None) -> OptimizeResult:
    """The phases in order (module docstring), each result handed to the phases after it."""
    o, timer = run.opts, _Timer(on_phase)
    prepared = phases.prepare(run, model_or_path, output=output, db=db, cost_cache=cost_cache)
    dbfile = g = None
    complete = False
    once = ExitStack()  # the input model serialized once, and one unoptimized session of it (``phases.load``)
    try:
        with timer("import"):
            loaded = phases.load(prepared, model_or_path, once)
            dbfile = EGraphFile(db) if db is not None else None  # (its folders go again if the run fails)
            g = EGraph(dbfile.path if dbfile else None, memory_limit=o.memory_limit, temp_dir=o.temp_dir)
            imported = phases.read(run, loaded, g)
        price = phases.pricer(run, prepared, imported)
        with timer("profile", "profile (the input graph)"):
            input_priced = phases.price_input(run, imported, price)
        with timer("profile", "profile (the call overhead)"):
            overhead = phases.check_overhead(run, prepared, input_priced)
            if overhead is not None and overhead["replaced"] and overhead["cached_ms"] is not None:
                again = phases.price_input(run, imported, price)  # every one-node cost moved with it
                input_priced = replace(again, report=phases.merged(again.report, input_priced.report))
        with timer("derive"):
            derived = phases.derive(run, imported)
        with timer("saturate"):
            # explanations only where the e-graph outlives the run (``--db``, ``keep_egraph``): nothing else reads
            # them, and recording them was 10-33 % of ac-add's saturation (its match rows carry their e-nodes too)
            saturated = phases.saturate(run, prepared, imported, price, explain=db is not None or keep_egraph)
        with timer("profile"):
            priced = phases.profile(run, prepared, imported, price, input_priced.report)
        with timer("extract"):
            extracted = phases.extract(run, imported, saturated, priced)
        search = None
        if phases.in_context(run, prepared):
            with timer("context"):
                candidates = phases.search_candidates(run, prepared, imported, priced, extracted)
            complete, search = True, candidates.search
            with timer("choose"):
                chosen = phases.choose(run, imported, saturated, priced, extracted, candidates)
            outcome = phases.decide(imported, chosen, db=db)
        else:
            with timer("export"):
                exported = phases.export(imported, priced, extracted)
            complete = True
            with timer("verify"):
                verified = phases.verify_export(run, imported, exported)
            exported = replace(exported, session=None)  # its session served verification: freed before timing
            timed = None
            if o.measure and exported.model is not None and verified.ok:
                timed = _time(run, imported, exported.model, timer)
            outcome = phases.decide(imported, exported, verified, timed, db=db)
        report = _report(run, prepared, imported, saturated, priced, extracted, outcome, search=search,
                         overhead=overhead, phases_s=timer.seconds, input_cost=input_priced.cost, derived=derived)
        _write(run, g, outcome, output)
    finally:
        try:
            once.close()  # (it waits for the input model's load check, if that still runs)
        finally:
            g = _close(g, dbfile, complete, keep_egraph)
    return OptimizeResult(outcome.model, report, g if keep_egraph else None)


def _time(run: phases.Run, imported: phases.Imported, optimized: onnx.ModelProto, timer: _Timer) -> phases.Timed:
    """The latency guard, timed as ``latency``; skipped with a notice where nothing here times whole models."""
    if run.backend.whole_graph is None:
        return phases.guard_skipped()
    with timer("latency"):
        return phases.guard(run, imported, optimized)


def _write(run: phases.Run, g: EGraph, outcome: phases.Outcome, output) -> None:
    """What ``decide`` chose: ``written`` (with the cost model and provider) into the e-graph's ``meta`` table,
    and the model to ``output`` (atomically: a reader never sees half a file)."""
    g.con.execute("INSERT OR REPLACE INTO meta VALUES ('written', ?), ('cost_model', ?), ('provider', ?)",
                  [outcome.written, run.opts.cost_model, run.opts.provider])
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        save_model_atomic(outcome.model, output)


def _cost_label(run: phases.Run, prepared: phases.Prepared, priced: phases.Priced, search) -> str:
    p = priced.profile
    if run.opts.cost_model == "analytic":
        return "analytic"
    if p is not None and p.all_fallback:
        return "analytic (no operator could be timed or found in the cost table)"
    if search is not None:
        return "in context"
    return "measured, one node each" + (" (from the cost table)" if prepared.cache_only else "")


def _report(run: phases.Run, prepared: phases.Prepared, imported: phases.Imported, saturated: phases.Saturated,
            priced: phases.Priced, extracted: phases.Extracted, outcome: phases.Outcome, *, search, overhead,
            phases_s: dict, input_cost: float | None = None, derived: phases.Derived | None = None) -> Report:
    """The ``Report`` from the phases' results (``search``: the in-context ``Search``, None without it;
    ``overhead``: the call overhead's check)."""
    o, sat, searched, p, best = run.opts, saturated.sat, saturated.searched, priced.profile, extracted.best
    counts, binding, check = imported.g.counts(), imported.binding, outcome.check
    measured = _measured(outcome)
    return Report(
        producer=f"relsat {__version__}", input=imported.source, nodes_in=len(imported.model.graph.node),
        nodes_out=len(outcome.model.graph.node), rules=len(prepared.rules),
        stop_reason=(f"{searched.strategy}: {searched.stop}" if searched is not None
                     else sat.stop_reason.value if sat else "no rules"),
        iterations=[vars(i) for i in sat.iterations] if sat else [],
        rules_applied=dict(sorted(sat.applied_by_rule.items(), key=lambda kv: -kv[1])) if sat else {},
        enodes=counts["enodes"], eclasses=counts["eclasses"], cost_model=o.cost_model, provider=o.provider,
        threads=o.threads, profiled=p.measured if p else 0, cached=p.cached if p else 0,
        profile=p.as_dict() if p else None,
        cost_before=outcome.cost_before if outcome.cost_before is not None else extracted.original_cost,
        cost_after=outcome.cost_after, cost_label=_cost_label(run, prepared, priced, search),
        candidates=search.report() if search is not None else [],
        binding={"costed": binding.costed, "second": binding.second, "symbols": binding.symbols,
                 "fixed": o.fix_shapes},
        extraction={"method": best.method, "status": best.status, "objective": best.cost, "bound": best.bound,
                    "gap": best.gap, "seconds": best.seconds, "greedy_cost": extracted.greedy.cost,
                    "mip_gap": o.mip_gap, "time_limit": o.ilp_time_limit, "used": outcome.label,
                    "fallbacks": outcome.fallbacks},
        latency=outcome.latency, extracted=outcome.extracted, written=outcome.written,
        verification=check.as_report(),
        notices=(list(imported.graph.notices) + list(derived.notices if derived is not None else ())
                 + list(prepared.notices) + _conflicts(sat) + list(priced.notices) + list(outcome.notices)),
        phases_s=phases_s, search=searched.as_dict() if searched is not None else {"strategy": "eqsat"},
        fidelity={**search.fidelity, "call_overhead": overhead} if search is not None else None,
        shape_notes=search.notes if search is not None else None,
        predicted=_predicted(run, prepared, priced, input_cost, outcome, search),
        measured=measured, limits=_limits(o, sat, searched, best, saturated.node_limit), verdict=_verdict(outcome, measured),
        derivations=derived.as_dict() if derived is not None else {})


def _table_cost(priced: phases.Priced, choice: dict) -> float:
    """A graph's cost under the run's one cost table: its distinct e-nodes' costs summed exactly (``fsum``
    over the sorted costs) and rounded to 1e-9, so that the same graph gives the same figure whichever
    e-graph (strategy) it was found in."""
    cost_of = dict(zip(priced.node_ids.tolist(), priced.problem.node_cost.tolist()))
    return _same(math.fsum(sorted(cost_of.get(n, 0.0) for n in set(choice.values()))))


def _same(x: float | None) -> float | None:
    return None if x is None else round(float(x), 9)


def _predicted(run: phases.Run, prepared: phases.Prepared, priced: phases.Priced, input_cost: float,
               outcome: phases.Outcome, search) -> dict:
    """The predicted costs (``Report.predicted``): ``input`` and ``extracted`` under the one-node cost table
    (``costs`` names it; the input priced before any rule ran), ``written`` (the one of the two written), and
    ``in_context`` (the in-context search's predictions, which move with each run's profiles; None without
    it)."""
    source = _cost_label(run, prepared, priced, None)  # the one-node costs, also where in-context ones came after
    before = _same(input_cost)  # priced before saturation (``phases.price_input``)
    after = _table_cost(priced, outcome.choice) if outcome.choice is not None else before
    return {"costs": source, "unit": "ms", "input": before, "extracted": after,
            "written": after if outcome.written == "optimized" else before,
            "in_context": ({"input": outcome.cost_before,
                            "extracted": (search.predicted(outcome.choice) - search.call_overhead_ms
                                          if outcome.choice is not None else outcome.cost_after),
                            "written": outcome.cost_after} if search is not None else None)}


def _measured(outcome: phases.Outcome) -> dict | None:
    """The measured latencies (``Report.measured``): the input model and the written (or fastest) graph, by the
    figure the decision compared, each with its interval of block medians, the noise and whether the
    difference is beyond it; None when nothing was timed."""
    lat = outcome.latency
    if not lat or "metric" not in lat:
        return None
    cpu = lat["metric"] == "cpu"
    a, b = _paired(lat)
    sp = lat.get("spread") or {}
    return {"metric": "CPU time" if cpu else "wall clock", "input_ms": a, "candidate_ms": b,
            "speedup": a / b if b else None, "input_blocks_ms": sp.get("original_ms"),
            "candidate_blocks_ms": sp.get("optimized_ms"), "noise": sp.get("noise"),
            "block_ratios": sp.get("ratios"), "threshold": lat["threshold"],
            "beyond_noise": lat["kept"] == "optimized" and not lat.get("simplified"), "runs": lat["runs"],
            "apart": sp.get("apart", True), "simplified": lat.get("simplified")}


def _paired(lat: dict) -> tuple[float, float]:
    """The input model's and the candidate's medians by the compared figure over the blocks both ran
    (``latency.paired_ms``): as the guard recorded them, or for a guard an older relsat stored, from its timings
    (or its overall medians, where it kept no timings)."""
    metric = lat["metric"]
    if "paired_ms" in lat:
        return tuple(lat["paired_ms"][metric])
    if isinstance(lat.get("original"), dict) and isinstance(lat.get("optimized"), dict):
        return paired_ms(Latency(**lat["original"]), Latency(**lat["optimized"]), metric)
    if metric == "cpu":
        return lat["original_cpu_ms"], lat["optimized_cpu_ms"]
    return lat["original_ms"], lat["optimized_ms"]


def _verdict(outcome: phases.Outcome, measured: dict | None) -> str:
    """What was written and why, in one line: the optimized model is announced faster only when its timing
    is beyond the spread; else the input model was kept, with the noise it would have had to beat."""
    if outcome.written == "optimized":
        if measured is None:
            return "wrote the optimized model (not timed: the predicted costs decided)"
        if measured.get("simplified"):
            k0, k1 = measured["simplified"]["kernels"]
            return (f"wrote the simplified model: ONNX Runtime runs {k1} kernels instead of {k0} and no more work of "
                    f"any kind; {measured['speedup']:.3f}x the input model's speed ({measured['metric']}), within the "
                    f"noise: not claimed faster")
        return (f"wrote the optimized model: {measured['speedup']:.3f}x the input model's speed "
                f"({measured['metric']}), beyond the noise ({_blocks(measured)})")
    if measured is not None and outcome.choice is not None:
        if measured["apart"] and measured["speedup"] and measured["speedup"] * (1 - measured["threshold"]) > 1:
            return ("kept the input model: the fastest candidate was faster beyond noise "
                    f"({measured['speedup']:.3f}x) but is not written (see the notices)")
        return (f"kept the input model: no candidate faster beyond noise ({_blocks(measured)}; "
                f"the fastest measured {measured['speedup']:.3f}x)")
    if outcome.fallbacks and outcome.choice is None:
        return "kept the input model: no extracted graph could be used"
    return "kept the input model: the extraction kept the original graph"


def _blocks(measured: dict) -> str:
    """What the timing had to beat: the threshold in every interleaved block, and what each block gave."""
    ratios = measured.get("block_ratios")
    if not ratios:
        return f"threshold {measured['threshold']:.0%}"
    return (f"{measured['threshold']:.0%} in each of {len(ratios)} interleaved blocks: "
            f"{phases.block_range(ratios)}")


def _conflicts(sat) -> list[str]:
    """A notice per rule whose matches were left out because its right side's shape or dtype was not its left
    side's (``runner.Report.conflicts``): the rule does not hold for those operands."""
    if sat is None or not getattr(sat, "conflicts", None):
        return []
    return [f"rule {rule}: {n} match(es) left out: its right side's shape or dtype differs from its left side's "
            "(the rule does not hold for those operands)" for rule, n in sorted(sat.conflicts.items())]


def _limits(o, sat, searched, best, node_limit: int | None) -> list[dict]:
    """Every limit that cut the run (``Report.limits``): the limit, its flag and value, what the run reached,
    and what it cut, in words."""
    out = []

    def cut(limit, flag, value, reached, what):
        out.append({"limit": limit, "flag": flag, "value": value, "reached": reached, "cut": what})

    rounds = sat.stop_reason if sat is not None else None
    if searched is None and sat is not None:
        n, enodes = len(sat.iterations), sat.iterations[-1].enodes if sat.iterations else 0
        if rounds.value == "node limit":
            cut("node limit", "--node-limit", node_limit, enodes,
                f"saturation stopped after {n} round(s) at {enodes} e-nodes"
                + (f"; {sat.dropped} match(es) left unapplied" if sat.dropped else ""))
        elif rounds.value == "time limit":
            cut("time limit", "--time-limit", o.time_limit, round(sat.seconds, 2),
                f"saturation stopped after {n} round(s), before saturating")
        elif rounds.value == "iteration limit":
            cut("iteration limit", "--iter-limit", o.iter_limit, n, f"saturation stopped after {n} round(s), "
                "before saturating")
        elif rounds.value == "slow growth":
            cut("slow growth", "--slow-rounds", o.slow_rounds, n, f"saturation stopped after {n} round(s): the last "
                f"{o.slow_rounds} each added under {SLOW_GROWTH:.0%} e-nodes and merged nothing")
    elif searched is not None:
        st, stop = searched.stats, searched.stop
        if searched.strategy == "mcts":
            done, budget = st.get("iterations"), st.get("budget")
            if stop == "time limit":
                cut("time limit", "--time-limit", o.time_limit, round(searched.seconds, 2),
                    f"mcts ran {done} of --budget {budget} iterations")
            elif stop == "budget":
                cut("budget", "--budget", budget, done, f"mcts stopped after {done} iterations, "
                    f"{st.get('candidates')} e-graph(s) reached")
            if rounds is not None and rounds.value == "node limit":
                cut("node limit", "--node-limit", node_limit, None,
                    "the rounds of the chosen path stopped at the node limit")
        else:
            done, budget = st.get("expanded"), st.get("budget")
            if stop == "time limit":
                cut("time limit", "--time-limit", o.time_limit, round(searched.seconds, 2),
                    f"backtracking expanded {done} of --budget {budget} graphs")
            elif stop == "budget":
                cut("budget", "--budget", budget, done, f"backtracking expanded {done} graphs; "
                    f"{st.get('generated', 0) - st.get('materialised', 0) - st.get('pruned', 0)} child graph(s) "
                    "not taken")
    if best is not None and best.method == "ilp" and "time" in str(best.status):
        gap = "" if best.gap is None else f", gap {best.gap:.2%}"
        cut("ILP time limit", "--ilp-time-limit", o.ilp_time_limit, round(best.seconds, 2),
            f"the ILP stopped before proving its choice optimal{gap}")
    return out


def _close(g, dbfile, complete: bool, keep_egraph: bool):
    """Close the e-graph; move a complete one into ``db`` (reopened there with ``keep_egraph``) or
    drop an incomplete one. Returns the e-graph the caller keeps, if any."""
    if g is None:
        if dbfile is not None:  # (the e-graph file did not open)
            dbfile.discard()
        return None
    if dbfile is None:
        if not keep_egraph or not complete:
            g.close()
        return g
    tensors = g.tensors
    g.close()
    if not complete:
        dbfile.discard()
        return None
    dbfile.commit()
    if not keep_egraph:
        return None
    g = EGraph(dbfile.final)
    g.tensors = tensors
    return g
