"""Low-rank kernels restored (issue 28 item 3): EinNet's GCN with each separable pair (a k x 1 Conv then a 1 x k
one, or the other way round) merged into one k x k Conv of the same weights' product, as a graph optimizer that
enlarges and merges kernels would leave it, then ``relsat optimize`` on that model (its low-rank derivation in
``driver/app/derive.py``, no rule for it) and onnxsim on it, each verified against the merged model, then the
three timed under ONNX Runtime level ALL, interleaved, medians (``relsat.driver.boundary.latency.time_models``).
The merged model keeps the second Conv's bias alone (the first one's bias would not survive the merge
exactly at the borders), so it is GCN's structure, not GCN's function.

    python -m relsat.benchmarks.bench_lowrank --threads 1 --out /tmp/relsat_lowrank
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relsat.driver.boundary import latency, zoo
from relsat.driver.boundary.verify import verify


def merged_gcn(small: bool = False) -> tuple[onnx.ModelProto, int]:
    """The zoo's GCN with every k x 1 / 1 x k Conv pair merged into one k x k Conv; and how many pairs."""
    m = zoo.build("gcn", small=small)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    by_out = {n.output[0]: n for n in g.node}
    k_of = {n.output[0]: [a.ints for a in n.attribute if a.name == "kernel_shape"][0] for n in g.node
            if n.op_type == "Conv"}
    drop, merged = set(), 0
    for n in list(g.node):
        first = by_out.get(n.input[0]) if n.op_type == "Conv" else None
        if first is None or first.op_type != "Conv" or readers[first.output[0]] != 1:
            continue
        k1, k2 = list(k_of[first.output[0]]), list(k_of[n.output[0]])
        if sorted([k1, k2]) != sorted([[k1[0] * k1[1], 1], [1, k1[0] * k1[1]]]) or 1 not in k1:
            continue
        w1, w2 = (numpy_helper.to_array(inits[x.input[1]]).astype(np.float64) for x in (first, n))
        if k1[1] == 1:  # rows first: W[m, c, i, j] = sum_r w2[m, r, 0, j] w1[r, c, i, 0]
            w = np.einsum("mrj,rci->mcij", w2[:, :, 0, :], w1[:, :, :, 0])
        else:
            w = np.einsum("mri,rcj->mcij", w2[:, :, :, 0], w1[:, :, 0, :])
        kh, kw = w.shape[2:]
        name = f"{n.output[0]}.merged_w"
        g.initializer.append(numpy_helper.from_array(w.astype(np.float32), name))
        pads = [(kh - 1) // 2, (kw - 1) // 2, kh // 2, kw // 2]
        new = helper.make_node("Conv", [first.input[0], name, *n.input[2:]], [n.output[0]], name=f"{n.name}.merged",
                               kernel_shape=[kh, kw], pads=pads)
        g.node.insert(list(g.node).index(n), new)
        drop.update({id(first), id(n)})
        merged += 1
    kept = [x for x in g.node if id(x) not in drop]
    del g.node[:]
    g.node.extend(kept)
    used = {i for x in g.node for i in x.input}
    kept_inits = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept_inits)
    onnx.checker.check_model(m)
    return m, merged


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--budget", type=float, default=3.0, help="timed seconds per model")
    ap.add_argument("--out", type=Path, default=Path("/tmp/relsat_lowrank"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model, pairs = merged_gcn(args.small)
    src, dst, rep = args.out / "gcn_merged.onnx", args.out / "relsat.onnx", args.out / "report.json"
    onnx.save(model, src)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", "from relsat.driver.app.cli import main; main()", "optimize",
                           str(src), "-o", str(dst), "--report", str(rep), "--threads", str(args.threads), "-q"],
                          capture_output=True, text=True)
    relsat_s = time.perf_counter() - t
    if proc.returncode:
        print(proc.stderr.strip().splitlines()[-1:])
        return 1
    r = json.loads(rep.read_text())
    import onnxsim
    t = time.perf_counter()
    sim, ok = onnxsim.simplify(onnx.load(src))
    sim_s = time.perf_counter() - t
    onnx.save(sim, args.out / "onnxsim.onnx")
    checks = {name: verify(model, str(args.out / f"{name}.onnx")) for name in ("relsat", "onnxsim")}
    lat = latency.time_models([src, dst, args.out / "onnxsim.onnx"], threads=args.threads, budget_s=args.budget)
    o = lat[0].cpu_ms if args.threads == 1 else lat[0].median_ms
    fig = [x.cpu_ms if args.threads == 1 else x.median_ms for x in lat]
    metric = "CPU time of the calling thread" if args.threads == 1 else "wall clock"
    print(f"GCN (zoo, {'small' if args.small else 'full size'}) with {pairs} separable pairs merged into k x k Convs; "
          f"{args.threads} thread(s); {metric}, medians of {lat[0].runs} interleaved runs")
    print("| system | ms | speedup | nodes | verified | time to make (s) |")
    print("|---|---:|---:|---:|---|---:|")
    nodes = [len(model.graph.node), r["nodes_out"], len(sim.graph.node)]
    for (name, make_s, chk), ms, n in zip([("merged (input)", 0.0, None), ("relsat", relsat_s, checks["relsat"]),
                                           ("onnxsim", sim_s, checks["onnxsim"])], fig, nodes):
        v = "-" if chk is None else ("ok" if chk.ok else "FAILED")
        print(f"| {name} | {ms:.2f} | {o / ms:.2f}x | {n} | {v} | {make_s:.1f} |")
    applied = r.get("derivations", {}).get("applied", [])
    print(f"\nrelsat: wrote the {r['written']} model; {len(applied)} derivation(s) applied "
          f"({sum(1 for d in applied if d['kind'] == 'low-rank-conv')} low-rank splits); derive "
          f"{r['phases_s'].get('derive', 0):.1f} s + extract {r['phases_s'].get('extract', 0):.2f} s; "
          f"verdict: {r.get('verdict', '')}")
    for d in applied[:3]:
        print(f"- {d['root']}: {d['detail']}; max abs error {d['max_error']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
