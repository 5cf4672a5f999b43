"""Operator signatures, ONNX Runtime profiling and the DuckDB cost cache."""

import math
import multiprocessing as mp
import time

import duckdb
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.extract import profile as P
from relsat.extract.cost_cache import CostCache, CostRow
from relsat.relations.backend import available, resolve

F = TensorProto.FLOAT


def unary(op, shape=(2, 8), dtype=F, name="x", **attrs):
    node = helper.make_node(op, [name], ["y"], **attrs)
    return P.OpSample(node, ((name, dtype, shape),), (), ("y",))


def matmul(m, k, n, k2=None):
    node = helper.make_node("MatMul", ["a", "b"], ["c"])
    return P.OpSample(node, (("a", F, (m, k)), ("b", F, (k2 or k, n))), (), ("c",))


def reshape(shape, target):
    const = numpy_helper.from_array(np.array(target, dtype=np.int64), "shape")
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    return P.OpSample(node, (("x", F, shape),), (const,), ("y",))


def conv():
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)
    return P.OpSample(node, (("x", F, (1, 4, 16, 16)), ("w", F, (8, 4, 3, 3)), ("b", F, (8,))),
                      (), ("y",))


def split():
    node = helper.make_node("Split", ["x"], ["p", "q"], axis=1)
    return P.OpSample(node, (("x", F, (4, 16)),), (), ("p", "q"))


def add():
    node = helper.make_node("Add", ["a", "b"], ["c"])
    return P.OpSample(node, (("a", F, (4, 16)), ("b", F, (16,))), (), ("c",))


def run(samples, cache=None, **kw):
    return P.profile(samples, cache=cache, warmup=1, repeats=3, progress=False, **kw)


def test_key_is_stable_and_name_free():
    a, b = unary("Relu"), unary("Relu", name="other")
    renamed = P.OpSample(helper.make_node("Relu", ["other"], ["z"], name="n1"),
                         (("other", F, (2, 8)),), (), ("z",))
    assert a.key("cpu", 1) == a.key("cpu", 1) == b.key("cpu", 1) == renamed.key("cpu", 1)
    assert len(a.key("cpu", 1)) == 64


def test_key_is_sensitive():
    base = unary("LeakyRelu", alpha=0.1)
    variants = [
        unary("LeakyRelu", alpha=0.2), unary("LeakyRelu", shape=(2, 9), alpha=0.1),
        unary("LeakyRelu", dtype=TensorProto.DOUBLE, alpha=0.1), unary("Relu"),
        P.OpSample(base.node, base.inputs, (), base.outputs, opset=18),
    ]
    keys = {v.key("cpu", 1) for v in variants} | {base.key("cuda", 1), base.key("cpu", 4)}
    assert base.key("cpu", 1) not in keys and len(keys) == len(variants) + 2
    assert reshape((2, 8), [2, 8]).key("cpu", 1) != reshape((2, 8), [4, 4]).key("cpu", 1)


def test_attribute_order_does_not_matter():
    n1 = helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])
    n1.attribute.append(helper.make_attribute("zz", 1))
    n2 = helper.make_node("Transpose", ["x"], ["y"])
    n2.attribute.extend([helper.make_attribute("zz", 1), helper.make_attribute("perm", [1, 0])])
    ins = (("x", F, (2, 3)),)
    assert P.OpSample(n1, ins, (), ("y",)).key("cpu", 1) == P.OpSample(n2, ins, (), ("y",)).key(
        "cpu", 1)


def test_build_model_is_checker_valid_with_typed_outputs():
    model = P.build_model(split())
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 10
    assert [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output] == \
        [[4, 8], [4, 8]]


def test_describe_is_json_able():
    import json
    d = reshape((2, 8), [4, -1]).describe()
    assert d["op_type"] == "Reshape" and d["inputs"][1]["value"] == [4, -1]
    json.dumps(unary("Clip", min=-math.inf).describe(), allow_nan=False)


def test_profile_common_ops_and_failures():
    samples = [conv(), matmul(16, 16, 16), add(), unary("Relu"), reshape((2, 8), [4, 4]),
               split(), matmul(4, 5, 6, k2=7), unary("Relu")]
    report = run(samples)
    assert np.all(np.isfinite(report.ms[:6])) and np.all(report.ms[:6] > 0)
    assert math.isnan(report.ms[6]) and report.failures[report.keys[6]]
    assert report.ms[7] == report.ms[3]  # deduplicated
    assert report.measured == 6 and report.cached == 0 and len(report.failures) == 1


def test_bigger_matmul_costs_more():
    ms = run([matmul(8, 8, 8), matmul(512, 512, 512)]).ms
    assert ms[1] > 5 * ms[0]


def test_second_profile_hits_the_cache(tmp_path):
    samples = [add(), unary("Relu"), matmul(8, 8, 8)]
    with CostCache(tmp_path / "c.duckdb") as cache:
        first = run(samples, cache)
        second = run(samples, cache)
        assert first.measured == 3 and second.measured == 0 and second.cached == 3
        np.testing.assert_array_equal(first.ms, second.ms)
        assert cache.count() == 3


def test_time_budget_skips_rest():
    report = run([add(), unary("Relu")], time_budget_s=0.0)
    assert report.measured == 0 and np.all(np.isnan(report.ms))
    assert all("budget" in reason for reason in report.failures.values())


def test_unknown_provider():
    with pytest.raises(ValueError, match="--provider tpu"):
        resolve("tpu")
    assert "cpu" in available()


def test_a_backend_nothing_runs_here_is_unavailable_to_the_profiler():
    cuda = resolve("cuda")
    if cuda.here:
        pytest.skip("CUDA is here")
    with pytest.raises(P.ProviderUnavailable, match="no CUDA here"):
        run([add()], backend=cuda)


def row(key, ms=1.0):
    return CostRow(key, "cpu", 1, "Relu", {"op_type": "Relu", "v": [1, 2]}, ms, 3, "1.0")


@pytest.mark.parametrize("suffix", [".duckdb", ".csv", ".parquet"])
def test_export_import_roundtrip(tmp_path, suffix):
    src = CostCache(tmp_path / "a.duckdb")
    src.store([row("k1", 0.125), row("k2", 1 / 3), row("k2", 2 / 3)])
    src.store([row("k1", 0.25)])  # upsert
    src.export(tmp_path / f"out{suffix}")
    dst = CostCache(tmp_path / "b.duckdb")
    assert dst.import_(tmp_path / f"out{suffix}") == 2
    assert dst.lookup(["k1", "k2", "nope"]) == {"k1": 0.25, "k2": 2 / 3}
    query = "SELECT * FROM costs ORDER BY key"
    assert src._run(lambda c: c.execute(query).fetchall()) == \
        dst._run(lambda c: c.execute(query).fetchall())


def test_env_var_is_honoured(tmp_path, monkeypatch):
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "env.duckdb"))
    cache = CostCache()
    assert cache.path == tmp_path / "env.duckdb" and cache.path.exists()


def _store_many(path, tag, ready):
    ready.set()
    cache = CostCache(path)  # opening waits for the lock the parent holds
    for i in range(5):
        cache.store([row(f"{tag}-{i}-{j}") for j in range(20)])


# ~3 s. By default tests/test_batch.py::test_cost_cache_two_processes_create_store_and_look_up_concurrently has two
# processes store into one cache (and retry on its lock), and ::test_cost_cache_survives_a_writer_killed_mid_store
@pytest.mark.slow
def test_concurrent_processes_can_store(tmp_path):
    path = tmp_path / "shared.duckdb"
    CostCache(path)
    ctx = mp.get_context("spawn")
    ready = [ctx.Event() for _ in "ab"]
    procs = [ctx.Process(target=_store_many, args=(path, t, r)) for t, r in zip("ab", ready)]
    with duckdb.connect(str(path)):  # hold the lock: both writers must wait and retry
        for p in procs:
            p.start()
        assert all(r.wait(30) for r in ready)
        time.sleep(0.3)
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert CostCache(path).count() == 200


@pytest.mark.gpu
def test_cuda_profile():
    if "cuda" not in available():
        pytest.skip("no CUDA provider (onnxruntime-gpu or torch with CUDA)")
    report = run([conv(), matmul(256, 256, 256), add(), split(), reshape((2, 8), [4, 4])],
                 backend=resolve("cuda"))
    assert np.all(np.isfinite(report.ms)) and np.all(report.ms > 0), report.failures


@pytest.mark.gpu
def test_torch_runtime_per_node_cost_is_measured_once_per_cache(tmp_path):
    """PyTorch's runtime on CUDA (issue 25): one more node of a chain costs a positive, sub-millisecond time, an
    Add (a kernel launch) more than an Identity (none); calibrated once per cache, its row recording both."""
    backend = resolve("cuda")
    if backend.timing != "cuda-torch":
        pytest.skip("no PyTorch with CUDA standing in for onnxruntime-gpu here")
    import relsat.driver.boundary.torch_runtime  # noqa: F401  (registers the runtime's node timer with profile)

    cache = CostCache(tmp_path / "c.duckdb")
    ms = P.calibrated_node_overhead_ms(backend, 1, cache)
    key = P.node_overhead_key("cuda-torch", 1)
    row = cache.rows([key])[key]
    assert 0 < ms < 1.0 and row[0] == ms
    identity, add_ = row[1]["identity"], row[1]["add"]
    assert add_["ms"] > identity["ms"] == ms, row[1]
    assert P.calibrated_node_overhead_ms(backend, 1, cache) == ms  # the cache's row, not timed again
    # the model's cost of the Add of a chain (per-node cost + one-node Add less the call overhead), for the record
    one = helper.make_node("Add", ["a", "one"], ["c"])
    sample = P.OpSample(one, (("a", F, (1,)),), (numpy_helper.from_array(np.ones(1, np.float32), "one"),), ("c",))
    add_ms = run([sample], backend=backend).ms[0]
    overhead = P.calibrated_call_overhead_ms(backend, 1, cache)
    print(f"per-node {ms * 1e3:.1f} us; Add in the chain {add_['ms'] * 1e3:.1f} us, priced "
          f"{(ms + max(add_ms - overhead, 0)) * 1e3:.1f} us (one-node {add_ms * 1e3:.1f}, call overhead "
          f"{overhead * 1e3:.1f})")


def gather(data_shape, index_shape, axis=0, op="Gather"):
    node = helper.make_node(op, ["data", "idx"], ["y"], axis=axis)
    return P.OpSample(node, (("data", TensorProto.INT64, data_shape), ("idx", TensorProto.INT64, index_shape)),
                      (), ("y",))


def test_a_gathers_runtime_index_is_drawn_within_its_datas_dim():
    """A Gather of a Shape's two dims by a runtime index (DistilBERT, GPT-2, T5): drawn in [0, 4) the index was
    2 or 3, an error under ONNX Runtime ("could not be timed alone") and a device-side fault under PyTorch CUDA
    that ended relsat on four corpus models on the H200. The catalog's ``indexes`` keeps it within the dim."""
    rng = np.random.default_rng(0)
    for data, axis, dim in (((2,), 0, 2), ((3, 1), 0, 3), ((5, 2), -1, 2), ((1,), 0, 1), ((9,), 0, 9)):
        drawn = np.concatenate([P.random_inputs(gather(data, (6,), axis), rng)["idx"] for _ in range(50)])
        assert drawn.min() >= 0 and drawn.max() < min(dim, 4)
        assert drawn.max() == min(dim, 4) - 1  # the whole range, not a narrower one
    # timed alone under ONNX Runtime: the two-dim Gather has a cost now, not a failure
    report = run([gather((2,), ())])
    assert not report.failures and np.isfinite(report.ms[0]) and report.ms[0] > 0
    # an opaque GatherElements by its PyTorch mapping's entry
    torch_cuda = pytest.importorskip("relsat.extract.torch_cuda")
    sample = gather((2, 3), (2, 3), axis=0, op="GatherElements")
    op = torch_cuda.op_def(sample.node)
    assert op is not None and op.indexes == (1, 0)
    drawn = np.concatenate([P.random_inputs(sample, rng, op)["idx"].ravel() for _ in range(50)])
    assert drawn.min() >= 0 and drawn.max() == 1
