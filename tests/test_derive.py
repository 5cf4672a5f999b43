"""Derivations inside ``relsat optimize`` (driver/app/derive.py): masked-Softmax chains found in the graph, their
band derived from the mask's values (no banded-attention rule anywhere), checked under ONNX Runtime, added to
the e-graph as alternatives, and the written model verified against the input."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat import optimize
from relsat.driver.app import derive as dv
from relsat.driver.boundary import zoo
from relsat.driver.boundary.zoo_builder import Builder
from relsat.driver.boundary.zoo_seeds import _longformer


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _attention(seq: int, mask: np.ndarray, extra_reader: bool = False) -> onnx.ModelProto:
    """softmax(Q K^T * s + mask) V over one head, Q, K, V linear in the input: the chain and nothing more."""
    rng = np.random.default_rng(0)
    d = 16
    inits = [numpy_helper.from_array(rng.standard_normal((d, d)).astype(np.float32) / 4, n) for n in "qkv"]
    inits += [numpy_helper.from_array(mask.astype(np.float32), "mask"),
              numpy_helper.from_array(np.array(0.25, np.float32), "scale")]
    nodes = [helper.make_node("MatMul", ["x", n], [f"{n}x"], name=f"lin_{n}") for n in "qkv"]
    nodes += [helper.make_node("Transpose", ["kx"], ["kt"], perm=[1, 0], name="kt"),
              helper.make_node("MatMul", ["qx", "kt"], ["scores"], name="scores"),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scaled"),
              helper.make_node("Add", ["scaled", "mask"], ["masked"], name="masked"),
              helper.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="probs"),
              helper.make_node("MatMul", ["probs", "vx"], ["y"], name="y")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, d])]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["probs"], ["seen"], name="seen"))
        outputs.append(helper.make_tensor_value_info("seen", TensorProto.FLOAT, [seq, seq]))
    g = helper.make_graph(nodes, "att", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, d])], outputs,
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _band(seq: int, w: int) -> np.ndarray:
    i, j = np.indices((seq, seq))
    return np.where(np.abs(i - j) <= w, 0.0, np.finfo(np.float32).min)


def test_chains_are_found_by_structure_and_a_shared_inner_value_stops_one():
    m = _attention(128, _band(128, 16))
    (c,) = dv.find_chains(m)
    assert [n.name for n in c.nodes] == ["scores", "scaled", "masked", "probs", "y"]
    assert (c.root, c.mask, c.consts, c.inputs) == ("y", "mask", ["mask", "scale"], ["qx", "kt", "vx"])
    assert dv.find_chains(_attention(128, _band(128, 16), extra_reader=True)) == []
    b = Builder(0)
    lf = b.model("lf", _longformer(b, 128, 32, 2, 2, 16))
    assert len(dv.find_chains(lf)) == 2  # one per layer; the band mask is built by Range/Sub/Abs/Where


def test_the_band_is_derived_checked_and_written_verified(tmp_path):
    seq = 256
    m = _attention(seq, _band(seq, 16))
    src = tmp_path / "att.onnx"
    onnx.save(m, src)
    rep = optimize(str(src), output=str(tmp_path / "o.onnx"), cost_model="analytic", measure=False).report
    (d,) = rep["derivations"]["applied"]
    assert d["root"] == "y" and d["kind"] == "mask-band-blocks" and d["replaced"] == ["scores", "scaled", "masked",
                                                                                        "probs", "y"]
    assert "blocks of 32" in d["detail"] and "window of 64 of 256" in d["detail"] and d["max_error"] <= 1e-5
    assert rep["verification"]["ok"] and rep["written"] == "optimized"
    written = onnx.load(tmp_path / "o.onnx")
    assert "Gather" in {n.op_type for n in written.graph.node} or "Slice" in {n.op_type for n in written.graph.node}
    x = np.random.default_rng(3).standard_normal((seq, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(written, x), _run(m, x), rtol=1e-4, atol=1e-5)


def test_a_mask_without_a_band_to_skip_derives_nothing(tmp_path):
    seq = 128
    causal = np.where(np.tril(np.ones((seq, seq))) > 0, 0.0, -1e9)  # the last rows keep every column
    src = tmp_path / "c.onnx"
    onnx.save(_attention(seq, causal), src)
    rep = optimize(str(src), cost_model="analytic", measure=False).report
    assert rep["derivations"]["applied"] == []
    (s,) = rep["derivations"]["skipped"]
    assert s["root"] == "y" and "no band to skip" in s["why"]
    assert any("derivation skipped at y" in n for n in rep["notices"])


def test_no_derive_leaves_the_e_graph_alone(tmp_path):
    src = tmp_path / "att.onnx"
    onnx.save(_attention(128, _band(128, 16)), src)
    rep = optimize(str(src), cost_model="analytic", measure=False, derive=False).report
    assert rep["derivations"] == {"applied": [], "skipped": []} and rep["written"] == "original"


def test_the_check_refuses_a_wrong_derived_form():
    """The ONNX Runtime check compares the derived nodes with the chain's: one window constant changed (the mask
    read one block off) is refused with the error it saw."""
    seq = 128
    m = _attention(seq, _band(seq, 16))
    (c,) = dv.find_chains(m)
    values = dv.model_values(m, [*c.inputs, *c.consts], {"x": [seq, 16]}, threads=1)
    d = dv.derive_chain(c, values, threads=1)
    assert isinstance(d, dv.Derivation)
    assert dv.check(c, d.nodes, d.inits, values, threads=1) == d.max_error
    bad = [onnx.TensorProto() for _ in d.inits]
    for b, t in zip(bad, d.inits):
        b.CopyFrom(t)
    win = next(t for t in bad if numpy_helper.to_array(t).size > 1 and (numpy_helper.to_array(t) < -1e4).any())
    arr = numpy_helper.to_array(win)
    win.CopyFrom(numpy_helper.from_array(np.roll(arr, 1, axis=-1), win.name))
    why = dv.check(c, d.nodes, bad, values, threads=1)
    assert isinstance(why, str) and "disagrees with the original" in why


@pytest.mark.slow
def test_the_zoo_longformer_at_4096_is_derived_within_a_minute(tmp_path):
    """Issue 28: both layers' attention derived at sequence 4096 (window 256) inside relsat optimize, and derivation
    plus extraction within 60 s (analytic costs; the measured run is benchmarks/RESULTS.md's)."""
    rep = optimize(zoo.build("longformer"), output=str(tmp_path / "o.onnx"), cost_model="analytic",
                   measure=False).report
    assert len(rep["derivations"]["applied"]) == 2 and rep["verification"]["ok"]
    assert rep["phases_s"]["derive"] + rep["phases_s"]["extract"] <= 60


def _conv_model(w: np.ndarray, size: int = 32, **attrs) -> onnx.ModelProto:
    m, c = w.shape[:2]
    b = np.random.default_rng(1).standard_normal(m).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", kernel_shape=list(w.shape[2:]), **attrs)
    g = helper.make_graph([node, helper.make_node("Relu", ["y"], ["z"], name="relu")], "c",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, size, size])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", m, None, None])],
                          [numpy_helper.from_array(w.astype(np.float32), "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _low_rank(m: int, c: int, k: int, r: int, seed: int = 0) -> np.ndarray:
    """W[m, c, i, j] = sum_r A[m, r, j] B[r, c, i]: a k x 1 then a 1 x k convolution through r channels, merged."""
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, r, k)), rng.standard_normal((r, c, k))
    return np.einsum("mrj,rci->mcij", a, b) / k


@pytest.mark.parametrize("attrs", [{"pads": [3, 3, 3, 3]}, {"pads": [1, 3, 2, 0], "strides": [2, 1],
                                                                  "dilations": [1, 2]}])
def test_a_low_rank_kernel_splits_into_two_one_dimensional_convolutions(tmp_path, attrs):
    """EinNet's low-rank derivation: a 7x7 kernel of rank 3 over 8 -> 8 channels (what a merged k x 1 / 1 x k pair
    is) becomes a 7x1 Conv into 3 channels and a 1x7 Conv, found from the weight's singular values alone, at any
    pads, strides and dilations; the written model computes the same (dynamic batch kept)."""
    model = _conv_model(_low_rank(8, 8, 7, 3), **attrs)
    src = tmp_path / "c.onnx"
    onnx.save(model, src)
    rep = optimize(str(src), output=str(tmp_path / "o.onnx"), cost_model="analytic", measure=False).report
    (d,) = rep["derivations"]["applied"]
    assert d["kind"] == "low-rank-conv" and d["root"] == "y" and "has rank 3: a 7x1 Conv" in d["detail"]
    assert rep["written"] == "optimized" and rep["verification"]["ok"]
    written = onnx.load(tmp_path / "o.onnx")
    kernels = sorted(tuple(helper.get_attribute_value(a)) for n in written.graph.node if n.op_type == "Conv"
                     for a in n.attribute if a.name == "kernel_shape")
    assert kernels == [(1, 7), (7, 1)]
    assert written.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    x = np.random.default_rng(2).standard_normal((2, 8, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(written, x), _run(model, x), rtol=1e-3, atol=1e-4)


def test_the_other_order_splits_too(tmp_path):
    """W[m, c, i, j] = sum_r A[m, r, i] B[r, c, j] (a 1 x k Conv first, then a k x 1 one, merged): rank 2 over
    (out channel, kernel row) x (in channel, kernel column); 5x3 kernel, stride 2 down the rows."""
    rng = np.random.default_rng(4)
    w = np.einsum("mri,rcj->mcij", rng.standard_normal((6, 2, 5)), rng.standard_normal((2, 4, 3)))
    model = _conv_model(w, pads=[2, 1, 2, 1], strides=[2, 1])
    src = tmp_path / "c.onnx"
    onnx.save(model, src)
    rep = optimize(str(src), output=str(tmp_path / "o.onnx"), cost_model="analytic", measure=False).report
    (d,) = rep["derivations"]["applied"]
    assert "has rank 2: a 1x3 Conv into 2 channels, then a 5x1 Conv" in d["detail"] and rep["verification"]["ok"]
    x = np.random.default_rng(5).standard_normal((1, 4, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(_run(onnx.load(tmp_path / "o.onnx"), x), _run(model, x), rtol=1e-3, atol=1e-4)


def test_a_full_rank_kernel_derives_nothing_and_says_nothing(tmp_path):
    src = tmp_path / "c.onnx"
    onnx.save(_conv_model(np.random.default_rng(0).standard_normal((8, 8, 3, 3))), src)
    rep = optimize(str(src), cost_model="analytic", measure=False).report
    assert rep["derivations"] == {"applied": [], "skipped": []}
    assert not any("derivation" in n or "derived" in n for n in rep["notices"])


def test_a_rank_that_saves_nothing_is_not_split():
    """Rank 6 of a 3x3 kernel over 4 -> 4 channels: 6 * (4*3 + 4*3) = 144 multiplications per position against
    4*4*9 = 144: no split."""
    m = _conv_model(_low_rank(4, 4, 3, 6))
    (c,) = dv.find_convs(m)
    values = dv.model_values(m, [*c.inputs, *c.consts], {"x": [1, 4, 32, 32]}, threads=1)
    assert dv.derive(c, values, threads=1) is None
    assert isinstance(dv.derive(dv.find_convs(_conv_model(_low_rank(4, 4, 3, 1)))[0], values | {
        "w": _low_rank(4, 4, 3, 1).astype(np.float32)}, threads=1), dv.Derivation)


def test_an_overridable_initializer_is_not_a_constant_to_derive_from():
    """A mask or weight that is also a graph input (ONNX IR >= 4: a caller may feed another value) is not derived
    from: its default value decides nothing."""
    m = _attention(128, _band(128, 16))
    m.graph.input.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [128, 128]))
    assert dv.find_chains(m) == []
    c = _conv_model(_low_rank(8, 8, 7, 3))
    assert len(dv.find_convs(c)) == 1
    c.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 8, 7, 7]))
    assert dv.find_convs(c) == []
