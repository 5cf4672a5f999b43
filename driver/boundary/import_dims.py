"""The dims ONNX import puts on a model's values: shape inference's dims, renamed to the ones relsat's catalog derives.

ONNX's shape inference (and ONNX Runtime's symbolic one, where it runs) gives the values of a model over a dynamic
image size dims of their own: a fresh unknown dim past every strided Conv, an expression such as
``floor(2.0*floor(...))`` past a Resize.  The catalog's shape rules derive other codes for the same dims (the same
dim through an element-wise op, the derived symbol of a sliding window, a product dim; ``relations/dims.py``) and a
node whose rule disagrees with inference is kept opaque.  This module renames inference's dims to the catalog's:

- ``elementwise_dims``: where ONNX Runtime's symbolic inference does not run, an element-wise op's output takes the
  dims its inputs agree on;
- ``propagate_dims``: walking the graph in order, a dim inference gave an output is renamed to the dim the catalog's
  rule derives there (Conv and pools, ConvTranspose, broadcasting, Concat, Reshape, each output of a Split, ...),
  and a Resize by constant scales keeps its input's dims where a scale is 1.  Where a node *needs* two dims equal,
  inference's dim is unified with the other: exactly at a Concat (ONNX requires its other dims equal) and, as an
  assumption, at a broadcasting op whose inputs have two different dynamic dims at one position (a feature pyramid's
  Add of an upsampled map and a lateral one: equal wherever the model runs, unless one of them is 1 and broadcasts).
  The assumed nodes are named in a notice and the written model is verified at two bindings, as every model is.

A dim is renamed only when it is inference's own (not a graph input's dim, not a derived or product dim, whose codes
the catalog computes), and every occurrence of it is renamed alike.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from relsat.relations.catalog import for_node
from relsat.relations.dims import DERIVED_BASE, Symbols, deconv_dim, infer_dim, is_sym, window_dim
from relsat.relations.onnx_form import IMPORT_HOOKS, attr_value, norm_axis

# ops whose output 0 has the broadcast shape of their inputs, and ops whose output 0 has their first input's shape
BROADCASTING = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Equal", "Less",
                          "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Mod", "PRelu"})
SAME_SHAPE = frozenset({"Relu", "Sigmoid", "Tanh", "Clip", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu",
                        "Erf", "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Identity", "Cast", "Softplus",
                        "Softsign", "Mish", "Sign", "Ceil", "Floor", "Round", "Not", "Sin", "Cos", "Gelu",
                        "BatchNormalization", "InstanceNormalization", "LayerNormalization", "Softmax", "LogSoftmax",
                        "Dropout"})
_WINDOW_OPS = ("Conv", "MaxPool", "AveragePool")


def elementwise_dims(model: onnx.ModelProto, types: dict, symbols: Symbols) -> dict:
    """``types`` with the unknown dims of element-wise ops' outputs taken from their inputs, in graph order: an
    output dim that shape inference left anonymous is the dim its inputs agree on at that position (broadcasting:
    inputs of dim 1 aside; where they name different or unknown dims, it stays).  Where ONNX Runtime's symbolic
    inference does not run (PP-OCR's classifier: it stops at a Concat of axis 1), ONNX's inference gives every
    value past a Conv over a dynamic image size fresh dims, so ``x + 3`` had other dims than ``x`` and its node was
    kept opaque (78 of its nodes, none of its hard-swish chains rewritten)."""
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx") or not n.output or n.output[0] not in types:
            continue
        if n.op_type in BROADCASTING:
            ins = [i for i in n.input if i]
        elif n.op_type in SAME_SHAPE and n.input:
            ins = n.input[:1]
        else:
            continue
        dtype, shape = types[n.output[0]]
        given = [types.get(i, (None, None))[1] for i in ins]
        if shape is None or not any(symbols.anonymous(d) for d in shape) or any(s is None for s in given):
            continue
        rank = len(shape)
        if any(len(s) > rank for s in given):
            continue
        dims = list(shape)
        for k in range(rank):
            if not symbols.anonymous(dims[k]):
                continue
            at = {s[k - (rank - len(s))] for s in given if k >= rank - len(s)} - {1}
            if len(at) == 1:  # (an input's unknown dim too: the output's is the same size)
                dims[k] = next(iter(at))
        types[n.output[0]] = (dtype, dims)
    return types


def bcast(a: list, b: list) -> list | None:
    """Broadcast two shapes as the catalog's ``bcast`` does (symbols equal only to themselves)."""
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    out = []
    for x, y in zip(a, b):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return out


def _window_attrs(node: onnx.NodeProto, shapes: list) -> dict | None:
    """A Conv's, pool's or ConvTranspose's attributes as import reads them (the catalog's import hook resolves
    defaults and auto_pad), None where the hook leaves the node opaque."""
    attrs = {a.name: attr_value(a) for a in node.attribute}
    return attrs if IMPORT_HOOKS[node.op_type](None, node, attrs, [], shapes) else None


def _weight(node: onnx.NodeProto, x: list, types: dict) -> list | None:
    w = (types.get(node.input[1]) or (None, None))[1] if len(node.input) > 1 else None
    return None if not w or len(w) != len(x) or any(is_sym(d) for d in w) else w


def window_shape(node: onnx.NodeProto, x: list, types: dict) -> list | None:
    """The output shape of a Conv or pool over ``x`` (``dims.window_dim`` per spatial dim), None when unknown."""
    shapes, channels = [x], x[1]
    if node.op_type == "Conv":
        w = _weight(node, x, types)
        if w is None:
            return None
        shapes, channels = [x, w], w[0]
    attrs = _window_attrs(node, shapes) if len(x) >= 3 else None
    if attrs is None:
        return None
    k, s, p, d = attrs["kernel_shape"], attrs["strides"], attrs["pads"], attrs["dilations"]
    n = len(k)
    dims = [window_dim(x[j + 2], k[j], s[j], p[j], p[j + n], d[j], int(attrs.get("ceil_mode", 0))) for j in range(n)]
    return None if any(v is None for v in dims) else [x[0], channels, *dims]


def deconv_shape(node: onnx.NodeProto, x: list, types: dict) -> list | None:
    """The output shape of a ConvTranspose over ``x`` (``dims.deconv_dim`` per spatial dim), None when unknown."""
    w = _weight(node, x, types)
    attrs = _window_attrs(node, [x, w]) if w is not None and len(x) >= 3 else None
    if attrs is None:
        return None
    k, s, p, d, op = (attrs[a] for a in ("kernel_shape", "strides", "pads", "dilations", "output_padding"))
    n = len(k)
    dims = [deconv_dim(x[j + 2], k[j], s[j], p[j], p[j + n], d[j], op[j]) for j in range(n)]
    return None if any(v is None for v in dims) else [x[0], w[1] * int(attrs.get("group", 1)), *dims]


def reshape_dims(x: list, out: list) -> list | None:
    """A Reshape's output dims with the one dim inference could not name derived from its data
    (``dims.infer_dim``: the element count left): a number where the output's other dynamic dims are the
    data's (ViT's patches, ``[batch, 768, 14, 14]`` to ``[batch, 768, -1]``: inference gave ``[batch, 768,
    unk]``, which is 196); the data's dynamic dim, or that dim times a number (a product dim: Swin's windows,
    ``[batch, 8, 7, 8, 7, 96]`` to ``[-1, 7, 7, 96]`` is ``batch * 64``), where the output has no other."""
    unknown = [d for d in out if is_sym(d) and d not in x]
    if len(unknown) != 1 or out.count(unknown[0]) != 1:
        return None
    u = unknown[0]
    got = infer_dim(x, [d for d in out if d != u])
    return None if got is None else [got if d == u else d for d in out]


def _constant_arrays(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """The graph's initializers and Constant nodes' tensors, by value name."""
    out = {t.name: t for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = n.attribute[0].t
    return {name: numpy_helper.to_array(t) for name, t in out.items()}


def _resize_shape(node: onnx.NodeProto, x: list, out: list, consts: dict) -> list | None:
    """A Resize by constant scales keeps its input's dim wherever a scale is 1 (opset 10's ``scales`` is input 1;
    ``sizes``, and ``tf_crop_and_resize``'s crop by ``roi``, aside); the other dims stay as inference gave them."""
    attrs = {a.name: attr_value(a) for a in node.attribute}
    at = 1 if len(node.input) == 2 else 2
    scales = consts.get(node.input[at]) if len(node.input) > at and node.input[at] else None
    if (scales is None or scales.size != len(x) or len(node.input) > 3 and node.input[3]
            or attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize"):
        return None
    return [d if s == 1.0 else o for d, o, s in zip(x, out, scales.reshape(-1).tolist())]


class _Renames:
    """The renaming of inference's dims: ``sub`` maps a dim to the one it stands for (followed to its end), and
    ``assumed`` names the nodes where two dims were taken as equal because the node needs them so."""

    def __init__(self, input_syms: set[int]):
        self.input_syms = input_syms
        self.sub: dict[int, int] = {}
        self.assumed: list[str] = []

    def find(self, d):
        while d in self.sub:
            d = self.sub[d]
        return d

    def own(self, d) -> bool:
        """Whether ``d`` is inference's own dim, free to rename: a symbol that is neither a graph input's dim nor
        one the catalog computes (derived, product)."""
        return is_sym(d) and d > DERIVED_BASE and d not in self.input_syms

    def unify(self, a, b) -> bool:
        """Take the dims ``a`` and ``b`` as equal, renaming one of inference's own into the other; False when
        neither is inference's own (or one is a number: a dim that may be 1)."""
        a, b = self.find(a), self.find(b)
        if a == b:
            return True
        if not (is_sym(a) and is_sym(b)) or not (self.own(a) or self.own(b)):
            return False
        if self.own(a) and (not self.own(b) or a < b):
            a, b = b, a  # rename a later dim of inference into an earlier one (codes fall as symbols are added)
        self.sub[b] = a
        return True


def propagate_dims(graph: onnx.GraphProto, types: dict, symbols: Symbols, inputs: set[str]) -> tuple[dict, list[str]]:
    """``types`` with inference's dims renamed to the catalog's (module docstring), and the names of the nodes
    where two dims were assumed equal. Walking the graph in order, a dim inference gave an output is renamed to
    the dim the catalog's rule derives; the rest is left as inference gave it (and checked against the rules at
    insertion)."""
    input_syms = {d for n in inputs for d in ((types.get(n) or (None, None))[1] or ()) if is_sym(d)}
    names = _Renames(input_syms)
    consts: dict | None = None

    def shape_of(name):
        shape = (types.get(name) or (None, None))[1] if name else None
        return None if shape is None else [names.find(d) for d in shape]

    for node in graph.node:
        op = for_node(node.domain, node.op_type)
        if node.op_type == "Resize" and node.domain in ("", "ai.onnx") and op is None:
            x, out = shape_of(node.input[0]), shape_of(node.output[0])
            if x and out and len(x) == len(out):
                consts = _constant_arrays(graph) if consts is None else consts
                got = _resize_shape(node, x, out, consts)
                for inferred, d in zip(out, got or ()):
                    if names.own(inferred) and inferred != d:
                        names.sub[inferred] = d
            continue
        if op is None or op.domain or not node.output:
            continue
        x = shape_of(node.input[0]) if node.input else None
        if op.op_type == "Split" and x:  # each output: its input's dims but along the axis
            k = norm_axis(next((attr_value(a) for a in node.attribute if a.name == "axis"), 0), len(x))
            for o in node.output:
                out = shape_of(o)
                if out and len(out) == len(x):
                    _rename(names, symbols, out, x[:k] + [out[k]] + x[k + 1:])
            continue
        if len(node.output) > 1 and any(node.output[1:]):
            continue
        out = shape_of(node.output[0])
        if not x or not out:
            continue
        if op.op_type in _WINDOW_OPS:
            got = window_shape(node, x, types) if len(x) >= 3 else None
        elif op.op_type == "ConvTranspose":
            got = deconv_shape(node, x, types)
        elif op.op_type == "GlobalAveragePool":
            got = x[:2] + [1] * (len(x) - 2)
        elif "bcast(s_a, s_b)" in (op.shape or "") and len(node.input) == 2:
            y = shape_of(node.input[1])
            got = bcast(x, y) if y is not None else None
            if got is None and y is not None and _unify_broadcast(names, x, y):
                names.assumed.append(node.name or node.output[0])
                got = bcast(shape_of(node.input[0]), shape_of(node.input[1]))
        elif op.op_type == "Concat":
            got = _concat_shape(node, [shape_of(i) for i in node.input if i], out, names)
        elif op.shape == "s_x" or op.op_type == "BatchNormalization":
            got = x
        elif op.op_type == "Reshape":
            got = reshape_dims(x, out)
        else:
            continue
        if got is not None and len(got) == len(out):
            _rename(names, symbols, out, got)
    if not names.sub:
        return types, names.assumed
    return ({name: (dt, None if shape is None else [names.find(d) for d in shape])
             for name, (dt, shape) in types.items()}, names.assumed)


def _rename(names: _Renames, symbols: Symbols, out: list, got: list) -> None:
    """Rename each dim inference gave an output (``out``) to the one the catalog derives there (``got``), where it is
    a symbol not yet renamed and not a graph input's."""
    for inferred, d in zip(out, got):
        inferred = names.find(inferred)
        if is_sym(inferred) and inferred != d and inferred not in names.input_syms and inferred not in names.sub:
            names.sub[inferred] = d
            if is_sym(d) and d not in symbols.by_code:
                symbols.add_derived(d)


def _unify_broadcast(names: _Renames, x: list, y: list) -> bool:
    """At a broadcasting op of inputs of one rank whose dims differ only where both are symbols: those dims taken
    as equal (the op fails at sizes where they differ, neither being 1). False, renaming nothing, where some
    position cannot be unified."""
    if len(x) != len(y):
        return False
    pairs = [(a, b) for a, b in zip(x, y) if a != b and 1 not in (a, b)]
    if not pairs or not all(is_sym(a) and is_sym(b) and (names.own(a) or names.own(b)) for a, b in pairs):
        return False
    return all(names.unify(a, b) for a, b in pairs)


def _concat_shape(node: onnx.NodeProto, shapes: list, out: list, names: _Renames) -> list | None:
    """A Concat's output shape, its inputs' other dims unified first (ONNX requires them equal): the first input's
    dims, and along the axis the sum where every input's is a number (else inference's)."""
    if not shapes or any(s is None or len(s) != len(out) for s in shapes):
        return None
    axis = norm_axis(next((attr_value(a) for a in node.attribute if a.name == "axis"), 0), len(out))
    for s in shapes[1:]:
        for k, (a, b) in enumerate(zip(shapes[0], s)):
            if k != axis and a != b and not names.unify(a, b):
                return None
    first = [names.find(d) for d in shapes[0]]
    along = [s[axis] for s in shapes]
    first[axis] = sum(along) if not any(is_sym(d) for d in along) else out[axis]
    return first
