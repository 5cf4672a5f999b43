"""The graph ONNX Runtime actually runs, as an op histogram: which fusions a rewrite enabled.

This module owns the op histogram of ONNX Runtime's own optimized model (the graph after its level-ALL
fusions and layout changes, as saved by ``SessionOptions.optimized_model_filepath``) and the one-line
before/after diff the benchmarks print beside a written model.

    ort_histogram(model_path_or_proto, threads=1, backend=CPU) -> Counter
    diff(before, after) -> "nodes 180->150: HardSigmoid 0->12, Mul 40->12, com.microsoft.FusedConv 0->4"

The session is made as timing sessions are (``relsat.relations.runtime.session_options``: level ALL,
``threads`` intra-op threads, sequential, on ``provider``), so the optimized graph is the one that is
timed: ONNX Runtime's choices depend on the thread count (e.g. NCHWc blocking) and the provider.
Counts are by domain-qualified op type: ``Conv`` (the default ONNX domain), ``com.microsoft.FusedConv``,
``com.microsoft.nchwc.Conv``; the nodes of subgraphs (``If``/``Loop``/``Scan`` bodies) are counted too.
The weights of the optimized model go to a side file that is never read (only the graph is). Reading the
graph back is ``relsat.driver.boundary.ort_graph``'s (the measured choice asks it too); this module counts and prints.
"""

from __future__ import annotations

from collections import Counter

from relsat.relations.backend import CPU, Backend

from relsat.driver.boundary.ort_graph import histogram, op_key, optimized_graph

__all__ = ["diff", "histogram", "op_key", "optimized_graph", "ort_histogram"]


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
