"""Issue 12's thread default and honest cost labels: all cores by default, the call overhead calibrated
once per cache, costs of another ONNX Runtime version used with a warning, and the all-fallback flag
(real DuckDB and ONNX Runtime)."""

import json
import os
import warnings

import duckdb
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from relsat.relations.backend import CPU, resolve
from relsat.driver.app import batch as B
from relsat.driver.app import cli
from relsat.driver.errors import RelsatError
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.options import DEFAULTS, Options
from relsat.extract.cost_cache import CostCache, CostRow
from relsat.extract.measured import MIN_COST_MS, collect_samples, measured_costs
from relsat.extract.profile import CALL_OVERHEAD_OP, call_overhead_key, calibrated_call_overhead_ms, lookup

F = TensorProto.FLOAT
OTHER = "0.0.0-test"
THREADS = 1  # timings on one thread: the calling thread's CPU time, stable on a shared machine


def tiny_model():
    """MatMul + Add + Relu + Tanh on a 4x8 input: four operator signatures."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.ones(8, np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Tanh", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", F, [4, 8])],
                              [helper.make_tensor_value_info("y", F, [4, 8])], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def egraph():
    imported = import_model(tiny_model())
    return imported.egraph, imported.opset_imports


def total(g) -> float:
    return g.con.execute("SELECT sum(ms) FROM costs").fetchone()[0]


def overhead_rows(path) -> int:
    with duckdb.connect(str(path), read_only=True) as con:
        return con.execute("SELECT count(*) FROM costs WHERE op_type = ?", [CALL_OVERHEAD_OP]).fetchone()[0]


# ------------------------------------------------------------------ --threads


def test_threads_default_to_all_cores_and_an_explicit_value_is_kept():
    cores = len(os.sched_getaffinity(0))
    assert Options().threads == DEFAULTS.threads == cores
    assert Options(threads=3).threads == 3 and Options(threads=3).check().threads == 3
    with pytest.raises(RelsatError, match="--threads 0"):
        Options(threads=0).check()
    assert [B.worker_threads(j) for j in (1, 2, cores, 2 * cores)] == [cores, max(1, cores // 2), 1, 1]
    help_text = " ".join(CliRunner().invoke(cli.app, ["optimize", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "default: all cores" in help_text
    help_text = " ".join(CliRunner().invoke(cli.app, ["batch", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "cores // jobs" in help_text


def test_batch_workers_share_the_cores_unless_threads_are_given(tmp_path):
    models = tmp_path / "m"
    models.mkdir()
    (models / "tiny.onnx").write_bytes(tiny_model().SerializeToString())
    quick = dict(cost_model="analytic", measure=False)
    shared = B.run_batch(models, tmp_path / "a", jobs=2, **quick)
    given = B.run_batch(models, tmp_path / "b", jobs=2, threads=3, **quick)
    assert [r["status"] for r in shared.rows + given.rows] == ["ok", "ok"]
    assert json.loads(shared.rows[0]["options"])["threads"] == B.worker_threads(2)
    assert json.loads(given.rows[0]["options"])["threads"] == 3


# ------------------------------------------------------------------ the call overhead, once per cache


def test_all_cached_runs_predict_the_same_total_and_store_the_call_overhead_once(tmp_path):
    path = tmp_path / "costs.duckdb"
    cache = CostCache(path)
    totals, reports = [], []
    for _ in range(3):
        g, opsets = egraph()
        reports.append(measured_costs(g, opsets, threads=THREADS, cache=cache, measure=True))
        totals.append(total(g))
        g.close()
    first, *cached = reports
    assert first.measured == first.signatures > 0 and first.failed == 0
    assert all(r.measured == 0 and r.cached == r.signatures for r in cached)
    assert totals[1] == totals[2] == totals[0]  # exactly: the overhead is the cache's, not re-timed
    assert len({r.call_overhead_ms for r in reports}) == 1 and reports[0].call_overhead_ms > 0
    assert overhead_rows(path) == 1
    assert calibrated_call_overhead_ms(CPU, THREADS, cache) == reports[0].call_overhead_ms
    assert overhead_rows(path) == 1
    assert call_overhead_key("cpu", THREADS) != call_overhead_key("cpu", THREADS, OTHER)


# ------------------------------------------------------------------ costs of another ONNX Runtime version


def test_costs_of_another_onnxruntime_version_are_used_with_a_warning(tmp_path):
    g, opsets = egraph()
    samples, _ = collect_samples(g, opsets)
    g.close()
    # a cost table written under another onnxruntime version, exported and imported as --costs does
    elsewhere = CostCache(tmp_path / "elsewhere.duckdb")
    stored = {s.key("cpu", THREADS, ort_version=OTHER): 5.0 + i for i, s in enumerate(samples)}
    elsewhere.store([CostRow(k, "cpu", THREADS, s.node.op_type, s.describe(), ms, 3, OTHER)
                     for (k, ms), s in zip(stored.items(), samples)])
    elsewhere.export(tmp_path / "table.parquet")
    cache = CostCache(tmp_path / "costs.duckdb")
    cache.import_(tmp_path / "table.parquet")
    assert cache.versions(["cpu"], THREADS) == [OTHER]

    for measure in (True, False):
        g, opsets = egraph()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rep = measured_costs(g, opsets, threads=THREADS, cache=cache, measure=measure)
        assert rep.measured == 0 and rep.cached == rep.signatures == rep.other_version == len(samples)
        assert rep.other_versions == [OTHER] and not rep.all_fallback
        notice = (f"{len(samples)} operator costs come from ONNX Runtime {OTHER} rows of the cost cache "
                  f"(this is {ort.__version__}): used as they are")
        assert rep.notices == [notice] and [str(w.message) for w in caught] == [notice]
        rows = g.con.execute("SELECT key, ms, source FROM costs WHERE key IS NOT NULL").fetchall()
        assert {k for k, _, _ in rows} == set(stored) and {s for _, _, s in rows} == {"cache"}
        for k, ms, _ in rows:
            assert ms == pytest.approx(max(stored[k] - rep.call_overhead_ms, MIN_COST_MS))
        g.close()

    # a row of the running version wins over another version's
    cache.store([CostRow(samples[0].key("cpu", THREADS), "cpu", THREADS, samples[0].node.op_type,
                         samples[0].describe(), 9.0, 3, ort.__version__)])
    prof = lookup(samples, threads=THREADS, cache=cache)
    assert prof.ms[0] == 9.0 and list(prof.ms[1:]) == [5.0 + i for i in range(1, len(samples))]
    assert prof.other_versions == {OTHER: len(samples) - 1} and prof.cached == len(samples)


# ------------------------------------------------------------------ every cost a fallback


def test_a_cuda_table_missing_every_signature_is_flagged_all_fallback(tmp_path):
    g, opsets = egraph()
    rep = measured_costs(g, opsets, backend=resolve("cuda"), threads=THREADS, cache=CostCache(tmp_path / "empty.duckdb"),
                         measure=False)
    assert rep.signatures > 0 and rep.nodes == 0 and rep.failed == rep.signatures and rep.all_fallback
    assert rep.notices == ["no operator cost could be measured or found in the cost table: every e-node uses a "
                           "scaled analytic cost"]
    assert g.con.execute("SELECT count(*) FROM costs WHERE source = 'analytic-fallback'").fetchone()[0] > 0
    g.close()
    g, opsets = egraph()
    assert not measured_costs(g, opsets, threads=THREADS, cache=CostCache(tmp_path / "cpu.duckdb")).all_fallback
    g.close()


def test_the_summary_prints_the_cost_label(capsys):
    rep = {"input": "m.onnx", "nodes_in": 4, "nodes_out": 3, "enodes": 9, "eclasses": 7, "iterations": [],
           "stop_reason": "saturated", "rules_applied": {}, "cost_before": 1.0, "cost_after": 0.5,
           "cost_model": "measured", "extraction": {"gap": None, "method": "ilp", "status": "optimal"},
           "verification": {"ok": True, "max_abs_err": 0.0, "draws": 3}, "phases_s": {}, "notices": [],
           "output": "o.onnx"}
    cli._summary(dict(rep, cost_label="analytic (no operator could be timed or found in the cost table)"))
    printed = " ".join(capsys.readouterr().out.split())
    assert "(analytic (no operator could be timed" in printed and "(measured)" not in printed
    cli._summary(rep)  # a report without a label: the cost model
    assert "(measured)" in capsys.readouterr().out
