"""In-context costs: what each node of a whole graph costs as ONNX Runtime actually runs it.

One-node timings (:mod:`relsat.extract.measured`) cannot see what ONNX Runtime does to a whole
graph at level ALL: a BatchNormalization and a Relu folded into their Conv cost nothing there, a
MatMul + Add runs as one FusedGemm, NCHWc reorders appear, and a graph of many small kernels pays
the executor's per-kernel cost. This module prices the nodes of a whole exported graph as they run:

1. :func:`profile_graph` runs the graph in two ONNX Runtime sessions of the timing kind (level ALL,
   the user's provider and threads): one with ONNX Runtime's profiler, whose per-kernel durations
   (median over the runs) say where the time goes, and one without, whose median latency (by the
   clock of :func:`relsat.extract.profile.timer`) is what the graph costs, since the profiler
   itself slows small kernels down. Both are stored in the cost cache under a key that says what was
   timed: the graph (its weights by the digests of their data), provider, threads, clock and ONNX
   Runtime version.
2. :func:`attribute` charges every kernel to the graph nodes it came from. The profiler names each
   kernel after a source node: ``fused NAME/MatMulAddFusion``, ``NAME/MatmulTransposeFusion/``, or
   after the value a fused Conv writes (``VALUE_nchwc``); the nodes are renamed ``RELSATN<i>_`` for
   profiling so that a node is found in any such name. Kernels ONNX Runtime made up itself
   (``ReorderInput``, ``Gelu``, ``gemm_input_reshape``) go to the nearest named kernel in
   execution order (the next one for a reorder of inputs, else the one before). A node no kernel
   names was fused into a neighbour: a named node takes the unnamed producers it reaches backwards
   (a Conv and a BatchNormalization fused under their Relu's name), the rest join the group of
   their first producer (an Add fused into the MatMul before it) or, with none, of a consumer.
   Every group's kernel time is split among its members in proportion to their one-node costs, so
   each member of a fused Conv + BatchNormalization + Relu is charged its share. A group that no
   kernel names costs zero.
3. The kernel times are scaled so that the nodes' costs add up to the measured latency less the
   call overhead of ``session.run`` (calibrated once per cache): the prediction of a profiled graph
   is its measured latency, and the overhead between kernels is charged to kernels.

A cached profile is only as good as the moment it was taken: one taken while other jobs loaded the
machine predicted squeezenet at 5.7x its latency in every later run. So each row records its
conditions (``signature["conditions"]``: when, the load average, CPU count and threads, the latency
with its quartiles and runs, and the call overhead it was scaled with; :func:`relsat.extract.cost_cache.conditions`),
and the measured final choice (:mod:`relsat.driver.search.candidates`) checks every profile it used against
the fresh timing of the same graph; ``profile_graph(..., refresh=...)`` re-takes one that disagreed,
replacing its row.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import onnxruntime as ort

from relsat.relations import runtime
from relsat.relations.backend import CPU, Backend
from relsat.relations.digests import tensor_digest

from .cost_cache import CostCache, CostRow, conditions
from .profile import ProviderUnavailable, timing_kind, calibrated_call_overhead_ms, timer

GRAPH_OP = "__graph__"  # op_type of a whole-graph profile in the cost cache
BUDGET_S = 0.6  # about this long of timed runs per session, for fast graphs
MIN_RUNS, MAX_RUNS = 5, 200
WARMUP_RUNS, WARMUP_S, WARMUP_MAX = 3, 0.1, 50  # warm-up: at least 3 runs, up to 0.1 s (50 runs at most)
MIN_WEIGHT = 1e-6  # a member of a fused group with no one-node cost still gets a sliver
_TOKEN = re.compile(r"RELSATN(\d+)_")
_SUFFIXES = ("_kernel_time", "_nchwc")


@dataclass
class GraphProfile:
    """One whole graph as it runs: ``node_ms[i]`` is what node ``i`` of the model costs in it."""

    node_ms: np.ndarray
    latency_ms: float  # median latency of the whole graph (call overhead included)
    kernels_ms: float  # sum of the profiler's per-kernel medians
    call_overhead_ms: float
    kernels: int  # kernels that ran
    unnamed: int  # kernels charged to a neighbour because they name no node
    key: str
    cached: bool
    seconds: float
    conditions: dict | None = None  # what the row records it was taken under (None: a row from before they were kept)
    replaced: bool = False  # re-taken (``refresh``): the cache's row for this graph was replaced
    q1_ms: float | None = None  # quartiles of the whole-graph runs (None: not recorded)
    q3_ms: float | None = None
    blob: object = None  # the graph as profiled, made runnable when this call ran it (``runtime.runnable``: bytes
    # or a Runnable; its nodes renamed; None: from the cache, or over 2 GiB), which runs as the model does: a
    # caller timing it need not serialize it again


@contextlib.contextmanager
def _renamed(model: onnx.ModelProto):
    """``model`` with its nodes named ``RELSATN<i>_`` for as long as the block runs, then its names back
    (renamed in place: a copy of DistilBERT's 265 MB took 0.3 s a graph)."""
    names = [node.name if node.HasField("name") else None for node in model.graph.node]
    for i, node in enumerate(model.graph.node):
        node.name = f"RELSATN{i}_"
    try:
        yield model
    finally:
        for node, name in zip(model.graph.node, names):
            if name is None:  # (unnamed again, not named "": the model's bytes as they were)
                node.ClearField("name")
            else:
                node.name = name


def _graph_key(renamed: onnx.ModelProto, kind: str, threads: int, shapes=None,
               digests: dict[str, str] | None = None) -> str:
    """sha256 of what a graph profile depends on: the graph as profiled, part by part (its IR version,
    opsets, functions, inputs, outputs, value infos and nodes serialized; each weight over
    ``digests.MIN_BYTES`` by the digest of its data, from ``digests`` (initializer name -> digest, what the
    exporter hashed once a run) or else hashed here), the input shapes it ran at (a graph with dynamic dims
    runs at any), provider, threads, clock and ONNX Runtime version. Nothing is serialized whole: ViT-B/16's
    graphs took 1.1 s each to serialize for the key before."""
    parts = ["graph", kind, threads, timer(kind, threads).__name__, ort.__version__, renamed.ir_version]
    if shapes:
        parts.append(shapes)
    h = hashlib.sha256(json.dumps(parts).encode())
    g = renamed.graph

    def put(tag: bytes, data: bytes) -> None:
        h.update(tag + len(data).to_bytes(8, "little") + data)

    for part in (*renamed.opset_import, *renamed.functions, *g.input, *g.output, *g.value_info, *g.node,
                 *g.sparse_initializer):
        put(b"p", part.SerializeToString(deterministic=True))
    known = digests or {}
    for t in g.initializer:
        d = known.get(t.name) or tensor_digest(t)
        if d is None:
            put(b"t", t.SerializeToString(deterministic=True))
        else:
            put(b"d", f"{t.name}:{d}".encode())
    return h.hexdigest()


def restate_latency(cache: CostCache, key: str, latency_ms: float, bursts_ms: list[float], *,
                    quartiles_ms: tuple[float, float] | None = None, runs: int | None = None,
                    backend: Backend = CPU, threads: int = 1) -> bool:
    """Restate the latency of the whole-graph profile ``key`` (its kernels' shares kept) as ``latency_ms``, the
    middle of ``bursts_ms`` measured now (``quartiles_ms`` and ``runs``: that burst's, else the bursts' range
    and count); the row records the latency it had (``restated_from``) and the bursts.
    For a profile this run took that the run's timing and a re-measure both disagreed with: it was taken while
    the machine ran slower (ViT-B/16's original 1.5x its timing on a quiet machine), and kept as it was it is
    found stale in the next run, which then searches twice. False when the row is gone."""
    row = cache.rows([key]).get(key)
    if row is None:
        return False
    old, sig = row
    cond = dict(sig.get("conditions") or {})
    q1, q3 = quartiles_ms if quartiles_ms is not None else (min(bursts_ms), max(bursts_ms))
    cond.update(latency_ms=latency_ms, q1_ms=q1, q3_ms=q3, runs=runs or len(bursts_ms), restated_from=old,
                restated_bursts_ms=list(bursts_ms), restated_at=dt.datetime.now().isoformat(timespec="seconds"))
    cache.store([CostRow(key, timing_kind(backend), threads, GRAPH_OP, {**sig, "conditions": cond}, latency_ms,
                         cond["runs"], ort.__version__)])
    return True


def graph_key(model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, backend: Backend = CPU,
              threads: int = 1, digests: dict[str, str] | None = None) -> str:
    """The cache key :func:`profile_graph` files ``model``'s profile under, without profiling it: the name
    of the graph as it would run (a graph that was not profiled, timed as a candidate). ``digests``: as
    :func:`profile_graph`'s."""
    with _renamed(model) as renamed:
        return _graph_key(renamed, timing_kind(backend), threads, _shapes(model, feeds), digests)


def _shapes(model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    """The input shapes a graph's key names: those fed, where an input has a dynamic dim (else None)."""
    return sorted((k, list(np.shape(v))) for k, v in feeds.items()) if _dynamic(model) else None


def _dynamic(model: onnx.ModelProto) -> bool:
    """Whether a graph input has a dynamic dim (its profile then depends on the input shapes fed)."""
    return any(not d.HasField("dim_value") for v in model.graph.input for d in v.type.tensor_type.shape.dim)


def _kernel_medians(trace: list[dict]) -> dict[str, float]:
    """Median ms per kernel name, in order of first execution."""
    durations: dict[str, list[float]] = {}
    for e in trace:
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
            durations.setdefault(e["name"], []).append(float(e["dur"]) / 1e3)
    return {name: float(np.median(d)) for name, d in durations.items()}


def _source(name: str, producer: dict[str, int]) -> int | None:
    """The node a kernel is named after (module docstring), or None."""
    m = _TOKEN.search(name)
    if m:
        return int(m.group(1))
    base = name[len("fused "):] if name.startswith("fused ") else name
    for part in (base, base.split("/")[0]):
        for suffix in _SUFFIXES:
            part = part[:-len(suffix)] if part.endswith(suffix) else part
        if part in producer:
            return producer[part]
    return None


def _fusions(nodes: list, names: list[str], src: list) -> None:
    """Point each kernel ONNX Runtime made up by fusing graph nodes at the node it computes (in ``src``, in place):
    the kernel names no node (``SkipLayerNormalization_token_141``, ``BiasGelu``), but its name holds the op type
    of a node no kernel names, the first such node after the node of the named kernel before it (its Add +
    LayerNormalization: the LayerNormalization, which then takes the Add as every named node takes its unnamed
    producers). A kernel named as an op itself (``Transpose_token_12``: one the layout optimizer moved or made) is
    not a fusion of the graph's nodes and stays with its neighbour. Charged to
    the nearest named kernel instead, as layout kernels are, a SkipLayerNormalization's time (8.7x the two ops'
    on the CPU) went to the MatMul before it, and the norm over the Add was priced as if ONNX Runtime had not
    fused it."""
    claimed = {s for s in src if s is not None}
    last = -1  # the node of the last kernel that named one, in execution order
    for j, name in enumerate(names):
        if src[j] is not None:
            last = src[j]
            continue
        base = name[:-len("_kernel_time")] if name.endswith("_kernel_time") else name
        base = base.split("_token_")[0]
        pick = next((i for i in range(last + 1, len(nodes)) if i not in claimed and len(nodes[i].op_type) > 3
                     and nodes[i].op_type in base and nodes[i].op_type != base), None)
        if pick is not None:
            src[j] = pick
            claimed.add(pick)


def attribute(model: onnx.ModelProto, kernel_ms: dict[str, float], weights) -> tuple[np.ndarray, int]:
    """Per node of ``model`` (nodes named ``RELSATN<i>_``), its share of the kernel times (module
    docstring, step 2), and how many kernels named no node. ``kernel_ms`` is in execution order;
    ``weights`` are the nodes' one-node costs. The shares add up to the kernels' total."""
    nodes = list(model.graph.node)
    n = len(nodes)
    producer = {o: i for i, node in enumerate(nodes) for o in node.output if o}
    names = list(kernel_ms)
    src = [_source(k, producer) for k in names]
    _fusions(nodes, names, src)
    named = [j for j, s in enumerate(src) if s is not None]
    sources = set(src) - {None}
    kernel_time = np.zeros(n)
    for j, name in enumerate(names):
        s = src[j]
        if s is None and named:  # a kernel ONNX Runtime made up: its nearest named neighbour
            after = [k for k in named if k > j]
            before = [k for k in named if k < j]
            pick = after[0] if after and ("Input" in name or "input" in name or not before) else before[-1]
            s = src[pick]
        if s is not None:
            kernel_time[s] += kernel_ms[name]
    group = np.full(n, -1, dtype=np.int64)
    for s in sorted(sources):  # a named node and the unnamed producers it absorbed
        stack = [s]
        group[s] = s
        while stack:
            for v in nodes[stack.pop()].input:
                p = producer.get(v)
                if p is not None and group[p] < 0 and p not in sources:
                    group[p] = s
                    stack.append(p)
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for v in node.input:
            consumers.setdefault(v, []).append(i)
    for i, node in enumerate(nodes):  # the rest: fused into a producer (nodes are in topological order)
        if group[i] < 0:
            p = next((producer[v] for v in node.input if v in producer and group[producer[v]] >= 0), None)
            if p is not None:
                group[i] = group[p]
    for i in reversed(range(n)):  # ... or, with none, into a consumer
        if group[i] < 0:
            c = next((c for o in nodes[i].output for c in consumers.get(o, []) if group[c] >= 0), None)
            group[i] = group[c] if c is not None else i
    roots = group
    w = np.maximum(np.nan_to_num(np.asarray(weights, dtype=np.float64), nan=0.0), MIN_WEIGHT)
    group_time = np.bincount(roots, weights=kernel_time, minlength=n)
    group_weight = np.bincount(roots, weights=w, minlength=n)
    return group_time[roots] * w / group_weight[roots], sum(s is None for s in src)


def _session(model: onnx.ModelProto | bytes, backend: Backend, threads: int, profile_dir: str | None):
    opts = runtime.session_options(threads=threads)
    if profile_dir is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(profile_dir, "profile")
    return backend.session(model, threads=threads, options=opts)


def _runs(run, clock, budget_s: float) -> tuple[float, int, float, float]:
    """(median, runs, first and third quartile) in ms of a whole graph: warm-up (at least WARMUP_RUNS
    runs and, for fast graphs, about WARMUP_S, as whole-model timing does: two runs left a fresh
    session's first slow runs in the median), then about ``budget_s`` of runs (MIN_RUNS..MAX_RUNS)."""
    t = time.perf_counter()
    warm = 0
    while warm < WARMUP_RUNS or (time.perf_counter() - t < WARMUP_S and warm < WARMUP_MAX):
        run()
        warm += 1
    per = max((time.perf_counter() - t) / warm, 1e-6)
    n = int(min(MAX_RUNS, max(MIN_RUNS, budget_s / per)))
    times = []
    for _ in range(n):
        c = clock()
        run()
        times.append(clock() - c)
    q1, med, q3 = np.percentile(np.asarray(times) * 1e3, [25, 50, 75])
    return float(med), n, float(q1), float(q3)


def graph_latency(model: onnx.ModelProto | bytes, feeds: dict[str, np.ndarray], *, backend: Backend = CPU,
                  threads: int = 1, budget_s: float = BUDGET_S) -> tuple[float, float, float, int]:
    """(median, first and third quartile in ms, runs) of ``model`` as a whole, measured as
    :func:`profile_graph` measures a profile's latency (one session, warm-up, runs back to back, the
    same clock), without the profiler and without touching the cache: what re-measuring a cached
    profile's latency takes."""
    sess = _session(model, backend, threads, None)
    median, runs, q1, q3 = _runs(lambda: sess.run(None, feeds), timer(timing_kind(backend), threads), budget_s)
    return median, q1, q3, runs


def profile_graph(model: onnx.ModelProto, feeds: dict[str, np.ndarray], weights, *, backend: Backend = CPU,
                  threads: int = 1, cache: CostCache | None = None, budget_s: float = BUDGET_S,
                  refresh: bool | Callable[[str], bool] = False, digests: dict[str, str] | None = None,
                  arrays: dict | None = None) -> GraphProfile:
    """Profile ``model`` as a whole (module docstring) and price its nodes; ``feeds`` are its inputs,
    ``weights`` its nodes' one-node costs (how a fused group's time is shared); ``digests``: its weights'
    digests where its exporter hashed them (:mod:`relsat.relations.digests`; else hashed here); ``arrays``: the
    data of the weights it holds as shells, by name (an export with a memo: ``relsat.driver.boundary.onnx_export``),
    which the graph is run with (``runtime.runnable``) when its profile is not taken from the cache. From the cache when
    this graph was profiled before with these settings, unless ``refresh`` (True, or a function of the
    cache key saying whether to) re-takes it: the cached row is then ignored and replaced. Raises
    ProviderUnavailable when the backend cannot run whole graphs here through ONNX Runtime."""
    t0 = time.perf_counter()
    kind = timing_kind(backend)
    if not backend.profiles_graphs:
        raise ProviderUnavailable("whole graphs are profiled with ONNX Runtime, which has no CUDA provider here")
    blob = None  # serialized only to be run (a profile from the cache runs nothing)
    with _renamed(model) as renamed:
        key = _graph_key(renamed, kind, threads, _shapes(model, feeds), digests)
        overhead = calibrated_call_overhead_ms(backend, threads, cache)
        retake = refresh(key) if callable(refresh) else bool(refresh)
        hit = cache.rows([key]).get(key) if cache is not None else None
        replaced = retake and hit is not None
        if retake:
            hit = None
        if hit is not None:
            latency, sig = hit
            kernels = {k: float(v) for k, v in sig["kernels"]}
            cond = sig.get("conditions")
            q1, q3 = (cond.get("q1_ms"), cond.get("q3_ms")) if cond else (None, None)
            cached = True
        else:
            clock = timer(kind, threads)
            fetch = [o.name for o in model.graph.output]
            blob = runtime.runnable(renamed, arrays)  # bytes, or a Runnable (big weights as arrays)
            blob = None if isinstance(blob, onnx.ModelProto) else blob  # (over one buffer: run as the model)
            cond = conditions(threads)  # taken as the timing starts
            latency, q1, q3, runs = graph_latency(renamed if blob is None else blob, feeds, backend=backend,
                                                  threads=threads, budget_s=budget_s)
            with tempfile.TemporaryDirectory() as tmp:
                prof = _session(renamed if blob is None else blob, backend, threads, tmp)
                _runs(lambda: prof.run(fetch, feeds), clock, budget_s / 2)
                trace_file = prof.end_profiling()
                with open(trace_file) as f:
                    kernels = _kernel_medians(json.load(f))
                del prof
            cached = False
            cond.update(latency_ms=latency, q1_ms=q1, q3_ms=q3, runs=runs, clock=clock.__name__,
                        call_overhead_ms=overhead)
            if cache is not None:
                cache.store([CostRow(key, kind, threads, GRAPH_OP,
                                     {"nodes": len(model.graph.node), "kernels": list(kernels.items()),
                                      "conditions": cond},
                                     latency, runs, ort.__version__)])
        shares, unnamed = attribute(renamed, kernels, weights)
    total = float(shares.sum())
    scale = max(latency - overhead, 0.0) / total if total > 0 else 0.0
    return GraphProfile(shares * scale, float(latency), total, overhead, len(kernels), unnamed, key, cached,
                        time.perf_counter() - t0, cond, replaced, q1, q3, blob)
