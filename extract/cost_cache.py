"""Persistent cache of measured operator costs (one DuckDB file shared by every run).

Owns the ``costs`` table and its import/export. Keys come from
:meth:`relsat.extract.profile.OpSample.key` (and
:func:`relsat.extract.profile.call_overhead_key` for the one row of the call overhead), so a
row answers the same operator signature, provider, thread count and onnxruntime version;
where the running version has no row, :mod:`relsat.extract.profile` uses those of the other
versions :meth:`CostCache.versions` lists (and :mod:`relsat.extract.measured` warns that it did).

Concurrency: DuckDB lets one process at a time open a database file for writing.
``CostCache`` therefore never holds a connection between calls: every lookup, store,
import or export opens the file, does its work in one statement batch and closes it
again. When another process holds the file, DuckDB raises ``IOException("Could not set
lock ...")``; the call is retried with a jittered exponential backoff (10 ms doubling up to
0.5 s) for at most ``lock_timeout_s`` seconds in total, after which the error is re-raised.

Whose file it is: a cache file is only ever written when it is certainly relsat's. A new cache is
built under a temporary name and linked into place (never over an existing file), so the path holds
either nothing or a whole cache. An existing file at the path is used only when it is a DuckDB
database whose one table is ``costs`` with the cache's columns; anything else (the input model, a
user's own DuckDB database, a text file, a folder) is refused with a one-line
:class:`NotACostCache` (the driver's one-line error) and left untouched: never renamed, never written. Only in
relsat's own cache folder (the default path, ``<user cache dir>/relsat/``), where every file is
relsat's, is an unreadable cache set aside (renamed ``costs.duckdb.corrupt-<time>-<pid>``, with a
warning) and rebuilt.

Timings of whole graphs and of the call overhead depend on the moment as well as on the key: a row
taken while other jobs loaded the machine stays wrong in every later run. Such rows keep what they
were taken under in their signature (:func:`conditions`), and are checked against fresh timings and
replaced (:meth:`CostCache.store` upserts) or removed (:meth:`CostCache.delete`) when they disagree.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import numpy as np
import platformdirs

from relsat.relations.schema import literal

_COLUMNS = "key, provider, threads, op_type, signature, ms, repeats, measured_at, ort_version"
_SCHEMA = """CREATE TABLE IF NOT EXISTS {table}(
    key VARCHAR PRIMARY KEY, provider VARCHAR, threads INTEGER, op_type VARCHAR, signature JSON,
    ms DOUBLE, repeats INTEGER, measured_at TIMESTAMP, ort_version VARCHAR)"""
_UPSERT = """INSERT INTO costs SELECT key::VARCHAR, provider::VARCHAR, threads::INTEGER,
    op_type::VARCHAR, signature::JSON, ms::DOUBLE, repeats::INTEGER, measured_at::TIMESTAMP,
    ort_version::VARCHAR FROM {source}
    ON CONFLICT (key) DO UPDATE SET provider = excluded.provider, threads = excluded.threads,
    op_type = excluded.op_type, signature = excluded.signature, ms = excluded.ms,
    repeats = excluded.repeats, measured_at = excluded.measured_at,
    ort_version = excluded.ort_version"""


def default_path() -> Path:
    """``$RELSAT_COST_CACHE`` if set, else ``<user cache dir>/relsat/costs.duckdb``."""
    env = os.environ.get("RELSAT_COST_CACHE")
    return Path(env) if env else Path(platformdirs.user_cache_dir("relsat")) / "costs.duckdb"


def own_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is in relsat's own cache folder (where the default cache lives), whose files
    are all relsat's."""
    try:
        return Path(path).resolve().parent == Path(platformdirs.user_cache_dir("relsat")).resolve()
    except OSError:
        return False


def table_columns(con) -> dict[str, list[str]]:
    """The tables of a database's main schema, each with its columns in order."""
    tables: dict[str, list[str]] = {}
    for table, column in con.execute(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'main' "
            "ORDER BY table_name, ordinal_position").fetchall():
        tables.setdefault(table, []).append(column)
    return tables


def _remove_db(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".wal").unlink(missing_ok=True)


@dataclass(frozen=True)
class CostRow:
    """One measured operator cost; ``signature`` is the human-readable ``OpSample.describe()``."""

    key: str
    provider: str
    threads: int
    op_type: str
    signature: dict
    ms: float
    repeats: int
    ort_version: str
    measured_at: dt.datetime = field(default_factory=dt.datetime.now)


def conditions(threads: int) -> dict:
    """What a timing is taken under, as a row's signature records it: the time, this machine's load
    average (1, 5, 15 minutes) and CPUs (those this process may run on, and all), and the threads."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        load = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"measured_at": dt.datetime.now().isoformat(timespec="seconds"), "loadavg": load,
            "cpus": usable, "cpu_count": os.cpu_count(), "threads": threads}


def _object_array(values: Iterable[str]) -> np.ndarray:
    return np.array(list(values), dtype=object)


def is_cost_table(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a cost table as ``CostCache.export`` writes it (CSV or Parquet by
    suffix, else a DuckDB file with a ``costs`` table of those columns)."""
    path, want = Path(path), [c.strip() for c in _COLUMNS.split(",")]
    try:
        with duckdb.connect(":memory:") as con:
            if path.suffix.lower() == ".csv":
                cols = [d[0] for d in con.execute(
                    f"SELECT * FROM read_csv({literal(str(path))}, header = true, all_varchar = true) LIMIT 0").description]
            elif path.suffix.lower() == ".parquet":
                cols = [d[0] for d in con.execute(f"SELECT * FROM read_parquet({literal(str(path))}) LIMIT 0").description]
            else:
                con.execute(f"ATTACH {literal(str(path))} AS src (READ_ONLY)")
                cols = [d[0] for d in con.execute("SELECT * FROM src.costs LIMIT 0").description]
    except duckdb.Error:
        return False
    return cols == want


class NotACostCache(ValueError):
    """A cost cache path that holds something else (its one-line message says what); the driver reports it as
    a RelsatError."""


class CostCache:
    """DuckDB-backed ``key -> ms`` store; see the module docstring for the locking policy."""

    def __init__(self, path: str | os.PathLike | None = None, *, lock_timeout_s: float = 30.0):
        self.path = Path(path) if path is not None else default_path()
        self.lock_timeout_s = lock_timeout_s
        self._closed = False
        self.notices: list[str] = []  # what opening the cache had to repair
        problem = self._problem()
        if problem is None:
            return
        if not own_folder(self.path):
            raise NotACostCache(f"cost cache {self.path}: {problem}, not a relsat cost cache; relsat neither "
                              f"renames nor writes it: remove it or set RELSAT_COST_CACHE to another file")
        self._set_aside(problem)
        self._create()

    def _problem(self) -> str | None:
        """Make sure a cost cache is at ``self.path``: build one where there is nothing, and return
        None; or say why the file there is not a cost cache (it is left as it is)."""
        if not os.path.lexists(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._create()
            return None
        if self.path.is_dir():
            return "is a folder"
        if not self.path.is_file():
            return "is not a regular file"
        try:
            tables = self._run(table_columns, read_only=True)
        except duckdb.Error as e:
            if "Could not set lock" in str(e):
                raise
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            return f"not a DuckDB database ({first})"
        want = [c.strip() for c in _COLUMNS.split(",")]
        if set(tables) != {"costs"}:
            return ("a DuckDB database with the tables " + ", ".join(sorted(tables)) if tables
                    else "a DuckDB database without tables")
        if tables["costs"] != want:
            return f"its costs table has the columns {', '.join(tables['costs'])}"
        return None

    def _create(self) -> None:
        """Build an empty cache under a temporary name and link it into place; where a file
        appeared there meanwhile (another process built the cache first) it is left alone."""
        tmp = self.path.with_name(f".{self.path.name}.new-{os.getpid()}")
        try:
            _remove_db(tmp)
            with duckdb.connect(str(tmp)) as con:
                con.execute(_SCHEMA.format(table="costs"))
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass
            except OSError:  # no hard links on this file system: a rename, racing only with ourselves
                if not os.path.lexists(self.path):
                    os.replace(tmp, self.path)
        finally:
            _remove_db(tmp)
        if self._problem() is not None:  # someone else's file appeared at the path meanwhile
            raise NotACostCache(f"cost cache {self.path}: another file appeared there while the cache was built")

    def _set_aside(self, why: str) -> None:
        """Rename an unreadable cache file of relsat's own cache folder (and its WAL) out of the way,
        so a new one is built; the old file is kept for the user to look at."""
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
        reason = " ".join(str(why).split())[:300]
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:  # another process set it aside first
            pass
        wal = self.path.with_name(self.path.name + ".wal")
        if wal.exists():
            os.replace(wal, aside.with_name(aside.name + ".wal"))
        msg = f"cost cache {self.path} could not be read ({reason}): set aside as {aside.name}; a new cache is built"
        self.notices.append(msg)
        warnings.warn(msg, stacklevel=3)

    def _run(self, work, *, read_only: bool = False):
        """Run ``work(con)`` on a short-lived connection, retrying while the file is locked."""
        if self._closed:
            raise ValueError(f"cost cache {self.path} is closed")
        deadline, delay = time.monotonic() + self.lock_timeout_s, 0.01
        while True:
            try:
                with duckdb.connect(str(self.path), read_only=read_only) as con:
                    return work(con)
            except duckdb.IOException as exc:
                if "Could not set lock" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(min(delay * random.uniform(0.5, 1.5), max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, 0.5)

    def lookup(self, keys: list[str]) -> dict[str, float]:
        """Cached ``ms`` for those of ``keys`` that are present (one query)."""
        if not keys:
            return {}
        rows = self._run(lambda con: con.execute(
            "SELECT key, ms FROM costs WHERE key IN (SELECT unnest(?::VARCHAR[]))", [list(keys)]
        ).fetchall())
        return dict(rows)

    def store(self, rows: Iterable[CostRow]) -> int:
        """Upsert ``rows`` in one statement (later duplicates of a key win); returns the count."""
        rows = list({r.key: r for r in rows}.values())
        if not rows:
            return 0
        frame = {
            "key": _object_array(r.key for r in rows),
            "provider": _object_array(r.provider for r in rows),
            "threads": np.array([r.threads for r in rows], dtype=np.int32),
            "op_type": _object_array(r.op_type for r in rows),
            "signature": _object_array(json.dumps(r.signature, sort_keys=True) for r in rows),
            "ms": np.array([r.ms for r in rows], dtype=np.float64),
            "repeats": np.array([r.repeats for r in rows], dtype=np.int32),
            "measured_at": np.array([r.measured_at for r in rows], dtype="datetime64[us]"),
            "ort_version": _object_array(r.ort_version for r in rows),
        }

        def work(con):
            con.register("new_costs", frame)
            con.execute(_UPSERT.format(source="new_costs"))

        self._run(work)
        return len(rows)

    def delete(self, keys: Iterable[str]) -> int:
        """Remove the rows of ``keys`` (one statement); returns how many there were."""
        keys = sorted(set(keys))
        if not keys:
            return 0
        return self._run(lambda con: len(con.execute(
            "DELETE FROM costs WHERE key IN (SELECT unnest(?::VARCHAR[])) RETURNING key", [keys]).fetchall()))

    def export(self, path: str | os.PathLike) -> None:
        """Write the whole table to ``path``: CSV or Parquet by suffix (through a temporary file and
        a rename), else a DuckDB file whose ``costs`` table is replaced."""
        path = Path(path)
        if path.suffix.lower() in (".csv", ".parquet"):
            fmt = "FORMAT csv, HEADER" if path.suffix.lower() == ".csv" else "FORMAT parquet"
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                self._run(lambda con: con.execute(f"COPY costs TO {literal(str(tmp))} ({fmt})"))
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            return

        def work(con):
            con.execute(f"ATTACH {literal(str(path))} AS dst")
            con.execute("DROP TABLE IF EXISTS dst.costs")
            con.execute(_SCHEMA.format(table="dst.costs"))
            con.execute(f"INSERT INTO dst.costs SELECT {_COLUMNS} FROM costs")
            con.execute("DETACH dst")

        self._run(work)

    def import_(self, path: str | os.PathLike) -> int:
        """Upsert every row of an exported file (CSV, Parquet or DuckDB) into this cache;
        imported rows replace local ones with the same key. Returns the number of rows read."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(path)
        suffix = path.suffix.lower()

        def work(con):
            if suffix == ".csv":
                source = f"read_csv({literal(str(path))}, header = true, all_varchar = true)"
            elif suffix == ".parquet":
                source = f"read_parquet({literal(str(path))})"
            else:
                con.execute(f"ATTACH {literal(str(path))} AS src (READ_ONLY)")
                source = "src.costs"
            n = con.execute(f"SELECT count(*) FROM {source}").fetchone()[0]
            con.execute(_UPSERT.format(source=f"(SELECT {_COLUMNS} FROM {source})"))
            return n

        return self._run(work)

    merge_from = import_

    def summary(self) -> list[tuple]:
        """(provider, threads, ort_version, costs, distinct op types, last measured) per group."""
        return self._run(lambda con: con.execute(
            "SELECT provider, threads, ort_version, count(*), count(DISTINCT op_type), max(measured_at) "
            "FROM costs GROUP BY ALL ORDER BY ALL").fetchall())

    def rows(self, keys: list[str]) -> dict[str, tuple[float, dict]]:
        """Cached ``(ms, signature)`` for those of ``keys`` that are present (one query)."""
        if not keys:
            return {}
        rows = self._run(lambda con: con.execute(
            "SELECT key, ms, signature FROM costs WHERE key IN (SELECT unnest(?::VARCHAR[]))", [list(keys)]
        ).fetchall())
        return {k: (ms, json.loads(sig)) for k, ms, sig in rows}

    def versions(self, providers: list[str], threads: int) -> list[str]:
        """The onnxruntime versions of the rows of ``providers`` at ``threads``, the most recently
        measured first (one query)."""
        return [v for (v,) in self._run(lambda con: con.execute(
            "SELECT ort_version FROM costs WHERE provider IN (SELECT unnest(?::VARCHAR[])) AND threads = ? "
            "GROUP BY ort_version ORDER BY max(measured_at) DESC, ort_version", [list(providers), threads]
        ).fetchall())]

    def count(self) -> int:
        return self._run(lambda con: con.execute("SELECT count(*) FROM costs").fetchone()[0])

    def close(self) -> None:
        """Mark the cache unusable; no connection is held between calls, so nothing else to do."""
        self._closed = True

    def __enter__(self) -> CostCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CostCache({str(self.path)!r})"
