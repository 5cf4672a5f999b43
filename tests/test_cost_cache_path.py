"""The cost cache path (issue 26, item 2): a file there that is not a relsat cost cache is refused
with one line and left as it was (never renamed, never written); the input model, outputs, report
and e-graph are never the cache; only relsat's own cache folder sets a corrupt cache aside.

Real CLI (a subprocess where the issue met it), real DuckDB files, real ONNX Runtime."""

import os
import subprocess
import sys
import warnings

import duckdb
import onnx
import pytest
from test_batch_outputs import one_line_error
from test_safety import small_model
from typer.testing import CliRunner

from relsat.driver.app import batch as B
from relsat.driver.app.cli import app
from relsat.driver.errors import RelsatError
from relsat.driver.boundary.outputs import open_cost_cache
from relsat.extract.cost_cache import CostCache, CostRow, NotACostCache

CLI = [sys.executable, "-c", "from relsat.driver.app.cli import main; main()"]
runner = CliRunner()


def snapshot(folder):
    return {p.name: (p.read_bytes() if p.is_file() else "folder") for p in sorted(folder.iterdir())}


@pytest.fixture
def place(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    onnx.save(small_model(), tmp_path / "in.onnx")
    return tmp_path


def test_cost_cache_at_the_input_model_is_refused_and_the_model_left_alone(place):
    """The issue: RELSAT_COST_CACHE=in.onnx renamed the model and wrote a DuckDB file in its place."""
    before = snapshot(place)
    proc = subprocess.run([*CLI, "optimize", "in.onnx", "-o", "out.onnx", "--no-measure"], cwd=place,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, RELSAT_COST_CACHE=str(place / "in.onnx")))
    assert proc.returncode == 1, proc.stderr
    one_line_error(proc.stderr, "in.onnx", "input model")
    assert snapshot(place) == before  # not renamed, not written, no out.onnx


def test_cost_cache_at_a_users_duckdb_is_refused_without_adding_a_table(place, monkeypatch):
    with duckdb.connect(str(place / "mine.duckdb")) as con:
        con.execute("CREATE TABLE t AS SELECT 42 AS answer")
    before = snapshot(place)
    monkeypatch.setenv("RELSAT_COST_CACHE", str(place / "mine.duckdb"))
    res = runner.invoke(app, ["optimize", "in.onnx", "-o", "out.onnx", "--no-measure"])
    assert res.exit_code == 1, res.output
    one_line_error(res.stderr, "mine.duckdb", "not a relsat cost cache")
    assert snapshot(place) == before
    with duckdb.connect(str(place / "mine.duckdb"), read_only=True) as con:
        assert [r[0] for r in con.execute("SHOW TABLES").fetchall()] == ["t"]


def _users_files(place):
    (place / "notes.txt").write_text("my notes\n")
    (place / "empty").write_bytes(b"")
    (place / "folder").mkdir()
    with duckdb.connect(str(place / "their-costs.duckdb")) as con:  # a table named costs, not ours
        con.execute("CREATE TABLE costs(item VARCHAR, euros DOUBLE)")
        con.execute("INSERT INTO costs VALUES ('coffee', 2.5)")
    CostCache(place / "mixed.duckdb").store([CostRow("k", "cpu", 1, "Relu", {}, 0.5, 3, "1")])
    with duckdb.connect(str(place / "mixed.duckdb")) as con:  # a cost table in a database of the user's
        con.execute("CREATE TABLE budget AS SELECT 1 AS x")


@pytest.mark.parametrize("name, needle", [
    ("in.onnx", "not a DuckDB database"), ("notes.txt", "not a DuckDB database"),
    ("empty", "not a DuckDB database"), ("folder", "is a folder"),
    ("their-costs.duckdb", "columns item, euros"), ("mixed.duckdb", "tables budget, costs")])
def test_a_file_that_is_not_a_cost_cache_is_refused_and_left_as_it_was(place, name, needle):
    _users_files(place)
    before = snapshot(place)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "set aside" warning either
        with pytest.raises(NotACostCache, match="not a relsat cost cache"):
            CostCache(place / name)
        with pytest.raises(RelsatError, match="not a relsat cost cache") as e:  # as the driver reports it
            open_cost_cache(place / name)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert snapshot(place) == before  # nothing renamed, nothing written, no temporary file left


def test_a_new_cache_is_built_whole_and_an_existing_one_is_used(place):
    cache = CostCache(place / "sub" / "costs.duckdb")
    assert cache.count() == 0 and sorted(os.listdir(place / "sub")) == ["costs.duckdb"]
    cache.store([CostRow("k", "cpu", 1, "Relu", {}, 0.5, 3, "1")])
    assert CostCache(place / "sub" / "costs.duckdb").lookup(["k"]) == {"k": 0.5}
    cache.export(place / "exported.duckdb")  # what `relsat costs export x.duckdb` writes is a cache too
    assert CostCache(place / "exported.duckdb").lookup(["k"]) == {"k": 0.5}


def test_only_relsats_own_cache_folder_sets_a_corrupt_cache_aside(tmp_path, monkeypatch):
    monkeypatch.delenv("RELSAT_COST_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the user cache dir (platformdirs, Linux)
    own = tmp_path / "xdg" / "relsat" / "costs.duckdb"
    own.parent.mkdir(parents=True)
    own.write_bytes(b"not a database " * 100)
    with pytest.warns(UserWarning, match="set aside as costs.duckdb.corrupt-"):
        cache = CostCache()
    assert cache.path == own and cache.count() == 0
    aside = [p for p in own.parent.iterdir() if p.name.startswith("costs.duckdb.corrupt-")]
    assert len(aside) == 1 and aside[0].read_bytes() == b"not a database " * 100


@pytest.mark.parametrize("flag", ["-o", "--db", "--report"])
def test_no_output_is_the_cost_cache(place, monkeypatch, flag):
    CostCache(place / "costs.duckdb").store([CostRow("k", "cpu", 1, "Relu", {}, 0.5, 3, "1")])
    monkeypatch.setenv("RELSAT_COST_CACHE", str(place / "costs.duckdb"))
    args = {"-o": ["-o", "costs.duckdb"], "--db": ["-o", "o.onnx", "--db", "costs.duckdb"],
            "--report": ["-o", "o.onnx", "--report", "costs.duckdb"]}[flag]
    before = snapshot(place)
    res = runner.invoke(app, ["optimize", "in.onnx", *args, "--no-measure"])
    assert res.exit_code == 1, res.output
    one_line_error(res.stderr, f"{flag} costs.duckdb", "cost cache")
    assert snapshot(place) == before


def test_batch_refuses_a_cost_cache_that_is_a_model_or_a_file_it_writes(place, monkeypatch):
    (place / "models").mkdir()
    onnx.save(small_model(), place / "models" / "m.onnx")
    before = snapshot(place / "models")
    monkeypatch.setenv("RELSAT_COST_CACHE", str(place / "models" / "m.onnx"))
    with pytest.raises(RelsatError, match="input model"):
        B.run_batch(place / "models", place / "out", measure=False)
    monkeypatch.setenv("RELSAT_COST_CACHE", str(place / "out" / "m.json"))
    with pytest.raises(RelsatError, match="a file relsat batch writes"):
        B.run_batch(place / "models", place / "out", measure=False)
    monkeypatch.setenv("RELSAT_COST_CACHE", str(place / "in.onnx"))  # not a cache: refused before any model
    with pytest.raises(RelsatError, match="not a relsat cost cache"):
        B.run_batch(place / "models", place / "out", measure=False)
    assert snapshot(place / "models") == before and not (place / "out").exists()


def test_the_suite_never_uses_the_users_cost_cache():
    """``conftest.py`` gives the session a cost cache of its own: a test that names none uses it, not the user's."""
    from relsat.extract.cost_cache import default_path, own_folder

    assert not own_folder(default_path()) and CostCache().path == default_path()
