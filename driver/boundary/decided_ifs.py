"""Decided ``If`` nodes: an ``If`` whose condition the import computed, replaced by the branch it takes.

The import computes what constants and static dims make constant (``onnx_import._infer_types``: Shape and
small shape arithmetic on it, over dynamic dims where the elements read are static). An ``If`` of the
main graph whose condition is such a value, a constant or an initializer (not one a caller may override)
runs the same branch for every input: :func:`inline_decided` puts that branch's nodes in its place, so the
e-graph sees them (an ``If`` is opaque to it) and ONNX Runtime runs them without the ``If``. Silero VAD
16k: its LSTM decoder sits in an ``If`` on ``bool(Shape(state)[0])``, and ``state`` is ``[2, batch, 128]``.

Exact by construction: the branch computes the ``If``'s outputs whenever the condition has that value, and
it has it for every size of the dynamic dims. The branch's own values are renamed where a name is taken in
the graph (their reads inside nested subgraphs too); its outputs take the ``If``'s output names (an
``Identity`` where the branch passes through an outer value or names one value twice); its initializers
move to the graph. ``If`` nodes inside a taken branch are decided by the caller's next pass, once the
import has computed again over the new nodes.

An ``If`` the main graph keeps (its condition depends on an input's value) may hold decided ``If`` nodes
in its branches: :func:`inline_within` decides them there, at any depth, each branch computed as a graph
of its own whose inputs are the outer values it reads, typed as the enclosing graph computed them (the
static dims of the model's inputs hold in every branch) and constant where the enclosing graph computed
them. Silero VAD (the export with the sample rate an input): the whole model sits in an ``If`` on
``sr == 16000``, and the same LSTM decoder ``If`` as above sits in each of its branches.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relsat.relations.onnx_form import graph_outer_names, outer_names, rename_outer, subgraphs, walk_graphs


def _names_in(graph: onnx.GraphProto) -> set[str]:
    """Every value and node name used anywhere in ``graph`` and its subgraphs."""
    names = set()
    for g in walk_graphs(graph):
        names |= {v.name for v in [*g.input, *g.output, *g.value_info]} | {t.name for t in g.initializer}
        for n in g.node:
            names |= {*n.input, *n.output, n.name}
    names.discard("")
    return names


def _condition(name: str, folded: dict, consts: dict) -> bool | None:
    """The value of a condition input when it is known for every input, else None."""
    arr = folded.get(name)
    if arr is None and name in consts:
        arr = consts[name]
    if arr is None:
        return None
    arr = np.asarray(arr)
    return bool(arr.reshape(-1)[0]) if arr.size == 1 else None


def scalar_constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Values of the main graph's Constant nodes and initializers that are not also graph inputs."""
    listed = {v.name for v in graph.input}
    out = {t.name: t for t in graph.initializer if t.name not in listed and np.prod(t.dims) == 1}
    out = {k: numpy_helper.to_array(t) for k, t in out.items()}
    for n in graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.attribute) == 1 \
                and n.attribute[0].name == "value" and np.prod(n.attribute[0].t.dims) == 1:
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _branch_nodes(node: onnx.NodeProto, branch: onnx.GraphProto, taken: set[str]) -> tuple[list, list]:
    """The nodes (and initializers) that replace ``node`` by ``branch``: its values renamed away from
    ``taken`` (which grows by the names used), its outputs written to the ``If``'s output names."""
    local = [t.name for t in branch.initializer] + [o for n in branch.node for o in n.output if o]
    rename: dict[str, str] = {}
    produced = {o for n in branch.node for o in n.output if o}
    # the If's outputs: a branch output that a branch node produces (once) takes the If's name
    passthrough = []
    for b, o in zip(branch.output, node.output):
        if not o:
            continue
        if b.name in produced and b.name not in rename:
            rename[b.name] = o
        else:
            passthrough.append((b.name, o))
    prefix = node.name or node.output[0]
    for name in local:
        if name in rename:
            continue
        new, k = name, 0
        while new in taken:
            k += 1
            new = f"{prefix}/{name}" if k == 1 else f"{prefix}/{name}_{k}"
        rename[name] = new
        taken.add(new)
    taken.update(rename.values())
    inits = []
    for t in branch.initializer:
        c = onnx.TensorProto()
        c.CopyFrom(t)
        c.name = rename[t.name]
        inits.append(c)
    nodes = []
    for n in branch.node:
        c = onnx.NodeProto()
        c.CopyFrom(n)
        c.input[:] = [rename.get(i, i) for i in n.input]
        c.output[:] = [rename.get(o, o) for o in n.output]
        if c.name:
            new, k = c.name, 0
            while new in taken:
                k += 1
                new = f"{prefix}/{c.name}" if k == 1 else f"{prefix}/{c.name}_{k}"
            c.name = new
            taken.add(new)
        for sub in subgraphs(c):  # nested graphs read the renamed values under their new names
            rename_outer(sub, rename)
        nodes.append(c)
    for b, o in passthrough:
        nodes.append(helper.make_node("Identity", [rename.get(b, b)], [o], name=f"{prefix}/{o}/Identity"))
    return nodes, inits


def inline_decided(model: onnx.ModelProto, folded: dict,
                   taken: set[str] | None = None) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every main-graph ``If`` whose condition ``folded`` (the import's computed values), a
    Constant or a (not overridable) initializer decides replaced by its taken branch; the names of the ``If``
    nodes replaced (``model`` itself, untouched, when there are none). ``taken``: names in use besides the
    model's own (an enclosing graph's, where ``model`` stands for a branch); it grows by the names added."""
    graph = model.graph
    consts = scalar_constants(graph)
    decided = []
    for n in graph.node:
        if n.op_type == "If" and n.domain in ("", "ai.onnx") and n.input:
            cond = _condition(n.input[0], folded, consts)
            if cond is not None:
                decided.append((n, cond))
    if not decided:
        return model, []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    taken = (set() if taken is None else taken)
    taken |= _names_in(out.graph)
    which = {id(n): cond for n, cond in decided}
    nodes, inits, names = [], [], []
    for n, orig in zip(out.graph.node, graph.node):
        if id(orig) not in which:
            nodes.append(n)
            continue
        branch = next(a.g for a in n.attribute if a.name == ("then_branch" if which[id(orig)] else "else_branch"))
        more, init = _branch_nodes(n, branch, taken)
        nodes += more
        inits += init
        names.append(n.name or n.output[0])
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(inits)
    return out, names


def inline_all(model: onnx.ModelProto, infer, taken: set[str] | None = None) -> tuple:
    """``model`` with its main graph's decided ``If`` nodes replaced (:func:`inline_decided`), its values computed
    again (``infer(model) -> (types, values)``) after each pass until a pass decides none (an ``If`` inside a taken
    branch is decided by the next); returns it, its last computed types and values, and the names replaced."""
    names = []
    while True:
        types, known = infer(model)
        model, more = inline_decided(model, known, taken)
        if not more:
            return model, types, known, names
        names += more


def _live(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The graph's nodes that its outputs need (a taken branch leaves the condition it was taken on
    computed and unread; ONNX Runtime does not remove such nodes inside a subgraph)."""
    needed, kept = {v.name for v in graph.output}, []
    for n in reversed(graph.node):
        if any(o in needed for o in n.output if o):
            kept.append(n)
            needed.update(i for i in [*n.input, *outer_names(n)] if i)
    return kept[::-1]


def _branch_model(branch: onnx.GraphProto, model: onnx.ModelProto, types: dict, known: dict):
    """A branch as a model of its own: the outer values it reads as inputs typed by ``types`` (``name ->
    (dtype, dims)``), or as initializers where ``known`` holds their value; returns it, the shapes to give
    its inputs, and the names of the initializers that stand for outer values."""
    inputs, inits, shapes = [], [], {}
    for name in sorted(graph_outer_names(branch)):
        if name in known:
            inits.append(numpy_helper.from_array(np.asarray(known[name]), name))
            continue
        dtype, dims = types.get(name, (None, None))
        if not dtype:
            return None
        inputs.append(helper.make_tensor_value_info(name, dtype, None))
        if dims is not None:
            shapes[name] = list(dims)
    graph = helper.make_graph(list(branch.node), branch.name or "branch", inputs, list(branch.output),
                              [*branch.initializer, *inits])
    return (helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version,
                              functions=model.functions), shapes, {t.name for t in inits})


def inline_within(model: onnx.ModelProto, types: dict, known: dict, infer,
                  taken: set[str] | None = None) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with the decided ``If`` nodes inside the branches of its main graph's ``If`` nodes (at
    any depth) replaced by their taken branches; the names of those replaced (``model`` itself when none).
    ``types``/``known``: the main graph's computed types and constant values; ``infer(model, shapes)``
    computes a branch's (the import's ``_infer_types``). A branch whose types cannot be computed is kept."""
    taken = _names_in(model.graph) if taken is None else taken
    out, names = None, []
    for i, n in enumerate(model.graph.node):
        if not (n.op_type == "If" and n.domain in ("", "ai.onnx")):
            continue
        for k, a in enumerate(n.attribute):
            if a.type != onnx.AttributeProto.GRAPH:
                continue
            made = _branch_model(a.g, model, types, known)
            if made is None:
                continue
            sub, shapes, outer = made
            try:
                sub, sub_types, sub_known, decided = inline_all(sub, lambda m: infer(m, shapes), taken)
                sub, more = inline_within(sub, {**types, **sub_types}, {**known, **sub_known}, infer, taken)
            except Exception:  # types not computable: the branch kept as it is
                continue
            if not decided and not more:
                continue
            if out is None:
                out = onnx.ModelProto()
                out.CopyFrom(model)
            g = out.graph.node[i].attribute[k].g
            nodes = _live(sub.graph)
            read = {v.name for v in g.output} | {x for node in nodes for x in [*node.input, *outer_names(node)]}
            del g.node[:]
            g.node.extend(nodes)
            del g.initializer[:]
            g.initializer.extend(t for t in sub.graph.initializer if t.name not in outer and t.name in read)
            names += decided + more
    return (model if out is None else out), names
