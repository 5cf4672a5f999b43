"""Saturation scale benchmark with an exact answer: an Add chain over n inputs under ac-add,
relsat beside egglog saturating the same two rules.

    python -m relsat.benchmarks.bench_ac_add [--n 8 9 10 11] [--no-egglog] [--timeout S]
    python -m relsat.benchmarks.bench_ac_add --cli --n 10 11 12 13 [--pin 0] [--db]

Saturating Add(...Add(Add(x0, x1), x2)..., x{n-1}) with exactly commutativity and
associativity gives 2^n - n - 1 Add e-classes and 3^n - 2^(n+1) + 1 Add e-nodes.  Each
(system, n) runs in a fresh process, so its peak memory (max RSS, interpreter and libraries
included; ``base_mib`` is the RSS before saturation) is its own, under a wall-clock cap: a run
that passes it is reported with ``seconds = None``.  ``series()`` returns the rows for other
benchmarks (``benchmarks/compare.py``); ``main`` prints them as a Markdown table.

``--cli`` checks the user's path instead: the chain is written as an ONNX model and optimized by
``relsat optimize --rules ac-add`` with the default scheduler and iteration limit (node and time
limits raised, greedy extraction over analytic costs so that extracting from millions of e-nodes
is not what is timed), and the counts are read from its report (with ``--db``: from the ``enodes`` view of
that file, whose e-graph records explanations as a user's ``--db`` does); egglog runs
beside it for each n unless ``--no-egglog``.  ``--pin CPUS`` runs every process under ``taskset -c CPUS``
(one core, as egglog runs, with ``--pin 0``).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RULES = Path(__file__).resolve().parent.parent / "programs" / "rules" / "ac-add.rules"
NO_NODE_LIMIT = 10**12  # a node limit no run reaches: a rule applies at most (limit - e-nodes) / builds matches in a
# round, and n = 15's add-assoc passes 1e9 / 2 (a capped rule is applied whole, its matches sorted for the cut)


def exact_counts(n: int) -> tuple[int, int]:
    """(Add e-classes, Add e-nodes) of the saturated chain over n inputs."""
    return 2**n - n - 1, 3**n - 2 ** (n + 1) + 1


def _rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def run_relsat(n: int, memory_limit: str | None = None, chunk_rows: int | None = None) -> dict:
    from relsat.driver.search.runner import Limits, Runner
    from relsat.programs.parser import load_rules
    from relsat.relations.egraph import EGraph

    rules = list(load_rules(RULES).rules)
    g = EGraph()
    spill = tempfile.TemporaryDirectory(prefix="relsat-bench-")  # where DuckDB spills past memory_limit
    g.con.execute(f"SET temp_directory = '{spill.name}'")
    if memory_limit:
        g.con.execute(f"SET memory_limit = '{memory_limit}'")
    x = g.add("Input", attrs={"name": np.array([f"x{i}" for i in range(n)], dtype=object), "shape": [4], "dtype": 1})
    acc = x[0]
    for i in range(1, n):
        acc = g.add("Add", {"a": [acc], "b": [x[i]]})[0]
    base = _rss_mib()
    t = time.perf_counter()
    rep = Runner(g, rules, Limits(iterations=200, enodes=NO_NODE_LIMIT, seconds=10**6), scheduler="simple",
                 chunk_rows=chunk_rows).run()
    seconds = time.perf_counter() - t
    classes, nodes = g.sql("SELECT count(DISTINCT out), count(*) FROM op_add")[0]
    g.close()
    spill.cleanup()
    return {
        "system": "relsat", "n": n, "seconds": round(seconds, 2), "peak_mib": _rss_mib(), "base_mib": base,
        "enodes": nodes, "eclasses": classes, "exact": (classes, nodes) == exact_counts(n),
        "rounds": len(rep.iterations), "stop": rep.stop_reason.value,
        "match_s": round(sum(i.match_s for i in rep.iterations), 2),
        "apply_s": round(sum(i.apply_s for i in rep.iterations), 2),
        "rebuild_s": round(sum(i.rebuild_s for i in rep.iterations), 2),
        "temp_mib": max((i.temp_mib for i in rep.iterations), default=0.0), "in_parts": rep.in_parts,
    }


def egglog_program(n: int) -> str:
    """The chain and the two rules in egglog's language (``rewrite`` is one-directional)."""
    lets = "\n".join(f'(let $x{i} (Var "x{i}"))' for i in range(n))
    chain = "$x0"
    for i in range(1, n):
        chain = f"(Add {chain} $x{i})"
    return f"""
(datatype T (Var String) (Add T T))
{lets}
(let $root {chain})
(rewrite (Add a b) (Add b a))
(rewrite (Add a (Add b c)) (Add (Add a b) c))
(relation IsAdd (T))
(ruleset count)
(rule ((= e (Add a b))) ((IsAdd e)) :ruleset count)
"""


def run_egglog(n: int) -> dict:
    import egglog.bindings as eb

    g = eb.EGraph()
    g.run_program(*g.parse_program(egglog_program(n)))
    base = _rss_mib()
    t = time.perf_counter()
    g.run_program(*g.parse_program("(run-schedule (saturate (run)))"))
    seconds = time.perf_counter() - t
    peak = _rss_mib()
    # after the timed part: one pass of a separate ruleset marks every Add e-class once
    out = g.run_program(*g.parse_program("(run count 1) (print-size Add) (print-size IsAdd)"))
    nodes, classes = (int(str(o).strip()) for o in out[-2:])
    return {
        "system": _version("egglog"), "n": n, "seconds": round(seconds, 2),
        "peak_mib": peak, "base_mib": base, "enodes": nodes, "eclasses": classes,
        "exact": (classes, nodes) == exact_counts(n),
    }


def _version(system: str) -> str:
    if system == "egglog":
        from importlib.metadata import version
        return f"egglog {version('egglog')}"
    return system


PIN: list[str] = []  # ``taskset -c CPUS`` before every command (``--pin``)


def run_isolated(system: str, n: int, timeout: float, memory_limit: str | None = None,
                 chunk_rows: int | None = None) -> dict:
    """One run in a fresh interpreter, killed after ``timeout`` seconds (then seconds is None)."""
    cmd = PIN + [sys.executable, "-m", "relsat.benchmarks.bench_ac_add", "--one", system, str(n)]
    if memory_limit:
        cmd += ["--memory-limit", memory_limit]
    if chunk_rows is not None:
        cmd += ["--chunk-rows", str(chunk_rows)]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"system": _version(system), "n": n, "seconds": None, "peak_mib": None, "enodes": None,
                "eclasses": None, "exact": False, "note": f"killed after {timeout:g} s"}
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return {"system": _version(system), "n": n, "seconds": None, "peak_mib": None, "enodes": None,
                "eclasses": None, "exact": False, "note": f"failed: {last[:200]}"}
    return json.loads(res.stdout.strip().splitlines()[-1])


def series(ns, with_egglog: bool = True, timeout: float = 600.0, memory_limit: str | None = "12GB",
           chunk_rows: int | None = None) -> list[dict]:
    """Rows (keys: system, n, seconds, peak_mib, enodes, eclasses, exact; relsat rows also rounds,
    stop, match_s, apply_s, rebuild_s, base_mib, temp_mib, in_parts) for every n, relsat then egglog, each run
    isolated."""
    rows = []
    for n in ns:
        for system in ("relsat", "egglog") if with_egglog else ("relsat",):
            rows.append(run_isolated(system, n, timeout, memory_limit if system == "relsat" else None,
                                     chunk_rows if system == "relsat" else None))
    return rows


def chain_model(n: int):
    """Add(...Add(Add(x0, x1), x2)..., x{n-1}) over float[4] inputs, as an ONNX model."""
    from onnx import TensorProto, helper

    xs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [4]) for i in range(n)]
    nodes, acc = [], "x0"
    for i in range(1, n):
        out = f"s{i}" if i < n - 1 else "y"
        nodes.append(helper.make_node("Add", [acc, f"x{i}"], [out]))
        acc = out
    graph = helper.make_graph(nodes, f"chain{n}", xs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def run_cli(n: int, timeout: float, memory_limit: str | None = None, db: bool = False) -> dict:
    """``relsat optimize chain{n}.onnx --rules ac-add`` with the default scheduler and iteration limit; the
    counts from the report's last round less the n inputs (the chain's e-graph holds Add e-nodes and n Input
    leaves only), or with ``db`` (which records explanations, as ``--db`` does) from the ``enodes`` view of that
    file; the peak RSS from ``/usr/bin/time``."""
    import duckdb
    import onnx

    with tempfile.TemporaryDirectory(prefix="relsat-chain-") as tmp:
        d = Path(tmp)
        onnx.save(chain_model(n), d / "chain.onnx")
        cmd = ["/usr/bin/time", "-f", "%M", "-o", str(d / "rss")] + PIN + [sys.executable, "-c", "from relsat.driver.app.cli import main; main()", "optimize", str(d / "chain.onnx"), "-o", str(d / "out.onnx"), "--rules", "ac-add",
               "--node-limit", str(NO_NODE_LIMIT), "--time-limit", str(10**6), "--extractor", "greedy",
               "--cost-model", "analytic", "--report", str(d / "report.json")] + (
                   ["--db", str(d / "chain.duckdb")] if db else [])
        if memory_limit:
            cmd += ["--memory-limit", memory_limit, "--temp-dir", str(d / "spill")]
        t = time.perf_counter()
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"n": n, "exact": False, "note": f"killed after {timeout:g} s"}
        wall = time.perf_counter() - t
        if res.returncode != 0:
            return {"n": n, "exact": False, "note": (res.stderr.strip().splitlines() or ["no output"])[-1][:200]}
        rep = json.loads((d / "report.json").read_text())
        peak = round(int((d / "rss").read_text().split()[-1]) / 1024, 1)  # the process's max RSS (KiB)
        if db:
            con = duckdb.connect(str(d / "chain.duckdb"), read_only=True)
            nodes, classes = con.execute("SELECT count(*), count(DISTINCT eclass) FROM enodes WHERE op = 'Add'"
                                         ).fetchall()[0]
            con.close()
        else:
            last = rep["iterations"][-1]
            nodes, classes = last["enodes"] - n, last["eclasses"] - n
    return {"n": n, "rounds": len(rep["iterations"]), "stop": rep["stop_reason"], "eclasses": classes,
            "enodes": nodes, "exact": (classes, nodes) == exact_counts(n),
            "saturation_s": round(rep["phases_s"].get("saturate", 0.0), 2), "wall_s": round(wall, 2), "peak_mib": peak,
            "temp_mib": max((it.get("temp_mib", 0.0) for it in rep["iterations"]), default=0.0)}


def _cell(v) -> str:
    return "-" if v is None else str(v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[8, 9, 10, 11])
    p.add_argument("--no-egglog", action="store_true", help="relsat only")
    p.add_argument("--timeout", type=float, default=600.0, help="wall-clock cap per run, seconds")
    p.add_argument("--memory-limit", default="12GB", help="DuckDB memory_limit for the relsat runs")
    p.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    p.add_argument("--cli", action="store_true", help="through `relsat optimize` with default scheduler and rounds")
    p.add_argument("--pin", metavar="CPUS", help="run every process under `taskset -c CPUS`")
    p.add_argument("--db", action="store_true", help="with --cli: keep the e-graph in a --db file (explanations "
                   "recorded, as for a user who keeps it) and count from its enodes view")
    p.add_argument("--chunk-rows", type=int, default=None, help="relsat's most match rows applied at once (0: "
                   "never in parts; default: from --memory-limit)")
    p.add_argument("--one", nargs=2, metavar=("SYSTEM", "N"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.cli and args.chunk_rows is not None:
        p.error("--chunk-rows sets the Runner's budget; `relsat optimize` (--cli) has no such option")
    if args.pin:
        PIN[:] = ["taskset", "-c", args.pin]
    if args.cli:
        print("| n | system | rounds | stop | Add e-classes | Add e-nodes | exact | saturation s | wall s | peak RSS MiB "
              "| peak temp MiB | note |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n in args.n:
            row = run_cli(n, args.timeout, args.memory_limit, args.db)
            print(" | ".join(["", str(n), "relsat optimize" + (" --db" if args.db else "")] + [_cell(row.get(k)) for k in (
                "rounds", "stop", "eclasses", "enodes", "exact", "saturation_s", "wall_s", "peak_mib",
                "temp_mib", "note")]).strip() + " |", flush=True)
            if not args.no_egglog:
                e = run_isolated("egglog", n, args.timeout)
                print(" | ".join(["", str(n), e["system"], "-", "-", _cell(e.get("eclasses")), _cell(e.get("enodes")),
                                  _cell(e.get("exact")), _cell(e.get("seconds")), "-", _cell(e.get("peak_mib")), "-",
                                  _cell(e.get("note"))]).strip() + " |", flush=True)
        return
    if args.one:
        system, n = args.one[0], int(args.one[1])
        row = run_relsat(n, args.memory_limit, args.chunk_rows) if system == "relsat" else run_egglog(n)
        print(json.dumps(row))
        return
    if not args.json:
        print("| system | n | seconds | match | apply | rebuild | rounds | Add e-classes | Add e-nodes | exact "
              "| peak RSS MiB | peak temp MiB | rule runs in parts | note |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.n:
        for row in series([n], not args.no_egglog, args.timeout, args.memory_limit, args.chunk_rows):
            if args.json:
                print(json.dumps(row), flush=True)
                continue
            print(" | ".join(["", row["system"], str(row["n"])] + [_cell(row.get(k)) for k in (
                "seconds", "match_s", "apply_s", "rebuild_s", "rounds", "eclasses", "enodes", "exact", "peak_mib",
                "temp_mib", "in_parts", "note")]).strip() + " |", flush=True)


if __name__ == "__main__":
    main()
