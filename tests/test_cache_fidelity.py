"""Cached whole-graph profiles never go stale (issue 25, part 2): a profile row records what it was taken
under, the measured final choice checks every profile it used against the fresh timing of its graph, and
one that disagrees beyond the noise is re-taken and its row replaced, the candidates searched again on
the fresh prices. Real ONNX Runtime sessions and timings, real DuckDB cost caches, no mocks."""

import datetime as dt
import json
import math
import shutil

import duckdb
import pytest

from relsat.driver.boundary import zoo
from relsat.driver.app.optimize import optimize
from relsat.relations.backend import CPU
from relsat.extract.context import GRAPH_OP
from relsat.extract.cost_cache import CostCache
from relsat.extract.profile import CALL_OVERHEAD_OP, OVERHEAD_MATERIAL, call_overhead_key, check_call_overhead

MODEL = "squeezenet"  # the quickest small zoo model to optimize (about 8 s here)
THREADS = 1
POISON = 5.0  # a profile taken while other jobs shared the machine: 5x the truth (squeezenet was 5.7x)


def rows(path, op_type=GRAPH_OP) -> dict:
    """key -> (ms, signature, measured_at) of the cache's rows of ``op_type``."""
    with duckdb.connect(str(path), read_only=True) as con:
        found = con.execute("SELECT key, ms, signature, measured_at FROM costs WHERE op_type = ?", [op_type]).fetchall()
    return {k: (ms, json.loads(sig), at) for k, ms, sig, at in found}


def within(check: dict) -> bool:
    return 1 / (1 + check["tolerance"]) <= check["ratio"] <= 1 + check["tolerance"]


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    """A cost cache filled by one optimize run of the small model, and that run's report."""
    path = tmp_path_factory.mktemp("honest") / "costs.duckdb"
    report = optimize(zoo.build(MODEL, small=True), threads=THREADS, cost_cache=path).report
    return path, report


def copy_of(honest, tmp_path):
    path = tmp_path / "costs.duckdb"
    shutil.copy(honest[0], path)
    return path


def test_every_profile_row_records_its_conditions(honest):
    path, report = honest
    graphs = rows(path)
    assert graphs and set(graphs) >= {c["key"] for c in report["fidelity"]["checked"]}
    for ms, sig, at in graphs.values():
        c = sig["conditions"]
        assert c["threads"] == THREADS and c["cpus"] >= 1 and len(c["loadavg"]) == 3
        assert dt.datetime.fromisoformat(c["measured_at"]) <= dt.datetime.now()
        assert c["latency_ms"] == ms and c["q1_ms"] <= ms <= c["q3_ms"] and c["runs"] >= 5
        assert c["call_overhead_ms"] > 0 and c["clock"] == "thread_time"
    (overhead,) = rows(path, CALL_OVERHEAD_OP).values()
    assert overhead[1]["conditions"]["threads"] == THREADS and overhead[1]["conditions"]["latency_ms"] == overhead[0]
    fid = report["fidelity"]
    assert fid["metric"] == "cpu" and fid["original_measured_ms"] > 0
    assert fid["original_prediction_ratio"] == pytest.approx(fid["original_predicted_ms"] / fid["original_measured_ms"])
    # a cold cache: the run calibrated the call overhead itself, so its check kept that row untimed
    check = fid["call_overhead"]
    assert check["taken_this_run"] and not check["replaced"] and check["fresh_ms"] is None
    assert check["cached_ms"] == overhead[0] > 0


def poisoned_run(honest, folder):
    """The honest cache with every whole-graph profile saying 5x what was measured, and an optimize run
    with it: (cache path, the poisoned rows, the report)."""
    folder.mkdir()
    path = copy_of(honest, folder)
    with duckdb.connect(str(path)) as con:
        con.execute("UPDATE costs SET ms = ms * ?, measured_at = TIMESTAMP '2020-01-01' WHERE op_type = ?",
                    [POISON, GRAPH_OP])
    poisoned = rows(path)
    return path, poisoned, optimize(zoo.build(MODEL, small=True), threads=THREADS, cost_cache=path).report


def test_a_poisoned_profile_is_retaken_its_row_replaced_and_the_prediction_is_fresh(honest, tmp_path):
    # Whether the fresh prediction lands within the noise of the fresh timing depends on the machine holding
    # still between the two (a shared one swung 1.7x within seconds, and a CI run saw three runs in a row 1.7x
    # off): up to five runs; the rest holds in each.
    for attempt in range(5):
        path, poisoned, report = poisoned_run(honest, tmp_path / str(attempt))
        fid = report["fidelity"]

        first = fid["first_pass"]  # the search ran twice: first on the poisoned rows
        assert first is not None and first["original_prediction_ratio"] > POISON / 2
        (stale_original,) = [r for r in fid["stale"] if r["label"] == "original"]
        assert stale_original["profile"] == "cache" and not stale_original["agrees"]
        assert stale_original["ratio"] > POISON / 2
        assert any("re-taken" in n for n in report["notices"])

        # then on fresh ones: the original's profile re-taken, its row replaced; no stale row left as it was
        (original,) = [r for r in fid["checked"] if r["label"] == "original"]
        assert original["key"] == stale_original["key"] and original["profile"] == "re-taken"
        assert report["candidates"][0]["profile"] == "re-taken"
        assert fid["retaken"] >= 1 and fid["stale_rows_replaced"] >= 1
        assert fid["stale_rows_removed"] == len(fid["stale"])
        now = rows(path)
        ms, sig, at = now[original["key"]]
        # as re-taken, or as measured once more where the timing and that measurement both contradicted it
        restated = {h["key"]: h["fresh_ms"] for h in fid["restated"] if h["restated"]}
        assert ms == pytest.approx(restated.get(original["key"], fid["original_profiled_ms"]))
        assert ms < poisoned[original["key"]][0] / 2
        assert at > dt.datetime(2021, 1, 1) and sig["conditions"]["latency_ms"] == ms
        for r in fid["stale"]:
            assert r["key"] not in now or now[r["key"]][2] > dt.datetime(2021, 1, 1)

        # the reported prediction of the original: within the tolerance of the fresh measurement
        assert fid["original_prediction_ratio"] == pytest.approx(
            fid["original_predicted_ms"] / fid["original_measured_ms"])
        assert fid["original_within_tolerance"] == (
            1 / (1 + fid["original_tolerance"]) <= fid["original_prediction_ratio"] <= 1 + fid["original_tolerance"])
        if fid["original_within_tolerance"]:
            break
    assert fid["original_within_tolerance"], fid


def test_an_agreeing_profile_is_not_retaken(honest, tmp_path):
    path = copy_of(honest, tmp_path)
    before = rows(path)
    report = optimize(zoo.build(MODEL, small=True), threads=THREADS, cost_cache=path).report
    fid = report["fidelity"]
    checks = (fid["first_pass"] or fid)["checked"]  # what the check found in the cached profiles
    (original,) = [r for r in checks if r["label"] == "original"]
    assert original["profile"] == "cache" and original["key"] in before
    assert fid["profiles_from_cache"] >= 1
    now = rows(path)
    agreeing = [r for r in checks if r["agrees"]]
    for r in agreeing:  # confirmed by the fresh timing: neither taken again nor its row touched
        assert within(r)
        assert r["key"] not in {c["key"] for c in fid["checked"] if c["profile"] == "re-taken"}
        if r["key"] in before:
            assert now[r["key"]] == before[r["key"]]
    if not fid["stale"]:  # as on a quiet machine: nothing re-taken, no row of the honest cache replaced
        assert fid["first_pass"] is None and fid["retaken"] == 0 and fid["stale_rows_removed"] == 0
        assert all(now[k] == v for k, v in before.items())
        assert not any("re-taken" in n for n in report["notices"])


def test_a_stale_call_overhead_is_replaced(tmp_path):
    cache = CostCache(tmp_path / "costs.duckdb")
    fresh = check_call_overhead(CPU, THREADS, cache)  # none cached: timed and stored
    assert fresh["cached_ms"] is None and fresh["replaced"]
    key = call_overhead_key("cpu", THREADS)
    ms, sig, _ = rows(cache.path, CALL_OVERHEAD_OP)[key]
    assert ms == fresh["fresh_ms"] and sig["conditions"]["threads"] == THREADS
    with duckdb.connect(str(cache.path)) as con:  # calibrated on a busy machine: 20x the truth
        con.execute("UPDATE costs SET ms = ms * 20 WHERE key = ?", [key])
    again = check_call_overhead(CPU, THREADS, cache)
    assert again["ratio"] > 5 and again["replaced"]
    assert rows(cache.path, CALL_OVERHEAD_OP)[key][0] == again["fresh_ms"] < ms * 10


def test_a_call_overhead_this_run_took_is_not_timed_again(tmp_path):
    """A row dated at or after the run's start is the run's own calibration: kept as it is, even when a
    fresh timing would replace it, and not timed again; an older row is checked."""
    cache = CostCache(tmp_path / "costs.duckdb")
    start = dt.datetime.now()
    first = check_call_overhead(CPU, THREADS, cache)  # a cold cache: timed and stored
    key = call_overhead_key("cpu", THREADS)
    with duckdb.connect(str(cache.path)) as con:  # twenty times the truth: any check replaces it
        con.execute("UPDATE costs SET ms = ? WHERE key = ?", [20 * first["fresh_ms"], key])
    kept = check_call_overhead(CPU, THREADS, cache, taken_since=start)
    assert kept["taken_this_run"] and not kept["replaced"] and kept["fresh_ms"] is None
    assert kept["cached_ms"] == rows(cache.path, CALL_OVERHEAD_OP)[key][0] == 20 * first["fresh_ms"]
    later = check_call_overhead(CPU, THREADS, cache, taken_since=dt.datetime.now() + dt.timedelta(seconds=2))
    assert not later["taken_this_run"] and later["replaced"] and later["ratio"] > 5
    assert rows(cache.path, CALL_OVERHEAD_OP)[key][0] == later["fresh_ms"]


def test_a_call_overhead_off_by_less_than_matters_is_kept(tmp_path):
    """A cached overhead beyond the fresh timing's noise is still kept when the difference moves the input
    graph's one-node prediction by less than ``OVERHEAD_MATERIAL`` (the row stays, so a warm cache prices the
    same graph the same way run after run), and replaced when it moves it by more."""
    cache = CostCache(tmp_path / "costs.duckdb")
    first = check_call_overhead(CPU, THREADS, cache)
    key = call_overhead_key("cpu", THREADS)
    with duckdb.connect(str(cache.path)) as con:  # three times what this machine measures: beyond any noise
        con.execute("UPDATE costs SET ms = ? WHERE key = ?", [3 * first["fresh_ms"], key])
    planted = rows(cache.path, CALL_OVERHEAD_OP)[key][0]
    # 10 nodes of a 100 ms graph: each node's cost moves by ~2x the overhead, a few hundredths of a percent
    small = check_call_overhead(CPU, THREADS, cache, nodes=10, cost_ms=100.0)
    assert small["beyond_noise"] and small["shift"] < OVERHEAD_MATERIAL and not small["replaced"]
    assert rows(cache.path, CALL_OVERHEAD_OP)[key][0] == planted
    # 1,000 nodes of a 1 ms graph: the same difference is most of the prediction
    large = check_call_overhead(CPU, THREADS, cache, nodes=1000, cost_ms=1.0)
    assert large["beyond_noise"] and large["shift"] > OVERHEAD_MATERIAL and large["replaced"]
    assert rows(cache.path, CALL_OVERHEAD_OP)[key][0] == large["fresh_ms"] != planted
