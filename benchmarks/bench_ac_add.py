"""Saturation scale benchmark with an exact answer: an Add chain over n inputs under ac-add.

    python -m relsat.benchmarks.bench_ac_add [--n 8 9 10 11]

Saturating Add(...Add(Add(x0, x1), x2)..., x{n-1}) with exactly commutativity and
associativity gives 2^n - n - 1 Add e-classes and 3^n - 2^(n+1) + 1 Add e-nodes.
Each n runs in a fresh process so the peak memory (max RSS) is that run's own.
Prints time split into match / apply / rebuild and checks the exact counts.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def run_one(n: int) -> dict:
    from relsat.driver.runner import Limits, Runner
    from relsat.programs.parser import load_rules
    from relsat.relations.egraph import EGraph

    rules = list(load_rules(Path(__file__).resolve().parent.parent / "programs" / "rules" / "ac-add.rules").rules)
    g = EGraph()
    x = g.add("Input", attrs={"name": np.array([f"x{i}" for i in range(n)], dtype=object), "shape": [4], "dtype": 1})
    acc = x[0]
    for i in range(1, n):
        acc = g.add("Add", {"a": [acc], "b": [x[i]]})[0]
    t = time.perf_counter()
    rep = Runner(g, rules, Limits(iterations=200, enodes=10**8, seconds=3600), scheduler="simple").run()
    seconds = time.perf_counter() - t
    classes, nodes = g.sql("SELECT count(DISTINCT out), count(*) FROM op_add")[0]
    return {
        "n": n, "seconds": round(seconds, 2), "rounds": len(rep.iterations),
        "match_s": round(sum(i.match_s for i in rep.iterations), 2),
        "apply_s": round(sum(i.apply_s for i in rep.iterations), 2),
        "rebuild_s": round(sum(i.rebuild_s for i in rep.iterations), 2),
        "add_eclasses": classes, "add_enodes": nodes,
        "exact": classes == 2**n - n - 1 and nodes == 3**n - 2 ** (n + 1) + 1,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[8, 9, 10, 11])
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one)))
        return
    print("| n | seconds | match | apply | rebuild | rounds | Add e-classes | Add e-nodes | exact | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in args.n:
        res = subprocess.run([sys.executable, "-m", "relsat.benchmarks.bench_ac_add", "--one", str(n)],
                             capture_output=True, text=True, check=True)
        r = json.loads(res.stdout)
        print(f"| {r['n']} | {r['seconds']} | {r['match_s']} | {r['apply_s']} | {r['rebuild_s']} | {r['rounds']} | "
              f"{r['add_eclasses']} | {r['add_enodes']} | {r['exact']} | {r['peak_rss_mib']} |", flush=True)


if __name__ == "__main__":
    main()
