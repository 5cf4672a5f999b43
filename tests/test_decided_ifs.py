"""Decided ``If`` nodes (relsat.driver.boundary.decided_ifs): an ``If`` whose condition the import computes from
constants and static dims is replaced by its taken branch before the e-graph is built; one that a dynamic dim
decides stays. Models rewritten, exported and compared with the input under ONNX Runtime at several sizes of
their dynamic dims (``roundtrip``)."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from relsat.driver.boundary.decided_ifs import inline_decided, inline_within
from relsat.relations.onnx_form import walk_graphs
from relsat.relations.runtime import session
from test_onnx_roundtrip import F, make, roundtrip, w

B = TensorProto.BOOL


def _out(name, shape):
    return helper.make_tensor_value_info(name, F, shape)


def _dim_is(x: str, axis: int, value: int, out: str, tag: str) -> list:
    """out = (Shape(x)[axis] == value), a bool scalar."""
    return [helper.make_node("Shape", [x], [f"{tag}_s"]),
            helper.make_node("Gather", [f"{tag}_s", f"{tag}_i"], [f"{tag}_d"], axis=0),
            helper.make_node("Equal", [f"{tag}_d", f"{tag}_v"], [out])], {
        f"{tag}_i": np.int64(axis), f"{tag}_v": np.int64(value)}


def _model():
    """x: [2, n, 4]. ``If`` A on bool(Shape(x)[0]) (2: true) whose then-branch names a value "h" as ``If`` D's
    (on the same condition) does, holds an initializer and a nested ``If`` B on Shape(x)[2] == 4 (true); ``If`` C on Shape(x)[1] == 1 (n: dynamic) stays."""
    inner_then = helper.make_graph([helper.make_node("Mul", ["h", "k"], ["m"])], "b_then", [], [_out("m", [2, "n", 4])])
    inner_else = helper.make_graph([helper.make_node("Neg", ["h"], ["m2"])], "b_else", [], [_out("m2", [2, "n", 4])])
    cond_b, consts_b = _dim_is("x", 2, 4, "cb", "b")
    a_then = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["h"]), *cond_b,
         helper.make_node("If", ["cb"], ["hb"], then_branch=inner_then, else_branch=inner_else, name="B"),
         helper.make_node("Add", ["hb", "bias"], ["ya"]), helper.make_node("Identity", ["x"], ["xo"])], "a_then", [],
        [_out("ya", [2, "n", 4]), _out("xo", [2, "n", 4])],
        [onnx.numpy_helper.from_array(w(4, seed=3), "bias"),
         *(onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts_b.items())])
    a_else = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["ye"]), helper.make_node("Neg", ["x"], ["xe"])],
                               "a_else", [], [_out("ye", [2, "n", 4]), _out("xe", [2, "n", 4])])
    c_then = helper.make_graph([helper.make_node("Relu", ["z"], ["zs"])], "c_then", [], [_out("zs", [2, "n", 4])])
    c_else = helper.make_graph([helper.make_node("Abs", ["z"], ["zi"])], "c_else", [], [_out("zi", [2, "n", 4])])
    cond_c, consts_c = _dim_is("x", 1, 1, "cc", "c")
    d_then = helper.make_graph([helper.make_node("Tanh", ["x"], ["h"])], "d_then", [], [_out("h", [2, "n", 4])])
    d_else = helper.make_graph([helper.make_node("Exp", ["x"], ["de"])], "d_else", [], [_out("de", [2, "n", 4])])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
             helper.make_node("Cast", ["d0"], ["ca"], to=B),
             helper.make_node("If", ["ca"], ["g"], then_branch=d_then, else_branch=d_else, name="D"),
             helper.make_node("If", ["ca"], ["ya", "xa"], then_branch=a_then, else_branch=a_else, name="A"),
             helper.make_node("Add", ["ya", "g"], ["y1"]), helper.make_node("Mul", ["y1", "xa"], ["z"]),
             *cond_c, helper.make_node("If", ["cc"], ["y"], then_branch=c_then, else_branch=c_else, name="C")]
    inits = {"zero": np.int64(0), "k": w(4, seed=5), **consts_c}
    return make(nodes, {"x": [2, "n", 4]}, [_out("y", [2, "n", 4])], inits, opset=17)


def test_an_if_the_static_dims_decide_is_replaced_by_its_branch_and_computes_the_same():
    model = _model()
    before = model.SerializeToString()
    imported, out = roundtrip(model, input_shapes={"x": [2, 5, 4]})  # verified at several sizes of n
    assert model.SerializeToString() == before  # the input model is not touched
    assert [n.name for n in out.graph.node if n.op_type == "If"] == ["C"]  # n decides C: it stays
    ops = [n.op_type for n in out.graph.node]
    assert "Relu" in ops and "Tanh" in ops and "Sigmoid" not in ops and "Neg" not in ops  # A's then, B's then
    notice = next(n for n in imported.notices if "decided at import" in n)
    assert "If x3" in notice and "'A'" in notice and "'D'" in notice
    assert imported.node_count == len(model.graph.node)


def test_branch_values_are_renamed_away_from_the_graphs_names():
    model = _model()
    folded = {"ca": np.array(True)}
    out, names = inline_decided(model, folded)
    assert names == ["D", "A"]
    produced = [o for n in out.graph.node for o in n.output]
    assert len(produced) == len(set(produced))  # A's "h" renamed: D's, first, became the graph's "g"
    assert "g" in produced and "A/h" in produced
    b = next(n for n in out.graph.node if n.name == "A/B" or n.name == "B")
    assert "A/h" in [i for g in (a.g for a in b.attribute) for n in g.node for i in n.input]  # its reads follow
    assert "A/bias" in {t.name for t in out.graph.initializer}  # the branch's initializer moved (renamed)
    assert any(n.op_type == "Identity" and list(n.output) == ["xa"] and list(n.input) == ["x"] for n in out.graph.node)
    assert out.graph.output[0].name == "y"
    onnx.checker.check_model(out)
    assert inline_decided(model, {})[0] is model  # nothing decided: the same model


def test_a_condition_a_caller_may_override_decides_nothing():
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "t", [], [_out("t", [3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "e", [], [_out("e", [3])])
    model = make([helper.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g)],
                 {"x": [3]}, ["y"], {"flag": np.array(True)}, inits_as_inputs=True)
    assert inline_decided(model, {})[1] == []  # an initializer listed as an input is a default, not a constant
    fixed = make([helper.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g)],
                 {"x": [3]}, ["y"], {"flag": np.array(False)})
    out, names = inline_decided(fixed, {})
    assert len(names) == 1 and [n.op_type for n in out.graph.node] == ["Neg"]


def _kept_if_model():
    """x: [2, n, 4], sr: an int64 scalar. The main ``If`` S on sr == 16000 (an input's value: it stays). Its
    then-branch computes its own condition bool(Shape(x)[0]) for ``If`` E (2: true), whose then-branch
    holds ``If`` F on Shape(x)[2] == 4 (true); its else-branch holds ``If`` G on ``ca``, a value the main
    graph computes (Cast(Shape(x)[0])), and ``If`` H on Shape(x)[1] == 1 (n: dynamic: it stays)."""
    f_then = helper.make_graph([helper.make_node("Tanh", ["x"], ["ft"])], "f_then", [], [_out("ft", [2, "n", 4])])
    f_else = helper.make_graph([helper.make_node("Exp", ["x"], ["fe"])], "f_else", [], [_out("fe", [2, "n", 4])])
    cond_f, consts_f = _dim_is("x", 2, 4, "cf", "f")
    e_then = helper.make_graph(
        [*cond_f, helper.make_node("If", ["cf"], ["et"], then_branch=f_then, else_branch=f_else, name="F")],
        "e_then", [], [_out("et", [2, "n", 4])],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts_f.items()])
    e_else = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["ee"])], "e_else", [], [_out("ee", [2, "n", 4])])
    s_then = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["ts"]), helper.make_node("Gather", ["ts", "zero"], ["t0"], axis=0),
         helper.make_node("Cast", ["t0"], ["tc"], to=B),
         helper.make_node("If", ["tc"], ["st"], then_branch=e_then, else_branch=e_else, name="E")],
        "s_then", [], [_out("st", [2, "n", 4])])
    g_then = helper.make_graph([helper.make_node("Relu", ["x"], ["gt"])], "g_then", [], [_out("gt", [2, "n", 4])])
    g_else = helper.make_graph([helper.make_node("Neg", ["x"], ["ge"])], "g_else", [], [_out("ge", [2, "n", 4])])
    h_then = helper.make_graph([helper.make_node("Abs", ["gx"], ["ht"])], "h_then", [], [_out("ht", [2, "n", 4])])
    h_else = helper.make_graph([helper.make_node("Sin", ["gx"], ["he"])], "h_else", [], [_out("he", [2, "n", 4])])
    cond_h, consts_h = _dim_is("x", 1, 1, "ch", "h")
    s_else = helper.make_graph(
        [helper.make_node("If", ["ca"], ["gx"], then_branch=g_then, else_branch=g_else, name="G"), *cond_h,
         helper.make_node("If", ["ch"], ["se"], then_branch=h_then, else_branch=h_else, name="H")],
        "s_else", [], [_out("se", [2, "n", 4])],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in consts_h.items()])
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
             helper.make_node("Cast", ["d0"], ["ca"], to=B),
             helper.make_node("Equal", ["sr", "rate"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], then_branch=s_then, else_branch=s_else, name="S")]
    return make(nodes, {"x": [2, "n", 4], "sr": (TensorProto.INT64, [])}, [_out("y", [2, "n", 4])],
                {"zero": np.int64(0), "rate": np.int64(16000)}, opset=17)


def _branch_ops(node) -> dict[str, list[str]]:
    """Each branch of ``node``: the op types of its nodes, and the names of the ``If`` nodes in it (any depth)."""
    out = {}
    for a in node.attribute:
        out[a.name] = [n.op_type for n in a.g.node] + [
            f"If:{n.name}" for g in walk_graphs(a.g) for n in g.node if n.op_type == "If"]
    return out


def test_ifs_inside_the_branches_of_a_kept_if_are_decided_at_any_depth():
    model = _kept_if_model()
    before = model.SerializeToString()
    imported, out = roundtrip(model, input_shapes={"x": [2, 5, 4]})  # verified at several sizes of n
    assert model.SerializeToString() == before
    (s,) = [n for n in out.graph.node if n.op_type == "If"]  # S stays: an input's value decides it
    ops = _branch_ops(s)
    assert ops["then_branch"] == ["Tanh"]  # E and F decided, the condition computed for E gone with it
    assert ops["else_branch"] == ["Relu", "Shape", "Gather", "Equal", "If", "If:H"]  # G decided by the main graph's value
    notice = next(n for n in imported.notices if "inside the branches" in n)
    assert "If x3" in notice and "'E'" in notice and "'G'" in notice
    # both branches of S, each at two sizes of the dynamic dim, against the input model
    x = {n: np.random.default_rng(n).standard_normal((2, n, 4)).astype(np.float32) for n in (1, 3)}
    for sr in (16000, 8000):
        for n in (1, 3):
            feeds = {"x": x[n], "sr": np.array(sr, np.int64)}
            want = session(model, optimize=False).run(None, feeds)[0]
            got = session(out, optimize=False).run(None, feeds)[0]
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_branch_whose_types_cannot_be_computed_is_kept():
    model = _kept_if_model()

    def infer(sub, shapes):
        raise ValueError("no types")

    out, names = inline_within(model, {"x": (F, [2, 5, 4]), "sr": (TensorProto.INT64, [])}, {}, infer)
    assert out is model and names == []
