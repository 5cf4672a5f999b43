"""The graph ONNX Runtime actually runs for a model, and whether one such graph does less work than another.

This module owns reading back ONNX Runtime's own optimized model (the graph after its level-ALL fusions and
layout changes, as saved by ``SessionOptions.optimized_model_filepath``), counting its kernels, and telling
whether a candidate graph's kernels are the input model's with some taken away:

    optimized_graph(model, threads=1, backend=CPU) -> onnx.GraphProto   (None-free: raises where it cannot)
    histogram(graph) -> Counter            domain-qualified op counts, subgraphs included
    work(graph) -> Counter                 the same graph as classes of work (fused kernels split up)
    does_less(before, after) -> dict|None  ``after`` runs fewer kernels and no more of any class of work

The session is made as timing sessions are (``relsat.relations.runtime.session_options``: level ALL,
``threads`` intra-op threads, sequential, on the backend's provider), so the graph read is the one timed:
ONNX Runtime's choices depend on the thread count (NCHWc blocking) and the provider. The optimized model's
weights go to a side file that is never read (only the graph is).

**Classes of work** (``work``): a kernel ONNX Runtime fused from several ONNX ops counts as the ops it computes, so
that a graph is not said to do less for running one fused kernel where the other runs its parts, nor more for the
reverse: ``com.microsoft.Fused<Op>`` counts as ``<Op>`` and its ``activation`` (and an ``Add`` where a Conv takes
a summand), ``Gemm`` as ``MatMul`` (and ``Add`` with a bias), ``BiasGelu`` as ``Add`` and ``Gelu``,
``SkipLayerNormalization`` as ``Add`` and ``LayerNormalization`` (and ``Add`` with a bias), a two-input ``Sum`` as
``Add``, ``com.microsoft.Gelu`` as ``Gelu``. A copy of one slab of a tensor is one class, ``Slice``, however it is
written: a Slice, each output of a Split, a Gather of one constant index (ONNX Runtime's GatherSliceToSplitFusion
makes one Split of the Gathers or Slices that read one tensor, but only of those in one graph: Silero VAD's Gathers
of its state, two in each branch of an ``If``, became one Split once relsat inlined the branch). The NCHWc kernels
(``com.microsoft.nchwc.Conv`` and its activation, the reorders) stay classes of their own: a graph run with plain
Convs where the input model's ran blocked ones does not do less. Any other op is its own class (domain-qualified).
The ops whose ONNX Runtime CPU kernels alias their input (``Reshape``, ``Squeeze``, ``Unsqueeze``, ``Flatten``,
``Identity``: a view, no copy) are kernels but no work. A Mul may run in place of a Div, an Add in place of a Sub (``STANDS_IN``: the same
element-wise pass, no dearer). Shapes are not compared: a class counts kernels, not their sizes. ``does_less`` is
the structural half of what ``relsat.driver.search.candidates`` asks before it writes a graph that is not
measured faster (a *simplified* graph); the timing is the other half.
"""

from __future__ import annotations

import math
import tempfile
from collections import Counter
from pathlib import Path

import onnx

from relsat.relations import runtime
from relsat.relations.backend import CPU, Backend

MS = "com.microsoft"
FUSED_PREFIX = f"{MS}.Fused"  # ONNX Runtime's FusedConv, FusedGemm, ...: the op after the prefix and an activation
NCHWC = f"{MS}.nchwc."  # its NCHWc kernels (Conv, pools) stay classes of their own: a graph the runtime runs with
# plain Convs where the input model's ran blocked ones (and the reorders around them) does not do less
# an op (domain-qualified, after those prefixes) -> the classes of work it stands for, beside its activation attribute
PARTS = {
    "Gemm": ("MatMul",), f"{MS}.BiasGelu": ("Add", "Gelu"), f"{MS}.FastGelu": ("Gelu",), f"{MS}.Gelu": ("Gelu",),
    f"{MS}.SkipLayerNormalization": ("Add", "LayerNormalization"),
    f"{MS}.SkipSimplifiedLayerNormalization": ("Add", f"{MS}.SimplifiedLayerNormalization"),
    f"{MS}.BiasSoftmax": ("Add", "Softmax"),
}
SUMMAND = {"Conv": 3, f"{NCHWC}Conv": 3, "Gemm": 2, f"{MS}.FastGelu": 1, f"{MS}.SkipLayerNormalization": 4,
           f"{MS}.SkipSimplifiedLayerNormalization": 3}  # the input index of a summand these kernels add (a fused
# Conv's residual, a bias)
STANDS_IN = {"Mul": "Div", "Add": "Sub"}  # a class that may run in place of another at no more work: x / c as
# x * (1 / c), x - c as x + (-c) (T5's relative-position bucket: its two Divs by constants became Muls, and a graph of
# 42 kernels fewer was said to do more)
CLASSES = 3  # the version of the classes of work below: a cached comparison that judged by others is not recalled
SLAB = "Slice"  # the class of a copy of one slab of a tensor: a Slice, each output of a Split, a Gather of one index
VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})  # ONNX Runtime's CPU kernels of
# these alias their input (no copy, no arithmetic): kernels, but no work


def op_key(node: onnx.NodeProto) -> str:
    """``op_type`` qualified by its domain unless it is the default ONNX domain."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _graphs(graph: onnx.GraphProto):
    """``graph`` and every subgraph in its nodes' attributes, at any depth."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _graphs(sub)


def _nodes(graph: onnx.GraphProto):
    """The nodes of ``graph`` and of every subgraph in its nodes' attributes."""
    for g in _graphs(graph):
        yield from g.node


def histogram(graph: onnx.GraphProto) -> Counter:
    """Domain-qualified op counts of ``graph`` and of every subgraph in its nodes' attributes."""
    return Counter(op_key(n) for n in _nodes(graph))


def _one_element(graph: onnx.GraphProto) -> frozenset:
    """The names of the initializers of ``graph`` and its subgraphs that hold one element (a scalar or a
    one-element tensor): the indices of a ``Gather`` that copies one slab."""
    return frozenset(t.name for g in _graphs(graph) for t in g.initializer if math.prod(t.dims) == 1)


def _classes(node: onnx.NodeProto, one: frozenset = frozenset()) -> list[str]:
    key = op_key(node)
    if key == "Sum" and len(node.input) == 2:
        return ["Add"]
    if key == "Split":  # one slab copied per output, as a Slice copies it
        return [SLAB] * sum(1 for o in node.output if o)
    if key == "Gather" and len(node.input) > 1 and node.input[1] in one:  # one index: one slab
        return [SLAB]
    if key.startswith(FUSED_PREFIX):
        key = key[len(FUSED_PREFIX):]
    if key in VIEWS:
        return []
    out = list(PARTS.get(key, (key,)))
    out += [a.s.decode() for a in node.attribute if a.name == "activation" and a.s]
    i = SUMMAND.get(key)
    if i is not None and len(node.input) > i and node.input[i]:
        out.append("Add")
    return out


def work(graph: onnx.GraphProto) -> Counter:
    """``graph``'s kernels as classes of work (module docstring), subgraphs included."""
    one = _one_element(graph)
    return Counter(c for n in _nodes(graph) for c in _classes(n, one))


def does_less(before: onnx.GraphProto, after: onnx.GraphProto) -> dict | None:
    """Whether ``after`` (the graph ONNX Runtime runs for a candidate) does less than ``before`` (for the input
    model): fewer kernels (views among them), and no class of work (``work``) more often, except one that runs in
    place of as many fewer of the class it stands in for (``STANDS_IN``: a Mul for a Div). Returns what it does less
    (``kernels``: [before, after]; ``fewer``: class -> [before, after] for each class that went down; ``instead``,
    where some class stood in: class -> [before, after] for each that went up), or None."""
    k0, k1 = sum(1 for _ in _nodes(before)), sum(1 for _ in _nodes(after))
    w0, w1 = work(before), work(after)
    if k1 >= k0:
        return None
    fewer = {c: [w0[c], w1[c]] for c in sorted(w0) if w1[c] < w0[c]}
    spare = Counter({c: a - b for c, (a, b) in fewer.items()})  # what each class left out
    instead = {}
    for c in sorted(w1):
        extra = w1[c] - w0[c]
        if extra <= 0:
            continue
        other = STANDS_IN.get(c)
        if other is None or spare[other] < extra:
            return None
        spare[other] -= extra
        instead[c] = [w0[c], w1[c]]
    return {"kernels": [k0, k1], "fewer": fewer, **({"instead": instead} if instead else {})}


def optimized_graph(model, *, threads: int = 1, backend: Backend = CPU) -> onnx.GraphProto:
    """The graph ONNX Runtime runs for ``model`` (a path, a ModelProto, its bytes or a ``runtime.Runnable``) at
    level ALL on ``backend`` with ``threads`` intra-op threads."""
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "ort_optimized.onnx"
        so = runtime.session_options(threads=threads)
        so.optimized_model_filepath = str(out)
        # weights to a side file: the saved model stays small (and under protobuf's 2 GiB) and is never read
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    "ort_optimized.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "0")
        if isinstance(model, Path):
            model = str(model)
        backend.session(model, options=so)
        return onnx.load_model(str(out), load_external_data=False).graph
