"""Folded constants shared between the exports of one e-graph (``export_graph(..., memo=)``'s ``folds``): a graph
exported with the shared values is byte for byte the graph exported alone, whatever was exported before
it, and a constant computed once is not computed again. Real DuckDB e-graph, real ONNX Runtime."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.boundary import onnx_export
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.search.runner import Limits, Runner
from relsat.extract.analytic import analytic_costs, problem_from
from relsat.extract.extraction import ilp_extract
from relsat.extract.original import original_choice
from relsat.programs.rulesets import load_rule_list

F = TensorProto.FLOAT


def conv_bn_chain(channels=8, size=16, depth=3):
    """Conv + BatchNormalization, ``depth`` times: the default rules fold each BatchNormalization into a
    Conv whose weight and bias are constants computed from the BatchNormalization's."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(depth):
        inits += [numpy_helper.from_array(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32) * .1, f"W{i}"),
                  numpy_helper.from_array(rng.uniform(.5, 1.5, channels).astype(np.float32), f"s{i}"),
                  numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), f"b{i}"),
                  numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), f"m{i}"),
                  numpy_helper.from_array(rng.uniform(.5, 1.5, channels).astype(np.float32), f"v{i}")]
        nodes += [helper.make_node("Conv", [x, f"W{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}", f"s{i}", f"b{i}", f"m{i}", f"v{i}"], [f"y{i}"])]
        x = f"y{i}"
    graph = helper.make_graph(nodes, "cbn", [helper.make_tensor_value_info("x", F, [1, channels, size, size])],
                              [helper.make_tensor_value_info(x, F, [1, channels, size, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_shared_folds_export_the_same_bytes_and_evaluate_each_constant_once(monkeypatch):
    imported = import_model(conv_bn_chain())
    g = imported.egraph
    Runner(g, load_rule_list(["default"]), Limits(iterations=10, enodes=10_000, seconds=60)).run()
    roots = [int(c) for c in g.find([c for _, c in imported.outputs])]
    analytic_costs(g)
    problem, node_ids = problem_from(g, roots)
    folded = {int(c): int(node_ids[i]) for c, i in ilp_extract(problem).choice.items()}
    original = original_choice(g, roots)
    alone = {name: onnx_export.export_graph(imported, choice)[0].SerializeToString()
             for name, choice in (("original", original), ("folded", folded))}
    assert alone["original"] != alone["folded"]
    assert sum(n.op_type == "BatchNormalization" for n in
               onnx_export.export_graph(imported, folded)[0].graph.node) == 0  # the folds were taken

    evaluated = []
    real = onnx_export._evaluate
    monkeypatch.setattr(onnx_export, "_evaluate", lambda *a: evaluated.append(list(a[3])) or real(*a))
    memo = onnx_export.ExportMemo()
    folds = memo.folds
    for name, choice in (("folded", folded), ("original", original), ("folded", folded)):
        model, _, _, weights = onnx_export.export_graph(imported, choice, memo=memo)
        onnx_export.fill_weights(model, weights)
        assert model.SerializeToString() == alone[name], name
    assert len(evaluated) == 1 and len(evaluated[0]) >= 3  # the folded weights and biases, computed once
    assert len(folds) == len(evaluated[0])
