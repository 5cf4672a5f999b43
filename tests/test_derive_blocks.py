"""Zero-block weights split (driver/app/derive_blocks.py, issue 28 item 3): a weight whose exact zeros make it
block-diagonal over channels (a grouped Conv exported dense, with its channels permuted or not, a block-diagonal
MatMul) is derived into a grouped Conv or a batched / split MatMul inside ``relsat optimize``, checked under ONNX
Runtime, and the written model verified; one nonzero across the blocks derives nothing."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from relsat import optimize
from relsat.driver.app import derive as dv
from relsat.driver.app import derive_blocks as db


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _dense_grouped(o: int, i: int, g: int, k: int = 3, seed: int = 0) -> np.ndarray:
    """A group-``g`` Conv weight [o, i/g, k, k] expanded to the dense [o, i, k, k] it computes."""
    rng = np.random.default_rng(seed)
    w = np.zeros((o, i, k, k), np.float32)
    for b in range(g):
        w[b * o // g:(b + 1) * o // g, b * i // g:(b + 1) * i // g] = rng.standard_normal((o // g, i // g, k, k))
    return w


def _conv_model(w: np.ndarray, size: int = 16) -> onnx.ModelProto:
    o, i, kh, kw = w.shape
    b = np.random.default_rng(1).standard_normal(o).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", kernel_shape=[kh, kw],
                            pads=[kh // 2, kw // 2] * 2)
    g = helper.make_graph([node, helper.make_node("Relu", ["y"], ["z"], name="relu")], "c",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", i, size, size])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", o, None, None])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _matmul_model(w: np.ndarray, rows: int = 64) -> onnx.ModelProto:
    k, n = w.shape
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
                           helper.make_node("Relu", ["y"], ["z"], name="relu")], "m",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [rows, n])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _optimize(tmp_path, model):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    rep = optimize(str(src), output=str(dst), cost_model="analytic", measure=False).report
    return rep, dst


def test_a_dense_exported_grouped_conv_becomes_a_grouped_conv_without_gathers(tmp_path):
    model = _conv_model(_dense_grouped(32, 32, 8))
    (c,) = [c for c in db.find_blocks(model)]
    f = db.block_form(c, {"w": numpy_helper.to_array(model.graph.initializer[0])})
    assert f.g == 8 and f.identity
    rep, dst = _optimize(tmp_path, model)
    (d,) = rep["derivations"]["applied"]
    assert d["kind"] == "zero-blocks" and d["ops"] == {"Conv": 1} and "8 blocks of 4 x 4 channels as stored" in \
        d["detail"]
    assert any("derived at y" in n for n in rep["notices"])
    assert rep["verification"]["ok"] and rep["written"] == "optimized"
    written = onnx.load(dst)
    (conv,) = [n for n in written.graph.node if n.op_type == "Conv"]
    assert [a.i for a in conv.attribute if a.name == "group"] == [8]
    x = np.random.default_rng(2).standard_normal((2, 32, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(written, x), _run(model, x), rtol=1e-4, atol=1e-4)


def test_a_depthwise_conv_with_permuted_channels_gathers_them(tmp_path):
    """A depthwise 3x3 over 16 channels exported dense, its output and input channels shuffled: 16 blocks of 1 x 1
    found from the components of the nonzero pattern; the blocks kept in output channel order, so one Gather of
    the input channels is all it needs."""
    rng = np.random.default_rng(3)
    w = _dense_grouped(16, 16, 16)[rng.permutation(16)][:, rng.permutation(16)]
    model = _conv_model(w)
    rep, dst = _optimize(tmp_path, model)
    (d,) = rep["derivations"]["applied"]
    assert d["ops"] == {"Conv": 1, "Gather": 1} and "16 blocks of 1 x 1 channels after a permutation" in d["detail"]
    assert rep["verification"]["ok"]
    x = rng.standard_normal((1, 16, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(_run(onnx.load(dst), x), _run(model, x), rtol=1e-4, atol=1e-4)
    # the derived subgraph itself, whether extraction chose it or not
    (c,) = db.find_blocks(model)
    values = dv.model_values(model, [*c.inputs, *c.consts], {"x": [1, 16, 16, 16]}, threads=1)
    der = db.derive_zero_blocks(c, values, threads=1)
    assert isinstance(der, dv.Derivation) and der.max_error <= 1e-4
    assert dv.check(c, der.nodes, der.inits, values, threads=1) == der.max_error


def test_a_block_diagonal_matmul_is_batched_or_split_whichever_runs_faster(tmp_path):
    rng = np.random.default_rng(4)
    w = np.zeros((64, 96), np.float32)
    for b in range(4):
        w[b * 16:(b + 1) * 16, b * 24:(b + 1) * 24] = rng.standard_normal((16, 24))
    perm = rng.permutation(96)
    for weight, gathers in ((w, 0), (w[:, perm], 1)):  # output columns permuted: one Gather after
        model = _matmul_model(weight)
        (c,) = db.find_blocks(model)
        values = dv.model_values(model, [*c.inputs, *c.consts], {}, threads=1)
        d = db.derive_zero_blocks(c, values, threads=1)
        assert isinstance(d, dv.Derivation) and "4 blocks of 24 x 16 channels" in d.detail
        assert "ONNX Runtime: batched" in d.detail and d.ops.get("Gather", 0) == gathers
        assert d.ops.get("MatMul") in (1, 4)
    rep, dst = _optimize(tmp_path, model)
    (d,) = rep["derivations"]["applied"]
    assert d["kind"] == "zero-blocks" and rep["verification"]["ok"]
    x = rng.standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_allclose(_run(onnx.load(dst), x), _run(model, x), rtol=1e-4, atol=1e-4)


def test_both_matmul_forms_compute_the_original():
    rng = np.random.default_rng(5)
    w = np.zeros((32, 32), np.float32)
    for b in range(2):
        w[b * 16:(b + 1) * 16, b * 16:(b + 1) * 16] = rng.standard_normal((16, 16))
    p = rng.permutation(32)
    model = _matmul_model(w[p][:, rng.permutation(32)])
    (c,) = db.find_blocks(model)
    values = dv.model_values(model, [*c.inputs, *c.consts], {}, threads=1)
    b = db.block_form(c, values)
    assert b.g == 2 and not b.identity
    for batched in (True, False):
        nodes, inits = db._matmul(c, values, b, batched)
        assert isinstance(dv.check(c, nodes, inits, values, threads=1), float)


def test_a_gemm_with_trans_b_alpha_and_c():
    """Gemm(x, B, C, transB=1, alpha, beta) with B [N, K] block-diagonal: alpha folded into the blocks, beta * C
    added after."""
    rng = np.random.default_rng(6)
    b = np.zeros((24, 16), np.float32)
    for j in range(2):
        b[j * 12:(j + 1) * 12, j * 8:(j + 1) * 8] = rng.standard_normal((12, 8))
    node = helper.make_node("Gemm", ["x", "b", "c"], ["y"], name="gemm", transB=1, alpha=0.5, beta=2.0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 24])],
                          [numpy_helper.from_array(b, "b"),
                           numpy_helper.from_array(rng.standard_normal(24).astype(np.float32), "c")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    (c,) = db.find_blocks(model)
    values = dv.model_values(model, [*c.inputs, *c.consts], {}, threads=1)
    d = db.derive_zero_blocks(c, values, threads=1)
    assert isinstance(d, dv.Derivation) and "2 blocks of 12 x 8 channels as stored" in d.detail
    assert d.ops.get("Add") == 1 and "Gather" not in d.ops


def test_one_nonzero_across_the_blocks_derives_nothing(tmp_path):
    w = _dense_grouped(32, 32, 2)
    w[0, 31, 1, 1] = 0.5  # joins the first block to the second: one component
    assert db.blocks(w) is None
    rep, _ = _optimize(tmp_path, _conv_model(w))
    assert rep["derivations"] == {"applied": [], "skipped": []}
    w8 = _dense_grouped(32, 32, 8)
    w8[0, 31, 1, 1] = 0.5  # of 8 blocks, the first two it joins pack with the other six as 4 equal blocks
    assert db.blocks(w8).g == 4 and not db.blocks(w8).identity
    w2 = np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype(np.float32)
    w2[:4, 4:] = 0
    w2[4:, :4] = 0
    w2[0, 7, 0, 0] = 1.0
    assert db.blocks(w2) is None


def test_components_of_the_nonzero_pattern():
    nz = np.zeros((6, 5), bool)
    nz[0, 1] = nz[2, 1] = nz[2, 4] = nz[5, 0] = True
    rows, cols = db.components(nz)
    assert rows.tolist() == [0, 1, 0, 3, 4, 5] and cols.tolist() == [5, 0, 8, 9, 0]
