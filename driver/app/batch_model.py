"""One model of a ``relsat batch``, from its run to its row, whatever the executor runs it.

Owns the results table (its columns and ``OUTDIR/results.duckdb``, with the ``batch_files`` table
of the files of OUTDIR the batch wrote: :func:`read_results`, :class:`Results`), a model's files in
OUTDIR and its stage folder, the worker side (:func:`model_fields`: optimize one model into its stage folder
and return the fields of its row) and the parent side (:class:`Recorder`: commit the staged files,
hash them and write the row).  :mod:`relsat.driver.app.batch` (the batch, resume and the local executor)
and :mod:`relsat.driver.app.batch_ray` (the Ray executor) both build on it; see
:mod:`relsat.driver.app.batch` for what goes into OUTDIR and why.
"""

from __future__ import annotations

import datetime as dt
import glob as globlib
import hashlib
import json
import os
import re
import shutil
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from relsat.extract.cost_cache import table_columns

from relsat.driver.errors import RelsatError, resource_error
from relsat.driver.options import Options


# the results table: (column, DuckDB type); the order is the CSV's
COLUMNS = [
    ("model", "VARCHAR PRIMARY KEY"),
    ("status", "VARCHAR"),  # ok | failed
    ("reason", "VARCHAR"),  # one line, for failures
    ("speedup", "DOUBLE"),  # before / after (> 1 is faster)
    ("speedup_source", "VARCHAR"),  # measured latency | predicted cost (<cost model>)
    ("latency_before_ms", "DOUBLE"),
    ("latency_after_ms", "DOUBLE"),
    ("cost_before", "DOUBLE"),
    ("cost_after", "DOUBLE"),
    ("cost_model", "VARCHAR"),
    ("written", "VARCHAR"),  # optimized | simplified (does less, not faster beyond noise) | original (the latency
    # guard kept the original graph)
    ("optimizer_s", "DOUBLE"),  # the pipeline's phases summed (import .. verify)
    ("wall_s", "DOUBLE"),  # the worker from start to end, process start included
    ("enodes", "BIGINT"),
    ("eclasses", "BIGINT"),
    ("rounds", "INTEGER"),
    ("stop_reason", "VARCHAR"),
    ("nodes_in", "INTEGER"),
    ("nodes_out", "INTEGER"),
    ("top_rules", "VARCHAR"),  # the rules applied most: "name xN, ..."
    ("rules_applied", "JSON"),
    ("max_abs_err", "DOUBLE"),
    ("path", "VARCHAR"),
    ("file_sha256", "VARCHAR"),
    ("options_sha256", "VARCHAR"),
    ("options", "JSON"),
    ("output", "VARCHAR"),
    ("report", "VARCHAR"),
    ("db", "VARCHAR"),
    ("output_sha256", "VARCHAR"),  # SHA-256 of the files as committed (output: with its external data)
    ("report_sha256", "VARCHAR"),
    ("db_sha256", "VARCHAR"),
    ("phases_s", "JSON"),
    ("detail", "VARCHAR"),  # traceback of an unexpected error
    ("finished_at", "TIMESTAMP"),
]


COLUMN_NAMES = [c for c, _ in COLUMNS]


@dataclass
class ModelTask:
    name: str
    path: Path
    file_sha256: str = ""
    redo: str = ""  # why a model done earlier is optimized again (its files do not match its row)


@dataclass
class BatchResult:
    outdir: Path
    rows: list[dict]  # one per model of this run, sorted by name, with "this_run" added
    ran: int = 0
    skipped: int = 0
    failed: int = 0  # rows of this run whose status is failed (skipped ones included)
    seconds: float = 0.0
    interrupted: bool = False
    costs_merged: int = 0  # cost rows the Ray workers measured, merged into the cost cache here
    replaced: list[str] = field(default_factory=list)  # files of OUTDIR not the batch's, replaced (force)

    @property
    def ok(self) -> bool:
        return self.failed == 0 and not self.interrupted


# ---------------------------------------------------------------- a model's files


def sha256_file(path: Path, h=None):
    h = h or hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h


def _outputs(outdir: Path, name: str) -> dict[str, Path]:
    return {"output": outdir / f"{name}.onnx", "report": outdir / f"{name}.json", "db": outdir / f"{name}.duckdb"}


def _companions(outdir: Path, name: str) -> dict[str, Path]:
    """The files that go with the outputs: an external-data model's tensors (``save_model_atomic``
    writes them to ``<name>.onnx.data``) and an e-graph's WAL."""
    return {"output": outdir / f"{name}.onnx.data", "db": outdir / f"{name}.duckdb.wal"}


def stage_dir(outdir: Path, name: str, tag: int | str) -> Path:
    """The folder a worker writes a model's files to: hidden, one per attempt (``tag``: the local
    worker's pid, or the number the Ray executor gives the task)."""
    return outdir / f".{name}.stage-{tag}"


_TEMPS = ((".stage-*", r"\.stage-(\d+|ray\d+)", True), (".onnx.*", r"\.onnx\.(\d+\.)?\w+", True),
          (".json.*.tmp", r"\.json\.\d+\.tmp", False), (".duckdb.tmp-*", r"\.duckdb\.tmp-\d+(\.wal)?", False))


def _temp_paths(outdir: Path, name: str) -> list[Path]:
    """Temporary files and folders of a model: worker stage folders, and what older relsat
    versions and ``save_model_atomic`` leave when killed (folders for folders, files for files,
    named exactly as relsat names them, so a user's hidden ``.NAME.onnx.swp`` is not one)."""
    stem = globlib.escape(str(outdir / f".{name}"))
    paths = []
    for pattern, regex, folder in _TEMPS:
        full = re.compile(re.escape(f".{name}") + regex)
        paths += [Path(p) for p in globlib.glob(stem + pattern)
                  if full.fullmatch(Path(p).name) and Path(p).is_dir() == folder and not Path(p).is_symlink()]
    return paths


def _remove_paths(paths) -> None:
    for p in paths:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def remove_temps(outdir: Path, name: str) -> None:
    _remove_paths(_temp_paths(outdir, name))


def remove_outputs(outdir: Path, name: str) -> None:
    """Remove a model's outputs and any temporary files a killed worker left."""
    _remove_paths([*_outputs(outdir, name).values(), *_companions(outdir, name).values(),
                   *_temp_paths(outdir, name)])


def _hash_with_companion(path: Path, companion: Path) -> str:
    h = sha256_file(path)
    if companion.is_file():
        h.update(b"\0companion:" + companion.name.encode())
        sha256_file(companion, h)
    return h.hexdigest()


def output_hashes(outdir: Path, name: str, keep_db: bool) -> dict[str, str | None]:
    """SHA-256 of a model's files in OUTDIR as the results table records them: ``output_sha256``
    (the ``.onnx`` file and its external data), ``report_sha256`` (the ``.json``) and, with
    ``keep_db``, ``db_sha256`` (the e-graph and its WAL).  A missing file hashes to None."""
    outs, comp = _outputs(outdir, name), _companions(outdir, name)
    return {
        "output_sha256": _hash_with_companion(outs["output"], comp["output"]) if outs["output"].is_file() else None,
        "report_sha256": sha256_file(outs["report"]).hexdigest() if outs["report"].is_file() else None,
        "db_sha256": (_hash_with_companion(outs["db"], comp["db"]) if outs["db"].is_file() else None)
        if keep_db else None,
    }


def commit(outdir: Path, name: str, stage: Path, keep_db: bool) -> dict:
    """Parent side: move a worker's files from its stage folder into OUTDIR (stale companions of
    an earlier result removed) and return the row fields naming and hashing them.  The caller
    writes the row after this: a parent killed in between leaves files that do not match the
    row, and the next run redoes the model."""
    outs, comp = _outputs(outdir, name), _companions(outdir, name)
    if not (stage / outs["output"].name).is_file() or not (stage / outs["report"].name).is_file():
        raise RelsatError(f"internal error: the worker reported success but left no {outs['output'].name} "
                          f"and {outs['report'].name} in {stage.name}")
    if keep_db and not (stage / outs["db"].name).is_file():
        raise RelsatError(f"internal error: the worker left no e-graph {outs['db'].name} in {stage.name}")
    moves = [outs["output"], comp["output"], outs["report"]] + ([outs["db"], comp["db"]] if keep_db else [])
    for final in moves:
        staged = stage / final.name
        if staged.is_file():
            os.replace(staged, final)
        else:  # a companion the new result does not have
            final.unlink(missing_ok=True)
    if not keep_db:  # an e-graph of an earlier attempt no longer goes with these files
        _remove_paths([outs["db"], comp["db"]])
    shutil.rmtree(stage, ignore_errors=True)
    return dict(output_hashes(outdir, name, keep_db), output=str(outs["output"]), report=str(outs["report"]),
                db=str(outs["db"]) if keep_db else None)


# ---------------------------------------------------------------- the worker side


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _latencies(rep: dict) -> tuple[float | None, float | None]:
    """Measured latencies (ms) before and after, from the report, when it has them."""
    def num(v):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    for before_key, after_key in (("latency_before_ms", "latency_after_ms"), ("latency_before", "latency_after")):
        if num(rep.get(before_key)) and num(rep.get(after_key)):
            return num(rep[before_key]), num(rep[after_key])
    for key in ("latency", "latency_ms", "measured", "measurement"):
        sub = rep.get(key)
        if isinstance(sub, dict):
            for b, a in (("before_ms", "after_ms"), ("original_ms", "optimized_ms"), ("before", "after"),
                         ("original", "optimized")):
                if num(sub.get(b)) and num(sub.get(a)):
                    return num(sub[b]), num(sub[a])
    return None, None


def row_from_report(rep: dict) -> dict:
    """The results-table fields one optimize report gives."""
    before, after = _latencies(rep)
    cost_model = rep.get("cost_model")
    if before and after:
        speedup, source = before / after, "measured latency"
    elif (pr := rep.get("predicted") or {}).get("input") and pr.get("extracted"):
        # the input priced before saturation against the extracted graph, under the one cost table
        speedup, source = pr["input"] / pr["extracted"], f"predicted cost ({cost_model})"
    elif rep.get("cost_before") and rep.get("cost_after"):
        speedup, source = rep["cost_before"] / rep["cost_after"], f"predicted cost ({cost_model})"
    else:
        speedup, source = None, None
    applied = rep.get("rules_applied") or {}
    top = sorted(((k, v) for k, v in applied.items() if v), key=lambda kv: -kv[1])[:3]
    phases = rep.get("phases_s") or {}
    return {
        "speedup": speedup, "speedup_source": source, "latency_before_ms": before, "latency_after_ms": after,
        "cost_before": rep.get("cost_before"), "cost_after": rep.get("cost_after"), "cost_model": cost_model,
        "written": "simplified" if (rep.get("measured") or {}).get("simplified") else rep.get("written", "optimized"),
        "optimizer_s": float(sum(phases.values())) if phases else None,
        "enodes": rep.get("enodes"), "eclasses": rep.get("eclasses"),
        "rounds": len(rep.get("iterations") or []), "stop_reason": rep.get("stop_reason"),
        "nodes_in": rep.get("nodes_in"), "nodes_out": rep.get("nodes_out"),
        "top_rules": ", ".join(f"{k} x{v}" for k, v in top), "rules_applied": json.dumps(applied),
        "max_abs_err": (rep.get("verification") or {}).get("max_abs_err"), "phases_s": json.dumps(phases),
    }


def _optimize_one(task: ModelTask, stage: Path, outdir: Path, options: dict, keep_db: bool, on_round,
                  on_status, cost_cache) -> dict:
    """Optimize one model, writing its files under their final names into ``stage`` only (the
    parent moves them into ``outdir``); return the row fields of its report."""
    from relsat.driver.app.optimize import optimize

    shutil.rmtree(stage, ignore_errors=True)  # a stale one of an earlier process with this pid
    stage.mkdir()
    outs = _outputs(outdir, task.name)
    staged = {k: stage / p.name for k, p in outs.items()}
    # the final file names inside the stage folder: an external-data model names its data file
    # after the model file, so it stays valid once both are moved into OUTDIR
    result = optimize(task.path, Options(**options), output=staged["output"],
                      db=staged["db"] if keep_db else None, on_round=on_round, on_status=on_status,
                      cost_cache=cost_cache)
    rep = result.report.as_dict()
    rep.update(input=str(task.path), output=str(outs["output"]), model=task.name, file_sha256=task.file_sha256)
    staged["report"].write_text(json.dumps(rep, indent=2, default=str))
    return row_from_report(rep)


def model_fields(task: ModelTask, outdir: Path, options: dict, keep_db: bool, stage: Path, *,
                 on_round=None, on_status=None, cost_cache=None) -> dict:
    """Worker side, whatever the executor: optimize one model into ``stage`` and return the fields
    of its row: ``status`` ok (with the report's fields) or failed (with a one-line ``reason``, and
    the traceback as ``detail`` for an unexpected error; the stage folder removed), and ``wall_s``.
    ``cost_cache`` goes to :func:`relsat.driver.app.optimize.optimize` (None: the default cache)."""
    started = time.perf_counter()
    try:
        fields = _optimize_one(task, stage, outdir, options, keep_db, on_round, on_status, cost_cache)
        fields["status"] = "ok"
    except RelsatError as e:
        fields = {"status": "failed", "reason": one_line(e)}
    except Exception as e:  # out of memory or disk: one line naming the limit; else a bug or an unexpected
        # library error: still one model's failure
        limit = resource_error(e, memory_limit=options.get("memory_limit"), temp_dir=options.get("temp_dir"))
        fields = {"status": "failed", "reason": one_line(limit)} if limit is not None else {
            "status": "failed", "reason": one_line(f"internal error: {type(e).__name__}: {e}"),
            "detail": traceback.format_exc()}
    if fields["status"] != "ok":
        shutil.rmtree(stage, ignore_errors=True)
    fields["wall_s"] = time.perf_counter() - started
    return fields


# ---------------------------------------------------------------- the parent side


RESULTS_DB = "results.duckdb"
BATCH_FILES = ("results.csv", "summary.md")  # rewritten at the end of every run
OWNED = "batch_files"  # the table of the files of OUTDIR the batch wrote or is about to write


def model_files(name: str) -> list[str]:
    """The files of OUTDIR a model's attempt may write or remove: its outputs and their companions."""
    return [p.name for p in (*_outputs(Path("."), name).values(), *_companions(Path("."), name).values())]


class NotOurs(Exception):
    """A file at a path the batch writes that the batch did not write (its str says what it is)."""


def read_results(path: Path) -> tuple[dict[str, dict], set[str]]:
    """Read an existing ``OUTDIR/results.duckdb`` without writing it: ``(rows by model, names of the
    files of OUTDIR the batch owns)``; ``({}, set())`` where there is none.  The owned files are those
    of the ``batch_files`` table; a table written by a relsat that kept none owns the files its rows
    name (with their companions) and ``results.csv`` and ``summary.md``.  Raises :class:`NotOurs` when
    the file is not a batch's results table (a user's DuckDB database, another file), RelsatError when
    it cannot be read now (another process holds it)."""
    import duckdb

    if not os.path.lexists(path):
        return {}, set()
    if path.is_dir() or not path.is_file():
        raise NotOurs("a folder" if path.is_dir() else "not a regular file")
    try:
        with duckdb.connect(str(path), read_only=True) as con:
            tables = table_columns(con)
            cols = tables.get("results", [])
            if not cols or cols[0] != "model" or not set(cols) <= set(COLUMN_NAMES) \
                    or not set(tables) <= {"results", OWNED} or tables.get(OWNED, ["name"]) != ["name"]:
                what = ", ".join(sorted(tables))
                raise NotOurs(f"a DuckDB database with the tables {what}" if what else "an empty DuckDB database")
            rows = {r[0]: {**dict.fromkeys(COLUMN_NAMES), **dict(zip(cols, r))}
                    for r in con.execute(f"SELECT {', '.join(cols)} FROM results").fetchall()}
            owned = ({n for (n,) in con.execute(f"SELECT name FROM {OWNED}").fetchall()} if OWNED in tables
                     else None)
    except duckdb.Error as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        if "Could not set lock" in first:
            raise RelsatError(f"{path}: in use by another process ({first})") from None
        raise NotOurs(f"not a DuckDB database ({first})") from None
    if owned is None:  # written by an older relsat
        owned = set(BATCH_FILES)
        for name, r in rows.items():
            outs, comp = _outputs(Path("."), name), _companions(Path("."), name)
            for kind in ("output", "report", "db"):
                if r.get(kind):
                    owned.add(outs[kind].name)
                    if kind in comp:
                        owned.add(comp[kind].name)
    return rows, owned


class Results:
    """OUTDIR/results.duckdb, opened for each read or write only: the ``results`` table (one row
    per model) and the ``batch_files`` table (the names of the files of OUTDIR the batch wrote or is
    about to write: a name is recorded before its file is first written, and dropped once its file
    is gone, :meth:`own`)."""

    def __init__(self, path: Path):
        self.path = path
        if not os.path.lexists(path):
            self._create_whole()
        self._run(self._create)

    def _create_whole(self) -> None:
        """A new results table is built under a temporary name (``.results.duckdb.tmp-<pid>``) and renamed
        in, so a batch killed while creating it leaves no empty database that the next run would have to
        refuse as not its own; what a killed run left under that name is swept first."""
        import duckdb

        from relsat.driver.boundary.outputs import sweep_leftovers

        sweep_leftovers(self.path)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            with duckdb.connect(str(tmp)) as con:
                self._create(con)
            os.replace(tmp, self.path)
        except duckdb.Error as e:
            raise RelsatError(f"{self.path}: {str(e).splitlines()[0]}") from None
        finally:
            for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
                if os.path.lexists(leftover):
                    os.unlink(leftover)

    def _run(self, work):
        import duckdb

        try:
            with duckdb.connect(str(self.path)) as con:
                return work(con)
        except duckdb.Error as e:
            raise RelsatError(f"{self.path}: {str(e).splitlines()[0]}") from None

    @staticmethod
    def _create(con):
        con.execute("CREATE TABLE IF NOT EXISTS results(" + ", ".join(f"{c} {t}" for c, t in COLUMNS) + ")")
        for c, t in COLUMNS[1:]:  # tables written by an older relsat get the new columns
            con.execute(f"ALTER TABLE results ADD COLUMN IF NOT EXISTS {c} {t}")
        con.execute(f"CREATE TABLE IF NOT EXISTS {OWNED}(name VARCHAR PRIMARY KEY)")

    def own(self, add=()) -> None:
        """Forget the recorded files of OUTDIR that are gone, then record the names ``add``."""
        outdir = self.path.parent

        def work(con):
            gone = [n for (n,) in con.execute(f"SELECT name FROM {OWNED}").fetchall()
                    if not os.path.lexists(outdir / n)]
            if gone:
                con.execute(f"DELETE FROM {OWNED} WHERE name IN (SELECT unnest(?::VARCHAR[]))", [gone])
            if add:
                con.execute(f"INSERT OR IGNORE INTO {OWNED} SELECT unnest(?::VARCHAR[])", [sorted(set(add))])

        self._run(work)

    def rows(self) -> dict[str, dict]:
        def work(con):
            cur = con.execute(f"SELECT {', '.join(COLUMN_NAMES)} FROM results")
            return {r[0]: dict(zip(COLUMN_NAMES, r)) for r in cur.fetchall()}

        return self._run(work)

    def put(self, row: dict) -> None:
        values = [row.get(c) for c in COLUMN_NAMES]
        self._run(lambda con: con.execute(
            f"INSERT OR REPLACE INTO results ({', '.join(COLUMN_NAMES)}) VALUES ({', '.join('?' * len(values))})",
            values))


class Recorder:
    """Parent side, whatever the executor: draws the progress and turns what a worker reported for
    a model into its row (:meth:`finish`: the staged files committed, the row written to the
    results table, ``rows`` and the ``BatchResult`` counts updated, ``on_result`` called)."""

    def __init__(self, outdir: Path, keep_db: bool, common: dict, results: Results, rows: dict[str, dict],
                 result: BatchResult, on_result, console, total: int):
        self.outdir, self.keep_db, self.common, self.results = outdir, keep_db, common, results
        self.rows, self.result, self.on_result = rows, result, on_result
        self.progress = self.overall = None
        self.console = console
        self._bars: dict[str, int] = {}
        if console is not None and console.is_terminal:  # off a terminal: a line per model as it ends, no bars
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=console, transient=False)
            self.progress.start()
            self.overall = self.progress.add_task("batch", total=total)

    def status(self, task: ModelTask, text: str) -> None:
        """Show what a model's worker is doing (its first status adds its line)."""
        if self.progress is None:
            return
        if task.name in self._bars:
            self.progress.update(self._bars[task.name], description=f"  {task.name}: {text}")
        else:
            self._bars[task.name] = self.progress.add_task(f"  {task.name}: {text}", total=None)

    def print(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, highlight=False, soft_wrap=True)

    def finish(self, task: ModelTask, fields: dict, stage: str | None = None, expected: Path | None = None) -> None:
        """Record a model's attempt from its worker's ``fields`` (:func:`model_fields`).  For a
        success the worker's files are moved from ``stage``, which must be the ``expected`` stage
        folder, into place, then the row naming their hashes is written."""
        name, outdir = task.name, self.outdir
        row = dict.fromkeys(COLUMN_NAMES)
        row.update(self.common, model=name, path=str(task.path), file_sha256=task.file_sha256,
                   finished_at=dt.datetime.now())
        row.update({k: v for k, v in fields.items() if k in row})
        if row["status"] == "ok":
            try:
                if stage is None or expected is None or Path(stage) != expected:
                    raise RelsatError(f"internal error: the worker reported its files in {stage}, "
                                      f"not in {expected.name if expected else 'its stage folder'}")
                row.update(commit(outdir, name, expected, self.keep_db))
            except (RelsatError, OSError) as e:
                row.update(status="failed", reason=one_line(e if isinstance(e, RelsatError) else
                                                             f"internal error: {type(e).__name__}: {e}"))
        if row["status"] != "ok":
            remove_outputs(outdir, name)
            row.update({k: None for k in ("output", "report", "db", "output_sha256", "report_sha256",
                                          "db_sha256")})
        self.results.put(row)
        done = f"redone ({task.redo})" if task.redo else "optimized"
        self.rows[name] = dict(row, this_run=done if row["status"] == "ok" else "failed")
        self.result.ran += 1
        if self.on_result is not None:
            self.on_result(self.rows[name])
        if self.console is not None:
            from rich.markup import escape

            if row["status"] == "ok":
                sp = "" if row.get("speedup") is None else f"{row['speedup']:.3f}x ({row['speedup_source']}), "
                self.print(f"[green]ok[/green] {escape(name)}: {escape(sp)}{row.get('wall_s', 0):.1f} s")
            else:
                self.print(f"[red]failed[/red] {escape(name)}: {escape(row['reason'])}")
        if self.progress is not None:
            if name in self._bars:
                self.progress.remove_task(self._bars.pop(name))
            self.progress.advance(self.overall)
            failed = sum(r["status"] == "failed" for r in self.rows.values())
            self.progress.update(self.overall, description=f"batch ({failed} failed)" if failed else "batch")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def timeout_reason(model_timeout: float) -> str:
    return f"timed out: still running after {model_timeout:g} s (--model-timeout), worker killed"
