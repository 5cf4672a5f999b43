"""The ONNX form of catalog operators: the one writer of an e-node as NodeProto(s).

``catalog_nodes`` writes a catalog node as ONNX writes it at a given opset of its domain:
attributes equal to the ONNX default left out, lifted attributes (``Input.lifted``) as
initializer inputs from the opset that takes them as inputs (else as attributes), the
number of outputs of a tuple operator from the catalog (``OpDef.arity``), the op's domain, and
the few operator-specific spellings (``_SPELLINGS``: Slice's INT64_MIN end, Reshape's
allowzero, Softmax's axis before opset 13, Gelu below opset 20 as its definition in
primitives).  ``opaque_node`` writes an opaque node back with new value names (subgraph reads of
outer values renamed too).  ``enode_proto`` writes one e-node standing alone (the profiler's
one-node models).  Export (driver/onnx_export.py), rule verification (programs/verify.py)
and measured costs (extract/measured.py) all write nodes through this module.

Also here, as they are needed on both sides of it: walking the subgraphs of a node and the
outer-scope values they read (``subgraphs``, ``walk_graphs``, ``outer_names``, ``rename_outer``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from .catalog import BY_TYPE, REQUIRED, OpDef

ATTR_TYPES = {"int": AttributeProto.INT, "ints": AttributeProto.INTS, "float": AttributeProto.FLOAT,
              "floats": AttributeProto.FLOATS, "string": AttributeProto.STRING}
INT64_MIN = -(2 ** 63)


class FormError(ValueError):
    """A node that cannot be written at the requested opset."""


# ------------------------------------------------------------------ subgraphs
def subgraphs(node: onnx.NodeProto):
    """The graphs held by a node's attributes (If's branches, Loop's body, ...)."""
    for a in node.attribute:
        yield from ([a.g] if a.type == AttributeProto.GRAPH else a.graphs)


def walk_graphs(graph: onnx.GraphProto):
    """The graph and all its nested subgraphs."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from walk_graphs(sub)


def outer_names(node: onnx.NodeProto) -> list[str]:
    """Names of outer-scope values that the node's subgraphs read (sorted): implicit inputs."""

    def refs(graph) -> set[str]:
        local = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {
            o for n in graph.node for o in n.output}
        used = {v.name for v in graph.output}
        for n in graph.node:
            used.update(i for i in n.input if i)
            used.update(*(refs(sub) for sub in subgraphs(n)))
        return used - local

    return sorted(set().union(*(refs(sub) for sub in subgraphs(node))))


def rename_outer(graph: onnx.GraphProto, mapping: dict[str, str]) -> None:
    """Rename reads of outer-scope values inside a subgraph (names it defines itself shadow them)."""
    local = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {
        o for n in graph.node for o in n.output}
    m = {k: v for k, v in mapping.items() if k not in local}
    if not m:
        return
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in m:
                node.input[i] = m[name]
        for sub in subgraphs(node):
            rename_outer(sub, m)
    for v in graph.output:
        if v.name in m:
            v.name = m[v.name]


# ------------------------------------------------------------------ writing
def same(value, default, kind: str) -> bool:
    """Whether an attribute value is its default (floats compared as float32, as ONNX stores them)."""
    if default is REQUIRED:
        return False
    if kind == "float":
        return np.float32(value) == np.float32(default)
    return value == default


def _attribute_names(op: OpDef, opset: int) -> set[str]:
    """The attributes ONNX's schema of ``op`` has at ``opset`` (FormError when the op does not exist
    there); ops of other domains: the catalog's, within the entry's opset range."""
    if op.domain:
        if not op.in_opsets(opset):
            raise FormError(f"cannot export {op.op_type}: {op.domain} opset {opset} is outside {op.opset_range}")
        return {a.name for a in op.attrs}
    try:
        return set(onnx.defs.get_schema(op.op_type, opset).attributes)
    except onnx.defs.SchemaError:
        raise FormError(f"cannot export {op.op_type}: it does not exist at opset {opset}") from None


def catalog_nodes(op: OpDef, inputs: list[str], outputs: list[str], attrs: dict, *, opset: int,
                  data_dtype: int, data_shape, const: Callable[[object, int], str],
                  fresh: Callable[[str], str]) -> list[onnx.NodeProto]:
    """The NodeProto(s) of a catalog node at ``opset`` (of ``op.domain``): ``inputs`` name its
    children ("" for an absent optional one), ``outputs`` its values (``op.arity(attrs)`` for a
    tuple); ``data_dtype``/``data_shape`` are its first child's; ``const(value, dtype)`` names an
    initializer holding a value, ``fresh(hint)`` a new value name.  FormError when it cannot be
    written at ``opset``."""
    spell = _SPELLINGS.get(op.op_type)
    if op.op_type == "Gelu" and opset < 20:
        return _gelu(inputs[0], outputs[0], attrs, opset, data_dtype, const, fresh)
    schema_attrs = _attribute_names(op, opset)
    inputs, values = list(inputs), dict(attrs)
    extra_attrs = spell(values, opset, data_shape, schema_attrs) if spell else []
    lifted = {lf.attr: lf for lf in op.lifted}
    written, extra = [], {}
    for a in op.attrs:
        v = values[a.name]
        neutral = same(v, a.default, a.kind) or (a.name in ("dilations", "steps") and set(v) <= {1})
        lf = lifted.get(a.name)
        if lf and opset >= lf.since:
            if not same(v, a.default, a.kind):
                extra[lf.input_index] = const(v, data_dtype if lf.dtype == 1 else lf.dtype)
        elif a.name not in schema_attrs:
            if not neutral:
                raise FormError(f"cannot export {op.op_type} with {a.name}={v} at opset {opset}")
        elif not neutral:  # ONNX's defaults are the catalog's (and dilations of 1)
            written.append(helper.make_attribute(a.name, v, attr_type=ATTR_TYPES[a.kind]))
    for i, name in extra.items():
        inputs += [""] * (i + 1 - len(inputs))
        inputs[i] = name
    while inputs and not inputs[-1]:
        inputs.pop()
    node = helper.make_node(op.op_type, inputs, outputs, name=outputs[0], domain=op.domain or None)
    node.attribute.extend(written + extra_attrs)
    return [node]


def _slice(values, opset, shape, schema_attrs):
    """A negative step's end -1 means "before index 0": ONNX spells it INT64_MIN."""
    values["ends"] = [INT64_MIN if st < 0 and e < 0 else e for e, st in zip(values["ends"], values["steps"])]
    return []


def _reshape(values, opset, shape, schema_attrs):
    """A 0 in the target shape is a real 0 (imported shapes are resolved)."""
    return [helper.make_attribute("allowzero", 1)] if 0 in values["shape"] and "allowzero" in schema_attrs else []


def _softmax(values, opset, shape, schema_attrs):
    """Before opset 13 Softmax flattens at its axis: the same only over the last axis."""
    if opset < 13 and shape is not None and values["axis"] != len(shape) - 1:
        raise FormError(f"cannot export Softmax over axis {values['axis']} at opset {opset} (< 13)")
    return []


_SPELLINGS = {"Slice": _slice, "Reshape": _reshape, "Softmax": _softmax}


def _gelu(x: str, out: str, attrs: dict, opset: int, dtype: int, const, fresh) -> list[onnx.NodeProto]:
    """Gelu below opset 20, where ONNX has no Gelu op: its definition in ONNX primitives."""

    def c(v: float) -> str:
        return const(v, dtype)

    steps = ([("Mul", x, x), ("Mul", None, x), ("Mul", None, c(0.044715)), ("Add", x, None),
              ("Mul", None, c(math.sqrt(2 / math.pi))), ("Tanh", None)] if attrs["approximate"] == "tanh"
             else [("Div", x, c(math.sqrt(2))), ("Erf", None)])
    steps += [("Add", None, c(1.0)), ("Mul", x, None), ("Mul", None, c(0.5))]
    nodes, prev = [], None
    for k, (op_type, *ins) in enumerate(steps):
        try:
            onnx.defs.get_schema(op_type, opset)
        except onnx.defs.SchemaError:
            raise FormError(f"cannot export Gelu at opset {opset}: neither Gelu nor {op_type} exists there") from None
        name = out if k == len(steps) - 1 else fresh("gelu")
        nodes.append(helper.make_node(op_type, [prev if i is None else i for i in ins], [name], name=name))
        prev = name
    return nodes


def opaque_node(blob: bytes, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    """An opaque node's NodeProto with its non-empty inputs, then the outer values its subgraphs read
    (``outer_names`` order), named ``inputs``; its outputs named ``outputs`` ("" where unused)."""
    node = onnx.NodeProto()
    node.ParseFromString(blob)
    positions = [i for i, name in enumerate(node.input) if name]
    for i, name in zip(positions, inputs):
        node.input[i] = name
    mapping = dict(zip(outer_names(node), inputs[len(positions):]))
    for sub in subgraphs(node) if mapping else ():
        rename_outer(sub, mapping)
    for i, o in enumerate(outputs):
        if node.output[i]:
            node.output[i] = o
    return node


def opaque_outputs(blob: bytes) -> list[str]:
    """The output names of a serialized opaque node ("" where an output is omitted)."""
    node = onnx.NodeProto()
    node.ParseFromString(blob)
    return list(node.output)


def enode_proto(op: str, children: list[int], attrs: dict, info: dict, opset: int, domains: dict | None = None):
    """One e-node written as export writes it, standing alone (for the profiler's one-node models).
    ``op`` is a catalog op_type, or "opaque" with ``attrs = {"node": NodeProto bytes}``;
    ``children`` its child e-classes (-1 = absent); ``info`` maps each child e-class to
    ``(shape, dtype)``; ``opset``: of the default domain, ``domains``: of the others (a catalog op
    of a domain not listed is written at the first opset of its range). Returns the NodeProto, the initializers it reads (lifted
    attributes) and the input name given to each child e-class."""
    names = {c: f"v_{k + 1}" for k, c in enumerate(dict.fromkeys(c for c in children if c != -1))}
    inits: list[onnx.TensorProto] = []
    counter = [0]

    def fresh(hint: str) -> str:
        counter[0] += 1
        return f"{hint}_{counter[0]}"

    seen: dict[tuple, str] = {}

    def const(value, dtype: int) -> str:  # one initializer per distinct value, as export writes them
        arr = np.array(value, dtype=helper.tensor_dtype_to_np_dtype(dtype))
        key = (dtype, arr.shape, arr.tobytes())
        if key not in seen:
            seen[key] = fresh("const")
            inits.append(numpy_helper.from_array(arr, seen[key]))
        return seen[key]

    inputs = [names[c] if c != -1 else "" for c in children]
    if op == "opaque":
        outs = opaque_outputs(attrs["node"])
        node = opaque_node(attrs["node"], [i for i in inputs if i], [fresh("out") if o else "" for o in outs])
        return node, inits, names
    entry = BY_TYPE[op]
    n_out = entry.arity(attrs) if entry.is_tuple else 1
    outputs = [fresh("out") for _ in range(n_out)]
    first = info.get(children[0], (None, None)) if children else (None, None)
    nodes = catalog_nodes(entry, inputs, outputs, attrs, opset=(domains or {}).get(entry.domain, entry.since) if entry.domain else opset,
                          data_dtype=first[1] or onnx.TensorProto.FLOAT, data_shape=first[0], const=const,
                          fresh=fresh)
    if len(nodes) != 1:
        raise FormError(f"{op} at opset {opset} is written as {len(nodes)} nodes, not one")
    return nodes[0], inits, names
