"""relsat batch: a small zoo with a corrupt file and a model broken on purpose, resume, time-outs,
and the shared cost cache under concurrent processes."""

import csv
import fcntl
import json
import multiprocessing as mp
import subprocess
import sys
import textwrap
import time

import duckdb
import onnx
import pytest
from typer.testing import CliRunner

from relsat.driver.boundary import zoo
from relsat.driver.app import batch as B
from relsat.driver.app import batch_model as M
from relsat.driver.app import cli
from relsat.driver.errors import RelsatError
from relsat.driver.boundary.verify import verify
from relsat.extract.cost_cache import CostCache, CostRow

runner = CliRunner()
GOOD = ("resnet50", "vgg19")
# A wrong rule: Sigmoid(x) = x. Only nasrnn has Sigmoid, the x it leaves is cheaper than Sigmoid(x) under
# any cost model, so the extraction takes it and the optimized nasrnn computes something else.
WRONG_RULE = "sigmoid-drop: (Sigmoid ?x) => ?x\n"
FAST = dict(node_limit=300, iter_limit=2, measure=False, threads=1)  # threads: the same options whatever --jobs
FAST_ARGS = ["--node-limit", "300", "--iter-limit", "2", "--no-measure", "--threads", "1"]


def table(outdir):
    with duckdb.connect(str(outdir / "results.duckdb"), read_only=True) as con:
        cur = con.execute("SELECT * FROM results ORDER BY model")
        cols = [d[0] for d in cur.description]
        return {r[0]: dict(zip(cols, r)) for r in cur.fetchall()}


def leftovers(outdir):
    return sorted(p.name for p in outdir.iterdir() if p.name.startswith(".") and p.name != ".batch.lock")


@pytest.fixture
def zoo_dir(tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    for name in GOOD + ("nasrnn",):
        zoo.save(zoo.build(name, small=True), d / f"{name}.onnx")
    (d / "broken.onnx").write_bytes(b"\x08\x07this is not a protobuf model" * 10)
    wrong = tmp_path / "wrong.rules"
    wrong.write_text(WRONG_RULE)
    return d, wrong


def test_batch_optimizes_good_models_reports_bad_ones_and_resumes(zoo_dir, tmp_path, monkeypatch):
    models, wrong = zoo_dir
    out = tmp_path / "out"
    cache = tmp_path / "costs.duckdb"
    monkeypatch.setenv("RELSAT_COST_CACHE", str(cache))  # measured costs: two workers share one cache

    # 0. the command refuses the wrong rule before any model runs (it is checked on random tensors)
    res = runner.invoke(cli.app, ["batch", str(models), "-o", str(out), "--jobs", "2", "--rules", "default",
                                  "--rules", str(wrong), *FAST_ARGS])
    assert res.exit_code == 1 and not out.exists(), res.output
    assert res.stderr.strip().splitlines() == [f"error: {wrong}:1:1: rule sigmoid-drop is unsound: "
                                               + res.stderr.split("is unsound: ", 1)[1].strip()]

    # 1. with the rule check skipped (the Python API's check_rules=False), the wrong rule gets through
    # extraction and verification catches it: two workers, the default rules plus the wrong one
    first = B.run_batch(models, out, jobs=2, rules=["default", str(wrong)], check_rules=False, **FAST)
    assert first.failed == 2 and len(first.rows) == 4
    rows = table(out)
    assert {m: r["status"] for m, r in rows.items()} == \
        {"broken": "failed", "nasrnn": "failed", "resnet50": "ok", "vgg19": "ok"}
    assert "not an ONNX model" in rows["broken"]["reason"]
    assert "verification failed" in rows["nasrnn"]["reason"]
    assert "\n" not in rows["broken"]["reason"] + rows["nasrnn"]["reason"]
    for name in GOOD:
        r = rows[name]
        optimized = onnx.load(out / f"{name}.onnx")
        onnx.checker.check_model(optimized, full_check=True)
        assert verify(onnx.load(models / f"{name}.onnx"), optimized).ok
        rep = json.loads((out / f"{name}.json").read_text())
        assert rep["verification"]["ok"] and rep["cost_model"] == "measured"
        assert r["speedup"] == pytest.approx(rep["predicted"]["input"] / rep["predicted"]["extracted"])
        assert r["speedup_source"] == "predicted cost (measured)"  # --no-measure: no latencies
        assert (r["nodes_in"], r["nodes_out"], r["enodes"]) == (rep["nodes_in"], rep["nodes_out"], rep["enodes"])
        assert r["optimizer_s"] > 0 and r["wall_s"] >= r["optimizer_s"]
        most = sorted(((k, v) for k, v in rep["rules_applied"].items() if v), key=lambda kv: -kv[1])[:3]
        assert r["top_rules"] == ", ".join(f"{k} x{v}" for k, v in most)
    # the BatchNormalization folds were found; whether the extraction takes them rests on one-node costs
    # measured by two workers at once on two cores, where a small model's Conv-with-bias and Conv + BN differ by
    # less than the noise (CI once wrote ResNet-50 unfolded, 61 -> 61 nodes): the batch is what this tests
    rep = json.loads((out / "resnet50.json").read_text())
    assert rep["rules_applied"].get("bn-fold-conv", 0) > 0
    assert rows["resnet50"]["nodes_out"] <= rows["resnet50"]["nodes_in"]
    assert not (out / "nasrnn.onnx").exists() and not (out / "broken.onnx").exists()
    assert not (out / "nasrnn.json").exists()
    assert leftovers(out) == []
    assert CostCache(cache).count() > 0  # both workers stored their measured costs
    with open(out / "results.csv") as fh:
        got = {r["model"]: (r["status"], r["this_run"]) for r in csv.DictReader(fh)}
    assert got == {"broken": ("failed", "failed"), "nasrnn": ("failed", "failed"),
                   "resnet50": ("ok", "optimized"), "vgg19": ("ok", "optimized")}
    summary = (out / "summary.md").read_text()
    assert "verification failed" in summary and "not an ONNX model" in summary and "| resnet50 | ok |" in summary

    # 2. rerun with the same options: done models skipped (files untouched), failed ones tried again
    stamps = {n: (out / f"{n}.onnx").stat().st_mtime_ns for n in GOOD}
    ran = []
    again = B.run_batch(models, out, jobs=2, rules=["default", str(wrong)], check_rules=False, on_result=ran.append,
                        **FAST)
    assert sorted(r["model"] for r in ran) == ["broken", "nasrnn"]
    assert (again.ran, again.skipped, again.failed) == (2, 2, 2)
    assert {r["model"]: r["this_run"] for r in again.rows} == {
        "broken": "failed", "nasrnn": "failed", "resnet50": "skipped (done)", "vgg19": "skipped (done)"}
    assert stamps == {n: (out / f"{n}.onnx").stat().st_mtime_ns for n in GOOD}
    assert table(out)["vgg19"]["finished_at"] == rows["vgg19"]["finished_at"]

    # 3. a changed model file is a new key; --skip-failed leaves the failed ones alone
    zoo.save(zoo.build("vgg19", small=True, seed=1), models / "vgg19.onnx")
    third = B.run_batch(models, out, rules=["default", str(wrong)], check_rules=False, skip_failed=True, **FAST)
    assert {r["model"]: r["this_run"] for r in third.rows} == {
        "broken": "skipped (failed before)", "nasrnn": "skipped (failed before)",
        "resnet50": "skipped (done)", "vgg19": "optimized"}
    assert third.failed == 2 and not third.ok
    assert verify(onnx.load(models / "vgg19.onnx"), onnx.load(out / "vgg19.onnx")).ok

    # 4. other options are a new key too: nasrnn without the wrong rule is optimized and verified
    fourth = B.run_batch(str(models / "nas*.onnx"), out, rules=["default"], keep_db=True, **FAST)
    assert [(r["model"], r["status"], r["this_run"]) for r in fourth.rows] == [("nasrnn", "ok", "optimized")]
    assert verify(onnx.load(models / "nasrnn.onnx"), onnx.load(out / "nasrnn.onnx")).ok
    with duckdb.connect(str(out / "nasrnn.duckdb"), read_only=True) as con:  # --keep-db: the e-graph
        assert con.execute("SELECT count(*) FROM enodes").fetchone()[0] == fourth.rows[0]["enodes"]
    assert leftovers(out) == []


def small_zoo(root, names=zoo.NAMES):
    """Every zoo model (reduced size; or those of NAMES) and a corrupt file in ROOT/models; the wrong rule in
    ROOT/wrong.rules."""
    models = root / "models"
    models.mkdir()
    for name in names:
        zoo.save(zoo.build(name, small=True), models / f"{name}.onnx")
    (models / "broken.onnx").write_bytes(b"\x08\x07not a model" * 10)
    wrong = root / "wrong.rules"
    wrong.write_text(WRONG_RULE)
    return models, wrong


def check_small_zoo_batch(models, out, run, failing, names=zoo.NAMES):
    """Run a batch over ``small_zoo``'s models (``names``) with ``run()`` twice and check what every executor must
    give: the models of ``failing`` (name -> words of the reason) failed with no files, every other
    one is optimized, verifies and has its hashes in its row, no temporary files are left, and the
    rerun skips the done models (files untouched) and tries the failed ones again."""
    run()
    rows = table(out)
    assert {m: r["status"] for m, r in rows.items()} == \
        {**dict.fromkeys(names, "ok"), **dict.fromkeys(failing, "failed")}
    done = sorted(set(rows) - set(failing))
    for name, needle in failing.items():
        assert needle in rows[name]["reason"] and "\n" not in rows[name]["reason"], rows[name]["reason"]
        assert not (out / f"{name}.onnx").exists() and not (out / f"{name}.json").exists()
    for name in done:
        assert verify(onnx.load(models / f"{name}.onnx"), onnx.load(out / f"{name}.onnx")).ok
        assert json.loads((out / f"{name}.json").read_text())["verification"]["ok"]
        hashes = M.output_hashes(out, name, False)
        assert (rows[name]["output_sha256"], rows[name]["report_sha256"]) == \
            (hashes["output_sha256"], hashes["report_sha256"])
    assert leftovers(out) == []
    with open(out / "results.csv") as fh:
        assert {r["model"]: r["this_run"] for r in csv.DictReader(fh)} == \
            {**dict.fromkeys(done, "optimized"), **dict.fromkeys(failing, "failed")}
    stamps = {n: (out / f"{n}.onnx").stat().st_mtime_ns for n in done}

    run()
    with open(out / "results.csv") as fh:
        assert {r["model"]: r["this_run"] for r in csv.DictReader(fh)} == \
            {**dict.fromkeys(done, "skipped (done)"), **dict.fromkeys(failing, "failed")}
    assert stamps == {n: (out / f"{n}.onnx").stat().st_mtime_ns for n in done}
    again = table(out)
    assert all(again[n]["finished_at"] == rows[n]["finished_at"] for n in done)
    assert all(again[n]["finished_at"] > rows[n]["finished_at"] for n in failing)
    assert leftovers(out) == []


# ~40 s. By default the local executor's campaign (wrong rule, corrupt file, rows, resume) is
# test_batch_optimizes_good_models_reports_bad_ones_and_resumes, and the same checks on three zoo models are
# tests/test_batch_ray.py::test_ray_batch_over_the_small_zoo_reports_the_corrupt_file_and_resumes
@pytest.mark.slow
def test_batch_over_the_whole_small_zoo(tmp_path, monkeypatch):
    """Every zoo model (reduced size) plus a corrupt file, with the wrong rule breaking nasrnn:
    the nine others are optimized and verify, the two bad ones are reported, a rerun skips."""
    models, wrong = small_zoo(tmp_path)
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "costs.duckdb"))
    out = tmp_path / "out"
    check_small_zoo_batch(
        # two workers (FAST keeps each to one thread): ~40 s with one
        models, out, lambda: B.run_batch(models, out, jobs=2, rules=["default", str(wrong)], check_rules=False,
                                         **FAST),
        {"nasrnn": "verification failed", "broken": "not an ONNX model"})


def test_model_timeout_kills_the_worker_and_removes_stale_outputs(tmp_path):
    models = tmp_path / "m"
    models.mkdir()
    zoo.save(zoo.build("resnet50", small=True), models / "resnet50.onnx")
    out = tmp_path / "out"
    out.mkdir()
    (out / "resnet50.onnx").write_bytes(b"from an earlier run")  # must not survive a failed attempt
    (out / ".resnet50.onnx.x1y2").mkdir()  # a temporary folder a killed worker left
    t = time.perf_counter()
    # force: no batch recorded the stale model as its own (a file of unknown origin is refused without it)
    res = B.run_batch(models, out, model_timeout=0.3, cost_model="analytic", measure=False, force=True)
    assert time.perf_counter() - t < 30
    (row,) = res.rows
    assert row["status"] == "failed" and "timed out" in row["reason"] and "0.3 s" in row["reason"]
    assert not (out / "resnet50.onnx").exists() and leftovers(out) == []
    assert mp.active_children() == []  # the worker was killed and reaped


def test_batch_level_problems_are_one_line_errors(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "m").mkdir()
    zoo.save(zoo.build("vgg19", small=True), tmp_path / "m" / "vgg19.onnx")
    cases = [
        ([str(tmp_path / "missing")], "no such folder or file"),
        ([str(empty)], "no .onnx models found"),
        ([str(tmp_path / "m"), "--rules", "no-such-set"], "no-such-set"),
        ([str(tmp_path / "m"), "--jobs", "0"], "--jobs 0"),
        ([str(tmp_path / "m"), "--cost-model", "guess"], "--cost-model guess"),
    ]
    for args, needle in cases:
        res = runner.invoke(cli.app, ["batch", *args, "-o", str(tmp_path / "out")])
        assert res.exit_code == 1, (args, res.output)
        assert needle in res.output and len(res.output.strip().splitlines()) == 1, res.output
    out = tmp_path / "busy"
    out.mkdir()
    with open(out / ".batch.lock", "a") as fh:  # another batch holds the folder
        fcntl.flock(fh, fcntl.LOCK_EX)
        with pytest.raises(RelsatError, match="another relsat batch"):
            B.run_batch(tmp_path / "m", out)
    assert not (out / "results.duckdb").exists()


def test_models_are_found_recursively_named_uniquely_and_outdir_excluded(tmp_path):
    root = tmp_path / "zoo"
    for rel in ("a/net.onnx", "b/net.onnx", "top.onnx", "results.onnx", ".hidden/x.onnx", "out/old.onnx"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x")
    names = [t.name for t in B.find_models(root, root / "out")]
    assert names == ["a__net", "b__net", "results_model", "top"]
    assert [t.name for t in B.find_models(str(root / "*" / "net.onnx"))] == ["a__net", "b__net"]
    assert B.model_hash(root / "top.onnx") == B.model_hash(root / "a" / "net.onnx")  # same bytes
    (root / "a" / "net.onnx").write_bytes(b"y")
    assert B.model_hash(root / "top.onnx") != B.model_hash(root / "a" / "net.onnx")


# ---------------------------------------------------------------- the shared cost cache, concurrently

_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import relsat.extract.cost_cache as cc
    from relsat.extract.cost_cache import CostCache, CostRow

    path, tag, go, n = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    retries, real_sleep = 0, time.sleep

    class Clock:  # CostCache sleeps only between retries on a locked file: count them
        def __getattr__(self, k):
            return getattr(time, k)

        def sleep(self, s):
            global retries
            retries += 1
            real_sleep(s)

    cc.time = Clock()
    row = lambda k: CostRow(k, "cpu", 1, "Relu", {"k": k}, float(len(k)), 3, "test")
    while not go.exists():
        real_sleep(0.001)
    cache = CostCache(path)  # the file does not exist yet: both processes race to create it
    for i in range(n):
        cache.store([row(f"{tag}-{i}"), row(f"shared-{i}")])
        got = cache.lookup([f"{tag}-{i}", f"shared-{i}"])
        assert got == {f"{tag}-{i}": float(len(f"{tag}-{i}")), f"shared-{i}": float(len(f"shared-{i}"))}, got
    print("retries", retries)
""")


def test_cost_cache_two_processes_create_store_and_look_up_concurrently(tmp_path):
    path, go, n = tmp_path / "sub" / "costs.duckdb", tmp_path / "go", 12
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), tag, str(go), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for tag in "ab"]
    time.sleep(0.5)  # both started and importing; then release them together
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for _, e in outs]
    retries = sum(int(o.split()[-1]) for o, _ in outs)
    assert retries > 0, "the two writers never met: the test did not exercise the lock"
    cache = CostCache(path)
    assert cache.count() == 3 * n
    assert len(cache.lookup([f"{t}-{i}" for t in ("a", "b", "shared") for i in range(n)])) == 3 * n


_KILLED = textwrap.dedent("""
    import sys
    from relsat.extract.cost_cache import CostCache, CostRow
    cache, i = CostCache(sys.argv[1]), 0
    while True:
        cache.store([CostRow(f"k-{i}-{j}", "cpu", 1, "Relu", {}, 1.0, 3, "test") for j in range(500)])
        i += 1
        print(i, flush=True)
""")


def test_cost_cache_survives_a_writer_killed_mid_store(tmp_path):
    """relsat batch kills workers that run past --model-timeout, possibly inside a store."""
    path = tmp_path / "costs.duckdb"
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "1"  # one store committed; kill during the next ones
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    done = int((proc.stdout.read().split() or ["1"])[-1])  # stores reported committed
    cache = CostCache(path, lock_timeout_s=5)  # the lock died with the process
    n = cache.count()
    assert n % 500 == 0 and n >= 500 * done  # whole stores only, none lost
    cache.store([CostRow("after", "cpu", 1, "Relu", {}, 2.0, 3, "test")])
    assert cache.lookup(["after"]) == {"after": 2.0} and cache.count() == n + 1
