"""Measured costs, extraction on real e-graphs, the cost cache across runs, the latency guard, and the
``relsat optimize`` / ``relsat costs`` options that drive them (real ONNX Runtime, DuckDB and HiGHS)."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from relsat.driver.boundary import zoo
from relsat.driver.boundary import latency
from relsat.driver.boundary.latency import judge
from relsat.driver.app.cli import app
from relsat.driver.errors import RelsatError
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.app.optimize import optimize
from relsat.driver.options import DEFAULTS
from relsat.programs.rulesets import load_rule_list
from relsat.driver.search.runner import Limits, Runner
from relsat.extract.analytic import analytic_costs, problem_from
from relsat.extract.cost_cache import CostCache, CostRow
from relsat.extract.extraction import dag_cost, greedy_extract, ilp_extract, is_acyclic, validate_choice
from relsat.extract.measured import collect_samples, measured_costs
from relsat.extract.profile import MIN_REPEATS, OpSample, profile
from relsat.relations.backend import CPU, available
from relsat.relations.egraph import EGraph

HERE = Path(__file__).parent
F = TensorProto.FLOAT
cli = CliRunner()


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    """A private cost cache for the test (the user's cache is never touched)."""
    path = tmp_path / "cache" / "costs.duckdb"
    monkeypatch.setenv("RELSAT_COST_CACHE", str(path))
    return path


def saturated(model, rules=("default",), node_limit=2000):
    g = EGraph()
    imported = import_model(model, egraph=g)
    Runner(g, load_rule_list(rules), Limits(6, node_limit, 60.0, DEFAULTS.multi_rounds)).run()  # as optimize does
    return g, imported


def model_of(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "t", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


# ------------------------------------------------------------------ extraction on real e-graphs


# bert (a transformer) and nasnet_a (the largest ILP) by default; the other zoo models (~1-2 s each) with -m slow
@pytest.mark.parametrize("name", [n if n in ("bert", "nasnet_a") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in zoo.NAMES])
def test_ilp_never_costs_more_than_greedy_on_the_zoo(name):
    g, imported = saturated(zoo.build(name, small=True))
    analytic_costs(g)
    problem, _ = problem_from(g, [c for _, c in imported.outputs])
    greedy = greedy_extract(problem)
    ilp = ilp_extract(problem, time_limit=20.0, warm_start=greedy)
    validate_choice(problem, ilp.choice)
    assert ilp.cost <= greedy.cost
    assert ilp.cost == pytest.approx(dag_cost(problem, ilp.choice))
    g.close()


def test_extraction_is_acyclic_on_a_rule_set_that_creates_cycles(tmp_path):
    w = numpy_helper.from_array(np.linspace(-1, 1, 8 * 4, dtype=np.float32).reshape(8, 4), "w")
    model = model_of([helper.make_node("Transpose", ["x"], ["t1"], perm=[1, 0]),
                      helper.make_node("Transpose", ["t1"], ["t2"], perm=[1, 0]),
                      helper.make_node("Relu", ["t2"], ["r"]),
                      helper.make_node("MatMul", ["r", "w"], ["y"])],
                     [helper.make_tensor_value_info("x", F, [3, 8])],
                     [helper.make_tensor_value_info("y", F, [3, 4])], [w])
    g, imported = saturated(model, rules=[str(HERE / "cycles.rules")])
    self_loops = g.sql("SELECT count(*) FROM enodes WHERE list_contains(children, eclass)")[0][0]
    x_class = g.find([imported.values["x"]])[0]
    assert self_loops >= 2  # Relu(R) and Identity(R) in R
    assert g.sql("SELECT count(*) FROM enodes WHERE eclass = ?", [int(x_class)])[0][0] == 2  # x = T(T(x))
    analytic_costs(g)
    roots = [c for _, c in imported.outputs]
    problem, node_ids = problem_from(g, roots)
    for ext in (greedy_extract(problem), ilp_extract(problem)):
        validate_choice(problem, ext.choice)  # raises on a cycle
        assert is_acyclic(problem, ext.choice)
    g.close()
    res = optimize(model, rules=[str(HERE / "cycles.rules")], cost_model="analytic", measure=False,
                   output=tmp_path / "o.onnx")
    onnx.checker.check_model(onnx.load(tmp_path / "o.onnx"), full_check=True)  # topologically sorted
    assert res.report["verification"]["ok"]
    assert {n.op_type for n in res.model.graph.node} <= {"Relu", "MatMul", "Transpose", "Identity"}


# ------------------------------------------------------------------ measured costs


def test_measured_costs_cover_every_enode_and_dedupe_signatures(cache_env):
    g, imported = saturated(zoo.build("bert", small=True))
    rep = measured_costs(g, imported.opset_imports, cache=CostCache())
    missing = g.sql("SELECT count(*) FROM enodes n ANTI JOIN costs c ON c.node = n.id")[0][0]
    assert missing == 0
    by_source = dict(g.sql("SELECT source, count(*) FROM costs GROUP BY source"))
    assert rep.failed == 0 and rep.fallback_nodes == 0
    assert rep.nodes == by_source["measured"] > rep.signatures == rep.measured > 0
    assert g.sql("SELECT count(*) FROM costs WHERE source IN ('leaf', 'const', 'projection') AND ms <> 0")[0][0] == 0
    assert g.sql("SELECT min(ms) FROM costs WHERE source = 'measured'")[0][0] > 0
    # constant e-classes (weight-only) cost zero, whatever their op
    assert g.sql("SELECT count(*) FROM costs c JOIN enodes n ON n.id = c.node JOIN eclass e ON e.id = n.eclass "
                 "WHERE e.is_const AND c.ms <> 0")[0][0] == 0
    g.close()


def test_opaque_nodes_are_measured_and_unrunnable_ones_fall_back(cache_env):
    idx = numpy_helper.from_array(np.array([0, 2, 1], dtype=np.int64), "idx")
    model = model_of([helper.make_node("Gather", ["x", "idx"], ["g"], axis=1),
                      helper.make_node("Relu", ["g"], ["r"]),
                      helper.make_node("Foo", ["r"], ["y"], domain="com.example")],
                     [helper.make_tensor_value_info("x", F, [64, 32])],
                     [helper.make_tensor_value_info("y", F, None)], [idx])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    g = EGraph()
    imported = import_model(model, egraph=g)
    rep = measured_costs(g, imported.opset_imports, cache=CostCache())
    rows = dict(g.sql("SELECT op, source FROM costs WHERE op IN ('Gather', 'Relu', 'Foo')"))
    assert rows == {"Gather": "measured", "Relu": "measured", "Foo": "analytic-fallback"}
    assert rep.failed == 1 and rep.fallback_nodes == 1 and "Foo" in rep.failures[0]
    scaled = g.sql("SELECT ms, analytic_ms FROM costs WHERE op = 'Foo'")[0]
    assert scaled[0] == pytest.approx(scaled[1] * rep.fallback_scale)
    g.close()


# ~4 s. By default a run over a filled cache profiles nothing in test_costs_export_and_import_round_trip, and cached
# runs measure nothing in
# tests/test_cost_labels.py::test_all_cached_runs_predict_the_same_total_and_store_the_call_overhead_once
@pytest.mark.slow
def test_second_run_profiles_no_new_signatures(cache_env, tmp_path):
    model = zoo.build("squeezenet", small=True)
    first = optimize(model, measure=False).report
    assert first["profiled"] > 0 and first["profile"]["failed"] == 0
    second = optimize(model, measure=False, keep_egraph=True)
    rep = second.report
    assert rep["profiled"] == 0
    assert rep["cached"] == rep["profile"]["signatures"] == first["profiled"] + first["cached"]
    sources = dict(second.egraph.sql("SELECT source, count(*) FROM costs GROUP BY source"))
    assert "measured" not in sources and sources["cache"] > 0
    assert rep["cost_before"] > 0 and rep["phases_s"]["profile"] > 0
    second.egraph.close()


def test_saved_database_has_costs_and_extraction(cache_env, tmp_path):
    db = tmp_path / "g.duckdb"
    optimize(zoo.build("resnet50", small=True), db=db, measure=False, output=tmp_path / "o.onnx")
    g = EGraph(db, read_only=True)
    assert g.sql("SELECT count(*) FROM enodes n ANTI JOIN costs c ON c.node = n.id")[0][0] == 0
    cols = [r[0] for r in g.sql("DESCRIBE extraction")]
    assert cols[:2] == ["eclass", "node"] and {"cost", "original_node", "changed", "op"} <= set(cols)
    assert g.sql("SELECT count(*) FROM extraction x ANTI JOIN enodes n ON n.id = x.node")[0][0] == 0
    # the table says what was written: its BatchNormalization nodes are the written model's (folding one pays
    # only by the measured one-node costs of a biased Conv against Conv + BatchNormalization, a near-tie that
    # noise may decide either way on a loaded machine, so the test does not ask which way), and it records a
    # change exactly when the optimized model was written
    written = onnx.load(tmp_path / "o.onnx")
    bn = g.sql("SELECT count(*) FROM extraction WHERE op = 'BatchNormalization'")[0][0]
    assert bn == sum(n.op_type == "BatchNormalization" for n in written.graph.node)
    changed = g.sql("SELECT count(*) FROM extraction WHERE changed")[0][0]
    assert dict(g.sql("SELECT key, value FROM meta WHERE key IN ('written', 'cost_model')")) == {
        "written": "optimized" if changed else "original", "cost_model": "measured"}
    g.close()


def test_slow_signatures_get_fewer_runs_and_progress_is_reported(tmp_path):
    node = helper.make_node("MatMul", ["a", "b"], ["c"])
    samples = [OpSample(node, (("a", F, (n, 64)), ("b", F, (64, 64))), (), ("c",)) for n in (8, 16, 32)]
    cache, calls = CostCache(tmp_path / "c.duckdb"), []
    rep = profile(samples, cache=cache, warmup=3, repeats=50, sample_budget_s=1e-9,
                  progress=lambda done, total: calls.append((done, total)))
    assert rep.measured == 3 and calls == [(1, 3), (2, 3), (3, 3)]
    runs = cache._run(lambda con: con.execute("SELECT DISTINCT repeats FROM costs").fetchall())
    assert runs == [(MIN_REPEATS,)]


# ------------------------------------------------------------------ the latency guard


def chain(n, size=96):
    w = numpy_helper.from_array(np.eye(size, dtype=np.float32), "w")
    names = ["x"] + [f"h{i}" for i in range(n - 1)] + ["y"]
    nodes = [helper.make_node("MatMul", [a, "w"], [b]) for a, b in zip(names, names[1:])]
    return model_of(nodes, [helper.make_tensor_value_info("x", F, [size, size])],
                    [helper.make_tensor_value_info("y", F, [size, size])], [w])


def test_guard_tells_a_much_slower_model_apart():
    fast, slow = chain(1), chain(24)
    res = latency.guard(slow, fast)
    assert res.keep_optimized and res.metric == "cpu" and res.original.runs >= latency.MIN_RUNS
    assert res.cpu_speedup > 2 and res.original.cpu_ms > 0
    assert not latency.guard(fast, slow).keep_optimized


def test_the_race_stops_timing_a_model_that_can_no_longer_pass_the_guard():
    """After the first session block, a model whose block medians already overlap the reference's is not
    run again (it keeps two blocks) and the guard rejects it; one still apart runs the second block too."""
    ref, fast, slower = chain(24), chain(1), chain(48)
    race = latency.undecided(threads=1, backend=CPU)
    t_ref, t_fast, t_slow = latency.time_models([ref, fast, slower], race=race)
    assert len(t_ref.blocks_cpu_ms) == 4 and len(t_fast.blocks_cpu_ms) == 4 and len(t_slow.blocks_cpu_ms) == 2
    assert t_slow.runs < t_ref.runs
    assert judge(t_ref, t_fast, threads=1, backend=CPU).keep_optimized
    assert not judge(t_ref, t_slow, threads=1, backend=CPU).keep_optimized
    # nothing left to decide after the first block: the second is not run at all
    t_ref, t_slow = latency.time_models([ref, slower], race=race)
    assert len(t_ref.blocks_cpu_ms) == 2 == len(t_slow.blocks_cpu_ms)


# ~10 s. By default a failed guard writes the input model in
# tests/test_pipeline_phases.py::test_a_failed_guard_writes_the_input_model, the real 0.9 threshold keeps it in
# tests/test_comparisons.py (fixture kept), and the guard's decision is test_guard_tells_a_much_slower_model_apart's
@pytest.mark.slow
def test_guard_writes_the_original_graph_when_not_faster(cache_env, tmp_path):
    model = zoo.build("resnet50", small=True)
    out = tmp_path / "o.onnx"
    # no real model gets 90 % faster, so the guard must keep the original graph
    res = optimize(model, output=out, guard_threshold=0.9)
    rep = res.report
    assert rep["written"] == "original"
    assert any("input model is written unchanged" in n for n in rep["notices"])
    lat = rep["latency"]
    assert lat["kept"] == "original" and lat["original_ms"] > 0 and lat["optimized_ms"] > 0
    assert lat["speedup"] == pytest.approx(lat["original_ms"] / lat["optimized_ms"])
    written = onnx.load(out)
    assert written == model  # the input graph itself, not a re-export of it
    assert zoo.op_counts(written).get("BatchNormalization") == zoo.op_counts(model)["BatchNormalization"]
    assert len(written.graph.node) == rep["nodes_out"] == len(model.graph.node)
    assert rep["verification"]["ok"] and rep["phases_s"]["choose"] > 0  # candidates timed against the input


# ------------------------------------------------------------------ CLI


@pytest.fixture(scope="module")
def small_squeezenet(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "squeezenet.onnx"
    zoo.save(zoo.build("squeezenet", small=True), path)
    return path


def test_costs_export_and_import_round_trip(small_squeezenet, tmp_path, monkeypatch):
    here, there = tmp_path / "here.duckdb", tmp_path / "there.duckdb"
    monkeypatch.setenv("RELSAT_COST_CACHE", str(here))
    r1 = tmp_path / "r1.json"
    res = cli.invoke(app, ["optimize", str(small_squeezenet), "-o", str(tmp_path / "a.onnx"), "--no-measure",
                           "--report", str(r1)])
    assert res.exit_code == 0, res.output
    assert json.loads(r1.read_text())["profiled"] > 0
    table = tmp_path / "exported" / "costs.parquet"
    res = cli.invoke(app, ["costs", "export", str(table)])
    assert res.exit_code == 0, res.output
    assert table.exists() and str(CostCache(here).count()) in res.output
    res = cli.invoke(app, ["costs", "info"])
    assert res.exit_code == 0 and "cpu" in res.output and str(here) in res.output.replace("\n", "")
    monkeypatch.setenv("RELSAT_COST_CACHE", str(there))  # another machine: an empty cache
    r2 = tmp_path / "r2.json"
    res = cli.invoke(app, ["optimize", str(small_squeezenet), "-o", str(tmp_path / "b.onnx"), "--no-measure",
                           "--costs", str(table), "--report", str(r2)])
    assert res.exit_code == 0, res.output
    rep = json.loads(r2.read_text())
    assert rep["profiled"] == 0 and rep["cached"] == rep["profile"]["signatures"] > 0
    assert CostCache(there).count() == CostCache(here).count()


def test_costs_export_without_a_cache_fails_cleanly(tmp_path, monkeypatch):
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "none" / "costs.duckdb"))
    res = cli.invoke(app, ["costs", "export", str(tmp_path / "x.csv")])
    assert res.exit_code == 1 and "no cost cache" in res.output and not (tmp_path / "x.csv").exists()


@pytest.mark.parametrize("args,needle", [
    (["--provider", "tpu"], "--provider tpu"),
    (["--cost-model", "guess"], "--cost-model guess"),
    (["--threads", "0"], "--threads 0"),
    (["--mip-gap", "2"], "--mip-gap 2"),
    (["--ilp-time-limit", "0"], "--ilp-time-limit 0"),
    (["--costs", "nowhere.parquet"], "nowhere.parquet"),
])
def test_bad_options_give_one_line_errors(small_squeezenet, tmp_path, args, needle):
    out = tmp_path / "o.onnx"
    res = cli.invoke(app, ["optimize", str(small_squeezenet), "-o", str(out), *args])
    assert res.exit_code == 1 and needle in res.output and not out.exists()


def test_provider_cuda_without_a_gpu_is_a_clear_error(small_squeezenet, tmp_path, cache_env):
    if "cuda" in available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "o.onnx"
    res = cli.invoke(app, ["optimize", str(small_squeezenet), "-o", str(out), "--provider", "cuda"])
    assert res.exit_code == 1 and not out.exists()
    assert "--provider cuda" in res.output and "Traceback" not in res.output
    with pytest.raises(RelsatError, match="provider cuda"):
        optimize(zoo.build("squeezenet", small=True), provider="cuda", cost_model="analytic")


# ~5 s. By default tests/test_cuda_pricing.py::test_optimize_writes_every_fold_from_a_cuda_table optimizes with
# --provider cuda from a table of cuda costs on a machine without a GPU (nothing profiled, the model verified)
@pytest.mark.slow
def test_cuda_costs_measured_elsewhere_are_used_without_a_gpu(cache_env, tmp_path):
    """Profile on the GPU box, optimize anywhere: a table of cuda costs is read, nothing is timed."""
    if "cuda" in available():
        pytest.skip("this machine has CUDA")
    model = zoo.build("squeezenet", small=True)
    g, imported = saturated(model)
    samples, _ = collect_samples(g, imported.opset_imports)
    g.close()
    # what `relsat costs export` writes on the GPU machine (its figures stood in for by CPU timings)
    ms = profile(samples, warmup=1, repeats=3, progress=False).ms
    elsewhere = CostCache(tmp_path / "gpu-box.duckdb")
    elsewhere.store([CostRow(s.key("cuda", 1), "cuda", 1, s.node.op_type, s.describe(), float(t), 3, "gpu-box")
                     for s, t in zip(samples, ms)])
    rep = optimize(model, provider="cuda", threads=1, costs=tmp_path / "gpu-box.duckdb",
                   output=tmp_path / "o.onnx").report
    assert rep["profiled"] == 0 and rep["cached"] == rep["profile"]["signatures"] == len(samples)
    assert rep["profile"]["failed"] == 0 and rep["latency"] is None and rep["verification"]["ok"]
    # the guard is reached only when the extraction differs from the input, which these stand-in timings decide
    if rep["written"] == "optimized":
        assert any("latency guard skipped" in n for n in rep["notices"])
    else:
        assert any("input model is written unchanged" in n for n in rep["notices"])


@pytest.mark.gpu
def test_provider_cuda_profiles_on_the_gpu(cache_env, tmp_path):
    if "cuda" not in available():
        pytest.skip("no CUDA provider (onnxruntime-gpu or torch with CUDA)")
    rep = optimize(zoo.build("resnet50", small=True), provider="cuda", output=tmp_path / "o.onnx").report
    assert rep["provider"] == "cuda" and rep["profiled"] > 0 and rep["verification"]["ok"]
    assert rep["profile"]["nodes"] > 0
