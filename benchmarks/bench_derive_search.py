"""Searched derivations on EinNet's seed models (issue 28): ``relsat optimize --derive-search ROUNDS`` per model.

For each model (the zoo's seed models by default, shapes fixed: the search needs static ones): the search's
roots and rounds (programs written per rule, kept, duplicates, refuted, unchecked, SQL statements per round),
the derived forms imported as alternatives (their ops), whether the extracted graph uses one, what was
written and the guard's measured ratio, and the time of the derive phase and of the whole run.

    python -m relsat.benchmarks.bench_derive_search --rounds 2 --threads 1 [--models dcgan fsrcnn ...] [--small]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

SEEDS = ("dcgan", "infogan", "fsrcnn", "csrnet", "gcn", "resnet18")
DERIVED_OPS = ("Einsum", "Slice", "Pad", "Squeeze")  # ops the searched forms bring that the seed models lack


def run(name: str, rounds: int, threads: int, small: bool) -> dict:
    from relsat.driver.app.optimize import optimize
    from relsat.driver.boundary import zoo

    with tempfile.TemporaryDirectory(prefix="relsat-dsearch-") as tmp:
        t0 = time.perf_counter()
        rep = optimize(zoo.build(name, small=small), output=str(Path(tmp) / "o.onnx"), fix_shapes=True,
                       derive_search=rounds, threads=threads).report
        total = time.perf_counter() - t0
    d = rep.get("derivations", {})
    search = d.get("search") or {}
    applied = [a for a in d.get("applied", []) if a["kind"] == "search"]
    m = rep.get("measured") or {}
    extracted = (rep.get("extracted") or {}).get("ops", {})
    return {
        "model": name, "roots": search.get("roots", 0), "rounds": search.get("rounds", []),
        "search_s": search.get("search_seconds"), "derive_s": (rep.get("phases_s") or {}).get("derive"),
        "alternatives": len(applied), "alternative_ops": sorted({k for a in applied for k in a["ops"]}),
        "extracted_uses": {k: v for k, v in extracted.items() if k in DERIVED_OPS},
        "written": rep.get("written"), "speedup": m.get("speedup"), "block_ratios": m.get("block_ratios"),
        "beyond_noise": m.get("beyond_noise"), "optimize_s": round(total, 1), "verdict": rep.get("verdict"),
    }


def markdown(rows: list[dict]) -> str:
    out = ["| model | roots | per round: kept / duplicate / refuted / unchecked (statements) | alternatives imported "
           "(ops) | extracted graph uses | written | measured (by block) | derive s (search s) | optimize s |",
           "|---|---:|---|---|---|---|---|---:|---:|"]
    for r in rows:
        rounds = "; ".join(f"{x['kept']} / {x['duplicate']} / {x['refuted']} / {x['unchecked']} ({x['statements']})"
                           for x in r["rounds"]) or "-"
        uses = ", ".join(f"{k} x{v}" for k, v in r["extracted_uses"].items()) or "none"
        blocks = "-" if not r["block_ratios"] else "-".join(f"{b:.3f}" for b in (min(r["block_ratios"]),
                                                                               max(r["block_ratios"])))
        speed = "-" if r["speedup"] is None else f"{r['speedup']:.3f}x ({blocks})"
        out.append(f"| {r['model']} | {r['roots']} | {rounds} | {r['alternatives']} ({', '.join(r['alternative_ops'])}) "
                   f"| {uses} | {r['written']} | {speed} | {r['derive_s']:.1f} ({r['search_s'] or 0:.1f}) | "
                   f"{r['optimize_s']} |")
    return "\n".join(out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(SEEDS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--small", action="store_true", help="the zoo's small variants")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON lines too")
    a = ap.parse_args(argv)
    rows = []
    for name in a.models:
        r = run(name, a.rounds, a.threads, a.small)
        rows.append(r)
        if a.json:
            print(json.dumps(r), flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    main()
