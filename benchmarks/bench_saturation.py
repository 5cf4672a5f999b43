"""Saturation time per zoo model with the default rule set (or others), at two node limits.

    python -m relsat.benchmarks.bench_saturation [--models bert ...] [--limits 2000 50000]
                                                 [--iter-limit 10] [--time-limit 120] [--timeout 600]
                                                 [--configs default default+generated]

Each (model, node limit) runs in a fresh process: the full-size zoo model is built
(``relsat.driver.boundary.zoo.build``), imported (``relsat.driver.boundary.onnx_import.import_model``, not
timed) and saturated by a ``Runner`` with the rules of ``load_rule_list(["default"])`` (``--configs``:
each rule configuration in turn, model by model; ``default+generated`` is ``--rules default --rules
generated``) and the CLI's defaults otherwise (backoff scheduler, multi-pattern rules in the first round, cycle
filtering on, no explanations: ``relsat optimize`` records them only for ``--db``).  Reported: seconds, rounds,
e-nodes before and after, stop reason, the time split into match / apply / rebuild, SQL statements (in all and per
round), and the process's peak RSS.  ``rows()`` returns the
results as dicts for other benchmarks.

``--tree-ab PAIRS``: instead, per model, limit and configuration, one process saturates the same imported model
without and with the tree match (``Runner(tree_match=...)``, ``driver/search/treematch.py``) alternately, PAIRS
times each; reported: the seconds of every run, statements per round and rule runs that matched nothing for each
side, and whether every run left the same e-graph (all op tables, ``eclass``, ``uf`` and ``rule_stats`` without
timings, hashed).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

LIMITS = (2_000, 50_000)
CONFIGS = {"default": ("default",), "default+generated": ("default", "generated")}


def run_one(name: str, node_limit: int, iter_limit: int = 10, time_limit: float = 120.0,
            config: str = "default", explain: bool = False) -> dict:
    from relsat.driver.boundary import zoo
    from relsat.driver.boundary.onnx_import import import_model
    from relsat.programs.rulesets import load_rule_list
    from relsat.driver.search.runner import Limits, Runner

    g = import_model(zoo.build(name)).egraph
    before = g.counts()["enodes"]
    rules = load_rule_list(list(CONFIGS[config]))
    t = time.perf_counter()
    rep = Runner(g, rules, Limits(iter_limit, node_limit, time_limit), explain=explain).run()
    seconds = time.perf_counter() - t
    its = rep.iterations
    return {
        "model": name, "rules": config, "node_limit": node_limit, "seconds": round(seconds, 2), "rounds": len(its),
        "enodes_before": before, "enodes": its[-1].enodes if its else before,
        "eclasses": its[-1].eclasses if its else g.counts()["eclasses"], "stop": rep.stop_reason.value,
        "match_s": round(sum(i.match_s for i in its), 2), "apply_s": round(sum(i.apply_s for i in its), 2),
        "rebuild_s": round(sum(i.rebuild_s for i in its), 2), "statements": sum(rep.statements),
        "per_round": "/".join(str(n) for n in rep.statements),
        "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def _fingerprint(g) -> str:
    """The e-graph's fingerprint (``EGraph.fingerprint``) and ``rule_stats`` without its timings, hashed."""
    import hashlib

    stats = g.sql("SELECT round, rule, matches, applied, new_nodes, banned FROM rule_stats ORDER BY ALL")
    return hashlib.sha256((g.fingerprint() + repr(stats)).encode()).hexdigest()


def tree_ab(name: str, node_limit: int, iter_limit: int, time_limit: float, config: str, pairs: int) -> dict:
    """Saturation without and with the tree match, alternated ``pairs`` times in this process (module docstring)."""
    from relsat.driver.boundary import zoo
    from relsat.driver.boundary.onnx_import import import_model
    from relsat.driver.search.runner import Limits, Runner
    from relsat.programs.rulesets import load_rule_list

    model, rules = zoo.build(name), load_rule_list(list(CONFIGS[config]))
    row, prints = {"model": name, "rules": config, "node_limit": node_limit}, set()
    for _ in range(pairs):
        for side, tree in (("without", False), ("with", True)):
            g = import_model(model).egraph
            t = time.perf_counter()
            rep = Runner(g, rules, Limits(iter_limit, node_limit, time_limit), tree_match=tree).run()
            row.setdefault(f"{side}_s", []).append(round(time.perf_counter() - t, 2))
            row[f"{side}_per_round"] = "/".join(str(n) for n in rep.statements)
            row[f"{side}_empty"] = g.sql("SELECT count(*) FROM rule_stats WHERE seconds > 0 AND matches = 0")[0][0]
            prints.add(_fingerprint(g))
            g.close()
    row["same_egraph"] = len(prints) == 1
    return row


def run_isolated(name: str, node_limit: int, iter_limit: int, time_limit: float, timeout: float,
                 config: str = "default", tree_ab: int | None = None) -> dict:
    """``run_one`` (or, with ``tree_ab``, ``tree_ab``) in a fresh process; a failure is a row with a ``note``."""
    cmd = [sys.executable, "-m", "relsat.benchmarks.bench_saturation", "--one", name, str(node_limit),
           "--iter-limit", str(iter_limit), "--time-limit", str(time_limit), "--configs", config]
    if tree_ab:
        cmd += ["--tree-ab", str(tree_ab)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "rules": config, "node_limit": node_limit, "seconds": None,
                "note": f"killed after {timeout:g} s"}
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "rules": config, "node_limit": node_limit, "seconds": None,
                "note": f"failed: {last[:200]}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def rows(models=None, limits=LIMITS, iter_limit: int = 10, time_limit: float = 120.0,
         timeout: float = 600.0) -> list[dict]:
    from relsat.driver.boundary import zoo

    return [run_isolated(m, lim, iter_limit, time_limit, timeout) for m in (models or zoo.NAMES) for lim in limits]


COLUMNS = ("seconds", "match_s", "apply_s", "rebuild_s", "rounds", "enodes_before", "enodes", "eclasses", "stop",
           "statements", "per_round", "peak_mib", "note")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", help="zoo model names (default: all)")
    p.add_argument("--limits", type=int, nargs="+", default=list(LIMITS), help="node limits")
    p.add_argument("--iter-limit", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=120.0, help="saturation time limit, seconds")
    p.add_argument("--timeout", type=float, default=600.0, help="wall-clock cap per run, seconds")
    p.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    p.add_argument("--configs", nargs="+", default=["default"], choices=list(CONFIGS),
                   help="rule configurations, each in turn per model and limit")
    p.add_argument("--tree-ab", type=int, metavar="PAIRS", help="without and with the tree match, alternated")
    p.add_argument("--one", nargs=2, metavar=("MODEL", "LIMIT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one and args.tree_ab:
        print(json.dumps(tree_ab(args.one[0], int(args.one[1]), args.iter_limit, args.time_limit, args.configs[0],
                                 args.tree_ab)))
        return
    if args.one:
        print(json.dumps(run_one(args.one[0], int(args.one[1]), args.iter_limit, args.time_limit, args.configs[0])))
        return
    from relsat.driver.boundary import zoo

    header, cells = (TREE_HEADER, _tree_cells) if args.tree_ab else (HEADER, _cells)
    if not args.json:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
    for m in args.models or zoo.NAMES:
        for lim in args.limits:
            for config in args.configs:
                r = run_isolated(m, lim, args.iter_limit, args.time_limit, args.timeout, config, args.tree_ab)
                if args.json:
                    print(json.dumps(r), flush=True)
                else:
                    print(f"| {m} | {config} | {lim} | " + " | ".join(cells(r)) + " |", flush=True)


HEADER = ("model", "rules", "node limit", "seconds", "match", "apply", "rebuild", "rounds", "e-nodes before", "e-nodes",
          "e-classes", "stop", "SQL statements", "per round", "peak RSS MiB", "note")
TREE_HEADER = ("model", "rules", "node limit", "without s", "with s", "statements per round, without -> with",
               "empty rule runs, without -> with", "same e-graph")


def _cells(r: dict) -> list[str]:
    return ["-" if r.get(k) is None else str(r[k]) for k in COLUMNS]


def _tree_cells(r: dict) -> list[str]:
    if r.get("note"):
        return [r["note"], "", "", "", ""]
    return [" / ".join(map(str, r["without_s"])), " / ".join(map(str, r["with_s"])),
            f"{r['without_per_round']} -> {r['with_per_round']}", f"{r['without_empty']} -> {r['with_empty']}",
            "yes" if r["same_egraph"] else "NO"]


if __name__ == "__main__":
    main()
