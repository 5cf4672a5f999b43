"""The generated rules on the zoo: ``--rules default`` against ``--rules default --rules generated``.

For every zoo model (full size) and both rule configurations, ``relsat optimize`` runs in its own
process at node limit 50,000 (``--node-limit``), with measured one-node costs (the persistent
cost cache) and ``--candidates 0`` (the ILP's choice under one-node costs, then the latency guard),
so that the two configurations' predicted costs come from the same cost table.  Reported per
model and configuration: e-nodes, stop reason, saturation seconds, rounds, predicted cost of the
extracted graph (ILP objective, ms), and the guard's measured latency of the input and the
extracted model (ONNX Runtime, medians, interleaved).

    python -m relsat.benchmarks.bench_generated [--models bert ...] [--node-limit 50000] [--out DIR]
                                                [--configs default default+generated]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIGS = {"default": ["default"], "default+generated": ["default", "generated"]}


def run(model: str, rules: list[str], node_limit: int, out: Path, timeout: float) -> dict:
    tag = "-".join(rules)
    report = out / f"{model}.{tag}.json"
    cmd = [sys.executable, "-c", "from relsat.driver.app.cli import main; main()", "optimize", f"zoo:{model}", "-o", str(out / f"{model}.{tag}.onnx"),
           "--node-limit", str(node_limit), "--candidates", "0", "--report", str(report)]
    for r in rules:
        cmd += ["--rules", r]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"model": model, "rules": tag, "note": f"killed after {timeout:g} s"}
    if res.returncode != 0:
        return {"model": model, "rules": tag, "note": (res.stderr.strip().splitlines() or ["?"])[-1][:200]}
    r = json.loads(report.read_text())
    lat = r.get("latency") or {}
    return {"model": model, "rules": tag, "enodes": r["enodes"], "stop": r["stop_reason"],
            "rounds": len(r["iterations"]), "saturate_s": round(r["phases_s"].get("saturate", 0.0), 1),
            "predicted_ms": round(r["extraction"]["objective"], 4), "original_ms": lat.get("original_ms"),
            "extracted_ms": lat.get("optimized_ms"), "written": r["written"], "total_s": round(sum(r["phases_s"].values()), 1)}


def main() -> None:
    from relsat.driver.boundary import zoo

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(zoo.NAMES))
    p.add_argument("--node-limit", type=int, default=50_000)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per optimize run")
    p.add_argument("--out", type=Path, default=None, help="folder for models and reports (default: a temp folder)")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), help="rule configurations")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_generated_"))
    out.mkdir(parents=True, exist_ok=True)
    print("| model | rules | e-nodes | stop | rounds | saturation s | predicted ms | input ms | extracted ms | written |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for m in args.models:
        for name in args.configs:
            rules = CONFIGS[name]
            r = run(m, rules, args.node_limit, out, args.timeout)
            rows.append(r)
            cells = [r.get(k, "-") for k in ("enodes", "stop", "rounds", "saturate_s", "predicted_ms", "original_ms",
                                             "extracted_ms", "written")]
            note = f" ({r['note']})" if "note" in r else ""
            print(f"| {m} | {name}{note} | " + " | ".join("-" if c is None else str(c) for c in cells) + " |",
                  flush=True)
    (out / "results.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
