"""``relsat batch``: optimize every model of a folder or glob, in parallel, resumably.

``run_batch(spec, outdir, ...)`` is the Python API; the ``batch`` command of
:mod:`relsat.driver.app.cli` calls it.  This module owns what a batch is whatever runs the models:
finding and naming them, resume, the CSV and the summary; and the *local* executor (the default).
One model's way from its run to its row is :mod:`relsat.driver.app.batch_model`'s, for both executors:
the worker-side :func:`~relsat.driver.app.batch_model.model_fields` turns a model into the fields of
its row, the parent-side :class:`~relsat.driver.app.batch_model.Recorder` commits its files and writes
the row to the results table.  The *ray* executor (``executor="ray"``,
:mod:`relsat.driver.app.batch_ray`) runs each model as a Ray task instead, on this machine or a
cluster, through the same two.

Local executor: each model runs the ``optimize`` pipeline
(:func:`relsat.driver.app.optimize.optimize`) in its own worker process, started with the *spawn*
method (DuckDB and ONNX Runtime are not fork-safe once used, and ``import onnxruntime`` already
starts a thread).  At most ``jobs`` workers run at once.  A worker gets one model and then
exits, so a model that runs past ``model_timeout`` is stopped by killing exactly its process
(a ``concurrent.futures`` pool cannot kill one task without breaking every other one), and a
model that crashes its process (a segfault, the OOM killer) is a failure of that model only.
The workers store the costs they measure in the shared cost cache themselves (one DuckDB file,
locked per call: :mod:`relsat.extract.cost_cache`).

What goes into OUTDIR:

- ``<name>.onnx`` the optimized model (with ``<name>.onnx.data`` when its tensors are stored
  externally), ``<name>.json`` its report and, with ``keep_db``, ``<name>.duckdb`` its e-graph.
  A worker never writes a file of OUTDIR under its final name: it writes them into its own hidden
  stage folder ``OUTDIR/.<name>.stage-<pid>/`` (``.stage-ray<N>`` for a Ray task) and names that
  folder in its "done" message.  The parent then commits the model: it renames the staged files
  into place, hashes them (SHA-256) and only then writes the model's row, with the hashes
  (``output_sha256``: the ``.onnx`` file and its external data; ``report_sha256``; ``db_sha256``
  with ``keep_db``).  When a model fails,
  the files of any earlier success of that name are removed.
- ``results.duckdb``, table ``results``: one row per model name (its latest attempt), written
  by this process only, after every model (a batch that is interrupted keeps what it did).
  It is opened only for each write, so ``relsat query OUTDIR/results.duckdb`` works while a
  batch runs.
- ``results.csv`` (LF line ends) and ``summary.md``: the rows of the models of this run, rewritten
  atomically at the end (also after Ctrl-C).

Whose files: a batch writes (or removes) only files that a batch wrote.  Every file of OUTDIR it is
about to write is recorded by name in ``results.duckdb``'s ``batch_files`` table before it is first
written (a name is dropped once its file is gone, at the start and the end of a run), and a table
written by a relsat that kept none owns the files its rows name and the CSV and summary.  Before
anything is written, a file at a path this run would write (the files of each model to optimize,
the CSV and the summary) that is not recorded, and a ``results.duckdb`` that is not a batch's
results table (a user's DuckDB database), is refused with one line naming them; ``force``
replaces them and says so (on the console and in the summary).  A folder at such a path is
refused either way.  A refused run leaves OUTDIR as it was.  With measured costs the cost cache is
checked first too: it may not be a model or a file the batch writes, and must be a cost cache
(:mod:`relsat.extract.cost_cache`).

Killing the batch (local executor; for Ray see :mod:`relsat.driver.app.batch_ray`): the workers die
with it, however it ends (SIGKILL included).  On Linux each worker asks the kernel for SIGKILL when
its parent exits (``prctl(PR_SET_PDEATHSIG)``, then a ``getppid`` check for a parent that died
before the call); elsewhere, or should that fail, a watchdog thread in the worker exits it within
about half a second of the parent's pid changing or its end of the pipe closing.  (The death signal
follows the parent *thread* that started the worker: ``run_batch`` starts, waits for and joins its
workers in the thread that called it, so that thread outlives them.)  A killed batch leaves at most
stage folders and, if it died inside a commit, files that do not match their row; the next run
removes the former and redoes the latter.

Resume: a model is skipped when the table holds an ``ok`` row with the same model-file hash
(SHA-256 of the ``.onnx`` file and of any external-data files it names) and the same options
hash (SHA-256 of the optimize options, the content of every rule file used, and the relsat
version), and its files in OUTDIR still have the hashes recorded in that row (with ``keep_db``
the e-graph too).  Otherwise it is optimized again; when only its files disagree the summary's
*this run* says why: ``redone (files changed)``, ``redone (files missing)``, ``redone (no e-graph
kept)`` (``keep_db`` now, not then), or ``redone (no file hashes recorded)`` for a row written by
a relsat that recorded none.  Failed models are
attempted again (a time-out or a crash may not recur; a fixed environment may help);
``skip_failed`` skips them too when their key is unchanged, and ``force`` reruns everything (and
replaces files of OUTDIR no batch wrote, above).
``jobs``, ``model_timeout``, ``keep_db`` and the executor are not part of the options hash (but
without a thread count given, ``jobs`` sets each worker's, :func:`worker_threads`, which is), so a
batch started with one executor resumes with the other.

Names: a model's name is its path relative to the folder (or, for a glob, to the common
folder of the matches) without ``.onnx``, with ``/`` replaced by ``__``.  Files under OUTDIR
and hidden files are never taken as inputs.

One batch at a time may use an OUTDIR (``OUTDIR/.batch.lock``, an advisory ``flock``).

Workers are spawned, so a script that calls ``run_batch`` must guard its top level with
``if __name__ == "__main__":`` (the spawned interpreter imports the main module).
"""

from __future__ import annotations

import csv
import datetime as dt
import fcntl
import glob as globlib
import hashlib
import io
import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait as wait_conns
from pathlib import Path
from typing import Callable

from relsat.driver.app.batch_ray import DEFAULT_CONNECT_TIMEOUT_S
from relsat.driver.app.batch_model import BATCH_FILES, COLUMN_NAMES, RESULTS_DB, BatchResult, ModelTask, NotOurs, Recorder, Results, model_fields, model_files, output_hashes, read_results, remove_temps, sha256_file, stage_dir, timeout_reason
from relsat.driver.errors import RelsatError
from relsat.driver.options import DEFAULTS, Options, all_cores
from relsat.driver.boundary.outputs import write_text_atomic

RESERVED = {"results", "summary"}
DEFAULT_MODEL_TIMEOUT_S = 900.0
EXECUTORS = ("local", "ray")


def worker_threads(jobs: int) -> int:
    """The default intra-op threads of each of ``jobs`` workers: the cores shared among them,
    ``max(1, cores // jobs)`` (``run_batch`` refuses ``jobs`` < 1)."""
    return max(1, all_cores() // max(1, jobs))


# ---------------------------------------------------------------- inputs, names, hashes


def find_models(spec: str | os.PathLike, outdir: Path | None = None) -> list[ModelTask]:
    """The models a DIR_OR_GLOB names: every ``*.onnx`` file under a folder (recursively), or the
    files a glob matches (``**`` recurses); files under ``outdir`` and hidden files left out."""
    spec = str(spec)
    out_root = outdir.resolve() if outdir is not None else None
    p = Path(spec).expanduser()
    if p.is_dir():
        base = p.resolve()
        files = [f for f in base.rglob("*.onnx") if f.is_file()
                 and not any(part.startswith(".") for part in f.relative_to(base).parts)]
    elif p.is_file():
        files = [p.resolve()]
        base = files[0].parent
    else:
        if not globlib.has_magic(spec):
            raise RelsatError(f"{spec}: no such folder or file")
        files = [Path(f).resolve() for f in globlib.glob(os.path.expanduser(spec), recursive=True)]
        files = [f for f in files if f.is_file() and not f.name.startswith(".")]
        base = Path(os.path.commonpath([f.parent for f in files])) if files else None
    if out_root is not None:
        files = [f for f in files if out_root != f.parent and out_root not in f.parents]
    if not files:
        raise RelsatError(f"{spec}: no .onnx models found" + (" (outside the output folder)" if out_root else ""))
    files = sorted(set(files))
    tasks, seen = [], set()
    for f in files:
        rel = f.relative_to(base)
        stem = rel.with_suffix("") if rel.suffix.lower() == ".onnx" else rel
        name = "__".join(stem.parts)
        if name in RESERVED:
            name += "_model"
        while name.lower() in seen:  # case-insensitive file systems
            name += "_"
        seen.add(name.lower())
        tasks.append(ModelTask(name, f))
    return tasks


def model_hash(path: Path) -> str:
    """SHA-256 of the model file and, in order, of the external-data files it names (a file that
    does not parse as ONNX is hashed as bytes: it will fail, and a changed file is a new key)."""
    h = sha256_file(path)
    try:
        import onnx

        m = onnx.load_model(str(path), load_external_data=False)
        locations = []
        for t in _all_tensors(m):
            if t.data_location == onnx.TensorProto.EXTERNAL:
                loc = {e.key: e.value for e in t.external_data}.get("location")
                if loc and loc not in locations:
                    locations.append(loc)
        for loc in locations:
            target = path.parent / loc
            h.update(b"\0external:" + loc.encode())
            if target.is_file():
                sha256_file(target, h)
    except Exception:
        pass
    return h.hexdigest()


def _all_tensors(model):
    from onnx import GraphProto

    def graphs(g: GraphProto):
        yield g
        for n in g.node:
            for a in n.attribute:
                if a.g.ByteSize():
                    yield from graphs(a.g)
                for sub in a.graphs:
                    yield from graphs(sub)

    for g in graphs(model.graph):
        yield from g.initializer
        for n in g.node:
            for a in n.attribute:
                if a.t.ByteSize():
                    yield a.t
                yield from a.tensors


def resolve_options(opts: Options) -> tuple[dict, dict, str]:
    """Check the optimize options once, before any worker starts, and return
    ``(worker options, options as recorded, options hash)``.  Rule set names become absolute
    file paths (workers do not depend on the current folder) and the hash covers the content of
    every rule file a set reads (includes too), so editing one invalidates earlier results.  User
    rule files are verified here, once (``check_rules``; an unsound rule stops the batch before any
    model runs), and the workers do not verify them again."""
    from relsat.programs.rulesets import rule_sources

    from relsat.driver.app.phases import resolve_rules
    from relsat.driver.version import __version__

    opts.check()
    if opts.costs is not None:
        opts = opts.replace(costs=str(Path(opts.costs).expanduser().resolve()))
    files, _ = resolve_rules(opts.rules, check=opts.check_rules)
    worker = opts.replace(rules=tuple(str(f.resolve()) for f in files), check_rules=False).as_dict()
    recorded = {k: list(v) if isinstance(v, tuple) else v for k, v in opts.as_dict().items() if k != "check_rules"}
    keyed = dict(recorded, relsat=__version__,
                 rules=[[name, [sha256_file(src).hexdigest() for src in rule_sources([str(f)])]]
                        for name, f in zip(opts.rules, files)])  # included files too
    digest = hashlib.sha256(json.dumps(keyed, sort_keys=True, default=str).encode()).hexdigest()
    return worker, recorded, digest


def _files_disagree(outdir: Path, prev: dict, keep_db: bool) -> str | None:
    """Why the files of a model done earlier do not match its row (None when they do)."""
    keys = ["output_sha256", "report_sha256"] + (["db_sha256"] if keep_db else [])
    if keep_db and not prev.get("db"):
        return "no e-graph kept"
    if any(not prev.get(k) for k in keys):
        return "no file hashes recorded"  # a row written by an older relsat
    now = output_hashes(outdir, prev["model"], keep_db)
    if any(now[k] is None for k in keys):
        return "files missing"
    if any(now[k] != prev[k] for k in keys):
        return "files changed"
    return None


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _die_with_parent(parent_pid: int, conn) -> None:
    """Make this worker die with the batch process, however that ends (SIGKILL included), so no
    worker outlives it.  On Linux the kernel sends SIGKILL to the worker when its parent exits
    (``PR_SET_PDEATHSIG``; strictly, when the parent *thread* that started it exits: the batch
    starts, waits for and joins its workers in one thread, so that thread outlives them).  The
    signal is not sent when the parent died before the call, hence the ``getppid`` check after
    it.  Elsewhere, and should ``prctl`` fail, a watchdog thread does the same, later."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), ctypes.c_ulong(0),
                       ctypes.c_ulong(0), ctypes.c_ulong(0))
        except Exception:
            pass  # the watchdog below still applies
    if os.getppid() != parent_pid:
        os._exit(3)
    _start_parent_watchdog(parent_pid, conn)


def _start_parent_watchdog(parent_pid: int, conn) -> None:
    """The portable fallback: a daemon thread that exits the process (``os._exit``) when its
    parent's pid changes (it was reparented) or the parent's end of the pipe ``conn`` writes to
    is closed.  It polls every 0.5 s and needs the GIL, so it can lag behind a long call into C
    code that holds it."""
    try:
        fd = os.dup(conn.fileno())  # the watchdog's own copy: the worker closes conn at its end
    except (OSError, ValueError, AttributeError):
        fd = None
    threading.Thread(target=_watch_parent, args=(parent_pid, fd), name="relsat-batch-parent-watch",
                     daemon=True).start()


def _watch_parent(parent_pid: int, fd: int | None) -> None:
    import select

    poller = None
    if fd is not None and hasattr(select, "poll"):
        poller = select.poll()  # the write end of a pipe reports POLLERR once the reader is gone
        poller.register(fd, select.POLLERR | select.POLLHUP)
    while True:
        if poller is not None:
            if poller.poll(500):
                os._exit(3)
        else:
            time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(3)


def _worker(conn, task: ModelTask, outdir: Path, options: dict, keep_db: bool, parent_pid: int) -> None:
    """Local executor, child process: optimize one model into a stage folder, send ("status", text)
    messages while it runs and one ("done", fields, stage folder) message at the end
    (:func:`~relsat.driver.app.batch_model.model_fields`).  A worker never writes a file of OUTDIR under its final name."""
    _die_with_parent(parent_pid, conn)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    stage = stage_dir(outdir, task.name, os.getpid())

    def send(*msg):
        try:
            conn.send(msg)
        except Exception:
            pass

    def on_round(it):
        send("status", f"saturating: round {getattr(it, 'round', '?')}, {getattr(it, 'enodes', '?')} e-nodes")

    fields = model_fields(task, outdir, options, keep_db, stage, on_round=on_round,
                          on_status=lambda text: send("status", str(text)))
    conn.send(("done", fields, str(stage)))
    conn.close()


def _fmt(v, spec="") -> str:
    if v is None:
        return ""
    return format(v, spec) if spec else str(v)


def write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")  # LF, as every other file relsat writes
    cols = COLUMN_NAMES + ["this_run"]
    w.writerow(cols)
    for r in rows:
        w.writerow([_fmt(r.get(c)) for c in cols])
    write_text_atomic(path, buf.getvalue())


def write_summary(path: Path, result: BatchResult, spec: str, recorded_options: dict) -> None:
    rows = result.rows

    def cell(text) -> str:
        return _fmt(text).replace("|", "\\|")

    lines = [
        "# relsat batch",
        "",
        f"- input: `{spec}`",
        f"- finished: {dt.datetime.now().isoformat(timespec='seconds')}, {result.seconds:.1f} s",
        f"- options: `{json.dumps(recorded_options, sort_keys=True, default=str)}`",
        f"- models: {len(rows)}; optimized now {sum(r['this_run'] == 'optimized' for r in rows)}, "
        f"redone (files did not match their rows) {sum(r['this_run'].startswith('redone') for r in rows)}, "
        f"done earlier and skipped {sum(r['this_run'].startswith('skipped') for r in rows)}, "
        f"failed {result.failed}" + (" (interrupted)" if result.interrupted else ""),
        *([f"- replaced (--force; not written by relsat batch): {', '.join(result.replaced)}"] if result.replaced
          else []),
        "- speedup = before / after: from measured latencies when the report has them, else the "
        "ratio of predicted model costs (column *from*); *written* = original when the latency guard "
        "found the optimized graph not faster and wrote the original graph, simplified when it wrote a graph "
        "that ONNX Runtime runs with fewer kernels and no more work, not faster beyond noise",
        "",
        "| model | status | speedup | from | written | optimizer s | e-nodes | e-classes | nodes in -> out "
        "| rules applied most | this run | reason |",
        "|---|---|---:|---|---|---:|---:|---:|---|---|---|---|",
    ]
    for r in rows:
        nodes = f"{r['nodes_in']} -> {r['nodes_out']}" if r.get("nodes_in") is not None else ""
        lines.append("| " + " | ".join(cell(x) for x in [
            r["model"], r["status"], _fmt(r.get("speedup"), ".3f"), r.get("speedup_source"), r.get("written"),
            _fmt(r.get("optimizer_s"), ".2f"), r.get("enodes"), r.get("eclasses"), nodes,
            r.get("top_rules"), r["this_run"], r.get("reason")]) + " |")
    write_text_atomic(path, "\n".join(lines) + "\n")


def _lock_outdir(outdir: Path):
    fh = open(outdir / ".batch.lock", "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.close()
        raise RelsatError(f"{outdir}: another relsat batch is writing to this folder") from None
    return fh


def run_batch(spec, outdir, options: Options | None = None, *, jobs: int = 1,
              model_timeout: float | None = DEFAULT_MODEL_TIMEOUT_S,
              keep_db: bool = False, skip_failed: bool = False, force: bool = False,
              executor: str = "local", address: str | None = None,
              connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S, console=None, on_result: Callable[[dict], None] | None = None,
              **overrides) -> BatchResult:
    """Optimize every model ``spec`` names into ``outdir``; see the module docstring.

    ``options`` (an ``Options``; default ``DEFAULTS``) with keyword ``overrides`` of its fields
    (``node_limit=500``) go to every model's :func:`relsat.driver.app.optimize.optimize`.  A thread
    count given (in ``options`` or as ``threads=``) is each worker's; without ``options`` and a
    ``threads`` override the workers share the cores (:func:`worker_threads`).  A rich
    progress bar is drawn on ``console`` when one is given.  ``model_timeout`` (seconds, None
    or 0 for none) is a wall-clock limit per model, process start included.  ``executor`` is
    ``local`` (worker processes here) or ``ray`` (a Ray task per model, :mod:`relsat.driver.app.batch_ray`,
    on the Ray instance at ``address``; None starts or joins a local one; an address that does not
    answer within ``connect_timeout`` seconds is an error).
    Raises RelsatError for problems with the batch itself (no models, bad options, OUTDIR in
    use, Ray missing or unreachable); a model's failure is a row with status ``failed``."""
    t0 = time.perf_counter()
    if executor not in EXECUTORS:
        raise RelsatError(f"--executor {executor}: expected one of {', '.join(EXECUTORS)}")
    if address is not None and executor != "ray":
        raise RelsatError(f"--address {address}: only with --executor ray")
    if jobs < 1:
        raise RelsatError(f"--jobs {jobs}: expected 1 or more")
    if model_timeout is not None and model_timeout < 0:
        raise RelsatError(f"--model-timeout {model_timeout}: expected seconds >= 0 (0: no limit)")
    if not connect_timeout > 0:
        raise RelsatError(f"--connect-timeout {connect_timeout}: expected seconds > 0")
    if executor == "ray":
        from relsat.driver.app.batch_ray import check_address, require_ray

        require_ray()  # before any work: a missing extra is a one-line error
        check_address(address, connect_timeout)  # and so is an address that does not answer
    outdir = Path(outdir).expanduser().resolve()
    if outdir.exists() and not outdir.is_dir():
        raise RelsatError(f"{outdir}: exists and is not a folder")
    tasks = find_models(spec, outdir)
    try:
        opts = (options or DEFAULTS.replace(threads=worker_threads(jobs))).replace(**overrides)
    except TypeError as e:
        raise RelsatError(f"batch: {e}") from None
    worker_options, recorded, options_hash = resolve_options(opts)
    check_cost_cache(opts, tasks, outdir)
    made = not outdir.exists()
    outdir.mkdir(parents=True, exist_ok=True)
    lock_existed = os.path.lexists(outdir / ".batch.lock")
    lock = _lock_outdir(outdir)
    refused = True
    try:
        foreign: list[str] = []  # files at paths this run writes that no batch wrote
        try:
            previous, owned = read_results(outdir / RESULTS_DB)
        except NotOurs as e:
            previous, owned = {}, set()
            foreign.append(f"{RESULTS_DB} ({e})")
        common = {"options_sha256": options_hash, "options": json.dumps(recorded, sort_keys=True, default=str)}
        rows: dict[str, dict] = {}
        todo: deque[ModelTask] = deque()
        for task in tasks:
            task.file_sha256 = model_hash(task.path)
            prev = previous.get(task.name)
            same = (prev is not None and prev["file_sha256"] == task.file_sha256
                    and prev["options_sha256"] == options_hash and not force)
            if same and prev["status"] == "ok":
                task.redo = _files_disagree(outdir, prev, keep_db) or ""
                if not task.redo:
                    rows[task.name] = dict(prev, this_run="skipped (done)")
                    continue
                if console is not None:
                    console.print(f"[yellow]redo[/yellow] {task.name}: {task.redo} since its row in "
                                  f"results.duckdb was written", highlight=False)
            elif same and prev["status"] == "failed" and skip_failed:
                rows[task.name] = dict(prev, this_run="skipped (failed before)")
                continue
            todo.append(task)
        targets = [n for t in todo for n in model_files(t.name)] + list(BATCH_FILES)
        foreign += [n for n in targets if os.path.lexists(outdir / n) and n not in owned]
        replaced = _refuse_or_replace(outdir, foreign, force, console)
        for task in tasks:
            remove_temps(outdir, task.name)  # what a killed batch or worker left
        results = Results(outdir / RESULTS_DB)
        results.own(owned | set(targets))  # recorded before any of them is written
        refused = False
        result = BatchResult(outdir, [], skipped=len(rows), replaced=replaced)
        try:
            with _executor(executor, address, connect_timeout, todo) as schedule:
                rec = Recorder(outdir, keep_db, common, results, rows, result, on_result, console, len(todo))
                try:
                    schedule(todo, rec, worker_options, jobs, model_timeout or None)
                finally:
                    rec.close()
        except KeyboardInterrupt:
            result.interrupted = True
        result.rows = [rows[t.name] for t in sorted(tasks, key=lambda t: t.name) if t.name in rows]
        result.failed = sum(r["status"] == "failed" for r in result.rows)
        result.seconds = time.perf_counter() - t0
        write_csv(outdir / "results.csv", result.rows)
        write_summary(outdir / "summary.md", result, str(spec), recorded)
        results.own()  # files removed this run (a failed model's) are no longer the batch's
        return result
    finally:
        if refused and not lock_existed:  # nothing of this run left in a folder it would not write
            (outdir / ".batch.lock").unlink(missing_ok=True)
            if made:
                try:
                    outdir.rmdir()
                except OSError:
                    pass
        lock.close()


def _refuse_or_replace(outdir: Path, foreign: list[str], force: bool, console) -> list[str]:
    """Refuse the files at paths the batch writes that no batch wrote (one line naming them), or with
    ``force`` say that they are replaced (a foreign results table is removed now, the others are
    replaced as the batch writes them); a folder at such a path is refused either way."""
    if not foreign:
        return []
    names = [f.split(" (", 1)[0] for f in foreign]
    folders = [n for n in names if (outdir / n).is_dir() and not (outdir / n).is_symlink()]
    if folders:
        raise RelsatError(f"{outdir}: {_some(folders)}: a folder where relsat batch writes a file; move it "
                          f"or choose another output folder")
    if not force:
        raise RelsatError(f"{outdir}: {_some(foreign)} already there, not written by relsat batch; remove "
                          f"{'it' if len(foreign) == 1 else 'them'}, choose another output folder, or pass "
                          f"--force to replace {'it' if len(foreign) == 1 else 'them'}")
    if console is not None:
        console.print(f"[yellow]--force:[/yellow] replacing {_some(names, 20)} in {outdir} "
                      f"(not written by relsat batch)", highlight=False, soft_wrap=True)
    if RESULTS_DB in names:
        for p in (outdir / RESULTS_DB, outdir / f"{RESULTS_DB}.wal"):
            p.unlink(missing_ok=True)
    return names


def _some(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def check_cost_cache(opts: Options, tasks: list[ModelTask], outdir: Path) -> None:
    """With measured costs, refuse a cost cache (``$RELSAT_COST_CACHE`` or the user cache) that is
    one of the models or a file the batch writes in OUTDIR, or that is not a relsat cost cache
    (:class:`relsat.extract.cost_cache.CostCache` refuses it), before any model runs."""
    if opts.cost_model != "measured":
        return
    from relsat.extract.cost_cache import default_path

    from relsat.driver.boundary.outputs import _same, open_cost_cache

    where = default_path()
    for task in tasks:
        if _same(where, task.path):
            raise RelsatError(f"cost cache {where}: is the input model {task.path}; relsat never writes it "
                              f"(set RELSAT_COST_CACHE to another file)")
    mine = [RESULTS_DB, *BATCH_FILES, ".batch.lock"] + [n for t in tasks for n in model_files(t.name)]
    if any(_same(where, outdir / n) for n in mine):
        raise RelsatError(f"cost cache {where}: is a file relsat batch writes in {outdir}; set RELSAT_COST_CACHE "
                          f"to a file outside it")
    open_cost_cache(where)


@contextmanager
def _executor(executor: str, address: str | None, connect_timeout: float, todo):
    """The function that runs ``todo``: the local executor's, or, when there is something to run,
    the Ray executor's, connected to Ray before any progress is drawn and disconnected after."""
    if executor == "ray" and todo:
        from relsat.driver.app.batch_ray import ray_executor

        with ray_executor(address, connect_timeout) as schedule:
            yield schedule
    else:
        yield _schedule_local


# ---------------------------------------------------------------- the local executor


@dataclass
class _Running:
    task: ModelTask
    proc: object
    conn: object
    started: float
    deadline: float | None


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"signal {-code}"
        hint = " (out of memory?)" if -code == signal.SIGKILL else ""
        return f"worker process died: killed by {sig}{hint}"
    return f"worker process exited with status {code} before reporting"


def _schedule_local(todo: deque[ModelTask], rec: Recorder, options: dict, jobs: int,
                    model_timeout: float | None) -> None:
    """Run ``todo`` in at most ``jobs`` spawned worker processes (:func:`_worker`), one per model."""
    ctx = mp.get_context("spawn")
    outdir, keep_db = rec.outdir, rec.keep_db
    running: dict[object, _Running] = {}

    def stop(run: _Running) -> None:
        if run.proc.is_alive():
            run.proc.kill()
        run.proc.join()
        run.conn.close()
        del running[run.conn]

    try:
        while todo or running:
            while todo and len(running) < jobs:
                task = todo.popleft()
                parent_end, child_end = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_worker, args=(child_end, task, outdir, options, keep_db, os.getpid()),
                                   name=f"relsat-batch-{task.name}")
                now = time.monotonic()
                proc.start()
                child_end.close()
                running[parent_end] = _Running(task, proc, parent_end, now,
                                               now + model_timeout if model_timeout else None)
                rec.status(task, "starting")
            deadlines = [r.deadline for r in running.values() if r.deadline is not None]
            wait_s = 0.5 if not deadlines else max(0.0, min(0.5, min(deadlines) - time.monotonic()))
            for conn in wait_conns(list(running), timeout=wait_s):
                run = running[conn]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    stop(run)
                    rec.finish(run.task, {"status": "failed", "reason": _exit_reason(run.proc.exitcode),
                                          "wall_s": time.monotonic() - run.started})
                    continue
                if msg[0] == "status":
                    rec.status(run.task, msg[1])
                elif msg[0] == "done":
                    run.proc.join(10)
                    stop(run)
                    rec.finish(run.task, msg[1], msg[2] if len(msg) > 2 else None,
                               stage_dir(outdir, run.task.name, run.proc.pid))
            now = time.monotonic()
            for run in [r for r in running.values() if r.deadline is not None and now >= r.deadline]:
                stop(run)
                rec.finish(run.task, {"status": "failed", "wall_s": now - run.started,
                                      "reason": timeout_reason(model_timeout)})
    finally:
        for run in list(running.values()):  # Ctrl-C or an error here: no orphans, no half files
            stop(run)
            remove_temps(outdir, run.task.name)  # files of an earlier result still match its row
