"""A cached whole-graph profile that the fresh timing disagrees with is measured again, as it was taken, before
the candidates are searched again: when that measurement agrees with the row, the row holds (the timing moved,
not the profile) and there is no second search; when it does not, the search runs again on a re-taken row (a
poisoned row always: tests/test_cache_fidelity.py). Real ONNX Runtime sessions, real DuckDB cost caches: the
timing that "moved" is the check's verdict, turned for the first check only. Whether a tiny model's row holds
when measured in a new session depends on the machine (sessions of a 0.2 ms graph differ by 10 % and more), so
each outcome is checked for what it must lead to."""

import math
import shutil

from relsat.driver.app.optimize import optimize
from relsat.driver.boundary import zoo
from relsat.driver.search.candidates import Search
from relsat.driver.search.fidelity import FIDELITY_FLOOR, REMEASURE_BURSTS
from test_cache_fidelity import MODEL, THREADS, honest, rows  # noqa: F401  (the module-scoped fixture)


def within(h) -> bool:
    """The cached latency inside the bursts' range widened by the noise (computed here from the bursts)."""
    low, high = min(h["bursts_ms"]) / (1 + h["tolerance"]), max(h["bursts_ms"]) * (1 + h["tolerance"])
    return h["range_ms"] == [low, high] and low <= h["cached_ms"] <= high


def off(h: dict, field: str) -> float:
    """How far ``h[field]`` lies from the run's timing of that graph (``timed_ms``), as a log ratio."""
    return abs(math.log(h[field] / h["timed_ms"]))


def test_a_disagreeing_row_is_measured_again_and_only_a_row_that_fails_again_is_searched_for(honest, tmp_path,
                                                                                             monkeypatch):
    real = Search.check
    calls = []

    def moved(self):  # the first check finds every cached profile off the timing, as when the machine moved
        found = real(self)
        calls.append(1)
        return [{**r, "agrees": False, "stale": True} if len(calls) == 1 and r["profile"] == "cache" else r
                for r in found]

    monkeypatch.setattr(Search, "check", moved)
    path = tmp_path / "costs.duckdb"
    shutil.copy(honest[0], path)
    before = rows(path)
    report = optimize(zoo.build(MODEL, small=True), threads=THREADS, cost_cache=path).report
    fid = report["fidelity"]
    again = fid["remeasured"]
    turned = [r for r in (fid["first_pass"] or fid)["checked"] if r["profile"] == "cache"]
    assert turned and {h["key"] for h in again} >= {r["key"] for r in turned}  # every one measured again
    for h in again:
        assert h["fresh_ms"] > 0 and len(h["bursts_ms"]) == REMEASURE_BURSTS and h["held"] == within(h)
        assert min(h["bursts_ms"]) <= h["fresh_ms"] <= max(h["bursts_ms"]) and h["tolerance"] >= FIDELITY_FLOOR
        assert h["cached_ms"] == before[h["key"]][0]
        assert bool(h.get("restated")) == (h["held"] and off(h, "fresh_ms") <= math.log1p(FIDELITY_FLOOR)
                                           < off(h, "cached_ms"))
    assert fid["confirmed"] == [h for h in again if h["held"]]
    failed = {h["key"] for h in again if not h["held"]}
    assert {r["key"] for r in fid["stale"]} == failed  # only those that failed again are stale
    if failed:  # searched again on re-taken rows
        assert fid["searches"] == 2 and fid["first_pass"] is not None and fid["retaken"] >= 1
    else:  # every row held: one search, nothing re-taken, the cache as it was
        assert fid["searches"] == 1 and fid["first_pass"] is None and fid["retaken"] == 0
        moved = {h["key"]: h for h in again if h.get("restated")}  # (held only by the band's width: restated)
        after = rows(path)
        assert {k: v for k, v in after.items() if k not in moved} == {k: v for k, v in before.items() if k not in moved}
        for k, h in moved.items():
            assert after[k][0] == h["fresh_ms"] and after[k][1]["conditions"]["restated_from"] == h["cached_ms"]
    if fid["confirmed"]:
        assert any("held" in n for n in report["notices"])


def test_a_held_row_off_the_timing_is_restated_where_measured_again_nearer_it(tmp_path):
    """``Search._restate_held``: a cached row the re-measure held, but 1.14x this run's timing while the re-measure's
    middle burst is 1.03x of it, is restated as measured now (its latency the middle burst's, ``restated_from`` the
    old one); a held row within the floor of the timing, or one whose re-measure is off the timing beyond the floor
    too, is kept as it was."""
    from relsat.extract.context import GRAPH_OP
    from relsat.extract.cost_cache import CostCache, CostRow

    from test_context import _matmul_model, _search

    cache = CostCache(tmp_path / "c.duckdb")
    sig = {"nodes": 1, "kernels": [["k", 1.0]], "conditions": {"latency_ms": 0.0}}
    cached = {"off": 9.91, "near": 9.1, "farther": 9.91}
    cache.store([CostRow(k, "cpu", 1, GRAPH_OP, {**sig, "conditions": {"latency_ms": ms}}, ms, 20, "x")
                 for k, ms in cached.items()])
    s = _search(_matmul_model(1), cache=cache)
    fresh = {"off": 8.9, "near": 8.5, "farther": 10.5}
    again = [{"key": k, "label": k, "held": True, "cached_ms": cached[k], "fresh_ms": fresh[k], "timed_ms": 8.66,
              "bursts_ms": [fresh[k] * 0.97, fresh[k], fresh[k] * 1.02], "quartiles_ms": [fresh[k] * 0.99,
              fresh[k] * 1.01], "runs": 20} for k in cached]
    s._restate_held(again)
    assert [bool(h.get("restated")) for h in again] == [True, False, False]
    after = rows(tmp_path / "c.duckdb")
    assert after["off"][0] == 8.9 and after["off"][1]["conditions"]["restated_from"] == 9.91
    assert after["near"][0] == 9.1 and after["farther"][0] == 9.91
