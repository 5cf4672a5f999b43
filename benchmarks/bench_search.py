"""The search strategies on the zoo: ``--search eqsat``, ``mcts`` and ``backtrack``, as the seeds compare them.

For every zoo model (full size, saved once as ``DIR/inputs/NAME.onnx``), strategy and node
limit, ``relsat optimize`` runs in its own process with measured one-node costs (the persistent
cost cache), ``--candidates 0`` and ``--no-measure``, so that every strategy's predicted cost (the
ILP objective, ms) comes from the same cost table and the written model is the extracted graph
(verified against the input).  Backtracking does not build an e-graph, so the node limit does not
bound it: it runs once per model and alpha.  One JSON report per run is kept in ``--out``.

``--time`` then times, in a separate pass meant for a quiet machine, every written model that
differs from its input against that input (``python -m relsat.driver.boundary.latency``: ONNX Runtime,
block-interleaved medians, ``--threads``), and stores the medians in the report.  ``--table``
prints the Markdown table from every report there (so runs can be added in pieces):

    python -m relsat.benchmarks.bench_search --out DIR [--models bert ...] [--rules default]
        [--strategies eqsat mcts backtrack-1.0 backtrack-1.05] [--node-limits 2000 50000] [--budget N]
        [--time-limit S]
    python -m relsat.benchmarks.bench_search --out DIR --time [--threads 2]
    python -m relsat.benchmarks.bench_search --out DIR --table
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

STRATEGIES = ("eqsat", "mcts", "backtrack-1.0", "backtrack-1.05")
# TENSAT's speedups on a GPU, as the MCTS paper's appendix reports them (percent)
TENSAT_PUBLISHED = {"bert": 22.35, "inception_v3": 18.34, "nasnet_a": 17.83, "nasrnn": 10.22, "resnext50": 27.11,
                    "squeezenet": 29.74, "vgg19": 12.48}


def _flags(strategy: str) -> list[str]:
    if strategy.startswith("backtrack-"):
        return ["--search", "backtrack", "--alpha", strategy.split("-", 1)[1]]
    return ["--search", strategy]


def _input(model: str, out: Path) -> Path:
    from relsat.driver.boundary import zoo

    path = out / "inputs" / f"{model}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        zoo.save(zoo.build(model), path)
    return path


def run(model: str, strategy: str, node_limit: int | None, rules: list[str], budget: int | None, out: Path,
        timeout: float, time_limit: float | None = None) -> dict:
    tag = f"{model}.{strategy}.{node_limit or 'none'}"
    report = out / f"{tag}.json"
    cmd = [sys.executable, "-c", "from relsat.driver.app.cli import main; main()", "optimize", str(_input(model, out)),
           "-o", str(out / f"{tag}.onnx"), "--candidates", "0", "--no-measure", "--report", str(report),
           *_flags(strategy)]
    if node_limit is not None:
        cmd += ["--node-limit", str(node_limit)]
    if budget is not None:
        cmd += ["--budget", str(budget)]
    if time_limit is not None:
        cmd += ["--time-limit", str(time_limit)]
    for r in rules:
        cmd += ["--rules", r]
    row = {"model": model, "strategy": strategy, "node_limit": node_limit, "rules": rules}
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        row["note"] = f"killed after {timeout:g} s"
    else:
        if res.returncode != 0:
            row["note"] = (res.stderr.strip().splitlines() or ["?"])[-1][:200]
    if "note" in row:
        report.write_text(json.dumps({"bench": row}))
        return row
    r = json.loads(report.read_text())
    r["bench"] = row
    report.write_text(json.dumps(r))
    return row


def time_written(out: Path, threads: int) -> None:
    """Time every written model that differs from its input against that input (module docstring)."""
    for p in sorted(out.glob("*.json")):
        r = json.loads(p.read_text())
        if "note" in r["bench"] or r.get("written") != "optimized" or "timing" in r["bench"]:
            continue
        model = out / f"{p.stem}.onnx"
        cmd = [sys.executable, "-m", "relsat.driver.boundary.latency", str(_input(r["bench"]["model"], out)), str(model),
               "--threads", str(threads)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            r["bench"]["timing"] = {"error": (res.stderr.strip().splitlines() or ["?"])[-1][:200]}
        else:
            a, b = json.loads(res.stdout)
            r["bench"]["timing"] = {"input_ms": a["median_ms"], "extracted_ms": b["median_ms"], "threads": threads}
        p.write_text(json.dumps(r))
        print(p.stem, r["bench"]["timing"], flush=True)


def _row(r: dict) -> dict:
    b = r["bench"]
    if "note" in b:
        return {**b}
    lat = b.get("timing") or {}
    # backtracking's e-graph is the chosen graph only: older reports' cost_before is its cost, not the input's
    search = r.get("search") or {}
    before = search["start_cost"] if search.get("strategy") == "backtrack" else r["cost_before"]
    after = r["extraction"]["objective"]
    phases = r["phases_s"]
    return {**b, "enodes": r["enodes"], "stop": r["stop_reason"], "build_s": phases.get("saturate", 0.0),
            "total_s": sum(phases.values()), "cost_before": before, "predicted": after,
            "predicted_speedup": before / after if after else None, "input_ms": lat.get("input_ms"),
            "extracted_ms": lat.get("extracted_ms"), "written": r["written"], "verified": r["verification"]["ok"],
            "search": r.get("search", {})}


def table(out: Path) -> str:
    rows = [_row(json.loads(p.read_text())) for p in sorted(out.glob("*.json")) if p.name != "results.json"]
    order = {s: i for i, s in enumerate(STRATEGIES)}
    rows.sort(key=lambda x: (x["model"], x["node_limit"] or 10**9, order.get(x["strategy"], 9)))
    lines = ["| model | node limit | strategy | e-nodes | stop | build s | total s | predicted ms | predicted speedup "
             "| input ms | extracted ms | measured speedup | graph | verified |",
             "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    f = lambda v, d=2: "-" if v is None else f"{v:,.{d}f}" if isinstance(v, float) else f"{v:,}"  # noqa: E731
    for x in rows:
        if "note" in x:
            lines.append(f"| {x['model']} | {x['node_limit'] or '-'} | {x['strategy']} | {x['note']} |")
            continue
        measured = (x["input_ms"] / x["extracted_ms"]) if x["input_ms"] and x["extracted_ms"] else None
        lines.append(
            f"| {x['model']} | {f(x['node_limit']) if x['node_limit'] else '-'} | {x['strategy']} | {f(x['enodes'])} "
            f"| {x['stop']} | {f(x['build_s'], 1)} | {f(x['total_s'], 1)} | {f(x['predicted'], 4)} "
            f"| {f(x['predicted_speedup'], 4)} | {f(x['input_ms'])} | {f(x['extracted_ms'])} | {f(measured, 3)} "
            f"| {'changed' if x['written'] == 'optimized' else 'input'} | {x['verified']} |")
    return "\n".join(lines)


def seeds_table(out: Path) -> str:
    """Predicted speedup in percent per model and strategy, beside TENSAT's published GPU figures."""
    rows = [_row(json.loads(p.read_text())) for p in sorted(out.glob("*.json")) if p.name != "results.json"]
    cols = [("eqsat", 2000), ("mcts", 2000), ("eqsat", 50_000), ("mcts", 50_000), ("backtrack-1.0", None),
            ("backtrack-1.05", None)]
    cell = {(x["model"], x["strategy"], x["node_limit"]): x for x in rows}
    head = ["model", "TENSAT, GPU (published)"] + [f"{s} {n:,}" if n else s for s, n in cols]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for m in sorted({x["model"] for x in rows}):
        vals = []
        for s, n in cols:
            x = cell.get((m, s, n))
            ok = x is not None and "note" not in x and x.get("predicted_speedup")
            vals.append(f"{(x['predicted_speedup'] - 1) * 100:.2f} %" if ok else "-" if x is None else "failed")
        pub = TENSAT_PUBLISHED.get(m)
        lines.append(f"| {m} | {f'{pub:.2f} %' if pub is not None else '-'} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def main() -> None:
    from relsat.driver.boundary import zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for models and reports")
    p.add_argument("--models", nargs="+", default=list(zoo.NAMES))
    p.add_argument("--rules", nargs="+", default=["default"])
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    p.add_argument("--node-limits", nargs="+", type=int, default=[2000, 50_000])
    p.add_argument("--budget", type=int, default=None, help="--budget for mcts and backtrack (their defaults if absent)")
    p.add_argument("--time-limit", type=float, default=None, help="--time-limit for every run (its default if absent)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per optimize run")
    p.add_argument("--time", action="store_true", help="only time the written models that differ from their input")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime threads for --time")
    p.add_argument("--table", action="store_true", help="only print the tables of the reports in --out")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.time:
        time_written(args.out, args.threads)
    elif not args.table:
        for m in args.models:
            for s in args.strategies:
                for limit in ([None] if s.startswith("backtrack") else args.node_limits):
                    row = run(m, s, limit, args.rules, args.budget, args.out, args.timeout, args.time_limit)
                    print(json.dumps(row), flush=True)
    print(table(args.out))
    print()
    print(seeds_table(args.out))


if __name__ == "__main__":
    main()
