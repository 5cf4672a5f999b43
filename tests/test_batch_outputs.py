"""relsat batch and the files of its output folder (issue 26, items 1 and 6): a file at a path the
batch writes that no batch wrote is refused with one line (or replaced with --force, which says so),
never silently replaced; files a batch wrote are replaced on a rerun and resume keeps working;
results.csv ends its lines with LF; --executor ray with an address that does not answer fails
within the connect timeout, with one line; the --executor help names the extra to install.

Real CLI in subprocesses, real DuckDB, real ONNX Runtime; a tiny model (MatMul, Relu)."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import duckdb
import onnx
import pytest
from test_safety import small_model

from relsat.driver.app import batch as B
from relsat.driver.errors import RelsatError

CLI = [sys.executable, "-c", "from relsat.driver.app.cli import main; main()", "batch"]
QUICK = ["--cost-model", "analytic", "--no-measure", "--threads", "1"]
QUICK_KW = dict(cost_model="analytic", measure=False, threads=1)
MINE = b"mine\n"


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def batch(models, out, *args, env=None, timeout=120):
    return subprocess.run([*CLI, str(models), "-o", str(out), *QUICK, *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def one_line_error(stderr, *needles):
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in stderr, stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def models(tmp_path, monkeypatch):
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "costs.duckdb"))
    d = tmp_path / "models"
    d.mkdir()
    onnx.save(small_model(), d / "m.onnx")
    return d


def test_the_users_files_in_the_output_folder_are_refused_not_replaced(models, tmp_path):
    """The issue's run: m.onnx, m.json, m.duckdb, results.csv and summary.md of the user's in OUTDIR."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("m.onnx", "m.json", "m.duckdb", "results.csv", "summary.md"):
        (out / name).write_bytes(MINE)
    proc = batch(models, out, "--keep-db")
    assert proc.returncode == 1, proc.stderr
    one_line_error(proc.stderr, "m.onnx", "m.json", "m.duckdb", "results.csv", "summary.md",
                   "not written by relsat batch", "--force")
    assert snapshot(out) == dict.fromkeys(["m.duckdb", "m.json", "m.onnx", "results.csv", "summary.md"], MINE)
    assert sorted(os.listdir(out)) == sorted(snapshot(out))  # no results.duckdb, no lock file, no stage folder

    # without --keep-db the batch would remove an e-graph m.duckdb: refused as well
    (out / "m.onnx").unlink(), (out / "m.json").unlink(), (out / "results.csv").unlink(), (out / "summary.md").unlink()
    proc = batch(models, out)
    assert proc.returncode == 1
    one_line_error(proc.stderr, "m.duckdb")
    assert snapshot(out) == {"m.duckdb": MINE}


def test_a_users_duckdb_named_results_duckdb_gets_no_table(models, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with duckdb.connect(str(out / "results.duckdb")) as con:
        con.execute("CREATE TABLE t AS SELECT 42 AS answer")
    before = snapshot(out)
    proc = batch(models, out)
    assert proc.returncode == 1
    one_line_error(proc.stderr, "results.duckdb", "tables t")
    assert snapshot(out) == before
    with duckdb.connect(str(out / "results.duckdb"), read_only=True) as con:
        assert [r[0] for r in con.execute("SHOW TABLES").fetchall()] == ["t"]


def test_force_replaces_the_users_files_and_says_so_then_resume_works(models, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("m.onnx", "results.csv"):
        (out / name).write_bytes(MINE)
    with duckdb.connect(str(out / "results.duckdb")) as con:
        con.execute("CREATE TABLE t AS SELECT 42 AS answer")
    proc = batch(models, out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert "--force: replacing results.duckdb, m.onnx, results.csv" in proc.stderr, proc.stderr
    assert "replaced (--force; not written by relsat batch): results.duckdb, m.onnx, results.csv" in \
        (out / "summary.md").read_text()
    assert (out / "m.onnx").read_bytes() != MINE and onnx.load(out / "m.onnx").graph.node
    again = batch(models, out)  # files the batch wrote: no refusal, the model is skipped
    assert again.returncode == 0, again.stderr
    assert "1 done earlier" in again.stderr


def test_files_the_batch_wrote_are_its_own_on_later_runs(models, tmp_path):
    out = tmp_path / "out"
    first = B.run_batch(models, out, **QUICK_KW)
    assert first.ok and (out / "m.onnx").is_file()

    # new options: the model is optimized again and its files replaced, no refusal
    again = B.run_batch(models, out, node_limit=500, **QUICK_KW)
    assert [r["this_run"] for r in again.rows] == ["optimized"]

    # written by an older relsat (no batch_files table): the files its rows name are the batch's
    with duckdb.connect(str(out / "results.duckdb")) as con:
        con.execute("DROP TABLE batch_files")
    third = B.run_batch(models, out, node_limit=400, keep_db=True, **QUICK_KW)
    assert [r["this_run"] for r in third.rows] == ["optimized"] and (out / "m.duckdb").is_file()

    # a kill inside a commit leaves a file recorded in batch_files before it was written, and no row
    onnx.save(small_model(), models / "n.onnx")
    (out / "n.onnx").write_bytes(b"half")
    with duckdb.connect(str(out / "results.duckdb")) as con:
        con.execute("INSERT INTO batch_files VALUES ('n.onnx')")
    fourth = B.run_batch(models, out, node_limit=400, keep_db=True, **QUICK_KW)
    assert {r["model"]: r["this_run"] for r in fourth.rows} == {"m": "skipped (done)", "n": "optimized"}

    # a model that now fails loses its files; a file the user puts there afterwards is the user's
    (models / "n.onnx").write_bytes(b"\x08\x07not a model" * 10)
    fifth = B.run_batch(models, out, node_limit=400, keep_db=True, **QUICK_KW)
    assert fifth.failed == 1 and not (out / "n.onnx").exists()
    (out / "n.onnx").write_bytes(MINE)
    with pytest.raises(RelsatError, match="n.onnx already there, not written by relsat batch"):
        B.run_batch(models, out, node_limit=400, keep_db=True, **QUICK_KW)
    assert (out / "n.onnx").read_bytes() == MINE


def test_a_folder_where_the_batch_writes_a_file_is_refused_even_with_force(models, tmp_path):
    out = tmp_path / "out"
    (out / "m.json").mkdir(parents=True)
    (out / "m.json" / "keep.txt").write_text("mine")
    for force in (False, True):
        with pytest.raises(RelsatError, match="m.json: a folder where relsat batch writes a file"):
            B.run_batch(models, out, force=force, **QUICK_KW)
    assert (out / "m.json" / "keep.txt").read_text() == "mine" and sorted(os.listdir(out)) == ["m.json"]


def test_users_hidden_files_that_look_like_temporaries_are_kept(models, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".m.onnx.swp").write_bytes(MINE)  # an editor's, not save_model_atomic's folder
    (out / ".m.json.notes.tmp").write_bytes(MINE)
    assert B.run_batch(models, out, **QUICK_KW).ok
    assert (out / ".m.onnx.swp").read_bytes() == MINE and (out / ".m.json.notes.tmp").read_bytes() == MINE
    data = (out / "results.csv").read_bytes()  # and results.csv ends its lines with LF alone
    assert b"\r" not in data and data.endswith(b"\n") and data.count(b"\n") == 2


# the same batch run and assertion are in test_users_hidden_files_that_look_like_temporaries_are_kept by default
@pytest.mark.slow
def test_results_csv_ends_lines_with_lf(models, tmp_path):
    out = tmp_path / "out"
    assert B.run_batch(models, out, **QUICK_KW).ok
    data = (out / "results.csv").read_bytes()
    assert b"\r" not in data and data.endswith(b"\n") and data.count(b"\n") == 2


# ---------------------------------------------------------------- --executor ray

def _silent_listener():
    """A TCP port that accepts connections and never answers (bound on every address: Ray replaces a
    loopback host with this node's address)."""
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    s.listen()
    return s


def test_ray_at_a_closed_port_fails_at_once_with_one_line(models, tmp_path):
    pytest.importorskip("ray")
    s = socket.socket()
    s.bind(("0.0.0.0", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t = time.monotonic()
    proc = batch(models, tmp_path / "out", "--executor", "ray", "--address", f"127.0.0.1:{port}", timeout=60)
    assert time.monotonic() - t < 30 and proc.returncode == 1
    one_line_error(proc.stderr, f"--executor ray: cannot join a Ray instance at 127.0.0.1:{port}")
    assert not (tmp_path / "out").exists()


def test_ray_at_a_silent_port_gives_up_after_the_connect_timeout(models, tmp_path):
    pytest.importorskip("ray")
    with _silent_listener() as s:
        port = s.getsockname()[1]
        t = time.monotonic()
        proc = batch(models, tmp_path / "out", "--executor", "ray", "--address", f"127.0.0.1:{port}",
                     "--connect-timeout", "2", timeout=60)
        assert time.monotonic() - t < 30 and proc.returncode == 1  # not the 3 minutes of Ray's own retries
        one_line_error(proc.stderr, f"127.0.0.1:{port}", "no answer within 2 s")

        # Ctrl-C while it waits ends it at once
        s.settimeout(0.2)
        with contextlib.suppress(OSError):  # the first run's connections, still queued
            while True:
                s.accept()[0].close()
        p = subprocess.Popen([*CLI, str(models), "-o", str(tmp_path / "out"), *QUICK, "--executor", "ray",
                              "--address", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        s.settimeout(60)
        conn, _ = s.accept()  # it has connected and waits for an answer (15 s by default), however long it took
        # to start on a busy machine
        t = time.monotonic()
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
        assert time.monotonic() - t < 5 and p.returncode == 130 and b"Traceback" not in err, err
        conn.close()
    assert not (tmp_path / "out").exists()


def test_executor_help_names_the_extra_to_install():
    proc = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, COLUMNS="300", TERM="dumb"))
    assert proc.returncode == 0
    line = next(x for x in proc.stdout.splitlines() if "--executor" in x)
    assert "pip install 'relsat[ray]'" in line, line
