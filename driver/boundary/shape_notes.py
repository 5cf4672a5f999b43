"""Inferred shapes written into a graph (its ``value_info``), where ONNX Runtime then runs no op more often.

ONNX Runtime infers shapes itself when it loads a model, but a dim it cannot compute (a NonZero's count, a size read
from a ``Shape`` through a ``Concat``) it leaves unnamed, and its memory planner reuses an input's buffer for an
output (ScatterElements, element-wise ops) only where it can prove both of one size: two unnamed dims prove nothing.
ONNX's own shape inference names such a dim once (``unk__N``) and carries the name to every tensor of that size,
which is what onnxsim writes into its outputs. Faster R-CNN (MobileNetV3, 3x128x128, 2 threads, ONNX Runtime's
profiler): its RoI pooling's two ScatterElements over 150x256x7x7 floats ran 6.1 + 0.43 ms without the names and
4.8 + 0.015 ms with them, in place.

Names also let ONNX Runtime fuse where it could not: with them, DistilBERT's residual Add + LayerNormalization become
SkipLayerNormalization (0 -> 12), whose CPU kernel ran 8.7x slower than the two ops it replaces (RESULTS, thirty-fifth
session), and the model 0.92x. So the names are written only where they do not change what ONNX Runtime runs beyond
taking kernels away:

    notes(model, data_prop) -> list        the inferred shapes (ValueInfoProtos) of the values the graph's nodes
                                          make, with or without ONNX's data propagation
    annotated(model, notes) -> ModelProto  ``model`` with them added, in place (returned for chaining)
    unknown_dims(notes, model) -> set[str] the dims they name that ONNX Runtime leaves unnamed (``unk__N``)
    harmless(before, after) -> bool        ``after``'s runtime graph runs no op (domain-qualified) more often
    decide(model, arrays, ...) -> dict     ``harmless`` asked of ``model``'s runtime graph without and with its notes
                                          (with data propagation first, then without)
    decided(cache, key, ...) -> dict       ``decide`` once per graph, threads, backend, ONNX Runtime and ONNX
                                          version (the answer a row of the cost cache, op_type ``NOTES_OP``); two
                                          or three ONNX Runtime sessions of the graph (DistilBERT: 2.3 s) a run
                                          otherwise

``relsat.driver.search.candidates`` decides once a search, on the first graph it exports (the original choice: the
input model's graph as relsat writes it), and then writes the notes into every candidate graph it exports, so that
what it times and verifies is what it writes; a candidate they slowed would not be faster for them. The input model
itself is never annotated: written unchanged, it is the user's file. Big weights are given to inference as typed
graph inputs, so it never serializes them.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter

import onnx
import onnxruntime as ort
from onnx import helper

from relsat.extract.cost_cache import CostRow

from relsat.relations import runtime
from relsat.relations.backend import CPU, Backend

from relsat.driver.boundary.ort_graph import histogram, optimized_graph

NOTES_OP = "__shape_notes__"  # the op_type of a cached decision's row
DECISION = 4  # how ``decide`` decides, in its rows' keys (2: with data propagation first; 3: unknown dims counted;
# 4: not the dims the graph's inputs and outputs name, the same notes not tried twice)
SMALL = 1024  # initializers up to this many elements are given to inference with their values (a Reshape's shape)


def _light(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``'s graph with its big initializers as typed inputs and no subgraph changed: what inference reads."""
    g = model.graph
    big = [t for t in g.initializer if _numel(t) > SMALL or not _has_data(t)]  # (an export's shells: no data)
    listed = {i.name for i in g.input}
    inputs = list(g.input) + [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                              for t in big if t.name not in listed]
    names = {t.name for t in big}
    light = helper.make_graph(list(g.node), g.name, inputs, list(g.output),
                              [t for t in g.initializer if t.name not in names],
                              sparse_initializer=g.sparse_initializer)
    return helper.make_model(light, opset_imports=model.opset_import, ir_version=model.ir_version,
                             functions=model.functions)


def _has_data(t: onnx.TensorProto) -> bool:
    return bool(t.raw_data or t.float_data or t.int32_data or t.int64_data or t.double_data or t.uint64_data
                or t.string_data or t.data_location == onnx.TensorProto.EXTERNAL)


def _numel(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def notes(model: onnx.ModelProto, data_prop: bool = False) -> list[onnx.ValueInfoProto]:
    """The shapes ONNX's inference gives the values ``model``'s top-level nodes make, with their unknown dims named
    (``unk__N``), except its graph outputs (declared already); [] where inference fails. ``data_prop``: with ONNX's
    data propagation (a size computed from a ``Shape`` through ``Gather``/``Concat`` known where its parts are)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(_light(model), strict_mode=False, data_prop=data_prop)
    except Exception:  # an op inference does not know, a malformed graph: no notes, the graph as it is
        return []
    made = {o for n in model.graph.node for o in n.output if o}
    declared = {v.name for v in model.graph.output} | {v.name for v in model.graph.value_info}
    return [v for v in inferred.graph.value_info if v.name in made and v.name not in declared
            and v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")]


def unknown_dims(found: list[onnx.ValueInfoProto], model: onnx.ModelProto | None = None) -> set[str]:
    """The dims ``found`` names that ONNX's inference made up (``unk__N``): the sizes ONNX Runtime, inferring shapes
    itself, leaves unnamed (a dim of a graph input it names as the input does, a fixed one it knows). A name the
    graph's inputs or outputs of ``model`` already give a dim (a model that went through onnxsim has ``unk__``
    names of its own) is not counted: the runtime knows it."""
    own = {d.dim_param for v in (*model.graph.input, *model.graph.output) if v.type.HasField("tensor_type")
           for d in v.type.tensor_type.shape.dim} if model is not None else set()
    return {d.dim_param for v in found for d in v.type.tensor_type.shape.dim
            if d.dim_param.startswith("unk__") and d.dim_param not in own}


def annotated(model: onnx.ModelProto, found: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    """``model`` with ``found`` added to its graph's value_info, in place; returned for chaining."""
    model.graph.value_info.extend(found)
    return model


def harmless(before: Counter, after: Counter) -> bool:
    """Whether a runtime graph's op histogram ``after`` (``ort_graph.histogram``) has no op more often than
    ``before``: the notes let ONNX Runtime take kernels away (fold a shape computation) but fuse nothing new."""
    return all(n <= before.get(op, 0) for op, n in after.items())


def decide(model: onnx.ModelProto, arrays: dict | None = None, *, threads: int = 1, backend: Backend = CPU) -> dict:
    """Whether graphs like ``model`` (an export's shells and their ``arrays``, or a whole model) carry their notes,
    and which: ``{"named", "data_prop", "values", "unknown_dims", "more", "fewer", "seconds"}``; ``unknown_dims``: the
    dims the notes name that ONNX Runtime would leave unnamed (:func:`unknown_dims`); ``more``/``fewer``: op ->
    [without, with] where the runtime graph's counts differ. The notes with data propagation are tried first (ONNX
    Runtime then folds more of a shape computation), those without where the first would make ONNX Runtime run an op
    more often (YOLOv8n: its Slices become one more Split); the report is of the notes written, else of the first
    tried. Raises where ONNX Runtime cannot load the graph."""
    t0 = time.perf_counter()
    before, first, tried = None, None, set()
    for data_prop in (True, False):
        found = notes(model, data_prop)
        same = b"".join(v.SerializeToString(deterministic=True) for v in found)
        if not found or same in tried:  # (without data propagation the notes are often the same: one session less)
            continue
        tried.add(same)
        if before is None:
            before = histogram(optimized_graph(runtime.runnable(model, arrays), threads=threads, backend=backend))
        named = onnx.ModelProto()
        named.CopyFrom(model)
        after = histogram(optimized_graph(runtime.runnable(annotated(named, found), arrays), threads=threads,
                                          backend=backend))
        diff = {op: [before.get(op, 0), after.get(op, 0)] for op in sorted(set(before) | set(after))
                if before.get(op, 0) != after.get(op, 0)}
        report = {"named": harmless(before, after), "data_prop": data_prop, "values": len(found),
                  "unknown_dims": len(unknown_dims(found, model)),
                  "more": {op: c for op, c in diff.items() if c[1] > c[0]},
                  "fewer": {op: c for op, c in diff.items() if c[1] < c[0]}}
        first = first or report
        if report["named"]:
            return {**report, "seconds": time.perf_counter() - t0}
    return {**(first or {"named": False, "data_prop": False, "values": 0, "unknown_dims": 0, "more": {}, "fewer": {}}),
            "seconds": time.perf_counter() - t0}


def decided(cache, graph_key: str, model: onnx.ModelProto, arrays: dict | None = None, *, threads: int = 1,
            backend: Backend = CPU) -> dict:
    """``decide``'s answer for the graph whose profile key is ``graph_key`` (``extract.context.graph_key``: the
    graph, timing kind, threads and shapes), from ``cache`` where it was decided under these ONNX Runtime and ONNX
    versions (the notes are ONNX's inference's: ``"cached": True``), else decided and stored."""
    key = hashlib.sha256(json.dumps([NOTES_OP, DECISION, graph_key, ort.__version__, onnx.__version__]).encode()
                         ).hexdigest()
    row = cache.rows([key]).get(key) if cache is not None else None
    if row is not None and row[1].get("op_type") == NOTES_OP and isinstance(row[1].get("decision"), dict):
        return {**row[1]["decision"], "cached": True}
    found = decide(model, arrays, threads=threads, backend=backend)
    if cache is not None:
        cache.store([CostRow(key, backend.name, threads, NOTES_OP, {"op_type": NOTES_OP, "decision": found},
                             found["seconds"] * 1e3, 1, ort.__version__)])
    return {**found, "cached": False}
