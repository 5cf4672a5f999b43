"""relsat on the real-model corpus (``relsat.benchmarks.corpus``), as a user runs it: default options, no
``--input-shape``; every model keeps its dynamic dims.

    python -m relsat.benchmarks.bench_corpus [--models NAME ...] [--threads 1 2] [--budget 2]
        [--out results.jsonl] [--peers NAME ... | --no-peers] [--optimized-at N] [--reexport] [--table]

For each model:

- ``optimize(path)`` with the default options (measured costs in context, the measured final
  choice, verification at two bindings of the dynamic dims); import and total seconds, e-graph
  size, opaque e-nodes (operators outside the catalog, or whose shape relsat cannot prove over
  dynamic dims), the verification error, the bindings, and the in-context prediction of the input model
  over its measured latency (``prediction``; the table lists those off by more than ``FIDELITY``);
- **dims kept**: the written model's graph inputs and outputs declare the same dynamic dims as the
  original's, and it runs in ONNX Runtime at a third binding, neither costed nor verified at
  (batch 2, other dims the first of 96, 160, 48, 200 at which the original runs), with every
  output equal to the original's there (the same element-wise check as verification);
- **peers** (``PEERS``, made by ``relsat.benchmarks.compare.run_system``, which owns them): onnxsim
  (``onnxsim.simplify``, defaults, dynamic dims kept), onnxslim (``onnxslim.slim``, defaults),
  onnxoptimizer (its default fuse-and-eliminate passes, then onnxsim's constant folding), for the
  transformer models ONNX Runtime's transformers optimizer (``optimize_model``, the model type, heads
  and hidden size given per model in ``ORT_TYPES``, default options otherwise), and relsat run on
  onnxsim's model (default options: relsat is never worse than a peer output it could have reached).
  Each is verified against the original element by element at relsat's two bindings and must keep
  every dynamic dim; one that fails gets an 'x' and its one-line reason, and is not timed;
- **latency** at the costed binding, at 1 thread and at all cores, of the original, relsat's model
  and the verified peers, all timed together (``relsat.driver.boundary.latency.time_models``: fresh sessions,
  blocks of back-to-back runs interleaved, medians), level ALL; the table gives each one's speedup
  over the original, relsat / the best peer (relsat-on-onnxsim is not a peer there), and the
  geometric mean of both per group of models (``corpus.Entry.group``) and over all. Where relsat wrote
  the input model unchanged (the same bytes), its latency is the original's, marked "input": the same
  model is not timed twice (the ratio of two timings of one file is the spread alone: YOLOv8n's input
  model, timed again as relsat's, ran 0.961x of itself in one run);
- **ONNX Runtime's ops** for every written model (relsat's, and relsat-on-onnxsim's against
  onnxsim's model): the op histogram of the graph ONNX Runtime actually runs, before and after
  (``relsat.benchmarks.ort_ops``, level ALL at the first timed thread count), so that the table shows
  which fusion the rewrite enabled;
- **the same kernels**: the peers whose graph, as ONNX Runtime runs it (the same histogram), has the
  op counts of relsat's written model's (``same_kernels``); where the best peer is one of them, the
  latency table says so beside relsat / best peer: the two run the same kernels, and their difference is
  the spread of timing one graph twice.

``--optimized-at N``: relsat (and relsat on onnxsim's model) optimizes with ``--threads N``, as a user who
deploys at N threads runs it, instead of its default (all cores); the row records ``optimized_at``. By default a
model chosen at all cores is also timed at 1 thread, where a graph 6 % faster at 2 threads can be 1 % slower
(Whisper-tiny, fortieth session).

``--reexport`` instead writes the extracted graph whatever its speed (analytic costs, no timing), so
that a model with relsat's rewrites in it goes through verification at two bindings and the dims
check even where the default run writes the input model unchanged.

One JSON line per model is appended to ``--out`` as soon as it is done (a long run that stops
keeps what it measured); ``--table`` prints the Markdown table of a results file.
"""

from __future__ import annotations

import argparse
import filecmp
import functools
import json
import math
import tempfile
import time
from pathlib import Path

import onnx

from relsat.benchmarks import compare, corpus, ort_ops
from relsat.benchmarks.compare import declared_dims, dims_kept
from relsat.driver.boundary import feeds
from relsat.driver.boundary.latency import time_models
from relsat.driver.app.optimize import optimize
from relsat.driver.options import all_cores
from relsat.driver.boundary.verify import verify
from relsat.relations import runtime

FIDELITY = 0.10  # the fidelity target: the input model's in-context prediction within this of its latency
THIRD = (96, 160, 48, 200)  # sizes tried for the non-batch dims of the third binding
PEERS = ("onnxsim", "onnxslim", "onnxoptimizer", "ort-transformers", "relsat-on-onnxsim")  # compare.MAKERS names
# the transformers optimizer's model_type, num_heads and hidden_size per model
ORT_TYPES = {"bert_base": ("bert", 12, 768), "distilbert": ("bert", 12, 768), "gpt2": ("gpt2", 12, 768),
             "vit_b16": ("vit", 12, 768), "whisper_tiny_encoder": ("bert", 6, 384)}


def third_binding(path: Path, binding: dict) -> dict | None:
    """A binding neither costed nor verified at: batch-like symbols 2, the others the first of THIRD at
    which the original runs (None when it runs at none)."""
    model = onnx.load_model(str(path), load_external_data=False)
    sess = runtime.session(str(path), optimize=False)
    syms = binding["symbols"]
    for v in THIRD:
        values = {k: (2 if s[0] == 1 and s[1] == 3 else v) for k, s in syms.items()}
        shapes = {}
        for name, dims in declared_dims(model)["inputs"].items():
            costed = binding["costed"][name]
            shapes[name] = [values.get(d, c) if isinstance(d, str) else c for d, c in zip(dims, costed)]
            for i, d in enumerate(dims):  # unnamed dims: the one value of a non-batch symbol
                if d is None:
                    shapes[name][i] = 2 if i == 0 and len(dims) >= 2 else v
        specs = [(i.name, shapes[i.name], runtime.np_dtype(i.type)) for i in sess.get_inputs()]
        try:
            sess.run(None, feeds.draw(specs, feeds.input_roles(model, shapes), 7))
            return shapes
        except Exception:
            continue
    return None


def _first_line(e: BaseException, n: int) -> str:
    """The first line of an exception's message (its type when it has none), at most ``n`` characters."""
    return (str(e).splitlines()[0] if str(e).strip() else type(e).__name__)[:n]


def run_peers(name: str, path: Path, original: onnx.ModelProto, binding: dict, tmp: Path, row: dict,
              peers=PEERS, optimized_at: int | None = None) -> dict[str, compare.SystemResult]:
    """Make and check ``peers`` for corpus model ``name`` (``compare.run_system``: verified at the
    binding's costed and second shapes, dynamic dims kept); into ``row`` each one's status
    (``verified`` or ``failed: <why>``, one line), seconds and nodes, and relsat-on-onnxsim's choice.
    Returns the verified ones. ``optimized_at``: the threads relsat-on-onnxsim optimizes at (None: its default)."""
    opts = compare.Options(threads=optimized_at, transformer=ORT_TYPES.get(name),  # relsat's own defaults
                           bindings=[b for b in (binding["costed"], binding["second"]) if b])
    out = {}
    for peer in peers:
        r = compare.run_system(peer, compare.MAKERS[peer], original, opts, tmp, original=path)
        if r.status == "not applicable":
            continue
        row[f"{peer}_status"] = "verified" if r.status == "ok" else " ".join(
            f"failed: {r.status}: {r.message}".split())[:240]
        row[f"{peer}_make_s"], row[f"{peer}_nodes"] = round(r.make_s, 1), r.nodes
        if "written" in r.info:
            row[f"{peer}_written"] = r.info["written"]
        if r.status == "ok":
            out[peer] = r
    return out


def _check_written(row: dict, path: Path, original: onnx.ModelProto, out_path: Path, binding: dict, *,
                   run: bool) -> None:
    """Into ``row``: whether the written model keeps the original's dynamic dims, the third binding and,
    with ``run``, whether the written model matches the original there."""
    row["dims_kept"], why = dims_kept(original, onnx.load_model(str(out_path)))
    if why:
        row["dims_lost"] = why
    third = third_binding(path, binding)
    row["third"] = third
    if third is not None and run:
        check = verify(str(path), str(out_path), bindings=[third])
        row["third_ok"], row["third_err"] = check.ok, check.max_abs_err
        if not check.ok:
            row["third_msg"] = check.message


def run_model(name: str, *, threads=(1, None), budget: float = 2.0, peers=PEERS,
              optimized_at: int | None = None) -> dict:
    """Optimize, check and time one corpus model beside ``peers`` (module docstring); the row of the
    results file. ``optimized_at``: relsat's ``threads`` (None: its default, all cores)."""
    path = corpus.build([name])[name]
    original = onnx.load_model(str(path))
    row: dict = {"model": name, "nodes_in": len(original.graph.node), "mb": round(path.stat().st_size / 1e6, 1),
                 "optimized_at": optimized_at or all_cores()}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        out_path = tmp / "relsat.onnx"
        try:
            res = optimize(str(path), output=str(out_path), keep_egraph=True,
                           **({"threads": optimized_at} if optimized_at else {}))
        except Exception as e:
            row["error"] = _first_line(e, 300)
            return row
        rep = res.report
        g = res.egraph
        row.update(
            optimize_s=round(time.perf_counter() - t0, 1), import_s=round(rep.phases_s.get("import", 0.0), 2),
            phases_s={k: round(v, 2) for k, v in rep.phases_s.items()}, enodes=rep.enodes, eclasses=rep.eclasses,
            opaque=g.sql("SELECT count(*) FROM op_opaque")[0][0], nodes_out=rep.nodes_out, written=rep.written,
            verify_err=rep.verification["max_abs_err"], verify_msg=rep.verification["message"],
            binding=rep.binding["symbols"], costed=rep.binding["costed"], notices=rep.notices,
            cost_label=rep.cost_label, prediction=_prediction(rep.fidelity))
        g.close()
        _check_written(row, path, original, out_path, rep.binding, run=True)
        verified = run_peers(name, path, original, rep.binding, tmp, row, peers or (), optimized_at)
        systems = {"original": path, "relsat": out_path, **{k: r.path for k, r in verified.items()}}
        row["relsat_is_input"] = rep.written == "original" and filecmp.cmp(out_path, path, shallow=False)
        pairs = {k: (r.info["input"], r.path) for k, r in verified.items() if r.info.get("written") == "optimized"}
        if rep.written == "optimized":
            pairs = {"relsat": (path, out_path), **pairs}
        n_ops = threads[0] or all_cores()
        histogram = functools.cache(lambda p: ort_ops.ort_histogram(p, n_ops))  # (each model's session made once)
        for who, (before, after) in pairs.items():
            row.setdefault("ort_ops", {})[who] = compare.ort_ops_diff(before, after, histogram=histogram)
        if pairs:
            row["ort_ops_threads"] = n_ops
        row["same_kernels"] = same_kernels(systems, n_ops, histogram)
        roles = feeds.input_roles(original, rep.binding["costed"])
        for t in threads:
            n = t or all_cores()
            row[f"ms_{n}t"], cpu = latencies(systems, n, rep.binding["costed"], budget, roles, row["relsat_is_input"])
            if n == 1:  # the calling thread's CPU time: what the guard compares at 1 thread, steady under load
                row["cpu_1t"] = cpu
    return row


def _prediction(fidelity: dict | None) -> dict | None:
    """The in-context prediction of the input model over its measured latency (the issue's fidelity target: within
    10 %), of the first search and of the last where the search ran again, and the noise it was judged against."""
    if not fidelity or fidelity.get("original_prediction_ratio") is None:
        return None
    first = (fidelity.get("first_pass") or {}).get("original_prediction_ratio")
    return {"ratio": round(fidelity["original_prediction_ratio"], 3), "tolerance": fidelity.get("original_tolerance"),
            "searches": fidelity.get("searches", 1), **({"first_ratio": round(first, 3)} if first else {}),
            "recalled": bool(fidelity.get("comparison_recalled"))}


def latencies(systems: dict[str, Path], threads: int, shapes: dict, budget: float, roles: dict | None,
              relsat_is_input: bool) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall and calling-thread CPU ms of every system, timed together at ``threads``; with
    ``relsat_is_input`` (relsat wrote the input model's bytes), relsat's model is not timed and its figures are
    the original's."""
    timed = {k: p for k, p in systems.items() if not (k == "relsat" and relsat_is_input)}
    lat = time_models(list(timed.values()), threads=threads, input_shapes=shapes, budget_s=budget * len(timed),
                      roles=roles)
    ms = {k: round(v.median_ms, 3) for k, v in zip(timed, lat)}
    cpu = {k: round(v.cpu_ms, 3) for k, v in zip(timed, lat)}
    if relsat_is_input:
        ms["relsat"], cpu["relsat"] = ms["original"], cpu["original"]
    return ms, cpu


def same_kernels(systems: dict[str, Path], threads: int, histogram=None) -> list[str] | None:
    """The peers of ``systems`` (name -> model path; ``relsat`` its written model) whose graph as ONNX Runtime
    runs it at ``threads`` has the same op histogram as relsat's (``ort_ops.ort_histogram``, or the caller's
    ``histogram`` at ``threads``), or None where relsat's could not be read."""
    histogram = histogram or (lambda m: ort_ops.ort_histogram(m, threads))
    try:
        mine = histogram(systems["relsat"])
    except Exception:
        return None
    same = []
    for who, path in systems.items():
        if compare.is_peer(who):
            try:
                if histogram(path) == mine:
                    same.append(who)
            except Exception:
                pass
    return same


def run_reexport(name: str) -> dict:
    """The extracted graph written whatever its speed (analytic costs, no timing): a re-exported model with
    relsat's rewrites in it, verified at the two bindings by ``optimize``; then its declared dims and a
    run at the third binding, as for the default run (where the input model is often written unchanged)."""
    path = corpus.build([name])[name]
    original = onnx.load_model(str(path))
    row: dict = {"model": name}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as td:
        out_path = Path(td) / "relsat.onnx"
        try:
            res = optimize(str(path), output=str(out_path), cost_model="analytic", measure=False)
        except Exception as e:
            row["error"] = _first_line(e, 300)
            return row
        rep = res.report
        row.update(seconds=round(time.perf_counter() - t0, 1), written=rep.written, nodes_out=rep.nodes_out,
                   nodes_in=len(original.graph.node), verify_msg=rep.verification["message"],
                   verify_err=rep.verification["max_abs_err"], binding=rep.binding["symbols"],
                   rules_applied=rep.rules_applied)
        _check_written(row, path, original, out_path, rep.binding, run=rep.written == "optimized")
    return row


def _fmt(x, d=3):
    return "" if x is None else f"{x:.{d}f}" if isinstance(x, float) else str(x)


def _group(name: str) -> str:
    try:
        return corpus.entry(name).group
    except KeyError:
        return "other"


def _geomean(xs) -> float | None:
    xs = [x for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _mean_cell(xs: list, models: int, fmt: str) -> str:
    """The geometric mean of ``xs``, with their number when fewer than the group's ``models``."""
    mean = _geomean(xs)
    return "-" if mean is None else fmt.format(mean) + (f" ({len(xs)})" if len(xs) < models else "")


def _failed(r: dict, system: str) -> bool:
    return r.get(f"{system}_status", "verified") != "verified"


def _best_peer(m: dict) -> tuple[str, float] | None:
    """The fastest timed peer of a row's ms dict (relsat on a peer's output is not a peer)."""
    peers = [(k, v) for k, v in m.items() if compare.is_peer(k)]
    return min(peers, key=lambda kv: kv[1]) if peers else None


def latency_table(rows: list[dict], n: int) -> str:
    """Median ms at ``n`` threads of every system with its speedup over the original, relsat / the best
    peer, then the geometric means per group (speedups: over the models where the system was timed,
    their number in brackets when fewer than the group's), and the failed peers' reasons."""
    rows = [r for r in rows if f"ms_{n}t" in r]
    systems = ["original", "relsat"] + [s for s in PEERS if any(s in r[f"ms_{n}t"] or f"{s}_status" in r
                                                                for r in rows)]
    lines = ["| model | " + " | ".join(systems) + " | relsat / best peer |", "|---|" + "---:|" * (len(systems) + 1)]
    speed: dict = {}  # group -> system -> [speedups]; "relsat / best peer" -> ratios
    over: list = []  # (model, the best peer runs relsat's kernels) where relsat / best peer > 1.01
    for r in rows:
        m = r[f"ms_{n}t"]
        cells = [_fmt(m["original"])]
        for s in systems[1:]:
            if s in m:
                mark = ", input" if s == "relsat" and r.get("relsat_is_input") else ""
                cells.append(f"{_fmt(m[s])} ({m['original'] / m[s]:.3f}x{mark})")
            else:
                cells.append("x" if _failed(r, s) else "-")
        best = _best_peer(m)
        ratio = m["relsat"] / best[1] if best else None
        same = best is not None and best[0] in (r.get("same_kernels") or ())
        cells.append(f"{ratio:.3f} ({best[0]}{', same kernels' if same else ''})" if best else "-")
        if ratio and ratio > 1.01:
            over.append((r["model"], same))
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
        for g in (_group(r["model"]), "all"):
            at = speed.setdefault(g, {"models": 0})
            at["models"] += 1
            for s in systems[1:]:
                if s in m:
                    at.setdefault(s, []).append(m["original"] / m[s])
            if ratio:
                at.setdefault("relsat / best peer", []).append(ratio)
    for g in sorted(speed, key=lambda g: g == "all"):  # the groups as they come, then all
        at = speed[g]
        cells = [_mean_cell(at.get(s, []), at["models"], "{:.3f}x") for s in systems[1:]]
        cells.append(_mean_cell(at.get("relsat / best peer", []), at["models"], "{:.3f}"))
        lines.append(f"| **geomean {g}** ({at['models']}) | | " + " | ".join(cells) + " |")
    why = [f"- x {r['model']} {s}: {r[f'{s}_status'].removeprefix('failed: ')}" for r in rows for s in systems
           if _failed(r, s)]
    if over:
        same = [m for m, s in over if s]
        other = [m for m, s in over if not s]
        why.append(f"- relsat / best peer > 1.01 on {len(over)} of {len(rows)}: "
                   + (f"{len(same)} where that peer's graph runs relsat's kernels ({', '.join(same)}); " if same else "")
                   + (f"{len(other)} where it runs others ({', '.join(other)})" if other else "none where it runs others"))
    return "\n".join(lines + ([""] + why if why else []))


def table(rows: list[dict]) -> str:
    """The Markdown tables of a results file: per model what relsat did and checked, with the ops of the
    graph ONNX Runtime runs for every written model; then one latency table per thread count timed."""
    head = ("| model | nodes in -> out | opaque | import s | optimize s | e-nodes | e-classes | costed at | "
            "dims kept, third binding | verify max abs err | written | ONNX Runtime's ops, before -> after "
            "(written models) |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---|---|---:|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['nodes_in']} | | | | | | | | FAILED: {r['error']} | | |")
            continue
        third = r.get("third")
        kept = ("yes" if r["dims_kept"] else f"NO ({r.get('dims_lost')})") + (
            f", runs and matches at {' '.join(f'{k}={chr(215).join(map(str, v))}' for k, v in third.items())}"
            if third and r.get("third_ok") else ", third binding FAILED" if third else ", no third binding ran")
        costed = ", ".join(f"{k}={v[0]}" for k, v in r["binding"].items()) or "static"
        written = r.get("written", "")
        if "relsat-on-onnxsim_written" in r:
            written += f"; on onnxsim's: {r['relsat-on-onnxsim_written']}"
        ops = "; ".join(f"{who}{' (vs onnxsim)' if who != 'relsat' else ''}: {d}"
                        for who, d in (r.get("ort_ops") or {}).items())
        lines.append(f"| {r['model']} | {r['nodes_in']} -> {r['nodes_out']} | {r['opaque']} | {r['import_s']} | "
                     f"{r['optimize_s']} | {r['enodes']} | {r['eclasses']} | {costed} | {kept} | "
                     f"{r['verify_err']:.2e} | {written} | {ops or '-'} |")
    if fid := fidelity_line(rows):
        lines += ["", fid]
    at = sorted({r["optimized_at"] for r in rows if "optimized_at" in r})
    if at:
        lines += ["", f"relsat optimized with --threads {', '.join(map(str, at))}."]
    counts = sorted({int(k[3:-1]) for r in rows for k in r if k.startswith("ms_") and k.endswith("t")})
    for n in counts:
        lines += ["", f"Latency at {n} thread{'s' if n > 1 else ''}: median ms (speedup over the original)", "",
                  latency_table(rows, n)]
    return "\n".join(lines)


def fidelity_line(rows: list[dict]) -> str | None:
    """On how many models the input model's in-context prediction (``prediction``) lay within ``FIDELITY`` of its
    measured latency, and which were off (by how much, and the first search's where the search ran again)."""
    preds = [(r["model"], r["prediction"]) for r in rows if r.get("prediction")]
    if not preds:
        return None
    off = [f"{m} {p['ratio']:.2f}x" + (f" (first search {p['first_ratio']:.2f}x)" if p.get("first_ratio") else "")
           for m, p in preds if abs(p["ratio"] - 1.0) > FIDELITY]
    return (f"The in-context prediction of the input model over its measured latency: within {FIDELITY:.0%} on "
            f"{len(preds) - len(off)} of {len(preds)}" + (f"; off on {', '.join(off)}" if off else "") + ".")


def reexport_table(rows: list[dict]) -> str:
    lines = ["| model | nodes in -> out | written | rules applied | verification (2 bindings) | dims kept | "
             "third binding | seconds |", "|---|---|---|---|---|---|---|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | | FAILED: {r['error']} | | | | | |")
            continue
        rules = ", ".join(f"{k} x{v}" for k, v in list(r["rules_applied"].items())[:3] if v) or "none"
        third = r.get("third")
        t = ("not run (input written)" if r["written"] != "optimized" else
             "no size ran" if third is None else
             ("ok" if r.get("third_ok") else "FAILED") + " at " + " ".join(
                 f"{k}={chr(215).join(map(str, v))}" for k, v in third.items()))
        lines.append(f"| {r['model']} | {r['nodes_in']} -> {r['nodes_out']} | {r['written']} | {rules} | "
                     f"max abs err {r['verify_err']:.2e} | {'yes' if r['dims_kept'] else 'NO: ' + r['dims_lost']} | "
                     f"{t} | {r['seconds']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=None)
    ap.add_argument("--threads", nargs="*", type=int, default=None, help="thread counts timed (default: 1 and all)")
    ap.add_argument("--budget", type=float, default=2.0, help="timing seconds per model and thread count")
    ap.add_argument("--out", default="corpus_results.jsonl")
    ap.add_argument("--peers", nargs="*", choices=PEERS, default=list(PEERS), metavar="PEER",
                    help=f"peers made, verified and timed (default: all of {', '.join(PEERS)})")
    ap.add_argument("--no-peers", action="store_true", help="no peer (as --peers with none)")
    ap.add_argument("--optimized-at", type=int, default=None, metavar="N",
                    help="relsat optimizes with --threads N (default: its own default, all cores)")
    ap.add_argument("--table", action="store_true", help="print the table of --out and stop")
    ap.add_argument("--reexport", action="store_true", help="instead: the extracted graph written whatever its "
                    "speed (analytic costs, no timing), verified, its dims checked (``run_reexport``)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    if a.table:
        rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        print(table(rows) if any("nodes_in" in r and "opaque" in r for r in rows) else reexport_table(rows))
        return
    names = a.models or [e.name for e in corpus.entries()]
    if a.reexport:
        for name in names:
            row = run_reexport(name)
            with out.open("a") as f:
                f.write(json.dumps(row, default=str) + "\n")
            print(json.dumps({k: row.get(k) for k in ("model", "written", "nodes_in", "nodes_out", "dims_kept",
                                                       "third_ok", "verify_err", "seconds", "error")}), flush=True)
        return
    threads = tuple(a.threads) if a.threads else (1, None)
    for name in names:
        t = time.perf_counter()
        row = run_model(name, threads=threads, budget=a.budget, peers=() if a.no_peers else tuple(a.peers),
                        optimized_at=a.optimized_at)
        row["bench_s"] = round(time.perf_counter() - t, 1)
        with out.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(json.dumps({k: row.get(k) for k in ("model", "written", "dims_kept", "third_ok", "verify_err",
                                                   "optimize_s", "ms_1t", f"ms_{all_cores()}t", "error")},
                         default=str), flush=True)


if __name__ == "__main__":
    main()
