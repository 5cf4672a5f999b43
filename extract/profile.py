"""Measured per-operator costs: what one operator instance costs on a provider, in ms.

Owns the operator signature (:class:`OpSample` and its cache key), the one-node model
built to time it, and :func:`profile`, which answers from the :class:`CostCache` where it
can and times the rest on the ``Backend`` it is given (relsat.relations.backend): with ONNX Runtime
(or, for CUDA without onnxruntime-gpu, with PyTorch via :mod:`relsat.extract.torch_cuda`). Sessions use the same
options as whole-model timing: ``threads`` intra-op threads, one inter-op thread,
sequential execution, ``ORT_ENABLE_ALL``. With one thread on the CPU the calling thread's CPU
time is measured (see :func:`timer`); the clock is part of the cache key.

The onnxruntime version is part of every key. A signature missing from the cache under the
running version is looked up under the other versions the cache holds for the same backend
and threads (a cost table imported from elsewhere); such costs are used as they are, not timed
again, and counted in ``ProfileReport.other_versions``. The fixed cost of a ``session.run``
call is calibrated once per cache (:func:`calibrated_call_overhead_ms`, a row of its own that records
the conditions it was timed under, timed as a few bursts of runs); like every timing it can go stale
(measured here: 8 us with both cores busy, 13-17 us on the same machine quieter, and 7.8-18.5 us from one
burst to the next on a quiet one), so :func:`check_call_overhead` compares it with a fresh timing and
replaces it when no burst of that timing comes near it and the difference moves the input graph's
prediction by more than ``OVERHEAD_MATERIAL`` (the optimize pipeline checks it after pricing the input
graph, and prices it again when the row was replaced).
PyTorch's runtime (timing kind ``cuda-torch``) also pays a cost per node that one-node timings do not see; it
is calibrated the same way (:func:`calibrated_node_overhead_ms`) and added to every operator's cost.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from relsat.relations import runtime
from relsat.relations.backend import CPU, Backend
from relsat.relations.catalog import for_node

from .cost_cache import CostCache, CostRow, conditions

IR_VERSION = 10  # onnx 1.23 writes IR 14 by default, which onnxruntime 1.31 refuses
FLUSH_EVERY = 200  # store new measurements every this many samples
MIN_REPEATS = 3  # timed runs a sample gets even when it overruns its time budget
OVERHEAD_BURSTS = 5  # the call overhead is timed as this many bursts (sessions) of runs, their median kept
OVERHEAD_MATERIAL = 0.03  # a fresh call overhead that would move the input graph's one-node prediction by less
# than this (the guard's threshold: what relsat calls noise in a latency) does not replace the cached one
CALL_OVERHEAD_OP = "__call_overhead__"  # the op_type of the call overhead's cache row
NODE_OVERHEAD_OP = "__node_overhead__"  # the op_type of the PyTorch runtime's per-node cost row
# PyTorch on CUDA: a one-node timing of a few microseconds is a median of at least this many runs (an operator
# timed alone runs in about its launch, so 50 runs cost little; a slow one stops at its time budget)
TORCH_WARMUP, TORCH_REPEATS = 10, 50


class ProviderUnavailable(RuntimeError):
    """The requested execution provider cannot be used on this machine."""


@dataclass(frozen=True)
class OpSample:
    """One operator instance to time.

    ``inputs`` are the runtime inputs ``(name, TensorProto dtype, shape)``; ``initializers``
    are constant inputs (a Reshape's shape, Clip's bounds) and part of the signature.
    ``node`` names its inputs/outputs with these names ("" for absent optional ones);
    ``outputs`` are the node outputs to fetch.
    """

    node: onnx.NodeProto
    inputs: tuple[tuple[str, int, tuple[int, ...]], ...]
    initializers: tuple[onnx.TensorProto, ...]
    outputs: tuple[str, ...]
    opset: int = 17
    domain_opsets: tuple[tuple[str, int], ...] = ()

    def _slots(self) -> tuple[list, list[onnx.TensorProto]]:
        """Name-free description of each node input, plus the constants in first-use order."""
        runtime = {name: (dtype, tuple(shape)) for name, dtype, shape in self.inputs}
        consts = {t.name: t for t in self.initializers}
        order: dict[str, int] = {}
        slots: list = []
        for name in self.node.input:
            if not name:
                slots.append(None)
                continue
            idx = order.setdefault(name, len(order))
            if name in runtime:
                slots.append(["input", idx, runtime[name][0], list(runtime[name][1])])
            elif name in consts:
                slots.append(["const", idx, consts[name].data_type, list(consts[name].dims)])
            else:
                slots.append(["unbound", idx])
        used = [consts[n] for n in order if n in consts and n not in runtime]
        return slots, used

    def key(self, kind: str, threads: int, ort_version: str | None = None) -> str:
        """sha256 of everything that determines the cost; node, input and output names excluded.
        ``ort_version``: the onnxruntime version the cost is for (default: the running one)."""
        slots, consts = self._slots()
        fetched = [i for i, o in enumerate(self.node.output) if o and o in self.outputs]
        head = [kind, threads, timer(kind, threads).__name__, ort_version or ort.__version__, self.node.op_type,
                self.node.domain, self.opset, sorted(self.domain_opsets), slots, fetched, len(self.node.output)]
        h = hashlib.sha256(json.dumps(head).encode())
        blobs = [a.SerializeToString(deterministic=True)
                 for a in sorted(self.node.attribute, key=lambda a: a.name)]
        blobs += [numpy_helper.to_array(t).tobytes() for t in consts]
        for blob in blobs:
            h.update(len(blob).to_bytes(8, "little") + blob)
        return h.hexdigest()

    def describe(self) -> dict:
        """Human-readable, JSON-able signature (stored next to the cached cost)."""
        slots, consts = self._slots()
        values = {t.name: numpy_helper.to_array(t) for t in consts}

        def entry(name, slot):
            if slot is None or slot[0] == "unbound":
                return slot and {"unbound": True}
            out = {"dtype": onnx.TensorProto.DataType.Name(slot[2]), "shape": slot[3]}
            if slot[0] == "const":
                v = values[name]
                out["value"] = _jsonable(v.tolist()) if v.size <= 64 else f"<{v.size} values>"
            return out

        return {
            "op_type": self.node.op_type,
            "domain": self.node.domain,
            "opset": self.opset,
            "attributes": {a.name: _jsonable(helper.get_attribute_value(a))
                           for a in sorted(self.node.attribute, key=lambda a: a.name)},
            "inputs": [entry(n, s) for n, s in zip(self.node.input, slots)],
            "outputs": len(self.node.output),
        }


def _jsonable(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, onnx.TensorProto):
        return _jsonable(numpy_helper.to_array(value).tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no inf/nan
    if isinstance(value, (int, float, str)):
        return value
    return f"<{type(value).__name__}>"


def build_model(sample: OpSample) -> onnx.ModelProto:
    """A checker-valid one-node model; output types come from onnx shape inference.

    Outputs that onnx cannot type (ops of non-default domains) are declared without a type
    and left to onnxruntime; such models skip the checker.
    """
    opsets = [helper.make_opsetid("", sample.opset)] + [
        helper.make_opsetid(d, v) for d, v in sample.domain_opsets]
    inputs = [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in sample.inputs]

    def model(outputs):
        graph = helper.make_graph([sample.node], sample.node.op_type, inputs, outputs,
                                  initializer=list(sample.initializers))
        return helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)

    inferred = onnx.shape_inference.infer_shapes(model([]), strict_mode=True)
    typed = {vi.name: vi for vi in inferred.graph.value_info}
    result = model([typed.get(o) or helper.make_empty_tensor_value_info(o)
                    for o in sample.outputs])
    if all(o in typed for o in sample.outputs):
        onnx.checker.check_model(result)
    return result


def timing_kind(backend: Backend) -> str:
    """What times one node of ``backend`` here (``Backend.timing``; recorded in the cache keys, as costs
    of different kinds differ); ProviderUnavailable where nothing can."""
    if backend.timing is None:
        raise ProviderUnavailable(backend.unavailable())
    return backend.timing


def _index_range(sample: OpSample, op) -> dict[str, tuple[int, int]]:
    """The range [0, min(4, dim)) for the operator's index input (the catalog's ``indexes``), the dim being its
    data's along ``axis``: an index out of range is an error under ONNX Runtime, a fault under PyTorch CUDA."""
    if op is None or op.indexes is None:
        return {}
    at, of = op.indexes
    node = sample.node
    if max(at, of) >= len(node.input) or not node.input[at]:
        return {}
    shapes = {name: tuple(shape) for name, _, shape in sample.inputs}
    shapes.update((t.name, tuple(t.dims)) for t in sample.initializers)
    shape = shapes.get(node.input[of], ())
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    axis = axis + len(shape) if axis < 0 else axis
    dim = shape[axis] if 0 <= axis < len(shape) else None
    return {node.input[at]: (0, max(1, min(4, dim)))} if isinstance(dim, int) else {}


def random_inputs(sample: OpSample, rng: np.random.Generator, op=None) -> dict[str, np.ndarray]:
    """Runtime inputs (``relations.runtime.random_feeds``): floats ~ N(0, 1), bools uniform, integers
    in [0, 4) (semantics unknown; a divisor, the catalog's ``nonzero`` inputs or Mod's, gets [1, 4) so
    that integer division never faults; an index, the catalog's ``indexes``, stays within its data's dim).
    ``op``: the node's entry where it is not the catalog's (an opaque operator's PyTorch mapping)."""
    op = op or for_node(sample.node.domain, sample.node.op_type)
    nonzero = op.nonzero if op is not None else (1,) if sample.node.op_type == "Mod" else ()
    ranges = {sample.node.input[i]: (1, 4) for i in nonzero if i < len(sample.node.input)}
    ranges.update(_index_range(sample, op))
    specs = [(name, shape, runtime.np_dtype(dtype)) for name, dtype, shape in sample.inputs]
    return runtime.random_feeds(specs, rng=rng, int_range=(0, 4), int_ranges=ranges)


def timer(kind: str, threads: int):
    """The clock a timing uses: with one intra-op thread on the CPU, ONNX Runtime runs the kernel on
    the calling thread, so that thread's CPU time measures it without the time other processes
    take on a shared machine; otherwise the wall clock."""
    return time.thread_time if kind == "cpu" and threads == 1 else time.perf_counter


def _median_ms(run, warmup: int, repeats: int, budget_s: float | None = None,
               clock=time.perf_counter, times_out: list | None = None) -> tuple[float, int]:
    """Median ms (by ``clock``) over at most ``repeats`` timed runs after at most ``warmup`` runs, and
    the runs timed. With ``budget_s``, slow operators get fewer runs: warm-up stops after half the
    budget (at least one run), timing once the budget is spent and ``MIN_REPEATS`` runs were timed.
    ``times_out``, when given, receives every timed run in ms."""
    start = time.perf_counter()
    for _ in range(warmup):
        run()
        if budget_s is not None and time.perf_counter() - start > budget_s / 2:
            break
    times: list[float] = []
    start = time.perf_counter()
    for _ in range(repeats):
        t = clock()
        run()
        times.append(clock() - t)
        if budget_s is not None and len(times) >= MIN_REPEATS and time.perf_counter() - start > budget_s:
            break
    if times_out is not None:
        times_out.extend(t * 1e3 for t in times)
    return float(np.median(times) * 1e3), len(times)


def _time_sample(sample: OpSample, backend: Backend, threads: int, warmup: int, repeats: int,
                 rng: np.random.Generator, budget_s: float | None = None,
                 times_out: list | None = None) -> tuple[float, int]:
    """(median ms, timed runs) of one sample; ``times_out`` receives the timed runs (ONNX Runtime only)."""
    kind = timing_kind(backend)
    if kind == "cuda-torch":
        from . import torch_cuda
        feeds = random_inputs(sample, rng, torch_cuda.op_def(sample.node))
        consts = {t.name: numpy_helper.to_array(t) for t in sample.initializers}
        return torch_cuda.time_op(sample, {**consts, **feeds}, max(warmup, TORCH_WARMUP), max(repeats, TORCH_REPEATS),
                                  budget_s, MIN_REPEATS)
    feeds = random_inputs(sample, rng)
    session = backend.session(build_model(sample), threads=threads)
    if not backend.cuda:
        return _median_ms(lambda: session.run(list(sample.outputs), feeds), warmup, repeats, budget_s,
                          timer(kind, threads), times_out)
    binding = session.io_binding()  # CUDA: keep data on the device, time the kernels only
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0))
    for name in sample.outputs:
        binding.bind_output(name, "cuda")
    return _median_ms(lambda: session.run_with_iobinding(binding), warmup, repeats, budget_s, times_out=times_out)


def call_overhead_ms(backend: Backend = CPU, threads: int = 1, repeats: int = 200,
                     times_out: list | None = None) -> float:
    """Median ms of running a one-node model that does nothing (Identity of one float): the
    fixed cost of a ``session.run`` call that every one-node timing includes and that an
    operator inside a whole model does not pay. ``times_out`` receives every timed run."""
    node = helper.make_node("Identity", ["x"], ["y"])
    sample = OpSample(node, (("x", onnx.TensorProto.FLOAT, (1,)),), (), ("y",))
    return _time_sample(sample, backend, threads, 20, repeats, np.random.default_rng(0),
                        times_out=times_out)[0]


def call_overhead_key(kind: str, threads: int, ort_version: str | None = None) -> str:
    """The cost cache key of the call overhead: what was timed, the backend, threads, the clock
    and the onnxruntime version (default: the running one)."""
    head = ["call-overhead", kind, threads, timer(kind, threads).__name__, ort_version or ort.__version__]
    return hashlib.sha256(json.dumps(head).encode()).hexdigest()


def calibrated_call_overhead_ms(backend: Backend, threads: int, cache: CostCache | None) -> float:
    """:func:`call_overhead_ms`, calibrated once per cache: the cache's row for it
    (:func:`call_overhead_key`, op_type ``CALL_OVERHEAD_OP``) when there is one, else timed now
    and stored; with ``cache`` None, timed. When ``backend`` cannot run here, a row of any
    timing kind that stands for it, of this onnxruntime version or else of another, is used; without
    one, ProviderUnavailable. :func:`check_call_overhead` replaces a row that went stale."""
    try:
        kinds, unavailable = [timing_kind(backend)], None
    except ProviderUnavailable as e:
        kinds, unavailable = list(backend.cost_backends), e
    if cache is not None:
        keys = [call_overhead_key(b, threads) for b in kinds]
        found = cache.lookup(keys)
        ms = next((found[k] for k in keys if k in found), None)
        if ms is None and unavailable is not None:
            other = _from_other_versions({"": lambda v: [call_overhead_key(b, threads, v) for b in kinds]},
                                         kinds, threads, cache)
            ms = other[""][1] if other else None
        if ms is not None:
            return ms
    if unavailable is not None:
        raise unavailable
    ms, row = _timed_call_overhead(backend, threads)
    if cache is not None:
        cache.store([row])
    return ms


def _timed_call_overhead(backend: Backend, threads: int, repeats: int = 200,
                         bursts: int = OVERHEAD_BURSTS) -> tuple[float, CostRow]:
    """The call overhead timed now, and its cache row: ``bursts`` timings of ``repeats`` runs each (a session
    each), their median; the signature records the conditions (:func:`relsat.extract.cost_cache.conditions`),
    the quartiles of all the runs and every burst's median (``bursts_ms``: how far it moves from one moment
    to the next, which one burst's quartiles do not show)."""
    cond = conditions(threads)
    times: list[float] = []
    kind = timing_kind(backend)
    medians = [call_overhead_ms(backend, threads, repeats, times_out=times) for _ in range(max(1, bursts))]
    ms = float(np.median(medians))
    if times:
        q1, q3 = np.percentile(times, [25, 75])
        cond.update(q1_ms=float(q1), q3_ms=float(q3))
    cond.update(latency_ms=ms, runs=len(times) or repeats, clock=timer(kind, threads).__name__,
                bursts_ms=[float(m) for m in medians])
    return ms, CostRow(call_overhead_key(kind, threads), kind, threads, CALL_OVERHEAD_OP,
                       {"op_type": CALL_OVERHEAD_OP, "timed": "session.run of a one-node Identity of one float",
                        "conditions": cond}, ms, len(times) or repeats, ort.__version__)


def check_call_overhead(backend: Backend, threads: int, cache: CostCache, floor: float = 0.10, *,
                        nodes: int | None = None, cost_ms: float | None = None,
                        taken_since: dt.datetime | None = None) -> dict | None:
    """The cached call overhead against a fresh timing of it (:func:`_timed_call_overhead`, a few bursts): the
    row is replaced when no fresh burst comes near it, the cached value outside the bursts' range widened by
    ``floor`` on either side (a row taken while other jobs shared the machine, or on another one), and the
    difference matters: every one-node cost of a graph of ``nodes`` nodes whose one-node prediction is
    ``cost_ms`` (priced with the cached row) moves by it, and a change that moves that prediction by less than
    ``OVERHEAD_MATERIAL`` keeps the row (without ``nodes`` and ``cost_ms`` every disagreement counts). Stored
    when the cache has none. A row taken at or after ``taken_since`` (the run's start: this run calibrated it a
    moment ago, on a cold cache) is a fresh timing itself: kept, not timed again (``taken_this_run``), since a
    second timing a second later is no better and replacing the first moved the run's own prices between its
    input graph and its e-graph. Returns what was compared (``replaced`` says whether the row was, ``shift``
    the fraction of the prediction the fresh value would move); None when ``backend`` cannot be timed here
    (its row, from elsewhere, is kept).

    Both keep a warm cache's prices, and so the candidate graphs and their cached whole-graph profiles, the
    same from run to run. The overhead moves from moment to moment on a quiet machine (2 threads, 200 runs a
    burst, eight bursts 0.3 s apart in each of four processes: 7.8-18.5 us, one process 7.8-16.5), while one
    burst's quartiles are narrow (8.0-8.7 us); compared with those, the row was replaced in most runs, which
    moved ViT-B/16's one-node costs by 6 us each (2 % of its prediction), changed the ILP's near-ties and so
    every candidate graph, whose profiles (10 s each) were then all taken again."""
    try:
        key = call_overhead_key(timing_kind(backend), threads)
    except ProviderUnavailable:
        return None
    row = cache.rows([key]).get(key)
    cached = row[0] if row is not None else None
    taken = row[1].get("conditions", {}).get("measured_at") if row is not None else None
    if taken is not None and taken_since is not None and \
            dt.datetime.fromisoformat(taken) >= taken_since.replace(microsecond=0):
        return {"cached_ms": cached, "fresh_ms": None, "ratio": None, "range_ms": None, "shift": None,
                "beyond_noise": False, "replaced": False, "taken_this_run": True,
                "cached_conditions": row[1].get("conditions")}
    fresh, new = _timed_call_overhead(backend, threads)
    bursts = new.signature["conditions"]["bursts_ms"]
    low, high = min(bursts) / (1 + floor), max(bursts) * (1 + floor)
    ratio = cached / fresh if cached is not None and fresh > 0 else None
    shift = (nodes * abs(fresh - cached) / cost_ms if cached is not None and nodes is not None
             and cost_ms is not None and cost_ms > 0 else None)
    beyond = cached is None or not low <= cached <= high
    replace = beyond and (shift is None or shift > OVERHEAD_MATERIAL)
    if replace:
        cache.store([new])
    return {"cached_ms": cached, "fresh_ms": fresh, "ratio": ratio, "range_ms": [low, high], "shift": shift,
            "beyond_noise": beyond, "replaced": replace, "taken_this_run": False,
            "cached_conditions": row[1].get("conditions") if row is not None else None}


def node_overhead_key(kind: str, threads: int, ort_version: str | None = None) -> str:
    """The cost cache key of the per-node cost of a whole-graph runtime (:func:`calibrated_node_overhead_ms`):
    what was timed, the timing kind, threads, the clock and the onnxruntime version (default: the running one),
    as :func:`call_overhead_key`."""
    head = ["node-overhead", kind, threads, timer(kind, threads).__name__, ort_version or ort.__version__]
    return hashlib.sha256(json.dumps(head).encode()).hexdigest()


# the timing kinds whose whole-graph runtime pays a per-node cost that their one-node timings do not see
NODE_OVERHEAD_KINDS = ("cuda-torch",)
# timing kind -> what one more node costs its whole-graph runtime (``f(op_type) -> {"ms": ..., ...}``): the runtime
# lives in driver (relsat.driver.boundary.torch_runtime registers ``runtime_node_ms`` on import), above this layer
NODE_TIMERS: dict[str, Callable[[str], dict]] = {}


def calibrated_node_overhead_ms(backend: Backend, threads: int, cache: CostCache | None) -> float:
    """What every node costs the whole-graph runtime of ``backend`` beyond its one-node timing (less the call
    overhead), in ms: added to each operator's cost by :mod:`relsat.extract.measured`. Only PyTorch's runtime
    (``--provider cuda`` without onnxruntime-gpu, timing kind ``cuda-torch``) has one: it gathers a node's inputs,
    builds its operator's namespace and evaluates its expression on every run, for every node
    (:data:`NODE_TIMERS`, ``torch_runtime.runtime_node_ms``: the marginal cost of an Identity node in a chain of them,
    through :class:`~relsat.driver.boundary.torch_runtime.TorchSession`), where a one-node timing builds the
    closure once and times its call. So one node fewer is cheaper by about this much, which one-node costs of a few
    microseconds, each with its own noise, do not say by themselves. 0.0 for ONNX Runtime (CPU or CUDA), whose
    costs are unchanged.

    Calibrated once per cache like the call overhead: the cache's row (:func:`node_overhead_key`, op_type
    ``NODE_OVERHEAD_OP``, its signature the conditions it was timed under) when there is one, else timed now (a
    fraction of a second) and stored; with ``cache`` None, timed. Where ``backend`` cannot run here (costs from a
    table measured elsewhere), the table's row, of this onnxruntime version or else of another, or 0.0 without
    one."""
    try:
        kind = timing_kind(backend)
    except ProviderUnavailable:
        if cache is None or not backend.cuda:
            return 0.0
        keys = [node_overhead_key(k, threads) for k in NODE_OVERHEAD_KINDS]
        found = cache.lookup(keys)
        ms = next((found[k] for k in keys if k in found), None)
        if ms is None:
            other = _from_other_versions(
                {"": lambda v: [node_overhead_key(k, threads, v) for k in NODE_OVERHEAD_KINDS]},
                list(NODE_OVERHEAD_KINDS), threads, cache)
            ms = other[""][1] if other else None
        return ms if ms is not None else 0.0
    if kind not in NODE_OVERHEAD_KINDS:
        return 0.0
    key = node_overhead_key(kind, threads)
    if cache is not None:
        found = cache.lookup([key])
        if key in found:
            return found[key]
    ms, row = _timed_node_overhead(kind, threads)
    if cache is not None:
        cache.store([row])
    return ms


def _timed_node_overhead(kind: str, threads: int) -> tuple[float, CostRow]:
    """The per-node cost of the PyTorch runtime timed now, and its cache row: the signature records the conditions
    (:func:`relsat.extract.cost_cache.conditions`), the chains' percentiles, and beside them a chain of
    one-element Adds (each a kernel launch) for comparison."""
    from . import torch_cuda
    timer = NODE_TIMERS.get(kind)
    if timer is None:
        raise RuntimeError(f"no whole-graph runtime registered to time the per-node cost of {kind} "
                           "(import relsat.driver.boundary.torch_runtime)")
    cond = conditions(threads)
    identity = timer("Identity")
    add = timer("Add")
    cond.update(latency_ms=identity["ms"], clock="perf_counter", torch=torch_cuda.torch.__version__,
                device=torch_cuda.torch.cuda.get_device_name())
    signature = {"op_type": NODE_OVERHEAD_OP,
                 "timed": "one more Identity node of a chain run by the PyTorch runtime (TorchSession) on CUDA",
                 "identity": identity, "add": add, "conditions": cond}
    return identity["ms"], CostRow(node_overhead_key(kind, threads), kind, threads, NODE_OVERHEAD_OP, signature,
                                   identity["ms"], identity["rounds"], ort.__version__)


def _from_other_versions(todo: dict[str, Callable[[str], list[str]]], backends: list[str], threads: int,
                         cache: CostCache) -> dict[str, tuple[str, float, str]]:
    """For each key of ``todo`` (missing under the running onnxruntime version), the first cached
    key among ``todo[key](version)`` for the other versions the cache holds for ``backends`` and
    ``threads`` (the most recently measured first): ``{key: (found key, ms, version)}``."""
    versions = [v for v in cache.versions(backends, threads) if v != ort.__version__] if todo else []
    if not versions:
        return {}
    alternatives = {k: [(a, v) for v in versions for a in keys_for(v)] for k, keys_for in todo.items()}
    found = cache.lookup(sorted({a for pairs in alternatives.values() for a, _ in pairs}))
    out = {}
    for k, pairs in alternatives.items():
        hit, version = next(((a, v) for a, v in pairs if a in found), (None, None))
        if hit is not None:
            out[k] = (hit, found[hit], version)
    return out


@dataclass
class ProfileReport:
    """Result of :func:`profile`: ``ms[i]`` is the cost of ``samples[i]`` (NaN on failure)."""

    ms: np.ndarray
    keys: list[str]
    measured: int = 0  # new signatures timed successfully
    cached: int = 0  # signatures answered by the cache (other_versions' included)
    failures: dict[str, str] = field(default_factory=dict)  # key -> reason
    new_keys: set[str] = field(default_factory=set)  # the signatures timed by this call
    other_versions: dict[str, int] = field(default_factory=dict)  # onnxruntime version -> signatures from its rows

    def use_other_versions(self, hits: dict[str, tuple[str, float, str]], costs: dict[str, float]) -> None:
        """Answer the signatures of ``hits`` (:func:`_from_other_versions`) with their rows: into
        ``costs`` under the rows' keys, which replace theirs in ``keys``; counted."""
        for found, ms, version in hits.values():
            costs[found] = ms
            self.other_versions[version] = self.other_versions.get(version, 0) + 1
        self.cached += len(hits)
        self.keys = [hits[k][0] if k in hits else k for k in self.keys]


def profile(samples: list[OpSample], *, backend: Backend = CPU, threads: int = 1,
            cache: CostCache | None = None, warmup: int = 3, repeats: int = 10,
            progress: bool | Callable[[int, int], None] = True, time_budget_s: float | None = None,
            sample_budget_s: float | None = None) -> ProfileReport:
    """Median ms per sample over ``repeats`` timed runs after ``warmup`` runs.

    Samples are deduplicated by key and looked up in ``cache`` first; each missing signature
    gets its own session. New measurements are stored in batches of ``FLUSH_EVERY`` and at
    the end (also on interruption). A sample that fails to build or run, or is not reached
    within ``time_budget_s``, costs NaN and its reason is kept in ``report.failures``.
    ``sample_budget_s`` caps the time spent timing one slow sample (see :func:`_median_ms`).
    ``progress``: a rich progress bar when true, or a callback ``progress(done, total)``
    called after each new signature.
    """
    kind = timing_kind(backend)
    keys = [s.key(kind, threads) for s in samples]
    unique = dict(zip(keys, samples))
    costs = cache.lookup(list(unique)) if cache is not None else {}
    report = ProfileReport(ms=np.full(len(samples), np.nan), keys=keys, cached=len(costs))
    missing = [k for k in unique if k not in costs]
    if cache is not None and missing:
        hits = _from_other_versions({k: lambda v, s=unique[k]: [s.key(kind, threads, v)] for k in missing},
                                    [kind], threads, cache)
        report.use_other_versions(hits, costs)
        missing = [k for k in missing if k not in hits]
    pending: list[CostRow] = []

    def flush():
        if cache is not None and pending:
            cache.store(pending)
        pending.clear()

    bar = None
    callback = progress if callable(progress) else None
    if progress is True and len(missing) > 5:
        from rich.progress import Progress
        bar = Progress(transient=True)
        task = bar.add_task(f"profiling {len(missing)} operators ({backend.name})", total=len(missing))
        bar.start()
    start = time.monotonic()
    try:
        for key in missing:
            sample = unique[key]
            if time_budget_s is not None and time.monotonic() - start > time_budget_s:
                report.failures[key] = f"skipped: time budget of {time_budget_s} s exhausted"
            else:
                try:
                    rng = np.random.default_rng(int(key[:16], 16))
                    ms, runs = _time_sample(sample, backend, threads, warmup, repeats, rng, sample_budget_s)
                except Exception as exc:  # any failure costs NaN, never the whole profile
                    report.failures[key] = f"{type(exc).__name__}: {exc}".strip()
                else:
                    costs[key] = ms
                    report.measured += 1
                    report.new_keys.add(key)
                    pending.append(CostRow(key, kind, threads, sample.node.op_type,
                                           sample.describe(), ms, runs, ort.__version__))
                    if len(pending) >= FLUSH_EVERY:
                        flush()
            if bar is not None:
                bar.advance(task)
            if callback is not None:
                callback(len(report.failures) + report.measured, len(missing))
    finally:
        if bar is not None:
            bar.stop()
        flush()
    report.ms[:] = [costs.get(k, np.nan) for k in report.keys]
    return report


def lookup(samples: list[OpSample], *, backend: Backend = CPU, threads: int = 1,
           cache: CostCache) -> ProfileReport:
    """Costs of ``samples`` from ``cache`` alone, without timing anything (NaN where absent), so
    that a cost table measured elsewhere (the CUDA backend on a machine without a GPU) can be
    used. For CUDA both timing kinds' keys are tried, onnxruntime's first; rows of other
    onnxruntime versions answer what this version's do not."""
    backends = backend.cost_backends
    per = [[s.key(b, threads) for s in samples] for b in backends]
    found = cache.lookup(sorted({k for keys in per for k in keys}))
    keys = [next((k for k in ks if k in found), ks[0]) for ks in zip(*per)]
    report = ProfileReport(ms=np.full(len(samples), np.nan), keys=keys, cached=len({k for k in keys if k in found}))
    missing = {k: s for k, s in zip(keys, samples) if k not in found}
    hits = _from_other_versions({k: lambda v, s=s: [s.key(b, threads, v) for b in backends]
                                 for k, s in missing.items()}, backends, threads, cache)
    report.use_other_versions(hits, found)
    for k in report.keys:
        if k not in found:
            report.failures[k] = f"not in the cost cache and provider {backend.name!r} cannot run here"
    report.ms[:] = [found.get(k, np.nan) for k in report.keys]
    return report
