"""The optimize pipeline: import -> saturate -> profile -> extract -> export -> verify -> guard -> write.

``optimize(model_or_path, ...)`` is the Python API behind ``relsat optimize``.
It returns an ``OptimizeResult`` with the optimized model, the report (a plain
dict, also written as JSON) and, when asked, the open e-graph.  Costs are
measured per operator signature (``relsat.extract.measured``, through the
persistent cost cache) or analytic; the final guard (``relsat.driver.latency``)
times the original and the optimized model and writes the original graph,
re-exported, when the optimized one is not faster beyond noise.  Nothing is
written unless verification passes; the output file is replaced atomically.
The saved database holds the ``costs`` and ``extraction`` tables.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from relsat.extract.analytic import analytic_costs, problem_from
from relsat import __version__
from relsat.extract.cost_cache import CostCache
from relsat.extract.extraction import greedy_extract, ilp_extract
from relsat.extract.measured import measured_costs
from relsat.extract.original import original_choice
from relsat.extract.profile import ProviderUnavailable, available_providers
from relsat.programs import rulesets
from relsat.programs.ir import RuleError
from relsat.programs.parser import load_rules
from relsat.relations import runtime
from relsat.relations.egraph import EGraph

from . import latency
from .errors import RelsatError
from .onnx_export import export_model
from .onnx_import import check_ort_loadable, import_model, load_model
from .outputs import EGraphFile, check_outputs, protected_paths, save_model_atomic
from .runner import Limits, Runner
from .verify import VerifyResult, error_line, verify

def resolve_rules(names, *, check: bool, status=lambda text: None) -> tuple[list[Path], list]:
    """``--rules`` values as (files, rules) through ``relsat.programs.rulesets``; ``check``: verify user
    rule files on random tensors first. Rule-file problems become one-line RelsatErrors."""
    try:
        files = rulesets.rule_files(names) if names else []
        if check and not all(rulesets.is_shipped(f) for f in files):
            status("checking the user rules on random tensors ...")
            rulesets.check_rule_files(files)
        return files, [r for f in files for r in load_rules(f).rules]
    except (rulesets.RuleSetError, RuleError, OSError) as e:
        raise RelsatError(error_line(e)) from None


@dataclass
class OptimizeResult:
    model: onnx.ModelProto
    report: dict
    egraph: EGraph | None = None


COST_MODELS = ("measured", "analytic")
PROVIDERS = ("cpu", "cuda")
EXTRACTORS = ("ilp", "greedy")


def _check_options(cost_model, provider, extractor, threads, mip_gap, ilp_time_limit, costs) -> None:
    if cost_model not in COST_MODELS:
        raise RelsatError(f"--cost-model {cost_model}: expected measured or analytic")
    if provider not in PROVIDERS:
        raise RelsatError(f"--provider {provider}: expected cpu or cuda")
    if extractor not in EXTRACTORS:
        raise RelsatError(f"--extractor {extractor}: expected ilp or greedy")
    if not isinstance(threads, int) or threads < 1:
        raise RelsatError(f"--threads {threads}: expected a whole number >= 1")
    if not 0 <= mip_gap < 1:
        raise RelsatError(f"--mip-gap {mip_gap}: expected a relative gap in [0, 1)")
    if not ilp_time_limit > 0:
        raise RelsatError(f"--ilp-time-limit {ilp_time_limit}: expected seconds > 0")
    if costs is not None and not Path(costs).is_file():
        raise RelsatError(f"--costs {costs}: no such cost table file")


def _cuda_here(provider: str) -> bool:
    return provider != "cuda" or "cuda" in available_providers()


def optimize(model_or_path, *, rules=("default",), db=None, input_shapes=None, iter_limit=10,
             node_limit=2000, time_limit=60.0, extractor="ilp", ilp_time_limit=30.0, mip_gap=1e-4,
             multi_rounds=1, output=None, keep_egraph=False, on_round=None, cost_model="measured",
             provider="cpu", threads=1, costs=None, measure=True, cost_cache=None,
             guard_threshold=latency.GUARD_THRESHOLD, on_status=None, check_rules=True) -> OptimizeResult:
    """Optimize one model; see ``relsat optimize --help`` for the knobs. ``costs``: a cost table
    (exported by ``relsat costs export``) imported into the cost cache first; ``cost_cache``: the
    cache path (default ``$RELSAT_COST_CACHE`` or the user cache); ``measure=False`` skips the
    final latency guard, which keeps the optimized graph only when it is faster than the original by
    more than ``guard_threshold`` (relative); ``on_status(text)`` receives progress lines;
    ``check_rules``: verify user rule files on random tensors before using them (``relsat batch``
    checks them once and passes False to its workers).

    Every output path is checked before any work (``relsat.driver.outputs``); the e-graph is built
    beside ``db`` and moved there once extraction is done; the model is written only after it
    verifies. When the extracted graph cannot be exported or loaded, the next candidate is used
    (ILP, then greedy, then the input model), with a notice."""
    _check_options(cost_model, provider, extractor, threads, mip_gap, ilp_time_limit, costs)
    in_memory = isinstance(model_or_path, onnx.ModelProto)
    check_outputs(source=None if in_memory else model_or_path, output=output, db=db,
                  protected=protected_paths(cost_cache, costs))
    status = on_status or (lambda text: None)
    rule_paths, rule_list = resolve_rules(rules, check=check_rules, status=status)
    notices: list[str] = []
    cache_only = False
    if not _cuda_here(provider):
        why = ("--provider cuda: no CUDA here (needs onnxruntime-gpu with a GPU, or PyTorch with CUDA; "
               "onnxruntime has " + ", ".join(ort.get_available_providers()) + ")")
        if cost_model != "measured" or costs is None:
            raise RelsatError(why + "; to use CUDA costs measured elsewhere pass --costs FILE")
        cache_only = True
        notices.append("provider cuda is not available here: costs come from the --costs table only "
                       "(missing signatures use scaled analytic costs)")
    cache = None
    if cost_model == "measured":  # a bad --costs file fails before any work
        cache = cost_cache if isinstance(cost_cache, CostCache) else CostCache(cost_cache)
        notices += cache.notices
        if costs is not None:
            try:
                n = cache.import_(costs)
            except Exception as e:
                raise RelsatError(f"--costs {costs}: cannot read it as a cost table: {error_line(e)}") from None
            notices.append(f"imported {n} cost rows from {costs} into {cache.path}")
    phases: dict[str, float] = {}
    t = time.perf_counter()
    source = "<model>" if in_memory else str(model_or_path)
    if in_memory:
        model = model_or_path
        check_ort_loadable(model)
    else:
        model = load_model(model_or_path)  # checks that ONNX Runtime can load it too
    dbfile = EGraphFile(db) if db is not None else None
    g = EGraph(dbfile.path if dbfile else None)
    complete = False
    try:
        imported = import_model(model, input_shapes=input_shapes, egraph=g)
        phases["import"] = time.perf_counter() - t

        t = time.perf_counter()
        runner = Runner(g, rule_list, Limits(iter_limit, node_limit, time_limit, multi_rounds), on_round=on_round)
        sat = runner.run() if rule_list else None
        phases["saturate"] = time.perf_counter() - t

        t = time.perf_counter()
        profile_report = None
        if cost_model == "measured":
            status("profiling operators ...")
            try:
                profile_report = measured_costs(
                    g, imported.opset_imports, provider=provider, threads=threads, cache=cache,
                    measure=not cache_only,
                    progress=lambda done, total: status(f"profiling operators: {done}/{total} new signatures"))
            except ProviderUnavailable as e:
                raise RelsatError(f"--provider {provider}: {e}") from None
            if profile_report.failed:
                why = "are not in the cost table" if cache_only else "could not be timed alone"
                notices.append(f"{profile_report.failed} of {profile_report.signatures} operator signatures {why}; "
                               f"their {profile_report.fallback_nodes} e-nodes use scaled analytic costs")
        else:
            analytic_costs(g)
        roots = [cid for _, cid in imported.outputs]
        problem, node_ids = problem_from(g, roots)
        phases["profile"] = time.perf_counter() - t

        t = time.perf_counter()
        status("extracting ...")
        greedy = greedy_extract(problem)
        best = (ilp_extract(problem, time_limit=ilp_time_limit, mip_gap=mip_gap, warm_start=greedy)
                if extractor == "ilp" else greedy)
        orig = original_choice(g, roots)
        cost_of = dict(zip(node_ids.tolist(), problem.node_cost.tolist()))
        original_cost = sum(cost_of.get(n, 0.0) for n in set(orig.values()))
        phases["extract"] = time.perf_counter() - t

        t = time.perf_counter()
        label, used, choice, optimized, fallbacks = _export_first_usable(
            imported, [(best.method, best), ("greedy", greedy)], node_ids, orig, notices)
        _extraction_table(g, choice, orig)
        complete = True
        written = "original" if choice == orig else "optimized"
        if optimized is None:
            optimized = model
        extracted = {"nodes": len(optimized.graph.node),
                     "ops": dict(sorted(Counter(n.op_type for n in optimized.graph.node).items()))}
        phases["export"] = time.perf_counter() - t

        t = time.perf_counter()
        if written == "optimized":
            check = verify(model, optimized, input_shapes=input_shapes)
        else:
            check = VerifyResult(True, 0.0, 0.0, {}, "the input model is written unchanged")
            if not fallbacks:
                notices.append("the extraction kept the original graph: the input model is written unchanged")
        phases["verify"] = time.perf_counter() - t
        if not check.ok:
            where = f"; the e-graph is in {db}" if db is not None else ""
            raise RelsatError(f"{source}: verification failed, no model written: {check.message}{where}")

        latency_report = None
        if measure and written == "optimized" and provider == "cuda" \
                and "CUDAExecutionProvider" not in ort.get_available_providers():
            notices.append("latency guard skipped: ONNX Runtime has no CUDAExecutionProvider here to time whole models")
        elif measure and written == "optimized":
            t = time.perf_counter()
            status("timing the original and the optimized model ...")
            res_lat = latency.guard(model, optimized, threads=threads, provider=provider, input_shapes=input_shapes,
                                    threshold=guard_threshold)
            latency_report = res_lat.as_dict()
            if not res_lat.keep_optimized:
                written, optimized = "original", model
                a, b = ((res_lat.original.cpu_ms, res_lat.optimized.cpu_ms) if res_lat.metric == "cpu"
                        else (res_lat.original.median_ms, res_lat.optimized.median_ms))
                notices.append(f"the optimized model is not faster beyond noise ({b:.3f} ms vs {a:.3f} ms "
                               f"{'CPU time' if res_lat.metric == 'cpu' else 'wall clock'}, threshold "
                               f"{res_lat.threshold:.0%}): the input model is written unchanged")
            phases["latency"] = time.perf_counter() - t
        g.con.execute("INSERT OR REPLACE INTO meta VALUES ('written', ?), ('cost_model', ?), ('provider', ?)",
                      [written, cost_model, provider])

        counts = g.counts()
        report = {
            "producer": f"relsat {__version__}",
            "input": source,
            "nodes_in": len(model.graph.node),
            "nodes_out": len(optimized.graph.node),
            "rules": len(rule_list),
            "stop_reason": sat.stop_reason.value if sat else "no rules",
            "iterations": [vars(i) for i in sat.iterations] if sat else [],
            "rules_applied": dict(sorted(sat.applied_by_rule.items(), key=lambda kv: -kv[1])) if sat else {},
            "enodes": counts["enodes"],
            "eclasses": counts["eclasses"],
            "cost_model": cost_model,
            "provider": provider,
            "threads": threads,
            "profiled": profile_report.measured if profile_report else 0,
            "cached": profile_report.cached if profile_report else 0,
            "profile": profile_report.as_dict() if profile_report else None,
            "cost_before": original_cost,
            "cost_after": used.cost if used is not None else original_cost,
            "extraction": {"method": best.method, "status": best.status, "objective": best.cost, "bound": best.bound,
                           "gap": best.gap, "seconds": best.seconds, "greedy_cost": greedy.cost, "mip_gap": mip_gap,
                           "time_limit": ilp_time_limit, "used": label, "fallbacks": fallbacks},
            "latency": latency_report,
            "extracted": extracted,  # the extracted graph, also when the input model was written instead
            "written": written,
            "verification": {"ok": check.ok, "max_abs_err": check.max_abs_err, "message": check.message,
                             "draws": check.draws},
            "notices": list(imported.notices) + notices,
            "phases_s": phases,
        }
        if output is not None:
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            save_model_atomic(optimized, output)
    finally:
        if dbfile is None:
            if not keep_egraph or not complete:
                g.close()
        else:
            tensors = g.tensors
            g.close()
            if complete:
                dbfile.commit()
                if keep_egraph:
                    g = EGraph(dbfile.final)
                    g.tensors = tensors
            else:
                dbfile.discard()
    return OptimizeResult(optimized, report, g if keep_egraph else None)


def _export_first_usable(imported, candidates, node_ids, orig, notices):
    """Export the first candidate extraction that ONNX Runtime can load (with its optimizations on),
    so that a valid model never makes ``optimize`` fail: ``(label, result, choice, model, fallbacks)``,
    with ``model`` None when the choice is the original graph and the label ``original`` (result None)
    when no candidate could be used. Each candidate passed over adds a notice and a fallback entry."""
    fallbacks, seen = [], []
    for label, res in candidates:
        choice = {int(c): int(node_ids[i]) for c, i in res.choice.items()}
        if choice in seen:
            continue
        seen.append(choice)
        if choice == orig:
            return label, res, choice, None, fallbacks
        try:
            candidate = export_model(imported, choice)
            runtime.session(candidate)
        except Exception as e:  # never fail a valid model: fall back to the next candidate
            fallbacks.append({"candidate": label, "reason": error_line(e)})
            notices.append(f"the {label} extraction cannot be used: {error_line(e)}")
            continue
        return label, res, choice, candidate, fallbacks
    notices.append("no extracted graph could be used: the input model is written unchanged")
    return "original", None, orig, None, fallbacks


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
