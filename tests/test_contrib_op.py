"""An operator of another ONNX domain is one catalog entry: com.microsoft's FusedMatMul, end to end.

FusedMatMul (ONNX Runtime's contrib op: ``alpha * op(A) @ op(B)``, ``op`` transposing the last two
dims when ``transA``/``transB``) is the single ``OpDef("FusedMatMul", ..., domain="com.microsoft")`` of
relations/catalog.py and is named nowhere else in relsat: no import hook, no export code, no
verification planner or cost rule of its own.  From that entry alone it is imported from a model
that holds a com.microsoft node, rewritten into by a rule that the rule checker verifies, exported
(with com.microsoft in the opset imports when a rule brought it in), verified under ONNX Runtime,
and costed both analytically (the entry's FLOP rule) and by one-node profiling.
"""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.boundary.onnx_export import export_model
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.app.optimize import optimize
from relsat.driver.boundary.verify import verify
from relsat.programs.parser import load_rules
from relsat.programs.verify import check_rule
from relsat.relations.catalog import BY_TYPE, OPS, for_node

RULE = "mul-matmul-fused: (Mul (MatMul ?a ?b) (Constant :value_float ?k)) => (FusedMatMul :alpha ?k ?a ?b)\n"
PACKAGES = ("relations", "programs", "extract", "driver")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def rules(tmp_path):
    path = tmp_path / "fused.rules"
    path.write_text(RULE)
    return path


def model(*, fused: bool) -> onnx.ModelProto:
    """y = (x @ w1) * 0.5 [+ FusedMatMul(x, w2, transB=1, alpha=2) when ``fused``]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w1"),
             numpy_helper.from_array(np.array(0.5, dtype=np.float32), "k")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]), helper.make_node("Mul", ["m", "k"], ["y"])]
    opsets = [helper.make_opsetid("", 17)]
    if fused:
        inits.append(numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w2"))
        nodes += [helper.make_node("FusedMatMul", ["x", "w2"], ["f"], domain="com.microsoft", alpha=2.0, transB=1),
                  helper.make_node("Add", ["y", "f"], ["z"])]
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    # f is an output too: ONNX's shape inference cannot type a com.microsoft node, its declared type can
    outs = ["z", "f"] if fused else ["y"]
    graph = helper.make_graph(nodes, "contrib", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, [4, 16]) for o in outs], inits)
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def fused_nodes(m: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in m.graph.node if (n.domain, n.op_type) == ("com.microsoft", "FusedMatMul")]


def test_the_operator_is_one_catalog_entry():
    entries = [op for op in OPS if op.op_type == "FusedMatMul"]
    assert len(entries) == 1 and entries[0].domain == "com.microsoft"
    assert for_node("com.microsoft", "FusedMatMul") is BY_TYPE["FusedMatMul"] is entries[0]
    assert for_node("", "FusedMatMul") is None  # the domain is part of the operator's identity
    mentions = sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
                      if "FusedMatMul" in p.read_text())
    assert mentions == ["relations/catalog.py"]


def test_the_rule_checks(rules):
    (rule,) = load_rules(rules).rules
    result = check_rule(rule)
    assert result.ok, result.message


def test_import_and_export_keep_the_contrib_node():
    m = model(fused=True)
    imported = import_model(m)
    assert imported.egraph.sql("SELECT count(*) FROM op_fusedmatmul")[0][0] == 1
    assert imported.egraph.sql("SELECT count(*) FROM op_opaque")[0][0] == 0
    shape = imported.egraph.sql("SELECT e.shape FROM op_fusedmatmul n JOIN eclass e ON e.id = n.out")[0][0]
    assert shape == [4, 16]
    out = export_model(imported)
    (node,) = fused_nodes(out)
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute} == {"alpha": 2.0, "transB": 1}
    assert ("com.microsoft", 1) in {(o.domain, o.version) for o in out.opset_import}
    assert verify(m, out).ok


def test_catalog_ops_reading_its_output_are_catalog_nodes():
    """ONNX's shape inference has no schema for com.microsoft ops: import types their outputs from the catalog's
    shape and dtype rules (dynamic dims too), so the ops reading them, and theirs, are catalog nodes, not opaque."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in [("w1", (16, 8)), ("w2", (16, 16)), ("w3", (16, 3))]]
    nodes = [helper.make_node("FusedMatMul", ["x", "w1"], ["f1"], domain="com.microsoft", alpha=0.5, transB=1),
             helper.make_node("FusedMatMul", ["f1", "w2"], ["f2"], domain="com.microsoft"),
             helper.make_node("Relu", ["f2"], ["r"]), helper.make_node("MatMul", ["r", "w3"], ["y"])]
    graph = helper.make_graph(nodes, "contrib", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=10)
    imported = import_model(m)
    g = imported.egraph
    assert g.sql("SELECT count(*) FROM op_opaque")[0][0] == 0, imported.notices
    assert dict(g.sql("SELECT op, count(*) FROM enodes WHERE op NOT IN ('Input', 'Weight') GROUP BY op")) == {
        "FusedMatMul": 2, "Relu": 1, "MatMul": 1}
    batch = imported.inputs[0][2][0]
    assert imported.types["f2"] == (TensorProto.FLOAT, [batch, 16]) and imported.types["r"][1] == [batch, 16]
    assert verify(m, export_model(imported)).ok


@pytest.mark.parametrize("fused", [False, True])
def test_optimize_rewrites_into_it_and_verifies(rules, fused, tmp_path, monkeypatch):
    monkeypatch.setenv("RELSAT_COST_CACHE", str(tmp_path / "costs.duckdb"))
    m = model(fused=fused)
    analytic = optimize(m, rules=[str(rules)], cost_model="analytic", measure=False)
    assert len(fused_nodes(analytic.model)) == 1 + fused  # the MatMul * 0.5 became a FusedMatMul
    assert "com.microsoft" in {o.domain for o in analytic.model.opset_import}  # gained when a rule brought it
    assert verify(m, analytic.model).ok

    measured = optimize(m, rules=[str(rules)], cost_model="measured", measure=False, keep_egraph=True)
    try:
        costs = dict(measured.egraph.sql("SELECT source, count(*) FROM costs WHERE op = 'FusedMatMul' GROUP BY ALL"))
    finally:
        measured.egraph.close()
    assert costs and set(costs) <= {"measured", "cache"}, costs  # profiled as one-node models
    assert verify(m, measured.model).ok
