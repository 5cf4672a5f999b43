"""EinNet's seed models (driver/boundary/zoo_seeds.py): valid, runnable at two batches, each with the structure
its paper names, and optimized by relsat end to end with the written model verified."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from relsat.driver.boundary import zoo

SEEDS = zoo.SEED_NAMES


def run(model: onnx.ModelProto, batch: int, seed: int = 0) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (i,) = sess.get_inputs()
    shape = [batch if isinstance(d, str) else d for d in i.shape]
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)
    (y,) = sess.run(None, {i.name: x})
    return y


def declared(v: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]


def convs(model, op="Conv"):
    return [n for n in model.graph.node if n.op_type == op]


def attr(node, name, default=None):
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def test_seed_names_are_zoo_names_and_not_tasos():
    assert SEEDS == ("dcgan", "infogan", "fsrcnn", "csrnet", "gcn", "resnet18", "longformer")
    assert set(SEEDS).isdisjoint(zoo.NAMES) and zoo.ALL_NAMES == zoo.NAMES + SEEDS
    with pytest.raises(ValueError, match="longformer"):
        zoo.build("einnet")


@pytest.mark.parametrize("name", SEEDS)
def test_small_seed_model_is_valid_and_runs_at_its_declared_shapes(name):
    m = zoo.build(name, small=True)
    onnx.checker.check_model(m, full_check=True)
    batches = (1, 3) if name != "longformer" else (1,)
    for batch in batches:
        y = run(m, batch)
        want = [batch if isinstance(d, str) else d for d in declared(m.graph.output[0])]
        assert list(y.shape) == want, (name, batch)
        assert np.isfinite(y).all() and float(np.abs(y).max()) > 0
    assert (declared(m.graph.input[0])[0] == "batch") == (name != "longformer")


def test_seed_models_are_seeded():
    a, b, c = (zoo.build("fsrcnn", small=True, seed=s) for s in (0, 0, 1))
    assert a.SerializeToString() == b.SerializeToString() != c.SerializeToString()


def test_each_seed_model_has_the_structure_its_paper_names():
    m = {n: zoo.build(n, small=True) for n in SEEDS}
    # the generators and FSRCNN upsample with ConvTranspose (DCGAN 5, InfoGAN 2, FSRCNN's 9x9 stride 3)
    assert len(convs(m["dcgan"], "ConvTranspose")) == 5 and len(convs(m["infogan"], "ConvTranspose")) == 2
    (deconv,) = convs(m["fsrcnn"], "ConvTranspose")
    assert attr(deconv, "kernel_shape") == [9, 9] and attr(deconv, "strides") == [3, 3]
    assert sum(n.op_type == "PRelu" for n in m["fsrcnn"].graph.node) == 3 + 2  # extract, shrink, expand, and m = 2 mapping layers in small
    # CSRNet's back end: six 3x3 convs of dilation 2
    assert sum(attr(n, "dilations") == [2, 2] for n in convs(m["csrnet"])) == 6
    # GCN: separable large kernels k x 1 and 1 x k (k = 7 in the small variant)
    shapes = [tuple(attr(n, "kernel_shape")) for n in convs(m["gcn"])]
    assert shapes.count((7, 1)) == shapes.count((1, 7)) == 2 * 4
    # the Longformer-style encoder: full QK^T attention plus a band mask built from positions
    ops = [n.op_type for n in m["longformer"].graph.node]
    assert ops.count("Softmax") == 1 and {"Range", "Abs", "LessOrEqual", "Where"} <= set(ops)


def test_longformer_mask_is_the_band():
    """The mask the graph builds is 0 exactly where |i - j| <= window: the band the derivations exploit."""
    m = zoo.build("longformer", small=True)
    seq, window = 128, 16
    where = next(n for n in m.graph.node if n.op_type == "Where")
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    probe.graph.output.append(onnx.helper.make_tensor_value_info(where.output[0], onnx.TensorProto.FLOAT, None))
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.zeros((1, seq, 32), np.float32)
    mask = sess.run([where.output[0]], {"input": x})[0]
    i, j = np.indices((seq, seq))
    assert np.array_equal(mask == 0, np.abs(i - j) <= window)
    assert (mask[mask != 0] == np.finfo(np.float32).min).all()


@pytest.mark.parametrize("name", ["dcgan", "fsrcnn", "longformer"])
def test_relsat_optimizes_a_seed_model_and_verifies_it(name, tmp_path):
    from relsat import optimize

    src = tmp_path / f"{name}.onnx"
    zoo.save(zoo.build(name, small=True), src)
    result = optimize(str(src), output=str(tmp_path / "out.onnx"), cost_model="analytic", measure=False)
    rep = result.report
    assert rep["verification"]["ok"], rep["verification"]
    written = onnx.load(tmp_path / "out.onnx")
    y0 = run(onnx.load(src), 2 if name != "longformer" else 1, seed=5)
    y1 = run(written, 2 if name != "longformer" else 1, seed=5)
    np.testing.assert_allclose(y1, y0, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["dcgan", "infogan"])
def test_generator_batchnorms_fold_into_conv_transposes_and_gemms(name, tmp_path):
    """ConvTranspose is a catalog operator: the BatchNormalizations after DCGAN's and InfoGAN's ConvTransposes
    (bn-fold-convtranspose, weight axis 1) and InfoGAN's Gemms (bn-fold-gemm-t) fold into their weights and
    biases, and the written model computes the same."""
    from relsat import optimize

    src = tmp_path / f"{name}.onnx"
    model = zoo.build(name, small=True)
    zoo.save(model, src)
    rep = optimize(str(src), output=str(tmp_path / "out.onnx"), cost_model="analytic", measure=False).report
    written = onnx.load(tmp_path / "out.onnx")
    assert len(convs(model, "BatchNormalization")) > 0 and not convs(written, "BatchNormalization")
    for op in ("ConvTranspose", "Gemm"):
        assert len(convs(written, op)) == len(convs(model, op))
    assert rep["verification"]["ok"]
    np.testing.assert_allclose(run(written, 3, seed=7), run(model, 3, seed=7), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", SEEDS)
def test_full_size_seed_model_runs_at_its_declared_shape(name):
    m = zoo.build(name)
    onnx.checker.check_model(m, full_check=True)
    y = run(m, 1)
    assert list(y.shape) == [1 if isinstance(d, str) else d for d in declared(m.graph.output[0])]
    assert np.isfinite(y).all()
