"""The GPU benchmark of issue 25 (part 4): the zoo and the corpus end to end with ``--provider cuda``, one command.

Owns the GPU section of ``benchmarks/RESULTS.md``: which models run (every zoo model, small by
default, then every corpus model already built in the corpus cache; one not built is skipped with a
line), the time budget each gets out of a total (``--total-budget``, 540 s: the whole run stays under
10 minutes), the three systems timed per model (the original, relsat's written model, onnxsim's
output), how they are timed, and the Markdown it writes (``--markdown``). Per model:

- ``relsat optimize --provider cuda`` in its own process (``relsat.driver.app.cli``, as bench_e2e runs
  it), killed at its share of the budget; saturation and ILP time limits are cut from the same share;
- onnxsim (``onnxsim.simplify``, defaults, dynamic dims kept) in its own process, killed likewise,
  then verified against the original (``relsat.driver.boundary.verify``); an onnxsim model that does not
  verify is not timed;
- latency on the GPU at the binding relsat costed: with onnxruntime-gpu, ONNX Runtime's CUDA
  execution provider (``relsat.driver.boundary.latency.session``); without it, PyTorch through
  ``relsat.driver.boundary.torch_runtime.TorchSession`` on cuda. Fresh sessions in two blocks, created in
  the given order and then reversed, runs interleaved in blocks (``relsat.driver.boundary.latency``'s
  ``_timed_block``), the median wall clock per system. A system its runtime cannot run is reported,
  the others are still timed;
- which rules fired (the saturation's applications per rule) and the extracted graph's op changes
  (relsat reports them also where its final choice writes the input model unchanged).

``--jobs N`` (default 1: each model optimized and then timed before the next starts, its budget its share
of what is left of the total) runs in two phases instead. Phase 1: relsat optimize and onnxsim for every
model, up to N models at a time, each model's processes pinned (``taskset``) to a slice of this process's
CPUs of its own, relsat with ``--threads`` the slice's size unless ``--threads`` is given; phase 1 has the
total less ``TIME_S`` per model (less at most half the total), and a model gets N times what is left of it
over the models not yet done, weighed by their set (``WEIGHT``: a corpus model gets 2.5 times a small zoo
model's share; all of it once N or fewer are left). Phase 2: every model's systems timed
as above, one model at a time with nothing else running. What it costs in honesty: relsat's in-context
costs, its guard's measured choice of what to write and its optimize time were taken while other jobs
shared the machine and the GPU, so what it writes may differ from a run alone; the latencies timed are
not affected. The section says so.

``--dry-run`` runs the same code path on the CPU so that it can be tested without a GPU:
``--provider cpu`` and ``--candidates 0`` (no in-context search: it needs ONNX Runtime on the
provider, so a GPU machine without onnxruntime-gpu runs none either), timing with PyTorch on its
CPU device (ONNX Runtime on the CPU where torch is not installed), tiny budgets, and by default the
small squeezenet and mobilenet_v2 only. Its section says plainly that it is not a GPU figure.

    python -m relsat.benchmarks.bench_gpu --jobs 4 --out /tmp/relsat_gpu --markdown gpu_section.md  # on a CUDA machine
    python -m relsat.benchmarks.bench_gpu --dry-run --models squeezenet --markdown /tmp/dry.md  # anywhere

One JSON row per model goes to ``OUT/results.json`` as soon as it is timed; ``optimize_start`` and
``optimize_end`` are when its relsat optimize ran, in seconds from the start of the run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import queue
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx

from relsat.benchmarks import corpus
from relsat.driver.boundary import zoo
from relsat.driver.boundary import feeds, latency, torch_runtime
from relsat.driver.boundary.verify import random_inputs, verify
from relsat.relations.backend import resolve

TOTAL_S = 540.0  # the whole run: under 10 minutes with start-up and the table
DRY_TOTAL_S = 90.0
DRY_MODELS = ("squeezenet", "mobilenet_v2")
SYSTEMS = ("original", "relsat", "onnxsim")
MIN_BUDGET_S = 5.0  # a model whose share of what is left is below this is skipped
WEIGHT = {"zoo small": 1.0, "zoo": 2.5, "corpus": 2.5}  # --jobs > 1: a model's share of phase 1 (a corpus model
# optimizes in about 2.5 times a small zoo model's time: 20-30 s against 8-12 s alone)
TIME_S = 5.0  # --jobs > 1: kept per model for the timing phase (three systems, two blocks of a second, sessions;
# 24 models took 62 s in all on the H100, 2026-11-27)


def _line(text: str, n: int = 240) -> str:
    """One table-safe line of at most ``n`` characters."""
    return " ".join(str(text).split()).replace("|", "/")[:n]


_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception|Conflict)\b")


def _tail(proc: subprocess.CompletedProcess) -> str:
    """Why a process failed, in one line: its last exception line (``RuntimeError: CUDA error: ...``), then its last
    lines; a CUDA fault's advice (``CUDA_LAUNCH_BLOCKING``) follows its error, so the last lines alone miss it."""
    lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").strip().splitlines() if ln.strip()]
    if not lines:
        return f"exit {proc.returncode}"
    errors = [ln for ln in lines if _ERROR_LINE.match(ln)]
    last = lines[-3:]
    return " / ".join(([errors[-1]] if errors and errors[-1] not in last else []) + last)


# ---------------------------------------------------------------- where it runs

def runtime_here(dry_run: bool) -> tuple[str, str, str]:
    """(the provider relsat optimizes for, the whole-model runtime that times, its device)."""
    if dry_run:
        return "cpu", ("torch" if importlib.util.find_spec("torch") else "onnxruntime"), "cpu"
    rt = resolve("cuda").whole_graph
    if rt is None:
        raise SystemExit("bench_gpu: no CUDA here (neither onnxruntime-gpu nor PyTorch with CUDA); "
                         "use --dry-run to run the same path on the CPU")
    return "cuda", rt, "cuda"


def device_name(device: str) -> str:
    if device == "cpu":
        return f"CPU (dry run, not a GPU): {platform.machine()}, {os.cpu_count()} cores"
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"
    except ImportError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
        return out.splitlines()[0] if out else "a CUDA GPU (name unknown)"
    except (OSError, subprocess.SubprocessError):
        return "a CUDA GPU (name unknown)"


def core_slices(n: int) -> list[tuple[int, ...]]:
    """This process's CPUs cut into ``n`` slices, one per concurrent job (slices repeat when there are fewer
    CPUs than jobs)."""
    cores = sorted(os.sched_getaffinity(0))
    k = max(1, len(cores) // n)
    return [tuple(cores[(i * k) % len(cores):][:k]) for i in range(n)]


def _pinned(cores: tuple[int, ...]) -> list[str]:
    """The command prefix that keeps a process on ``cores`` (none for no cores, or without taskset)."""
    return ["taskset", "-c", ",".join(map(str, cores))] if cores and shutil.which("taskset") else []


def plan(args) -> tuple[list[tuple[str, str, Path | None]], list[str]]:
    """The models to run as (name, set, corpus file or None for zoo), and the lines for those skipped."""
    names = args.models or (list(DRY_MODELS) if args.dry_run else [*zoo.ALL_NAMES, *(e.name for e in corpus.entries())])
    known = {e.name for e in corpus.entries()}
    runs, skipped = [], []
    for name in names:
        if name in zoo.ALL_NAMES:
            runs.append((name, "zoo" if args.full_zoo else "zoo small", None))
        elif name in known:
            p = corpus.path(name, args.corpus_dir)
            if p.exists():
                runs.append((name, "corpus", p))
            else:
                skipped.append(f"{name}: not built in {p.parent} (python -m relsat.benchmarks.corpus build {name})")
        else:
            raise SystemExit(f"bench_gpu: unknown model {name!r} (zoo: {', '.join(zoo.ALL_NAMES)}; corpus: "
                             f"{', '.join(sorted(known))})")
    return runs, skipped


# ---------------------------------------------------------------- the three systems

def run_relsat(src: Path, dst: Path, rep: Path, budget: float, provider: str, args,
               cores: tuple[int, ...] = ()) -> tuple[dict | None, str]:
    """relsat optimize on ``cores`` (any when empty), ``--threads`` theirs unless given: (its report, '') or
    (None, why not)."""
    sat, ilp = (max(1.0, 0.2 * budget), max(1.0, 0.1 * budget))
    cmd = [*_pinned(cores), sys.executable, "-c", "from relsat.driver.app.cli import main; main()", "optimize",
           str(src), "-o", str(dst), "--report", str(rep), "--provider", provider]
    if args.dry_run:  # tiny budgets; no in-context search, as on a GPU without onnxruntime-gpu (optimize.in_context)
        sat, ilp = min(sat, 2.0), min(ilp, 2.0)
        cmd += ["--candidates", "0"]
    cmd += ["--time-limit", f"{sat:g}", "--ilp-time-limit", f"{ilp:g}"]
    threads = args.threads or len(cores)
    if threads:
        cmd += ["--threads", str(threads)]
    limit = max(3.0, 0.6 * budget)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, f"relsat timed out after {limit:.0f} s"
    if proc.returncode != 0 or not rep.exists():
        return None, f"relsat failed: {_tail(proc)}"
    return json.loads(rep.read_text()), ""


_ONNXSIM = ("import sys, onnx, onnxsim\n"
            "m, ok = onnxsim.simplify(sys.argv[1])\n"
            "if not ok: sys.exit(\"onnxsim's own check failed\")\n"
            "onnx.save_model(m, sys.argv[2])\n")


def run_onnxsim(src: Path, dst: Path, budget: float, shapes: dict | None, cores: tuple[int, ...] = ()) -> str:
    """onnxsim's model at ``dst`` (made on ``cores``, any when empty), verified against ``src`` at ``shapes``;
    '' or why there is none."""
    if importlib.util.find_spec("onnxsim") is None:
        return "onnxsim is not installed"
    limit = max(3.0, 0.25 * budget)
    try:
        proc = subprocess.run([*_pinned(cores), sys.executable, "-c", _ONNXSIM, str(src), str(dst)],
                              capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return f"onnxsim timed out after {limit:.0f} s"
    if proc.returncode != 0 or not dst.exists():
        return f"onnxsim failed: {_tail(proc)}"
    check = verify(str(src), str(dst), input_shapes=shapes)
    return "" if check.ok else f"onnxsim not verified: {check.message}"


def _session(path: Path, rt: str, device: str, threads: int):
    if rt == "torch":
        return torch_runtime.session(path, device)
    return latency.session(str(path), threads=threads, backend=resolve(device))


def time_systems(paths: dict[str, Path], *, rt: str, device: str, shapes: dict | None, roles: dict | None,
                 budget_s: float, threads: int) -> tuple[dict[str, float], dict[str, str]]:
    """Median wall-clock ms of every system that its runtime runs, all timed on the same inputs, interleaved
    (``relsat.driver.boundary.latency.time_models``'s method with this runtime's sessions); errors by system."""
    errors: dict[str, str] = {}
    names = list(paths)
    times: dict[str, list[float]] = {n: [] for n in names}
    feed = None
    for block in range(2):
        made = {}
        for n in (names if block == 0 else names[::-1]):
            if n in errors:
                continue
            try:
                made[n] = _session(paths[n], rt, device, threads)
            except Exception as e:  # a node the runtime cannot run, a provider missing: reported, others timed
                errors[n] = f"{n} not timed: {_line(e, 160)}"
        live = [n for n in names if n in made]
        if not live:
            break
        if feed is None:
            feed = random_inputs([made[n] for n in live], seed=0, input_shapes=shapes, roles=roles)
        for n in list(live):
            try:  # one run first: a runtime that makes a session may still fail to run it
                made[n].run(None, {i.name: feed[i.name] for i in made[n].get_inputs() if i.name in feed})
            except Exception as e:
                errors[n] = f"{n} not timed: {_line(e, 160)}"
                live.remove(n)
        runs = [(made[n], {i.name: feed[i.name] for i in made[n].get_inputs() if i.name in feed}) for n in live]
        wall = [times[n] for n in live]
        latency._timed_block(runs, wall, [[] for _ in live], budget_s / 2, math.ceil(latency.MIN_RUNS / 2))
        del made, runs
    ms = {n: float(statistics.median(t) * 1e3) for n, t in times.items() if t and n not in errors}
    return ms, errors


def _free(device: str) -> None:
    if device == "cuda" and "torch" in sys.modules:
        sys.modules["torch"].cuda.empty_cache()


# ---------------------------------------------------------------- one model

def _fallback_shapes(name: str, kind: str) -> dict | None:
    """The input shapes at the corpus entry's first binding (when relsat gave none), None for the zoo."""
    if kind != "corpus":
        return None
    e = corpus.entry(name)
    b = e.bindings[0]
    return {i.name: [b[d] if isinstance(d, str) else d for d in i.dims] for i in e.inputs}


def _op_changes(before: dict, after: dict) -> str:
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(before) | set(after))}
    return ", ".join(f"{k} {d:+d}" for k, d in delta.items() if d) or "none"


def optimize_model(name: str, kind: str, path: Path | None, budget: float, where: tuple[str, str, str], args,
                   cores: tuple[int, ...] = ()) -> tuple[dict, dict]:
    """The first half of a model's run: relsat optimize and onnxsim on ``cores`` (any when empty). Its row so
    far, and what timing it needs (the systems' files, the inputs' roles, its budget)."""
    out = args.out / name
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("original.onnx", "relsat.onnx", "report.json", "onnxsim.onnx"):  # an earlier run's, same --out
        (out / stale).unlink(missing_ok=True)
    src = path or out / "original.onnx"
    if path is None:
        zoo.save(zoo.build(name, small=not args.full_zoo), src)
    original = onnx.load_model(str(src), load_external_data=False)
    row: dict = {"model": name, "set": kind, "budget_s": round(budget, 1), "nodes_in": len(original.graph.node),
                 "ms": {}, "notes": []}
    t0 = time.perf_counter()
    rep, why = run_relsat(src, out / "relsat.onnx", out / "report.json", budget, where[0], args, cores)
    t1 = time.perf_counter()
    row.update(optimize_s=round(t1 - t0, 1), optimize_start=round(t0 - args.start, 2),
               optimize_end=round(t1 - args.start, 2))
    if rep is None:
        row["notes"].append(why)
    else:
        row.update(nodes_out=rep["nodes_out"], written=rep["written"],
                   rules_fired={k: v for k, v in rep["rules_applied"].items() if v},
                   op_changes=_op_changes(zoo.op_counts(original), rep["extracted"]["ops"]))
        row["notes"] += [n for n in rep.get("notices", []) if "written unchanged" not in n][:1]
    shapes = rep["binding"]["costed"] if rep else _fallback_shapes(name, kind)
    row["shapes"] = shapes
    paths = {"original": src}
    if rep is not None:
        paths["relsat"] = out / "relsat.onnx"
    why = run_onnxsim(src, out / "onnxsim.onnx", budget, shapes, cores)
    if why:
        row["notes"].append(_line(why, 200))
    else:
        paths["onnxsim"] = out / "onnxsim.onnx"
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row, {"paths": paths, "roles": feeds.input_roles(original, shapes), "budget": budget}


def time_model(row: dict, job: dict, where: tuple[str, str, str], args) -> dict:
    """The second half: the model's systems timed on the device; ``row`` with its ms, notes and seconds."""
    _, rt, device = where
    t0 = time.perf_counter()
    timing = min(2.0, max(0.3, 0.05 * job["budget"])) if not args.dry_run else 0.3
    try:
        row["ms"], errors = time_systems(job["paths"], rt=rt, device=device, shapes=row["shapes"],
                                         roles=job["roles"], budget_s=timing, threads=args.threads or 1)
        row["notes"] += list(errors.values())
    except Exception as e:
        row["notes"].append(f"timing failed: {_line(e, 200)}")
    _free(device)
    row["seconds"] = round(row["seconds"] + time.perf_counter() - t0, 1)
    return row


# ---------------------------------------------------------------- the section

def _ms(row: dict, system: str) -> str:
    v = row["ms"].get(system)
    return "-" if v is None else f"{v:.3f}"


def _speedup(row: dict, system: str) -> str:
    a, b = row["ms"].get("original"), row["ms"].get(system)
    return "-" if a is None or b is None or b <= 0 else f"{a / b:.3f}"


def _rules(row: dict) -> str:
    fired = row.get("rules_fired")
    if fired is None:
        return "-"
    top = [f"{k} x{v}" for k, v in list(fired.items())[:4]]
    return (", ".join(top) + (f", +{len(fired) - 4} more" if len(fired) > 4 else "")) or "none"


def _budget_lines(meta: dict) -> list[str]:
    took = f"; the run took {meta['elapsed_s']:.0f} s"
    if meta["jobs"] == 1:
        return [f"- budget: {meta['total_s']:.0f} s in all, shared out among the models as the run goes" + took]
    return [f"- budget: {meta['total_s']:.0f} s in all, {meta['phase1_s']:.0f} s of it for optimizing the models "
            f"{meta['jobs']} at a time (`--jobs {meta['jobs']}`), the rest for timing them" + took,
            f"- up to {meta['jobs']} optimizations (relsat and onnxsim, each relsat on CPUs of its own) shared the "
            "machine and the GPU, so relsat's in-context costs, its guard's measured choice of what to write and "
            "its optimize s were taken under that load, while the latencies in the table were timed afterwards, "
            "one model at a time with nothing else running"]


def markdown(rows: list[dict], meta: dict) -> str:
    dry = meta["dry_run"]
    title = ("## GPU dry run on the CPU (issue 25): not a GPU figure" if dry else
             "## GPU (issue 25): zoo and corpus end to end with `--provider cuda`")
    timed = ("PyTorch through `relsat.driver.boundary.torch_runtime.TorchSession` on " + meta["device"]
             + (" (onnxruntime-gpu is not installed)" if meta["device"] == "cuda" else "")
             if meta["runtime"] == "torch" else f"ONNX Runtime ({meta['device']} execution provider)")
    lines = [title, "",
             f"- device: {meta['device_name']}",
             f"- date: {meta['date']}; relsat `--provider {meta['provider']}`; latency timed with {timed}: fresh "
             "sessions in two blocks (given order, then reversed), runs interleaved, median wall clock per system, "
             "at the input shapes relsat costed (batch 1)",
             f"- command: `{meta['command']}`",
             *_budget_lines(meta),
             "", "| model | set | nodes in -> out | written | original ms | relsat ms | onnxsim ms | relsat speedup "
             "| onnxsim speedup | rules fired (applications) | extracted graph: op changes | optimize s | notes |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---|---|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['set']} | {r['nodes_in']} -> {r.get('nodes_out', '-')} | "
                     f"{r.get('written', '-')} | {_ms(r, 'original')} | {_ms(r, 'relsat')} | {_ms(r, 'onnxsim')} | "
                     f"{_speedup(r, 'relsat')} | {_speedup(r, 'onnxsim')} | {_rules(r)} | "
                     f"{r.get('op_changes', '-')} | {r['optimize_s']} | {_line('; '.join(r['notes']), 400)} |")
    if meta["skipped"]:
        lines += ["", "Skipped: " + "; ".join(meta["skipped"]) + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", help="zoo and corpus names (default: every zoo model, then every corpus "
                    f"model built; --dry-run: {' '.join(DRY_MODELS)})")
    ap.add_argument("--dry-run", action="store_true", help="the same path on the CPU: provider cpu, PyTorch's cpu "
                    "device (ONNX Runtime without torch), tiny budgets, two small zoo models")
    ap.add_argument("--total-budget", type=float, default=None, help=f"seconds for the whole run (default {TOTAL_S:g}; "
                    f"dry run {DRY_TOTAL_S:g})")
    ap.add_argument("--full-zoo", action="store_true", help="the zoo at full size (default: the small variants)")
    ap.add_argument("--corpus-dir", type=Path, default=None, help="the corpus cache (default: the user cache)")
    ap.add_argument("--threads", type=int, default=None, help="relsat --threads (default: relsat's; with --jobs "
                    "above 1 the size of each job's CPU slice; dry run 1)")
    ap.add_argument("--jobs", type=int, default=1, help="optimize up to this many models at once, then time them "
                    "one at a time (default 1: each model optimized and timed before the next)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/relsat_bench_gpu"), help="models, reports, results.json")
    ap.add_argument("--markdown", type=Path, default=None, help="the section (default OUT/gpu_section.md)")
    args = ap.parse_args(argv)
    args.argv = argv
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    if args.dry_run and args.threads is None:
        args.threads = 1
    total = args.total_budget or (DRY_TOTAL_S if args.dry_run else TOTAL_S)
    where = runtime_here(args.dry_run)
    if where[1:] != ("torch", "cpu"):
        return run_all(args, total, where)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)  # PyTorch's CPU device at relsat's thread count (dry run)
    try:
        run_all(args, total, where)
    finally:
        torch.set_num_threads(threads)


def _too_little(name: str, budget: float, skipped: list[str]) -> bool:
    """Whether ``budget`` is too little to run the model (then a line for it in ``skipped``)."""
    if budget >= MIN_BUDGET_S:
        return False
    skipped.append(f"{name}: out of time ({budget:.1f} s left for it)")
    print(f"skipped {skipped[-1]}", file=sys.stderr, flush=True)
    return True


def _done(rows: list[dict], budget: float, args) -> None:
    """results.json with the rows so far, and a line for the last."""
    row = rows[-1]
    (args.out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    print(f"{row['model']} ({row['set']}, {row['seconds']} s of {budget:.0f}): written {row.get('written', '-')}; ms "
          + ", ".join(f"{s} {_ms(row, s)}" for s in SYSTEMS)
          + (f"; {'; '.join(row['notes'])}" if row["notes"] else ""), file=sys.stderr, flush=True)


def run_serially(runs: list, total: float, where: tuple[str, str, str], args, skipped: list[str]) -> list[dict]:
    """--jobs 1: each model optimized and timed before the next, its budget its share of what is left."""
    rows = []
    for k, (name, kind, path) in enumerate(runs):
        budget = (total - (time.perf_counter() - args.start)) / (len(runs) - k)
        if _too_little(name, budget, skipped):
            continue
        rows.append(time_model(*optimize_model(name, kind, path, budget, where, args), where, args))
        _done(rows, budget, args)
    return rows


def share(kind: str, weights_left: float, left: int, n: int) -> float:
    """The part of what is left of phase 1 that a model of set ``kind`` starting now gets, with ``left`` models
    (weighing ``weights_left`` together, its own included) not done and ``n`` jobs at once."""
    return 1.0 if left <= n else min(1.0, n * WEIGHT[kind] / weights_left)


def optimize_all(runs: list, phase1_s: float, where: tuple[str, str, str], args,
                 skipped: list[str]) -> list[tuple[dict, dict]]:
    """Phase 1 of --jobs N: every model's optimize_model, N at a time, each on a CPU slice of its own; a model
    gets N times what is left of ``phase1_s``, shared among the models not done by their ``WEIGHT`` (all of it
    once N or fewer are left)."""
    n, slots, lock, done = args.jobs, queue.SimpleQueue(), threading.Lock(), [0]
    weights_left = [sum(WEIGHT[kind] for _, kind, _ in runs)]
    for cores in core_slices(n):
        slots.put(cores)

    def one(run: tuple[str, str, Path | None]) -> tuple[dict, dict] | None:
        name, kind, path = run
        with lock:
            left = len(runs) - done[0]
            budget = (phase1_s - (time.perf_counter() - args.start)) * share(kind, weights_left[0], left, n)
        try:
            if _too_little(name, budget, skipped):
                return None
            cores = slots.get()
            try:
                row, job = optimize_model(name, kind, path, budget, where, args, cores)
            finally:
                slots.put(cores)
            print(f"{name}: optimized in {row['optimize_s']} s of {budget:.0f} on CPUs {','.join(map(str, cores))}",
                  file=sys.stderr, flush=True)
            return row, job
        finally:
            with lock:
                done[0] += 1
                weights_left[0] -= WEIGHT[kind]

    with ThreadPoolExecutor(n) as pool:
        return [r for r in pool.map(one, runs) if r is not None]


def run_in_phases(runs: list, phase1_s: float, where: tuple[str, str, str], args, skipped: list[str]) -> list[dict]:
    """--jobs N > 1: every model optimized (``optimize_all``), then each timed alone, in the plan's order."""
    rows = []
    for row, job in optimize_all(runs, phase1_s, where, args, skipped):
        rows.append(time_model(row, job, where, args))
        _done(rows, job["budget"], args)
    return rows


def run_all(args, total: float, where: tuple[str, str, str]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    runs, skipped = plan(args)
    for s in skipped:
        print(f"skipped {s}", file=sys.stderr, flush=True)
    args.start = time.perf_counter()  # optimize_start and optimize_end count from here
    if args.jobs == 1:
        phase1, rows = None, run_serially(runs, total, where, args, skipped)
    else:
        phase1 = total - min(total / 2, TIME_S * len(runs))
        rows = run_in_phases(runs, phase1, where, args, skipped)
    meta = {"dry_run": args.dry_run, "provider": where[0], "runtime": where[1], "device": where[2],
            "device_name": device_name(where[2]), "date": datetime.date.today().isoformat(),
            "command": shlex.join(["python", "-m", "relsat.benchmarks.bench_gpu", *args.argv]), "total_s": total,
            "jobs": args.jobs, "phase1_s": phase1, "elapsed_s": time.perf_counter() - args.start, "skipped": skipped}
    md = markdown(rows, meta)
    (args.markdown or args.out / "gpu_section.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
