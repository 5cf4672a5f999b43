"""Corpus models carried to the device with float16 weights (benchmarks/device_pack.py): the unpacked model
is the original graph with float32 weights within float16's rounding, zeros and ones exact, and runs to
the same outputs under ONNX Runtime within that rounding."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from relsat.benchmarks import device_pack


def _model():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(np.zeros(300, np.float32), "b"),  # over 1 KB: packed
             numpy_helper.from_array(np.ones((1, 8, 1, 1), np.float32), "s"),  # 32 bytes: left as it is
             numpy_helper.from_array(np.array([1, 8, 36], np.int64), "shape"),
             numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([8], np.int64), "eight")]
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
             helper.make_node("Slice", ["b", "zero", "eight"], ["b8"]),
             helper.make_node("Conv", ["x", "w", "b8"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 36])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_pack_halves_the_weights_and_unpack_restores_the_graph(tmp_path):
    original = _model()
    packed, clipped = device_pack.pack(_model())
    assert clipped == 0
    assert {t.name: t.data_type for t in packed.graph.initializer} == {
        "b": TensorProto.FLOAT16, "s": TensorProto.FLOAT, "shape": TensorProto.INT64, "zero": TensorProto.INT64,
        "eight": TensorProto.INT64}
    assert packed.graph.node[0].attribute[0].t.data_type == TensorProto.FLOAT16  # a Constant node's weight
    assert packed.ByteSize() < original.ByteSize()
    back = device_pack.unpack(onnx.load_from_string(packed.SerializeToString()))
    assert not any(p.key == device_pack.KEY for p in back.metadata_props)
    assert back.graph.node[1:] == original.graph.node[1:] and back.graph.input == original.graph.input
    assert back.graph.node[0].attribute[0].t.data_type == TensorProto.FLOAT
    pairs = [(original.graph.node[0].attribute[0].t, back.graph.node[0].attribute[0].t)]
    for a, b in [*zip(original.graph.initializer, back.graph.initializer), *pairs]:
        x, y = numpy_helper.to_array(a), numpy_helper.to_array(b)
        assert a.name == b.name and x.dtype == y.dtype and x.shape == y.shape
        assert np.all(np.abs(x - y) <= np.abs(x) * 2.0 ** -11)
    assert np.all(numpy_helper.to_array(back.graph.initializer[0]) == 0)
    assert np.all(numpy_helper.to_array(back.graph.initializer[1]) == 1)
    feed = {"x": np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32)}
    want = ort.InferenceSession(original.SerializeToString()).run(None, feed)[0]
    got = ort.InferenceSession(back.SerializeToString()).run(None, feed)[0]
    assert np.allclose(got, want, rtol=1e-2, atol=1e-2) and not np.array_equal(got, want)
    # the command line: pack into a folder, unpack from it
    src = tmp_path / "m.onnx"
    onnx.save(original, str(src))
    device_pack.main(["pack", str(tmp_path / "packed"), str(src)])
    device_pack.main(["unpack", str(tmp_path / "packed"), str(tmp_path / "out")])
    assert onnx.load(str(tmp_path / "out" / "m.onnx")).graph == back.graph


def test_an_unpacked_model_is_left_as_it_is():
    m = _model()
    assert device_pack.unpack(m).graph == _model().graph


def _big_model():
    """A MatMul by a big random weight with an exact zero row, beside a big mask-like weight (two values) and
    a big weight with a zero block: only the first may be redrawn."""
    rng = np.random.default_rng(3)
    w = rng.normal(0.5, 0.02, (1024, 64)).astype(np.float32)
    w[7] = 0  # an embedding's padding row (under ZEROS_MAX of its values): its places travel
    mask = np.where(rng.random((64, 64)) < 0.5, 0.0, -1e4).astype(np.float32)
    blocks = rng.standard_normal((64, 64)).astype(np.float32)
    blocks[:32, :32] = 0  # zero blocks: kept (relsat's zero-block rules read them)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(mask, "mask"),
             numpy_helper.from_array(blocks, "blocks")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "mask"], ["a"]),
             helper.make_node("MatMul", ["a", "blocks"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 1024])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_redraw_carries_big_random_weights_as_their_moments_and_keeps_structured_ones():
    original = _big_model()
    packed, _ = device_pack.pack(_big_model(), redraw=True)
    sizes = {t.name: len(t.raw_data) for t in packed.graph.initializer}
    assert sizes["w"] == 0 and sizes["mask"] > 0 and sizes["blocks"] > 0
    assert packed.ByteSize() < original.ByteSize() * 0.7
    text = packed.SerializeToString()
    back = device_pack.unpack(onnx.load_from_string(text))
    assert not any(p.key in (device_pack.KEY, device_pack.KEY_REDRAWN) for p in back.metadata_props)
    assert back.graph.node == original.graph.node
    got = {t.name: numpy_helper.to_array(t) for t in back.graph.initializer}
    want = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    assert got["mask"].tolist() == want["mask"].tolist()  # two values: exact (float16 holds 0 and -1e4)
    assert np.all(got["blocks"][:32, :32] == 0) and np.all(got["blocks"][32:] != 0)
    w, w0 = got["w"], want["w"]
    assert w.dtype == np.float32 and w.shape == w0.shape and not np.allclose(w, w0)
    assert np.all(w[7] == 0) and np.count_nonzero(w == 0) == 64  # the padding row, and no other zero
    rest = np.delete(w, 7, axis=0)
    assert abs(rest.mean() - 0.5) < 0.005 and abs(rest.std() - 0.02) < 0.005  # its moments
    assert w[w != 0].min() >= w0[w0 != 0].min() and w.max() <= w0.max()
    # the draw is seeded by the name: unpacking again gives the same values
    again = device_pack.unpack(onnx.load_from_string(text))
    assert np.array_equal(numpy_helper.to_array(again.graph.initializer[0]), w)
    feed = {"x": np.random.default_rng(1).standard_normal((64, 1024)).astype(np.float32)}
    out = ort.InferenceSession(back.SerializeToString()).run(None, feed)[0]
    assert out.shape == (64, 64) and np.all(np.isfinite(out))
