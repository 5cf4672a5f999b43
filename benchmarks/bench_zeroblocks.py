"""Zero-block weights split (issue 28 item 3): a zoo model (ResNeXt-50 by default) with every grouped Conv exported
dense (its group-g weight [O, I/g, k, k] expanded to the block-diagonal [O, I, k, k] it computes, group 1), as a
tool that merges or re-exports convolutions without groups leaves it, then ``relsat optimize`` on that model (its
zero-block derivation in ``driver/app/derive_blocks.py``, no rule for it) and onnxsim on it, each verified against
the dense model, then the three timed under ONNX Runtime level ALL, interleaved, medians
(``relsat.driver.boundary.latency.time_models``; CPU time of the calling thread at one thread).

    python -m relsat.benchmarks.bench_zeroblocks --threads 1 --out /tmp/relsat_zeroblocks

``--matmul`` times instead a block-diagonal MatMul ([rows, K] x [K, N], g blocks) as stored, in the batched form
and in the split form (``derive_blocks._matmul``), the choice the derivation makes by timing:

    python -m relsat.benchmarks.bench_zeroblocks --matmul --threads 1
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
from onnx import numpy_helper

from relsat.driver.boundary import latency, zoo
from relsat.driver.boundary.verify import verify


def dense_grouped(name: str = "resnext50", small: bool = False) -> tuple[onnx.ModelProto, int]:
    """The zoo model ``name`` with every grouped Conv's weight expanded to the dense block-diagonal one (group 1);
    and how many convolutions were expanded."""
    m = zoo.build(name, small=small)
    inits = {t.name: t for t in m.graph.initializer}
    expanded = 0
    for n in m.graph.node:
        group = [a for a in n.attribute if a.name == "group"]
        if n.op_type != "Conv" or not group or group[0].i == 1:
            continue
        g = group[0].i
        w = numpy_helper.to_array(inits[n.input[1]])
        o, ig = w.shape[:2]
        dense = np.zeros((o, ig * g, *w.shape[2:]), w.dtype)
        for b in range(g):
            dense[b * o // g:(b + 1) * o // g, b * ig:(b + 1) * ig] = w[b * o // g:(b + 1) * o // g]
        inits[n.input[1]].CopyFrom(numpy_helper.from_array(dense, n.input[1]))
        group[0].i = 1
        expanded += 1
    onnx.checker.check_model(m)
    return m, expanded


def matmul_forms(threads: int, budget: float, rows: int = 128, k: int = 1024, n: int = 1024) -> None:
    """Dense vs batched vs split block-diagonal MatMul under ONNX Runtime, for a few block counts."""
    from onnx import TensorProto, helper

    from relsat.driver.app import derive as dv
    from relsat.driver.app import derive_blocks as db

    print(f"block-diagonal MatMul [{rows}, {k}] x [{k}, {n}]; {threads} thread(s); ms (medians, interleaved)")
    print("| blocks | dense | batched | split | faster form |  (medians; block medians' range)")
    print("|---:|---:|---:|---:|---|")
    rng = np.random.default_rng(0)
    for g in (2, 4, 8, 16):
        w = np.zeros((k, n), np.float32)
        for b in range(g):
            w[b * k // g:(b + 1) * k // g, b * n // g:(b + 1) * n // g] = rng.standard_normal((k // g, n // g))
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "m",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
                                  [numpy_helper.from_array(w, "w")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
        (c,) = db.find_blocks(model)
        values = dv.model_values(model, [*c.inputs, *c.consts], {}, threads)
        form = db.block_form(c, values)
        ins = {"x": values["x"]}
        models = [model] + [dv._subgraph(*db._matmul(c, values, form, batched), ins, "y") for batched in (True, False)]
        lat = latency.time_models(models, threads=threads, budget_s=budget)
        ms = [x.cpu_ms if threads == 1 else x.median_ms for x in lat]
        cell = [f"{m:.3f} ({_spread(x, threads, 3)})" for m, x in zip(ms, lat)]
        print(f"| {g} | {cell[0]} | {cell[1]} | {cell[2]} | {'batched' if ms[1] < ms[2] else 'split'} |")


def _spread(x, threads: int, digits: int = 2) -> str:
    """The range of the block medians (the spread a difference must exceed)."""
    b = x.blocks("cpu" if threads == 1 else "wall")
    return f"{min(b):.{digits}f}-{max(b):.{digits}f}" if b else "-"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnext50")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--budget", type=float, default=3.0, help="timed seconds per model")
    ap.add_argument("--out", type=Path, default=Path("/tmp/relsat_zeroblocks"))
    ap.add_argument("--matmul", action="store_true", help="time the two MatMul forms instead")
    args = ap.parse_args(argv)
    if args.matmul:
        matmul_forms(args.threads, args.budget)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    model, expanded = dense_grouped(args.model, args.small)
    grouped = args.out / "grouped.onnx"  # the zoo model as built, for reference
    onnx.save(zoo.build(args.model, small=args.small), grouped)
    src, dst, rep = args.out / "dense.onnx", args.out / "relsat.onnx", args.out / "report.json"
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
    sim, _ = onnxsim.simplify(onnx.load(src))
    sim_s = time.perf_counter() - t
    onnx.save(sim, args.out / "onnxsim.onnx")
    checks = {name: verify(model, str(args.out / f"{name}.onnx")) for name in ("relsat", "onnxsim")}
    lat = latency.time_models([src, dst, args.out / "onnxsim.onnx", grouped], threads=args.threads,
                              budget_s=args.budget)
    fig = [x.cpu_ms if args.threads == 1 else x.median_ms for x in lat]
    metric = "CPU time of the calling thread" if args.threads == 1 else "wall clock"
    print(f"{args.model} (zoo, {'small' if args.small else 'full size'}) with {expanded} grouped Convs exported "
          f"dense; {args.threads} thread(s); {metric}, medians of {lat[0].runs} interleaved runs")
    print("| system | ms | block medians | speedup | nodes | verified | time to make (s) |")
    print("|---|---:|---|---:|---:|---|---:|")
    nodes = [len(model.graph.node), r["nodes_out"], len(sim.graph.node), len(model.graph.node)]
    rows = [("dense (input)", 0.0, None), ("relsat", relsat_s, checks["relsat"]),
            ("onnxsim", sim_s, checks["onnxsim"]), ("grouped as built (reference)", 0.0, None)]
    for (name, make_s, chk), ms, n, x in zip(rows, fig, nodes, lat):
        v = "-" if chk is None else ("ok" if chk.ok else "FAILED")
        print(f"| {name} | {ms:.2f} | {_spread(x, args.threads)} | {fig[0] / ms:.2f}x | {n} | {v} | {make_s:.1f} |")
    applied = r.get("derivations", {}).get("applied", [])
    print(f"\nrelsat: wrote the {r['written']} model; {len(applied)} derivation(s) applied "
          f"({sum(1 for d in applied if d['kind'] == 'zero-blocks')} zero-block splits); derive "
          f"{r['phases_s'].get('derive', 0):.1f} s + extract {r['phases_s'].get('extract', 0):.2f} s; "
          f"verdict: {r.get('verdict', '')}")
    for d in applied[:3]:
        print(f"- {d['root']}: {d['detail']}; max abs error {d['max_error']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
