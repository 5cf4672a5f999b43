"""relsat beside its peers on the model zoo, all timed in one run (DESIGN section 11); and the peer
runners (``MAKERS``, ``run_system``: make one system's model, verify it) that ``bench_corpus`` shares.

    python -m relsat.benchmarks.compare [--models NAME ...] [--small] [--threads 1]
        [--node-limit N] [--cost-model measured|analytic] [--budget 2] [--min-runs 20]
        [--ac-add-n 8 9 10 11 | --no-ac-add] [--out benchmarks/] [--no-write]

For every zoo model, each system below produces a model from the same original:

  original       the zoo model as built
  relsat         ``relsat.driver.app.optimize.optimize`` (default rules, ILP extraction, measured
                 costs when that option exists, and its final latency guard)
  onnxsim        ``onnxsim.simplify`` with its defaults
  onnxoptimizer  ``onnxoptimizer.optimize`` with its default passes (fuse and eliminate), followed by
                 constant folding with ``onnxsim.simplify(perform_optimization=False)`` (onnxsim's
                 folder alone: its own optimizer passes are turned off); onnxoptimizer has no folding
  ort-offline    the model ONNX Runtime writes itself (``SessionOptions.optimized_model_filepath``,
                 level ALL, CPU provider, the same thread count); it may hold NCHWc and com.microsoft
                 operators that only load on that provider, which is the one timed
  onnxslim       ``onnxslim.slim`` with its defaults
  ort-transformers  ONNX Runtime's transformers optimizer (``optimize_model``, default options), for
                 transformer models only (``Options.transformer``: model type, heads, hidden size;
                 0 = detected from the graph, as for the zoo's two BERTs)
  relsat-on-onnxsim  relsat (as above) run on onnxsim's output: relsat is never worse than a peer
                 output it could have reached

Every model is checked against the original under ONNX Runtime with
``relsat.driver.boundary.verify.verify`` (at ``Options.bindings``, default the model's own shapes), and
its declared dynamic dims against the original's (``dims_kept``), before it is timed
(``run_system``); one that fails verification or freezes a dynamic dim, or a system that crashes
or is not installed, is reported as such (one line) and not timed. Where relsat (or relsat-on-onnxsim)
wrote a rewritten graph, its notes give what changed in the graph ONNX Runtime runs (``ort_ops``:
op counts of ONNX Runtime's optimized model, before -> after). The
verified models of one zoo model are then timed together (``time_interleaved``), in
sessions made by ``relsat.driver.boundary.latency.session``: ONNX Runtime level ALL, fixed
intra-op threads, one inter-op thread, sequential execution; the same seeded inputs; in
blocks of fresh sessions created in a rotated order (the sessions created first in a process
ran a few percent slower here, whatever the model), each warmed up, then rounds that run
every system once (the starting system rotating); median per system. Speedup is paired by round: the median over rounds of the original's run time
divided by the system's run time in the same round (load from other processes hits both).
The CPU time of the calling thread is recorded beside the wall clock (with one intra-op
thread ONNX Runtime computes on that thread: the run's own work, without the time other
processes held the core); with one thread the verdicts use it, else the wall clock. relsat
is called ahead of or behind the best peer only when their paired ratio differs from 1 by
more than 3% and its 95% bootstrap interval excludes 1.

Beside the zoo: the ``ac-add`` saturation benchmark, relsat and egglog on the same Add
chains (``relsat.benchmarks.bench_ac_add.series``).

Results go to ``OUT/RESULTS.md`` (the section "Peer comparison" is replaced, or appended;
the rest of the file is left as it is) and a chart of speedups, ``OUT/compare.png``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import importlib.util
import math
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from relsat.benchmarks import ort_ops
from relsat.driver.boundary import zoo
from relsat.driver.options import DEFAULTS, NODE_LIMIT, NODE_LIMIT_PER_ENODE
from relsat.driver.boundary.verify import error_line, random_inputs, verify

SECTION = "Peer comparison"
SYSTEMS = ("original", "relsat", "onnxsim", "onnxoptimizer", "ort-offline")  # the first comparison's systems
ADDED = ("onnxslim", "ort-transformers", "relsat-on-onnxsim")  # issue 25's peers, after them in the tables
ORDER = SYSTEMS + ADDED
# the zoo's transformer models, for ONNX Runtime's transformers optimizer: (model_type, num_heads, hidden_size);
# 0 lets it read heads and hidden size from the graph
ZOO_TRANSFORMERS = {"bert": ("bert", 0, 0), "bert_encoder": ("bert", 0, 0)}
NOISE = 0.03  # relative latency differences below this are noise on these machines (DESIGN section 11)
RELSAT_OPTIONS = ("threads", "node_limit", "time_limit", "cost_model")  # Options fields passed on to relsat
NODE_LIMIT_DEFAULT = f"relsat's default, {NODE_LIMIT:,} or {NODE_LIMIT_PER_ENODE}x the imported graph's e-nodes"


class NotInstalled(Exception):
    """A peer's package is missing (or has no wheel for this Python): the system is skipped."""


class NotApplicable(Exception):
    """The system does not apply to this model (ort-transformers on a model that is no transformer): it
    is left out of the results."""


@dataclass
class Options:
    """A comparison's settings: relsat's options where they differ from ``DEFAULTS`` (None: relsat's
    default), then the benchmark's own."""

    threads: int | None = 1  # ONNX Runtime intra-op threads, relsat's too (None: relsat's default, all cores)
    node_limit: int | None = None
    time_limit: float | None = None
    cost_model: str | None = None
    budget_s: float = 2.0  # seconds of timed runs per system (fast models)
    min_runs: int = 20  # at least this many timed runs per system (slow models)
    relsat_kwargs: dict = field(default_factory=dict)  # passed on to optimize() (e.g. measure=False)
    transformer: tuple | None = None  # (model_type, num_heads, hidden_size) of this model; None: no transformer
    bindings: list | None = None  # input shapes dicts every system is verified at; None: the model's own


@dataclass
class SystemResult:
    system: str
    status: str  # ok | verification failed | error | not installed
    message: str = ""
    make_s: float = 0.0  # seconds the system took to produce its model
    nodes: int | None = None
    foreign_ops: int = 0  # nodes outside the default ONNX domain
    max_abs_err: float | None = None
    median_ms: float | None = None
    q1_ms: float | None = None
    q3_ms: float | None = None
    runs: int = 0
    speedup: float | None = None  # median over rounds of (original's run / this run), paired by round
    times: np.ndarray | None = field(default=None, repr=False)  # seconds per timed run, by round
    cpu_median_ms: float | None = None  # CPU time of the calling thread per run (see time_interleaved)
    cpu_speedup: float | None = None  # paired like ``speedup``, on CPU times
    cpu_times: np.ndarray | None = field(default=None, repr=False)
    path: str | None = None  # the verified model file (kept only while the workdir exists)
    info: dict = field(default_factory=dict)


@dataclass
class ModelResult:
    model: str
    small: bool
    nodes: int
    systems: list[SystemResult]
    error: str = ""
    metric: str = "wall"  # what the verdict compares: "cpu" (one intra-op thread) or "wall"

    def by_system(self) -> dict[str, SystemResult]:
        return {s.system: s for s in self.systems}


# ------------------------------------------------------------------------------------ systems
# Each maker takes the original model, the options and a scratch folder and returns the path
# of the model it produced plus a dict of facts worth reporting.

def _require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise NotInstalled(f"{module} is not installed ({e}); pip install -e \".[bench]\"") from None


def make_original(model: onnx.ModelProto, opts: Options, tmp: Path):
    path = tmp / "original.onnx"
    onnx.save(model, path)
    return path, {}


def _relsat(model: onnx.ModelProto, opts: Options, path: Path):
    """relsat's model for ``model``, written to ``path``, and its facts worth reporting."""
    from relsat.driver.app.optimize import optimize

    kw = {k: getattr(opts, k) for k in RELSAT_OPTIONS if getattr(opts, k) is not None}
    kw.update(opts.relsat_kwargs)
    res = optimize(model, **kw)
    rep = res.report
    onnx.save(res.model, path)
    info = {"cost_model": rep.get("cost_model", "analytic"), "written": rep.get("written", "optimized"),
            "enodes": rep.get("enodes"), "stop": rep.get("stop_reason"),
            "cost_before": rep.get("cost_before"), "cost_after": rep.get("cost_after")}
    if rep.get("latency"):
        info["guard_speedup"] = rep["latency"].get("cpu_speedup") or rep["latency"].get("speedup")
    if any("extraction kept the original" in n for n in rep.get("notices", [])):
        info["why_original"] = "the extraction chose it"
    elif info["written"] == "original":
        info["why_original"] = "the latency guard rejected the optimized one"
    return path, info


def make_relsat(model: onnx.ModelProto, opts: Options, tmp: Path):
    return _relsat(model, opts, tmp / "relsat.onnx")


def make_relsat_on_onnxsim(model: onnx.ModelProto, opts: Options, tmp: Path):
    """relsat run on onnxsim's model (the one ``make_onnxsim`` wrote in ``tmp``, else made here)."""
    sim = tmp / "onnxsim.onnx"
    if not sim.exists():
        try:
            make_onnxsim(model, opts, tmp)
        except NotInstalled:
            raise
        except Exception as e:
            raise RuntimeError(f"onnxsim failed: {error_line(e)}") from None
    path, info = _relsat(onnx.load(str(sim)), opts, tmp / "relsat-on-onnxsim.onnx")
    return path, dict(info, input=str(sim))


def make_onnxsim(model: onnx.ModelProto, opts: Options, tmp: Path):
    onnxsim = _require("onnxsim")
    out, ok = onnxsim.simplify(model)
    if not ok:
        raise RuntimeError("onnxsim's own check failed")
    path = tmp / "onnxsim.onnx"
    onnx.save(out, path)
    return path, {}


def make_onnxslim(model: onnx.ModelProto, opts: Options, tmp: Path):
    onnxslim = _require("onnxslim")
    out = onnxslim.slim(model)  # a new model; the input is left as it is
    if out is None:
        raise RuntimeError("onnxslim returned no model")
    path = tmp / "onnxslim.onnx"
    onnx.save(out, path)
    return path, {}


def make_ort_transformers(model: onnx.ModelProto, opts: Options, tmp: Path):
    if opts.transformer is None:
        raise NotApplicable("not a transformer model")
    _require("onnxruntime.transformers.optimizer")
    from onnxruntime.transformers.optimizer import optimize_model

    kind, heads, hidden = opts.transformer
    given = tmp / "ort-transformers-input.onnx"  # given a ModelProto, optimize_model moves its weights to
    onnx.save(model, given)  # external data in place and then fails to read them (zoo BERT)
    out = optimize_model(str(given), model_type=kind, num_heads=heads, hidden_size=hidden)
    path = tmp / "ort-transformers.onnx"
    out.save_model_to_file(str(path))
    return path, {"model_type": kind}


def make_onnxoptimizer(model: onnx.ModelProto, opts: Options, tmp: Path):
    onnxoptimizer = _require("onnxoptimizer")
    onnxsim = _require("onnxsim")
    fused = onnxoptimizer.optimize(model)  # passes=None: get_fuse_and_elimination_passes()
    out, ok = onnxsim.simplify(fused, perform_optimization=False)  # constant folding only
    if not ok:
        raise RuntimeError("constant folding (onnxsim) check failed")
    path = tmp / "onnxoptimizer.onnx"
    onnx.save(out, path)
    return path, {"nodes_before_folding": len(fused.graph.node)}


def make_ort_offline(model: onnx.ModelProto, opts: Options, tmp: Path):
    path = tmp / "ort-offline.onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = opts.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3  # ORT warns that level ALL output is hardware specific: it is timed here
    so.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return path, {}


MAKERS: dict[str, Callable] = {
    "original": make_original,
    "relsat": make_relsat,
    "onnxsim": make_onnxsim,
    "onnxoptimizer": make_onnxoptimizer,
    "ort-offline": make_ort_offline,
    "onnxslim": make_onnxslim,
    "ort-transformers": make_ort_transformers,
    "relsat-on-onnxsim": make_relsat_on_onnxsim,
}


def _count(model: onnx.ModelProto) -> tuple[int, int]:
    return len(model.graph.node), sum(1 for n in model.graph.node if n.domain not in ("", "ai.onnx"))


def _dims(v) -> list:
    return [d.dim_param if d.dim_param else (d.dim_value if d.HasField("dim_value") else None)
            for d in v.type.tensor_type.shape.dim]


def declared_dims(model: onnx.ModelProto) -> dict:
    """The dims the graph's inputs (initializers left out) and outputs declare: int, dim_param, or None."""
    inits = {t.name for t in model.graph.initializer}
    return {"inputs": {v.name: _dims(v) for v in model.graph.input if v.name not in inits},
            "outputs": {v.name: _dims(v) for v in model.graph.output}}


def dims_kept(original: onnx.ModelProto, written: onnx.ModelProto) -> tuple[bool, str]:
    """Whether every dynamic dim of the original's inputs and outputs is dynamic in the written model
    (and why not: one line)."""
    a, b = declared_dims(original), declared_dims(written)
    for kind in ("inputs", "outputs"):
        for name, dims in a[kind].items():
            got = b[kind].get(name)
            if got is None or len(got) != len(dims):
                return False, f"{kind[:-1]} {name}: {got} for {dims}"
            lost = [i for i, d in enumerate(dims) if not isinstance(d, int) and isinstance(got[i], int)]
            if lost:
                return False, f"{kind[:-1]} {name}: dims {lost} fixed ({got} for {dims})"
    return True, ""


def ort_ops_diff(before, after, *, threads: int = 1, histogram=None) -> str:
    """What a rewrite changed in the graph ONNX Runtime runs (``ort_ops.diff`` of the two models'
    optimized graphs), or why that could not be read.  ``histogram``: the caller's ``ort_ops.ort_histogram``
    at ``threads`` (one that remembers what it read), else read here."""
    histogram = histogram or (lambda m: ort_ops.ort_histogram(m, threads))
    try:
        return ort_ops.diff(histogram(before), histogram(after))
    except Exception as e:
        return f"not read: {error_line(e)}"


def run_system(sysname: str, maker: Callable, model: onnx.ModelProto, opts: Options, tmp: Path, *,
               original=None) -> SystemResult:
    """Make one system's model (``maker(model, opts, tmp)``) and check it against the original
    (``original``: its path or ModelProto, default ``model``): verified element by element at
    ``opts.bindings``, and every dynamic dim kept. Status ``ok`` with ``path`` the verified model, else
    ``not applicable`` / ``not installed`` / ``error`` / ``verification failed`` / ``dims lost`` with a
    one-line message; ``nodes`` and ``foreign_ops`` once a model was made."""
    r = SystemResult(sysname, "ok")
    t = time.perf_counter()
    try:
        path, r.info = maker(model, opts, tmp)
    except (NotApplicable, NotInstalled) as e:
        r.status, r.message = "not applicable" if isinstance(e, NotApplicable) else "not installed", str(e)
        return r
    except Exception as e:  # a crashing system is reported, not timed
        r.status, r.message = "error", f"{type(e).__name__}: {error_line(e)}"
        return r
    finally:
        r.make_s = time.perf_counter() - t
    r.path = str(path)
    try:
        made = onnx.load(str(path), load_external_data=False)
        r.nodes, r.foreign_ops = _count(made)
        check = verify(model if original is None else original, path, bindings=opts.bindings)
        r.max_abs_err = check.max_abs_err
        if not check.ok:
            r.status, r.message = "verification failed", check.message
            return r
        kept, why = dims_kept(model, made)
        if not kept:
            r.status, r.message = "dims lost", why
    except Exception as e:
        r.status, r.message = "verification failed", f"{type(e).__name__}: {error_line(e)}"
    return r


# ------------------------------------------------------------------------------------ timing

def time_interleaved(models, *, threads: int = 1, budget_s: float = 2.0, min_runs: int = 20,
                     max_runs: int = 2000, blocks: int | None = None,
                     seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Seconds per run of each model (paths or ModelProtos), all on the same seeded inputs, in
    sessions made by ``relsat.driver.boundary.latency.session`` (level ALL, ``threads`` intra-op threads, one
    inter-op thread, sequential).

    The runs are split into ``blocks`` (default: one per model). Each block creates fresh sessions,
    in an order that rotates from block to block (the sessions created first in a process run a few
    percent slower here, whatever the model, so every model takes every place once), warms them
    up, then runs rounds in which every model runs once, the starting model rotating from round to
    round. In a round each model runs a burst of back-to-back runs (about ``BLOCK_S``, as
    ``relsat.driver.boundary.latency`` does), after one untimed run for a model faster than ``COLD_S``, so that
    its timed runs find its weights in the caches as a model serving requests does (run by run, each
    model's weights were evicted by the others', a penalty that differs between graphs; one untimed
    run was not enough either: NASRNN's original then ran 3.18 ms against 2.75 alone). The number of
    rounds gives about ``budget_s`` of runs per model (at least ``min_runs``);
    run k of every model belongs to round k (for paired ratios).

    Returns the wall-clock seconds and the CPU seconds of the calling thread per run: with one
    intra-op thread ONNX Runtime computes on the calling thread, so its CPU time is the run's
    own work, without the time other processes held the core."""
    import gc

    from relsat.driver.boundary.latency import BLOCK_RUNS, BLOCK_S, COLD_S, session

    k = len(models)
    blocks = blocks or k
    feeds = None

    def once(sess, f) -> tuple[float, float]:
        c, t = time.thread_time(), time.perf_counter()
        sess.run(None, f)
        return time.perf_counter() - t, time.thread_time() - c

    wall: list[list[float]] = [[] for _ in range(k)]
    cpu: list[list[float]] = [[] for _ in range(k)]
    n = per_block = None
    cold, burst = False, 1
    for blk in range(blocks):
        order = [(blk + j) % k for j in range(k)]
        made = {i: session(models[i], threads=threads) for i in order}
        sessions = [made[i] for i in range(k)]
        if feeds is None:
            feeds = random_inputs(sessions, seed=seed)
        runs = [(s, {i.name: feeds[i.name] for i in s.get_inputs() if i.name in feeds}) for s in sessions]
        warm = [[once(*runs[i])[0] for _ in range(3)] for i in range(k)]
        if n is None:  # size the whole run from the first block's warm-up
            start = time.perf_counter()
            while time.perf_counter() - start < min(0.5, budget_s / 4) and len(warm[0]) < 20:
                for i in range(k):
                    warm[i].append(once(*runs[i])[0])
            per_run = max(float(np.median(w[1:])) for w in warm)
            n = int(min(max_runs, max(min_runs, math.ceil(budget_s / max(per_run, 1e-6)))))
            per_block = math.ceil(n / blocks)
            cold = per_run < COLD_S
            burst = max(1, min(BLOCK_RUNS, math.ceil(BLOCK_S / max(per_run, 1e-6))))
        for r in range(0, per_block, burst):
            for j in range(k):
                i = (r + j) % k
                if cold:  # warm the caches the other models' runs evicted, untimed
                    once(*runs[i])
                for _ in range(min(burst, per_block - r)):  # then back to back, as a model serving requests
                    w, c = once(*runs[i])
                    wall[i].append(w)
                    cpu[i].append(c)
        del runs, sessions, made
        gc.collect()
    return [np.asarray(w) for w in wall], [np.asarray(c) for c in cpu]


# ------------------------------------------------------------------------------------ one model

def compare_model(name: str, *, small: bool = False, opts: Options | None = None, systems=None,
                  workdir: str | Path | None = None, progress=print) -> ModelResult:
    """Produce, verify and time every system's model for zoo model ``name``. ``systems``: a dict
    name -> maker (default ``MAKERS``; ``original`` is always first; a system that does not apply to the
    model is left out). Model files are written under ``workdir`` (a temporary folder, removed
    afterwards, when None)."""
    opts = replace(opts or Options(), transformer=ZOO_TRANSFORMERS.get(name))
    makers = dict(systems or MAKERS)
    makers = {"original": makers.pop("original", make_original), **makers}
    with tempfile.TemporaryDirectory() if workdir is None else _nullctx(workdir) as tmp:
        tmp = Path(tmp) / (name + ("_small" if small else ""))
        tmp.mkdir(parents=True, exist_ok=True)
        model = zoo.build(name, small=small)
        result = ModelResult(name, small, len(model.graph.node), [], metric="cpu" if opts.threads == 1 else "wall")
        for sysname, maker in makers.items():
            progress(f"  {name}: {sysname} ...")
            r = run_system(sysname, maker, model, opts, tmp)
            if r.status == "not applicable":
                continue
            if r.status == "ok" and r.info.get("written") == "optimized":
                r.info["ort_ops"] = ort_ops_diff(r.info.get("input") or model, r.path, threads=opts.threads)
            result.systems.append(r)
        timed = [s for s in result.systems if s.status == "ok"]
        if not timed or timed[0].system != "original":
            result.error = "the original model could not be timed"
            return result
        progress(f"  {name}: timing {len(timed)} models interleaved ...")
        try:
            times, cpus = time_interleaved([s.path for s in timed], threads=opts.threads,
                                           budget_s=opts.budget_s, min_runs=opts.min_runs)
        except Exception as e:
            result.error = f"timing failed: {type(e).__name__}: {error_line(e)}"
            return result
        for s, t in zip(timed, times):
            s.q1_ms, s.median_ms, s.q3_ms = (float(v) for v in np.percentile(t * 1e3, [25, 50, 75]))
            s.runs, s.times = len(t), t
            s.speedup = float(np.median(times[0] / t))  # paired: runs of the same round share the load
        for s, c in zip(timed, cpus):
            s.cpu_times, s.cpu_median_ms = c, float(np.median(c) * 1e3)
            s.cpu_speedup = float(np.median(cpus[0] / np.maximum(c, 1e-9)))
        if workdir is None:
            for s in result.systems:
                s.path = None  # the folder is gone
    return result


class _nullctx:
    def __init__(self, value):
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


# ------------------------------------------------------------------------------------ ac-add

def ac_add(ns, *, with_egglog: bool = True, timeout: float = 3600.0) -> tuple[list[dict], str]:
    """Rows of ``bench_ac_add.series(ns, with_egglog=...)`` and a note (why something is missing).

    The series runs in a fresh, small interpreter: its runs are child processes whose peak memory
    is their max RSS, and Linux carries a process's max RSS across fork and exec, so children
    forked straight from this (large) process would report this process's size instead."""
    import json
    import subprocess

    from relsat.benchmarks import bench_ac_add

    if getattr(bench_ac_add, "series", None) is None:
        return [], ("relsat.benchmarks.bench_ac_add.series is not available in this checkout, so the ac-add "
                    "comparison was not run")
    note = ""
    if with_egglog and importlib.util.find_spec("egglog") is None:
        with_egglog, note = False, "egglog is not installed (pip install -e \".[bench]\"): relsat only"
    code = ("import json, sys; from relsat.benchmarks.bench_ac_add import series; "
            f"print(json.dumps(series({[int(n) for n in ns]!r}, with_egglog={with_egglog!r})))")
    try:
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], f"the ac-add series did not finish in {timeout:g} s"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return [], f"the ac-add series failed: {last}"
    return json.loads(res.stdout.strip().splitlines()[-1]), note


# ------------------------------------------------------------------------------------ reporting

def _versions() -> str:
    out = [f"Python {platform.python_version()}", f"ONNX Runtime {ort.__version__}", f"onnx {onnx.__version__}"]
    for mod, label in (("duckdb", "DuckDB"), ("onnxsim", "onnxsim"), ("onnxoptimizer", "onnxoptimizer"),
                       ("egglog", "egglog")):
        try:
            from importlib.metadata import version

            out.append(f"{label} {version(mod)}")
        except Exception:
            out.append(f"{label} not installed")
    return ", ".join(out)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{platform.machine()}, {cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}"


def _fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def paired_ratio(a: np.ndarray, b: np.ndarray, *, seed: int = 0, resamples: int = 2000):
    """Median of a[r] / b[r] over rounds r, with a 95% bootstrap interval of that median."""
    r = np.asarray(a) / np.asarray(b)
    rng = np.random.default_rng(seed)
    boot = np.median(r[rng.integers(0, len(r), (resamples, len(r)))], axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(np.median(r)), float(lo), float(hi)


def _series(s: SystemResult, metric: str):
    """(times per run, paired speedup, median ms) of a system under ``metric``."""
    if metric == "cpu":
        return s.cpu_times, s.cpu_speedup, s.cpu_median_ms
    return s.times, s.speedup, s.median_ms


def is_peer(system: str) -> bool:
    """Whether ``system`` is a peer relsat is judged against: neither the original nor relsat (on its own
    or on a peer's output)."""
    return system != "original" and not system.startswith("relsat")


def verdict(res: ModelResult) -> tuple[str, str]:
    """relsat against the fastest verified peer under the model's metric: (verdict, detail). Ahead
    or behind only when the paired ratio differs from 1 by more than ``NOISE`` and its 95%
    interval excludes 1; a tie otherwise."""
    by = res.by_system()
    rel = by.get("relsat")
    if rel is None or rel.times is None:
        return "relsat not timed", (rel.status + (f": {rel.message}" if rel.message else "")) if rel else "not run"
    peers = [s for s in res.systems if is_peer(s.system) and s.times is not None]
    if not peers:
        return "no peer timed", ""
    best = max(peers, key=lambda s: _series(s, res.metric)[1])
    med, lo, hi = paired_ratio(_series(rel, res.metric)[0], _series(best, res.metric)[0])
    detail = f"relsat / {best.system} = {med:.3f} (95% CI {lo:.3f}-{hi:.3f})"
    if med < 1 - NOISE and hi < 1:
        return "ahead", detail
    if med > 1 + NOISE and lo > 1:
        return "behind", detail
    return "tie", detail


def verdicts(res: ModelResult) -> str:
    v, detail = verdict(res)
    return f"{v}: {detail}" if detail else v


def _table(results, systems, metric: str) -> list[str]:
    L = ["| model | " + " | ".join(systems) + " |", "|---|" + "---|" * len(systems)]
    for r in results:
        by = r.by_system()
        cells = []
        for s in systems:
            x = by.get(s)
            if x is None:
                cells.append("-")
            elif x.times is None:
                cells.append(x.status)
            else:
                _, sp, med = _series(x, metric)
                cells.append(_fmt(med) if s == "original" else f"{_fmt(med)} ({sp:.2f}x)")
        L.append(f"| {r.model}{' (small)' if r.small else ''} | " + " | ".join(cells) + " |")
    return L


def _relsat_option(opts: Options, name: str):
    """The value of relsat option ``name`` that ``opts`` runs relsat with."""
    value = getattr(opts, name)
    value = getattr(DEFAULTS, name) if value is None else value
    return NODE_LIMIT_DEFAULT if name == "node_limit" and value is None else value


def render(results: list[ModelResult], ac_rows: list[dict], ac_note: str, *, command: str, opts: Options,
           started: str, load: tuple[float, float], chart: str | None) -> str:
    systems = [s for s in ORDER if any(s in r.by_system() for r in results)]
    systems += sorted({s.system for r in results for s in r.systems} - set(systems))
    metric = "cpu" if opts.threads == 1 else "wall"
    L = [f"## {SECTION}", "", f"Command: `{command}`", ""]
    L.append(f"Machine: {machine()}; {_versions()}. Measured {started}; load average (1 min) "
             f"{load[0]:.2f} before and {load[1]:.2f} after: other processes shared the cores when it is "
             "above 1.")
    L.append("")
    L.append(
        "Systems: relsat = `relsat.driver.app.optimize.optimize` with its defaults (default rules, "
        f"{'cost model ' + opts.cost_model + ', ' if opts.cost_model else ''}ILP extraction, latency guard) and "
        f"node limit {_relsat_option(opts, 'node_limit')}; onnxsim = `onnxsim.simplify` with its defaults; "
        "onnxoptimizer = its default fuse-and-eliminate passes, then constant folding by "
        "`onnxsim.simplify(perform_optimization=False)` (onnxsim's folder with its optimizer off); ort-offline = the model ONNX Runtime saves at level "
        "ALL (`optimized_model_filepath`; NCHWc and com.microsoft operators, for the CPU provider only); "
        "onnxslim = `onnxslim.slim` with its defaults; ort-transformers = ONNX Runtime's transformers optimizer "
        "(`optimize_model`, model type bert, heads and hidden size read from the graph; the two BERTs only); "
        "relsat-on-onnxsim = relsat as above on onnxsim's model (not counted as a peer in the verdicts). Every "
        "system's model is verified against the original under ONNX Runtime (`relsat.driver.boundary.verify.verify`) "
        "before it is timed; a model that fails, or a system that crashes, is reported and not timed. Where "
        "relsat wrote a rewritten graph, its notes give what changed in the graph ONNX Runtime runs (op counts "
        "of its optimized model, before -> after).")
    L.append("")
    L.append(
        f"Timing: ONNX Runtime {ort.__version__}, CPU provider, level ALL for every model (so the original "
        f"already gets ONNX Runtime's own fusions), {opts.threads} intra-op thread(s), one inter-op thread, "
        "sequential, the same seeded inputs. The models of one zoo model are timed together, in as many blocks "
        "as there are models: each block makes fresh sessions in a rotated order (the sessions made first in a "
        "process ran a few percent slower here, whatever the model), warms them up, then runs rounds that run "
        f"each model once (the first one rotating); about {opts.budget_s:g} s of runs per model in all and at "
        f"least {opts.min_runs}. Speedups are paired by round: the median over rounds of the original's "
        "time / the system's time in the same round.")
    L.append("")
    L.append("### Latency (wall clock): median ms (speedup over the original)")
    L.append("")
    L += _table(results, systems, "wall")
    L.append("")
    if metric == "cpu":
        L.append("### CPU time of the calling thread per run: median ms (speedup over the original)")
        L.append("")
        L.append("With one intra-op thread ONNX Runtime computes on the calling thread, so this is the run's own "
                 "work without the time other processes held the core: the steadier measure on a shared machine, "
                 "used for the verdicts below.")
        L.append("")
        L += _table(results, systems, "cpu")
        L.append("")
    L.append(f"### relsat against the best peer ({'CPU time' if metric == 'cpu' else 'wall clock'})")
    L.append("")
    L.append(f"The paired ratio of relsat's time to the fastest peer's, with a 95% bootstrap interval of its "
             f"median; ahead / behind only when it differs from 1 by more than {NOISE:.0%} and the interval "
             "excludes 1, a tie otherwise.")
    L.append("")
    L.append("| model | verdict | ratio | relsat wrote |")
    L.append("|---|---|---|---|")
    for r in results:
        v, detail = (r.error, "") if r.error else verdict(r)
        rel = r.by_system().get("relsat")
        wrote = rel.info.get("written", "-") if rel and rel.info else "-"
        L.append(f"| {r.model}{' (small)' if r.small else ''} | {v} | {detail} | {wrote} graph |")
    L.append("")
    L.append("### Per system: nodes, time to produce the model, verification, spread")
    L.append("")
    L.append("| model | system | status | nodes (non-ONNX) | make s | verify max abs err | wall ms q1-median-q3 | "
             "runs | notes |")
    L.append("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for s in r.systems:
            notes = s.message
            if s.system.startswith("relsat") and s.info:
                i = s.info
                notes = "; ".join(x for x in (
                    f"cost model {i.get('cost_model')}", f"{i.get('enodes')} e-nodes, {i.get('stop')}",
                    f"wrote the {i.get('written')} graph" + (f" ({i['why_original']})" if i.get("why_original") else ""),
                    (f"model cost {i['cost_before']:.3g} -> {i['cost_after']:.3g} ms" if i.get("cost_after") is not None
                     else ""),
                    (f"its guard measured {i['guard_speedup']:.2f}x" if i.get("guard_speedup") else ""),
                    (f"ONNX Runtime's ops {i['ort_ops']}" if i.get("ort_ops") else ""), notes) if x)
            nodes = "-" if s.nodes is None else f"{s.nodes}" + (f" ({s.foreign_ops})" if s.foreign_ops else "")
            spread = "-" if s.q1_ms is None else f"{_fmt(s.q1_ms)} / {_fmt(s.median_ms)} / {_fmt(s.q3_ms)}"
            err = "-" if s.max_abs_err is None else f"{s.max_abs_err:.2g}"
            L.append(f"| {r.model} | {s.system} | {s.status} | {nodes} | {s.make_s:.2f} | {err} | {spread} | "
                     f"{s.runs or '-'} | {notes.replace('|', '/')} |")
    L.append("")
    if chart:
        L.append(f"Chart: `{chart}` (speedup over the original per model and system, "
                 f"{'CPU time' if metric == 'cpu' else 'wall clock'}).")
        L.append("")
    L.append("### Saturation: ac-add, relsat beside egglog")
    L.append("")
    if ac_note:
        L.append(f"Note: {ac_note}.")
        L.append("")
    if ac_rows:
        L.append("An Add chain over n inputs saturated with commutativity and associativity only; exact = the "
                 "e-graph has 2^n - n - 1 Add e-classes and 3^n - 2^(n+1) + 1 Add e-nodes.")
        L.append("")
        systems_ac = list(dict.fromkeys(str(r.get("system")) for r in ac_rows))
        head = ("| n | e-nodes | e-classes | " + " | ".join(f"{x} s | {x} peak MiB (at start)" for x in systems_ac)
                + " | exact |")
        L.append(head)
        L.append("|---" * (4 + 2 * len(systems_ac)) + "|")
        for n in sorted({r.get("n") for r in ac_rows}):
            at = {str(r.get("system")): r for r in ac_rows if r.get("n") == n}
            sizes = {(r.get("enodes"), r.get("eclasses")) for r in at.values()}
            en, ec = next(iter(sizes)) if len(sizes) == 1 else ("differ", "differ")
            cells = []
            for x in systems_ac:
                r = at.get(x, {})
                sec = r.get("seconds")
                base = f" ({_fmt(r['base_mib'], 1)})" if r.get("base_mib") is not None else ""
                cells += ["-" if sec is None else f"{sec:g}", _fmt(r.get("peak_mib"), 1) + base]
            exact = all(r.get("exact") for r in at.values())
            L.append(f"| {n} | {en} | {ec} | " + " | ".join(cells) + f" | {exact} |")
        L.append("")
        L.append("Seconds and peak memory as `relsat.benchmarks.bench_ac_add.series` reports them (each run in its "
                 "own process; relsat's seconds are its saturation runner's wall time).")
        L.append("")
    return "\n".join(L).rstrip() + "\n"


def write_section(path: str | Path, text: str, title: str = SECTION) -> None:
    """Replace the ``## title`` section of the Markdown file ``path`` with ``text`` (which starts
    with that heading), or append it; everything else in the file is kept as it is. The file is
    read and replaced in one quick step (other sections belong to other people)."""
    path = Path(path)
    heading = f"## {title}"
    old = path.read_text() if path.exists() else ""
    lines = old.splitlines(keepends=True)
    start = next((i for i, l in enumerate(lines) if l.rstrip() == heading), None)
    if start is None:
        new = old + ("" if not old or old.endswith("\n\n") else "\n" if old.endswith("\n") else "\n\n") + text
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + text + ("\n" + tail if tail else "")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new)
    os.replace(tmp, path)


def chart(results: list[ModelResult], path: str | Path, metric: str = "cpu") -> bool:
    """A grouped bar chart of speedups per model and system; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    systems = [s for s in ORDER if s != "original" and any(s in r.by_system() for r in results)]
    labels = [r.model for r in results]
    width = 0.8 / max(len(systems), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(labels) + 2), 4.2))
    every: list[float] = []
    for k, s in enumerate(systems):
        xs, ys, missing = [], [], []
        for i, r in enumerate(results):
            x = r.by_system().get(s)
            pos = i - 0.4 + width * (k + 0.5)
            if x is not None and x.times is not None:
                xs.append(pos)
                ys.append(_series(x, metric)[1])
            else:
                missing.append(pos)
        bars = ax.bar(xs, [y - 1 for y in ys], width, bottom=1.0, label=s)  # bars grow from 1.0 (no change)
        every.extend(ys)
        color = bars.patches[0].get_facecolor() if bars.patches else None
        if missing:
            ax.plot(missing, [1.0] * len(missing), "x", color=color, markersize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    if every:
        pad = 0.02 + 0.1 * (max(every + [1.0]) - min(every + [1.0]))
        ax.set_ylim(min(every + [1.0]) - pad, max(every + [1.0]) + pad)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel("speedup over the original (x)")
    ax.set_title(f"ONNX Runtime CPU provider, level ALL: {'CPU time' if metric == 'cpu' else 'wall clock'} "
                 "(x: not timed)")
    ax.legend(fontsize=8, ncols=min(len(systems), 4), loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------------------------------ main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--models", nargs="+", default=list(zoo.NAMES),
                    help="zoo models (default: TASO's ten; EinNet's seed models by name)")
    ap.add_argument("--systems", nargs="+", default=None, choices=[m for m in MAKERS if m != "original"],
                    help="the systems beside the original (default: all)")
    ap.add_argument("--small", action="store_true", help="the reduced zoo variants")
    ap.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)")
    ap.add_argument("--node-limit", type=int, default=None,
                    help=f"relsat's e-node limit (default: {NODE_LIMIT_DEFAULT})")
    ap.add_argument("--time-limit", type=float, default=None,
                    help=f"relsat's saturation time limit, s (default: relsat's, {DEFAULTS.time_limit:g})")
    ap.add_argument("--cost-model", default=None, help="relsat's cost model (default: relsat's own default)")
    ap.add_argument("--budget", type=float, default=2.0, help="seconds of timed runs per system (default 2)")
    ap.add_argument("--min-runs", type=int, default=20, help="timed runs per system, at least (default 20)")
    ap.add_argument("--ac-add-n", type=int, nargs="+", default=[8, 9, 10, 11])
    ap.add_argument("--no-ac-add", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent),
                    help="folder of RESULTS.md and compare.png (default: benchmarks/)")
    ap.add_argument("--no-write", action="store_true", help="print the Markdown, write nothing")
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if m not in zoo.ALL_NAMES]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; zoo: {', '.join(zoo.ALL_NAMES)}")
    systems = {k: MAKERS[k] for k in args.systems} if args.systems else None
    opts = Options(threads=args.threads, node_limit=args.node_limit, time_limit=args.time_limit,
                   cost_model=args.cost_model, budget_s=args.budget, min_runs=args.min_runs)
    command = "python -m relsat.benchmarks.compare " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    started = _dt.datetime.now().strftime("%Y-%m-%d %H:%M")
    load0 = os.getloadavg()[0]
    results = []
    for name in args.models:
        print(f"{name}:", flush=True)
        results.append(compare_model(name, small=args.small, opts=opts, systems=systems,
                                     progress=lambda s: print(s, flush=True)))
        print("  " + (results[-1].error or verdicts(results[-1])), flush=True)
    ac_rows, ac_note = ([], "not run (--no-ac-add)") if args.no_ac_add else ac_add(args.ac_add_n)
    load1 = os.getloadavg()[0]
    out = Path(args.out)
    png = None
    if not args.no_write:
        out.mkdir(parents=True, exist_ok=True)
        if chart(results, out / "compare.png", "cpu" if opts.threads == 1 else "wall"):
            png = str(out / "compare.png")
            try:
                png = os.path.relpath(png, Path(__file__).resolve().parent.parent)
            except ValueError:
                pass
    text = render(results, ac_rows, ac_note.rstrip("."), command=command.strip(), opts=opts, started=started,
                  load=(load0, load1), chart=png)
    print(text)
    if not args.no_write:
        write_section(out / "RESULTS.md", text)
        print(f"wrote {out / 'RESULTS.md'} (section '{SECTION}')" + (f" and {png}" if png else ""))
    bad = [r.model for r in results if r.error]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
