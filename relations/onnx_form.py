"""The ONNX form of catalog operators: how a node is read (import normalisation) and written.

``IMPORT_HOOKS`` holds the one import hook of each operator whose ONNX spellings need more than
the generic attribute reading (auto_pad to pads, negative axes, opset-dependent defaults, Pad's
axes input, ...); ONNX import (driver/boundary/onnx_import.py) calls it.  The rest of this module is the
one writer of an e-node as NodeProto(s).

``catalog_nodes`` writes a catalog node as ONNX writes it at a given opset of its domain:
attributes equal to the ONNX default left out, lifted attributes (``Input.lifted``) as
initializer inputs from the opset that takes them as inputs (else as attributes), the
number of outputs of a tuple operator from the catalog (``OpDef.arity``), the op's domain, and
the few operator-specific spellings (``_SPELLINGS``: Slice's INT64_MIN end, Reshape's
allowzero, Softmax's axis before opset 13; ``_DEFINITIONS``: Gelu below opset 20, HardSwish below 14 and
RMSNormalization below 23 as their definitions in primitives).  ``opaque_node`` writes an opaque node back with
new value names (subgraph reads of outer values renamed too).  ``enode_proto`` writes one e-node standing alone
(the profiler's one-node models).  Export (driver/boundary/onnx_export.py), rule verification (programs/verify.py)
and measured costs (extract/measured.py) all write nodes through this module.

Also here, as they are needed on both sides of it: walking the subgraphs of a node and the
outer-scope values they read (``subgraphs``, ``walk_graphs``, ``graph_outer_names``, ``outer_names``,
``rename_outer``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from .catalog import BY_TYPE, REQUIRED, OpDef
from .dims import infer_dim, is_sym, spell_reshape

ATTR_TYPES = {"int": AttributeProto.INT, "ints": AttributeProto.INTS, "float": AttributeProto.FLOAT,
              "floats": AttributeProto.FLOATS, "string": AttributeProto.STRING}
INT64_MIN = -(2 ** 63)
INT64_MAX = 2 ** 63 - 1


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


def graph_outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names of outer-scope values that a subgraph (or the graphs nested in it) reads."""
    local = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {
        o for n in graph.node for o in n.output}
    used = {v.name for v in graph.output}
    for n in graph.node:
        used.update(i for i in n.input if i)
        used.update(*(graph_outer_names(sub) for sub in subgraphs(n)))
    return used - local


def outer_names(node: onnx.NodeProto) -> list[str]:
    """Names of outer-scope values that the node's subgraphs read (sorted): implicit inputs."""
    return sorted(set().union(*(graph_outer_names(sub) for sub in subgraphs(node))))


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
    if op.op_type in _DEFINITIONS and opset < _DEFINITIONS[op.op_type][0]:
        return _DEFINITIONS[op.op_type][1](inputs, outputs[0], attrs, opset, data_dtype, data_shape, const, fresh)
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
    """A 0 in the target shape is a real 0 (imported shapes are resolved); a symbol is written as 0
    (copied from the data) or -1 (inferred) by ``dims.spell_reshape``."""
    spelled = spell_reshape(values["shape"], shape)
    if spelled is None:
        raise FormError(f"cannot write Reshape to {values['shape']} over dynamic dims of {shape}")
    values["shape"], zero = spelled
    return [helper.make_attribute("allowzero", 1)] if zero and "allowzero" in schema_attrs else []


def _softmax(values, opset, shape, schema_attrs):
    """Before opset 13 Softmax flattens at its axis: the same only over the last axis."""
    if opset < 13 and shape is not None and values["axis"] != len(shape) - 1:
        raise FormError(f"cannot export Softmax over axis {values['axis']} at opset {opset} (< 13)")
    return []


def _reduce_axes(values, opset, shape, schema_attrs):
    """Reduction axes counted from the end (-1 for the last; ONNX allows it from opset 11), as exporters write
    them: written as 2 of a rank-3 tensor, PP-OCRv4 rec's five decomposed LayerNormalizations (ReduceMean, Sub,
    Pow, ReduceMean, Add, Sqrt, Div) were no longer fused by ONNX Runtime; spelled -1 they are again."""
    if shape is not None and opset >= 11:
        values["axes"] = [a - len(shape) for a in values["axes"]]
    return []


_SPELLINGS = {"Slice": _slice, "Reshape": _reshape, "Softmax": _softmax, "ReduceMean": _reduce_axes,
              "ReduceL2": _reduce_axes}


def _chain(op: str, steps: list, out: str, opset: int, fresh, attrs: dict | None = None) -> list[onnx.NodeProto]:
    """``steps`` (op_type, inputs: None for the step before's output) as a chain of nodes ending in ``out``, each op
    checked to exist at ``opset``; ``attrs``: the attributes of the steps that have some, by step index."""
    nodes, prev = [], None
    for k, (op_type, *ins) in enumerate(steps):
        try:
            onnx.defs.get_schema(op_type, opset)
        except onnx.defs.SchemaError:
            raise FormError(f"cannot export {op} at opset {opset}: neither {op} nor {op_type} exists there") from None
        name = out if k == len(steps) - 1 else fresh(op.lower())
        nodes.append(helper.make_node(op_type, [prev if i is None else i for i in ins], [name], name=name,
                                      **(attrs or {}).get(k, {})))
        prev = name
    return nodes


def _gelu(inputs: list, out: str, attrs: dict, opset: int, dtype: int, shape, const, fresh) -> list[onnx.NodeProto]:
    """Gelu below opset 20, where ONNX has no Gelu op: its definition in ONNX primitives."""
    x = inputs[0]

    def c(v: float) -> str:
        return const(v, dtype)

    steps = ([("Mul", x, x), ("Mul", None, x), ("Mul", None, c(0.044715)), ("Add", x, None),
              ("Mul", None, c(math.sqrt(2 / math.pi))), ("Tanh", None)] if attrs["approximate"] == "tanh"
             else [("Div", x, c(math.sqrt(2))), ("Erf", None)])
    steps += [("Add", None, c(1.0)), ("Mul", x, None), ("Mul", None, c(0.5))]
    return _chain("Gelu", steps, out, opset, fresh)


def _rmsnorm(inputs: list, out: str, attrs: dict, opset: int, dtype: int, shape, const,
             fresh) -> list[onnx.NodeProto]:
    """RMSNormalization below opset 23: scale * (x * (1 / sqrt(mean(x^2) + epsilon))), the mean over the axes
    from ``axis`` on, counted from the end, kept. This is the form transformers exports for T5 (and LLaMA's but for
    the reciprocal), which ONNX Runtime fuses into one SimplifiedLayerNormalization kernel; float32 only (no
    ``stash_type`` cast)."""
    x, scale, axis = inputs[0], inputs[1], attrs["axis"]
    if dtype != onnx.TensorProto.FLOAT or (axis >= 0 and shape is None):
        raise FormError(f"cannot export RMSNormalization at opset {opset} but over float32 (of a known rank)")
    axes = list(range(axis - len(shape) if axis >= 0 else axis, 0))
    mean = ("ReduceMean", None, const(axes, onnx.TensorProto.INT64)) if opset >= 18 else ("ReduceMean", None)
    steps = [("Pow", x, const(2.0, dtype)), mean, ("Add", None, const(attrs["epsilon"], dtype)), ("Sqrt", None),
             ("Div", const(1.0, dtype), None), ("Mul", x, None), ("Mul", scale, None)]
    reduce_attrs = {"keepdims": 1, **({} if opset >= 18 else {"axes": axes})}
    return _chain("RMSNormalization", steps, out, opset, fresh, {1: reduce_attrs})


def _hardswish(inputs: list, out: str, attrs: dict, opset: int, dtype: int, shape, const,
               fresh) -> list[onnx.NodeProto]:
    """HardSwish below opset 14, where ONNX has no HardSwish op: x * HardSigmoid(x) with alpha 1/6 and
    beta 1/2, its definition (and the form ONNX Runtime keeps in its blocked NCHWc layout)."""
    x = inputs[0]
    gate = fresh("hardswish")
    return [helper.make_node("HardSigmoid", [x], [gate], name=gate, alpha=1 / 6, beta=0.5),
            helper.make_node("Mul", [x, gate], [out], name=out)]


# ops written as their definition in older ONNX primitives below the opset that introduced them
_DEFINITIONS = {"Gelu": (20, _gelu), "HardSwish": (14, _hardswish), "RMSNormalization": (23, _rmsnorm)}


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

# ------------------------------------------------------------------ reading: import normalisation
# An operator whose ONNX spellings need more than the generic attribute reading has one hook here,
# ``IMPORT_HOOKS[op_type](ctx, node, attrs, data, shapes) -> representable?``: it rewrites ``attrs``
# (the node's attributes, lifted inputs included) into the catalog's canonical form (axes
# normalised, auto_pad resolved to pads, defaults that depend on the opset made explicit) and may
# consume data inputs (``data``: their names, ``shapes``: their shapes). ``ctx`` gives ``opset``
# (of the node's domain) and ``const_ints(name)`` (a constant input's values, or None).
def attr_value(a: onnx.AttributeProto):
    """An attribute's value as import reads it: strings decoded."""
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def norm_axis(axis: int, rank: int) -> int:
    """A possibly negative axis as a position in 0..rank-1."""
    return axis + rank if axis < 0 else axis


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def _window(ctx, node, attrs, data, shapes) -> bool:
    x = shapes[0]
    sp = len(x) - 2
    k = attrs.get("kernel_shape") or (list(shapes[1][2:]) if node.op_type in ("Conv", "ConvTranspose")
                                      and len(shapes) > 1 else None)
    if sp < 1 or not k or len(k) != sp:
        return False
    s = attrs.get("strides") or [1] * sp
    d = attrs.get("dilations") or [1] * sp
    auto = attrs.pop("auto_pad", "NOTSET")
    pads = attrs.get("pads") or [0] * (2 * sp)
    if auto == "VALID":
        pads = [0] * (2 * sp)
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        if any(is_sym(d) for d in x[2:]):
            return False  # the pads depend on a dynamic spatial dim's size
        total = [max(0, (-(-x[i + 2] // s[i]) - 1) * s[i] + (k[i] - 1) * d[i] + 1 - x[i + 2]) for i in range(sp)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        pads = small + big if auto == "SAME_UPPER" else big + small
    elif auto != "NOTSET":
        return False
    attrs.pop("storage_order", None)  # only changes MaxPool's Indices output, which must be unused
    attrs.update(kernel_shape=list(k), strides=list(s), dilations=list(d), pads=list(pads))
    return True


def _conv_transpose(ctx, node, attrs, data, shapes) -> bool:
    """ConvTranspose with explicit pads (``auto_pad`` NOTSET or VALID), read as a Conv's window, with
    output_padding made explicit; ``output_shape`` and ``auto_pad`` SAME (whose pads ONNX derives from the output
    size) are left opaque."""
    if "output_shape" in attrs or attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return False
    if not _window(ctx, node, attrs, data, shapes):
        return False
    attrs["output_padding"] = list(attrs.get("output_padding") or [0] * len(attrs["kernel_shape"]))
    return True


def _softmax(ctx, node, attrs, data, shapes) -> bool:
    rank = len(shapes[0])
    axis = norm_axis(attrs.get("axis", -1 if ctx.opset >= 13 else 1), rank)
    attrs["axis"] = axis
    return ctx.opset >= 13 or axis == rank - 1  # before 13, Softmax flattens at axis: same only for the last


def _batchnorm(ctx, node, attrs, data, shapes) -> bool:
    inference = attrs.pop("training_mode", 0) == 0 and attrs.pop("spatial", 1) == 1
    return inference and not any(node.output[1:])


def _split(ctx, node, attrs, data, shapes) -> bool:
    x = shapes[0]
    axis = norm_axis(attrs.get("axis", 0), len(x))
    if not 0 <= axis < len(x):
        return False
    d, k, num = x[axis], len(node.output), attrs.pop("num_outputs", None)
    if is_sym(d):
        return False
    split = attrs.get("split")
    if split is None and num:
        chunk = -(-d // num)
        split = [chunk] * (num - 1) + [d - chunk * (num - 1)]
    elif split is None:
        split = [d // k] * k if d % k == 0 else None
    attrs.update(axis=axis, split=split)
    return split is not None and len(split) == k and min(split) >= 0


def _slice(ctx, node, attrs, data, shapes) -> bool:
    x = shapes[0]
    starts, ends = attrs.get("starts"), attrs.get("ends")
    if starts is None or ends is None:
        return False
    axes = attrs.get("axes") or list(range(len(starts)))
    steps = attrs.get("steps") or [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return False
    rows = {}
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(a, len(x))
        if not 0 <= a < len(x) or st == 0 or a in rows:
            return False
        d = x[a]
        if is_sym(d):  # a dynamic dim: only the whole of it, [0, end)
            if s != 0 or st != 1 or e < 2 ** 31 - 1:
                return False
            rows[a] = (0, INT64_MAX, 1)
            continue
        s, e = norm_axis(s, d), norm_axis(e, d)
        rows[a] = (_clamp(s, 0, d), _clamp(e, 0, d), st) if st > 0 else (_clamp(s, 0, d - 1), _clamp(e, -1, d - 1), st)
    axes = sorted(rows)
    attrs.update(axes=axes, starts=[rows[a][0] for a in axes], ends=[rows[a][1] for a in axes],
                 steps=[rows[a][2] for a in axes])
    return True


def _gather(ctx, node, attrs, data, shapes) -> bool:
    x = shapes[0]
    axis = norm_axis(attrs.get("axis", 0), len(x))
    if not 0 <= axis < len(x) or is_sym(x[axis]) or "indices" not in attrs:
        return False
    index = norm_axis(attrs["indices"], x[axis])
    attrs.update(axis=axis, indices=index)
    return 0 <= index < x[axis]


def _transpose(ctx, node, attrs, data, shapes) -> bool:
    attrs["perm"] = [norm_axis(p, len(shapes[0])) for p in attrs.get("perm", range(len(shapes[0]) - 1, -1, -1))]
    return True


def _reshape(ctx, node, attrs, data, shapes) -> bool:
    x, zero = shapes[0], attrs.pop("allowzero", 0)
    target = attrs.get("shape")
    if target is None:
        return False
    out = [x[i] if t == 0 and not zero and i < len(x) else t for i, t in enumerate(target)]
    if out.count(-1) == 1:
        d = infer_dim(x, [t for t in out if t != -1])
        if d is None:
            return False
        out[out.index(-1)] = d
    attrs["shape"] = out
    return all(t >= 0 or is_sym(t) for t in out) and not (0 in out and not zero)


def _squeeze(ctx, node, attrs, data, shapes) -> bool:
    x = shapes[0]
    axes = attrs.get("axes")
    axes = [i for i, d in enumerate(x) if d == 1] if axes is None else sorted({norm_axis(a, len(x)) for a in axes})
    attrs["axes"] = axes
    return all(0 <= a < len(x) and x[a] == 1 for a in axes)


def _unsqueeze(ctx, node, attrs, data, shapes) -> bool:
    axes = attrs.get("axes")
    if axes is None:
        return False
    rank = len(shapes[0]) + len(axes)
    attrs["axes"] = sorted({norm_axis(a, rank) for a in axes})
    return len(attrs["axes"]) == len(axes) and all(0 <= a < rank for a in attrs["axes"])


def _pad(ctx, node, attrs, data, shapes) -> bool:
    rank = len(shapes[0])
    pads = attrs.get("pads")
    if len(data) > 1:  # opset 18: the axes that pads refer to
        axes = ctx.const_ints(data.pop())
        shapes.pop()
        if axes is None or pads is None or len(pads) != 2 * len(axes):
            return False
        full = [0] * (2 * rank)
        for j, a in enumerate(axes):
            full[norm_axis(a, rank)], full[norm_axis(a, rank) + rank] = pads[j], pads[j + len(axes)]
        pads = full
    attrs["pads"] = pads
    return pads is not None and len(pads) == 2 * rank


def _reduce(ctx, node, attrs, data, shapes) -> bool:
    """ReduceMean/ReduceL2: the axes as sorted positions; none given means all of them (ONNX's default),
    unless ``noop_with_empty_axes`` makes the node an identity, which stays opaque."""
    rank = len(shapes[0])
    axes = attrs.get("axes")
    if not axes and attrs.pop("noop_with_empty_axes", 0):
        return False
    attrs.pop("noop_with_empty_axes", None)
    axes = list(range(rank)) if not axes else [norm_axis(a, rank) for a in axes]
    attrs["axes"] = sorted(set(axes))
    attrs.setdefault("keepdims", 1)
    return len(attrs["axes"]) == len(axes) and all(0 <= a < rank for a in axes) and rank >= 1


IMPORT_HOOKS = {"Conv": _window, "ConvTranspose": _conv_transpose, "MaxPool": _window, "AveragePool": _window,
          "Softmax": _softmax,
          "BatchNormalization": _batchnorm, "Split": _split, "Slice": _slice, "Transpose": _transpose,
          "Reshape": _reshape, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Pad": _pad, "Gather": _gather,
          "ReduceMean": _reduce, "ReduceL2": _reduce}
