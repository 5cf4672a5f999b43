"""ONNX import: from a model file to e-graph tables.

Owns reading and checking a model file (``load_model``, ``check_ort_loadable``),
specializing dynamic input dims, and translating the graph into the e-graph
(``import_model`` -> ``ImportResult``): initializers and Constant nodes become
deduplicated Weight leaves, graph inputs Input leaves, and each node either a
catalog node (attributes defaulted and normalized, lifted inputs turned into
attributes, shapes checked against ONNX shape inference) or an opaque node that
keeps its NodeProto (``add_opaque``).  Nodes are inserted in batches per
(operator, topological level).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

from relsat.relations.catalog import BY_TYPE, REQUIRED, OpDef
from relsat.relations.egraph import EGraph, ShapeConflict

from .errors import RelsatError
from .verify import ort_error, ort_session

MIN_OPSET, MAX_OPSET = 7, 26
_BATCH_NAMES = {"n", "b", "bs", "batch", "batch_size", "batchsize", "batch_dim"}
_RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
               "Bernoulli", "Dropout"}  # never folded, even with constant inputs
_SMALL_TENSOR = 1024  # initializers up to this many elements are kept for shape inference's data propagation


@dataclass
class ImportResult:
    egraph: EGraph
    outputs: list[tuple[str, int]]  # graph output name -> e-class
    inputs: list[tuple[str, int, list[int]]]  # graph input name, ONNX dtype, (specialized) shape
    notices: list[str]
    opset_imports: dict[str, int]  # domain -> version
    ir_version: int
    metadata: dict[str, str]
    producer: tuple[str, str]  # producer name, version
    graph_name: str
    doc_string: str
    node_count: int
    values: dict[str, int] = field(default_factory=dict)  # every ONNX value name -> e-class
    specialized: dict[str, list[int]] = field(default_factory=dict)  # inputs whose dynamic dims were fixed
    output_dtypes: dict[str, int] = field(default_factory=dict)
    functions: list = field(default_factory=list)  # model-local FunctionProtos (opaque nodes may call them)
    domain: str = ""
    model_version: int = 0


# ------------------------------------------------------------------ loading
def walk_graphs(graph: onnx.GraphProto):
    """The graph and all its nested subgraphs."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            for sub in ([a.g] if a.type == AttributeProto.GRAPH else a.graphs):
                yield from walk_graphs(sub)


def _tensors(model: onnx.ModelProto):
    for g in walk_graphs(model.graph):
        yield from g.initializer
        for s in g.sparse_initializer:
            yield from (s.values, s.indices)
        for node in g.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors


def load_model(path) -> onnx.ModelProto:
    """Read, check and return a model file (external data loaded); RelsatError when the file is
    missing, not ONNX, points outside its folder for external data, fails the ONNX checker, or
    cannot be loaded by ONNX Runtime."""
    p = Path(path)
    if not p.exists():
        raise RelsatError(f"{p}: no such file")
    if not p.is_file():
        raise RelsatError(f"{p}: not a file")
    try:
        model = onnx.load_model(str(p), load_external_data=False)
    except Exception as e:
        raise RelsatError(f"{p}: not an ONNX model (cannot parse it: {str(e) or type(e).__name__})") from None
    if not model.HasField("graph") or model.ir_version <= 0 or not model.opset_import:
        raise RelsatError(f"{p}: not an ONNX model (no graph, IR version or opset import)")
    base = p.resolve().parent
    external = False
    for t in _tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        external = True
        loc = {e.key: e.value for e in t.external_data}.get("location", "")
        target = (base / loc).resolve()
        if not loc or base not in target.parents:
            raise RelsatError(f"{p}: tensor '{t.name}' has external data at '{loc}', outside the model's folder")
        if not target.is_file():
            raise RelsatError(f"{p}: tensor '{t.name}' has external data at '{loc}', which does not exist")
    if external:
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(base))
        except Exception as e:
            raise RelsatError(f"{p}: cannot read external data: {str(e).splitlines()[0]}") from None
    try:
        onnx.checker.check_model(model if model.ByteSize() < 2_000_000_000 else str(p))
    except Exception as e:
        raise RelsatError(f"{p}: fails the ONNX checker: {str(e).strip().splitlines()[0]}") from None
    check_ort_loadable(p)
    return model


def check_ort_loadable(model_or_path) -> None:
    """RelsatError unless ONNX Runtime (CPU) can create a session for the model."""
    label = (model_or_path.graph.name or "model") if isinstance(model_or_path, onnx.ModelProto) else model_or_path
    try:
        ort_session(model_or_path, optimize=False)
    except Exception as e:
        raise RelsatError(f"{label}: ONNX Runtime cannot load the model: {ort_error(e)}") from None


# ----------------------------------------------------------- input shapes
def _is_batch_dim(param: str, index: int) -> bool:
    return (not param and index == 0) or param.lower() in _BATCH_NAMES


def _fmt_dims(dims) -> str:
    return ",".join(str(d) if isinstance(d, int) else (d or f"D{i}") for i, d in enumerate(dims))


def _input_shapes(inputs, overrides: dict | None):
    """Concrete shapes for the graph inputs, the notices about defaulted dims, and the inputs whose
    declared shape was specialized."""
    names = [v.name for v in inputs]
    for name in overrides or {}:
        if name not in names:
            raise RelsatError(f"--input-shape names '{name}', which is not an input of the model "
                              f"(inputs: {', '.join(names) or 'none'})")
    shapes, notices, specialized = {}, [], {}
    for v in inputs:
        if not v.type.HasField("tensor_type") or not v.type.tensor_type.elem_type:
            raise RelsatError(f"input '{v.name}': only tensor inputs are supported")
        tt = v.type.tensor_type
        declared = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim]
        if overrides and v.name in overrides:
            dims = [int(d) for d in overrides[v.name]]
            if tt.HasField("shape") and (len(dims) != len(declared) or any(
                    isinstance(d, int) and d != w for d, w in zip(declared, dims))) or min(dims, default=0) < 0:
                raise RelsatError(f"--input-shape {v.name}={_fmt_dims(dims)} does not fit the declared shape "
                                  f"[{_fmt_dims(declared)}] of input '{v.name}'")
        elif not tt.HasField("shape"):
            raise RelsatError(f"input '{v.name}' has no declared shape; set it with --input-shape {v.name}=D0,D1,...")
        else:
            dims = []
            for i, d in enumerate(declared):
                if isinstance(d, int):
                    dims.append(d)
                elif _is_batch_dim(d, i):
                    dims.append(1)
                    notices.append(f"input '{v.name}': dynamic dim {i} ({d or 'unnamed'}) set to 1 as a batch dim; "
                                   f"choose another size with --input-shape {v.name}=...")
                else:
                    raise RelsatError(f"input '{v.name}': dim {i} ({d or 'unnamed'}) is dynamic; set it with "
                                      f"--input-shape {v.name}={_fmt_dims(declared)}")
        if dims != declared:
            specialized[v.name] = dims
        shapes[v.name] = dims
    return shapes, notices, specialized


def _infer_types(model: onnx.ModelProto, shapes: dict) -> dict[str, tuple[int | None, list[int] | None]]:
    """ONNX dtype and static shape (None when unknown) of every value, by ONNX shape inference on
    a light copy of the model with the fixed input shapes (big initializers passed as inputs)."""
    g = model.graph
    listed = {v.name for v in g.input}
    inputs = [helper.make_tensor_value_info(v.name, v.type.tensor_type.elem_type, shapes[v.name])
              if v.name in shapes else v for v in g.input]
    small = []
    for t in g.initializer:
        if np.prod(t.dims, dtype=np.int64) <= _SMALL_TENSOR:
            small.append(t)
        elif t.name not in listed:
            inputs.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    light = helper.make_graph(g.node, g.name, inputs, g.output, small, sparse_initializer=g.sparse_initializer)
    light_model = helper.make_model(light, opset_imports=model.opset_import, ir_version=model.ir_version,
                                    functions=model.functions)
    inferred = onnx.shape_inference.infer_shapes(light_model, strict_mode=False, data_prop=True)
    types = {t.name: (t.data_type, list(t.dims)) for t in g.initializer}
    for v in [*inferred.graph.input, *inferred.graph.output, *inferred.graph.value_info]:
        if not v.type.HasField("tensor_type"):
            continue
        tt = v.type.tensor_type
        dims = tt.shape.dim
        known = tt.HasField("shape") and all(d.HasField("dim_value") for d in dims)
        types[v.name] = (tt.elem_type or None, [d.dim_value for d in dims] if known else None)
    return types


# ------------------------------------------------------------ node helpers
def outer_names(node: onnx.NodeProto) -> list[str]:
    """Names of outer-scope values that the node's subgraphs read (sorted): implicit inputs."""

    def refs(graph) -> set[str]:
        local = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {
            o for n in graph.node for o in n.output}
        used = {v.name for v in graph.output}
        for n in graph.node:
            used.update(i for i in n.input if i)
            used.update(sub_refs(n))
        return used - local

    def sub_refs(n) -> set[str]:
        out = set()
        for a in n.attribute:
            for sub in ([a.g] if a.type == AttributeProto.GRAPH else a.graphs):
                out |= refs(sub)
        return out

    return sorted(sub_refs(node))


def _attr_value(a: AttributeProto):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def _constant_value(node: onnx.NodeProto):
    """(array, ONNX dtype) of a Constant node, or None for sparse/string forms (kept opaque)."""
    if len(node.attribute) != 1:
        return None
    a = node.attribute[0]
    if a.name == "value" and a.t.data_type != onnx.TensorProto.STRING:
        return numpy_helper.to_array(a.t), a.t.data_type
    forms = {"value_float": (np.float32, 1), "value_floats": (np.float32, 1),
             "value_int": (np.int64, 7), "value_ints": (np.int64, 7)}
    if a.name in forms:
        dt, onnx_dt = forms[a.name]
        return np.array(_attr_value(a), dtype=dt), onnx_dt
    return None


def _digest(arr: np.ndarray, dtype: int) -> str:
    h = hashlib.sha1(f"{dtype}|{list(arr.shape)}|".encode())
    h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def _agrees(want, shape, dtype) -> bool:
    """Does an e-class's shape and dtype match ONNX inference's (dtype, shape), where known?"""
    want_dtype, want_shape = want or (None, None)
    return (want_shape is None or want_shape == shape) and (want_dtype is None or want_dtype == dtype)


def _norm(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


# Per-operator normalization: (importer, node, attrs, data input names, their shapes) -> representable?
def _window(imp, node, attrs, data, shapes) -> bool:
    x = shapes[0]
    sp = len(x) - 2
    k = attrs.get("kernel_shape") or (list(shapes[1][2:]) if node.op_type == "Conv" and len(shapes) > 1 else None)
    if sp < 1 or not k or len(k) != sp:
        return False
    s = attrs.get("strides") or [1] * sp
    d = attrs.get("dilations") or [1] * sp
    auto = attrs.pop("auto_pad", "NOTSET")
    pads = attrs.get("pads") or [0] * (2 * sp)
    if auto == "VALID":
        pads = [0] * (2 * sp)
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (-(-x[i + 2] // s[i]) - 1) * s[i] + (k[i] - 1) * d[i] + 1 - x[i + 2]) for i in range(sp)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        pads = small + big if auto == "SAME_UPPER" else big + small
    elif auto != "NOTSET":
        return False
    attrs.pop("storage_order", None)  # only changes MaxPool's Indices output, which must be unused
    attrs.update(kernel_shape=list(k), strides=list(s), dilations=list(d), pads=list(pads))
    return True


def _softmax(imp, node, attrs, data, shapes) -> bool:
    rank = len(shapes[0])
    axis = _norm(attrs.get("axis", -1 if imp.opset >= 13 else 1), rank)
    attrs["axis"] = axis
    return imp.opset >= 13 or axis == rank - 1  # before 13, Softmax flattens at axis: same only for the last


def _batchnorm(imp, node, attrs, data, shapes) -> bool:
    inference = attrs.pop("training_mode", 0) == 0 and attrs.pop("spatial", 1) == 1
    return inference and not any(node.output[1:])


def _split(imp, node, attrs, data, shapes) -> bool:
    x = shapes[0]
    axis = _norm(attrs.get("axis", 0), len(x))
    if not 0 <= axis < len(x):
        return False
    d, k, num = x[axis], len(node.output), attrs.pop("num_outputs", None)
    split = attrs.get("split")
    if split is None and num:
        chunk = -(-d // num)
        split = [chunk] * (num - 1) + [d - chunk * (num - 1)]
    elif split is None:
        split = [d // k] * k if d % k == 0 else None
    attrs.update(axis=axis, split=split)
    return split is not None and len(split) == k and min(split) >= 0


def _slice(imp, node, attrs, data, shapes) -> bool:
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
        a = _norm(a, len(x))
        if not 0 <= a < len(x) or st == 0 or a in rows:
            return False
        d = x[a]
        s, e = _norm(s, d), _norm(e, d)
        rows[a] = (_clamp(s, 0, d), _clamp(e, 0, d), st) if st > 0 else (_clamp(s, 0, d - 1), _clamp(e, -1, d - 1), st)
    axes = sorted(rows)
    attrs.update(axes=axes, starts=[rows[a][0] for a in axes], ends=[rows[a][1] for a in axes],
                 steps=[rows[a][2] for a in axes])
    return True


def _transpose(imp, node, attrs, data, shapes) -> bool:
    attrs["perm"] = [_norm(p, len(shapes[0])) for p in attrs.get("perm", range(len(shapes[0]) - 1, -1, -1))]
    return True


def _reshape(imp, node, attrs, data, shapes) -> bool:
    x, zero = shapes[0], attrs.pop("allowzero", 0)
    target = attrs.get("shape")
    if target is None:
        return False
    out = [x[i] if t == 0 and not zero and i < len(x) else t for i, t in enumerate(target)]
    if out.count(-1) == 1:
        rest = int(np.prod([t for t in out if t != -1], dtype=np.int64))
        if rest == 0 or int(np.prod(x, dtype=np.int64)) % rest:
            return False
        out[out.index(-1)] = int(np.prod(x, dtype=np.int64)) // rest
    attrs["shape"] = out
    return min(out, default=0) >= 0 and not (0 in out and not zero)


def _squeeze(imp, node, attrs, data, shapes) -> bool:
    x = shapes[0]
    axes = attrs.get("axes")
    axes = [i for i, d in enumerate(x) if d == 1] if axes is None else sorted({_norm(a, len(x)) for a in axes})
    attrs["axes"] = axes
    return all(0 <= a < len(x) and x[a] == 1 for a in axes)


def _unsqueeze(imp, node, attrs, data, shapes) -> bool:
    axes = attrs.get("axes")
    if axes is None:
        return False
    rank = len(shapes[0]) + len(axes)
    attrs["axes"] = sorted({_norm(a, rank) for a in axes})
    return len(attrs["axes"]) == len(axes) and all(0 <= a < rank for a in attrs["axes"])


def _pad(imp, node, attrs, data, shapes) -> bool:
    rank = len(shapes[0])
    pads = attrs.get("pads")
    if len(data) > 1:  # opset 18: the axes that pads refer to
        axes = imp.const_ints(data.pop())
        shapes.pop()
        if axes is None or pads is None or len(pads) != 2 * len(axes):
            return False
        full = [0] * (2 * rank)
        for j, a in enumerate(axes):
            full[_norm(a, rank)], full[_norm(a, rank) + rank] = pads[j], pads[j + len(axes)]
        pads = full
    attrs["pads"] = pads
    return pads is not None and len(pads) == 2 * rank


_HOOKS = {"Conv": _window, "MaxPool": _window, "AveragePool": _window, "Softmax": _softmax,
          "BatchNormalization": _batchnorm, "Split": _split, "Slice": _slice, "Transpose": _transpose,
          "Reshape": _reshape, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Pad": _pad}


# ---------------------------------------------------------- opaque nodes
def add_opaque(g: EGraph, nodes, inputs, output_shapes, output_dtypes, *, ts: int = 0) -> list[list[int]]:
    """Insert opaque nodes in one batch of set-oriented SQL; returns each node's e-class per output
    position (-1 where the output is omitted).

    ``nodes``: NodeProtos, kept verbatim in ``opaque_nodes``; ``inputs``: per node the e-classes of
    its non-empty inputs, then of the outer values its subgraphs read (``outer_names`` order);
    ``output_shapes`` / ``output_dtypes``: per node and output, a shape list / ONNX dtype or None.
    A single-output node's ``out`` is a tensor e-class; a multi-output node's is a tuple e-class
    whose outputs get getitem nodes.  A node is constant when it has inputs, all constant, and is
    not random."""
    if not len(nodes):
        return []
    frame = {
        "rid": np.arange(len(nodes), dtype=np.int64),
        "node": np.array([n.SerializeToString() for n in nodes], dtype=object),
        "op_type": np.array([n.op_type for n in nodes], dtype=object),
        "domain": np.array([n.domain for n in nodes], dtype=object),
        "n_outputs": np.array([len(n.output) for n in nodes], dtype=np.int32),
        "present": np.array([json.dumps([i for i, o in enumerate(n.output) if o]) for n in nodes], dtype=object),
        "inputs": np.array([json.dumps([int(c) for c in ins]) for ins in inputs], dtype=object),
        "shapes": np.array([json.dumps(s) for s in output_shapes], dtype=object),
        "dtypes": np.array([json.dumps(d) for d in output_dtypes], dtype=object),
    }
    random = ", ".join(f"'{op}'" for op in sorted(_RANDOM_OPS))
    c = g.con
    c.register("_opaque_batch", frame)
    try:
        c.execute(
            "CREATE OR REPLACE TEMP TABLE _opq AS SELECT *, (len(inputs) > 0 AND NOT (op_type IN (" + random + ") "
            "AND domain = '') AND NOT EXISTS (SELECT 1 FROM unnest(inputs) u(i) LEFT JOIN eclass k ON k.id = u.i "
            "WHERE k.is_const IS NOT true)) AS is_const FROM (SELECT rid, (SELECT coalesce(max(proto), 0) "
            "FROM opaque_nodes) + rid + 1 AS proto, node, op_type, domain, n_outputs, "
            "present::VARCHAR::INTEGER[] AS present, inputs::VARCHAR::BIGINT[] AS inputs, "
            "shapes::VARCHAR::BIGINT[][] AS shapes, dtypes::VARCHAR::INTEGER[] AS dtypes, "
            "nextval('node_seq') AS id, nextval('class_seq') AS out FROM _opaque_batch)")
    finally:
        c.unregister("_opaque_batch")
    c.execute("INSERT INTO opaque_nodes SELECT proto, op_type, domain, node, n_outputs, shapes, dtypes FROM _opq")
    c.execute(f"INSERT INTO op_opaque (id, proto, inputs, out, ts) SELECT id, proto, inputs, out, {int(ts)} FROM _opq")
    c.execute(
        "INSERT INTO eclass (id, shape, dtype, is_const, tuple_shapes, tuple_dtypes, ts) SELECT out, "
        "CASE WHEN n_outputs = 1 THEN shapes[1] END, CASE WHEN n_outputs = 1 THEN dtypes[1] END, is_const, "
        f"CASE WHEN n_outputs <> 1 THEN shapes END, CASE WHEN n_outputs <> 1 THEN dtypes END, {int(ts)} FROM _opq")
    c.execute(
        "CREATE OR REPLACE TEMP TABLE _opq_items AS SELECT nextval('node_seq') AS id, rid, out AS t, i, "
        "nextval('class_seq') AS cls, shapes[i + 1] AS shape, dtypes[i + 1] AS dtype, is_const FROM "
        "(SELECT rid, out, shapes, dtypes, is_const, unnest(present) AS i FROM _opq WHERE n_outputs <> 1)")
    c.execute(f'INSERT INTO op_getitem (id, t, "index", out, ts) SELECT id, t, i, cls, {int(ts)} FROM _opq_items')
    c.execute("INSERT INTO eclass (id, shape, dtype, is_const, tuple_shapes, tuple_dtypes, ts) "
              f"SELECT cls, shape, dtype, is_const, NULL, NULL, {int(ts)} FROM _opq_items")
    g.live.update({"op_opaque", "op_getitem"})
    result = [[-1] * len(n.output) for n in nodes]
    for rid, out in c.execute("SELECT rid, out FROM _opq WHERE n_outputs = 1").fetchall():
        result[rid][0] = out
    for rid, i, cls in c.execute("SELECT rid, i, cls FROM _opq_items").fetchall():
        result[rid][i] = cls
    return result


# ----------------------------------------------------------------- import
@dataclass
class _Item:
    node: onnx.NodeProto
    op: OpDef
    children: dict
    attrs: dict
    out: int = -1  # the e-class once inserted (a tuple e-class for Split)


class _Importer:
    def __init__(self, g: EGraph, model: onnx.ModelProto, opset: int, types: dict):
        self.g, self.opset, self.types = g, opset, types
        self.cls: dict[str, int] = {}  # ONNX value name -> e-class
        self.consts: dict[str, np.ndarray] = {}
        self.notices: list[str] = []
        self.opaque_ops: Counter = Counter()
        graph = model.graph
        self.used = {o.name for o in graph.output} | {
            i for n in graph.node for i in [*n.input, *outer_names(n)] if i}

    def shape(self, name: str):
        return (self.types.get(name) or (None, None))[1]

    def const_ints(self, name: str):
        v = self.consts.get(name)
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]

    def klass(self, name: str, reader: str) -> int:
        if name not in self.cls:
            raise RelsatError(f"{reader} reads '{name}', which no node, input or initializer defines")
        return self.cls[name]

    # leaves
    def add_weights(self, items: list[tuple[str, np.ndarray, int]]) -> None:
        g = self.g
        by_digest = {d: r for d, r in g.sql("SELECT digest, ref FROM weights") if r in g.tensors}
        next_ref = max([0, *g.tensors, *(r for (r,) in g.sql("SELECT ref FROM weights"))]) + 1
        rows, ref_of = [], {}
        for name, arr, dtype in items:
            d = _digest(arr, dtype)
            if d not in by_digest:
                by_digest[d] = next_ref
                g.tensors[next_ref] = arr
                rows.append((next_ref, name, dtype, json.dumps(list(arr.shape)), d))
                next_ref += 1
            ref_of[name] = by_digest[d]
            self.consts[name] = arr
        if rows:
            refs, names, dtypes, shapes, digests = zip(*rows)
            g.con.register("_wbatch", {"ref": np.array(refs, dtype=np.int64), "name": np.array(names, dtype=object),
                                       "dtype": np.array(dtypes, dtype=np.int32),
                                       "shape": np.array(shapes, dtype=object),
                                       "digest": np.array(digests, dtype=object)})
            try:
                g.con.execute("INSERT INTO weights SELECT ref, name, dtype, shape::VARCHAR::BIGINT[], digest FROM _wbatch")
            finally:
                g.con.unregister("_wbatch")
        refs = sorted(set(ref_of.values()))
        if not refs:
            return
        meta = dict((r, (dt, s)) for r, dt, s in g.sql(
            "SELECT ref, dtype, shape FROM weights WHERE ref IN (SELECT unnest(?::BIGINT[]))", [refs]))
        ids = g.add("Weight", attrs={"ref": np.array(refs, dtype=np.int64),
                                     "shape": np.array([json.dumps(meta[r][1]) for r in refs], dtype=object),
                                     "dtype": np.array([meta[r][0] for r in refs], dtype=np.int64)})
        cls_of = dict(zip(refs, ids.tolist()))
        self.cls.update({name: cls_of[r] for name, r in ref_of.items()})

    def add_inputs(self, inputs: list[tuple[str, int, list[int]]]) -> None:
        if inputs:
            names, dtypes, shapes = zip(*inputs)
            ids = self.g.add("Input", attrs={"name": np.array(names, dtype=object),
                                             "shape": np.array([json.dumps(s) for s in shapes], dtype=object),
                                             "dtype": np.array(dtypes, dtype=np.int64)})
            self.cls.update(zip(names, ids.tolist()))

    # nodes
    def spec(self, node: onnx.NodeProto) -> _Item | None:
        """The catalog form of a node, or None when it must stay opaque."""
        op = BY_TYPE.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if op is None or op.leaf or op.op_type == "getitem":
            return None
        attrs = {a.name: _attr_value(a) for a in node.attribute}
        lifted = {lf.input_index: lf for lf in op.lifted}
        data = []
        for i, name in enumerate(node.input):
            if i not in lifted:
                data.append(name)
            elif name:
                kind = op.attr(lifted[i].attr).kind
                v = self.consts.get(name)
                if v is not None and (kind != "float" or np.size(v) == 1):
                    attrs[lifted[i].attr] = float(np.asarray(v).reshape(-1)[0]) if kind == "float" else self.const_ints(name)
                elif op.op_type == "Reshape" and self.shape(node.output[0]) is not None:
                    attrs.update(shape=self.shape(node.output[0]), allowzero=1)  # input shapes are fixed
                else:
                    return None
        shapes = [self.shape(n) if n else None for n in data]
        if any(n and s is None for n, s in zip(data, shapes)) or not data or not data[0]:
            return None
        hook = _HOOKS.get(op.op_type)
        if hook and not hook(self, node, attrs, data, shapes):
            return None
        if set(attrs) - {a.name for a in op.attrs}:
            return None  # an attribute relsat cannot represent
        for a in op.attrs:
            if a.name not in attrs:
                if a.default is REQUIRED:
                    return None
                attrs[a.name] = a.default
        if "axis" in attrs:
            attrs["axis"] = _norm(attrs["axis"], len(shapes[0]))
        if not op.is_tuple and (not node.output or not node.output[0] or any(o in self.used for o in node.output[1:] if o)):
            return None
        if op.variadic:
            if not all(data):
                return None
            children = {op.inputs[0].column: [self.cls[n] for n in data]}
        else:
            if len(data) > len(op.inputs):
                return None
            children = {}
            for k, inp in enumerate(op.inputs):
                name = data[k] if k < len(data) else ""
                if not name and not inp.optional:
                    return None
                children[inp.column] = self.cls[name] if name else -1
        return _Item(node, op, children, attrs)

    def _disagree(self, items: list[_Item], ids: np.ndarray) -> list[int]:
        """Rows whose e-class shape or dtype differs from ONNX shape inference."""
        rows = {r[0]: r[1:] for r in self.g.sql(
            "SELECT id, shape, dtype, tuple_shapes, tuple_dtypes FROM eclass WHERE id IN (SELECT unnest(?::BIGINT[]))",
            [ids.tolist()])}
        bad = []
        for i, (it, c) in enumerate(zip(items, ids.tolist())):
            shape, dtype, tshapes, tdtypes = rows[c]
            got = list(zip(tshapes, tdtypes)) if it.op.is_tuple else [(shape, dtype)]
            outs = list(it.node.output) if it.op.is_tuple else [it.node.output[0]]
            if len(got) != len(outs) or not all(_agrees(self.types.get(o), s, d) for o, (s, d) in zip(outs, got)):
                bad.append(i)
        return bad

    def insert(self, op: OpDef, items: list[_Item]) -> list[_Item]:
        """Add a batch of catalog nodes; returns the items that must become opaque instead."""
        con = self.g.con
        children = {}
        for inp in op.inputs:
            col = [it.children[inp.column] for it in items]
            children[inp.column] = col if inp.variadic else np.array(col, dtype=np.int64)
        attrs = {}
        for a in op.attrs:
            col = [it.attrs[a.name] for it in items]
            attrs[a.name] = (np.array([json.dumps([int(v) for v in x]) for x in col], dtype=object) if a.kind == "ints"
                             else np.array(col, dtype={"int": np.int64, "float": np.float64}.get(a.kind, object)))
        con.execute("BEGIN TRANSACTION")
        try:
            ids = self.g.add(op.op_type, children, attrs, n=len(items))
            bad = self._disagree(items, ids)
        except ShapeConflict:
            ids, bad = None, None
        except BaseException:
            con.execute("ROLLBACK")
            raise
        if bad == []:
            con.execute("COMMIT")
            for it, c in zip(items, ids.tolist()):
                it.out = c
                if not op.is_tuple:
                    self.cls[it.node.output[0]] = c
            return []
        con.execute("ROLLBACK")
        if len(items) == 1:
            return items
        if bad is None:  # some row's shape rule failed: find it by bisection
            half = len(items) // 2
            return self.insert(op, items[:half]) + self.insert(op, items[half:])
        good = [it for i, it in enumerate(items) if i not in set(bad)]
        return [items[i] for i in bad] + (self.insert(op, good) if good else [])

    def run(self, nodes: list[onnx.NodeProto]) -> None:
        level_of: dict[str, int] = {}
        levels = defaultdict(list)
        for node in nodes:
            lvl = 1 + max((level_of.get(n, 0) for n in [*node.input, *outer_names(node)] if n), default=0)
            level_of.update((o, lvl) for o in node.output)
            levels[lvl].append(node)
        for lvl in sorted(levels):
            groups, opaque = defaultdict(list), []
            for node in levels[lvl]:
                item = self.spec(node)
                if item is None:
                    opaque.append(node)
                else:
                    groups[item.op.op_type].append(item)
            for op_type, items in groups.items():
                for it in self.insert(BY_TYPE[op_type], items):
                    self.notices.append(f"node '{it.node.name}' ({op_type}): relsat's shape rule disagrees with "
                                        f"ONNX shape inference; kept opaque")
                    opaque.append(it.node)
            self.add_getitems([it for items in groups.values() for it in items if it.op.is_tuple and it.out >= 0])
            self.add_opaque(opaque)

    def add_getitems(self, items: list[_Item]) -> None:
        rows = [(it.out, i, o) for it in items for i, o in enumerate(it.node.output) if o]
        if rows:
            t, idx, outs = zip(*rows)
            ids = self.g.add("getitem", {"t": np.array(t, dtype=np.int64)}, {"index": np.array(idx, dtype=np.int64)})
            self.cls.update(zip(outs, ids.tolist()))

    def add_opaque(self, nodes: list[onnx.NodeProto]) -> None:
        self.opaque_ops.update(n.op_type for n in nodes)
        inputs = [[self.klass(n, f"node '{node.name}' ({node.op_type})")
                   for n in [*(i for i in node.input if i), *outer_names(node)]] for node in nodes]
        types = [[self.types.get(o) or (None, None) for o in node.output] for node in nodes]
        outs = add_opaque(self.g, nodes, inputs, [[s for _, s in t] for t in types], [[d for d, _ in t] for t in types])
        for node, classes in zip(nodes, outs):
            self.cls.update((o, c) for o, c in zip(node.output, classes) if o)


def import_model(model: onnx.ModelProto, *, input_shapes: dict[str, list[int]] | None = None,
                 egraph: EGraph | None = None) -> ImportResult:
    """Translate a (checked) model into an e-graph, with every dynamic input dim fixed."""
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
    opset = opsets.get("")
    if opset is None or not MIN_OPSET <= opset <= MAX_OPSET:
        raise RelsatError(f"model '{model.graph.name}': default-domain opset {opset} is not supported "
                          f"(relsat supports opsets {MIN_OPSET} to {MAX_OPSET})")
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    real_inputs = [v for v in graph.input if v.name not in init_names]
    shapes, notices, specialized = _input_shapes(real_inputs, input_shapes)
    try:
        types = _infer_types(model, shapes)
    except Exception as e:
        types = {}
        notices.append(f"ONNX shape inference failed ({str(e).splitlines()[0]}); every node kept opaque")
    g = egraph if egraph is not None else EGraph()
    imp = _Importer(g, model, opset, types)
    weights = [(t.name, numpy_helper.to_array(t), t.data_type) for t in graph.initializer]
    nodes = []
    for node in graph.node:
        value = _constant_value(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else None
        if value is not None:
            weights.append((node.output[0], *value))
        else:
            nodes.append(node)
    imp.add_weights(weights)
    inputs = [(v.name, v.type.tensor_type.elem_type, shapes[v.name]) for v in real_inputs]
    imp.add_inputs(inputs)
    imp.run(nodes)
    if imp.opaque_ops:
        notices.append("kept opaque (not in relsat's catalog or not representable): "
                       + ", ".join(f"{op} x{n}" if n > 1 else op for op, n in imp.opaque_ops.most_common()))
    outputs = [(o.name, imp.klass(o.name, "the graph output")) for o in graph.output]
    return ImportResult(
        egraph=g, outputs=outputs, inputs=inputs, notices=notices + imp.notices, opset_imports=opsets,
        ir_version=model.ir_version, metadata={p.key: p.value for p in model.metadata_props},
        producer=(model.producer_name, model.producer_version), graph_name=graph.name, doc_string=model.doc_string,
        node_count=len(graph.node), values=imp.cls,
        specialized=specialized,
        output_dtypes={o.name: o.type.tensor_type.elem_type for o in graph.output if o.type.HasField("tensor_type")},
        functions=list(model.functions), domain=model.domain, model_version=model.model_version)
