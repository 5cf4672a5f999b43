"""The optimize pipeline: import -> saturate -> cost -> extract -> export -> verify -> write.

``optimize(model_or_path, ...)`` is the Python API behind ``relsat optimize``.
It returns an ``OptimizeResult`` with the optimized model, the report (a plain
dict, also written as JSON) and, when asked, the open e-graph.  Nothing is
written unless verification passes; the output file is replaced atomically.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from relsat.extract.analytic import analytic_costs, problem_from
from relsat.extract.extraction import greedy_extract, ilp_extract
from relsat.programs.parser import load_rules
from relsat.relations.egraph import EGraph

from .errors import RelsatError
from .onnx_export import export_model, original_choice, save_model_atomic
from .onnx_import import check_ort_loadable, import_model, load_model
from .runner import Limits, Runner
from .verify import verify

RULES_DIR = Path(__file__).resolve().parent.parent / "programs" / "rules"


def rule_files(names) -> list[Path]:
    """Resolve ``--rules`` values: a shipped set name (programs/rules/NAME.rules) or a file path."""
    out = []
    for name in names:
        path = Path(name)
        if path.suffix == ".rules" or path.exists():
            if not path.exists():
                raise RelsatError(f"{name}: rule file not found")
            out.append(path)
            continue
        shipped = RULES_DIR / f"{name}.rules"
        if not shipped.exists():
            known = ", ".join(sorted(p.stem for p in RULES_DIR.glob("*.rules")))
            raise RelsatError(f"--rules {name}: no such rule set (shipped: {known}) and no such file")
        out.append(shipped)
    return out


def load_rule_list(names) -> list:
    rules = []
    for path in rule_files(names):
        rules += list(load_rules(path).rules)
    return rules


@dataclass
class OptimizeResult:
    model: onnx.ModelProto
    report: dict
    egraph: EGraph | None = None


def optimize(model_or_path, *, rules=("default",), db=None, input_shapes=None, iter_limit=10,
             node_limit=2000, time_limit=60.0, extractor="ilp", ilp_time_limit=30.0, multi_rounds=1,
             output=None, keep_egraph=False, on_round=None) -> OptimizeResult:
    phases: dict[str, float] = {}
    t = time.perf_counter()
    source = str(model_or_path) if not isinstance(model_or_path, onnx.ModelProto) else "<model>"
    if isinstance(model_or_path, onnx.ModelProto):
        model = model_or_path
        check_ort_loadable(model)
    else:
        model = load_model(model_or_path)  # checks that ONNX Runtime can load it too
    if db is not None:
        Path(db).parent.mkdir(parents=True, exist_ok=True)
        if Path(db).exists():
            Path(db).unlink()  # a fresh e-graph per run; the file is the user's to keep afterwards
    g = EGraph(db)
    imported = import_model(model, input_shapes=input_shapes, egraph=g)
    phases["import"] = time.perf_counter() - t

    t = time.perf_counter()
    rule_list = load_rule_list(rules) if rules else []
    runner = Runner(g, rule_list, Limits(iter_limit, node_limit, time_limit, multi_rounds), on_round=on_round)
    sat = runner.run() if rule_list else None
    phases["saturate"] = time.perf_counter() - t

    t = time.perf_counter()
    analytic_costs(g)
    roots = [cid for _, cid in imported.outputs]
    problem, node_ids = problem_from(g, roots)
    phases["cost"] = time.perf_counter() - t

    t = time.perf_counter()
    greedy = greedy_extract(problem)
    best = ilp_extract(problem, time_limit=ilp_time_limit, warm_start=greedy) if extractor == "ilp" else greedy
    choice = {int(c): int(node_ids[i]) for c, i in best.choice.items()}
    orig = original_choice(g, roots)
    cost_of = dict(zip(node_ids.tolist(), problem.node_cost.tolist()))
    original_cost = sum(cost_of.get(n, 0.0) for n in set(orig.values()))
    g.con.register("_choice", {"eclass": np.fromiter(choice, dtype=np.int64, count=len(choice)),
                               "node": np.fromiter(choice.values(), dtype=np.int64, count=len(choice))})
    g.con.execute("CREATE OR REPLACE TABLE extraction AS SELECT eclass, node FROM _choice")
    g.con.unregister("_choice")
    phases["extract"] = time.perf_counter() - t

    t = time.perf_counter()
    optimized = export_model(imported, choice)
    phases["export"] = time.perf_counter() - t

    t = time.perf_counter()
    check = verify(model, optimized, input_shapes=input_shapes)
    phases["verify"] = time.perf_counter() - t
    counts = g.counts()
    report = {
        "input": source,
        "nodes_in": len(model.graph.node),
        "nodes_out": len(optimized.graph.node),
        "rules": len(rule_list),
        "stop_reason": sat.stop_reason.value if sat else "no rules",
        "iterations": [vars(i) for i in sat.iterations] if sat else [],
        "rules_applied": dict(sorted(sat.applied_by_rule.items(), key=lambda kv: -kv[1])) if sat else {},
        "enodes": counts["enodes"],
        "eclasses": counts["eclasses"],
        "cost_model": "analytic",
        "cost_before": original_cost,
        "cost_after": best.cost,
        "extraction": {"method": best.method, "status": best.status, "bound": best.bound, "gap": best.gap,
                       "seconds": best.seconds, "greedy_cost": greedy.cost},
        "verification": {"ok": check.ok, "max_abs_err": check.max_abs_err, "message": check.message},
        "notices": list(imported.notices),
        "phases_s": phases,
    }
    if not check.ok:
        raise RelsatError(f"{source}: verification failed, no model written: {check.message}")
    if output is not None:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        save_model_atomic(optimized, output)
    if not keep_egraph:
        g.close()
    return OptimizeResult(optimized, report, g if keep_egraph else None)
