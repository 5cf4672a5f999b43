"""Tensor expressions (relations/tensor_expr.py, tensor_lower.py, tensor_match.py): every lowered operator
computes what ONNX Runtime computes for it, and matching its expression back gives an ONNX node that does too.

The cases are a fixture table: op_type, attributes, input shapes, constant inputs (by position).
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.relations.tensor_expr import Access, Expr, Index, Iter, Program, evaluate
from relsat.relations.tensor_lower import NotLowerable, lower
from relsat.relations.tensor_match import match

# id: (op_type, attrs, input shapes, {input position: constant value}, opset)
CASES = {
    "matmul": ("MatMul", {}, [(3, 4), (4, 5)], {}, 17),
    "matmul_batch_bcast": ("MatMul", {}, [(2, 1, 3, 4), (3, 4, 6)], {}, 17),
    "gemm": ("Gemm", {"alpha": 0.5, "beta": 2.0, "transB": 1}, [(3, 4), (5, 4), (5,)], {}, 17),
    "gemm_transA": ("Gemm", {"transA": 1}, [(4, 3), (4, 5)], {}, 17),
    "conv": ("Conv", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, [(1, 3, 7, 7), (4, 3, 3, 3)], {}, 17),
    "conv_strided_dilated_bias": ("Conv", {"kernel_shape": [3, 3], "strides": [2, 1], "dilations": [2, 2],
                                           "pads": [2, 1, 0, 2]}, [(2, 3, 9, 8), (5, 3, 3, 3), (5,)], {}, 17),
    "conv_grouped": ("Conv", {"group": 2, "kernel_shape": [3, 1], "pads": [1, 0, 1, 0]},
                     [(1, 4, 6, 5), (6, 2, 3, 1)], {}, 17),
    "conv_depthwise": ("Conv", {"group": 3, "kernel_shape": [3, 3], "strides": [2, 2]},
                       [(1, 3, 7, 7), (3, 1, 3, 3)], {}, 17),
    "conv_transpose": ("ConvTranspose", {"kernel_shape": [4, 4], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                       [(1, 3, 4, 5), (3, 2, 4, 4)], {}, 17),
    "conv_transpose_fsrcnn": ("ConvTranspose", {"kernel_shape": [5, 5], "strides": [3, 3], "pads": [2, 2, 2, 2],
                                                "output_padding": [2, 2]}, [(1, 2, 3, 4), (2, 1, 5, 5), (1,)], {}, 17),
    "conv_transpose_grouped_dilated": ("ConvTranspose", {"group": 2, "kernel_shape": [3, 3], "strides": [2, 1],
                                                         "dilations": [1, 2]}, [(1, 4, 3, 3), (4, 3, 3, 3)], {}, 17),
    "einsum_bmm": ("Einsum", {"equation": "bij,bjk->bik"}, [(2, 3, 4), (2, 4, 5)], {}, 17),
    "einsum_three": ("Einsum", {"equation": "ij,jk,kl->il"}, [(2, 3), (3, 4), (4, 2)], {}, 17),
    "transpose": ("Transpose", {"perm": [2, 0, 1]}, [(2, 3, 4)], {}, 17),
    "reshape": ("Reshape", {}, [(2, 3, 4), (3,)], {1: np.array([4, -1, 2], np.int64)}, 17),
    "reshape_keep": ("Reshape", {}, [(2, 6, 1), (2,)], {1: np.array([0, 6], np.int64)}, 17),
    "add_bcast": ("Add", {}, [(2, 3, 4), (3, 1)], {}, 17),
    "mul": ("Mul", {}, [(2, 3), (2, 3)], {}, 17),
    "div_bcast": ("Div", {}, [(4,), (2, 3, 4)], {}, 17),
    "relu": ("Relu", {}, [(2, 5)], {}, 17),
    "exp": ("Exp", {}, [(3, 2)], {}, 17),
    "tanh": ("Tanh", {}, [(3, 2)], {}, 17),
    "reduce_sum": ("ReduceSum", {"keepdims": 0}, [(2, 3, 4), (1,)], {1: np.array([1], np.int64)}, 17),
    "reduce_sum_keep": ("ReduceSum", {}, [(2, 3, 4), (2,)], {1: np.array([0, 2], np.int64)}, 17),
    "reduce_max": ("ReduceMax", {"axes": [-1], "keepdims": 1}, [(2, 3, 4)], {}, 17),
    "softmax": ("Softmax", {"axis": -1}, [(2, 3, 5)], {}, 17),
    "softmax_axis1": ("Softmax", {"axis": 1}, [(2, 3, 5)], {}, 17),
    "depth_to_space_dcr": ("DepthToSpace", {"blocksize": 2, "mode": "DCR"}, [(1, 12, 3, 4)], {}, 17),
    "depth_to_space_crd": ("DepthToSpace", {"blocksize": 2, "mode": "CRD"}, [(2, 8, 3, 2)], {}, 17),
    "depth_to_space_3": ("DepthToSpace", {"blocksize": 3}, [(1, 18, 2, 2)], {}, 17),
    "space_to_depth": ("SpaceToDepth", {"blocksize": 2}, [(1, 3, 4, 6)], {}, 17),
}


def model_of(op, attrs, shapes, consts, opset, nodes=None):
    names = [f"x{k}" for k in range(len(shapes))]
    inits = [numpy_helper.from_array(v, names[k]) for k, v in consts.items()]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for k, (n, s) in enumerate(zip(names, shapes))
              if k not in consts]
    nodes = nodes or [helper.make_node(op, names, ["y"], **attrs)]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def feeds_of(shapes, consts, seed=0):
    rng = np.random.default_rng(seed)
    return {f"x{k}": rng.standard_normal(s).astype(np.float32) for k, s in enumerate(shapes) if k not in consts}


def run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def lowered(case):
    op, attrs, shapes, consts, _ = case
    names = [f"x{k}" for k in range(len(shapes))]
    return lower(op, attrs, list(zip(names, shapes)), {names[k]: v for k, v in consts.items()})


@pytest.mark.parametrize("cid", CASES)
def test_lowering_computes_what_onnx_runtime_computes(cid):
    op, attrs, shapes, consts, opset = CASES[cid]
    feeds = feeds_of(shapes, consts)
    want = run(model_of(*CASES[cid]), feeds)
    got = evaluate(lowered(CASES[cid]), {**feeds, **{f"x{k}": v for k, v in consts.items()}})
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cid", CASES)
def test_matching_the_lowered_expression_gives_back_an_equal_operator(cid):
    """Lower, match back to ONNX nodes, run them: the same values; and the matched operator is the one lowered
    (an Einsum may come back as the MatMul it is, Gemm as MatMul + element-wise)."""
    op, attrs, shapes, consts, opset = CASES[cid]
    program = lowered(CASES[cid])
    names = [f"x{k}" for k in range(len(shapes))]
    nodes, inits = match(program, "y", {names[k]: v for k, v in consts.items()})
    assert nodes, cid
    model = model_of(op, attrs, shapes, consts, opset, nodes=nodes)
    model.graph.initializer.extend(inits)
    model.graph.output[0].type.tensor_type.shape.SetInParent()
    for d in program.result.shape:
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = d
    onnx.checker.check_model(model, full_check=True)
    feeds = feeds_of(shapes, consts, seed=1)
    np.testing.assert_allclose(run(model, feeds), run(model_of(*CASES[cid]), feeds), rtol=1e-5, atol=1e-5)
    expected = {"Einsum": {"Einsum", "MatMul"}, "Gemm": {"MatMul", "Gemm"}}.get(op, {op})
    assert expected & {n.op_type for n in nodes}, [n.op_type for n in nodes]


def test_the_same_computation_lowers_to_the_same_value():
    """Iterators are named by role, so an Einsum that is a MatMul lowers to the MatMul's expression."""
    a = lower("MatMul", {}, [("a", (3, 4)), ("b", (4, 5))])
    b = lower("Einsum", {"equation": "ik,kj->ij"}, [("a", (3, 4)), ("b", (4, 5))])
    assert a == b and hash(a) == hash(b)


def test_padding_reads_zero_and_inexact_division_reads_zero():
    x = np.arange(4, dtype=np.float32) + 1
    shifted = Program((("x", (4,)),), (("y", Expr((Iter("o0", 6),), (), Access("x", (Index((("o0", 1),), -1),)))),))
    np.testing.assert_array_equal(evaluate(shifted, {"x": x}), [0, 1, 2, 3, 4, 0])
    stuffed = Program((("x", (4,)),), (("y", Expr((Iter("o0", 7),), (), Access("x", (Index((("o0", 1),), 0, 2),)))),))
    np.testing.assert_array_equal(evaluate(stuffed, {"x": x}), [1, 0, 2, 0, 3, 0, 4])


@pytest.mark.parametrize("op,attrs,shapes", [
    ("MatMul", {}, [(4,), (4, 3)]),
    ("Conv", {"kernel_shape": [3]}, [(1, 2, 8), (3, 2, 3)]),
    ("Conv", {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER"}, [(1, 2, 8, 8), (3, 2, 3, 3)]),
    ("LayerNormalization", {}, [(2, 3), (3,)]),
    ("Reshape", {}, [(2, 3), (2,)]),
])
def test_what_is_not_lowered_says_so(op, attrs, shapes):
    with pytest.raises(NotLowerable):
        lower(op, attrs, [(f"x{k}", s) for k, s in enumerate(shapes)])


# -- derivations (relations/tensor_derive.py) ------------------------------------------------------------

from relsat.relations.tensor_derive import canonical, derive, equivalent, inline, split_summation  # noqa: E402

CONVS = {
    "3x3_same": ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, [(1, 4, 6, 6), (5, 4, 3, 3)]),
    "5x3_valid": ({"kernel_shape": [5, 3]}, [(2, 3, 8, 7), (4, 3, 5, 3)]),
    "3x3_uneven_pads": ({"kernel_shape": [3, 3], "pads": [2, 0, 1, 1]}, [(1, 2, 5, 6), (3, 2, 3, 3)]),
}


@pytest.mark.parametrize("cid", CONVS)
def test_a_convolution_derives_a_matmul_over_channels_and_a_sum_of_shifted_slices(cid):
    """The seed's motivating example: Σ_{c,r,s} x[n,c,h+r-p,w+s-p]·w[m,c,r,s] splits at the channel sum into
    T = Σ_c x·w (a plain product: one Einsum over channels) and Σ_{r,s} T[n, h+r-p, w+s-p, m, r, s] (Pad and
    k^2 Slices added); the ONNX nodes matched from the derived program run equal to the Conv under ONNX
    Runtime, and merging the two steps again gives back the Conv's own expression."""
    attrs, shapes = CONVS[cid]
    conv = lower("Conv", attrs, [("x0", shapes[0]), ("x1", shapes[1])])
    derived = derive(conv, depth=1)
    split = next(p for p, how in derived.items() if how == ["split-summation"])
    (t_name, t), (_, rest) = split.steps
    assert t.sums and len(t.sums) == 1 and isinstance(t.body.args[0], Access) and len(rest.sums) == 2
    nodes, inits = match(split, "y")
    assert {"Einsum", "Slice", "Add"} <= {n.op_type for n in nodes} and "Conv" not in {n.op_type for n in nodes}
    model = model_of("Conv", attrs, shapes, {}, 17, nodes=nodes)
    model.graph.initializer.extend(inits)
    feeds = feeds_of(shapes, {}, seed=3)
    np.testing.assert_allclose(run(model, feeds), run(model_of("Conv", attrs, shapes, {}, 17), feeds),
                               rtol=1e-4, atol=1e-5)
    assert canonical(inline(split, 0)) == canonical(conv)
    back, _ = match(canonical(inline(split, 0)), "y")
    assert [n.op_type for n in back] == ["Conv"]


def test_a_wrong_derivation_is_caught_by_the_numeric_check():
    conv = lower("Conv", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, [("x", (1, 2, 5, 5)), ("w", (3, 2, 3, 3))])
    split = split_summation(conv, 0, "s0")
    (tn, t), (yn, rest) = split.steps
    shifted = Expr(rest.scope, rest.sums, Access(tn, (*rest.body.index[:1], Index(rest.body.index[1].terms, 0),
                                                       *rest.body.index[2:])))
    assert equivalent(conv, split) and not equivalent(conv, Program(split.inputs, ((tn, t), (yn, shifted))))


def test_derivations_are_distinct_and_each_checked():
    mm = lower("MatMul", {}, [("a", (3, 4)), ("b", (4, 5))])
    assert derive(mm, depth=2) == {}  # a plain product has nothing to split: the sum would only be copied
    ein = lower("Einsum", {"equation": "ij,jk,kl->il"}, [("a", (2, 3)), ("b", (3, 4)), ("c", (4, 2))])
    assert all(equivalent(ein, p) for p in derive(ein, depth=2))


def test_a_sum_is_merged_only_into_a_product_of_it():
    """(Σ_k a·b) + c is not Σ_k (a·b + c): merging the MatMul into the Add it feeds is refused, into a Mul taken."""
    mm = lower("MatMul", {}, [("a", (2, 3)), ("b", (3, 4))])
    for op, ok in (("Add", False), ("Mul", True)):
        tail = lower(op, {}, [("y", (2, 4)), ("c", (2, 4))]).steps[0][1]
        p = Program((("a", (2, 3)), ("b", (3, 4)), ("c", (2, 4))), (("y", mm.steps[0][1]), ("z", tail)))
        merged = inline(p, 0)
        assert (merged is not None) == ok
        if merged is not None:
            assert equivalent(p, merged)


# -- tables beside the e-graph (relations/tensor_tables.py) -------------------------------------------------

from relsat.relations import tensor_tables  # noqa: E402


@pytest.mark.parametrize("name", ["squeezenet", "longformer"])
def test_the_egraph_s_enodes_lower_into_tables_that_read_back_equal(name):
    from relsat.driver.boundary import zoo
    from relsat.driver.boundary.onnx_import import import_model

    con = import_model(zoo.build(name, small=True)).egraph.con
    counts = tensor_tables.lower_egraph(con)
    stored = con.execute("SELECT op, enode, eclass FROM texpr_program").fetchall()
    assert len(stored) == sum(counts.values()) > 0
    # one program per e-node of every lowered operator with static shapes, none for another operator
    assert {"Conv", "Relu"} <= set(counts) if name == "squeezenet" else {"MatMul", "Softmax", "Transpose"} <= set(counts)
    for op, enode, eclass in stored:
        p = tensor_tables.load(con, op, enode)
        assert dict(p.inputs) and p.result.shape == tuple(con.execute("SELECT shape FROM eclass WHERE id = ?",
                                                                        [eclass]).fetchone()[0])
        assert tensor_tables.rows_of(op, enode, eclass, p) == tensor_tables.rows_of(op, enode, eclass, p)
    conv = next(((op, e) for op, e, _ in stored if op == "op_conv"), None)
    if conv:
        row = con.execute('SELECT x, w, b, "group", kernel_shape, strides, pads, dilations FROM op_conv WHERE id = ?',
                          [conv[1]]).fetchone()
        shapes = dict(con.execute("SELECT id, shape FROM eclass").fetchall())
        attrs = dict(zip(("group", "kernel_shape", "strides", "pads", "dilations"), row[3:]))
        want = lower("Conv", attrs, [(f"c{c}", shapes[c]) for c in row[:3] if c != -1])
        assert tensor_tables.load(con, *conv).steps == want.steps
    # queryable with SQL: e.g. the summation iterators of every MatMul/Conv
    sums = con.execute("SELECT count(*) FROM texpr_iter WHERE role = 'sum'").fetchone()[0]
    assert sums > 0


def test_every_fixture_program_round_trips_through_the_tables():
    import duckdb

    con = duckdb.connect()
    for k, cid in enumerate(CASES):
        p = lowered(CASES[cid])
        tensor_tables.write(con, tensor_tables.rows_of("case", k, k, p), replace=k == 0)
        assert tensor_tables.load(con, "case", k) == p, cid


def test_a_product_chain_derives_every_association_order():
    """Summation splitting over a chain of products (EinNet's expression splitting): A·B·C comes out as (A·B)·C
    and A·(B·C), each matched as two MatMuls and equal under ONNX Runtime; A·B·C·D reaches three-product
    forms (every association order: five binary trees, one of them also in a transposed form)."""
    shapes = [(2, 3), (3, 4), (4, 2)]
    ein = lower("Einsum", {"equation": "ij,jk,kl->il"}, [(f"x{k}", s) for k, s in enumerate(shapes)])
    derived = derive(ein, depth=3)
    assert len(derived) == 2
    intermediates = set()
    for p in derived:
        nodes, inits = match(p, "y")
        assert [n.op_type for n in nodes] == ["MatMul", "MatMul"]
        model = model_of("Einsum", {"equation": "ij,jk,kl->il"}, shapes, {}, 17, nodes=nodes)
        feeds = feeds_of(shapes, {}, seed=4)
        want = run(model_of("Einsum", {"equation": "ij,jk,kl->il"}, shapes, {}, 17), feeds)
        np.testing.assert_allclose(run(model, feeds), want, rtol=1e-5, atol=1e-6)
        intermediates.add(p.steps[0][1].shape)
    assert intermediates == {(2, 4), (3, 2)}  # A·B, and B·C
    four = lower("Einsum", {"equation": "ij,jk,kl,lm->im"}, [("a", (2, 3)), ("b", (3, 4)), ("c", (4, 2)), ("d", (2, 5))])
    binary = [p for p in derive(four, depth=3) if len(p.steps) == 3 and all(len(e.sums) == 1 for _, e in p.steps)]
    assert len(binary) >= 5 and all(equivalent(four, p) for p in binary)


def test_blocking_an_iterator_gives_a_blocked_matmul_between_reshapes():
    """Variable substitution i = 4·ib + ii on a MatMul's rows, then the blocked access split into its own step:
    matched as Reshape, MatMul over blocks, Reshape back; equal under ONNX Runtime."""
    from relsat.relations.tensor_derive import split_access, split_scope

    shapes = [(8, 4), (4, 6)]
    mm = lower("MatMul", {}, [("x0", shapes[0]), ("x1", shapes[1])])
    blocked = split_access(split_scope(mm, 0, "o0", 4), 0, 0)
    assert [e.shape for _, e in blocked.steps] == [(2, 4, 4), (2, 4, 6), (8, 6)] and equivalent(mm, blocked)
    nodes, inits = match(blocked, "y")
    assert [n.op_type for n in nodes] == ["Reshape", "MatMul", "Reshape"]
    model = model_of("MatMul", {}, shapes, {}, 17, nodes=nodes)
    model.graph.initializer.extend(inits)
    feeds = feeds_of(shapes, {}, seed=6)
    np.testing.assert_allclose(run(model, feeds), run(model_of("MatMul", {}, shapes, {}, 17), feeds), rtol=1e-5)


@pytest.mark.parametrize("block,window,const,order,pad", [
    (4, 12, -4, "bjk", 0.0),  # blocks of 4 rows, each reading its block and both neighbours (a band of 4)
    (4, 10, -3, "bkj", float(np.finfo(np.float32).min)),  # a window not a multiple of the block, K^T order, -inf pad
    (3, 3, 0, "bjk", 0.0),  # no overlap: a plain reshape into blocks
])
def test_a_window_of_overlapping_blocks_is_matched_as_pad_slices_and_concat(block, window, const, order, pad):
    """The gather blocking a banded sum leaves, G[b, j, k] = T[B·b + j + c, k] (pad outside T), matched as Pad,
    Slices reshaped into blocks, Concat and Transpose: the ONNX nodes read exactly the same elements."""
    from relsat.relations.tensor_expr import evaluate

    n, d = 12, 3
    its = {"b": Iter("o0", n // block), "j": Iter("o1" if order == "bjk" else "o2", window),
           "k": Iter("o2" if order == "bjk" else "o1", d)}
    scope = tuple(its[c] for c in order)
    body = Access("x0", (Index(((its["b"].name, block), (its["j"].name, 1)), const), Index.of(its["k"].name)), pad)
    program = Program((("x0", (n, d)),), (("y", Expr(scope, (), body)),))
    nodes, inits = match(program, "y")
    assert "Concat" in {x.op_type for x in nodes} or window == block
    model = model_of("Identity", {}, [(n, d)], {}, 17, nodes=nodes)
    model.graph.initializer.extend(inits)
    x = np.random.default_rng(7).standard_normal((n, d)).astype(np.float32)
    np.testing.assert_array_equal(run(model, {"x0": x}), evaluate(program, {"x0": x}))
