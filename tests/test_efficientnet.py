"""EfficientNet (SE blocks, SiLU as x * Sigmoid(x), depthwise convs, BatchNormalization, opset 17).

The bug: a timm EfficientNet-B0 export failed `optimize` with "Node input v_9 is not a graph input,
initializer, or output of a previous node". The extracted choice was acyclic and the exported graph
valid; the `enlarge-conv-1x1*` rules write a 1x1 conv as a 3x3 conv whose weight is ``Pad(w)``, and
on an SE block's 1x1 feature map the 3x3 conv costs about the same as the 1x1 one, so measured costs
sometimes choose it. When the padded weight was above the export's folding size, the Pad stayed a
node feeding the Conv's weight input, and ONNX Runtime's PadFusion (every optimization level) fuses a
Pad into its Conv as if it padded the data input, dropping the Pad while the weight input still
reads it. The export now folds a Conv's constant weight and bias whatever their size, and checks the
graph it writes (ExportError).
"""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.benchmarks.efficientnet import build
from relsat.driver.app import phases as pipeline_phases
from relsat.driver.boundary.onnx_export import export_model
from relsat.extract.original import original_choice
from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.app.optimize import optimize
from relsat.programs.rulesets import load_rule_list
from relsat.driver.search.runner import Limits, Runner
from relsat.driver.boundary.verify import verify
from relsat.relations.runtime import session as ort_session
from relsat.extract.analytic import analytic_costs, problem_from
from relsat.extract.extraction import greedy_extract, ilp_extract, validate_choice
from relsat.relations.egraph import EGraph

# Costs of the 3x3 convs the enlarge rules made from the SE block's 1x1 convs (their input is a
# 1x1 map), scaled down: what timing noise does to two convs that cost about the same.
_NOISY_SE_CONVS = """
UPDATE costs SET ms = ms * 0.01 WHERE node IN (
    SELECT c.id FROM op_conv c JOIN eclass e ON e.id = c.x JOIN op_pad p ON p.out = c.w
    WHERE e.shape[3] = 1 AND e.shape[4] = 1)
"""


def _padded_weight_convs(model: onnx.ModelProto) -> list[str]:
    """Convs with a 3x3 kernel that read a 1x1 feature map (the enlarged SE convs)."""
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in onnx.shape_inference.infer_shapes(model).graph.value_info}
    return [n.name for n in model.graph.node if n.op_type == "Conv" and shapes.get(n.input[0], [0])[2:] == [1, 1]
            and list(next(a.ints for a in n.attribute if a.name == "kernel_shape")) == [3, 3]]


@pytest.fixture(scope="module")
def small():
    return build(small=True)


@pytest.fixture(scope="module")
def saturated(small):
    g = EGraph()
    imported = import_model(small, egraph=g)
    Runner(g, load_rule_list(["default", "merge"]), Limits(10, 2000, 60, 1)).run()
    analytic_costs(g)
    g.con.execute(_NOISY_SE_CONVS)
    roots = [c for _, c in imported.outputs]
    problem, node_ids = problem_from(g, roots)
    yield imported, problem, node_ids
    g.close()


def test_builder_has_efficientnets_structure(small):
    ops = [n.op_type for n in small.graph.node]
    assert small.opset_import[0].version == 17
    assert {"GlobalAveragePool", "Sigmoid", "Mul", "BatchNormalization", "Add", "Gemm"} <= set(ops)
    assert any(n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
               for n in small.graph.node)  # depthwise
    full = build()
    counts = {op: sum(n.op_type == op for n in full.graph.node) for op in ("Conv", "BatchNormalization", "Add")}
    assert counts == {"Conv": 81, "BatchNormalization": 49, "Add": 9}  # as timm's efficientnet_b0 exports


@pytest.mark.parametrize("extractor", ["greedy", "ilp"])
def test_padded_se_conv_weights_export_to_a_model_onnx_runtime_loads(small, saturated, extractor):
    """The choice measured costs can make: the SE block's convs as 3x3 convs of zero-padded weights."""
    imported, problem, node_ids = saturated
    greedy = greedy_extract(problem)
    best = greedy if extractor == "greedy" else ilp_extract(problem, time_limit=20, warm_start=greedy)
    validate_choice(problem, best.choice)
    optimized = export_model(imported, {int(c): int(node_ids[i]) for c, i in best.choice.items()})
    assert len(_padded_weight_convs(optimized)) >= 4  # the case of the bug is exercised
    ort_session(optimized)  # with ONNX Runtime's optimizations (PadFusion among them)
    assert not [n for n in optimized.graph.node if n.op_type == "Pad"]  # padded weights are folded
    assert verify(small, optimized).ok


@pytest.mark.parametrize("extractor", ["ilp", "greedy"])
def test_optimize_with_analytic_costs_verifies(small, extractor):
    result = optimize(small, cost_model="analytic", measure=False, extractor=extractor)
    assert verify(small, result.model).ok
    assert result.report["verification"]["ok"]


def test_optimize_writes_the_padded_se_convs_it_chose(small, monkeypatch):
    """The whole pipeline, with the noisy costs: the extracted graph is written, not a fallback."""

    def noisy_costs(g):
        analytic_costs(g)
        g.con.execute(_NOISY_SE_CONVS)

    monkeypatch.setattr(pipeline_phases, "analytic_costs", noisy_costs)
    result = optimize(small, cost_model="analytic", measure=False, extractor="greedy", rules=("default", "merge"))
    assert len(_padded_weight_convs(result.model)) >= 4
    assert verify(small, result.model).ok


def test_export_raises_export_error_on_a_cyclic_choice():
    from relsat.driver.errors import RelsatError
    from relsat.driver.boundary.onnx_export import ExportError

    F = TensorProto.FLOAT
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Relu", ["i"], ["y"])], "g",
        [helper.make_tensor_value_info("x", F, [4])], [helper.make_tensor_value_info("y", F, [4])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    g = EGraph()
    imported = import_model(model, egraph=g)
    Runner(g, load_rule_list(["default", "merge"]), Limits(3, 1000, 60, 1)).run()
    (ident, cls), = g.sql("SELECT id, eclass FROM enodes WHERE op = 'Identity'")  # now in x's e-class
    roots = [c for _, c in imported.outputs]
    choice = {**original_choice(g, roots), int(cls): int(ident)}
    with pytest.raises(ExportError, match=rf"cycle through e-class {cls}") as info:
        export_model(imported, choice)
    assert isinstance(info.value, RelsatError) and "\n" not in str(info.value)


def test_export_check_names_what_is_read_too_early_and_the_pad_fusion_hazard():
    from relsat.driver.boundary.onnx_export import ExportError, _check_graph

    F = TensorProto.FLOAT
    x = helper.make_tensor_value_info("x", F, [1, 2, 4, 4])
    y = helper.make_tensor_value_info("y", F, None)
    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    pads = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")
    late = helper.make_graph([helper.make_node("Relu", ["v_9"], ["y"]), helper.make_node("Relu", ["x"], ["v_9"])],
                             "g", [x], [y])
    with pytest.raises(ExportError, match=r"reads value 'v_9' \(e-class 7\) before it is produced"):
        _check_graph(late, {"v_9": 7})
    padded = helper.make_graph([helper.make_node("Pad", ["w", "pads"], ["v_4"]),
                                helper.make_node("Conv", ["x", "v_4"], ["y"], pads=[1, 1, 1, 1])],
                               "g", [x], [y], [w, pads])
    with pytest.raises(ExportError, match="Pad fusion"):
        _check_graph(padded, {})
    # the hazard is real: ONNX Runtime's PadFusion breaks exactly this graph
    model = helper.make_model(padded, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    ort_session(model, optimize=False)
    with pytest.raises(Exception, match="v_4"):
        ort_session(model)


@pytest.mark.slow
def test_timm_efficientnet_b0_optimizes_with_default_options(tmp_path):
    torch = pytest.importorskip("torch")
    try:
        timm = pytest.importorskip("timm")
    except Exception as e:  # e.g. a torchvision built for another torch
        pytest.skip(f"timm does not import here: {type(e).__name__}: {e}")
    net = timm.create_model("efficientnet_b0", pretrained=False).eval()
    path = tmp_path / "efficientnet_b0.onnx"
    torch.onnx.export(net, (torch.randn(1, 3, 224, 224),), str(path), opset_version=17, dynamo=False,
                      do_constant_folding=False, training=torch.onnx.TrainingMode.PRESERVE,
                      input_names=["input"], output_names=["output"])
    model = onnx.load(str(path))
    model.ir_version = min(model.ir_version, 10)  # ONNX Runtime here refuses newer IR versions
    assert {"Sigmoid", "Mul", "BatchNormalization"} <= {n.op_type for n in model.graph.node}
    result = optimize(model, output=tmp_path / "out.onnx")  # default options: measured costs, ILP, guard
    assert result.report["verification"]["ok"]
    assert verify(model, onnx.load(str(tmp_path / "out.onnx"))).ok
    greedy = optimize(model, extractor="greedy", measure=False)
    assert verify(model, greedy.model).ok
