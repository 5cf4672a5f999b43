"""Weights named by the digests of their data (relsat.relations.digests) in whole-graph profile keys: an array
and its TensorProto agree, a key changes with any weight, node or shape and not with node names, and an
exported graph's key is the same with or without the exporter's digests."""

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from relsat.driver.boundary import zoo
from relsat.driver.boundary.onnx_export import ExportMemo, export_graph, fill_weights
from relsat.driver.boundary.onnx_import import import_model
from relsat.extract.context import graph_key
from relsat.relations import runtime
from relsat.relations.digests import MIN_BYTES, Digests, array_digest, tensor_digest

from test_context import conv_bn_relu

DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
          "uint64", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_array_and_its_tensor_have_one_digest(dtype):
    rng = np.random.default_rng(0)
    arr = (rng.standard_normal((40, 33)) * 50).astype(dtype)
    d = array_digest(arr)
    assert d is not None and d == tensor_digest(numpy_helper.from_array(arr, "w"))
    assert array_digest(arr.T) == tensor_digest(numpy_helper.from_array(arr.T, "w"))  # not contiguous
    assert array_digest(arr.T) != d  # the same bytes in another shape differ (and another order)
    assert array_digest(arr.reshape(33, 40)) != d
    other = arr.copy()
    other.flat[7] = other.flat[7] + 1 if dtype != "bool" else not other.flat[7]
    assert array_digest(other) != d


def test_small_and_unplain_tensors_have_no_digest():
    assert array_digest(np.zeros(MIN_BYTES // 4, np.float32)) is None
    assert array_digest(np.zeros(MIN_BYTES, np.dtype(">f4"))) is None  # not native: from_array swaps its bytes
    assert array_digest(np.array(["ab"] * 600, dtype=object)) is None
    assert tensor_digest(numpy_helper.from_array(np.zeros(10, np.float32), "s")) is None


def test_the_memo_hashes_an_array_once_and_keeps_it():
    memo, arr = Digests(), np.ones((100, 100), np.float32)
    d = memo.of(arr)
    arr[0, 0] = 5  # the memo keys arrays by identity: an array is not changed while it is exported
    assert memo.of(arr) == d and memo.of(arr.copy()) != d


def test_a_key_follows_weights_nodes_and_shapes_not_node_names():
    model = conv_bn_relu()
    feeds = {"x": np.zeros((1, 16, 32, 32), np.float32)}
    key = graph_key(model, feeds, threads=1)
    renamed = conv_bn_relu()
    for i, n in enumerate(renamed.graph.node):
        n.name = f"n{i}"
    assert graph_key(renamed, feeds, threads=1) == key
    assert [n.name for n in renamed.graph.node] == ["n0", "n1", "n2"]  # names restored after hashing
    changed = conv_bn_relu()
    w = numpy_helper.to_array(changed.graph.initializer[0]).copy()
    w[3, 2, 1, 0] += 1e-3
    changed.graph.initializer[0].CopyFrom(numpy_helper.from_array(w, "W"))
    assert graph_key(changed, feeds, threads=1) != key
    small = conv_bn_relu()  # a small initializer, hashed serialized
    small.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.ones(16, np.float32), "bias"))
    assert graph_key(small, feeds, threads=1) != key
    node = conv_bn_relu()
    node.graph.node[0].attribute[0].CopyFrom(helper.make_attribute("pads", [1, 1, 1, 0]))
    assert graph_key(node, feeds, threads=1) != key
    assert graph_key(model, feeds, threads=1, digests={"W": "0" * 64}) != key  # the digest stands for the data


def test_an_exported_graph_has_one_key_with_or_without_its_digests():
    """With a memo the weights are shells named by digests; filled in, the model is the one an export without
    a memo writes, to the byte, and its key is the same with or without the digests."""
    imported = import_model(zoo.build("squeezenet", small=True))
    memo = ExportMemo()
    light, _, digests, weights = export_graph(imported, memo=memo)
    assert digests and set(digests) == set(weights) <= {t.name for t in light.graph.initializer}
    assert all(not t.raw_data for t in light.graph.initializer if t.name in weights)
    full = export_graph(imported).model
    feeds = {i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
             for i in full.graph.input}
    key = graph_key(full, feeds, threads=1)
    assert graph_key(light, feeds, threads=1, digests=digests) == key  # the shells' key: nothing filled in
    assert fill_weights(light, weights).SerializeToString() == full.SerializeToString()
    assert all(digests[t.name] == tensor_digest(t) for t in light.graph.initializer if t.name in digests)
    assert graph_key(light, feeds, threads=1, digests=digests) == graph_key(light, feeds, threads=1) == key
    again = export_graph(imported, memo=memo)  # the memo's digests, each array hashed once
    assert again.digests == digests and again.weights.keys() == weights.keys()
    assert fill_weights(again.model, again.weights).SerializeToString() == full.SerializeToString()


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_filled_shell_is_the_tensor_from_array_writes(dtype):
    arr = (np.random.default_rng(1).standard_normal((30, 20)) * 50).astype(dtype)
    shell = onnx.TensorProto(name="w", data_type=helper.np_dtype_to_tensor_dtype(arr.dtype))
    shell.dims.extend(arr.shape)
    model = helper.make_model(helper.make_graph([], "g", [], [], [shell]))
    fill_weights(model, {"w": arr})
    assert model.graph.initializer[0].SerializeToString() == numpy_helper.from_array(arr, "w").SerializeToString()


@pytest.mark.parametrize("small", [False, True])
def test_an_exported_graph_runs_from_its_shells_as_it_runs_filled(small):
    """``runtime.runnable(model, arrays)``: a graph whose weights are shells runs with the arrays themselves, what
    the filled graph runs (the same graph bytes and arrays, the same outputs), and is not filled; a graph whose
    weights are too few for that is filled in place and given as the bytes of the filled graph."""
    imported = import_model(zoo.build("squeezenet", small=small))
    light, _, _, weights = export_graph(imported, memo=ExportMemo())
    full = export_graph(imported).model
    got = runtime.runnable(light, weights)
    want = runtime.runnable(full)
    if small:
        assert isinstance(got, bytes) and got == want == full.SerializeToString()
        assert light.SerializeToString() == full.SerializeToString()  # filled in place
        return
    assert isinstance(got, runtime.Runnable) and isinstance(want, runtime.Runnable)
    assert got.graph == want.graph and got.names == want.names
    assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(got.arrays, want.arrays))
    assert all(not t.raw_data for t in light.graph.initializer if t.name in weights)  # still shells
    feeds = {i.name: np.random.default_rng(0).standard_normal(
        [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]).astype(np.float32) for i in full.graph.input}
    kept = [x.copy() for x in got.arrays]  # the arrays are the export's own, shared by the graphs of a search
    a = runtime.session(got).run(None, feeds)
    b = runtime.session(full.SerializeToString()).run(None, feeds)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert all(np.array_equal(x, y) for x, y in zip(got.arrays, kept))  # a session left them as they were
