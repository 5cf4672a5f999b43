"""The graph ONNX Runtime actually runs, as an op histogram: which fusions a rewrite enabled.

This module owns reading back ONNX Runtime's own optimized model (the graph after its level-ALL
fusions and layout changes, as saved by ``SessionOptions.optimized_model_filepath``) and counting its
operators, and the one-line before/after diff the benchmarks print beside a written model.

    ort_histogram(model_path_or_proto, threads=1, backend=CPU) -> Counter
    diff(before, after) -> "nodes 180->150: HardSigmoid 0->12, Mul 40->12, com.microsoft.FusedConv 0->4"

The session is made as timing sessions are (``relsat.relations.runtime.session_options``: level ALL,
``threads`` intra-op threads, sequential, on ``provider``), so the optimized graph is the one that is
timed: ONNX Runtime's choices depend on the thread count (e.g. NCHWc blocking) and the provider.
Counts are by domain-qualified op type: ``Conv`` (the default ONNX domain), ``com.microsoft.FusedConv``,
``com.microsoft.nchwc.Conv``; the nodes of subgraphs (``If``/``Loop``/``Scan`` bodies) are counted too.
The weights of the optimized model go to a side file that is never read (only the graph is).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import onnx

from relsat.relations import runtime
from relsat.relations.backend import CPU, Backend


def op_key(node: onnx.NodeProto) -> str:
    """``op_type`` qualified by its domain unless it is the default ONNX domain."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def histogram(graph: onnx.GraphProto) -> Counter:
    """Domain-qualified op counts of ``graph`` and of every subgraph in its nodes' attributes."""
    counts: Counter = Counter()
    for node in graph.node:
        counts[op_key(node)] += 1
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                counts += histogram(sub)
    return counts


def optimized_graph(model_path_or_proto, *, threads: int = 1, backend: Backend = CPU) -> onnx.GraphProto:
    """The graph ONNX Runtime runs for the model (a path or a ModelProto) at level ALL."""
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "ort_optimized.onnx"
        so = runtime.session_options(threads=threads)
        so.optimized_model_filepath = str(out)
        # weights to a side file: the saved model stays small (and under protobuf's 2 GiB) and is never read
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    "ort_optimized.data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "0")
        model = model_path_or_proto if isinstance(model_path_or_proto, onnx.ModelProto) else str(model_path_or_proto)
        backend.session(model, options=so)
        return onnx.load_model(str(out), load_external_data=False).graph


def ort_histogram(model_path_or_proto, threads: int = 1, backend: Backend = CPU) -> Counter:
    """Domain-qualified op counts of the graph ONNX Runtime runs for the model (module docstring)."""
    return histogram(optimized_graph(model_path_or_proto, threads=threads, backend=backend))


def diff(before: Counter | dict, after: Counter | dict, *, changed_only: bool = True) -> str:
    """``"nodes B->A: Op b->a, ..."`` over the op types whose count changed (all of them with
    ``changed_only=False``), default-domain ops first, each group by name; ``"nodes N->N: same ops"``
    when nothing changed."""
    keys = sorted(set(before) | set(after), key=lambda k: ("." in k, k))
    parts = [f"{k} {before.get(k, 0)}->{after.get(k, 0)}" for k in keys
             if not changed_only or before.get(k, 0) != after.get(k, 0)]
    head = f"nodes {sum(before.values())}->{sum(after.values())}"
    return f"{head}: {', '.join(parts) if parts else 'same ops'}"
