"""End-to-end benchmark: ``relsat optimize`` on every zoo model, then latency in fresh processes.

For each model (full size): ``relsat optimize`` with measured costs (the persistent cost cache
is used and filled), the given node limit and time limits, and the final latency guard on, in
its own process; then the original model and the written one are timed with
``python -m relsat.driver.boundary.latency`` (ONNX Runtime, ORT_ENABLE_ALL, fixed intra-op threads,
sequential, warm-up, runs interleaved, median; ``--provider cuda`` without onnxruntime-gpu: the
PyTorch runtime on the GPU, ``relsat.driver.boundary.torch_runtime``) in ``--processes`` fresh processes, alternating
which model goes first; the latency of a model is the median of the processes' medians.

Prints a Markdown table (model, nodes in -> out, original and optimized ms, speedup, guard
decision and the guard's own in-process figures, optimizer time by phase, e-nodes, ILP gap,
predicted cost before/after), the Spearman rank correlation between predicted graph cost
(sum of measured operator costs) and measured latency over all original and written models,
and the geometric-mean speedup. Raw results go to ``OUT/results.json``.

    python -m relsat.benchmarks.bench_e2e --node-limit 2000 --out /tmp/bench_e2e
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from relsat.driver.boundary import zoo


def spearman(x, y) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(a):
        a = np.asarray(a, dtype=float)
        order = np.argsort(a, kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=float)
        for v in np.unique(a):  # ties share their mean rank
            r[a == v] = r[a == v].mean()
        return r
    rx, ry = ranks(x), ranks(y)
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def run_optimize(src: Path, dst: Path, report: Path, args) -> tuple[dict | None, str, float]:
    cmd = [sys.executable, "-c", "from relsat.driver.app.cli import main; main()", "optimize", str(src), "-o", str(dst),
           "--report", str(report), "--node-limit", str(args.node_limit), "--iter-limit", str(args.iter_limit),
           "--time-limit", str(args.time_limit), "--ilp-time-limit", str(args.ilp_time_limit),
           "--threads", str(args.threads), "--cost-model", "measured", "--provider", args.provider]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.model_timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {args.model_timeout} s", time.perf_counter() - t
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        return None, " / ".join(lines[-4:]) if lines else f"exit {proc.returncode}", wall
    return json.loads(report.read_text()), "", wall


def fresh_latency(a: Path, b: Path, args) -> dict:
    """Median over fresh processes of each process's medians for a and b (runs interleaved):
    wall clock and CPU time of the calling thread."""
    per = []
    for k in range(args.processes):
        pair = [a, b] if k % 2 == 0 else [b, a]
        out = subprocess.run([sys.executable, "-m", "relsat.driver.boundary.latency", *map(str, pair),
                              "--threads", str(args.threads), "--budget", str(args.budget),
                              "--provider", args.provider],
                             capture_output=True, text=True, check=True).stdout
        res = {r["model"]: r for r in json.loads(out)}
        per.append([res[str(a)]["median_ms"], res[str(b)]["median_ms"], res[str(a)]["cpu_ms"], res[str(b)]["cpu_ms"]])
    med = np.median(np.asarray(per), axis=0)
    return {"original_ms": float(med[0]), "optimized_ms": float(med[1]), "original_cpu_ms": float(med[2]),
            "optimized_cpu_ms": float(med[3]), "speedup": float(med[0] / med[1]),
            "cpu_speedup": float(med[2] / med[3]), "per_process": per}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(zoo.NAMES))
    ap.add_argument("--node-limit", type=int, default=50_000)
    ap.add_argument("--iter-limit", type=int, default=10)
    ap.add_argument("--time-limit", type=float, default=120.0, help="saturation time limit per model (s)")
    ap.add_argument("--ilp-time-limit", type=float, default=60.0)
    ap.add_argument("--model-timeout", type=float, default=1800.0, help="wall limit of one optimize run (s)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--provider", default="cpu", help="cpu | cuda (cuda without onnxruntime-gpu: the PyTorch "
                    "runtime times whole models, relsat.driver.boundary.torch_runtime)")
    ap.add_argument("--processes", type=int, default=3, help="fresh latency processes per model")
    ap.add_argument("--budget", type=float, default=1.0, help="timed seconds per model per process (fast models)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/relsat_bench_e2e"))
    ap.add_argument("--reuse", action="store_true", help="reuse the optimize results already in OUT (re-time only)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.models:
        src, dst, rep_path = args.out / f"{name}.onnx", args.out / f"{name}.opt.onnx", args.out / f"{name}.json"
        if args.reuse and rep_path.exists() and dst.exists() and src.exists():
            rep, error, wall = json.loads(rep_path.read_text()), "", float("nan")
        else:
            zoo.save(zoo.build(name), src)
            rep, error, wall = run_optimize(src, dst, rep_path, args)
        row = {"model": name, "error": error, "wall_s": wall, "report": rep,
               "original_ops": zoo.op_counts(onnx.load(src, load_external_data=False))}
        if rep is not None:
            load = os.getloadavg()[0]
            row.update(fresh_latency(src, dst, args), load=[load, os.getloadavg()[0]])
        results.append(row)
        done = f"error: {error}" if error else f"speedup {row['speedup']:.3f}, CPU time {row['cpu_speedup']:.3f}"
        print(f"{name}: {done} ({wall:.0f} s)",
              file=sys.stderr, flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(markdown(results, args))


def _fmt(x, digits=2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def markdown(results: list[dict], args) -> str:
    lines = [f"Command: `python -m relsat.benchmarks.bench_e2e --node-limit {args.node_limit} "
             f"--threads {args.threads} --processes {args.processes} --budget {args.budget}`", "",
             "| model | nodes in -> out | original ms | written ms | speedup | CPU ms original -> written "
             "| CPU speedup "
             "| guard: written (its CPU ms, original -> extracted) | extracted graph: op count changes "
             "| import / saturate / profile / extract / context / export / verify / choose / guard s | e-nodes (stop) "
             "| signatures timed / cached | ILP status, gap | predicted ms before -> after "
             "| predicted latency original, written (error) | candidates: predicted when chosen / measured ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    xs, ys, cs, speedups, cpu_speedups, errors = [], [], [], [], [], []
    for r in results:
        rep = r["report"]
        if rep is None:
            lines.append(f"| {r['model']} | failed: {r['error']} |" + " |" * 12)
            continue
        ph = rep["phases_s"]
        phases = " / ".join(_fmt(ph.get(k), 1) for k in
                            ("import", "saturate", "profile", "extract", "context", "export", "verify", "choose",
                             "latency"))
        lat, x = rep["latency"] or {}, rep["extraction"]
        guard = (f"{rep['written']} ({_fmt(lat.get('original_cpu_ms'))} -> {_fmt(lat.get('optimized_cpu_ms'))})"
                 if lat else rep["written"])
        gap = "-" if x["gap"] is None else f"{x['gap']:.2%}"
        written_cost = rep["cost_after"] if rep["written"] == "optimized" else rep["cost_before"]
        lines.append(
            f"| {r['model']} | {rep['nodes_in']} -> {rep['nodes_out']} | {_fmt(r['original_ms'])} | "
            f"{_fmt(r['optimized_ms'])} | {r['speedup']:.3f} | {_fmt(r['original_cpu_ms'])} -> "
            f"{_fmt(r['optimized_cpu_ms'])} | {r['cpu_speedup']:.3f} | {guard} | "
            f"{_changes(r['original_ops'], rep['extracted']['ops'])} | {phases} | "
            f"{rep['enodes']:,} ({rep['stop_reason']}) | {rep['profiled']} / {rep['cached']} | {x['status']}, {gap} | "
            f"{_fmt(rep['cost_before'])} -> {_fmt(rep['cost_after'])} | {_fidelity(r)} | "
            f"{'; '.join(_candidate(c) for c in rep.get('candidates', [])[1:]) or '-'} |")
        pred = predicted_latency(rep)
        if pred is not None:
            errors += [pred[0] / _measured(r, 'original') - 1, pred[1] / _measured(r, 'optimized') - 1]
        xs += [rep["cost_before"], written_cost]
        ys += [r["original_ms"], r["optimized_ms"]]
        cs += [r["original_cpu_ms"], r["optimized_cpu_ms"]]
        speedups.append(r["speedup"])
        cpu_speedups.append(r["cpu_speedup"])
    if speedups:
        loads = [x for r in results if "load" in r for x in r["load"]]
        lines += ["", f"1-minute load average while timing: {min(loads):.1f} to {max(loads):.1f} "
                  f"(on {os.cpu_count()} cores).",
                  f"Geometric-mean speedup, written over original ({len(speedups)} models): "
                  f"{_geomean(speedups):.3f} wall clock, {_geomean(cpu_speedups):.3f} CPU time.",
                  f"Spearman correlation of predicted graph cost (sum of measured operator costs) with measured "
                  f"latency over {len(xs)} models (originals and written): {spearman(xs, ys):.3f} wall clock, "
                  f"{spearman(xs, cs):.3f} CPU time."]
        if errors:
            lines.append(f"Predicted whole-model latency against measured ({args.threads} thread(s), "
                         f"{'CPU time' if args.threads == 1 else 'wall clock'}), originals and written: "
                         f"{sum(abs(e) <= 0.10 for e in errors)} of {len(errors)} within 10 %, largest error "
                         f"{max(errors, key=abs):+.1%}.")
    return "\n".join(lines)


def predicted_latency(rep: dict) -> tuple[float, float] | None:
    """The cost model's whole-model latency of the original and of the written graph: the sum of the
    final e-node costs plus the call overhead (in-context search only)."""
    if not rep.get("candidates"):
        return None
    overhead = (rep.get("profile") or {}).get("call_overhead_ms", 0.0)
    written = rep["cost_after"] if rep["written"] == "optimized" else rep["cost_before"]
    return rep["cost_before"] + overhead, written + overhead


def _measured(r: dict, which: str) -> float:
    """Measured latency by the metric the predictions are in (CPU time with one thread, else wall)."""
    return r[f"{which}_cpu_ms"] if r["report"]["threads"] == 1 else r[f"{which}_ms"]


def _fidelity(r: dict) -> str:
    pred = predicted_latency(r["report"])
    if pred is None:
        return "-"
    a, b = pred[0] / _measured(r, "original") - 1, pred[1] / _measured(r, "optimized") - 1
    return f"{pred[0]:.2f} ({a:+.1%}), {pred[1]:.2f} ({b:+.1%})"


def _candidate(c: dict) -> str:
    return f"{c['label']}: {_fmt(c['predicted_ms'])} / {_fmt(c['measured_ms'])} ({c['status'].split(':')[0]})"


def _changes(before: dict, after: dict) -> str:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))}
    return ", ".join(f"{k} {d:+d}" for k, d in delta.items() if d) or "none"


def _geomean(values) -> float:
    return math.exp(float(np.mean(np.log(values))))


if __name__ == "__main__":
    main()
