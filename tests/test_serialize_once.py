"""``relations.runtime.serialize_once``: inside the block a ModelProto is serialized once and its unoptimized
session is shared; outside it nothing is kept; ``relsat optimize`` runs its input model through one serialization
and leaves nothing registered behind."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.app.optimize import optimize
from relsat.relations import runtime


def model(scale: float = 2.0):
    w = numpy_helper.from_array(np.full((4, 4), scale, np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_one_serialization_and_one_plain_session_inside_the_block():
    m = model()
    assert runtime.serialized(m) is not runtime.serialized(m)  # outside: serialized afresh every time
    with runtime.serialize_once(m):
        blob = runtime.serialized(m)
        assert runtime.serialized(m) is blob and blob == m.SerializeToString()
        plain = runtime.session(m, optimize=False)
        assert runtime.session(m, optimize=False) is plain
        assert runtime.session(m) is not plain and runtime.session(m, optimize=False, threads=1) is not plain
        with runtime.serialize_once(m):  # nested: the outer block's bytes
            assert runtime.serialized(m) is blob
        assert runtime.serialized(m) is blob  # the inner block's end leaves the outer one's
        other = model(3.0)
        assert runtime.serialized(other) is not runtime.serialized(other)  # another model: not registered
    assert id(m) not in runtime._ONCE
    x = {"x": np.ones((1, 4), np.float32)}
    np.testing.assert_array_equal(plain.run(None, x)[0], np.full((1, 4), 8.0, np.float32))


def test_optimize_leaves_nothing_registered_and_verifies_as_before():
    m = model()
    before = m.SerializeToString()
    r = optimize(m, cost_model="analytic", measure=False)
    assert not runtime._ONCE and m.SerializeToString() == before  # the input model is not changed
    assert r.report["verification"]["ok"]


def test_a_big_model_made_into_many_sessions_goes_as_arrays_not_its_bytes():
    """Inside the block, a model whose big weights pass ``RUNNABLE_MIN_BYTES`` is made runnable as its bytes for a
    session or two, and as a ``Runnable`` (its weights as arrays) for more (``sessions``): a session of that loads
    in about half the time for a big model (the measured choice's input model); both run alike."""
    n = 1024  # a 4 MiB weight
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((n, n)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    x = {"x": np.random.default_rng(1).standard_normal((1, n)).astype(np.float32)}
    with runtime.serialize_once(m):
        blob = runtime.serialized(m)
        assert runtime.runnable(m) is blob and runtime.runnable(m, sessions=2) is blob
        many = runtime.runnable(m, sessions=4)
        assert isinstance(many, runtime.Runnable) and many.names == ("w",)
        ys = [runtime.session(r, threads=1).run(None, x)[0] for r in (blob, many)]
    np.testing.assert_array_equal(ys[0], ys[1])
    small = model()
    with runtime.serialize_once(small):  # (small weights: its bytes whatever the count)
        assert runtime.runnable(small, sessions=4) is runtime.serialized(small)
