"""Scale benchmark of the e-graph tables: batch insertion and rebuild after random unions.

    python -m relsat.benchmarks.bench_egraph [--nodes 1000000] [--batch 100000] [--unions 100000]

Inserts ``--nodes`` Add e-nodes in batches over random existing e-classes (all of
one shape), then queues ``--unions`` random unions of Add e-classes (or, with
``--on-leaves``, of the input leaves, which makes congruence cascade) and
rebuilds to congruence closure.  Prints times, peak memory (max RSS) and the e-graph size.
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import numpy as np

from relsat.relations.egraph import EGraph


def run(nodes: int, batch: int, unions: int, leaves: int = 1000, seed: int = 0, on_leaves: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    g = EGraph()
    names = np.array([f"x{i}" for i in range(leaves)], dtype=object)
    classes = g.add("Input", attrs={"name": names, "shape": [16], "dtype": 1})
    t0 = time.perf_counter()
    inserted = 0
    while inserted < nodes:
        k = min(batch, nodes - inserted)
        a = classes[rng.integers(0, len(classes), k)]
        b = classes[rng.integers(0, len(classes), k)]
        out = g.add("Add", {"a": a, "b": b})
        classes = np.concatenate([classes, np.unique(out)])
        inserted += k
    insert_s = time.perf_counter() - t0
    adds = g.con.execute("SELECT count(*) FROM op_add").fetchall()[0][0]
    targets = classes[:leaves] if on_leaves else g.con.execute("SELECT out FROM op_add").fetchnumpy()["out"]
    pairs = targets[rng.integers(0, len(targets), (unions, 2))]
    g.union(pairs[:, 0], pairs[:, 1])
    t1 = time.perf_counter()
    report = g.rebuild()
    rebuild_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    g.check_invariants()
    check_s = time.perf_counter() - t2
    counts = g.counts()
    return {
        "add_enodes_inserted": int(adds),
        "insert_s": round(insert_s, 3),
        "unions": unions,
        "rebuild_s": round(rebuild_s, 3),
        "rebuild_passes": report.passes,
        "displaced_ids": report.unions,
        "congruence_pairs": report.congruences,
        "enodes_after": counts["enodes"],
        "eclasses_after": counts["eclasses"],
        "check_invariants_s": round(check_s, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores, Python {platform.python_version()}",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--unions", type=int, default=100_000)
    p.add_argument("--on-leaves", action="store_true",
                   help="union input leaves instead of Add e-classes (congruence cascades upward)")
    args = p.parse_args()
    for k, v in run(args.nodes, args.batch, args.unions, on_leaves=args.on_leaves).items():
        print(f"{k:22s} {v}")


if __name__ == "__main__":
    main()
