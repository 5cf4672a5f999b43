"""Cached comparisons: what a measured choice found, recalled by a later run that reaches the same graphs.

A warm run on an unchanged model searches on the same cached prices and so finds the same candidate graphs;
timing them against the input model again (two sessions of each, interleaved; ViT-B/16's 66-80 s of a 108-122 s
warm run) repeats a verdict that an interleaved timing already gave. The verdict of a measured choice is stored
as a row of the cost cache (op_type ``COMPARISON_OP``): its key names the input model (the SHA-256 of its
bytes), every candidate graph (the cache key of its whole-graph profile, or the key it would have: the graph,
the timing kind, the threads and the shapes it ran at), the guard threshold, whether the choice writes simplified
graphs (and by which classes of work: ``ort_graph.CLASSES``) and the ONNX Runtime version; the row holds every
model's timing, the candidates' statuses (the one written: ``written``, or ``simplified``) and the guard's report,
and the conditions it was taken under.

Recalling one (``relsat.driver.search.candidates.Search.choose``) still times the input model and checks the
original's cached profile against it, so a cache poisoned by a loaded machine is found as before (the check's
gross drift). Where the comparison kept the input model, the candidates' timings and the verdict come from the
row. Where it wrote a candidate, that candidate is timed again against the input model as every written model
is (its confirmation) and verified: a model is written on a fresh timing of it, and only the losing candidates'
timings come from the row (ViT-B/16's warm run, writing its 1.07-1.10x faster graph: 118-122 s before). The key
names this machine too (its CPU model and count), so a cache carried to another machine recalls none. A fresh
cache (``--cost-cache``) forgets them, or ``DELETE FROM costs WHERE op_type = '__comparison__'`` on the cache file."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
from dataclasses import asdict

import onnxruntime as ort

from relsat.driver.boundary import ort_graph
from relsat.driver.boundary.latency import Latency
from relsat.extract.cost_cache import CostRow, conditions

COMPARISON_OP = "__comparison__"  # the op_type of a cached comparison's row


def comparison_key(input_sha256: str, graph_keys: list[str], kind: str, threads: int, threshold: float,
                   shapes, ort_version: str | None = None, simplify: bool = False) -> str:
    """The cache key of the comparison of the input model (``input_sha256``) with the graphs ``graph_keys``
    (order aside) timed as ``kind`` at ``threads`` and ``shapes``, judged at ``threshold``, by a choice that writes
    a simplified graph (``simplify``) or not."""
    head = ["comparison", input_sha256, sorted(graph_keys), kind, threads, round(float(threshold), 6),
            sorted((str(k), [str(d) for d in v]) for k, v in (shapes or {}).items()), ort_version or ort.__version__,
            machine()] + (["simplify", ort_graph.CLASSES] if simplify else [])
    return hashlib.sha256(json.dumps(head).encode()).hexdigest()


@functools.cache
def machine() -> list:
    """This machine as a comparison's key names it: its CPU model (Linux's /proc/cpuinfo; else
    ``platform.processor()``) and count."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return [platform.machine(), model, os.cpu_count()]


def input_sha256(blob: bytes | None, model) -> str:
    """The SHA-256 of the input model's bytes (``blob``, or the model serialized when it has none)."""
    return hashlib.sha256(blob if blob is not None else model.SerializeToString(deterministic=True)).hexdigest()


def recall(cache, key: str) -> dict | None:
    """The stored comparison under ``key`` (its record, with ``measured_at``), or None."""
    if cache is None:
        return None
    row = cache.rows([key]).get(key)
    if row is None or row[1].get("op_type") != COMPARISON_OP:
        return None
    record = row[1]
    try:
        record["original"] = Latency(**record["original"])
        for c in record["candidates"]:
            c["timing"] = Latency(**c["timing"]) if c.get("timing") is not None else None
    except (KeyError, TypeError):  # a row of another layout: not recalled (it is replaced when stored again)
        return None
    return record


def remember(cache, key: str, kind: str, threads: int, original: Latency, candidates: list, guard: dict | None,
             reopened: int = 0) -> None:
    """Store the comparison under ``key``: the input model's timing, each candidate's (``(label, timing,
    status, graph)``, in the order of the key's graphs' candidates; ``graph``, the key that names its graph in
    ``key``, may be left out), the guard's report, the conditions now, and how many recalls have timed a close
    miss among them again (``reopened``: ``Search._chance_in``). A recall pairs the rows with its candidates by
    their graphs (``Recall._paired``): ``key`` names the graphs order aside, and a later search can find the same
    graphs under other labels."""
    if cache is None:
        return
    record = {"op_type": COMPARISON_OP, "original": asdict(original),
              "candidates": [{"label": label, "timing": asdict(t) if t is not None else None, "status": status,
                              **({"graph": graph[0]} if graph else {})}
                             for label, t, status, *graph in candidates],
              "guard": guard, "conditions": conditions(threads), "reopened": int(reopened)}
    cache.store([CostRow(key, kind, threads, COMPARISON_OP, json.loads(json.dumps(record, default=float)),
                         original.cpu_ms, original.runs, ort.__version__)])
