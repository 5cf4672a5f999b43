"""Searched derivations inside ``relsat optimize`` (``--derive-search``, driver/app/derive_search.py): EinNet's rules
run as SQL rounds from the model's contraction nodes, the derived forms that match ONNX operators are checked
under ONNX Runtime, enter the e-graph in the node's e-class, and the written model is verified."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from relsat import optimize
from relsat.driver.app import derive_search as dsr


def _convs(batch="N") -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 4, 3, 3)).astype(np.float32) / 6, "w1"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((5, 6, 1, 1)).astype(np.float32) / 3, "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="c1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], kernel_shape=[1, 1], name="c2")]
    g = helper.make_graph(nodes, "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5, 8, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_searched_derivations_enter_the_e_graph_and_the_written_model_is_verified(tmp_path):
    src = tmp_path / "convs.onnx"
    onnx.save(_convs(batch=1), src)
    db = tmp_path / "e.duckdb"
    rep = optimize(str(src), output=str(tmp_path / "o.onnx"), db=str(db), cost_model="analytic", measure=False,
                   derive_search=2).report
    d = rep["derivations"]
    assert d["search"]["roots"] == 2 and len(d["search"]["rounds"]) == 2
    searched = [a for a in d["applied"] if a["kind"] == "search"]
    assert {a["root"] for a in searched} == {"h", "y"}
    assert all("Einsum" in a["ops"] and a["max_error"] < 1e-4 for a in searched)
    assert rep["verification"]["ok"]
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    # the derived programs are in the saved e-graph with their lineage, and an Einsum sits in each Conv's e-class
    assert con.execute("SELECT count(*) FROM texpr_derived WHERE rule = 'split-summation'").fetchone()[0] > 0
    assert con.execute("SELECT count(*) FROM texpr_program WHERE op = 'node'").fetchone()[0] == 2
    assert con.execute("SELECT count(*) FROM opaque_nodes WHERE op_type = 'Einsum'").fetchone()[0] >= 2
    # each Conv's e-class holds its derived form's last node beside the Conv
    conv_classes = [r[0] for r in con.execute("SELECT out FROM op_conv").fetchall()]
    ops = {c: {r[0] for r in con.execute("SELECT op FROM enodes WHERE eclass = ?", [c]).fetchall()}
           for c in conv_classes}
    assert len(conv_classes) == 2 and all(len(o) >= 2 for o in ops.values()), ops

def test_off_by_default_and_dynamic_dims_are_not_searched(tmp_path):
    src = tmp_path / "convs.onnx"
    onnx.save(_convs(batch="N"), src)
    rep = optimize(str(src), cost_model="analytic", measure=False).report
    assert "search" not in rep["derivations"]
    rep = optimize(str(src), cost_model="analytic", measure=False, derive_search=2).report
    assert "search" not in rep["derivations"] and not rep["derivations"]["applied"]
    from relsat.driver.boundary.onnx_import import import_model

    types = import_model(_convs(batch=1)).types
    assert [s.node.name for s in dsr.sites(_convs(batch=1), types)] == ["c1", "c2"]
