"""relsat on the real-model corpus (``relsat.benchmarks.corpus``), as a user runs it: default options, no
``--input-shape``; every model keeps its dynamic dims.

    python -m relsat.benchmarks.bench_corpus [--models NAME ...] [--threads 1 2] [--budget 2]
        [--out results.jsonl] [--no-peers] [--reexport] [--table]

For each model:

- ``optimize(path)`` with the default options (measured costs in context, the measured final
  choice, verification at two bindings of the dynamic dims); import and total seconds, e-graph
  size, opaque e-nodes (operators outside the catalog, or whose shape relsat cannot prove over
  dynamic dims), the verification error, the bindings;
- **dims kept**: the written model's graph inputs and outputs declare the same dynamic dims as the
  original's, and it runs in ONNX Runtime at a third binding, neither costed nor verified at
  (batch 2, other dims the first of 96, 160, 48, 200 at which the original runs), with every
  output equal to the original's there (the same element-wise check as verification);
- **latency** at the costed binding, at 1 thread and at all cores, original and relsat's model
  and, beside them, onnxsim's (``onnxsim.simplify``, defaults, dynamic dims kept) and, for the
  transformer models, ONNX Runtime's transformers optimizer
  (``onnxruntime.transformers.optimizer.optimize_model``, the model type, heads and hidden size
  given per model, default options otherwise): all timed together (``relsat.driver.latency.time_models``: fresh sessions, blocks of
  back-to-back runs interleaved, medians), level ALL; each peer verified against the original
  first (one that fails is reported, not timed).

``--reexport`` instead writes the extracted graph whatever its speed (analytic costs, no timing), so
that a model with relsat's rewrites in it goes through verification at two bindings and the dims
check even where the default run writes the input model unchanged.

One JSON line per model is appended to ``--out`` as soon as it is done (a long run that stops
keeps what it measured); ``--table`` prints the Markdown table of a results file.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import onnx

from relsat.benchmarks import corpus
from relsat.driver import feeds
from relsat.driver.latency import time_models
from relsat.driver.optimize import optimize
from relsat.driver.options import all_cores
from relsat.driver.verify import verify
from relsat.relations import runtime

THIRD = (96, 160, 48, 200)  # sizes tried for the non-batch dims of the third binding
# the transformers optimizer's model_type, num_heads and hidden_size per model
ORT_TYPES = {"bert_base": ("bert", 12, 768), "distilbert": ("bert", 12, 768), "gpt2": ("gpt2", 12, 768),
             "vit_b16": ("vit", 12, 768), "whisper_tiny_encoder": ("bert", 6, 384)}


def _dims(v) -> list:
    return [d.dim_param if d.dim_param else (d.dim_value if d.HasField("dim_value") else None)
            for d in v.type.tensor_type.shape.dim]


def _declared(model: onnx.ModelProto) -> dict:
    inits = {t.name for t in model.graph.initializer}
    return {"inputs": {v.name: _dims(v) for v in model.graph.input if v.name not in inits},
            "outputs": {v.name: _dims(v) for v in model.graph.output}}


def _dynamic(dims: list) -> list[int]:
    return [i for i, d in enumerate(dims) if not isinstance(d, int)]


def dims_kept(original: onnx.ModelProto, written: onnx.ModelProto) -> tuple[bool, str]:
    """Whether every dynamic dim of the original's inputs and outputs is dynamic in the written model."""
    a, b = _declared(original), _declared(written)
    for kind in ("inputs", "outputs"):
        for name, dims in a[kind].items():
            got = b[kind].get(name)
            if got is None or len(got) != len(dims):
                return False, f"{kind[:-1]} {name}: {got} for {dims}"
            lost = [i for i in _dynamic(dims) if isinstance(got[i], int)]
            if lost:
                return False, f"{kind[:-1]} {name}: dims {lost} fixed ({got} for {dims})"
    return True, ""


def third_binding(path: Path, binding: dict) -> dict | None:
    """A binding neither costed nor verified at: batch-like symbols 2, the others the first of THIRD at
    which the original runs (None when it runs at none)."""
    model = onnx.load_model(str(path), load_external_data=False)
    sess = runtime.session(str(path), optimize=False)
    syms = binding["symbols"]
    for v in THIRD:
        values = {k: (2 if s[0] == 1 and s[1] == 3 else v) for k, s in syms.items()}
        shapes = {}
        for name, dims in _declared(model)["inputs"].items():
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


def _peer(name: str, path: Path, tmp: Path) -> dict:
    """onnxsim's and (transformer models) ONNX Runtime's transformers optimizer's models: path or error."""
    out = {}
    try:
        import onnxsim

        m, ok = onnxsim.simplify(str(path))
        if not ok:
            raise RuntimeError("onnxsim's own check failed")
        p = tmp / "onnxsim.onnx"
        onnx.save_model(m, str(p))
        out["onnxsim"] = p
    except Exception as e:
        out["onnxsim"] = f"failed: {_first_line(e, 200)}"
    if name in ORT_TYPES:
        try:
            from onnxruntime.transformers.optimizer import optimize_model

            kind, heads, hidden = ORT_TYPES[name]
            m = optimize_model(str(path), model_type=kind, num_heads=heads, hidden_size=hidden)
            p = tmp / "ort_transformers.onnx"
            m.save_model_to_file(str(p))
            out["ort-transformers"] = p
        except Exception as e:
            out["ort-transformers"] = f"failed: {_first_line(e, 200)}"
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


def run_model(name: str, *, threads=(1, None), budget: float = 2.0, peers: bool = True) -> dict:
    path = corpus.build([name])[name]
    original = onnx.load_model(str(path))
    row: dict = {"model": name, "nodes_in": len(original.graph.node), "mb": round(path.stat().st_size / 1e6, 1)}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        out_path = tmp / "relsat.onnx"
        try:
            res = optimize(str(path), output=str(out_path), keep_egraph=True)
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
            cost_label=rep.cost_label)
        g.close()
        _check_written(row, path, original, out_path, rep.binding, run=True)
        systems = {"original": path, "relsat": out_path}
        if peers:
            for peer, p in _peer(name, path, tmp).items():
                if isinstance(p, str):
                    row[f"{peer}_status"] = p
                    continue
                check = verify(str(path), str(p), bindings=[rep.binding["costed"]])
                row[f"{peer}_status"] = "verified" if check.ok else f"not verified: {check.message[:200]}"
                if check.ok:
                    systems[peer] = p
        roles = feeds.input_roles(original, rep.binding["costed"])
        for t in threads:
            n = t or all_cores()
            lat = time_models(list(systems.values()), threads=n, input_shapes=rep.binding["costed"],
                              budget_s=budget * len(systems), roles=roles)
            row[f"ms_{n}t"] = {k: round(v.median_ms, 3) for k, v in zip(systems, lat)}
    return row


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


def table(rows: list[dict]) -> str:
    cores = all_cores()
    head = ("| model | nodes in -> out | opaque | import s | optimize s | e-nodes | e-classes | costed at | "
            "dims kept, third binding | verify max abs err | "
            f"ms 1 thread: original / relsat / onnxsim / ort-tr | ms {cores} threads: original / relsat / onnxsim / ort-tr |")
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

        def ms(t):
            m = r.get(f"ms_{t}t") or {}
            cells = []
            for k in ("original", "relsat", "onnxsim", "ort-transformers"):
                if k in m:
                    cells.append(_fmt(m[k]))
                elif k in ("onnxsim", "ort-transformers") and r.get(f"{k}_status", "").startswith(("failed", "not")):
                    cells.append("x")
                else:
                    cells.append("-")
            return " / ".join(cells)

        lines.append(f"| {r['model']} | {r['nodes_in']} -> {r['nodes_out']} | {r['opaque']} | {r['import_s']} | "
                     f"{r['optimize_s']} | {r['enodes']} | {r['eclasses']} | {costed} | {kept} | "
                     f"{r['verify_err']:.2e} | {ms(1)} | {ms(cores)} |")
    return "\n".join(lines)


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
    ap.add_argument("--no-peers", action="store_true")
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
        row = run_model(name, threads=threads, budget=a.budget, peers=not a.no_peers)
        row["bench_s"] = round(time.perf_counter() - t, 1)
        with out.open("a") as f:
            f.write(json.dumps(row, default=str) + "\n")
        print(json.dumps({k: row.get(k) for k in ("model", "written", "dims_kept", "third_ok", "verify_err",
                                                   "optimize_s", "ms_1t", f"ms_{all_cores()}t", "error")},
                         default=str), flush=True)


if __name__ == "__main__":
    main()
