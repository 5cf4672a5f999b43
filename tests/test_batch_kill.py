"""relsat batch killed with SIGKILL: its workers die with it, a rerun finishes the batch, and every
row of results.duckdb matches the files on disk (a model whose files do not match its row is redone).

Real processes throughout: the batch runs as ``python -c 'from relsat.driver.app.cli import main; main()'``
and processes are found and watched through /proc."""

import hashlib
import os
import re
import signal
import subprocess
import sys
import time

import duckdb
import pytest

from relsat.driver.boundary import zoo
from relsat.driver.app import batch as B
from relsat.driver.app import batch_model as M
from relsat.driver.boundary import outputs
from relsat.driver.options import Options
from relsat.driver.boundary.verify import verify
from test_batch import leftovers, table  # the results table and stray files, read as test_batch reads them

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="watches processes through /proc")

CLI = [sys.executable, "-c", "from relsat.driver.app.cli import main; main()", "batch"]
QUICK = ["--cost-model", "analytic", "--no-measure", "--threads", "1"]  # threads: the same options whatever --jobs
QUICK_KW = dict(cost_model="analytic", measure=False, threads=1)
MODELS = ("bert", "squeezenet", "vgg19")  # the quickest of the small zoo


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def proc_stat(pid):
    """(ppid, state) of a live process, None when it is gone (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, ppid = fields[0], int(fields[1])
    return None if state in ("Z", "X") else (ppid, state)


def descendants(pid):
    """Every live process below ``pid``, from the ppid of each process in /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = proc_stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def wait_for(cond, timeout, what, proc=None, log=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.05)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    pytest.fail(f"timed out waiting for {what}" + (f"; batch exited {proc.returncode}" if proc and proc.poll() is not None
                                                    else "") + f"\n{tail}")


def stage_pids(outdir, names=None):
    """Worker pids, from the stage folders workers write their files to (``.NAME.stage-PID``)."""
    return {p.name[1:].rsplit(".stage-", 1)[0]: int(p.name.rsplit("-", 1)[1])
            for p in outdir.glob(".*.stage-*") if names is None or p.name[1:].rsplit(".stage-", 1)[0] in names}


def start_batch(models, out, log, *args):
    env = dict(os.environ, RELSAT_COST_CACHE=str(out.parent / "costs.duckdb"))
    return subprocess.Popen([*CLI, str(models), "-o", str(out), *QUICK, *args], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env=env)


def kill_and_check_workers_die(parent, timeout=5.0):
    """SIGKILL the batch process; every process it started must be gone within ``timeout``."""
    below = descendants(parent.pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    t = time.monotonic()
    while time.monotonic() - t < timeout and any(proc_stat(p) for p in below):
        time.sleep(0.05)
    alive = [p for p in below if proc_stat(p)]
    assert not alive, f"processes of the killed batch still running: {alive}"
    return below


@pytest.fixture
def models(tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    for name in MODELS:
        zoo.save(zoo.build(name, small=True), d / f"{name}.onnx")
    return d


def test_sigkill_of_the_batch_kills_its_workers(tmp_path):
    d = tmp_path / "slow"
    d.mkdir()
    zoo.save(zoo.build("nasrnn", small=True), d / "a.onnx")  # saturation that goes on well past the kill
    (d / "b.onnx").write_bytes((d / "a.onnx").read_bytes())
    out, log = tmp_path / "out", tmp_path / "batch.log"
    parent = start_batch(d, out, log, "--jobs", "2", "--node-limit", "10000000", "--iter-limit", "1000",
                         "--time-limit", "300", "--model-timeout", "0")
    try:
        # both workers are past their start (the stage folder comes after the parent-death setup)
        pids = wait_for(lambda: len(stage_pids(out)) == 2 and stage_pids(out), 60, "two workers", parent, log)
        assert all((proc_stat(pid) or (None,))[0] == parent.pid for pid in pids.values())  # its workers
        below = kill_and_check_workers_die(parent)
        assert set(pids.values()) <= set(below)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    time.sleep(0.5)  # nothing left to write final files
    assert not (out / "a.onnx").exists() and not (out / "b.onnx").exists()
    assert table(out) == {}


def test_kill_mid_batch_then_rerun_rows_match_files(models, tmp_path, monkeypatch):
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "costs.duckdb"))
    out, log = tmp_path / "out", tmp_path / "batch.log"
    parent = start_batch(models, out, log, "--jobs", "1")
    try:
        # kill once one model is done (its row written: "ok" printed) and the next one's worker is at work
        wait_for(lambda: re.search(r"^ok ", log.read_text(), re.M) and stage_pids(out), 90, "one model done",
                 parent, log)
        kill_and_check_workers_die(parent)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
    before = table(out)
    assert before and all(r["status"] == "ok" for r in before.values())

    res = B.run_batch(models, out, jobs=2, **QUICK_KW)
    assert res.ok and [r["model"] for r in res.rows] == list(MODELS)
    for r in res.rows:  # done before the kill: skipped; the others optimized now
        assert r["this_run"] == ("skipped (done)" if r["model"] in before else "optimized"), r
    rows = table(out)
    assert sorted(rows) == list(MODELS)
    for name, r in rows.items():
        assert r["status"] == "ok"
        output, report = out / f"{name}.onnx", out / f"{name}.json"
        assert (r["output"], r["report"], r["db"]) == (str(output), str(report), None)
        assert r["output_sha256"] == sha256(output) and r["report_sha256"] == sha256(report)
        assert not (out / f"{name}.onnx.data").exists()
        assert verify(str(models / f"{name}.onnx"), str(output)).ok
    assert leftovers(out) == []


def test_files_that_do_not_match_their_row_are_redone(models, tmp_path, monkeypatch):
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "costs.duckdb"))
    out = tmp_path / "out"
    first = B.run_batch(models, out, jobs=2, **QUICK_KW)
    assert first.ok
    stamps = {n: (out / f"{n}.onnx").stat().st_mtime_ns for n in MODELS}

    # another model's bytes in vgg19.onnx, as a stray worker of an older relsat could leave
    (out / "vgg19.onnx").write_bytes((out / "squeezenet.onnx").read_bytes())
    again = B.run_batch(models, out, jobs=2, **QUICK_KW)
    assert {r["model"]: r["this_run"] for r in again.rows} == {
        "bert": "skipped (done)", "squeezenet": "skipped (done)", "vgg19": "redone (files changed)"}
    assert (again.ran, again.skipped) == (1, 2)
    assert verify(str(models / "vgg19.onnx"), str(out / "vgg19.onnx")).ok
    assert "redone (files did not match their rows) 1" in (out / "summary.md").read_text()
    assert {n: (out / f"{n}.onnx").stat().st_mtime_ns for n in ("bert", "squeezenet")} == \
        {n: stamps[n] for n in ("bert", "squeezenet")}

    # a row without file hashes (an older relsat wrote it), a missing report, and a stage folder
    # a killed worker left
    with duckdb.connect(str(out / "results.duckdb")) as con:
        con.execute("UPDATE results SET output_sha256 = NULL, report_sha256 = NULL WHERE model = 'bert'")
    (out / "squeezenet.json").unlink()
    (out / ".vgg19.stage-999999").mkdir()
    (out / ".vgg19.stage-999999" / "vgg19.onnx").write_bytes(b"half")
    third = B.run_batch(models, out, jobs=2, **QUICK_KW)
    assert {r["model"]: r["this_run"] for r in third.rows} == {
        "bert": "redone (no file hashes recorded)", "squeezenet": "redone (files missing)",
        "vgg19": "skipped (done)"}
    for name, r in table(out).items():
        assert r["output_sha256"] == sha256(out / f"{name}.onnx")
        assert r["report_sha256"] == sha256(out / f"{name}.json")
    assert leftovers(out) == []


def test_external_data_models_are_committed_and_hashed_with_their_data(tmp_path, monkeypatch):
    """save_model_atomic writes NAME.onnx.data next to a large model: it is staged with the model,
    moved with it, and part of its hash; a later result without one removes it."""
    (tmp_path / "m").mkdir()
    src = tmp_path / "m" / "vgg19.onnx"
    zoo.save(zoo.build("vgg19", small=True), src)
    out = tmp_path / "out"
    out.mkdir()
    task = M.ModelTask("vgg19", src, B.model_hash(src))
    options = B.resolve_options(Options(**QUICK_KW))[0]
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "costs.duckdb"))

    monkeypatch.setattr(outputs, "EXTERNAL_DATA_BYTES", 0)
    stage = M.stage_dir(out, "vgg19", 1)
    assert M.model_fields(task, out, options, False, stage)["status"] == "ok"
    assert sorted(p.name for p in stage.iterdir()) == ["vgg19.json", "vgg19.onnx", "vgg19.onnx.data"]
    assert not (out / "vgg19.onnx").exists()  # nothing under a final name before the commit
    fields = M.commit(out, "vgg19", stage, False)
    assert not stage.exists() and (out / "vgg19.onnx.data").is_file()
    assert verify(str(src), str(out / "vgg19.onnx")).ok  # the model finds its data after the move
    row = dict(fields, model="vgg19")
    assert B._files_disagree(out, row, False) is None
    with open(out / "vgg19.onnx.data", "r+b") as fh:
        fh.write(b"\1\2\3\4")
    assert B._files_disagree(out, row, False) == "files changed"

    monkeypatch.setattr(outputs, "EXTERNAL_DATA_BYTES", 1 << 40)
    stage = M.stage_dir(out, "vgg19", 2)
    assert M.model_fields(task, out, options, False, stage)["status"] == "ok"
    fields = M.commit(out, "vgg19", stage, False)
    assert not (out / "vgg19.onnx.data").exists()
    assert fields["output_sha256"] == sha256(out / "vgg19.onnx")
    assert verify(str(src), str(out / "vgg19.onnx")).ok


_WATCHED = """
import sys, time
from relsat.driver.app import batch as B
B._start_parent_watchdog(int(sys.argv[1]), sys.stdout)  # the fallback alone, no parent-death signal
print("watching", flush=True)
time.sleep(60)
"""
_PARENT = """
import subprocess, sys, os, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())], stdout=subprocess.PIPE)
assert child.stdout.readline() == b"watching\\n"
print(child.pid, flush=True)
time.sleep(60)
"""


def test_the_portable_watchdog_alone_ends_a_worker_whose_parent_died(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, _WATCHED], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert (proc_stat(child) or (None,))[0] == parent.pid
        parent.kill()
        parent.wait()
        end = time.monotonic() + 5
        while proc_stat(child) and time.monotonic() < end:
            time.sleep(0.05)
        assert proc_stat(child) is None
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_batch_killed_while_creating_its_results_table_leaves_nothing_the_next_run_refuses(tmp_path):
    """Found by the 50-point fault injection: a batch SIGKILLed between DuckDB creating results.duckdb and the
    table's creation left an empty database, which the next run refused as not its own. The table is now
    built under a temporary name and renamed in; here the process is killed at exactly that point."""
    out = tmp_path / "out"
    out.mkdir()
    child = ("import os, signal, sys\n"
             "from pathlib import Path\n"
             "from relsat.driver.app import batch_model as M\n"
             "M.Results._create = staticmethod(lambda con: os.kill(os.getpid(), signal.SIGKILL))\n"
             "M.Results(Path(sys.argv[1]))\n")
    p = subprocess.run([sys.executable, "-c", child, str(out / M.RESULTS_DB)], capture_output=True)
    assert p.returncode == -signal.SIGKILL
    assert not (out / M.RESULTS_DB).exists()  # before the fix: an empty DuckDB database here
    assert [e.name for e in out.iterdir() if e.name.startswith(".results.duckdb.tmp-")]  # the dead run's temp
    M.Results(out / M.RESULTS_DB)  # the next run: sweeps the dead run's temp, creates the table whole
    assert M.read_results(out / M.RESULTS_DB) == ({}, set())
    assert sorted(e.name for e in out.iterdir()) == [M.RESULTS_DB]
