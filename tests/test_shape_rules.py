"""The catalog's SQL shape rules agree with ONNX's own shape inference on one-node models."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from relsat.relations.catalog import BY_TYPE, OPS
from relsat.relations.egraph import EGraph, ShapeConflict
from relsat.relations.runtime import session

# (op_type, input shapes, relsat attributes, extra ONNX attributes/initializers handled below)
CASES = [
    ("Add", [[2, 3, 4], [4]], {}),
    ("Add", [[2, 1, 4], [3, 1]], {}),
    ("Sub", [[5, 1], [1, 6]], {}),
    ("Mul", [[1], [7, 2]], {}),
    ("Div", [[3, 4], [3, 4]], {}),
    ("MatMul", [[2, 3], [3, 5]], {}),
    ("MatMul", [[4, 2, 3], [3, 5]], {}),
    ("MatMul", [[16, 64, 64], [16, 64, 32]], {}),
    ("MatMul", [[3], [2, 3, 5]], {}),
    ("MatMul", [[2, 4, 3], [3]], {}),
    ("Gemm", [[4, 3], [5, 3], [5]], {"transB": 1}),
    ("Gemm", [[3, 4], [3, 5]], {"transA": 1}),
    ("FusedMatMul", [[2, 4, 3], [4, 5]], {"transA": 1, "alpha": 0.5}),
    ("FusedMatMul", [[3], [2, 3, 5]], {}),
    ("FusedMatMul", [[2, 1, 3, 4], [2, 5, 4]], {"transB": 1}),
    ("Conv", [[1, 3, 32, 32], [8, 3, 3, 3]], {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [1, 1, 1, 1], "dilations": [1, 1]}),
    ("Conv", [[1, 8, 17, 15], [16, 2, 3, 5], [16]], {"group": 4, "kernel_shape": [3, 5], "strides": [2, 3], "pads": [0, 1, 2, 0], "dilations": [1, 2]}),
    ("Conv", [[1, 4, 10], [6, 4, 3]], {"kernel_shape": [3], "strides": [2], "pads": [1, 1], "dilations": [1]}),
    ("MaxPool", [[1, 4, 11, 11]], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1]}),
    ("MaxPool", [[1, 4, 12, 12]], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 0, 0], "dilations": [1, 1], "ceil_mode": 1}),
    ("AveragePool", [[1, 4, 9, 9]], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 1, 1], "dilations": [1, 1], "count_include_pad": 1}),
    ("GlobalAveragePool", [[1, 5, 7, 7]], {}),
    ("Relu", [[2, 3]], {}),
    ("Sigmoid", [[4]], {}),
    ("Tanh", [[1, 2, 3]], {}),
    ("Erf", [[3, 3]], {}),
    ("Sqrt", [[3, 3]], {}),
    ("LeakyRelu", [[2, 2]], {"alpha": 0.2}),
    ("Identity", [[6]], {}),
    ("Clip", [[2, 5]], {"min": 0.0, "max": 6.0}),
    ("Softmax", [[2, 3, 4]], {"axis": 1}),
    ("LayerNormalization", [[2, 5, 8], [8], [8]], {"axis": 2}),
    ("BatchNormalization", [[1, 3, 4, 4], [3], [3], [3], [3]], {}),
    ("Concat", [[2, 3], [2, 5], [2, 1]], {"axis": 1}),
    ("Concat", [[1, 2, 2], [3, 2, 2]], {"axis": -3}),
    ("Split", [[6, 4]], {"axis": 0, "split": [1, 2, 3]}),
    ("Slice", [[10, 8, 6]], {"starts": [1, 0], "ends": [7, 8], "axes": [0, 2], "steps": [2, 1]}),
    ("Slice", [[10, 8]], {"starts": [8], "ends": [1], "axes": [0], "steps": [-3]}),
    ("Transpose", [[2, 3, 4]], {"perm": [2, 0, 1]}),
    ("Reshape", [[2, 3, 4]], {"shape": [6, 4]}),
    ("Flatten", [[2, 3, 4, 5]], {"axis": 2}),
    ("Flatten", [[2, 3]], {"axis": 0}),
    ("Squeeze", [[1, 3, 1, 4]], {"axes": [0, 2]}),
    ("Unsqueeze", [[3, 4]], {"axes": [0, 3]}),
    ("Pad", [[2, 3]], {"pads": [1, 0, 2, 3], "mode": "constant", "value": 0.0}),
    ("Gelu", [[2, 3]], {}),
    ("HardSigmoid", [[2, 3]], {"alpha": 0.25, "beta": 0.4}),
    ("HardSwish", [[2, 3]], {}),
    ("Gather", [[2, 5, 3]], {"axis": 1, "indices": 4}),
    ("Gather", [[4, 3]], {"axis": 0, "indices": 0}),
]


def _onnx_shapes(op, shapes, attrs):
    """Output shapes by ONNX shape inference, with lifted attributes passed as initializers."""
    opdef = BY_TYPE[op]
    inputs = [helper.make_tensor_value_info(f"i{k}", TensorProto.FLOAT, s) for k, s in enumerate(shapes)]
    names = [f"i{k}" for k in range(len(shapes))]
    inits, onnx_attrs = [], dict(attrs)
    for lift in opdef.lifted:
        if lift.attr in onnx_attrs:
            val = onnx_attrs.pop(lift.attr)
            arr = np.array(val, dtype=np.int64 if lift.dtype == 7 else np.float32)
            while len(names) < lift.input_index:
                names.append("")
            names.insert(lift.input_index, f"c_{lift.attr}")
            inits.append(onnx.numpy_helper.from_array(arr, f"c_{lift.attr}"))
    nout = len(attrs["split"]) if op == "Split" else 1
    node = helper.make_node(op, names, [f"o{k}" for k in range(nout)], domain=opdef.domain or None, **onnx_attrs)
    outs = [helper.make_tensor_value_info(f"o{k}", TensorProto.FLOAT, None) for k in range(nout)]
    model = helper.make_model(helper.make_graph([node], "g", inputs, outs, inits),
                              opset_imports=[helper.make_opsetid("", 20)] + (
                                  [helper.make_opsetid(opdef.domain, opdef.since)] if opdef.domain else []),
                              ir_version=10)
    if opdef.domain:  # ONNX has no schema for other domains' ops (com.microsoft): ONNX Runtime computes them
        feeds = {f"i{k}": np.zeros(s, np.float32) for k, s in enumerate(shapes)}
        return [list(v.shape) for v in session(model, optimize=False).run(None, feeds)]
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    got = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in inferred.graph.output}
    return [got[f"o{k}"] for k in range(nout)]


def _relsat_shapes(op, shapes, attrs):
    g = EGraph()
    leaves = g.add("Input", attrs={"name": np.array([f"i{k}" for k in range(len(shapes))], dtype=object),
                                   "shape": np.array([json.dumps(s) for s in shapes], dtype=object), "dtype": 1})
    opdef = BY_TYPE[op]
    if opdef.variadic:
        children = {opdef.inputs[0].column: [list(leaves)]}
    else:
        children = {c: leaves[k:k + 1] if k < len(leaves) else np.array([-1]) for k, c in enumerate(opdef.child_columns)}
    (out,) = g.add(op, children, attrs)
    row = g.sql("SELECT shape, tuple_shapes FROM eclass WHERE id = ?", [int(out)])[0]
    g.check_invariants()
    return row[1] if opdef.is_tuple else [row[0]]


@pytest.mark.parametrize("op,shapes,attrs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_shape_rule_matches_onnx(op, shapes, attrs):
    assert _relsat_shapes(op, shapes, attrs) == _onnx_shapes(op, shapes, attrs)


def test_every_tensor_op_has_a_case():
    covered = {c[0] for c in CASES}
    skip = {"Input", "Weight", "Constant", "getitem"}
    assert {op.op_type for op in OPS} - skip <= covered


@pytest.mark.parametrize("op,shapes,attrs", [
    ("Add", [[2, 3], [4]], {}),
    ("MatMul", [[2, 3], [4, 5]], {}),
    ("Conv", [[1, 3, 8, 8], [4, 2, 3, 3]], {"kernel_shape": [3, 3], "strides": [1, 1], "pads": [0, 0, 0, 0], "dilations": [1, 1]}),
    ("Concat", [[2, 3], [3, 3]], {"axis": 1}),
    ("Reshape", [[2, 3]], {"shape": [4, 2]}),
    ("Split", [[6]], {"axis": 0, "split": [2, 2]}),
    ("Transpose", [[2, 3]], {"perm": [0, 0]}),
    ("Squeeze", [[2, 3]], {"axes": [0]}),
])
def test_invalid_nodes_are_rejected(op, shapes, attrs):
    with pytest.raises(ShapeConflict):
        _relsat_shapes(op, shapes, attrs)
