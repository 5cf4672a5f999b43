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
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relsat.relations.onnx_form import rename_outer, subgraphs, walk_graphs


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


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
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


def inline_decided(model: onnx.ModelProto, folded: dict) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every main-graph ``If`` whose condition ``folded`` (the import's computed values), a
    Constant or a (not overridable) initializer decides replaced by its taken branch; the names of the ``If``
    nodes replaced (``model`` itself, untouched, when there are none)."""
    graph = model.graph
    consts = _constants(graph)
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
    taken = _names_in(out.graph)
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
