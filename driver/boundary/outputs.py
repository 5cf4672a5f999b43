"""What relsat writes, checked before any work and committed atomically.

``check_outputs`` runs before a model is even loaded: every path a command will write
(``-o``, ``--db``, ``--report``) must be writable (its folder exists or can be made, and a
file can be created there), must not be a folder, must not be the input model, the cost
cache or another of the outputs, and, when it exists, must be a file of the kind relsat
writes there: an ONNX model for ``-o``, a relsat e-graph for ``--db``, a relsat report for
``--report``, a cost table for ``relsat costs export``.  Anything else is refused with a one-line ``RelsatError``: relsat never
replaces a file it did not write.

``save_model_atomic`` writes a model (``write_text_atomic`` a text) through a temporary file and a rename (with a side file of
tensors above ``EXTERNAL_DATA_BYTES``).

``open_egraph_readonly`` is the one way a saved e-graph is read back (``relsat query``, ``relsat explain``): a
read-only connection that can read nothing else.

``EGraphFile`` builds an e-graph beside its destination (a hidden temporary file in the same
folder) and renames it into place only when the run that built it got that far, so a run that
fails (or is killed) leaves an earlier e-graph at that path as it was; ``discard_uncommitted``
removes what a failed or interrupted run left of its e-graphs (the file, its WAL, DuckDB's spill
folder).  Renames that commit an output run with SIGINT and SIGTERM held (``signals_held``), so an
interrupt leaves every output whole or absent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path

import onnx

from relsat.relations.runtime import serialized_already, tensor_bytes

from relsat.driver.errors import RelsatError, error_line

EGRAPH_TABLES = {"meta", "eclass", "uf"}  # every relsat e-graph has these tables
EXTERNAL_DATA_BYTES = 1_800_000_000  # save_model_atomic puts tensors in a side file above this size


def _same(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.expanduser().resolve() == b.expanduser().resolve()


def _probe_folder(flag: str, path: Path) -> None:
    """RelsatError unless the folder of ``path`` exists (or can be made) and takes a new file."""
    parent = path.expanduser().absolute().parent
    existing = parent
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise RelsatError(f"{flag} {path}: {existing} is a file, not a folder")
    probe = existing / f".relsat-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise RelsatError(f"{flag} {path}: cannot write in {existing} ({e.strerror or e})") from None


def is_onnx_model(path: Path) -> bool:
    try:
        m = onnx.load_model(str(path), load_external_data=False)
    except Exception:
        return False
    return m.HasField("graph") and m.ir_version > 0


def egraph_problem(path: Path) -> str | None:
    """None when ``path`` is a relsat e-graph (a DuckDB file with the e-graph's tables), else why not."""
    import duckdb

    try:
        with duckdb.connect(str(path), read_only=True) as con:
            tables = {r[0] for r in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").fetchall()}
    except duckdb.Error as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"not a DuckDB database ({first})"
    missing = EGRAPH_TABLES - tables
    return f"a DuckDB database without the e-graph tables ({', '.join(sorted(missing))})" if missing else None


def is_report(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(data, dict) and {"nodes_in", "nodes_out", "verification"} <= set(data)


def _is_cost_table(path: Path) -> bool:
    from relsat.extract.cost_cache import is_cost_table

    return is_cost_table(path)


_KINDS = {
    "-o": ("an ONNX model", is_onnx_model),
    "--db": ("a relsat e-graph", lambda p: egraph_problem(p) is None),
    "--report": ("a relsat report", is_report),
    "costs export": ("a cost table", _is_cost_table),
}


def open_cost_cache(path=None):
    """The cost cache at ``path`` (None: the user's default), a RelsatError where the path holds something
    else (``extract.cost_cache.NotACostCache``: never renamed, never written)."""
    from relsat.extract.cost_cache import CostCache, NotACostCache

    try:
        return CostCache(path)
    except NotACostCache as e:
        raise RelsatError(str(e)) from None


def protected_paths(cost_cache=None, costs=None) -> list[tuple[str, Path]]:
    """The files no output may be: the cost cache (``cost_cache``: a path, a CostCache or None for
    the default) and a ``--costs`` table."""
    from relsat.extract.cost_cache import default_path

    path = getattr(cost_cache, "path", cost_cache) or default_path()
    return [("the cost cache", Path(path))] + ([("the --costs table", Path(costs))] if costs else [])


def check_outputs(*, source=None, output=None, db=None, report=None, cost_table=None, protected=(),
                  others=()) -> None:
    """Refuse, before any work, an output path relsat must not or cannot write (module docstring).
    ``source``: the input model's path (None for an in-memory model); ``cost_table``: the file of
    ``relsat costs export``; ``protected``: (label, path) pairs no output may be (the cost cache, a
    ``--costs`` table); ``others``: (flag, path) pairs of outputs checked by another call (the
    pipeline checks ``-o`` and ``--db``; the CLI only the report beside them), which no output here
    may be."""
    named = [(flag, Path(p)) for flag, p in (("-o", output), ("--db", db), ("--report", report),
                                             ("costs export", cost_table)) if p is not None]
    checked = [(flag, Path(p)) for flag, p in others if p is not None]
    outs = checked + named
    guarded = list(protected) + ([("the input model", Path(source))] if source is not None else [])
    for i, (flag, path) in enumerate(outs):
        if i < len(checked):
            continue
        for label, other in guarded:
            if other is not None and _same(path, Path(other)):
                raise RelsatError(f"{flag} {path}: is {label}; relsat never overwrites it")
        for flag2, other in outs[:i]:
            if _same(path, other):
                raise RelsatError(f"{flag} {path}: is also the {flag2} path; give each output its own file")
        if path.is_dir():
            raise RelsatError(f"{flag} {path}: is a folder; give a file path")
        if path.exists() or path.is_symlink():
            kind, ok = _KINDS[flag]
            if not path.is_file():
                raise RelsatError(f"{flag} {path}: exists and is not a regular file; relsat replaces only {kind}")
            if not ok(path):
                why = egraph_problem(path) if flag == "--db" else f"not {kind}"
                raise RelsatError(f"{flag} {path}: exists and is {why}; relsat replaces only {kind} there "
                                  "(remove the file or choose another path)")
        _probe_folder(flag, path)


_LIVE: dict[int, "EGraphFile"] = {}  # the EGraphFiles of this process not yet committed or discarded


@contextmanager
def signals_held():
    """SIGINT and SIGTERM held back (delivered on exit) while a commit renames files, so that an interrupt
    never lands between two renames of one output (a model and its side file, an e-graph and its WAL)."""
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (AttributeError, OSError, ValueError):  # no pthread_sigmask here
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _dead(pid: int) -> bool:
    """Whether no process has this pid (a process of another user counts as alive)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


# what a run killed while writing beside ``NAME`` leaves, after ``.NAME.``: the e-graph file (EGraphFile),
# its WAL and DuckDB's spill folder; a text temp file (write_text_atomic); a model temp folder (save_model_atomic)
_LEFTOVERS = ((re.compile(r"tmp-(\d+)"), False), (re.compile(r"tmp-(\d+)\.wal"), False),
              (re.compile(r"tmp-(\d+)\.tmp"), True), (re.compile(r"(\d+)\.tmp"), False),
              (re.compile(r"(\d+)\.[A-Za-z0-9_]+"), True))


def _ours(path: Path, name: str) -> bool:
    """A leftover folder holds only what relsat writes there: a model temp folder the model (and its
    ``.data``), DuckDB's spill folder its spill files (``*.tmp``-like, no subfolders); a file is ours by name."""
    if not path.is_dir():
        return True
    try:
        inside = list(os.scandir(path))
    except OSError:
        return False
    if path.name.endswith(".tmp"):  # DuckDB's spill folder beside the e-graph file
        return all(e.is_file() for e in inside)
    return all(e.is_file() and e.name in (name, name + ".data") for e in inside)


def sweep_leftovers(final) -> list[Path]:
    """Remove what relsat runs that were killed (their pid no longer alive) left beside ``final``: only
    names exactly as relsat makes them (``.NAME.tmp-<pid>``, ``.NAME.<pid>.tmp``, ``.NAME.<pid>.<random>/``),
    files as files and folders as folders, so a user's own hidden files are never touched. Returns what it
    removed."""
    final = Path(final)
    prefix = f".{final.name}."
    removed = []
    try:
        entries = list(os.scandir(final.parent))
    except OSError:
        return removed
    for e in entries:
        if not e.name.startswith(prefix) or e.is_symlink():
            continue
        rest = e.name[len(prefix):]
        for regex, folder in _LEFTOVERS:
            m = regex.fullmatch(rest)
            if m and e.is_dir() == folder and _dead(int(m.group(1))) and _ours(Path(e.path), final.name):
                if folder:
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    Path(e.path).unlink(missing_ok=True)
                removed.append(Path(e.path))
                break
    return removed


class EGraphFile:
    """The e-graph file of one run: ``path`` is where it is built (beside ``final``), ``commit()``
    renames it into place (with its WAL, if any) and ``discard()`` removes it with its WAL and the
    folder DuckDB spills to beside it (``<path>.tmp``). Until one of them runs, ``discard_uncommitted``
    (the CLI's last step on any failure or interrupt) removes it too, and the folders made for it that are
    still empty: a run that fails leaves no folder behind."""

    def __init__(self, final):
        self.final = Path(final)
        missing = [d for d in (self.final.parent, *self.final.parent.parents) if not d.exists()]
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.path = self.final.with_name(f".{self.final.name}.tmp-{os.getpid()}")
        self.made: list[Path] = []
        self.discard()  # a leftover of a killed run of this pid
        self.made = missing  # (deepest first)
        sweep_leftovers(self.final)  # and of killed runs of pids no longer alive
        _LIVE[id(self)] = self

    @staticmethod
    def _wal(p: Path) -> Path:
        return p.with_name(p.name + ".wal")

    def commit(self) -> None:
        wal, final_wal = self._wal(self.path), self._wal(self.final)
        with signals_held():
            final_wal.unlink(missing_ok=True)
            if wal.exists():
                os.replace(wal, final_wal)
            os.replace(self.path, self.final)
            _LIVE.pop(id(self), None)
        shutil.rmtree(self.path.with_name(self.path.name + ".tmp"), ignore_errors=True)

    def discard(self) -> None:
        for p in (self.path, self._wal(self.path)):
            p.unlink(missing_ok=True)
        shutil.rmtree(self.path.with_name(self.path.name + ".tmp"), ignore_errors=True)
        for d in self.made:
            try:
                d.rmdir()  # (only while empty)
            except OSError:
                break
        _LIVE.pop(id(self), None)


def discard_uncommitted() -> None:
    """Remove the files of every e-graph this process began and neither committed nor discarded (a run
    that failed or was interrupted before its own cleanup ran, e.g. while the e-graph database opened)."""
    for f in list(_LIVE.values()):
        f.discard()


def save_model_atomic(model: onnx.ModelProto, path, *, external_data: bool | None = None) -> None:
    """Write ``model`` to ``path`` through a temporary file in the same folder and a rename; tensors
    go to ``<name>.data`` next to it when ``external_data`` (default: above 1.8 GB). Inside
    ``relations.runtime.serialize_once(model)`` the bytes it holds are written (made there, or the file's the model
    was read from: ViT-B/16 1 s less)."""
    path = Path(path)
    if external_data is None:
        external_data = tensor_bytes(model) > EXTERNAL_DATA_BYTES
    sweep_leftovers(path)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{path.name}.{os.getpid()}.", dir=path.parent))
    try:
        tmp = tmpdir / path.name
        if external_data:
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            data = path.name + ".data"
            onnx.save_model(copy, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data, size_threshold=1024)
        else:  # the bytes this run has of the model already (the input model kept: its file's bytes)
            tmp.write_bytes(serialized_already(model) or model.SerializeToString())
        with signals_held():
            if external_data and (tmpdir / data).exists():
                os.replace(tmpdir / data, path.parent / data)
            os.replace(tmp, path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def write_text_atomic(path, text: str) -> None:
    """Write ``text`` to ``path`` (its folder made if needed) through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    sweep_leftovers(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def open_egraph_readonly(db: Path):
    """A read-only connection to a saved e-graph that reads nothing else: external access off (no
    COPY TO, ATTACH of other files, read_csv of arbitrary files), extensions neither installed nor
    autoloaded, and the configuration locked so a query cannot turn these back on."""
    import duckdb

    if not db.exists():
        raise RelsatError(f"{db}: no such e-graph database")
    if not db.is_file():
        raise RelsatError(f"{db}: is a folder, not an e-graph database")
    con = duckdb.connect(":memory:")
    try:  # attached (not opened) so that a connection this process already holds does not conflict
        from relsat.relations.schema import literal

        con.execute(f"ATTACH {literal(str(db))} AS egraph (READ_ONLY)")
        con.execute("USE egraph")
        for setting in ("enable_external_access = false", "autoinstall_known_extensions = false",
                        "autoload_known_extensions = false", "allow_community_extensions = false",
                        "lock_configuration = true"):
            con.execute("SET " + setting)
    except duckdb.Error as e:
        con.close()
        raise RelsatError(f"{db}: cannot open it as a DuckDB database: {error_line(e)}") from None
    return con
