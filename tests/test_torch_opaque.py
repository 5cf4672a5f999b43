"""The PyTorch mappings of the operators the catalog leaves opaque (extract/torch_opaque.py): each operator's
one-node models, run by the PyTorch runtime on PyTorch's CPU device and compared with ONNX Runtime element by
element under verify's tolerance, with the ONNX dtypes kept; the modes refused when a session is made; and the
shape arithmetic that the runtime keeps on the host (driver/boundary/torch_runtime.py)."""

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper

torch = pytest.importorskip("torch")

from relsat.driver.boundary.torch_runtime import TorchSession  # noqa: E402
from relsat.driver.boundary.verify import compare_output  # noqa: E402
from relsat.driver.errors import RelsatError  # noqa: E402
from relsat.extract import torch_cuda, torch_opaque  # noqa: E402
from relsat.relations.catalog import BY_ONNX  # noqa: E402
from relsat.relations.runtime import session  # noqa: E402

RNG = np.random.default_rng(0)
F32 = RNG.standard_normal((2, 3, 4)).astype(np.float32)
POS = (np.abs(F32) + 0.5).astype(np.float32)
INTS = np.array([[-7, -3, 0], [2, 5, 9]], np.int64)
IMG = RNG.standard_normal((1, 2, 5, 7)).astype(np.float32)
WIDE = RNG.standard_normal((1, 2, 8, 16)).astype(np.float32)


def model(nodes, feeds: dict, outputs: dict, inits: dict = {}, opset: int = 17) -> onnx.ModelProto:
    """A model of ``nodes`` over graph inputs typed as ``feeds`` and initializers ``inits``; ``outputs``: name ->
    ONNX dtype."""
    nodes = nodes if isinstance(nodes, list) else [nodes]
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in feeds.items()]
    outs = [helper.make_tensor_value_info(n, t, None) for n, t in outputs.items()]
    return helper.make_model(helper.make_graph(nodes, "g", ins, outs, [numpy_helper.from_array(np.asarray(v), n)
                                                                      for n, v in inits.items()]),
                             opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def node(op, inputs, **attrs):
    return helper.make_node(op, inputs, ["y"], **attrs)


CUDA = torch.cuda.is_available()
# PyTorch's CPU device here; CUDA where a GPU is (what a GPU runs: host values copied where device nodes read them)
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not CUDA, reason="needs an NVIDIA GPU with PyTorch CUDA")])]


def check(m: onnx.ModelProto, feeds: dict, device: str = "cpu") -> None:
    """The PyTorch runtime's outputs have ONNX Runtime's dtypes and shapes and its values under verify's tolerance."""
    want = session(m, optimize=False).run(None, feeds)
    got = TorchSession(m, device).run(None, feeds)
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        c = compare_output(w, g)
        assert c.ok, c.problem


def _unary(op, x=F32):
    return op, model(node(op, ["x"]), {"x": x}, {"y": T.FLOAT}), {"x": x}


def _compare(op, a, b):
    return op, model(node(op, ["a", "b"]), {"a": a, "b": b}, {"y": T.BOOL}), {"a": a, "b": b}


def _reduce(op, opset=17, x=F32, **attrs):
    if opset >= 18 and "axes" in attrs:
        axes = np.array(attrs.pop("axes"), np.int64)
        return op, model(node(op, ["x", "axes"], **attrs), {"x": x}, {"y": T.FLOAT}, {"axes": axes}, opset), {"x": x}
    return op, model(node(op, ["x"], **attrs), {"x": x}, {"y": T.FLOAT}, opset=opset), {"x": x}


def _resize(sizes=None, scales=None, x=IMG, opset=17, **attrs):
    inits = {"roi": np.zeros(0, np.float32), "scales": np.array(scales or [], np.float32)}
    names = ["x", "roi", "scales"]
    if sizes is not None:
        inits["sizes"], names = np.array(sizes, np.int64), names + ["sizes"]
    return "Resize", model(node("Resize", names, **attrs), {"x": x}, {"y": T.FLOAT}, inits, opset), {"x": x}


def _range(start, limit, delta, dtype):
    feeds = {n: np.array(v, dtype) for n, v in zip("abc", (start, limit, delta))}
    out = {"y": helper.np_dtype_to_tensor_dtype(np.dtype(dtype))}
    return "Range", model(node("Range", list(feeds)), feeds, out), feeds


CASES = {
    "shape": ("Shape", model(node("Shape", ["x"]), {"x": F32}, {"y": T.INT64}), {"x": F32}),
    "shape-start-end": ("Shape", model(node("Shape", ["x"], start=1, end=-1), {"x": F32}, {"y": T.INT64}), {"x": F32}),
    "cast-int32": ("Cast", model(node("Cast", ["x"], to=T.INT32), {"x": F32 * 5}, {"y": T.INT32}), {"x": F32 * 5}),
    "cast-bool": ("Cast", model(node("Cast", ["x"], to=T.BOOL), {"x": INTS}, {"y": T.BOOL}), {"x": INTS}),
    "cast-float": ("Cast", model(node("Cast", ["x"], to=T.DOUBLE), {"x": INTS}, {"y": T.DOUBLE}), {"x": INTS}),
    "constant-of-shape": ("ConstantOfShape", model(node("ConstantOfShape", ["s"]), {"s": np.array([2, 3], np.int64)},
                                                   {"y": T.FLOAT}), {"s": np.array([2, 3], np.int64)}),
    "constant-of-shape-int": ("ConstantOfShape", model(
        node("ConstantOfShape", ["s"], value=helper.make_tensor("v", T.INT64, [1], [7])),
        {"s": np.array([4], np.int64)}, {"y": T.INT64}), {"s": np.array([4], np.int64)}),
    "range-int": _range(3, -8, -2, np.int64),
    "range-float": _range(0.5, 7.0, 0.75, np.float32),
    "range-empty": _range(5, 2, 1, np.int32),
    "expand-both-ways": ("Expand", model(node("Expand", ["x", "s"]), {"x": F32[:, :1, :]}, {"y": T.FLOAT},
                                         {"s": np.array([3, 1, 3, 1], np.int64)}), {"x": F32[:, :1, :]}),
    "expand-lower-rank": ("Expand", model(node("Expand", ["x", "s"]), {"x": F32[:, :1, :]}, {"y": T.FLOAT},
                                          {"s": np.array([5, 4], np.int64)}), {"x": F32[:, :1, :]}),
    "equal": _compare("Equal", INTS, np.array([-3, 5, 0], np.int64)),
    "less": _compare("Less", F32, F32[0]),
    "greater": _compare("Greater", INTS, np.array(0, np.int64)),
    "less-or-equal": _compare("LessOrEqual", INTS, INTS[::-1].copy()),
    "greater-or-equal": _compare("GreaterOrEqual", F32, np.zeros(4, np.float32)),
    "and": _compare("And", INTS > 0, np.array([True, False, True])),
    "where": ("Where", model(node("Where", ["c", "a", "b"]), {"c": F32 > 0, "a": F32, "b": F32[0]}, {"y": T.FLOAT}),
              {"c": F32 > 0, "a": F32, "b": F32[0]}),
    "pow": ("Pow", model(node("Pow", ["a", "b"]), {"a": POS, "b": F32}, {"y": T.FLOAT}), {"a": POS, "b": F32}),
    "pow-int-exponent": ("Pow", model(node("Pow", ["a", "b"]), {"a": F32}, {"y": T.FLOAT},
                                      {"b": np.array(3, np.int64)}), {"a": F32}),
    "mod-int": ("Mod", model(node("Mod", ["a", "b"]), {"a": INTS, "b": np.array([4, -3, 5], np.int64)}, {"y": T.INT64}),
                {"a": INTS, "b": np.array([4, -3, 5], np.int64)}),
    "fmod-float": ("Mod", model(node("Mod", ["a", "b"], fmod=1), {"a": F32 * 4, "b": POS}, {"y": T.FLOAT}),
                   {"a": F32 * 4, "b": POS}),
    "min": ("Min", model(node("Min", ["a", "b", "c"]), {"a": F32, "b": F32[0], "c": F32[:, :1]}, {"y": T.FLOAT}),
            {"a": F32, "b": F32[0], "c": F32[:, :1]}),
    "max": ("Max", model(node("Max", ["a", "b"]), {"a": INTS, "b": np.array(1, np.int64)}, {"y": T.INT64}),
            {"a": INTS, "b": np.array(1, np.int64)}),
    "max-one-input": ("Max", model(node("Max", ["a"]), {"a": F32}, {"y": T.FLOAT}), {"a": F32}),
    "abs": _unary("Abs"),
    "log": _unary("Log", POS),
    "exp": _unary("Exp"),
    "floor": _unary("Floor", F32 * 3),
    "ceil": _unary("Ceil", F32 * 3),
    "reciprocal": _unary("Reciprocal", POS),
    "reduce-mean": _reduce("ReduceMean", axes=[-1], keepdims=0),
    "reduce-mean-opset18": _reduce("ReduceMean", 18, axes=[0, 2]),
    "reduce-mean-all": _reduce("ReduceMean"),
    "reduce-mean-noop": ("ReduceMean", model(node("ReduceMean", ["x", "axes"], noop_with_empty_axes=1), {"x": F32},
                                             {"y": T.FLOAT}, {"axes": np.zeros(0, np.int64)}, 18), {"x": F32}),
    "reduce-l2": _reduce("ReduceL2", axes=[1, 2]),
    "reduce-min": _reduce("ReduceMin", 18, axes=[1], keepdims=0),
    "reduce-max": _reduce("ReduceMax", axes=[0, -1]),
    "reduce-prod": _reduce("ReduceProd", x=POS, axes=[2, 0], keepdims=0),
    "gather-elements": ("GatherElements", model(node("GatherElements", ["x", "i"], axis=1), {"x": F32}, {"y": T.FLOAT},
                                                {"i": np.array([[[0, -1, 2, 1]], [[-3, 1, 0, 2]]], np.int64)}),
                        {"x": F32}),
    "instance-normalization": ("InstanceNormalization", model(
        node("InstanceNormalization", ["x", "s", "b"], epsilon=1e-3), {"x": IMG}, {"y": T.FLOAT},
        {"s": np.array([0.5, 2.0], np.float32), "b": np.array([0.1, -0.2], np.float32)}), {"x": IMG}),
    # the spelling of ppocr's and YOLO's upsampling
    "resize-nearest-asymmetric-floor": _resize(scales=[1, 1, 2, 2], mode="nearest",
                                               coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    "resize-nearest-default-sizes": _resize(sizes=[1, 2, 9, 4]),
    # source coordinates 2i + 0.5 and 4i + 1.5: ties that each rounding mode breaks its own way
    "resize-nearest-ties-floor": _resize(scales=[1, 1, 0.5, 0.25], x=WIDE),
    "resize-nearest-ties-ceil": _resize(scales=[1, 1, 0.5, 0.25], x=WIDE, nearest_mode="round_prefer_ceil"),
    "resize-nearest-align-corners-ceil": _resize(sizes=[1, 2, 8, 11], coordinate_transformation_mode="align_corners",
                                                 nearest_mode="round_prefer_ceil"),
    "resize-nearest-pytorch-half-pixel": _resize(scales=[1, 1, 0.6, 1.5], nearest_mode="ceil",
                                                 coordinate_transformation_mode="pytorch_half_pixel"),
    "resize-nearest-tf-half-pixel": _resize(scales=[1, 1, 1.7, 2.5], opset=11,
                                            coordinate_transformation_mode="tf_half_pixel_for_nn"),
    "resize-nearest-axes": _resize(sizes=[3, 10], opset=18, axes=[-2, -1], nearest_mode="floor"),
    "resize-linear-half-pixel": _resize(scales=[1, 1, 1.7, 2.5], mode="linear"),
    "resize-linear-align-corners": _resize(sizes=[1, 2, 9, 4], mode="linear",
                                           coordinate_transformation_mode="align_corners"),
    "resize-linear-asymmetric": _resize(scales=[1, 1, 2, 2], mode="linear",
                                        coordinate_transformation_mode="asymmetric"),
    "resize-linear-pytorch-half-pixel": _resize(sizes=[1, 2, 1, 12], mode="linear",
                                                coordinate_transformation_mode="pytorch_half_pixel"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_operator_matches_onnx_runtime(case, device):
    check(*CASES[case][1:], device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
def test_one_node_timing_path_matches_onnx_runtime(case, device):
    """``torch_cuda.build``, what CUDA operator timing runs, on the same one-node models."""
    _, m, feeds = CASES[case]
    values = {**feeds, **{t.name: numpy_helper.to_array(t) for t in m.graph.initializer}}
    got = torch_cuda.build(SimpleNamespace(node=m.graph.node[0], opset=m.opset_import[0].version), values, device)()
    (want,) = session(m, optimize=False).run(None, feeds)
    got = got.cpu().numpy()
    assert got.dtype == want.dtype and compare_output(want, got).ok


def test_every_opaque_operator_has_cases_and_none_is_in_the_catalog():
    ops = {(op.domain, op.op_type) for op in torch_opaque.OPAQUE}
    assert len(ops) == len(torch_opaque.OPAQUE) and not ops & set(BY_ONNX)
    cased = {op for op, _, _ in CASES.values()}
    # every opaque operator has cases; the other cases are of operators the catalog gained (ReduceMean, ReduceL2),
    # whose mapping (the catalog's) still runs the spellings kept here (axes as an input, all axes, a no-op)
    assert {op for _, op in ops} <= cased and all(("", op) in BY_ONNX for op in cased - {op for _, op in ops})


@pytest.mark.parametrize("m, why", [
    (_resize(scales=[1, 1, 2, 2], mode="cubic")[1], "mode='cubic'"),
    (_resize(scales=[1, 1, 2, 2], coordinate_transformation_mode="tf_crop_and_resize")[1], "tf_crop_and_resize"),
    (_resize(scales=[1, 1, 2, 2], opset=18, antialias=1)[1], "antialias=1"),
    (model(node("Resize", ["x", "s"]), {"x": IMG}, {"y": T.FLOAT}, {"s": np.ones(4, np.float32)}, opset=10),
     "before opset 11"),
    (model(node("Cast", ["x"], to=T.STRING), {"x": F32}, {"y": T.STRING}), "Cast to STRING"),
], ids=["resize-cubic", "resize-crop", "resize-antialias", "resize-10", "cast-string"])
def test_modes_without_a_mapping_are_refused_by_name(m, why):
    m.graph.node[0].name = "it"
    with pytest.raises(RelsatError, match=rf"node it \(ai.onnx::\w+\): .*{why}.* has no mapping here"):
        TorchSession(m, "cpu")


def _shape_arithmetic() -> onnx.ModelProto:
    """A YOLO-like graph over a dynamic [n, c, h, w] input: x reshaped to [n, c, h * w] from its own dims, and
    a grid of Range over w, expanded to [h, w] and added to x (host values read as data)."""
    x = helper.make_tensor_value_info("x", T.FLOAT, ["n", "c", "h", "w"])
    y = helper.make_tensor_value_info("y", T.FLOAT, None)
    z = helper.make_tensor_value_info("z", T.FLOAT, None)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "two"], ["nc"]),
             helper.make_node("Gather", ["s", "i2"], ["h"]),
             helper.make_node("Gather", ["s", "i3"], ["w"]),
             helper.make_node("Mul", ["h", "w"], ["hw"]),
             helper.make_node("Unsqueeze", ["hw", "zero"], ["hw1"]),
             helper.make_node("Concat", ["nc", "hw1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"]),
             helper.make_node("Cast", ["w"], ["wf"], to=T.FLOAT),
             helper.make_node("Range", ["half", "wf", "one"], ["grid"]),
             helper.make_node("Unsqueeze", ["h", "zero"], ["h1"]),
             helper.make_node("Unsqueeze", ["w", "zero"], ["w1"]),
             helper.make_node("Concat", ["h1", "w1"], ["hw2"], axis=0),
             helper.make_node("Expand", ["grid", "hw2"], ["grid2"]),
             helper.make_node("Add", ["x", "grid2"], ["z"])]
    inits = [numpy_helper.from_array(np.array(v, t), n) for n, v, t in [
        ("zero", [0], np.int64), ("two", [2], np.int64), ("i2", 2, np.int64), ("i3", 3, np.int64),
        ("half", 0.5, np.float32), ("one", 1.0, np.float32)]]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y, z], inits),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.mark.parametrize("device", DEVICES)
def test_shape_arithmetic_stays_on_the_host(device):
    """Every node over the dims runs on the host; only the Reshape and the Add run on the device, and the
    session answers as ONNX Runtime at two input shapes (the host values are computed per run)."""
    m = _shape_arithmetic()
    sess, ref = TorchSession(m, device), session(m)
    assert [s.node.op_type for s in sess.steps if not s.on_host] == ["Reshape", "Add"]
    for shape in [(1, 2, 3, 4), (2, 3, 5, 2)]:
        feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
        for w, g in zip(ref.run(None, feeds), sess.run(None, feeds)):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert compare_output(w, g).ok


def test_a_host_value_as_graph_output_keeps_its_dtype():
    m = model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["y"], to=T.INT32)],
              {"x": F32}, {"y": T.INT32})
    sess = TorchSession(m, "cpu")
    assert all(s.on_host for s in sess.steps)
    (y,) = sess.run(None, {"x": F32})
    assert y.dtype == np.int32 and y.tolist() == [2, 3, 4]
    (t,) = sess.run_on_device({"x": torch.from_numpy(F32)})
    assert t.dtype == torch.int32 and t.tolist() == [2, 3, 4]


def test_refusal_names_no_mapping_first():
    assert torch_cuda.refusal(helper.make_node("TopK", ["x", "k"], ["v", "i"]), 17) == "no mapping for this operator"
    assert torch_cuda.refusal(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear"), 17) is None
