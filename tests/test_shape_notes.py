"""Inferred shapes written into the exported graphs (relsat.driver.boundary.shape_notes): named once per unknown dim,
written only where ONNX Runtime then runs no op more often (a residual Add + LayerNormalization it would fuse into
the slower SkipLayerNormalization is not), decided once per graph (a cost-cache row), and carried by the written
model. Real ONNX Runtime sessions (their optimized graphs read back), real DuckDB cost caches, real HiGHS."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.app.optimize import optimize
from relsat.driver.boundary import shape_notes

F = TensorProto.FLOAT
I64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)


def reshaped(norm: bool, links: int = 0) -> onnx.ModelProto:
    """x [batch, seq, 64] reshaped to a shape read from its own Shape (so ONNX Runtime cannot name the result's
    dims), then ``Relu(h) + h``, then a LayerNormalization where ``norm``; then ``links`` times ``Sigmoid(t) + 0``
    (zero Adds relsat takes away, so that a simplified graph is written)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "zero_i", "two"], ["bs"]),
             helper.make_node("Concat", ["bs", "c64"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Add", ["r", "h"], ["a"])]
    t = "a"
    if norm:
        nodes.append(helper.make_node("LayerNormalization", ["a", "g", "b"], ["n"], axis=-1))
        t = "n"
    for i in range(links):
        nodes += [helper.make_node("Sigmoid", [t], [f"s{i}"]), helper.make_node("Add", [f"s{i}", "zero"], [f"t{i}"])]
        t = f"t{i}"
    nodes.append(helper.make_node("Identity", [t], ["y"]))
    inits = [I64("zero_i", [0]), I64("two", [2]), I64("c64", [64]),
             numpy_helper.from_array(np.ones(64, np.float32), "g"), numpy_helper.from_array(np.zeros(64, np.float32), "b"),
             numpy_helper.from_array(np.zeros(64, np.float32), "zero")]
    g = helper.make_graph(nodes, "reshaped", [helper.make_tensor_value_info("x", F, ["batch", "seq", 64])],
                          [helper.make_tensor_value_info("y", F, [None, None, 64])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.checker.check_model(m)
    return m


def dims(v: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]


def test_an_unknown_dim_is_named_once_and_carried_to_every_value_of_that_size():
    found = {v.name: dims(v) for v in shape_notes.notes(reshaped(norm=False))}
    assert "y" not in found  # a graph output is declared already
    h = found["h"]
    assert len(h) == 3 and all(isinstance(d, str) and d for d in h)  # named, not left empty (no data propagated)
    assert found["r"] == h and found["a"] == h  # the same names: ONNX Runtime's planner can prove one size
    assert shape_notes.unknown_dims(shape_notes.notes(reshaped(norm=False))) == set(h)  # made up: unk__N
    named = reshaped(norm=False)  # a model whose output names those dims itself (as onnxsim's outputs do)
    out = named.graph.output[0].type.tensor_type.shape
    del out.dim[:]
    for d in h:
        out.dim.add().dim_param = d
    assert not shape_notes.unknown_dims(shape_notes.notes(reshaped(norm=False)), named)  # the runtime knows them
    # with data propagation the reshape's dims are the input's own names, which ONNX Runtime knows too
    assert not shape_notes.unknown_dims(shape_notes.notes(reshaped(norm=False), data_prop=True))


def test_notes_that_let_onnx_runtime_fuse_a_slower_kernel_are_not_written():
    """With the notes, Relu(h) + h and the LayerNormalization after it become one SkipLayerNormalization (8.7x slower
    than the two ops on the CPU: RESULTS, thirty-fifth session): not harmless. Without the norm nothing fuses."""
    slow = shape_notes.decide(reshaped(norm=True))
    assert slow["named"] is False and slow["more"] == {"com.microsoft.SkipLayerNormalization": [0, 1]}
    assert slow["values"] > 0
    fine = shape_notes.decide(reshaped(norm=False))
    assert fine["named"] is True and fine["more"] == {} and fine["values"] > 0
    assert shape_notes.harmless({"Add": 2, "Relu": 1}, {"Add": 1, "Relu": 1})
    assert not shape_notes.harmless({"Add": 2}, {"Add": 1, "com.microsoft.SkipLayerNormalization": 1})


def residual_of_input() -> onnx.ModelProto:
    """x [batch, seq, 64] reshaped to a shape read from its own Shape, added to x, then normalized: with data
    propagation the reshaped value is [batch, seq, 64] and ONNX Runtime fuses the Add and the norm; without it the
    value's dims are other names and it does not."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "zero_i", "two"], ["bs"]),
             helper.make_node("Concat", ["bs", "c64"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["a"]),
             helper.make_node("LayerNormalization", ["a", "g", "b"], ["y"], axis=-1)]
    inits = [I64("zero_i", [0]), I64("two", [2]), I64("c64", [64]),
             numpy_helper.from_array(np.ones(64, np.float32), "g"), numpy_helper.from_array(np.zeros(64, np.float32), "b")]
    g = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", F, ["batch", "seq", 64])],
                          [helper.make_tensor_value_info("y", F, [None, None, 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_notes_with_data_propagation_are_tried_first_and_those_without_where_they_would_fuse():
    m = residual_of_input()
    assert {v.name: dims(v) for v in shape_notes.notes(m, data_prop=True)}["r"] == ["batch", "seq", 64]
    assert {v.name: dims(v) for v in shape_notes.notes(m, data_prop=False)}["r"][0] != "batch"
    got = shape_notes.decide(m)
    assert got["named"] is True and got["data_prop"] is False and got["more"] == {}
    plain = shape_notes.decide(reshaped(norm=False))  # nothing to fuse: the notes with data propagation
    assert plain["named"] is True and plain["data_prop"] is True


def test_big_weights_are_given_to_inference_as_typed_inputs():
    w = numpy_helper.from_array(np.ones((64, 32), np.float32), "w")  # 2,048 elements: over SMALL
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
                          "mm", [helper.make_tensor_value_info("x", F, ["batch", 64])],
                          [helper.make_tensor_value_info("y", F, [None, 32])], [w, I64("k", [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    light = shape_notes._light(m)
    assert [t.name for t in light.graph.initializer] == ["k"] and "w" in {v.name for v in light.graph.input}
    assert {v.name: dims(v) for v in shape_notes.notes(m)} == {"m": ["batch", 32]}


def test_the_written_graph_carries_the_notes_once_decided_and_not_where_they_would_slow_it(tmp_path):
    """Under a guard threshold nothing beats, the graph without the zero Adds is written simplified. Where the
    notes are harmless it names its values' shapes, decided once (a second run reads the decision from the cost
    cache) and verified as written: its outputs equal the input model's under ONNX Runtime. ``shape_notes=False``
    writes none. (relsat's own shape rules see through this model's Reshape with its norm too, so the notes would
fuse nothing there: the refusal is the test above's.)"""
    import onnxruntime as ort

    cache, out = tmp_path / "costs.duckdb", tmp_path / "out.onnx"
    src = tmp_path / "fine.onnx"
    onnx.save(reshaped(norm=False, links=4), src)
    rep = optimize(str(src), output=str(out), threads=1, cost_cache=cache, guard_threshold=0.9).report
    assert rep["written"] == "optimized", rep["verdict"]
    assert rep["shape_notes"]["named"] is True and rep["shape_notes"]["cached"] is False
    written = onnx.load(out)
    named = {v.name for v in written.graph.value_info}
    assert named and named <= {o for n in written.graph.node for o in n.output}
    assert any("names the inferred shapes" in n for n in rep["notices"])
    x = np.random.default_rng(0).standard_normal((2, 5, 64)).astype(np.float32)
    run = lambda p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(run(out), run(src), rtol=0, atol=1e-6)
    import duckdb

    with duckdb.connect(str(cache), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM costs WHERE op_type = ?", [shape_notes.NOTES_OP]).fetchall() == [(1,)]
    again = optimize(str(src), output=str(out), threads=1, cost_cache=cache, guard_threshold=0.9).report
    assert again["shape_notes"]["named"] is True and again["shape_notes"]["cached"] is True

    bare = optimize(str(src), output=str(tmp_path / "bare.onnx"), threads=1, cost_cache=cache, guard_threshold=0.9,
                    shape_notes=False).report
    assert bare["written"] == "optimized" and bare["shape_notes"] is None
    assert not onnx.load(tmp_path / "bare.onnx").graph.value_info



def test_the_notice_says_what_the_notes_would_change():
    from relsat.driver.app.phases import notes_notice

    said = notes_notice({"named": False, "values": 9, "more": {"com.microsoft.SkipLayerNormalization": [0, 6]},
                         "fewer": {"Add": [20, 14]}}, 0)
    assert said.endswith("would run com.microsoft.SkipLayerNormalization 0->6")
    said = notes_notice({"named": True, "values": 811, "more": {}, "fewer": {"Gather": [85, 82]}}, 808)
    assert "808 values" in said and "Gather 85->82" in said  # (the written graph's count, not the original's)
    said = notes_notice({"named": True, "values": 811, "more": {}, "fewer": {}}, 0)  # inference failed on it
    assert "does not name" in said


def test_a_decision_is_read_back_only_under_its_own_key(tmp_path):
    """``decided`` stores its answer under the graph's profile key (graph, timing kind, threads, shapes) and the
    ONNX Runtime and ONNX versions: the same key reads it back, another key (another thread count) decides anew."""
    from relsat.extract.cost_cache import CostCache

    cache, m = CostCache(tmp_path / "c.duckdb"), reshaped(norm=True)
    first = shape_notes.decided(cache, "graph-at-1-thread", m, threads=1)
    assert first["cached"] is False and first["named"] is False
    again = shape_notes.decided(cache, "graph-at-1-thread", m, threads=1)
    assert again["cached"] is True and {k: v for k, v in again.items() if k != "cached"} == {
        k: v for k, v in first.items() if k != "cached"}
    other = shape_notes.decided(cache, "graph-at-2-threads", m, threads=2)
    assert other["cached"] is False


def test_shells_without_data_are_given_to_inference_as_typed_inputs():
    """An export's weight shells (dims, no data) of few elements are typed inputs too, not empty initializers."""
    shell = onnx.TensorProto(name="s", data_type=F, dims=[4])  # 4 elements, no data
    g = helper.make_graph([helper.make_node("Add", ["x", "s"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
                          "sh", [helper.make_tensor_value_info("x", F, ["batch", 4])],
                          [helper.make_tensor_value_info("y", F, [None, 4])], [shell])
    light = shape_notes._light(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    assert not light.graph.initializer and "s" in {v.name for v in light.graph.input}


def test_an_exported_graph_is_put_in_the_input_models_order():
    """``in_order``: a topological order taking, of the nodes ready, the one the input model ran first; a node the
    input model has not follows the nodes it reads; a node whose branch reads an outer value comes after its
    producer."""
    from relsat.driver.boundary.onnx_export import in_order, node_positions

    x = helper.make_tensor_value_info("x", F, [4])
    src = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="A"),
                             helper.make_node("Sigmoid", ["x"], ["b"], name="B"),
                             helper.make_node("Add", ["a", "b"], ["y"], name="C")], "src", [x],
                            [helper.make_tensor_value_info("y", F, [4])])
    positions = node_positions(helper.make_model(src))
    then = helper.make_graph([helper.make_node("Identity", ["b"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, [4])])
    exported = helper.make_graph([  # the e-graph's order: B's consumer first, a new node (N), an If reading b
        helper.make_node("Sigmoid", ["x"], ["b"], name="B"),
        helper.make_node("Neg", ["b"], ["n"], name="N"),
        helper.make_node("Relu", ["x"], ["a"], name="A"),
        helper.make_node("Add", ["a", "n"], ["y"], name="C"),
        helper.make_node("ReduceMax", ["x"], ["m"], name="M", keepdims=0),
        helper.make_node("Greater", ["m", "zero"], ["cond"], name="G"),
        helper.make_node("If", ["cond"], ["z"], name="I", then_branch=then, else_branch=then)],
        "exp", [x], [helper.make_tensor_value_info("y", F, [4]), helper.make_tensor_value_info("z", F, [4])],
        [numpy_helper.from_array(np.array(0, np.float32), "zero")])
    m = helper.make_model(exported)
    before = [n.name for n in m.graph.node]
    order = in_order(m, positions)
    names = [n.name for n in m.graph.node]
    assert names == [before[i] for i in order]  # the permutation returned is the one made
    assert names.index("A") < names.index("B") < names.index("N") < names.index("C")  # the input's A, B, C
    assert names.index("B") < names.index("I")  # the If's branch reads b
    assert sorted(names) == sorted(["B", "N", "A", "C", "M", "G", "I"])
    onnx.checker.check_model(helper.make_model(m.graph, opset_imports=[helper.make_opsetid("", 17)]))
    again = helper.make_model(m.graph)
    assert in_order(again, positions) == list(range(7)) and [n.name for n in again.graph.node] == names  # in order


def test_the_order_follows_a_values_producer_before_a_node_of_that_name():
    """A node named like another node's output value: the exported node that makes the value takes the position of
    the input model's node that made it, not of the node that has its name; a cycle is left as it is."""
    from relsat.driver.boundary.onnx_export import in_order, node_positions

    x = helper.make_tensor_value_info("x", F, [4])
    src = helper.make_graph([helper.make_node("Relu", ["x"], ["a"], name="t"),  # named "t", makes "a"
                             helper.make_node("Sigmoid", ["x"], ["b"], name="S"),
                             helper.make_node("Exp", ["x"], ["e"], name="E"),
                             helper.make_node("Neg", ["b"], ["t"], name="N"),  # makes "t"
                             helper.make_node("Sum", ["a", "e", "t"], ["y"], name="C")], "src", [x],
                            [helper.make_tensor_value_info("y", F, [4])])
    positions = node_positions(helper.make_model(src))
    exported = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["b"]), helper.make_node("Neg", ["b"], ["t"]),
                                  helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Relu", ["x"], ["a"]),
                                  helper.make_node("Sum", ["a", "e", "t"], ["y"])],
                                 "exp", [x], [helper.make_tensor_value_info("y", F, [4])])
    m = helper.make_model(exported)
    in_order(m, positions)
    assert [n.output[0] for n in m.graph.node] == ["a", "b", "e", "t", "y"]  # "t" made fourth, as in the input
    loop = helper.make_graph([helper.make_node("Relu", ["q"], ["p"]), helper.make_node("Neg", ["p"], ["q"])], "cyc",
                             [x], [helper.make_tensor_value_info("p", F, [4])])
    c = helper.make_model(loop)
    assert in_order(c, {"q": 0, "p": 1}) == [0, 1] and [n.output[0] for n in c.graph.node] == ["p", "q"]
