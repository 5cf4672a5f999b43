"""Verification inputs (driver/boundary/feeds.py): integer inputs that are shapes, indices or split sizes are
drawn so that the model itself runs under ONNX Runtime (where the old default draw makes it fail),
and user-given .npz input sets are checked with one-line errors."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.boundary import feeds
from relsat.driver.errors import RelsatError
from relsat.relations import runtime

F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
SEEDS = (0, 1, 2)


def model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    vi = [i if isinstance(i, onnx.ValueInfoProto) else helper.make_tensor_value_info(*i) for i in inputs]
    vo = [o if isinstance(o, onnx.ValueInfoProto) else helper.make_tensor_value_info(*o) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in inits]
    m = helper.make_model(helper.make_graph(nodes, "g", vi, vo, inits),
                          opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    return m


def specs_of(m, shapes):
    return [(n, shapes[n], runtime.np_dtype(t)) for n, t, _ in feeds.graph_inputs(m)]


def run(m, fd):
    return runtime.session(m, threads=1).run(None, fd)


def new_feeds(m, shapes, seed):
    return feeds.draw(specs_of(m, shapes), feeds.input_roles(m, shapes), seed)


def old_feeds(m, shapes, seed):
    """The draw verification used before: integers uniform in [0, 8), masks ones."""
    return runtime.random_feeds(specs_of(m, shapes), rng=np.random.default_rng(seed), masks_ones=True)


TABLE5 = np.arange(15, dtype=np.float32).reshape(5, 3)


def gather_model():
    return model([helper.make_node("Gather", ["table", "idx"], ["y"], axis=0)],
                 [("idx", I64, ["n"])], [("y", F, ["n", 3])], [("table", TABLE5)])


# (a) Gather from a 5-row table

def test_gather_indices_below_rows():
    m, shapes = gather_model(), {"idx": [6]}
    role = feeds.input_roles(m, shapes)["idx"]
    assert (role.kind, role.low, role.high) == ("range", 0, 5)
    for seed in SEEDS:
        fd = new_feeds(m, shapes, seed)
        assert fd["idx"].dtype == np.int64 and fd["idx"].shape == (6,)
        assert 0 <= fd["idx"].min() and fd["idx"].max() < 5
        np.testing.assert_array_equal(run(m, fd)[0], TABLE5[fd["idx"]])
    with pytest.raises(Exception, match="out of data bounds"):
        run(m, old_feeds(m, shapes, 0))


def test_smallest_table_and_inferred_dynamic_rows():
    # one index into a 5-row initializer and into a graph input whose rows are dynamic (4 here)
    m = model([helper.make_node("Gather", ["table", "idx"], ["a"]),
               helper.make_node("Gather", ["data", "idx"], ["b"], axis=1)],
              [("idx", I64, [3]), ("data", F, [2, "cols"])], [("a", F, [3, 3]), ("b", F, [2, 3])],
              [("table", TABLE5)])
    shapes = {"idx": [3], "data": [2, 4]}
    assert feeds.input_roles(m, shapes)["idx"].high == 4
    assert feeds.input_roles(m, {"idx": [3], "data": [2, 9]})["idx"].high == 5
    for seed in SEEDS:
        fd = new_feeds(m, shapes, seed)
        assert fd["idx"].max() < 4
        run(m, fd)


# (b) Expand to a shape that is a graph input

def expand_model():
    return model([helper.make_node("Expand", ["x", "shape"], ["y"])],
                 [("x", F, [2, 3]), ("shape", I64, [2])], [("y", F, None)])


def test_expand_shape_is_ones():
    m, shapes = expand_model(), {"x": [2, 3], "shape": [2]}
    assert feeds.input_roles(m, shapes)["shape"].high == 2
    for seed in SEEDS:
        fd = new_feeds(m, shapes, seed)
        np.testing.assert_array_equal(fd["shape"], [1, 1])
        np.testing.assert_array_equal(run(m, fd)[0], fd["x"])
    with pytest.raises(Exception, match="broadcast|Expand|dimension"):
        run(m, old_feeds(m, shapes, 0))


# (c) SplitToSequence with the split sizes as an input

def split_model():
    return model([helper.make_node("SplitToSequence", ["x", "split"], ["seq"], axis=0)],
                 [("x", F, ["n", 2]), ("split", I64, None)],
                 [helper.make_tensor_sequence_value_info("seq", F, None)])


@pytest.mark.parametrize("split_shape, sizes", [([3], [3, 2, 2]), ([7], [1] * 7), ([2], [4, 3]), ([], None)])
def test_split_sizes_add_up(split_shape, sizes):
    m, shapes = split_model(), {"x": [7, 2], "split": split_shape}
    role = feeds.input_roles(m, shapes)["split"]
    assert (role.kind, role.dim) == ("split", 7)
    for seed in SEEDS:
        fd = new_feeds(m, shapes, seed)
        if sizes is None:
            assert fd["split"].shape == () and fd["split"] == 1
        else:
            assert fd["split"].tolist() == sizes
        pieces = run(m, fd)[0]
        assert [len(p) for p in pieces] == (sizes or [1] * 7)
        np.testing.assert_array_equal(np.concatenate(pieces), fd["x"])
    if split_shape == [3]:
        with pytest.raises(Exception, match="split|Split"):
            run(m, old_feeds(m, shapes, 0))


# (d) an index reached through a Cast (and an Unsqueeze)

def test_index_through_cast():
    table = np.arange(8, dtype=np.float32).reshape(4, 2)
    m = model([helper.make_node("Cast", ["ids"], ["ids64"], to=I64),
               helper.make_node("Unsqueeze", ["ids64", "zero"], ["ids2"]),
               helper.make_node("Gather", ["table", "ids2"], ["y"])],
              [("ids", I32, ["b", "s"])], [("y", F, None)],
              [("table", table), ("zero", np.array([0], dtype=np.int64))])
    shapes = {"ids": [3, 5]}
    role = feeds.input_roles(m, shapes)["ids"]
    assert (role.kind, role.high) == ("range", 4) and "Gather" in role.why
    for seed in SEEDS:
        fd = new_feeds(m, shapes, seed)
        assert fd["ids"].dtype == np.int32 and fd["ids"].max() < 4
        np.testing.assert_array_equal(run(m, fd)[0], table[fd["ids"][None]])
    with pytest.raises(Exception, match="out of data bounds"):
        run(m, old_feeds(m, shapes, 0))


def test_uses_that_agree_intersect():
    # ones (Expand shape) and indices into 5 rows: ones satisfy both
    m = model([helper.make_node("Expand", ["x", "k"], ["y"]), helper.make_node("Gather", ["table", "k"], ["z"])],
              [("x", F, [2, 3]), ("k", I64, [2])], [("y", F, None), ("z", F, None)], [("table", TABLE5)])
    shapes = {"x": [2, 3], "k": [2]}
    role = feeds.input_roles(m, shapes)["k"]
    assert (role.kind, role.low, role.high) == ("range", 1, 2)
    for seed in SEEDS:
        run(m, new_feeds(m, shapes, seed))


def test_conflicting_uses_fall_back_to_default():
    m = model([helper.make_node("SplitToSequence", ["x", "k"], ["seq"]),
               helper.make_node("Gather", ["table", "k"], ["y"])],
              [("x", F, [6]), ("k", I64, [2])],
              [helper.make_tensor_sequence_value_info("seq", F, None), ("y", F, None)], [("table", TABLE5)])
    role = feeds.input_roles(m, {"x": [6], "k": [2]})["k"]
    assert role.kind == "default" and "conflict" in role.why
    assert "SplitToSequence" in role.why and "Gather" in role.why


def test_mask_ones_other_ints_default_floats_no_role():
    m = model([helper.make_node("Cast", ["attention_mask"], ["mf"], to=F),
               helper.make_node("Cast", ["tokens"], ["tf"], to=F),
               helper.make_node("Mul", ["mf", "x"], ["m1"]),
               helper.make_node("Add", ["m1", "tf"], ["y"])],
              [("attention_mask", I64, [4]), ("tokens", I64, [4]), ("x", F, [4])], [("y", F, [4])])
    shapes = {"attention_mask": [4], "tokens": [4], "x": [4]}
    roles = feeds.input_roles(m, shapes)
    assert set(roles) == {"attention_mask", "tokens"}
    assert roles["tokens"].kind == "default"
    fd = new_feeds(m, shapes, 0)
    assert fd["attention_mask"].tolist() == [1, 1, 1, 1]
    assert fd["x"].dtype == np.float32
    again, other = new_feeds(m, shapes, 0), new_feeds(m, shapes, 1)
    assert all(np.array_equal(fd[k], again[k]) for k in fd)
    assert not np.array_equal(fd["x"], other["x"])
    np.testing.assert_allclose(run(m, fd)[0], fd["x"] + fd["tokens"])


# every other table entry: the model runs on the drawn inputs

D34 = np.arange(12, dtype=np.float32).reshape(3, 4)
CASES = {
    "GatherElements": ([helper.make_node("GatherElements", ["d", "i"], ["y"], axis=1)], [("i", I64, [3, 6])], {}),
    "GatherND": ([helper.make_node("GatherND", ["d", "i"], ["y"])], [("i", I64, [5, 2])], {}),
    "ScatterElements": ([helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=0)],
                        [("i", I64, [1, 4])], {"u": np.ones((1, 4), np.float32)}),
    "ScatterND": ([helper.make_node("ScatterND", ["d", "i", "u"], ["y"])], [("i", I64, [1, 1])],
                  {"u": np.ones((1, 4), np.float32)}),
    "Tile": ([helper.make_node("Tile", ["d", "i"], ["y"])], [("i", I64, [2])], {}),
    "ConstantOfShape": ([helper.make_node("ConstantOfShape", ["i"], ["c"]), helper.make_node("Add", ["d", "c"], ["y"])],
                        [("i", I64, [2])], {}),
    "Split": ([helper.make_node("Split", ["d", "i"], ["y", "y2"], axis=1)], [("i", I64, [2])], {}),
    "TopK": ([helper.make_node("TopK", ["d", "i"], ["y", "y2"])], [("i", I64, [1])], {}),
    "OneHot": ([helper.make_node("OneHot", ["ix", "i", "vals"], ["y"])], [("i", I64, [])],
               {"ix": np.array([0, 2], np.int64), "vals": np.array([0, 1], np.float32)}),
    "Range": ([helper.make_node("Range", ["zero", "ten", "i"], ["y"])], [("i", I64, [])],
              {"zero": np.array(0, np.int64), "ten": np.array(10, np.int64)}),
    "Slice": ([helper.make_node("Slice", ["d", "st", "en", "i", "j"], ["y"])], [("i", I64, [2]), ("j", I64, [2])],
              {"st": np.array([0, 0], np.int64), "en": np.array([9, 9], np.int64)}),
    "Unsqueeze": ([helper.make_node("Unsqueeze", ["d", "i"], ["y"])], [("i", I64, [3])], {}),
    "ReduceSum": ([helper.make_node("ReduceSum", ["d", "i"], ["y"])], [("i", I64, [2])], {}),
    "Reshape": ([helper.make_node("Reshape", ["d", "i"], ["y"]), helper.make_node("Reshape", ["d", "j"], ["y2"]),
                 helper.make_node("Reshape", ["d", "k"], ["y3"])],
                [("i", I64, [1]), ("j", I64, [2]), ("k", I64, [4])], {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_table_entry_runs(case):
    nodes, ints, consts = CASES[case]
    outs = [o for n in nodes for o in n.output if o.startswith("y")]
    int_out = {("TopK", "y2"), ("Range", "y")}
    m = model(nodes, ints, [(o, I64 if (case, o) in int_out else F, None) for o in outs],
              [("d", D34)] + list(consts.items()))
    shapes = {name: dims for name, _, dims in ints}
    roles = feeds.input_roles(m, shapes)
    assert all(roles[name].kind != "default" for name in shapes), roles
    for seed in SEEDS:
        run(m, new_feeds(m, shapes, seed))


def test_model_feeds_binds_dynamic_dims():
    fd = feeds.model_feeds(gather_model(), {"idx": [9]}, seed=3)
    assert fd["idx"].shape == (9,) and fd["idx"].max() < 5


# (e) user-given input sets

INPUTS = [("ids", I64, ["batch", 8]), ("x", np.float32, ["batch", 8, 4]), ("n", "tensor(int64)", [])]


def npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def good(batch=2):
    return {"ids": np.zeros((batch, 8), np.int64), "x": np.ones((batch, 8, 4), np.float32),
            "n": np.array(3, np.int64)}


def load_error(path) -> str:
    with pytest.raises(RelsatError) as info:
        feeds.load_input_sets([path], INPUTS)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ")
    return msg


def test_two_sets_with_different_dynamic_dims(tmp_path):
    a, b = npz(tmp_path / "a.npz", **good(2)), npz(tmp_path / "b.npz", **good(5))
    sets = feeds.load_input_sets([a, str(b)], INPUTS)
    assert [s["x"].shape for s in sets] == [(2, 8, 4), (5, 8, 4)]
    assert list(sets[0]) == ["ids", "x", "n"] and sets[1]["n"] == 3
    assert feeds.load_input_sets([], INPUTS) == []


def test_load_errors(tmp_path):
    def bad(name, **change):
        arrays = {**good(), **change}
        return npz(tmp_path / f"{name}.npz", **{k: v for k, v in arrays.items() if v is not None})

    assert "no array for input 'x'" in load_error(bad("missing", x=None))
    assert "array 'extra' is not an input" in load_error(bad("extra", extra=np.zeros(2)))
    msg = load_error(bad("dtype", ids=np.zeros((2, 8), np.float32)))
    assert "input 'ids' has dtype float32, the model wants int64" in msg
    msg = load_error(bad("rank", x=np.ones((2, 32), np.float32)))
    assert "input 'x' has rank 2" in msg and "rank 3" in msg
    msg = load_error(bad("dim", x=np.ones((2, 8, 5), np.float32)))
    assert "input 'x'" in msg and "dim 2 must be 4" in msg
    msg = load_error(bad("bind", x=np.ones((3, 8, 4), np.float32)))
    assert "dim 'batch'" in msg and "'ids'" in msg and "'x'" in msg
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    assert "not a valid .npz" in load_error(tmp_path / "junk.npz")
    np.save(tmp_path / "one.npy", np.zeros(3))
    assert "not a .npz archive" in load_error(tmp_path / "one.npy")
    assert "no such file" in load_error(tmp_path / "absent.npz")


def test_loaded_set_runs_the_model(tmp_path):
    m = gather_model()
    path = npz(tmp_path / "set.npz", idx=np.array([4, 0, 2], np.int64))
    (fd,) = feeds.load_input_sets([path], feeds.graph_inputs(m))
    np.testing.assert_array_equal(run(m, fd)[0], TABLE5[[4, 0, 2]])
