"""Fault injection (issue 26): SIGKILL at random points of ``relsat optimize`` and ``relsat batch``.

The real CLI runs as a subprocess (its own session, so that every process it starts can be waited for).
One clean run of each command is timed first; kill points are delays drawn uniformly (seeded) over that
duration, and the command's parent process gets SIGKILL after that delay.  After each kill:

- no partial output: each of ``-o``/``--db``/``--report`` (batch: each model's ``.onnx``/``.json``/
  ``.duckdb``, ``results.duckdb``, ``results.csv``, ``summary.md``) is absent or whole, and a whole model
  is byte for byte the clean run's (the written model is deterministic with these options);
- nothing but relsat's own temporary files beside them (named as relsat names them: ``.NAME.tmp-<pid>``,
  ``.NAME.<pid>.tmp``, ``.NAME.XXXX/``, ``.NAME.stage-<pid>/``, a DuckDB ``.wal``);
- the inputs and unrelated files of the folders unchanged (SHA-256);

and the next run succeeds, leaves exactly the files of a clean run (no stray temporary file) and agrees
with it: the same model bytes and report figures (optimize), the same results rows (batch).

Half of the kill points run in a fresh folder; the others in a folder a complete run already wrote (for
batch with ``--force``, so that the models are optimized and committed again over earlier outputs).

The default suite runs a few optimize kill points (tests/test_batch_kill.py kills a batch by default);
``-m slow`` adds a few batch kill points and ``SLOW_POINTS`` of each command, and prints the figures that
benchmarks/FAULT_RESULTS.md records.  A temp dir on a small tmpfs (mounted when run as root)
ends a batch with exit != 0, nothing partial and nothing left.

Defects found are kept as ``xfail(strict=True)`` tests below until fixed (the e-graph and output temporaries
of killed runs were left for good until driver/boundary/outputs.py's ``sweep_leftovers``)."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import onnx
import pytest

from relsat.driver.boundary import zoo
from relsat.driver.boundary.outputs import egraph_problem

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="watches processes through /proc")

SEED = 26
SHORT_POINTS = {"optimize": 2, "batch": 2}  # each: one fresh folder, one over earlier outputs (was 6 and 4, ~50 s)
SLOW_POINTS = 50
QUICK = ["--cost-model", "analytic", "--no-measure", "--threads", "1"]
OPT_MODEL = "bert"  # small zoo bert: rewritten (31 -> 29 nodes) in ~3 s, so -o is not the input
BATCH_MODELS = ("bert", "squeezenet")
CLI = [sys.executable, "-c", "from relsat.driver.app.cli import main; main()"]

# relsat's temporary names (driver/boundary/outputs.py, driver/app/batch_model.py): what a SIGKILL may leave behind
TEMP_RE = re.compile(
    r"\..+\.tmp-\d+(\.wal|\.tmp)?"  # EGraphFile: .e.duckdb.tmp-<pid>, its WAL, DuckDB's spill folder
    r"|\..+\.\d+\.tmp"  # write_text_atomic: .r.json.<pid>.tmp
    r"|\..+\.onnx\.(\d+\.)?[A-Za-z0-9_]+"  # save_model_atomic: mkdtemp(prefix=".o.onnx.<pid>.")
    r"|\..+\.stage-(\d+|ray\d+)"  # batch worker stage folders
    r"|\.relsat-probe-\d+"  # check_outputs' probe
    r"|.+\.duckdb\.wal"  # a DuckDB journal beside a database
    r"|\.batch\.lock")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def hashes(folder: Path, names) -> dict[str, str | None]:
    return {n: sha256(folder / n) if (folder / n).is_file() else None for n in names}


def session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid`` (the command and every process it started)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[3]) == sid:
            found.append(int(entry))
    return found


def start(args, cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([*CLI, *map(str, args)], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(p: subprocess.Popen, timeout=300) -> tuple[int, str]:
    _, err = p.communicate(timeout=timeout)
    return p.returncode, err


def kill_after(p: subprocess.Popen, delay: float) -> tuple[bool, list[str]]:
    """SIGKILL the command's process after ``delay`` s; wait until every process of its session is gone.
    Returns (killed: False when it had finished first, problems)."""
    problems = []
    try:
        p.wait(timeout=delay)
        killed = False
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        killed = True
    p.communicate(timeout=60)
    end = time.monotonic() + 15
    while session_pids(p.pid) and time.monotonic() < end:
        time.sleep(0.05)
    left = session_pids(p.pid)
    if left:
        problems.append(f"processes still alive 15 s after the kill: {left}")
        for pid in left:  # ours: started by this test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return killed, problems


def listing(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


@dataclass
class Figures:
    command: str
    points: int = 0
    killed: int = 0
    finished_first: int = 0
    temps_after_kill: int = 0  # kill points that left relsat temporary files (before the next run)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.command}: {self.points} kill points, {self.killed} killed ({self.finished_first} finished "
                f"before the kill), temporary files left by {self.temps_after_kill} kills (all removed by the next "
                f"run unless a failure says otherwise), failures {len(self.failures)}")


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    cache = tmp_path_factory.mktemp("cache") / "costs.duckdb"
    return dict(os.environ, RELSAT_COST_CACHE=str(cache), COLUMNS="200")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("zoo")
    for name in {OPT_MODEL, *BATCH_MODELS}:
        zoo.save(zoo.build(name, small=True), folder / f"{name}.onnx")
    return folder


def unrelated(folder: Path) -> list[str]:
    """Files of the user beside relsat's: they must come through every kill unchanged."""
    (folder / "notes.txt").write_text("mine\n")
    (folder / ".e.duckdb.swp").write_bytes(b"an editor's swap file, not relsat's")
    return ["notes.txt", ".e.duckdb.swp"]


# ---------------------------------------------------------------- optimize

OPT_OUT = ("o.onnx", "e.duckdb", "r.json")
OPT_ARGS = ["optimize", f"{OPT_MODEL}.onnx", "-o", "o.onnx", "--db", "e.duckdb", "--report", "r.json", *QUICK]


def opt_folder(root: Path, models: Path, tag: str) -> tuple[Path, list[str]]:
    folder = root / tag
    folder.mkdir()
    shutil.copy(models / f"{OPT_MODEL}.onnx", folder)
    return folder, [f"{OPT_MODEL}.onnx", *unrelated(folder)]


def egraph_size(path: Path) -> int:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT count(*) FROM eclass").fetchone()[0]


def opt_state(folder: Path) -> dict:
    rep = json.loads((folder / "r.json").read_text())
    return {"model": sha256(folder / "o.onnx"), "nodes": (rep["nodes_in"], rep["nodes_out"]),
            "verification": rep["verification"] is not None, "eclasses": egraph_size(folder / "e.duckdb")}


def opt_whole_or_absent(folder: Path, clean: dict) -> list[str]:
    problems = []
    if (folder / "o.onnx").exists():
        try:
            onnx.checker.check_model(onnx.load(str(folder / "o.onnx")))
            if sha256(folder / "o.onnx") != clean["model"]:
                problems.append("-o o.onnx is whole but not the clean run's model")
        except Exception as e:  # noqa: BLE001
            problems.append(f"-o o.onnx is partial: {type(e).__name__}: {e}")
    if (folder / "e.duckdb").exists():
        why = egraph_problem(folder / "e.duckdb")
        if why:
            problems.append(f"--db e.duckdb is partial: {why}")
    if (folder / "r.json").exists():
        try:
            rep = json.loads((folder / "r.json").read_text())
            if (rep["nodes_in"], rep["nodes_out"]) != clean["nodes"]:
                problems.append("--report r.json is whole but not the clean run's")
        except (ValueError, KeyError) as e:
            problems.append(f"--report r.json is partial: {e}")
    return problems


def campaign_optimize(root: Path, models: Path, env: dict, points: int) -> Figures:
    fig = Figures("optimize")
    clean_dir, _ = opt_folder(root, models, "clean")
    t0 = time.monotonic()
    rc, err = finish(start(OPT_ARGS, clean_dir, env))
    duration = time.monotonic() - t0
    assert rc == 0, err
    clean, clean_names = opt_state(clean_dir), listing(clean_dir)
    rng = random.Random(SEED)
    folder = None
    for i in range(points):
        delay = rng.uniform(0, duration)
        if i % 2 == 0 or folder is None:
            folder, mine = opt_folder(root, models, f"k{i}")  # fresh: no earlier outputs
        before = hashes(folder, mine)
        fig.points += 1
        where = f"kill point {i} ({delay:.2f} s of {duration:.2f} s, {'fresh' if i % 2 == 0 else 'over earlier outputs'})"
        killed, problems = kill_after(start(OPT_ARGS, folder, env), delay)
        fig.killed += killed
        fig.finished_first += not killed
        problems += opt_whole_or_absent(folder, clean)
        extra = listing(folder) - clean_names
        fig.temps_after_kill += bool(extra)
        problems += [f"unexpected file after the kill: {n}" for n in sorted(extra) if not TEMP_RE.fullmatch(n)]
        if hashes(folder, mine) != before:
            problems.append("an input or unrelated file changed")
        rc, err = finish(start(OPT_ARGS, folder, env))
        if rc != 0:
            problems.append(f"the next run failed (exit {rc}): {err.strip()[-500:]}")
        else:
            if opt_state(folder) != clean:
                problems.append(f"the next run disagrees with a clean run: {opt_state(folder)} != {clean}")
            stray = listing(folder) - clean_names
            problems += [f"stray file after the next run: {n}" for n in sorted(stray)]
            problems += [f"missing after the next run: {n}" for n in sorted(clean_names - listing(folder))]
        if hashes(folder, mine) != before:
            problems.append("an input or unrelated file changed after the next run")
        fig.failures += [f"{where}: {p}" for p in problems]
    return fig


# ---------------------------------------------------------------- batch

def batch_args(force=False):
    return ["batch", "models", "-o", "out", "--keep-db", *QUICK, *(["--force"] if force else [])]


def batch_outputs(names=BATCH_MODELS) -> list[str]:
    return [f"{n}{ext}" for n in names for ext in (".onnx", ".json", ".duckdb")] + [
        "results.duckdb", "results.csv", "summary.md"]


ROW_COLUMNS = "model, status, written, output_sha256, nodes_in, nodes_out, enodes, eclasses, file_sha256, options_sha256"


def batch_rows(out: Path) -> list[tuple]:
    with duckdb.connect(str(out / "results.duckdb"), read_only=True) as con:
        return con.execute(f"SELECT {ROW_COLUMNS} FROM results ORDER BY model").fetchall()


def batch_folder(root: Path, models: Path, tag: str) -> tuple[Path, list[str]]:
    """``root/tag`` with models/ (the inputs and a user's file) and out/ (a user's file only)."""
    folder = root / tag
    (folder / "models").mkdir(parents=True)
    (folder / "out").mkdir()
    for name in BATCH_MODELS:
        shutil.copy(models / f"{name}.onnx", folder / "models")
    (folder / "models" / "README.txt").write_text("my models\n")
    mine = [f"models/{n}.onnx" for n in BATCH_MODELS] + ["models/README.txt"]
    mine += [f"out/{n}" for n in unrelated(folder / "out")]
    return folder, mine


def batch_whole_or_absent(out: Path, clean_models: dict[str, str]) -> list[str]:
    problems = []
    for name in BATCH_MODELS:
        model, rep, db = out / f"{name}.onnx", out / f"{name}.json", out / f"{name}.duckdb"
        if model.exists():
            try:
                onnx.checker.check_model(onnx.load(str(model)))
                if sha256(model) != clean_models[name]:
                    problems.append(f"{model.name} is whole but not the clean run's model")
            except Exception as e:  # noqa: BLE001
                problems.append(f"{model.name} is partial: {type(e).__name__}: {e}")
        if rep.exists():
            try:
                assert "verification" in json.loads(rep.read_text())
            except (ValueError, AssertionError) as e:
                problems.append(f"{rep.name} is partial: {e!r}")
        if db.exists() and egraph_problem(db):
            problems.append(f"{db.name} is partial: {egraph_problem(db)}")
    if (out / "results.duckdb").exists():
        try:
            batch_rows(out)
        except duckdb.Error as e:
            # a killed batch may leave a WAL: a read-only open must still see a consistent table
            problems.append(f"results.duckdb does not open: {str(e).splitlines()[0]}")
    if (out / "results.csv").exists():
        text = (out / "results.csv").read_text()
        rows = list(csv.reader(text.splitlines()))
        if not rows or rows[0][:2] != ["model", "status"] or not text.endswith("\n") or any(
                len(r) != len(rows[0]) for r in rows):
            problems.append("results.csv is partial")
    if (out / "summary.md").exists() and not (out / "summary.md").read_text().endswith("\n"):
        problems.append("summary.md is partial")
    return problems


def campaign_batch(root: Path, models: Path, env: dict, points: int) -> Figures:
    fig = Figures("batch")
    clean_dir, _ = batch_folder(root, models, "clean")
    t0 = time.monotonic()
    rc, err = finish(start(batch_args(), clean_dir, env))
    duration = time.monotonic() - t0
    assert rc == 0, err
    clean_out = clean_dir / "out"
    clean_rows, clean_names = batch_rows(clean_out), listing(clean_out)
    clean_models = {n: sha256(clean_out / f"{n}.onnx") for n in BATCH_MODELS}
    assert {r[1] for r in clean_rows} == {"ok"}, clean_rows
    rng = random.Random(SEED + 1)
    folder = None
    for i in range(points):
        delay = rng.uniform(0, duration)
        fresh = i % 2 == 0 or folder is None
        if fresh:
            folder, mine = batch_folder(root, models, f"k{i}")
        out = folder / "out"
        before = hashes(folder, mine)
        fig.points += 1
        where = f"kill point {i} ({delay:.2f} s of {duration:.2f} s, {'fresh' if fresh else '--force over earlier outputs'})"
        killed, problems = kill_after(start(batch_args(force=not fresh), folder, env), delay)
        fig.killed += killed
        fig.finished_first += not killed
        problems += batch_whole_or_absent(out, clean_models)
        extra = listing(out) - clean_names
        fig.temps_after_kill += bool(extra)
        problems += [f"unexpected file after the kill: {n}" for n in sorted(extra) if not TEMP_RE.fullmatch(n)]
        if set(os.listdir(folder / "models")) != {*(f"{n}.onnx" for n in BATCH_MODELS), "README.txt"}:
            problems.append(f"the models folder changed: {sorted(os.listdir(folder / 'models'))}")
        if hashes(folder, mine) != before:
            problems.append("an input or unrelated file changed")
        rc, err = finish(start(batch_args(), folder, env))
        if rc != 0:
            problems.append(f"the next run failed (exit {rc}): {err.strip()[-500:]}")
        else:
            try:
                rows = batch_rows(out)
            except duckdb.Error as e:
                rows = [str(e).splitlines()[0]]
            if rows != clean_rows:
                problems.append(f"the next run's results rows disagree with a clean run's: {rows} != {clean_rows}")
            problems += [f"stray file after the next run: {n}" for n in sorted(listing(out) - clean_names)]
            problems += [f"missing after the next run: {n}" for n in sorted(clean_names - listing(out))]
            problems += batch_whole_or_absent(out, clean_models)
        if hashes(folder, mine) != before:
            problems.append("an input or unrelated file changed after the next run")
        fig.failures += [f"{where}: {p}" for p in problems]
    return fig


# ---------------------------------------------------------------- the tests

def report(fig: Figures, seconds: float) -> None:
    print(f"\n{fig.line()}; {seconds:.0f} s")
    for f in fig.failures:
        print("  " + f)
    assert not fig.failures, "\n".join(fig.failures)


def test_sigkill_optimize_at_random_points(tmp_path, models, env):
    t0 = time.monotonic()
    report(campaign_optimize(tmp_path, models, env, SHORT_POINTS["optimize"]), time.monotonic() - t0)


# ~26 s. By default a batch is killed mid-run and rerun in
# tests/test_batch_kill.py::test_kill_mid_batch_then_rerun_rows_match_files (and killed while creating its
# results table in ::test_a_batch_killed_while_creating_its_results_table_leaves_nothing_the_next_run_refuses);
# the campaign's checks run by default in test_sigkill_optimize_at_random_points
@pytest.mark.slow
def test_sigkill_batch_at_random_points(tmp_path, models, env):
    t0 = time.monotonic()
    report(campaign_batch(tmp_path, models, env, SHORT_POINTS["batch"]), time.monotonic() - t0)


@pytest.mark.slow
def test_sigkill_optimize_at_many_random_points(tmp_path, models, env):
    t0 = time.monotonic()
    report(campaign_optimize(tmp_path, models, env, SLOW_POINTS), time.monotonic() - t0)


@pytest.mark.slow
def test_sigkill_batch_at_many_random_points(tmp_path, models, env):
    t0 = time.monotonic()
    report(campaign_batch(tmp_path, models, env, SLOW_POINTS), time.monotonic() - t0)


# ---------------------------------------------------------------- defects found (kept failing: others own driver/)

def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_a_killed_optimize_leaves_no_egraph_temp_file_after_the_next_run(tmp_path, models, env):
    folder, _ = opt_folder(tmp_path, models, "run")
    p = start(OPT_ARGS, folder, env)
    end = time.monotonic() + 120
    while not any(n.startswith(".e.duckdb.tmp-") for n in os.listdir(folder)):
        assert p.poll() is None and time.monotonic() < end, "the run ended before its e-graph file appeared"
        time.sleep(0.01)
    time.sleep(0.3)  # the e-graph is being built
    killed, problems = kill_after(p, 0)
    assert killed and not problems
    assert not [p for p in opt_whole_or_absent(folder, {"model": None, "nodes": None}) if "partial" in p]
    rc, err = finish(start(OPT_ARGS, folder, env))
    assert rc == 0, err
    assert sorted(n for n in os.listdir(folder) if TEMP_RE.fullmatch(n)) == []


# the kill windows of save_model_atomic and write_text_atomic are milliseconds wide: the leftovers are made
# here as a kill there leaves them (a model temp folder is named with its writer's pid); one run sweeps both
def test_a_killed_optimize_leaves_no_output_temp_file_after_the_next_run(tmp_path, models, env):
    folder, _ = opt_folder(tmp_path, models, "run")
    model_stale = folder / f".o.onnx.{dead_pid()}.k1ll3d_x"
    model_stale.mkdir()
    (model_stale / "o.onnx").write_bytes((models / f"{OPT_MODEL}.onnx").read_bytes()[:1000])
    report_stale = folder / f".r.json.{dead_pid()}.tmp"
    report_stale.write_text('{"nodes_in": 3')
    rc, err = finish(start(OPT_ARGS, folder, env))
    assert rc == 0, err
    assert not model_stale.exists(), f"{model_stale.name} is still there after the next run"
    assert not report_stale.exists(), f"{report_stale.name} is still there after the next run"


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MB tmpfs, mounted when run as root (skipped otherwise)."""
    small = tmp_path / "small"
    small.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield small
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)


def batch_on_small_tmpfs(tmp_path, models, env, small):
    folder, mine = batch_folder(tmp_path, models, "run")
    before = hashes(folder, mine)
    args = [*batch_args(), "--memory-limit", "25MB", "--temp-dir", small]
    rc, err = finish(start(args, folder, env))
    out = folder / "out"
    assert rc != 0, err
    assert "Traceback" not in err, err
    assert os.listdir(small) == []
    assert batch_whole_or_absent(out, {}) == []
    assert not any((out / f"{n}{ext}").exists() for n in BATCH_MODELS for ext in (".onnx", ".json", ".duckdb"))
    assert sorted(n for n in listing(out) if n.startswith(".")) == [".batch.lock", ".e.duckdb.swp"]
    assert hashes(folder, mine) == before
    with duckdb.connect(str(out / "results.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT model, status, reason FROM results ORDER BY model").fetchall()
    assert [(m, s) for m, s, _ in rows] == [(n, "failed") for n in sorted(BATCH_MODELS)]
    return err, rows


# every check of this test runs by default in test_a_full_temp_dir_in_batch_is_one_line_naming_the_limit (the same
# batch_on_small_tmpfs, plus the reasons)
@pytest.mark.slow
def test_a_full_temp_dir_fails_batch_with_nothing_partial_left(tmp_path, models, env, small_tmpfs):
    batch_on_small_tmpfs(tmp_path, models, env, small_tmpfs)


def test_a_full_temp_dir_in_batch_is_one_line_naming_the_limit(tmp_path, models, env, small_tmpfs):
    err, rows = batch_on_small_tmpfs(tmp_path, models, env, small_tmpfs)
    for model, _, reason in rows:
        assert (reason.startswith("out of memory") and "--memory-limit 25MB" in reason) or (
            reason.startswith(f"out of disk space in {small_tmpfs}") and "--temp-dir" in reason), (model, reason)
    failed = [line for line in err.splitlines() if line.startswith("failed ")]
    assert len(failed) == len(BATCH_MODELS) and all("internal error" not in line for line in failed), err
