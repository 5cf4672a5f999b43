"""The peer runners (``relsat.benchmarks.compare.run_system`` and ``MAKERS``, used by compare.py and
bench_corpus.py): on a tiny model with a dynamic batch each peer returns a verified model that keeps the
dim, or a one-line failure; and bench_corpus's latency table over such rows."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.benchmarks import bench_corpus, compare
from relsat.driver.boundary.verify import verify

BINDINGS = [{"x": [1, 3, 8, 8]}, {"x": [3, 3, 8, 8]}]


def tiny() -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Identity -> Relu over a dynamic batch: something for every peer to do."""
    rng = np.random.default_rng(0)
    arr = lambda name, a: numpy_helper.from_array(a.astype(np.float32), name)
    inits = [arr("W", rng.standard_normal((8, 3, 3, 3))), arr("B", rng.standard_normal(8)),
             arr("scale", rng.uniform(0.5, 2, 8)), arr("bias", rng.standard_normal(8)),
             arr("mean", rng.standard_normal(8)), arr("var", rng.uniform(0.5, 2, 8))]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
             helper.make_node("Identity", ["bn"], ["i"]),
             helper.make_node("Relu", ["i"], ["y"])]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 8, 8])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(m)
    return m


def _opts(**kw) -> compare.Options:
    # relsat with analytic costs and no timing: fast; the transformers optimizer runs as for a BERT
    kw = {"threads": 1, "cost_model": "analytic", "relsat_kwargs": {"measure": False},
          "transformer": ("bert", 0, 0), "bindings": BINDINGS, **kw}
    return compare.Options(**kw)


def _one_line(r: compare.SystemResult) -> None:
    assert r.message and "\n" not in r.message, (r.system, r.message)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    for mod in ("onnxsim", "onnxslim", "onnxoptimizer"):
        pytest.importorskip(mod)
    tmp = tmp_path_factory.mktemp("peers")
    model = tiny()
    before = model.SerializeToString()
    out = {name: compare.run_system(name, compare.MAKERS[name], model, _opts(), tmp) for name in bench_corpus.PEERS}
    assert model.SerializeToString() == before  # no peer changed the model it was given
    return model, out


@pytest.mark.parametrize("peer", bench_corpus.PEERS)
def test_peer_returns_a_verified_model(made, peer):
    model, out = made
    r = out[peer]
    assert r.status == "ok", (peer, r.status, r.message)
    written = onnx.load(r.path)
    # checked again here, independently of run_system
    assert verify(model, r.path, bindings=BINDINGS).ok
    assert [d.dim_param for d in written.graph.input[0].type.tensor_type.shape.dim][:1] == ["batch"]
    assert [d.dim_param for d in written.graph.output[0].type.tensor_type.shape.dim][:1] == ["batch"]
    assert r.nodes == len(written.graph.node) and r.make_s > 0


def test_relsat_on_onnxsim_starts_from_onnxsim(made):
    _, out = made
    r = out["relsat-on-onnxsim"]
    assert r.info["input"].endswith("onnxsim.onnx") and r.info["written"] in ("optimized", "original")
    assert out["onnxsim"].nodes < len(tiny().graph.node)  # onnxsim folded the BatchNormalization


def _wrong(model, opts, tmp):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    w = m.graph.initializer[1]  # the Conv bias
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) + 1.0, w.name))
    onnx.save(m, tmp / "wrong.onnx")
    return tmp / "wrong.onnx", {}


def _frozen(model, opts, tmp):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for v in (m.graph.input[0], m.graph.output[0]):
        v.type.tensor_type.shape.dim[0].dim_value = 1
    onnx.save(m, tmp / "frozen.onnx")
    return tmp / "frozen.onnx", {}


def _crash(model, opts, tmp):
    raise RuntimeError("boom\nsecond line")


def test_failures_are_one_line(tmp_path):
    model = tiny()
    wrong = compare.run_system("wrong", _wrong, model, _opts(), tmp_path)
    assert wrong.status == "verification failed" and "> tolerance" in wrong.message
    # a peer that fixes the dynamic batch is caught: verified at batch 1 only, then its declared dims
    frozen = compare.run_system("frozen", _frozen, model, _opts(bindings=BINDINGS[:1]), tmp_path)
    assert frozen.status == "dims lost" and "dims [0] fixed" in frozen.message
    crash = compare.run_system("crash", _crash, model, _opts(), tmp_path)
    assert crash.status == "error" and crash.message == "RuntimeError: boom second line"
    for r in (wrong, frozen, crash):
        _one_line(r)
    na = compare.run_system("ort-transformers", compare.make_ort_transformers, model,
                            compare.Options(transformer=None), tmp_path)
    assert na.status == "not applicable"


def test_corpus_rows_record_peers(tmp_path, monkeypatch):
    """bench_corpus.run_peers: every peer's status in the row ('verified' or 'failed: ...', one line);
    the verified ones returned; ort-transformers left out for a model that is no transformer."""
    pytest.importorskip("onnxsim")
    model = tiny()
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    monkeypatch.setitem(compare.MAKERS, "wrong", _wrong)
    row: dict = {}
    got = bench_corpus.run_peers("tiny", path, model, {"costed": BINDINGS[0], "second": BINDINGS[1]}, tmp_path,
                                 row, peers=("onnxsim", "ort-transformers", "wrong"))
    assert set(got) == {"onnxsim"} and row["onnxsim_status"] == "verified"
    assert "ort-transformers_status" not in row
    assert row["wrong_status"].startswith("failed: verification failed: ") and "\n" not in row["wrong_status"]


def test_corpus_peers_optimize_at_the_threads_asked(tmp_path, monkeypatch):
    """``--optimized-at N``: the peers' options carry relsat's threads (relsat-on-onnxsim optimizes at N); without
    it, relsat's default (None: all cores)."""
    model = tiny()
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    seen = []

    def spy(m, opts, tmp):
        seen.append(opts.threads)
        onnx.save(m, tmp / "same.onnx")
        return tmp / "same.onnx", {}

    monkeypatch.setitem(compare.MAKERS, "spy", spy)
    binding = {"costed": BINDINGS[0], "second": BINDINGS[1]}
    for at in (1, None):
        bench_corpus.run_peers("tiny", path, model, binding, tmp_path, {}, peers=("spy",), optimized_at=at)
    assert seen == [1, None]


def test_latency_table_geomeans_and_failures():
    rows = [{"model": "efficientnet_b0", "ms_1t": {"original": 10.0, "relsat": 9.0, "onnxsim": 9.5,
                                                      "onnxslim": 10.0, "relsat-on-onnxsim": 8.0},
             "onnxsim_status": "verified", "onnxslim_status": "verified",
             "onnxoptimizer_status": "failed: error: boom"},
            {"model": "convnext_tiny", "ms_1t": {"original": 20.0, "relsat": 20.0, "onnxsim": 16.0,
                                                    "onnxoptimizer": 25.0}}]
    text = bench_corpus.latency_table(rows, 1)
    lines = text.splitlines()
    assert lines[0] == ("| model | original | relsat | onnxsim | onnxslim | onnxoptimizer | relsat-on-onnxsim "
                        "| relsat / best peer |")
    assert lines[2] == ("| efficientnet_b0 | 10.000 | 9.000 (1.111x) | 9.500 (1.053x) | 10.000 (1.000x) | x "
                        "| 8.000 (1.250x) | 0.947 (onnxsim) |")
    assert lines[3].endswith("| - | 1.250 (onnxsim) |")
    timm = next(l for l in lines if l.startswith("| **geomean timm** (2) |"))
    assert f"| {(10 / 9) ** 0.5:.3f}x | {(10 / 9.5 * 20 / 16) ** 0.5:.3f}x |" in timm  # relsat, onnxsim
    assert timm.endswith(f"| {(9 / 9.5 * 20 / 16) ** 0.5:.3f} |")
    assert "1.000x (1)" in timm  # onnxslim timed on one of the two
    assert "- x efficientnet_b0 onnxoptimizer: error: boom" in lines


def test_same_kernels_reads_the_graphs_onnx_runtime_runs(tmp_path):
    """``bench_corpus.same_kernels``: the peers whose graph under ONNX Runtime has relsat's op counts. A copy with
    an Identity more runs the same kernels (ONNX Runtime removes it); one with a Relu more does not; relsat on a
    peer's output is not a peer."""
    model = tiny()
    identity = onnx.ModelProto.FromString(model.SerializeToString())
    identity.graph.node[-1].output[0] = "r"
    identity.graph.node.append(helper.make_node("Identity", ["r"], ["y"]))
    relu = onnx.ModelProto.FromString(model.SerializeToString())
    relu.graph.node[-1].output[0] = "r"
    relu.graph.node.append(helper.make_node("Relu", ["r"], ["y"]))
    paths = {}
    for name, m in (("relsat", model), ("onnxsim", identity), ("onnxslim", relu), ("relsat-on-onnxsim", model)):
        paths[name] = tmp_path / f"{name}.onnx"
        onnx.save(m, paths[name])
    assert bench_corpus.same_kernels(paths, 1) == ["onnxsim"]


def test_latency_table_says_where_the_best_peer_runs_relsats_kernels():
    rows = [{"model": "yolov8n", "ms_1t": {"original": 10.0, "relsat": 10.2, "onnxoptimizer": 10.0},
             "same_kernels": ["onnxoptimizer"]},
            {"model": "whisper_tiny_encoder", "ms_1t": {"original": 10.0, "relsat": 10.0, "onnxslim": 9.5},
             "same_kernels": []},
            {"model": "ppocr_det_v4", "ms_1t": {"original": 10.0, "relsat": 8.0, "onnxsim": 9.5}}]
    lines = bench_corpus.latency_table(rows, 1).splitlines()
    assert lines[2].endswith("| 1.020 (onnxoptimizer, same kernels) |")
    assert lines[3].endswith("| 1.053 (onnxslim) |")
    assert lines[-1] == ("- relsat / best peer > 1.01 on 2 of 3: 1 where that peer's graph runs relsat's kernels "
                         "(yolov8n); 1 where it runs others (whisper_tiny_encoder)")


@pytest.mark.parametrize("relsat_is_input", [True, False])
def test_an_input_model_written_unchanged_is_not_timed_twice(tmp_path, relsat_is_input):
    """``bench_corpus.latencies``: where relsat wrote the input model's bytes, its figures are the original's (the
    ratio of two timings of one file is the spread alone); otherwise every system is timed (here relsat's file is a
    hundred Relus, so that its own timing shows)."""
    slow = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x" if i == 0 else f"r{i - 1}"], [f"r{i}" if i < 99 else "y"]) for i in range(100)],
        "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3, 8, 8])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    paths = {}
    for name, model in (("original", tiny()), ("relsat", slow), ("onnxsim", tiny())):
        paths[name] = tmp_path / f"{name}.onnx"
        onnx.save(model, paths[name])
    ms, cpu = bench_corpus.latencies(paths, 1, BINDINGS[0], 0.2, None, relsat_is_input)
    assert set(ms) == set(cpu) == set(paths) and all(v > 0 for v in ms.values())
    if relsat_is_input:
        assert ms["relsat"] == ms["original"] and cpu["relsat"] == cpu["original"]
    else:
        assert ms["relsat"] > 3 * ms["original"], ms


def test_latency_table_marks_an_input_model_written_unchanged():
    rows = [{"model": "yolov8n", "ms_1t": {"original": 10.0, "relsat": 10.0, "onnxsim": 10.4},
             "relsat_is_input": True},
            {"model": "ppocr_det_v4", "ms_1t": {"original": 10.0, "relsat": 8.0, "onnxsim": 9.5}}]
    lines = bench_corpus.latency_table(rows, 1).splitlines()
    assert lines[2] == "| yolov8n | 10.000 | 10.000 (1.000x, input) | 10.400 (0.962x) | 0.962 (onnxsim) |"
    assert lines[3] == "| ppocr_det_v4 | 10.000 | 8.000 (1.250x) | 9.500 (1.053x) | 0.842 (onnxsim) |"


def test_the_fidelity_line_counts_the_models_within_ten_percent_and_names_the_others():
    rows = [{"model": "a", "prediction": bench_corpus._prediction({"original_prediction_ratio": 1.04,
                                                                   "original_tolerance": 0.1})},
            {"model": "b", "prediction": bench_corpus._prediction({
                "original_prediction_ratio": 0.85, "searches": 2, "first_pass": {"original_prediction_ratio": 2.03}})},
            {"model": "c", "prediction": bench_corpus._prediction(None)}]
    assert rows[1]["prediction"] == {"ratio": 0.85, "tolerance": None, "searches": 2, "first_ratio": 2.03,
                                     "recalled": False}
    assert bench_corpus.fidelity_line(rows) == ("The in-context prediction of the input model over its measured "
                                                "latency: within 10% on 1 of 2; off on b 0.85x (first search 2.03x).")
    assert bench_corpus.fidelity_line(rows[2:]) is None
