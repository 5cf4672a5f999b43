"""The slow-growth stop (``Limits.slow_rounds``, ``--slow-rounds``): saturation ends after that many rounds in a
row that each add under ``SLOW_GROWTH`` e-nodes and merge nothing, as ViT-B/16's gather rules grew it for 24
rounds that no extraction used; 0 turns it off. Real DuckDB, the shipped rule, the real pipeline."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from relsat import optimize
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.options import SLOW_GROWTH, Options
from relsat.driver.search.runner import Limits, Runner, StopReason
from relsat.programs.rulesets import load_rule_list

# Relus under the Gather (more than the default 10 slow rounds; 40 made the saturating runs twice as long), and a
# second output's Relus that no rule touches
CHAIN, SIDE = 20, 100


def _model() -> onnx.ModelProto:
    """``Gather(relu^20(x), 0, axis 1)`` and, as a second output, ``relu^100(z)``: each round carries the Gather
    one Relu back (``gather-relu``: a new Gather e-class and a Relu in the old one), two e-nodes in ~125."""
    nodes, prev = [], "x"
    for i in range(CHAIN):
        nodes.append(helper.make_node("Relu", [prev], [f"r{i}"]))
        prev = f"r{i}"
    nodes.append(helper.make_node("Gather", [prev, "i0"], ["y"], axis=1))
    prev = "z"
    for i in range(SIDE):
        nodes.append(helper.make_node("Relu", [prev], [f"s{i}"]))
        prev = f"s{i}"
    nodes.append(helper.make_node("Identity", [prev], ["w"]))
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", f, [2, 8, 4]), helper.make_tensor_value_info("z", f, [3])],
        [helper.make_tensor_value_info("y", f, [2, 4]), helper.make_tensor_value_info("w", f, [3])],
        [numpy_helper.from_array(np.array(0, dtype=np.int64), "i0")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _gather_relu():
    return [r for r in load_rule_list(("runtime",)) if r.name == "gather-relu"]


def _run(slow_rounds: int):
    g = import_model(_model()).egraph
    return g, Runner(g, _gather_relu(), Limits(200, 10**6, 120.0, 2, slow_rounds)).run()


def test_rounds_that_each_add_a_sliver_stop_after_slow_rounds_of_them():
    g, rep = _run(10)
    assert rep.stop_reason == StopReason.SLOW_GROWTH and len(rep.iterations) == 10
    for it in rep.iterations:  # what made them slow: a node or two each, nothing merged
        assert it.unions == 0 and 0 < it.new_nodes < SLOW_GROWTH * (it.enodes - it.new_nodes)
    # the Gather went back 10 Relus, not to the input
    assert g.sql("SELECT count(*) FROM enodes WHERE op = 'Gather'")[0][0] == 11
    assert g.sql("SELECT stop_reason FROM iterations ORDER BY round DESC LIMIT 1")[0][0] == "slow growth"


def test_zero_turns_it_off_and_the_chain_saturates():
    g, rep = _run(0)
    assert rep.stop_reason == StopReason.SATURATED and len(rep.iterations) == CHAIN + 1
    assert g.sql("SELECT count(*) FROM enodes WHERE op = 'Gather'")[0][0] == CHAIN + 1  # down to x itself


def test_the_report_names_the_stop_and_its_flag(tmp_path):
    rules = tmp_path / "gather.rules"
    rules.write_text("gather-relu: (Gather :axis ?a :indices ?i (Relu ?x)) => (Relu (Gather :axis ?a :indices ?i ?x))\n")
    path = tmp_path / "chain.onnx"
    onnx.save(_model(), path)
    opts = Options(rules=(str(rules),), cost_model="analytic", measure=False)
    rep = optimize(path, opts, output=tmp_path / "out.onnx").report
    assert rep.stop_reason == "slow growth"
    (limit,) = [x for x in rep.limits if x["limit"] == "slow growth"]
    assert limit["flag"] == "--slow-rounds" and limit["value"] == Options().slow_rounds == limit["reached"]
    every = opts.replace(slow_rounds=0, iter_limit=2 * CHAIN)
    assert optimize(path, every, output=tmp_path / "all.onnx").report.stop_reason == "saturated"
