"""The dims import puts on values (driver/boundary/import_dims.py): a transposed convolution's dim in Python and SQL
alike, a feature pyramid over a dynamic image size imported with only its Resizes opaque (the dims its Add needs
equal assumed so, and named), and two graph inputs' dims never assumed equal."""

import duckdb
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.app.optimize import optimize
from relsat.driver.boundary.onnx_import import import_model
from relsat.relations.catalog import SQL_MACROS
from relsat.relations.dims import code, deconv_dim, product_dim, window_dim
from relsat.relations.runtime import session

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def test_a_transposed_convolutions_dim_is_the_same_in_python_and_sql():
    """``dims.deconv_dim`` and the catalog's SQL ``deconv_dim`` agree on numbers, symbols, derived and product dims:
    a number for a number, the symbol for a stride-1 window that keeps it, the product dim ``i * s`` for a kernel
    as wide as its stride (2x upsampling), nothing provable otherwise."""
    con = duckdb.connect()
    for stmt in SQL_MACROS.split(";\n"):
        if stmt.strip():
            con.execute(stmt)
    S = code(2)
    W = window_dim(S, 3, 2, 1, 1, 1, 0)
    for i in (1, 7, 32, S, W, product_dim(S, 3)):
        for k, s, p0, p1, d, op in [(2, 2, 0, 0, 1, 0), (3, 2, 1, 1, 1, 1), (3, 2, 1, 1, 1, 0), (3, 1, 1, 1, 1, 0),
                                    (4, 4, 0, 0, 1, 0), (3, 1, 0, 0, 1, 0), (2, 2, 0, 0, 2, 0)]:
            want = deconv_dim(i, k, s, p0, p1, d, op)
            got = con.execute("SELECT deconv_dim(?, ?, ?, ?, ?, ?, ?)", [i, k, s, p0, p1, d, op]).fetchall()[0][0]
            assert got == want, (i, k, s, p0, p1, d, op)
    assert deconv_dim(16, 2, 2, 0, 0, 1, 0) == 32 and deconv_dim(S, 2, 2, 0, 0, 1, 0) == product_dim(S, 2)
    assert deconv_dim(S, 3, 1, 1, 1, 1, 0) == S and deconv_dim(S, 3, 2, 1, 1, 1, 0) is None


def _pyramid(path=None) -> onnx.ModelProto:
    """Two strided Convs over x [n, 3, h, w]; the coarser map upsampled 2x (Resize, nearest) and added to the finer
    one (the Add needs h/2 and 2 (h/4) equal); the sum and the upsampled map concatenated, a ConvTranspose
    (2x2, stride 2) and its bias added as Paddle writes it ([1, C, 1, 1])."""
    inits = [numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.3, name) for name, shape in
             (("w1", (8, 3, 3, 3)), ("b1", (8,)), ("w2", (8, 8, 3, 3)), ("b2", (8,)), ("wt", (16, 4, 2, 2)),
              ("bt", (1, 4, 1, 1)))]
    inits += [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Resize", ["c2", "", "scales"], ["up"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Add", ["r1", "up"], ["sum"]),
             helper.make_node("Concat", ["sum", "up"], ["cat"], axis=1),
             helper.make_node("ConvTranspose", ["cat", "wt"], ["d"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Add", ["d", "bt"], ["y"])]
    graph = helper.make_graph(nodes, "pyramid", [helper.make_tensor_value_info("x", F, ["n", 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", F, ["n", 4, None, None])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    if path is not None:
        onnx.save(m, path)
    return m


def test_a_feature_pyramid_over_a_dynamic_image_keeps_only_its_resize_opaque(tmp_path):
    """The Add of the upsampled map and the finer one takes their dims as equal (shape inference names them
    ``floor(2*floor(...))`` and the window's dim: no rule proves them equal, but the model runs only where they
    are); it is named in a notice. Then only the Resize is opaque: the Add and the Concat after it, and the
    ConvTranspose (its doubled dim a product dim) are catalog nodes, and the bias Add folds into the
    ConvTranspose. The written model equals the original at sizes other than those verified."""
    m = _pyramid()
    imported = import_model(m)
    opaque = [n for n in imported.notices if "opaque" in n]
    assert len(opaque) == 1 and "Resize" in opaque[0] and "Add" not in opaque[0], imported.notices
    assumed = [n for n in imported.notices if n.startswith("dims assumed equal")]
    assert len(assumed) == 1 and "1 broadcasting node(s)" in assumed[0], imported.notices
    result = optimize(m, cost_model="analytic", measure=False)
    applied = result.report["rules_applied"]
    assert applied.get("convtranspose-add-fold-channel-nobias", 0) >= 1, applied
    out = result.model
    assert [n.op_type for n in out.graph.node].count("Add") == 1  # the pyramid's; the bias folded
    for n, h, w in ((1, 32, 48), (2, 8, 16), (3, 40, 24)):
        x = RNG.standard_normal((n, 3, h, w)).astype(np.float32)
        want = session(m).run(None, {"x": x})[0]
        got = session(out).run(None, {"x": x})[0]
        assert got.shape == want.shape == (n, 4, h, w)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_two_graph_inputs_dims_are_never_assumed_equal():
    """x [n, s] + y [n, t] runs with s = 1 or t = 1 too (broadcasting): the user's dims are not assumed equal, no
    notice says so, and the written model computes the original where one of them is 1."""
    nodes = [helper.make_node("Add", ["x", "y"], ["a"]), helper.make_node("Relu", ["a"], ["z"])]
    graph = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", F, ["n", "s"]),
                                             helper.make_tensor_value_info("y", F, ["n", "t"])],
                              [helper.make_tensor_value_info("z", F, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    imported = import_model(m)
    assert not any(n.startswith("dims assumed equal") for n in imported.notices), imported.notices
    out = optimize(m, cost_model="analytic", measure=False, input_shapes={"x": [2, 5], "y": [2, 5]}).model
    for s, t in ((5, 1), (1, 5), (4, 4)):
        feeds = {"x": RNG.standard_normal((2, s)).astype(np.float32), "y": RNG.standard_normal((2, t)).astype(np.float32)}
        np.testing.assert_allclose(session(out).run(None, feeds)[0], session(m).run(None, feeds)[0])


def _c2f_neck() -> onnx.ModelProto:
    """A YOLO neck's C2f block over an upsampled map: two strided Convs over x [n, 3, h, w], the coarser map
    upsampled 2x (Resize) and concatenated with the finer one, a 1x1 Conv, its output split in two along the
    channels, a 3x3 Conv over one half, both concatenated and mixed by a 1x1 Conv."""
    weight = lambda name, *shape: numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.3, name)
    inits = [weight("w1", 8, 3, 3, 3), weight("w2", 8, 8, 3, 3), weight("w3", 8, 16, 1, 1), weight("w4", 4, 4, 3, 3),
             weight("w5", 8, 12, 1, 1),
             numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             numpy_helper.from_array(np.array([4, 4], np.int64), "halves")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["c1", "w2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Resize", ["c2", "", "scales"], ["up"], mode="nearest"),
             helper.make_node("Concat", ["up", "c1"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w3"], ["m"]),
             helper.make_node("Split", ["m", "halves"], ["m0", "m1"], axis=1),
             helper.make_node("Conv", ["m1", "w4"], ["b"], pads=[1, 1, 1, 1]),
             helper.make_node("Concat", ["m0", "m1", "b"], ["cat2"], axis=1),
             helper.make_node("Conv", ["cat2", "w5"], ["y"])]
    graph = helper.make_graph(nodes, "c2f", [helper.make_tensor_value_info("x", F, ["n", 3, "h", "w"])],
                              [helper.make_tensor_value_info("y", F, ["n", 8, None, None])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_a_split_after_an_upsampled_concat_keeps_its_inputs_dims():
    """The Concat takes the upsampled dims as the finer map's (exactly: ONNX requires them equal); the Split's
    outputs then carry its input's dims but along the axis, so the Split, the Conv after it and the second
    Concat are catalog nodes, and only the Resize is opaque (YOLOv8's neck: its C2f Splits after an upsampled Concat
    were kept opaque, with the next level's Concat). The written model equals the original at other sizes."""
    m = _c2f_neck()
    imported = import_model(m)
    opaque = [n for n in imported.notices if "opaque" in n]
    assert len(opaque) == 1 and "Resize" in opaque[0] and "Split" not in opaque[0], imported.notices
    assert not any(n.startswith("dims assumed equal") for n in imported.notices), imported.notices
    out = optimize(m, cost_model="analytic", measure=False).model
    for n, h, w in ((1, 32, 48), (2, 8, 16), (1, 40, 24)):
        x = RNG.standard_normal((n, 3, h, w)).astype(np.float32)
        want = session(m).run(None, {"x": x})[0]
        got = session(out).run(None, {"x": x})[0]
        assert got.shape == want.shape == (n, 8, h // 2, w // 2)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_outputs_of_an_op_onnx_has_no_schema_for_are_typed_by_onnx_runtimes_inference():
    """ONNX's shape inference has no entry at all for the outputs of an op it has no schema for (com.microsoft's
    FastGelu, Attention, EmbedLayerNormalization): ONNX Runtime's symbolic inference types them, and the catalog ops
    after one are imported as catalog nodes. They were left untyped, and every node after such an op kept opaque
    (DistilBERT through ONNX Runtime's transformer optimizer: 24 Add, 18 MatMul and 12 LayerNormalization
    opaque behind its EmbedLayerNormalization)."""
    w = numpy_helper.from_array(RNG.standard_normal((8, 4)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("FastGelu", ["x"], ["f"], domain="com.microsoft"), helper.make_node("MatMul", ["f", "w"], ["m"]),
         helper.make_node("Relu", ["m"], ["y"])], "g", [helper.make_tensor_value_info("x", F, ["batch", 8])],
        [helper.make_tensor_value_info("y", F, ["batch", 4])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    imported = import_model(model)
    batch = imported.types["x"][1][0]
    assert imported.types["f"] == (F, [batch, 8]) and imported.types["m"] == (F, [batch, 4]), imported.types
    opaque = [n for n in imported.notices if "opaque" in n]
    assert len(opaque) == 1 and "FastGelu" in opaque[0] and "MatMul" not in opaque[0], imported.notices
    result = optimize(model, cost_model="analytic", measure=False, threads=1)
    assert result.report["verification"]["ok"]
    x = RNG.standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(session(result.model).run(None, {"x": x})[0], session(model).run(None, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)
