"""ONNX export: from a chosen DAG of e-nodes back to an ONNX model, and saving it.

Owns ``export_model`` (topological order, unique value names, the original
input/output names, lifted attributes written back as initializers or attributes
by opset, Gelu below opset 20 written as its definition in primitives, constant
subgraphs folded into initializers with ONNX Runtime, a Conv's constant weight and bias
always, opaque nodes written back verbatim, the original opsets/IR version/metadata),
and ``ExportError``: a choice that cannot be written (a cycle, a
value read before it is produced, a graph ONNX Runtime's optimizer would break), for the
caller to fall back from; and ``in_order``: an exported graph's nodes put in the input model's
order (``node_positions``), which ONNX Runtime runs and plans its memory by.
"""

from __future__ import annotations

import heapq
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relsat.extract.original import original_choice
from relsat.relations.catalog import BY_TYPE, OPS
from relsat.relations.digests import Digests
from relsat.relations.dims import is_sym
from relsat.relations.egraph import EGraph
from relsat.relations.onnx_form import (FormError, catalog_nodes, opaque_node, opaque_outputs, outer_names,
                                        subgraphs, walk_graphs)
from relsat.relations.runtime import session

from relsat.driver.errors import RelsatError, error_line
from relsat.driver.boundary.onnx_import import ImportResult

MAX_IR_VERSION = 10  # ONNX Runtime 1.31 refuses newer IR versions
_FOLD_MIN = 1 << 16  # a constant subgraph is folded when its result has at most max(this, its inputs') elements


class ExportError(RelsatError, ValueError):
    """The chosen e-nodes cannot be written as a valid ONNX graph (a cycle, a value read before it is
    produced, a class the choice leaves out, a graph ONNX Runtime would break): the caller can fall
    back to another choice. One line naming the e-class or value. Also a ValueError, as a malformed
    choice was before."""


class Exported(NamedTuple):
    """What :func:`export_graph` writes: the model, the e-node each of its nodes was written for (-1 for the
    Identity nodes that give an output its original name), and with a :class:`ExportMemo` the digests of its
    weights' data (initializer name -> SHA-256) and the weights written as shells (name -> the array to
    :func:`fill_weights` them from); both empty without one."""

    model: onnx.ModelProto
    origins: list[int]
    digests: dict[str, str]
    weights: dict[str, np.ndarray]


@dataclass
class ExportMemo:
    """What the exports of one e-graph share (the candidates of a search), kept by the caller between them:
    ``folds``, the values of folded constants, each keyed by its e-class and the e-nodes chosen below it,
    so that a constant computed for one graph is not computed again by ONNX Runtime for the next (0.6 s a
    graph on ConvNeXt-T) and a graph is the same whatever was exported before it; and ``digests``, each
    weight's digest, hashed once (:mod:`relsat.relations.digests`: what names the weights in a profile's key).

    An export with a memo writes its weights as shells (name, dtype and dims, no data: ``Exported.weights``
    holds their arrays) until :func:`fill_weights` fills them in: most candidate graphs of a warm run are only
    named (their profiles and comparison are cached) and never run, and copying ViT-B/16's 330 MB of weights
    into each took 0.5-1.2 s a graph. One that runs is given to ONNX Runtime with those arrays as they are
    (``relsat.relations.runtime.runnable(model, arrays)``); only the graph written is filled."""

    folds: dict = field(default_factory=dict)
    digests: Digests = field(default_factory=Digests)


@dataclass
class _Node:
    id: int
    op: str  # catalog op_type, or "opaque"
    cls: int
    children: list[int]  # catalog: one per child column (-1 = absent), Concat's inputs; opaque: its inputs
    attrs: dict  # catalog attributes; opaque: {"node": NodeProto bytes}


@dataclass
class _Info:
    shape: list[int] | None
    dtype: int | None
    is_const: bool


def _load_nodes(g: EGraph, choice: dict[int, int]) -> dict[int, _Node]:
    """The chosen node of every class in ``choice``, keyed by class."""
    g.con.register("_chosen", {"id": np.array(list(choice.values()), dtype=np.int64)})
    nodes = []
    try:
        for op in OPS:
            if op.table in g.live:
                g.con.execute(f"SELECT * FROM {op.table} WHERE id IN (SELECT id FROM _chosen)")
                cols = [d[0] for d in g.con.description]
                for row in g.con.fetchall():
                    r = dict(zip(cols, row))
                    kids = r[op.inputs[0].column] if op.variadic else [r[c] for c in op.child_columns]
                    attrs = {a.name: r[a.name] for a in op.attrs}
                    nodes.append(_Node(r["id"], op.op_type, r["out"], list(kids), attrs))
        if "op_opaque" in g.live:
            for nid, out, inputs, blob in g.sql("SELECT o.id, o.out, o.inputs, n.node FROM op_opaque o JOIN "
                                                "opaque_nodes n USING (proto) WHERE o.id IN (SELECT id FROM _chosen)"):
                nodes.append(_Node(nid, "opaque", out, list(inputs), {"node": bytes(blob)}))
    finally:
        g.con.unregister("_chosen")
    by_id = {n.id: n for n in nodes}
    out = {}
    for c, nid in choice.items():
        if nid not in by_id or by_id[nid].cls != c:
            raise ExportError(f"choice maps e-class {c} to node {nid}, which is not a node of that e-class")
        out[c] = by_id[nid]
    return out


def _analyses(g: EGraph, classes) -> dict[int, _Info]:
    rows = g.sql("SELECT id, shape, dtype, is_const FROM eclass WHERE id IN (SELECT unnest(?::BIGINT[]))",
                 [list(classes)])
    return {c: _Info(s, d, bool(k)) for c, s, d, k in rows}


def _kids(n: _Node) -> list[int]:
    return [c for c in n.children if c != -1]


def _topo(roots, nodes: dict[int, _Node], stop=frozenset()) -> list[int]:
    """Classes reachable from ``roots`` in post-order (children first), not entering ``stop``."""
    order, state, stack = [], {}, [(c, False) for c in reversed(roots)]
    while stack:
        c, done = stack.pop()
        if done:
            state[c] = 2
            order.append(c)
            continue
        if state.get(c) == 2:
            continue
        if state.get(c) == 1:
            raise ExportError(f"the chosen graph has a cycle through e-class {c} (node {nodes[c].id}, {nodes[c].op})")
        if c not in nodes:
            raise ExportError(f"the choice has no node for e-class {c}")
        state[c] = 1
        stack.append((c, True))
        if c not in stop:
            stack.extend((k, False) for k in reversed(_kids(nodes[c])) if state.get(k) != 2)
    return order


def _numel(shape) -> int:
    """Elements of a shape (a dynamic dim counts as 1: constant classes have static shapes)."""
    return int(np.prod([1 if is_sym(d) else d for d in shape], dtype=np.int64)) if shape is not None else 0


def _fold_roots(roots, nodes, info) -> list[int]:
    """The constant classes to fold: computed (not leaves) and not much bigger than their inputs, or
    read as a Conv's weight or bias, whatever their size (the Conv reads them whole, ONNX Runtime
    would materialize them at load anyway, and a Pad left in front of a Conv's weight is fused by
    ONNX Runtime's PadFusion as if it padded the Conv's data input, which breaks the graph)."""
    conv_params = {k for n in nodes.values() if n.op == "Conv" for k in n.children[1:] if k != -1}
    fold, seen, stack = [], set(), list(roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        n, i = nodes[c], info[c]
        limit = max(_FOLD_MIN, sum(_numel(info[k].shape) for k in _kids(n)))
        if i.is_const and n.op not in ("Weight", "Constant") and i.shape is not None and (
                c in conv_params or _numel(i.shape) <= limit):
            fold.append(c)
        else:
            stack.extend(_kids(n))
    return fold


def _subgraph_names(blob: bytes) -> set[str]:
    """Every value name defined inside the subgraphs of a serialized node."""
    node = onnx.NodeProto()
    node.ParseFromString(blob)
    return {v for sub in subgraphs(node) for g in walk_graphs(sub) for v in [
        *(i.name for i in g.input), *(t.name for t in g.initializer), *(o for n in g.node for o in n.output)]}


class _Writer:
    """Writes chosen classes as ONNX nodes and initializers, naming every value uniquely."""

    def __init__(self, imported: ImportResult, nodes: dict[int, _Node], info: dict[int, _Info],
                 folded: dict[int, np.ndarray], taken: set[str], owned: dict[int, str],
                 memo: ExportMemo | None = None):
        self.g, self.nodes, self.info, self.folded = imported.egraph, nodes, info, folded
        self.memo, self.digests = memo, {}  # initializer name -> digest of its data (with a memo)
        self.weights: dict[str, np.ndarray] = {}  # initializer name -> the array of a shell (with a memo)
        self.opsets = imported.opset_imports
        self.domains: dict[str, int] = {}  # domains of catalog nodes written -> their opset
        self.taken, self.owned = taken, owned  # names never generated; class -> its name in the original
        self.assigned: set[str] = set()
        self.name: dict[int, str] = {}
        self.out_nodes: list[onnx.NodeProto] = []
        self.origins: list[int] = []  # the e-node each of out_nodes was written for (-1: none)
        self.inits: list[onnx.TensorProto] = []
        self.counter: Counter = Counter()
        self.lifted: dict[tuple, str] = {}
        self.projections: dict[int, dict[int, int]] = {}  # tuple class -> {index: getitem class}
        for c, n in nodes.items():
            if n.op == "getitem":
                self.projections.setdefault(n.children[0], {})[n.attrs["index"]] = c

    def fresh(self, hint: str) -> str:
        while True:
            self.counter[hint] += 1
            name = f"{hint}_{self.counter[hint]}"
            if name not in self.taken and name not in self.assigned:
                self.assigned.add(name)
                return name

    def assign(self, c: int, name: str) -> None:
        self.name[c] = name
        self.assigned.add(name)

    def value(self, c: int) -> str:
        if c not in self.name:
            own = self.owned.get(c)
            if own and own not in self.assigned:
                self.assign(c, own)
            else:
                self.name[c] = self.fresh("v")
        return self.name[c]

    def tuple_output(self, t: int, index: int) -> str:
        proj = self.projections.get(t, {}).get(index)
        return self.value(proj) if proj is not None else self.fresh("unused")

    def initializer(self, c: int, arr: np.ndarray) -> None:
        arr, name = np.asarray(arr), self.value(c)
        d = self.memo.digests.of(arr) if self.memo is not None else None
        if d is None:  # no memo, or a small constant: written whole
            self.inits.append(numpy_helper.from_array(arr, name))
            return
        shell = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype))
        shell.dims.extend(arr.shape)
        self.inits.append(shell)
        self.digests[name], self.weights[name] = d, arr

    def emit(self, c: int) -> None:
        start = len(self.out_nodes)
        self._emit(c)
        self.origins += [self.nodes[c].id] * (len(self.out_nodes) - start)

    def _emit(self, c: int) -> None:
        n = self.nodes[c]
        if c in self.folded:
            self.initializer(c, self.folded[c])
        elif n.op == "Input":
            self.assign(c, n.attrs["name"])
        elif n.op == "Weight":
            if n.attrs["ref"] not in self.g.tensors:
                raise RelsatError(f"weight {n.attrs['ref']} has no tensor data in this session")
            self.initializer(c, self.g.tensors[n.attrs["ref"]])
        elif n.op == "Constant":
            self.initializer(c, np.array(n.attrs["value_float"], dtype=np.float32))
        elif n.op == "opaque":
            self.opaque(c, n)
        elif n.op != "getitem":  # a getitem's value is named by its tuple's node
            self.catalog(c, n)

    def opaque(self, c: int, n: _Node) -> None:
        names = [self.value(k) for k in n.children]
        outs = opaque_outputs(n.attrs["node"])
        outputs = [self.value(c)] if len(outs) == 1 else [self.tuple_output(c, i) if o else "" for i, o in enumerate(outs)]
        self.out_nodes.append(opaque_node(n.attrs["node"], names, outputs))

    def lifted_init(self, value, dtype: int) -> str:
        arr = np.array(value, dtype=helper.tensor_dtype_to_np_dtype(dtype))
        key = (dtype, arr.shape, arr.tobytes())
        if key not in self.lifted:
            self.lifted[key] = name = self.fresh("const")
            self.inits.append(numpy_helper.from_array(arr, name))
        return self.lifted[key]

    def catalog(self, c: int, n: _Node) -> None:
        op = BY_TYPE[n.op]
        opset = self.opsets.get(op.domain, op.since)
        inputs = [self.value(k) if k != -1 else "" for k in n.children]
        outputs = [self.tuple_output(c, i) for i in range(op.arity(n.attrs))] if op.is_tuple else [self.value(c)]
        first = self.info[n.children[0]]
        try:
            self.out_nodes += catalog_nodes(op, inputs, outputs, n.attrs, opset=opset,
                                            data_dtype=first.dtype or onnx.TensorProto.FLOAT, data_shape=first.shape,
                                            const=self.lifted_init, fresh=self.fresh)
        except FormError as e:
            raise RelsatError(str(e)) from None
        if op.domain:
            self.domains.setdefault(op.domain, opset)

    def opset_imports(self) -> list:
        """The model's opsets, and those of the other domains the written nodes use."""
        return [helper.make_opsetid(d, v) for d, v in {**self.domains, **self.opsets}.items()]


def _owned_names(imported: ImportResult) -> dict[int, str]:
    names = list(imported.values)
    classes = imported.egraph.find([imported.values[n] for n in names]) if names else []
    owned: dict[int, str] = {}
    for name, c in zip(names, classes):
        owned.setdefault(int(c), name)
    return owned


def _evaluate(imported: ImportResult, nodes, info, fold: list[int], taken) -> dict[int, np.ndarray]:
    """Values of the constant classes ``fold``, computed by ONNX Runtime in one model; when that
    fails, class by class, leaving out those it cannot compute."""
    values = _evaluate_together(imported, nodes, info, fold, taken)
    if values is not None or len(fold) == 1:
        return values or {}
    out = {}
    for c in fold:
        out.update(_evaluate_together(imported, nodes, info, [c], taken) or {})
    return out


def _evaluate_together(imported: ImportResult, nodes, info, fold: list[int], taken) -> dict[int, np.ndarray] | None:
    """Values of the constant classes ``fold`` from one ONNX Runtime run (None if it cannot)."""
    try:
        w = _Writer(imported, nodes, info, {}, taken, {})
        for c in _topo(fold, nodes):
            w.emit(c)
        outputs = [helper.make_tensor_value_info(w.value(c), info[c].dtype, imported.symbols.onnx_dims(info[c].shape))
                   for c in fold]
        model = helper.make_model(
            helper.make_graph(w.out_nodes, "fold", [], outputs, w.inits),
            opset_imports=w.opset_imports(), ir_version=min(imported.ir_version, MAX_IR_VERSION),
            functions=imported.functions)
        return dict(zip(fold, session(model, optimize=False).run(None, {})))
    except Exception:  # e.g. an opaque node ONNX Runtime cannot run alone: keep the nodes
        return None


def export_model(imported: ImportResult, choice: dict[int, int] | None = None) -> onnx.ModelProto:
    """The ONNX model of the chosen e-nodes (``choice``: e-class -> e-node id for every needed
    class; None: the original graph), checked by onnx.checker (full check)."""
    return export_graph(imported, choice)[0]


def export_graph(imported: ImportResult, choice: dict[int, int] | None = None,
                 memo: ExportMemo | None = None) -> Exported:
    """``export_model``'s model, and the e-node each of its nodes was written for (-1 for the
    Identity nodes that give an output its original name): what in-context profiling charges. With a
    ``memo`` (:class:`ExportMemo`, kept by the caller between the exports of one e-graph) the weights are
    shells and the digests of their data come back too; :func:`fill_weights` makes the model the one an
    export without a memo writes, to the byte."""
    g = imported.egraph
    dims = imported.symbols.onnx_dims  # dynamic dims written as the original's dim_params (or unnamed)
    roots = [int(c) for c in g.find([c for _, c in imported.outputs])] if imported.outputs else []
    if choice is None:
        choice = original_choice(g, roots)
    else:  # canonical e-class ids
        choice = dict(zip(g.find(list(choice)).tolist(), map(int, choice.values()))) if choice else {}
    nodes = _load_nodes(g, choice)
    needed = _topo(roots, nodes)
    nodes = {c: nodes[c] for c in needed}
    info = _analyses(g, needed)
    taken = set(imported.values) | {n for n, _, _ in imported.inputs} | {n for n, _ in imported.outputs}
    for n in nodes.values():
        if n.op == "opaque":
            taken |= _subgraph_names(n.attrs["node"])
    fold = _fold_roots(roots, nodes, info)
    if memo is None:
        folded = _evaluate(imported, nodes, info, fold, taken) if fold else {}
    else:
        folds = memo.folds
        keys = {c: (c, tuple(nodes[k].id for k in _topo([c], nodes))) for c in fold}
        todo = [c for c in fold if keys[c] not in folds]
        if todo:
            folds.update((keys[c], v) for c, v in _evaluate(imported, nodes, info, todo, taken).items())
        folded = {c: folds[keys[c]] for c in fold if keys[c] in folds}
    w = _Writer(imported, nodes, info, folded, taken, _owned_names(imported), memo)
    for name, c in zip([o for o, _ in imported.outputs], roots):
        if nodes[c].op != "Input" and c not in w.name:
            w.assign(c, name)
    for c in _topo(roots, nodes, stop=frozenset(folded)):
        w.emit(c)
    outputs = []
    for name, c in zip([o for o, _ in imported.outputs], roots):
        if w.name[c] != name:
            w.out_nodes.append(helper.make_node("Identity", [w.name[c]], [name], name=name))
            w.origins.append(-1)
        if info[c].shape is not None and info[c].dtype:
            outputs.append(helper.make_tensor_value_info(name, info[c].dtype, dims(info[c].shape)))
        else:
            outputs.append(imported.output_info[name])
    inputs = [helper.make_tensor_value_info(n, dt, dims(s)) for n, dt, s in imported.inputs]
    if imported.ir_version < 4:  # IR 3 wants every initializer listed as a graph input
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in w.inits]
    # made in place (make_graph and make_model each copy every weight again)
    model = onnx.ModelProto(ir_version=min(imported.ir_version, MAX_IR_VERSION), producer_name=imported.producer[0],
                            producer_version=imported.producer[1], doc_string=imported.doc_string,
                            domain=imported.domain, model_version=imported.model_version)
    model.opset_import.extend(w.opset_imports())
    model.functions.extend(imported.functions)
    graph = model.graph
    graph.name = imported.graph_name
    graph.node.extend(w.out_nodes)
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    graph.initializer.extend(w.inits + imported.defaults)
    _check_graph(graph, {name: c for c, name in w.name.items()})
    props = dict(imported.metadata)
    if imported.specialized:
        props["relsat.specialized_input_shapes"] = json.dumps(imported.specialized)
    if props:
        helper.set_model_props(model, props)
    try:
        onnx.checker.check_model(_hollow(model, set(w.weights)), full_check=True)
    except Exception as e:
        raise ExportError(f"the exported model fails the ONNX checker: {error_line(e)}") from None
    return Exported(model, w.origins, w.digests, w.weights)


def fill_weights(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The shells of an export with a memo (``Exported.weights``) filled in place with their data, as
    ``numpy_helper.from_array`` writes it (the same model to the byte as an export without a memo); a shell
    filled already is left as it is. Returns ``model``."""
    for t in model.graph.initializer:
        arr = weights.get(t.name)
        if arr is not None and not t.raw_data and arr.size:
            t.raw_data = np.ascontiguousarray(arr).tobytes()
    return model


HOLLOW_BYTES = 1024  # initializers above this size are checked as graph inputs of their type and shape


def _hollow(model: onnx.ModelProto, shells=frozenset()) -> onnx.ModelProto:
    """``model`` with every initializer over :data:`HOLLOW_BYTES` (and the weights written as ``shells``) as a
    graph input of its dtype and shape, for the checker: the graph, the types and shape inference are checked
    as they are, and the weights are not serialized for it (checking DistilBERT's candidates whole took 1.2 s
    each; a model over 2 GiB could not be checked at all). Small initializers (shapes, axes, scalars) stay:
    inference reads them."""
    g = model.graph
    big = [t for t in g.initializer if len(t.raw_data) > HOLLOW_BYTES or len(t.float_data) > HOLLOW_BYTES // 4
           or t.name in shells]
    if not big:
        return model
    names = {t.name for t in big}
    listed = {i.name for i in g.input}
    inputs = list(g.input) + [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in big
                              if t.name not in listed]
    graph = helper.make_graph(g.node, g.name, inputs, g.output,
                              [t for t in g.initializer if t.name not in names], value_info=g.value_info)
    graph.sparse_initializer.extend(g.sparse_initializer)
    hollow = onnx.ModelProto(ir_version=model.ir_version)
    hollow.opset_import.extend(model.opset_import)
    hollow.functions.extend(model.functions)
    hollow.graph.CopyFrom(graph)
    return hollow


def _check_graph(graph: onnx.GraphProto, owner: dict[str, int]) -> None:
    """Raise ExportError unless every value is produced once, before it is read (graph inputs and
    initializers first, then the nodes in order; a subgraph's reads of outer values included) and
    no Pad sits where ONNX Runtime's PadFusion would break the graph. ``owner``: value name ->
    e-class, for the message."""

    def which(name: str) -> str:
        return f"value {name!r}" + (f" (e-class {owner[name]})" if name in owner else "")

    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        reads = [(i, name) for i, name in enumerate(node.input) if name]
        reads += [(-1, name) for name in outer_names(node)]
        for i, name in reads:
            if name not in defined:
                raise ExportError(f"the exported graph reads {which(name)} before it is produced, in node "
                                  f"{node.name or node.op_type} ({node.op_type})")
            readers.setdefault(name, []).append((node, i))
        for name in node.output:
            if name in defined:
                raise ExportError(f"the exported graph produces {which(name)} twice, in node "
                                  f"{node.name or node.op_type} ({node.op_type})")
            if name:
                defined.add(name)
    outputs = {v.name for v in graph.output}
    for v in graph.output:
        if v.name not in defined:
            raise ExportError(f"the exported graph's output {which(v.name)} is never produced")

    def only_reader(name: str):
        uses = readers.get(name, [])
        return uses[0] if len(uses) == 1 and name not in outputs else (None, None)

    for node in graph.node:  # ONNX Runtime's PadFusion: Pad [-> Cast] -> Conv, whichever Conv input it feeds
        if node.op_type == "Pad" and node.domain in ("", "ai.onnx"):
            reader, i = only_reader(node.output[0])
            if reader is not None and reader.op_type == "Cast":
                reader, i = only_reader(reader.output[0])
            if reader is not None and reader.op_type == "Conv" and i != 0:
                raise ExportError(f"the exported graph pads {which(node.output[0])} into input {i} of Conv "
                                  f"{reader.name}, which ONNX Runtime's Pad fusion would rewire")


def node_positions(model: onnx.ModelProto) -> dict[str, int]:
    """Each top-level node's position in ``model``, by each of its outputs' names and, under ``"node:"`` + its name,
    by its name: what :func:`in_order` orders an exported graph by (outputs first: a catalog node is named after its
    output, and a value's name may be another node's)."""
    pos: dict[str, int] = {}
    for i, n in enumerate(model.graph.node):
        for key in _position_keys(n):
            pos.setdefault(key, i)
    return pos


def _position_keys(node: onnx.NodeProto) -> list[str]:
    """The keys a node's position is stored under (:func:`node_positions`) and looked up by (:func:`in_order`)."""
    return [k for k in (*node.output, "node:" + node.name if node.name else "") if k]


def _used_inside(node: onnx.NodeProto) -> set[str]:
    """The names the subgraphs of ``node`` (If, Loop, Scan bodies) read, at any depth: the outer values they capture
    among them (the caller keeps only the names a top-level node makes)."""
    used: set[str] = set()
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in g.node:
                used.update(i for i in n.input if i)
                used |= _used_inside(n)
    return used


def in_order(model: onnx.ModelProto, positions: dict[str, int]) -> list[int]:
    """``model``'s top-level nodes put in the input model's order (``positions``: :func:`node_positions`), in place;
    returns the permutation (``order[k]``: the index before of the node now at ``k``) for what is kept per node in
    the exported order (``export_graph``'s origins). A topological order that takes, of the nodes ready, the one the
    input model ran first; a node the input model has not (by an output's name or its own) takes the latest
    position of the top-level nodes it reads, or -1 (first) where it reads only graph inputs and weights. ONNX
    Runtime runs the nodes in the order given and plans its memory by it: YOLOv8n's original graph as exported, its
    nodes in the order the e-graph gave them (14 places out of the input's order), ran 1.021x the input model at 2
    threads with its shapes named, and 1.058x in the input's order, as the input model itself with them (1.063x)
    (thirty-seventh session; in a faster state of the machine all three ran level: RESULTS). A graph with a cycle
    is left as it is (identity)."""
    nodes = list(model.graph.node)
    identity = list(range(len(nodes)))
    made = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{made[x] for x in (*n.input, *_used_inside(n)) if x in made and made[x] != i} for i, n in enumerate(nodes)]
    own = [next((positions[k] for k in _position_keys(n) if k in positions), None) for n in nodes]
    users: list[list[int]] = [[] for _ in nodes]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    waiting = [len(d) for d in deps]
    at = [-1] * len(nodes)
    ready = [(own[i] if own[i] is not None else -1, i) for i in range(len(nodes)) if not waiting[i]]
    heapq.heapify(ready)
    order = []
    while ready:
        p, i = heapq.heappop(ready)
        at[i] = p
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if not waiting[u]:
                p_u = own[u] if own[u] is not None else max(at[j] for j in deps[u])
                heapq.heappush(ready, (p_u, u))
    if len(order) != len(nodes) or order == identity:  # a cycle (not a valid graph), or in order already
        return identity
    placed = []
    for i in order:  # (copies: the messages are the repeated field's, which is cleared next)
        placed.append(onnx.NodeProto())
        placed[-1].CopyFrom(nodes[i])
    del model.graph.node[:]
    model.graph.node.extend(placed)
    return order
