"""Per-operator test cases generated from the catalog (relations/catalog.py): every operator an ONNX
node imports as (``OPERATORS``), each with the one-node model of its ``OpDef.example`` written as
export writes it (``example_model``).  test_shape_rules, test_onnx_roundtrip and test_torch_ops
parametrize over these, so adding an operator to the catalog adds its cases there."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from relsat.relations.catalog import BY_ONNX, REQUIRED, OpDef
from relsat.relations.onnx_form import catalog_nodes
from relsat.relations.runtime import session

OPSET = 20  # the default domain's opset of the models (Gelu exists from 20); another domain's: the op's ``since``
OPERATORS: list[OpDef] = sorted(BY_ONNX.values(), key=lambda op: (op.domain, op.op_type))
IDS = [f"{op.domain}.{op.op_type}" if op.domain else op.op_type for op in OPERATORS]


def example_attrs(op: OpDef) -> dict:
    """The example's attributes with the defaults filled in (the catalog's form)."""
    return {a.name: op.example.attrs.get(a.name, a.default) for a in op.attrs}


def _data(rng, shape, k: int, op: OpDef) -> np.ndarray:
    a = rng.standard_normal(shape).astype(np.float32)
    if k in op.positive:
        return np.abs(a) + 0.5
    if k in op.nonzero:
        return np.where(a < 0, a - 0.5, a + 0.5).astype(np.float32)
    return a


def first_opset(op: OpDef) -> int:
    """The default domain's opset an example of ``op`` is written at: ``OPSET``, or the first opset that has the op
    where it is newer (RMSNormalization: 23; below it the op is written as its definition in primitives)."""
    if op.domain:
        return OPSET
    return max(OPSET, min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                          if s.name == op.op_type and s.domain == ""))


def one_node_model(op: OpDef, shapes, attrs: dict, *, opset: int | None = None, seed: int = 0,
                   all_inputs: bool = False) -> onnx.ModelProto:
    """A checked one-node model of ``op`` (float32) over inputs of ``shapes`` (one per catalog input: None
    absent, a list for a variadic input) with ``attrs`` (the catalog's form; defaults filled in here),
    written by ``onnx_form.catalog_nodes``: the first input a graph input, the others initializers of
    random data (positive or away from zero where the catalog says), unless ``all_inputs``; the outputs
    typed by ONNX Runtime."""
    rng = np.random.default_rng(seed)
    opset = first_opset(op) if opset is None else opset
    attrs = {a.name: attrs[a.name] if a.name in attrs else a.default for a in op.attrs}
    missing = [n for n, v in attrs.items() if v is REQUIRED]
    assert not missing, f"{op.op_type}: no value for {missing}"
    graph_inputs, inits, names, feeds = [], [], [], {}
    for k, (inp, shape) in enumerate(zip(op.inputs, shapes)):
        for j, s in enumerate(shape if inp.variadic else [shape]):
            if s is None:
                names.append("")
                continue
            name = f"{inp.column}{j}" if inp.variadic else inp.column
            names.append(name)
            value = _data(rng, s, k, op)
            if all_inputs or not graph_inputs:
                graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, s))
                feeds[name] = value
            else:
                inits.append(numpy_helper.from_array(value, name))
    counter = [0]

    def fresh(hint: str) -> str:
        counter[0] += 1
        return f"{hint}_{counter[0]}"

    def const(value, dtype: int) -> str:
        name = fresh("const")
        inits.append(numpy_helper.from_array(np.array(value, dtype=helper.tensor_dtype_to_np_dtype(dtype)), name))
        return name

    outputs = [f"y{i}" for i in range(op.arity(attrs))]
    first = next(s for s in shapes if s is not None)
    nodes = catalog_nodes(op, names, outputs, attrs, opset=op.since if op.domain else opset,
                          data_dtype=TensorProto.FLOAT, data_shape=first[0] if op.variadic else first,
                          const=const, fresh=fresh)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(op.domain, op.since)] if op.domain else [])
    untyped = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    model = helper.make_model(helper.make_graph(nodes, op.op_type, graph_inputs, untyped, inits),
                              opset_imports=opsets, ir_version=10)
    values = session(model, optimize=False).run(None, feeds)
    del model.graph.output[:]
    model.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.FLOAT, v.shape)
                              for o, v in zip(outputs, values))
    onnx.checker.check_model(model)
    return model


def example_model(op: OpDef, **kw) -> onnx.ModelProto:
    """The one-node model of ``op``'s catalog example."""
    return one_node_model(op, op.example.inputs, example_attrs(op), **kw)
