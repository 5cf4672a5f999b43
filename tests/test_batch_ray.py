"""relsat batch --executor ray on a local Ray instance (two CPUs): the small zoo with a corrupt file
through the command line, with the local executor's checks (tests/test_batch.py); the costs a task
measures merged into the driver's cost cache; a time-out; the one-line error without Ray."""

import json
import subprocess
import sys

import pytest
import ray
from test_batch import FAST, FAST_ARGS, check_small_zoo_batch, leftovers, small_zoo
from typer.testing import CliRunner

from relsat.driver.boundary import zoo
from relsat.driver.app import batch as B
from relsat.driver.app import cli
from relsat.extract.cost_cache import CostCache

runner = CliRunner()


@pytest.fixture(scope="module")
def local_ray():
    """One Ray instance for the module; run_batch finds it initialized and uses it."""
    ray.init(num_cpus=2, logging_level="WARNING")
    yield
    ray.shutdown()


# The executor's checks on three models of the small zoo (~30 s for all eleven): every zoo model through a batch is
# tests/test_batch.py::test_batch_over_the_whole_small_zoo (-m slow)
RAY_MODELS = ("bert", "squeezenet", "vgg19")


def test_ray_batch_over_the_small_zoo_reports_the_corrupt_file_and_resumes(local_ray, tmp_path, monkeypatch):
    models, _ = small_zoo(tmp_path, RAY_MODELS)
    cache = tmp_path / "costs.duckdb"
    monkeypatch.setenv("RELSAT_COST_CACHE", str(cache))
    out = tmp_path / "out"

    def run():
        res = runner.invoke(cli.app, ["batch", str(models), "-o", str(out), "--executor", "ray", "--jobs", "2",
                                      *FAST_ARGS])
        assert res.exit_code == 1, res.output
        assert f"1 of {len(RAY_MODELS) + 1} models failed" in res.stderr, res.stderr

    check_small_zoo_batch(models, out, run, {"broken": "not an ONNX model"}, RAY_MODELS)
    assert CostCache(cache).count() > 0  # the tasks' measured costs came back


def test_costs_a_ray_task_measures_are_merged_into_the_drivers_cache(local_ray, tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    zoo.save(zoo.build("squeezenet", small=True), tmp_path / "m" / "squeezenet.onnx")
    cache = tmp_path / "costs.duckdb"
    monkeypatch.setenv("RELSAT_COST_CACHE", str(cache))
    out = tmp_path / "out"

    first = B.run_batch(tmp_path / "m", out, executor="ray", **FAST)
    rep = json.loads((out / "squeezenet.json").read_text())
    assert first.ok and rep["cost_model"] == "measured" and rep["profiled"] > 0 and rep["cached"] == 0
    assert first.costs_merged > rep["profiled"]  # every signature measured, and the call overhead
    assert CostCache(cache).count() == first.costs_merged  # the driver's cache was empty

    # the next task starts from the driver's cache: nothing left to measure, nothing to merge
    again = B.run_batch(tmp_path / "m", out, executor="ray", force=True, **FAST)
    rep = json.loads((out / "squeezenet.json").read_text())
    assert again.ok and again.rows[0]["this_run"] == "optimized"
    assert (rep["profiled"], rep["cached"], again.costs_merged) == (0, rep["profile"]["signatures"], 0)
    assert CostCache(cache).count() == first.costs_merged
    # the executor is not part of a model's key: the local executor resumes what Ray did
    assert B.run_batch(tmp_path / "m", out, **FAST).rows[0]["this_run"] == "skipped (done)"


def test_ray_model_timeout_cancels_the_task_and_removes_stale_outputs(local_ray, tmp_path):
    (tmp_path / "m").mkdir()
    zoo.save(zoo.build("resnet50", small=True), tmp_path / "m" / "resnet50.onnx")
    out = tmp_path / "out"
    out.mkdir()
    (out / "resnet50.onnx").write_bytes(b"from an earlier run")  # must not survive a failed attempt
    # force: no batch recorded the stale model as its own (a file of unknown origin is refused without it)
    res = B.run_batch(tmp_path / "m", out, executor="ray", model_timeout=0.2, cost_model="analytic", measure=False,
                      force=True)
    (row,) = res.rows
    assert row["status"] == "failed" and row["reason"].startswith("timed out") and "0.2 s" in row["reason"]
    assert not (out / "resnet50.onnx").exists() and leftovers(out) == []


def test_without_ray_the_executor_is_a_one_line_error(tmp_path):
    (tmp_path / "m").mkdir()
    zoo.save(zoo.build("vgg19", small=True), tmp_path / "m" / "vgg19.onnx")
    out = tmp_path / "out"
    code = ("import sys; sys.modules['ray'] = None  # import ray fails, as where the extra is not installed\n"
            "from relsat.driver.app.cli import main\n"
            f"sys.argv = ['relsat', 'batch', {str(tmp_path / 'm')!r}, '-o', {str(out)!r}, '--executor', 'ray']\n"
            "main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == ["error: --executor ray: Ray is not installed "
                                                "(pip install 'relsat[ray]')"]
    assert not out.exists()
