"""ONNX import: from a model file to e-graph rows.

Owns reading and checking a model file (``load_model``, ``check_ort_loadable``), old models
(``normalise_legacy``: what ONNX's checker and version converter trip on in old exports, an IR 3
model's initializers that are not inputs and legacy broadcasts with an axis, rewritten to the same
meaning; ``upgrade_opset``: a model below opset 7 upgraded, checked under ONNX Runtime and, when ONNX
Runtime cannot run the original, against it under ONNX's reference evaluator; a model no conversion
reaches that ONNX Runtime runs passed through with every node opaque), the graph inputs' dynamic dims as symbols
(``relations/dims.py``; frozen only with ``fix_shapes``), and reading the graph into rows of the e-graph
(``import_model`` -> ``ImportResult``): float32 scalars (initializers and
Constant nodes) become Constant(value_float) leaves, other initializers and
Constant values deduplicated Weight leaves, graph inputs Input leaves, and each
node either a catalog node (found by domain and op_type, attributes defaulted and
normalized by the per-operator hooks below, lifted inputs turned into attributes,
shapes checked against ONNX shape inference) or an opaque node that keeps its NodeProto.
ONNX shape inference has no schema for other domains' operators: the outputs of those in the
catalog (com.microsoft) are typed by the catalog's shape and dtype rules (``_type_other_domains``)
and inference carries on from them, so the catalog nodes that read them are not opaque.

The nodes of a model are planned as one batch (``relations.bulk.Plan``: e-class ids
assigned while the graph is walked, identical nodes hash-consed) and written by
``relations.bulk.write``, so the number of SQL statements does not grow with the depth
of the graph.  ``_Leaves`` writes the leaves, ``_Planner`` plans the nodes and ``_Importer`` writes them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import math
import re
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import onnx.version_converter
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.boundary.decided_ifs import inline_all, inline_within, scalar_constants
from relsat.relations.catalog import DEFAULT_OPSETS, OPS, REQUIRED, OpDef, for_node
from relsat.relations.dims import Symbols, is_batch_like, is_sym
from relsat.driver.boundary.import_dims import elementwise_dims, propagate_dims, window_shape
from relsat.driver.boundary.contrib_fusions import split_fusions
from relsat.relations.bulk import GETITEM, Plan, Row, plan_opaque, real_id, write
from relsat.relations.egraph import EGraph
from relsat.relations.onnx_form import IMPORT_HOOKS, attr_value, norm_axis, outer_names, walk_graphs
from relsat.relations.rules import evaluate
from relsat.relations.runtime import session
from relsat.relations.schema import key_columns, q

from relsat.driver.errors import RelsatError, error_line

MIN_OPSET, MAX_OPSET = DEFAULT_OPSETS
UPGRADE_OPSET = 13  # a model below MIN_OPSET is upgraded to this opset (ONNX's version converter)
SYMBOLIC_S = 15.0  # CPU-time limit of ONNX Runtime's symbolic shape inference at import (the importing thread's
# CPU time, so that a loaded machine or another thread of the run does not change what import sees: ViT-B/16 took
# 5.3 s of wall time under load, past a wall-clock limit of 5 s, and imported with its whole encoder opaque)
_RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
               "Bernoulli", "Dropout"}  # never folded, even with constant inputs
_INT_TYPES = (TensorProto.INT64, TensorProto.INT32)
_SMALL_TENSOR = 1024  # initializers up to this many elements are kept for shape inference's data propagation
_SHAPE_OPS = {"Shape", "Size", "Gather", "Slice", "Concat", "Squeeze", "Unsqueeze", "Cast", "Add", "Sub", "Mul",
              "Div", "Neg", "Abs", "Floor", "Ceil", "Min", "Max", "Equal", "Less", "Greater", "Not", "Where",
              "Identity", "Reshape", "ReduceProd", "Mod", "ConstantOfShape", "Transpose", "Range", "Expand", "Tile",
              "LessOrEqual", "GreaterOrEqual", "And", "Or", "Sum"}  # evaluated at import over small constants


@dataclass
class ImportResult:
    egraph: EGraph
    outputs: list[tuple[str, int]]  # graph output name -> e-class
    inputs: list[tuple[str, int, list[int]]]  # graph input name, ONNX dtype, (specialized) shape
    notices: list[str]
    opset_imports: dict[str, int]  # domain -> version
    ir_version: int
    metadata: dict[str, str]
    producer: tuple[str, str]  # producer name, version
    graph_name: str
    doc_string: str
    node_count: int
    values: dict[str, int] = field(default_factory=dict)  # every ONNX value name -> e-class
    specialized: dict[str, list[int]] = field(default_factory=dict)  # inputs whose dynamic dims were fixed
    output_info: dict[str, onnx.ValueInfoProto] = field(default_factory=dict)  # declared output types
    functions: list = field(default_factory=list)  # model-local FunctionProtos (opaque nodes may call them)
    domain: str = ""
    model_version: int = 0
    symbols: Symbols = field(default_factory=Symbols)  # the dynamic dims (relations/dims.py) and their bindings
    defaults: list = field(default_factory=list)  # initializers that are also graph inputs (IR >= 4): overridable
    upgraded: str | None = None  # the opset upgrade notice, when the model was below opset 7
    types: dict = field(default_factory=dict)  # every value name -> (ONNX dtype, shape with symbols) from inference


# ------------------------------------------------------------------ loading
def _tensors(model: onnx.ModelProto):
    for g in walk_graphs(model.graph):
        yield from g.initializer
        for s in g.sparse_initializer:
            yield from (s.values, s.indices)
        for node in g.node:
            for a in node.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors


def load_model(path, *, check_runtime: bool = True) -> onnx.ModelProto:
    """Read, check and return a model file (external data loaded); RelsatError when the file is
    missing, not ONNX, points outside its folder for external data, fails the ONNX checker, or
    cannot be run by ONNX Runtime, as it is or once upgraded (``check_runtime=False``: the caller checks
    the last with ``check_ort_loadable(model, label=path)``, as ``relsat optimize`` does once the model's
    sessions are shared: ``relations.runtime.serialize_once``; ``read_model``)."""
    model, _ = read_model(path)
    old = _default_opset(model) is not None and _default_opset(model) < MIN_OPSET
    if check_runtime and not old and id(model) not in _UPGRADED:  # (those read_model ran or upgraded and verified)
        check_ort_loadable(path)
    return model


def read_model(path) -> tuple[onnx.ModelProto, bytes | None]:
    """``load_model`` without its ONNX Runtime check of a current-opset model, and the file's bytes where they are
    the returned model whole (no external data, not upgraded, not a text format), else None: its serialization,
    which ``runtime.serialize_once`` then need not make (GPT-2: 1.5-2.3 s).

    Old exports are read as ONNX Runtime reads them: what ONNX's checker and version converter trip
    on is normalised first (``normalise_legacy``).  A model below opset 7 that ONNX Runtime runs is
    returned as it is (``import_model`` upgrades it, or passes it through when no conversion exists);
    one that ONNX Runtime cannot run is upgraded here (``upgrade_opset``, verified against the
    original under ONNX's reference evaluator) and the upgraded model is returned, its notice kept
    for ``import_model``."""
    p = Path(path)
    if not p.exists():
        raise RelsatError(f"{p}: no such file")
    if not p.is_file():
        raise RelsatError(f"{p}: not a file")
    # a binary file is read once: its bytes are the model; a text format (by its extension, as onnx.load reads
    # it) is parsed as onnx.load parses it
    binary = onnx.serialization.registry.get_format_from_file_extension(p.suffix) in (None, "protobuf")
    data = None
    try:
        if binary:
            data = p.read_bytes()
            model = onnx.load_model_from_string(data)
        else:
            model = onnx.load_model(str(p), load_external_data=False)
    except Exception as e:
        raise RelsatError(f"{p}: not an ONNX model (cannot parse it: {str(e) or type(e).__name__})") from None
    if not model.HasField("graph") or model.ir_version <= 0 or not model.opset_import:
        raise RelsatError(f"{p}: not an ONNX model (no graph, IR version or opset import)")
    base = p.resolve().parent
    external = False
    for t in _tensors(model):
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        external = True
        loc = {e.key: e.value for e in t.external_data}.get("location", "")
        target = (base / loc).resolve()
        if not loc or base not in target.parents:
            raise RelsatError(f"{p}: tensor '{t.name}' has external data at '{loc}', outside the model's folder")
        if not target.is_file():
            raise RelsatError(f"{p}: tensor '{t.name}' has external data at '{loc}', which does not exist")
    if external:
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(base))
        except Exception as e:
            raise RelsatError(f"{p}: cannot read external data: {error_line(e)}") from None
    blob = None if external else data  # (None for a text format)
    normal, _ = normalise_legacy(model)
    try:
        # the file's bytes where they are the model (the checker parses them in C++: GPT-2 0.8 s, against 1.6 s
        # for serializing the loaded model for it); its path where it has external data
        onnx.checker.check_model(normal if normal is not model else (blob if blob is not None else str(p)))
    except Exception as e:
        raise RelsatError(f"{p}: fails the ONNX checker: {error_line(e)}") from None
    if _default_opset(model) is not None and _default_opset(model) < MIN_OPSET:
        ort_error = _ort_error(model)
        if ort_error is None:  # ONNX Runtime runs it: import_model upgrades it, or passes it through unchanged
            return model, blob
        up, notice = upgrade_opset(model, ort_error=ort_error, verify_against=True)
        _UPGRADED.clear()  # only the last one is kept: import_model reads it next
        _UPGRADED[id(up)] = (up, notice)
        return up, None
    return model, blob


def check_ort_loadable(model_or_path, *, label=None) -> None:
    """RelsatError unless ONNX Runtime (CPU) can create a session for the model (``label``: what the error
    names, by default the path or the graph's name)."""
    if label is None:
        label = (model_or_path.graph.name or "model") if isinstance(model_or_path, onnx.ModelProto) else model_or_path
    try:
        session(model_or_path, optimize=False)
    except Exception as e:
        raise RelsatError(f"{label}: ONNX Runtime cannot load the model: {error_line(e)}") from None


def _ort_error(model: onnx.ModelProto) -> str | None:
    """Why ONNX Runtime (CPU) cannot create a session for ``model``, or None when it can."""
    try:
        session(model, optimize=False)
    except Exception as e:
        return error_line(e)
    return None


# --------------------------------------------------------- old opsets and IR versions
UPGRADE_TARGETS = (UPGRADE_OPSET, 9, MIN_OPSET)  # tried in turn: an op removed at opset 10 still converts to 9
_LEGACY_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"}
_UPGRADED: dict[int, tuple[onnx.ModelProto, str]] = {}  # id -> (model load_model upgraded, its notice)


def _default_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank of every value ONNX's shape inference (or the declarations) know."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        inferred = model
    g = inferred.graph
    ranks = {t.name: len(t.dims) for t in g.initializer}
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape"):
            ranks[v.name] = len(v.type.tensor_type.shape.dim)
    return ranks


def normalise_legacy(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with what ONNX's checker and version converter trip on in old exports rewritten to the
    same meaning (a copy; ``model`` itself when there is nothing to rewrite), and what was rewritten:

    - IR version 3 with initializers that are not graph inputs (ONNX Runtime runs them; the checker and
      the converter refuse them): read as IR version 4, where initializers need not be inputs;
    - an element-wise op of opset < 7 with ``broadcast=1`` and an ``axis`` (B's dims aligned with A's
      from ``axis``, not from the end): B gets trailing dims of 1 (its initializer reshaped, or an
      ``Unsqueeze`` before the op) and the ``axis`` is dropped, so that NumPy broadcasting means the
      same, which the converter's adapter assumes."""
    done: list[str] = []
    out = model
    inputs = {v.name for v in model.graph.input}
    if model.ir_version < 4 and any(t.name not in inputs for t in model.graph.initializer):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        out.ir_version = 4
        done.append("IR version 3 with initializers that are not graph inputs read as IR version 4")
    opset = _default_opset(model)
    legacy = [i for i, n in enumerate(model.graph.node) if n.domain in ("", "ai.onnx") and n.op_type in
              _LEGACY_BROADCAST and any(a.name == "axis" for a in n.attribute)
              and any(a.name == "broadcast" and a.i == 1 for a in n.attribute)]
    if opset is None or opset >= 7 or not legacy:
        return out, done
    if out is model:
        out = onnx.ModelProto()
        out.CopyFrom(model)
    ranks = _ranks(out)
    g = out.graph
    inits = {t.name: t for t in g.initializer}
    readers = Counter(i for n in g.node for i in n.input)
    fixed, extra = 0, []
    for i in legacy:
        node = g.node[i]
        a, b = node.input[0], node.input[1]
        axis = next(x.i for x in node.attribute if x.name == "axis")
        ra, rb = ranks.get(a), ranks.get(b)
        if ra is None or rb is None:
            continue
        axis = axis + ra if axis < 0 else axis
        trailing = ra - axis - rb
        if trailing < 0:
            continue
        if trailing:
            if b in inits and readers[b] == 1 and b not in inputs:
                t = inits[b]
                t.dims.extend([1] * trailing)
            else:
                name = f"{b}__relsat_broadcast_{i}"
                extra.append((i, helper.make_node("Unsqueeze", [b], [name], axes=list(range(rb, rb + trailing)))))
                node.input[1] = name
        kept = [x for x in node.attribute if x.name != "axis"]
        del node.attribute[:]
        node.attribute.extend(kept)
        fixed += 1
    for i, unsq in reversed(extra):
        g.node.insert(i, unsq)
    if fixed:
        done.append(f"{fixed} legacy broadcast(s) with an axis rewritten as NumPy broadcasts")
    return out, done


def _culprit(model: onnx.ModelProto, *messages: str) -> str | None:
    """The op type an error message names, of those the model uses."""
    ops = sorted({n.op_type for n in model.graph.node}, key=len, reverse=True)
    for m in messages:
        for op in ops:
            if m and re.search(rf"(?<![A-Za-z0-9_]){re.escape(op)}(?![A-Za-z_])", m):  # the converter appends versions
                return op
    return None


def upgrade_opset(model: onnx.ModelProto, *, ort_error: str | None = None,
                  verify_against: bool = False) -> tuple[onnx.ModelProto, str | None]:
    """A model below relsat's lowest default-domain opset, normalised (``normalise_legacy``) and upgraded with
    ONNX's version converter (to ``UPGRADE_OPSET``, else the first of ``UPGRADE_TARGETS`` it reaches), valid
    under ONNX's checker and loadable by ONNX Runtime, and the notice saying so; other models unchanged (notice
    None).  ``verify_against``: the upgraded model is also compared with the original on random inputs
    (``relsat.driver.boundary.verify``; the original under ONNX's reference evaluator where ONNX Runtime cannot run it,
    ``ort_error`` saying why). RelsatError, naming the op where an error names one, when no target works."""
    opset = _default_opset(model)
    if opset is None or opset >= MIN_OPSET:
        return model, None
    normal, rewritten = normalise_legacy(model)
    why = []
    for target in UPGRADE_TARGETS:
        try:
            up = onnx.version_converter.convert_version(normal, target)
            up.ir_version = max(normal.ir_version, min(up.ir_version, 10))
            onnx.checker.check_model(up)
        except Exception as e:
            why.append(f"to {target}: {error_line(e)}")
            continue
        loads = _ort_error(up)
        if loads is not None:
            why.append(f"to {target}: ONNX Runtime cannot load the upgraded model: {loads}")
            continue
        if verify_against:
            from relsat.driver.boundary.verify import verify

            try:
                check = verify(normal, up)  # the reference evaluator reads legacy broadcasts as NumPy's
            except RelsatError as e:
                check = None
                why.append(f"to {target}: cannot be compared with the original: {e}")
            if check is not None and not check.ok:
                why.append(f"to {target}: differs from the original: {check.message}")
            if check is None or not check.ok:
                continue
        how = f" ({'; '.join(rewritten)})" if rewritten else ""
        checked = " and checked against the original under ONNX's reference evaluator" if verify_against else ""
        return up, f"upgraded from opset {opset} to {target} with ONNX's version converter{how}{checked}"
    op = _culprit(model, *why, ort_error or "")
    what = f"op {op}" if op else f"model '{model.graph.name}'"
    ort = f"; ONNX Runtime cannot run it at opset {opset} either ({ort_error})" if ort_error else ""
    raise RelsatError(f"{what}: default-domain opset {opset} is below {MIN_OPSET} and no conversion to a supported "
                      f"opset exists ({'; '.join(why[:1])}){ort}")


# ----------------------------------------------------------- input shapes
def infer_concrete(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> dict:
    """Every value's (dtype, shape) with the graph inputs at these concrete shapes (the importer's
    inference; dims it cannot resolve stay symbols of a throwaway table)."""
    try:
        return _infer_types(model, shapes, Symbols(), symbolic=False)[0]
    except Exception:
        return {}


def _fmt_dims(dims) -> str:
    return ",".join(str(d) if isinstance(d, int) else (d or "?") for d in dims)


def _input_shapes(inputs, overrides: dict | None, fix: bool, symbols: Symbols):
    """The graph inputs' shapes for the e-graph, the notices, and the inputs whose declared shape was
    specialized.  A dynamic dim becomes a symbol (``relations/dims.py``: its dim_param, or a made-up
    anonymous one) unless ``fix``; ``overrides`` (``--input-shape``) bind the symbols at those sizes
    for costs, or, with ``fix``, replace the declared shape (the old frozen behaviour: a dynamic
    batch-like dim without an override is fixed to 1)."""
    names = [v.name for v in inputs]
    for name in overrides or {}:
        if name not in names:
            raise RelsatError(f"--input-shape names '{name}', which is not an input of the model "
                              f"(inputs: {', '.join(names) or 'none'})")
    shapes, notices, specialized = {}, [], {}
    for v in inputs:
        if not v.type.HasField("tensor_type") or not v.type.tensor_type.elem_type:
            raise RelsatError(f"input '{v.name}': only tensor inputs are supported")
        tt = v.type.tensor_type
        declared = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else d.dim_param for d in tt.shape.dim]
        given = [int(d) for d in overrides[v.name]] if overrides and v.name in overrides else None
        if given is not None and (tt.HasField("shape") and (len(given) != len(declared) or any(
                isinstance(d, int) and d != w for d, w in zip(declared, given))) or min(given, default=0) < 0):
            raise RelsatError(f"--input-shape {v.name}={_fmt_dims(given)} does not fit the declared shape "
                              f"[{_fmt_dims(declared)}] of input '{v.name}'")
        if not tt.HasField("shape") and given is None:
            raise RelsatError(f"input '{v.name}' has no declared shape; set it with --input-shape {v.name}=D0,D1,...")
        if fix:
            if given is not None:
                dims = given
            else:
                dims = [d if isinstance(d, int) else 1 if is_batch_like(d, i, len(declared)) else d
                        for i, d in enumerate(declared)]
                unresolved = [f"dim {i} ({declared[i] or 'unnamed'})" for i, d in enumerate(dims) if not isinstance(d, int)]
                if unresolved:
                    raise RelsatError(f"input '{v.name}' has dynamic {', '.join(unresolved)}; with --fix-shapes set "
                                      f"its shape with --input-shape {v.name}={_fmt_dims(dims)}")
                notices += [f"input '{v.name}': dynamic dim {i} ({d or 'unnamed'}) fixed to 1 as a batch dim "
                            f"(--fix-shapes)" for i, d in enumerate(declared) if isinstance(d, str)]
            if dims != declared:
                specialized[v.name] = dims
            shapes[v.name] = dims
            continue
        if not tt.HasField("shape"):  # no declared shape: the override's sizes, all dynamic
            declared = [""] * len(given)
        dims = []
        for i, d in enumerate(declared):
            if isinstance(d, int):
                dims.append(d)
                continue
            c = symbols.get(d or f"{v.name}_dim{i}", anonymous=not d, batch=is_batch_like(d, i, len(declared)))
            if given is not None:
                sym = symbols.by_code[c]
                if sym.value is not None and sym.value != given[i]:
                    raise RelsatError(f"--input-shape {v.name}={_fmt_dims(given)} binds dim {i} ({sym.name}) to "
                                      f"{given[i]}, another input binds it to {sym.value}")
                sym.value = given[i]
            dims.append(c)
        shapes[v.name] = dims
    return shapes, notices, specialized


def _onnx_shape(dims, symbols: Symbols):
    """Dims for ``make_tensor_value_info``: symbols by name (anonymous ones too, so that shape
    inference carries them)."""
    codes = symbols.by_code
    return [codes[d].name if is_sym(d) else d for d in dims]


def _types_of(graph: onnx.GraphProto, symbols: Symbols, prefix: str = "") -> dict[str, tuple[int | None, list[int] | None]]:
    """ONNX dtype and shape of every value: a dim_param is its symbol, an unknown dim (or one ONNX's
    inference named ``unk__N``) a fresh anonymous symbol of that value and position; None when the rank
    is unknown. ``prefix``: for the fresh names of another inference's unknown dims."""
    types = {t.name: (t.data_type, list(t.dims)) for t in graph.initializer}
    for v in [*graph.input, *graph.output, *graph.value_info]:
        if v.type.HasField("tensor_type"):
            tt = v.type.tensor_type
            shape = None
            if tt.HasField("shape"):
                shape = [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0
                         else symbols.get(d.dim_param, batch=False) if d.dim_param and not d.dim_param.startswith("unk__")
                         else symbols.get(f"{prefix}{v.name}:{i}", anonymous=True) for i, d in enumerate(tt.shape.dim)]
            types[v.name] = (tt.elem_type or None, shape)
    return types


def _fill_gaps(model: onnx.ModelProto, types: dict, symbols: Symbols) -> dict:
    """``types`` (ONNX's shape inference, with data propagation) with the dims it left unknown (or named
    ``unk__N``) filled in from ONNX Runtime's symbolic shape inference where that runs: it carries
    dim_params through shape arithmetic (a Reshape to Concat(Shape(x)[0], Shape(x)[1], 12, 64) is
    [batch, sequence, 12, 64]) and names derived dims by their expression."""
    gaps = {n for n, (_, s) in types.items() if s is None or any(symbols.anonymous(d) for d in s)}
    # and the outputs ONNX's inference has no entry for at all: those of ops it has no schema for (com.microsoft's
    # Attention, EmbedLayerNormalization, ...), which ONNX Runtime's inference knows
    gaps |= {o for n in model.graph.node for o in n.output if o and o not in types}
    if not gaps:
        return types
    out = _symbolic(model)
    if out is None:
        return elementwise_dims(model, types, symbols)
    ort_types = _types_of(out.graph, symbols, prefix="ort:")
    for name in gaps:
        mine, theirs = types.get(name, (None, None)), ort_types.get(name)
        if theirs is None or theirs[1] is None:
            continue
        if mine[1] is None:
            types[name] = (mine[0] or theirs[0], theirs[1])
        elif len(mine[1]) == len(theirs[1]):
            types[name] = (mine[0] or theirs[0], [t if symbols.anonymous(m) else m for m, t in zip(mine[1], theirs[1])])
    return elementwise_dims(model, types, symbols)


class _TooLong(Exception):
    pass


def _safe_merge(merged, kept) -> bool:
    """Whether a merge ONNX Runtime's symbolic inference suggests (auto_merge: two dims a broadcast or an
    elementwise op needs equal) may be taken as fact. A dim merged into a number or into another input
    symbol is a guess (``Add([s], [3])`` runs at s = 1 too, ``[s1] + [s2]`` with either at 1). A derived
    expression merged into a symbol, as ``Min(512, sequence)`` into ``sequence`` (BERT's position ids), is
    taken as an assumption about the sizes the model runs at, which verification at two bindings checks."""
    return isinstance(kept, str) and isinstance(merged, str) and not merged.isidentifier() and kept.isidentifier()


@functools.cache
def _symbolic_shape_inference() -> type:
    """ONNX Runtime's ``SymbolicShapeInference``, loaded from its file. Importing it as
    ``onnxruntime.tools.symbolic_shape_infer`` runs that package's ``__init__``, which imports PyTorch when it
    is installed (2.3 s of every Swin-T import here, for a module that needs only onnx, numpy and sympy)."""
    import importlib.util

    spec = importlib.util.find_spec("onnxruntime")
    path = Path(spec.origin).parent / "tools" / "symbolic_shape_infer.py" if spec and spec.origin else None
    if path is None or not path.is_file():
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
        return SymbolicShapeInference
    module_spec = importlib.util.spec_from_file_location("_relsat_ort_symbolic_shape_infer", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    module.sympy = _QuickSympy("sympy")  # this copy's sympy: simplify made cheap (_quick_simplify)
    return module.SymbolicShapeInference


def _quick_simplify(expr, *args, **kwargs):
    """What ONNX Runtime's symbolic inference calls ``sympy.simplify`` for, a canonical form of a dim, without
    simplify's search: an expression without ``floor`` is expanded, one with it is kept as it is.
    ``sympy.simplify`` of the floors of Resize's output sizes took 12.8 of PP-OCRv4 det's 14.3 s import
    (Faster R-CNN 19.5 -> 5.8 s, YOLO 7 -> 2.4 s); on all 25 corpus models the e-graph's shapes are identical."""
    import sympy

    expr = sympy.sympify(expr)
    return expr if expr.has(sympy.floor) else sympy.expand(expr)


@contextlib.contextmanager
def _printed_once():
    """Within the block, each distinct sympy expression is printed once (``str`` of an equal one is the string
    already made).  ONNX Runtime's symbolic inference names every computed dim by ``str`` of its expression, again
    for each node that meets it: Faster R-CNN's import printed 52 expressions 3,292 times, 6.5 of its inference's
    8.3 s (sympy orders an expression's terms to print it).  Equal expressions print alike, so the names are the
    ones printing each would give."""
    from sympy.core._print_helpers import Printable

    plain = Printable.__str__
    memo: dict = {}

    def printed(self):
        try:
            key = (type(self), self)  # (the type too: an older sympy has Float(2.0) == Integer(2))
            text = memo.get(key)
        except TypeError:  # an unhashable one (a mutable matrix)
            return plain(self)
        if text is None:
            text = memo[key] = plain(self)
        return text

    try:
        Printable.__str__ = printed
        yield
    finally:
        Printable.__str__ = plain


class _QuickSympy(ModuleType):
    """sympy for the loaded copy of ONNX Runtime's symbolic inference, with ``simplify`` as ``_quick_simplify``."""

    simplify = staticmethod(_quick_simplify)

    def __getattr__(self, name):
        import sympy

        return getattr(sympy, name)


def _symbolic(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """ONNX Runtime's symbolic shape inference of ``model``, or None when it fails or runs past
    ``SYMBOLIC_S`` of the importing thread's CPU time (its sympy arithmetic can explode: Faster R-CNN with a dynamic
    image size ran for minutes). The limit is a SIGVTALRM timer, so outside the main thread it is not run
    at all."""
    if threading.current_thread() is not threading.main_thread():
        return None

    start, done = time.thread_time(), False

    def stop(signum, frame):
        if done:  # (a signal still pending as the timer was stopped)
            return
        # the process's timer counts every thread (the load check's session, ``phases.load``): the limit is this
        # thread's own CPU time, so the timer is set again for what is left of it
        left = SYMBOLIC_S - (time.thread_time() - start)
        if left > 0.01:
            signal.setitimer(signal.ITIMER_VIRTUAL, left)
            return
        raise _TooLong()

    previous = signal.signal(signal.SIGVTALRM, stop)
    signal.setitimer(signal.ITIMER_VIRTUAL, SYMBOLIC_S)
    try:
        try:
            SymbolicShapeInference = _symbolic_shape_inference()

            def run(auto_merge: bool):
                # SymbolicShapeInference.infer_shapes, less its ending: when some shapes stay unknown it saves
                # the model as sym_shape_infer_temp.onnx in the current folder (a user's) and raises; the
                # shapes it did infer are what relsat wants
                sym = SymbolicShapeInference(2 ** 31 - 1, auto_merge, False, 0)
                sym._preprocess(model)
                while sym.run_:
                    sym._infer_impl()
                sym._update_output_from_vi()
                return sym

            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                    _printed_once():
                sym = run(True)
                if all(_safe_merge(a, b) for a, b in sym.suggested_merge_.items()):
                    return sym.out_mp_
                return run(False).out_mp_  # a merge it guessed could be wrong: without merging (it stops sooner)
        finally:
            done = True  # (before the timer stops: a signal pending then neither re-arms it nor raises)
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    except (Exception, _TooLong):
        return None
    finally:
        signal.signal(signal.SIGVTALRM, previous)


def _concrete(shape) -> bool:
    return shape is not None and not any(is_sym(d) for d in shape)


def _shape_value(node: onnx.NodeProto, shape: list[int]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(np.prod(shape, dtype=np.int64))
    a = {x.name: x.i for x in node.attribute}
    return np.array(shape[a.get("start", 0):a.get("end", len(shape))], dtype=np.int64)


_PARTIAL_MOST = 64  # shape vectors up to this long are followed element by element


def _elementwise(op: str, a, b):
    """One element of an integer Add/Sub/Mul/Div/Mod over known, non-negative numbers (where ONNX's
    truncating and numpy's flooring division agree); None when unknown."""
    if a is None or b is None or is_sym(a) or is_sym(b):
        return None
    if op == "Add":
        return a + b
    if op == "Sub":
        return a - b
    if op == "Mul":
        return a * b
    if a < 0 or b <= 0:
        return None
    return a // b if op == "Div" else a % b


def _partial_values(nodes, types: dict, consts: dict, memo: dict | None = None) -> dict[str, tuple[list, bool]]:
    """The shape computations over dynamic dims, element by element: ``name -> (elements, scalar)`` for
    the integer scalars and vectors that ``Shape`` of a partly static value starts, followed through
    ``Gather``, ``Slice``, ``Concat``, ``Unsqueeze``, ``Squeeze``, ``Cast``, ``Identity`` and integer
    ``Add``/``Sub``/``Mul``/``Div``/``Mod``; an element is a number, a dynamic dim's symbol, or None
    (unknown). Every rule is exact: a number here is what the node computes for every size of the
    dynamic dims (Swin's window padding ``(7 - W % 7) % 7`` over a static W beside a dynamic batch).
    ``memo``: the constants' elements read so far (a caller that asks again as ``consts`` grows passes the
    same dict: a constant's value never changes)."""
    vals: dict[str, tuple[list, bool]] = {}
    memo = {} if memo is None else memo

    def get(name):
        if name in vals:
            return vals[name]
        if name not in memo:
            t = consts.get(name)
            if t is None or t.data_type not in _INT_TYPES or len(t.dims) > 1 or np.prod(t.dims) > _PARTIAL_MOST:
                return None  # not memoized: it may become a constant later
            a = numpy_helper.to_array(t)
            memo[name] = [int(x) for x in a.reshape(-1)], a.ndim == 0
        return memo[name]

    def ints(name):
        v = get(name) if name else None
        return None if v is None or any(e is None or is_sym(e) for e in v[0]) else v[0]

    for n in nodes:
        if n.domain not in ("", "ai.onnx") or len(n.output) != 1:
            continue
        a = {x.name: attr_value(x) for x in n.attribute}
        op, out = n.op_type, None
        if op == "Shape":
            shape = (types.get(n.input[0]) or (None, None))[1]
            if shape is not None and len(shape) <= _PARTIAL_MOST:
                start, end = a.get("start", 0), a.get("end", len(shape))
                out = list(shape[start:end]), False
        elif op in ("Identity", "Cast") and get(n.input[0]) is not None and (
                op == "Identity" or a.get("to") in _INT_TYPES):
            out = get(n.input[0])
        elif op == "Gather" and get(n.input[0]) is not None and ints(n.input[1]) is not None \
                and a.get("axis", 0) == 0 and not get(n.input[0])[1]:
            data, idx, scalar = get(n.input[0])[0], ints(n.input[1]), get(n.input[1])[1]
            if all(-len(data) <= i < len(data) for i in idx):
                out = [data[i] for i in idx], scalar
        elif op == "Slice" and get(n.input[0]) is not None and not get(n.input[0])[1]:
            data = get(n.input[0])[0]
            starts, ends = ints(n.input[1]), ints(n.input[2]) if len(n.input) > 2 else None
            axes = ints(n.input[3]) if len(n.input) > 3 and n.input[3] else [0]
            steps = ints(n.input[4]) if len(n.input) > 4 and n.input[4] else [1]
            if starts and ends and len(starts) == len(ends) == 1 and axes in ([0], [-1]) and steps == [1]:
                out = data[slice(max(-len(data) - 1, starts[0]), ends[0])], False
        elif op == "Concat" and all(get(i) is not None and not get(i)[1] for i in n.input):
            out = [e for i in n.input for e in get(i)[0]], False
        elif op == "Unsqueeze" and get(n.input[0]) is not None and get(n.input[0])[1]:
            axes = a.get("axes") if "axes" in a else ints(n.input[1]) if len(n.input) > 1 else None
            if axes in ([0], [-1]):
                out = get(n.input[0])[0], False
        elif op == "Squeeze" and get(n.input[0]) is not None and len(get(n.input[0])[0]) == 1:
            axes = a.get("axes") if "axes" in a else ints(n.input[1]) if len(n.input) > 1 and n.input[1] else None
            if axes in (None, [0], [-1]):
                out = get(n.input[0])[0], True
        elif op in ("Add", "Sub", "Mul", "Div", "Mod") and len(n.input) == 2 and a.get("fmod", 0) == 0:
            x, y = get(n.input[0]), get(n.input[1])
            if x is not None and y is not None and (len(x[0]) == len(y[0]) or 1 in (len(x[0]), len(y[0]))):
                size = max(len(x[0]), len(y[0]))
                xs, ys = (x[0] * size if len(x[0]) == 1 else x[0]), (y[0] * size if len(y[0]) == 1 else y[0])
                out = [_elementwise(op, p, q) for p, q in zip(xs, ys)], x[1] and y[1]
        if out is not None:
            vals[n.output[0]] = out
    return vals


def _static_parts(nodes, types: dict, consts: dict, failed: set, memo: dict | None = None) -> dict[str, np.ndarray]:
    """The outputs of shape computations over dynamic dims that are numbers whatever those dims are
    (``_partial_values``), as arrays of their inferred dtype: constants for the import."""
    out = {}
    for name, (elements, scalar) in _partial_values(nodes, types, consts, memo).items():
        dtype = (types.get(name) or (None, None))[0]
        if (name in consts or name in failed or dtype not in _INT_TYPES or not elements
                or any(e is None or is_sym(e) for e in elements)):
            continue
        arr = np.array(elements, dtype=helper.tensor_dtype_to_np_dtype(dtype))
        out[name] = arr.reshape(()) if scalar else arr
    return out


def _infer_types(model: onnx.ModelProto, shapes: dict, symbols: Symbols, symbolic: bool = True):
    """ONNX dtype and shape (dynamic dims as symbols; None when the rank is unknown) of every value,
    and the values that the static dims make constant (``Shape`` and small shape arithmetic on it).

    ONNX shape inference (with data propagation) runs on a light copy of the model: the fixed input
    shapes, big initializers passed as inputs.  Shape/Size nodes of statically shaped values and
    nodes in ``_SHAPE_OPS`` over small constants are then evaluated (ONNX Runtime) and become
    initializers of the copy, and inference runs again, until nothing more is constant: the shape
    computations of exporters (Shape -> Gather -> Concat -> Reshape) resolve even where ONNX's data
    propagation does not (older opsets)."""
    g = model.graph
    listed = {v.name for v in g.input}
    inputs = [helper.make_tensor_value_info(v.name, v.type.tensor_type.elem_type, _onnx_shape(shapes[v.name], symbols))
              if v.name in shapes else v for v in g.input]
    consts: dict[str, onnx.TensorProto] = {}
    for t in g.initializer:
        if np.prod(t.dims, dtype=np.int64) <= _SMALL_TENSOR:
            consts[t.name] = t
        elif t.name not in listed:
            inputs.append(helper.make_tensor_value_info(t.name, t.data_type, t.dims))
    nodes = []
    for n in g.node:
        constant = n.op_type == "Constant" and n.domain in ("", "ai.onnx")
        if constant and n.attribute[0].HasField("t") and np.prod(n.attribute[0].t.dims) > _SMALL_TENSOR:
            inputs.append(helper.make_tensor_value_info(n.output[0], n.attribute[0].t.data_type, n.attribute[0].t.dims))
            continue
        value = _constant_value(n) if constant else None
        if value is not None and value[0].size <= _SMALL_TENSOR:
            consts[n.output[0]] = numpy_helper.from_array(value[0], n.output[0])
        else:
            nodes.append(n)
    folded: dict[str, np.ndarray] = {}
    failed: set[str] = set()  # outputs of nodes ONNX Runtime could not evaluate
    typed: dict[str, onnx.ValueInfoProto] = {}  # outputs of other domains' catalog ops, typed by the catalog
    memo: dict = {}  # the integer constants' elements, read once (``_partial_values``)
    checked: set[str] = set()  # the ceil-mode pools whose output shape was checked (``_ceil_pools``)
    while True:
        light = helper.make_model(
            helper.make_graph(nodes, g.name, inputs, g.output, list(consts.values()),
                              sparse_initializer=g.sparse_initializer, value_info=list(typed.values())),
            opset_imports=model.opset_import, ir_version=max(model.ir_version, 4),  # IR 3 ignores unlisted initializers
            functions=model.functions)
        types = _types_of(onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True).graph, symbols)
        grown = _type_other_domains(light, types, consts, symbols, typed)
        grown = _ceil_pools(light, types, typed, checked) or grown
        known, shape_values, ready = set(consts), {}, []
        for n in nodes:
            out_dtype, out_shape = types.get(n.output[0], (None, None)) if len(n.output) == 1 else (None, None)
            if (n.domain not in ("", "ai.onnx") or n.op_type not in _SHAPE_OPS or not out_dtype
                    or not _concrete(out_shape) or np.prod(out_shape, dtype=np.int64) > _SMALL_TENSOR
                    or n.output[0] in failed):
                continue
            if n.op_type in ("Shape", "Size") and _concrete(types.get(n.input[0], (None, None))[1]):
                shape_values[n.output[0]] = _shape_value(n, types[n.input[0]][1])
            elif n.op_type in ("Shape", "Size") or not all(i in known for i in n.input if i):
                continue
            ready.append(n)
            known.add(n.output[0])
        shape_values.update(_static_parts(nodes, types, consts, failed, memo))
        if not ready and grown:
            continue  # inference again, from the outputs the catalog typed
        if not ready and not shape_values:
            return (_fill_gaps(light, types, symbols) if symbolic else types), folded
        consts.update((k, numpy_helper.from_array(v, k)) for k, v in shape_values.items())
        folded.update(shape_values)
        rest = [n for n in ready if n.output[0] not in shape_values]
        if rest:
            sub = helper.make_model(helper.make_graph(
                rest, "shapes", [], [helper.make_tensor_value_info(n.output[0], *types[n.output[0]]) for n in rest],
                [consts[i] for i in {i for n in rest for i in n.input if i and i in consts}]),
                opset_imports=model.opset_import, ir_version=min(model.ir_version, 10))
            try:
                values = session(sub, optimize=False).run(None, {})
            except Exception:  # leave these nodes to the graph
                values = []
                failed.update(n.output[0] for n in rest)
            for n, v in zip(rest, values):
                consts[n.output[0]] = numpy_helper.from_array(np.asarray(v), n.output[0])
                folded[n.output[0]] = np.asarray(v)
        nodes = [n for n in nodes if not (n.output and n.output[0] in folded)]


@dataclass
class _Constants:
    """What an import hook reads outside the importer: the default domain's opset, constant inputs' values."""

    opset: int
    tensors: dict  # name -> TensorProto

    def get(self, name: str):
        t = self.tensors.get(name)
        return None if t is None else numpy_helper.to_array(t)

    def const_ints(self, name: str):
        v = self.get(name)
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]


def _type_other_domains(light: onnx.ModelProto, types: dict, consts: dict, symbols: Symbols, typed: dict) -> bool:
    """Type the outputs of catalog operators of other domains (com.microsoft), which ONNX's shape inference has no
    schema for, from the catalog's shape and dtype rules over their inputs' types: ``typed`` (output name ->
    ValueInfoProto, for the next inference to carry on from) and ``types`` gain them, in graph order (one such
    op reading another's output is typed in the same pass).  An output that inference or a declaration already
    typed is left alone; so is a node the catalog cannot represent or whose rule rejects it (it stays opaque).
    Returns whether anything was typed."""
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in light.opset_import}
    ctx = _Constants(opsets.get("", 0), consts)
    grown = False
    for node in light.graph.node:
        op = for_node(node.domain, node.op_type)
        if (op is None or not op.domain or op.is_tuple or not op.in_opsets(opsets.get(op.domain, 0))
                or not node.output or not node.output[0] or node.output[0] in typed):
            continue
        dtype, shape = types.get(node.output[0]) or (None, None)
        if dtype is not None and shape is not None and not any(symbols.anonymous(d) for d in shape):
            continue
        form = _catalog_form(op, node, ctx, ctx.get, lambda name: (types.get(name) or (None, None))[1])
        if form is None:
            continue
        attrs, data, shapes = form
        dtypes = [(types.get(n) or (None, None))[0] for n in data]
        if op.variadic:
            kids, kid_dtypes = [shapes], [dtypes]
        else:
            pad = len(op.inputs) - len(data)
            if pad < 0:
                continue
            kids = [tuple(s) if s is not None else None for s in shapes] + [None] * pad
            kid_dtypes = dtypes + [None] * pad
        got, got_dtype, _ = evaluate(op, kids, attrs, kid_dtypes)
        if got is None or got_dtype is None:
            continue
        for d in got:
            if is_sym(d) and d not in symbols.by_code:
                symbols.add_derived(d)
        types[node.output[0]] = (got_dtype, list(got))
        typed[node.output[0]] = helper.make_tensor_value_info(node.output[0], got_dtype, _onnx_shape(got, symbols))
        grown = True
    return grown


# ------------------------------------------------------------ node helpers
_CEIL_POOLS = ("AveragePool", "MaxPool", "LpPool")
_ARBITER_ELEMENTS = 1 << 26  # the largest input a pool is run on to settle its shape (256 MB of float32)


def _ceil_pools(light: onnx.ModelProto, types: dict, typed: dict, checked: set) -> bool:
    """Correct ONNX's shape inference where it is wrong for a ceil-mode pool: onnx 1.23 keeps a last window that
    starts past the input (``AveragePool(kernel 1, stride 3, ceil_mode 1)`` over 9 x 9 is 4 x 4 to it, 3 x 3 to
    ONNX Runtime and to the catalog's ``window_dim``), and every value after it, the explicit pads derived for a
    ``SAME_LOWER`` Conv among them, took the wrong dims (fuzz model 2106: a written graph 1 x 1 where the original
    is 2 x 2, refused by verification).  Where the catalog's rule and inference disagree over concrete dims,
    ONNX Runtime settles it: the pools run alone, in one session, on zeros of their input shapes; an output
    shape it confirms is put in ``typed`` for the next inference to carry on from.  Returns whether any was."""
    todo = []
    for node in light.graph.node:
        if (node.domain not in ("", "ai.onnx") or node.op_type not in _CEIL_POOLS or not node.output
                or node.output[0] in checked or not any(a.name == "ceil_mode" and a.i for a in node.attribute)):
            continue
        checked.add(node.output[0])
        dtype, x = types.get(node.input[0]) or (None, None)
        _, out = types.get(node.output[0]) or (None, None)
        if not dtype or not _concrete(x) or not _concrete(out) or np.prod(x, dtype=np.int64) > _ARBITER_ELEMENTS:
            continue
        mine = window_shape(node, x, types)
        if mine is not None and list(mine) != list(out):
            todo.append((node, dtype, x, mine))
    if not todo:
        return False
    nodes = []
    for k, (n, _, _, _) in enumerate(todo):
        nodes.append(onnx.NodeProto())
        nodes[-1].CopyFrom(n)
        nodes[-1].input[:], nodes[-1].output[:] = [f"x{k}"], [f"y{k}"]
    sub = helper.make_model(helper.make_graph(
        nodes, "pools", [helper.make_tensor_value_info(f"x{k}", d, x) for k, (_, d, x, _) in enumerate(todo)],
        [helper.make_tensor_value_info(f"y{k}", d, None) for k, (_, d, _, _) in enumerate(todo)]),
        opset_imports=light.opset_import, ir_version=min(light.ir_version, 10))
    feeds = {f"x{k}": np.zeros(x, helper.tensor_dtype_to_np_dtype(d)) for k, (_, d, x, _) in enumerate(todo)}
    try:
        got = session(sub, optimize=False).run(None, feeds)
    except Exception:  # ONNX Runtime cannot run them alone: inference's shapes stay (the nodes stay opaque)
        return False
    grown = False
    for (node, dtype, _, mine), y in zip(todo, got):
        if list(y.shape) == list(mine):
            typed[node.output[0]] = helper.make_tensor_value_info(node.output[0], dtype, list(mine))
            types[node.output[0]] = (dtype, list(mine))
            grown = True
    return grown


def _constant_value(node: onnx.NodeProto):
    """(array, ONNX dtype) of a Constant node, or None for sparse/string forms (kept opaque)."""
    if len(node.attribute) != 1:
        return None
    a = node.attribute[0]
    if a.name == "value" and a.t.data_type != onnx.TensorProto.STRING:
        return numpy_helper.to_array(a.t), a.t.data_type
    forms = {"value_float": (np.float32, 1), "value_floats": (np.float32, 1),
             "value_int": (np.int64, 7), "value_ints": (np.int64, 7)}
    if a.name in forms:
        dt, onnx_dt = forms[a.name]
        return np.array(attr_value(a), dtype=dt), onnx_dt
    return None


def _fill(arr: np.ndarray) -> float:
    """The one value of a numeric tensor whose elements are all equal (what the rules' ``(zeros ?c)`` and
    ``(ones ?c)`` read in ``weights.fill``), else NaN (stored as NULL)."""
    a = np.asarray(arr)
    if a.size == 0 or a.dtype.kind not in "fiub":
        return math.nan
    first = a.reshape(-1)[0]
    return float(first) if np.all(a == first) else math.nan


def _digest(arr: np.ndarray, dtype: int) -> str:
    h = hashlib.sha1(f"{dtype}|{list(arr.shape)}|".encode())
    a = np.ascontiguousarray(arr)
    h.update(repr(a.tolist()).encode() if a.dtype == object else a.reshape(-1).view(np.uint8))
    return h.hexdigest()


# ----------------------------------------------------------------- import
def _catalog_form(op: OpDef, node: onnx.NodeProto, ctx, const_of, shape_of,
                  known=lambda name: True) -> tuple[dict, list, list] | None:
    """A node's catalog form: (attributes, defaults filled in and normalised by the op's import hook, lifted
    inputs read from constants; the names of its data inputs; their shapes), or None when the catalog cannot
    represent it.  ``const_of(name)``: a constant input's value (None if not constant); ``shape_of(name)``:
    a value's shape (None if unknown); ``known(name)``: whether a data input is defined yet; ``ctx``: what
    the hooks read (``opset``, ``const_ints``)."""
    attrs = {a.name: attr_value(a) for a in node.attribute}
    lifted = {lf.input_index: lf for lf in op.lifted}
    data = []
    for i, name in enumerate(node.input):
        if i not in lifted:
            data.append(name)
        elif name:
            kind = op.attr(lifted[i].attr).kind
            v = const_of(name)
            if v is not None and kind == "float" and np.size(v) == 1:
                x = np.asarray(v).reshape(-1)[0]
                if x.dtype.kind in "iu" and int(float(x)) != int(x):
                    return None  # an integer a float attribute cannot hold exactly (beyond 2**53)
                attrs[lifted[i].attr] = float(x)
            elif v is not None and kind == "ints":
                attrs[lifted[i].attr] = [int(x) for x in np.asarray(v).reshape(-1)]
            elif v is not None and kind == "int" and np.ndim(v) == 0 and np.asarray(v).dtype.kind in "iu":
                attrs[lifted[i].attr] = int(v)  # a scalar index (Gather); an index list stays opaque
            elif op.op_type == "Reshape" and node.output and shape_of(node.output[0]) is not None:
                attrs.update(shape=shape_of(node.output[0]), allowzero=1)  # input shapes are fixed
            else:
                return None
    shapes = [shape_of(n) if n else None for n in data]
    if any(n and (s is None or not known(n)) for n, s in zip(data, shapes)) or not data or not data[0]:
        return None
    hook = IMPORT_HOOKS.get(op.op_type)
    if hook and not hook(ctx, node, attrs, data, shapes):
        return None
    if set(attrs) - {a.name for a in op.attrs}:
        return None  # an attribute relsat cannot represent
    for a in op.attrs:
        if a.name not in attrs:
            if a.default is REQUIRED:
                return None
            attrs[a.name] = a.default
    if "axis" in attrs:
        attrs["axis"] = norm_axis(attrs["axis"], len(shapes[0]))
    return attrs, data, shapes


@dataclass
class _Item:
    node: onnx.NodeProto
    op: OpDef
    children: dict
    attrs: dict


def _frozen(v):
    return tuple(v) if isinstance(v, list) else v


def _class_of(cls: dict[str, int], name: str, reader: str) -> int:
    """The e-class of value ``name`` in ``cls``, which ``reader`` reads (an error when nothing defines it)."""
    if name not in cls:
        raise RelsatError(f"{reader} reads '{name}', which no node, input or initializer defines")
    return cls[name]


class _Leaves:
    """A graph's leaves as e-classes: initializers and Constant values (``add_weights``) and graph inputs
    (``add_inputs``); ``cls`` maps their names to their e-classes, ``consts`` to their values."""

    def __init__(self, g: EGraph):
        self.g = g
        self.cls: dict[str, int] = {}  # ONNX value name -> e-class
        self.consts: dict[str, np.ndarray] = {}

    def add_weights(self, items: list[tuple[str, np.ndarray, int]]) -> None:
        """Initializers and Constant values: a float32 scalar becomes a Constant leaf (value_float, as
        rules match it), any other tensor a Weight leaf (identical tensors share one)."""
        scalars = [(name, arr) for name, arr, dtype in items if dtype == onnx.TensorProto.FLOAT and arr.ndim == 0]
        if scalars:
            names, arrs = zip(*scalars)
            ids = self.g.add("Constant", attrs={"value_float": np.array([float(a) for a in arrs], dtype=np.float64)})
            self.cls.update(zip(names, ids.tolist()))
            self.consts.update(scalars)
        items = [it for it in items if not (it[2] == onnx.TensorProto.FLOAT and it[1].ndim == 0)]
        g = self.g
        held = [(r, dt, tuple(s), d) for r, dt, s, d in g.sql("SELECT ref, dtype, shape, digest FROM weights")
                if r in g.tensors]
        # only tensors that share their dtype and shape with another one can be equal: hash those alone
        group = Counter([(dt, s) for _, dt, s, _ in held] + [(dt, arr.shape) for _, arr, dt in items])
        by_digest = {d or _digest(g.tensors[r], dt): r for r, dt, s, d in held if group[dt, s] > 1}
        next_ref = max([0, *g.tensors, *(r for (r,) in g.sql("SELECT ref FROM weights"))]) + 1
        rows, ref_of = [], {}
        for name, arr, dtype in items:
            d = _digest(arr, dtype) if group[dtype, arr.shape] > 1 else None
            if d is None or d not in by_digest:
                if d is not None:
                    by_digest[d] = next_ref
                ref_of[name] = next_ref
                g.tensors[next_ref] = arr
                rows.append((next_ref, name, dtype, json.dumps(list(arr.shape)), d, _fill(arr)))
                next_ref += 1
            else:
                ref_of[name] = by_digest[d]
            self.consts[name] = arr
        if rows:
            refs, names, dtypes, shapes, digests, fills = zip(*rows)
            g.con.register("_wbatch", {"ref": np.array(refs, dtype=np.int64), "name": np.array(names, dtype=object),
                                       "dtype": np.array(dtypes, dtype=np.int32),
                                       "shape": np.array(shapes, dtype=object),
                                       "digest": np.array(digests, dtype=object),
                                       "fill": np.array(fills, dtype=np.float64)})
            try:
                g.con.execute("INSERT INTO weights (ref, name, dtype, shape, digest, fill) SELECT ref, name, dtype, "
                              "shape::VARCHAR::BIGINT[], digest, CASE WHEN isnan(fill) THEN NULL ELSE fill END "
                              "FROM _wbatch")
            finally:
                g.con.unregister("_wbatch")
        refs = sorted(set(ref_of.values()))
        if not refs:
            return
        meta = dict((r, (dt, s)) for r, dt, s in g.sql(
            "SELECT ref, dtype, shape FROM weights WHERE ref IN (SELECT unnest(?::BIGINT[]))", [refs]))
        ids = g.add("Weight", attrs={"ref": np.array(refs, dtype=np.int64),
                                     "shape": np.array([json.dumps(meta[r][1]) for r in refs], dtype=object),
                                     "dtype": np.array([meta[r][0] for r in refs], dtype=np.int64)})
        cls_of = dict(zip(refs, ids.tolist()))
        self.cls.update({name: cls_of[r] for name, r in ref_of.items()})
        self._scalar_views(refs, ids, meta)

    def _scalar_views(self, refs, ids, meta) -> None:
        """A float32 weight of one element and a shape of ones (``[1]``, ``[1, 1, 1]``: what exporters
        write for ``x + 3``) gets a second form in its e-class, ``Reshape(Constant(v), shape)``, so that
        rules that match a scalar ``(Constant :value_float v)`` see it (runtime.rules reads through the
        Reshape where broadcasting allows)."""
        g = self.g
        one = [(c, r) for r, c in zip(refs, ids.tolist())
               if meta[r][0] == onnx.TensorProto.FLOAT and meta[r][1] and all(d == 1 for d in meta[r][1])]
        if not one:
            return
        classes, refs1 = zip(*one)
        values = np.array([float(np.asarray(g.tensors[r]).reshape(-1)[0]) for r in refs1], dtype=np.float64)
        consts = g.add("Constant", attrs={"value_float": values})
        views = g.add("Reshape", {"data": consts}, {"shape": np.array(
            [json.dumps(list(meta[r][1])) for r in refs1], dtype=object)})
        g.union(np.array(classes, dtype=np.int64), views)
        g.rebuild()
        found = dict(zip(classes, g.find(list(classes)).tolist()))
        self.cls.update({name: found.get(c, c) for name, c in self.cls.items()})

    def add_inputs(self, inputs: list[tuple[str, int, list[int]]]) -> None:
        if inputs:
            names, dtypes, shapes = zip(*inputs)
            ids = self.g.add("Input", attrs={"name": np.array(names, dtype=object),
                                             "shape": np.array([json.dumps(s) for s in shapes], dtype=object),
                                             "dtype": np.array(dtypes, dtype=np.int64)})
            self.cls.update(zip(names, ids.tolist()))


class _Planner:
    """A graph's nodes as one batch (``relations.bulk.Plan``): each node in its catalog form (``spec``) or
    opaque, catalog nodes hash-consed (``plan``); ``cls`` maps the values planned to their e-classes,
    ``opaque_ops`` counts the opaque nodes by op type.  It is also what the import hooks read (``opset``,
    ``const_ints``)."""

    def __init__(self, model: onnx.ModelProto, opset: int, types: dict, consts: dict[str, np.ndarray], *,
                 opaque_all: bool):
        self.opset, self.types, self.consts = opset, types, consts
        self.opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
        self.opaque_all = opaque_all  # a model passed through at an opset relsat does not support: no catalog nodes
        self.cls: dict[str, int] = {}  # ONNX value name -> e-class
        self.opaque_ops: Counter = Counter()
        graph = model.graph
        self.used = {o.name for o in graph.output} | {
            i for n in graph.node for i in [*n.input, *outer_names(n)] if i}

    def shape(self, name: str):
        return (self.types.get(name) or (None, None))[1]

    def const_ints(self, name: str):
        v = self.consts.get(name)
        return None if v is None else [int(x) for x in np.asarray(v).reshape(-1)]

    def spec(self, node: onnx.NodeProto) -> _Item | None:
        """The catalog form of a node, or None when it must stay opaque."""
        op = for_node(node.domain, node.op_type)
        if op is None or self.opaque_all or (op.domain and not op.in_opsets(self.opsets.get(op.domain, 0))):
            return None
        form = _catalog_form(op, node, self, self.consts.get, self.shape, self.cls.__contains__)
        if form is None:
            return None
        attrs, data, shapes = form
        if not op.is_tuple and (not node.output or not node.output[0] or self.used.intersection(node.output[1:])):
            return None  # a second output (MaxPool's Indices, LayerNormalization's Mean, ...) is used
        if op.variadic:
            if not all(data):
                return None
            children = {op.inputs[0].column: [self.cls[n] for n in data]}
        else:
            if len(data) > len(op.inputs):
                return None
            children = {}
            for k, inp in enumerate(op.inputs):
                name = data[k] if k < len(data) else ""
                if not name and not inp.optional:
                    return None
                children[inp.column] = self.cls[name] if name else -1
        return _Item(node, op, children, attrs)

    def plan(self, nodes: list[onnx.NodeProto], leaves: dict[str, int], forced: set[int],
             const: dict[int, bool]) -> Plan:
        """Every node as a row of one batch, in order (``nodes`` is topologically sorted), reading the
        leaves' e-classes ``leaves``: catalog nodes hash-consed on (op, children, attributes), typed by ONNX
        shape inference; the nodes at positions ``forced``, and those the catalog cannot represent, opaque."""
        plan, seen, proj = Plan(), {}, {}
        self.cls = dict(leaves)
        self.opaque_ops = Counter()

        def getitem(t: int, index: int, name: str, src: list) -> int:
            if (t, index) not in proj:
                dtype, shape = self.types.get(name) or (None, None)
                proj[t, index] = c = plan.new_class(shape, dtype, const[t])
                const[c] = const[t]
                plan.rows.append(Row(GETITEM, {"t": t}, {"index": index}, c, src))
            return proj[t, index]

        for pos, node in enumerate(nodes):
            item = None if pos in forced else self.spec(node)
            if item is None:
                self.opaque_ops[node.op_type] += 1
                ins = [_class_of(self.cls, n, f"node '{node.name}' ({node.op_type})")
                       for n in [*(i for i in node.input if i), *outer_names(node)]]
                types = [self.types.get(o) or (None, None) for o in node.output]
                k = bool(ins) and not (node.op_type in _RANDOM_OPS and node.domain == "") and all(const[c] for c in ins)
                outs = plan_opaque(plan, node, ins, [s for _, s in types], [d for d, _ in types], k)
                const.update((c, k) for c in outs)
                self.cls.update((o, c) for o, c in zip(node.output, outs) if o)
                continue
            op = item.op
            values = [_frozen(item.children[c]) for c in op.child_columns]
            key = (op.op_type, *values, *(_frozen(item.attrs[a.name]) for a in op.attrs))
            if key in seen:
                out, src = seen[key]
                src.append(pos)
            else:
                kids = [c for v in values for c in (v if isinstance(v, tuple) else (v,)) if c != -1]
                k = all(const[c] for c in kids)
                if op.is_tuple:
                    types = [self.types.get(o) or (None, None) for o in node.output]
                    known = all(d is not None and s is not None for d, s in types)
                    out = plan.new_class(None, None, k, [s for _, s in types] if known else None,
                                         [d for d, _ in types] if known else None)
                else:
                    dtype, shape = self.types.get(node.output[0]) or (None, None)
                    out = plan.new_class(shape, dtype, k)
                const[out], src = k, [pos]
                seen[key] = out, src
                plan.rows.append(Row(op, item.children, item.attrs, out, src))
            if op.is_tuple:
                for index, o in enumerate(node.output):
                    if o:
                        self.cls[o] = getitem(out, index, o, src)
            else:
                self.cls[node.output[0]] = out
        return plan


class _Importer:
    """A graph's values into the e-graph: its leaves (``leaves``), then its nodes (``run``) planned
    (``_Planner``) and written as one batch; ``cls`` maps every value to its e-class, ``notices`` names the
    nodes kept opaque because relsat's shape rules disagreed."""

    def __init__(self, g: EGraph, model: onnx.ModelProto, opset: int, types: dict, *, opaque_all: bool):
        self.g = g
        # whether the e-graph held nodes before (read before the leaves are written)
        self.merge = any(not t.startswith(("op_input", "op_weight", "op_constant")) for t in g.live)
        self.leaves = _Leaves(g)
        self.planner = _Planner(model, opset, types, self.leaves.consts, opaque_all=opaque_all)
        self.cls: dict[str, int] = {}  # ONNX value name -> e-class, once the nodes are written
        self.notices: list[str] = []

    def klass(self, name: str, reader: str) -> int:
        return _class_of(self.cls, name, reader)

    def run(self, nodes: list[onnx.NodeProto]) -> None:
        """Insert the nodes in one set-oriented batch (``relations.bulk.write``), whatever the depth of the graph.
        A node whose catalog rule disagrees with ONNX shape inference is kept opaque (the batch is
        planned again without it)."""
        level_of: dict[str, int] = {}
        levels = []
        for node in nodes:
            lvl = 1 + max((level_of.get(n, 0) for n in [*node.input, *outer_names(node)] if n), default=0)
            level_of.update((o, lvl) for o in node.output)
            levels.append(lvl)
        nodes = [nodes[i] for i in sorted(range(len(nodes)), key=levels.__getitem__)]  # children first
        leaves = dict(self.leaves.cls)
        known = sorted(set(leaves.values()))
        const0 = dict(self.g.sql("SELECT id, is_const FROM eclass WHERE id IN (SELECT unnest(?::BIGINT[]))",
                                 [known])) if known else {}
        forced: set[int] = set()
        while True:
            plan = self.planner.plan(nodes, leaves, forced, dict(const0))
            bad, classes = write(self.g, plan)
            if not bad:
                break
            for k in sorted(bad):
                for pos in plan.rows[k].src:
                    if pos not in forced:
                        forced.add(pos)
                        node = nodes[pos]
                        dynamic = any(is_sym(d) for n in [*node.input, *node.output]
                                      for d in (self.planner.shape(n) or ()))
                        why = ("relsat's shape rules cannot prove its output shape over dynamic dims" if dynamic
                               else "relsat's shape rule disagrees with ONNX shape inference")
                        self.notices.append(f"node '{node.name}' ({node.op_type}): {why}; kept opaque")
        self.cls = {name: real_id(classes, c) for name, c in self.planner.cls.items()}
        if self.merge:  # the e-graph held nodes before: hash-cons the new rows against them
            for op in OPS:
                if op.table in self.g.live and not op.leaf:
                    on = " AND ".join(f"o.{q(k)} IS NOT DISTINCT FROM n.{q(k)}" for k in key_columns(op))
                    self.g.union_from(f"SELECT n.out, o.out FROM {op.table} n JOIN {op.table} o ON {on} AND o.id < n.id")
            self.g.rebuild()
            names = list(self.cls)
            self.cls = dict(zip(names, self.g.find([self.cls[n] for n in names]).tolist()))


def _upgraded(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str | None, bool]:
    """``model`` as ``import_model`` reads it, the upgrade notice, and whether it is passed through: one
    ``load_model`` upgraded keeps its notice; one below opset 7 is normalised and upgraded; one that no
    conversion reaches but ONNX Runtime runs is passed through (normalised only), with a notice."""
    if id(model) in _UPGRADED and _UPGRADED[id(model)][0] is model:
        return model, _UPGRADED[id(model)][1], False
    try:
        up, notice = upgrade_opset(model)
    except RelsatError as e:
        if _ort_error(model) is not None:
            raise
        normal, _ = normalise_legacy(model)
        return normal, (f"opset {_default_opset(model)} kept: {e}; ONNX Runtime runs the model, so it is passed "
                        "through with every node opaque"), True
    if notice is None:
        up, _ = normalise_legacy(model)  # an IR 3 model whose initializers are not inputs: read as IR 4
    return up, notice, False


def _overridable(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """From IR version 4 on, an initializer that is also listed as a graph input is a default the caller
    may override (ONNX Runtime neither folds it nor treats it as constant): ``model`` without those
    initializers, so that they import as graph inputs (typed from the initializer where the input
    declares no shape), and the initializers, which the export writes back as the inputs' defaults.
    In IR version 3 every initializer had to be listed as an input, and they are constants."""
    if model.ir_version < 4:
        return model, []
    listed = {v.name for v in model.graph.input}
    defaults = [t for t in model.graph.initializer if t.name in listed]
    if not defaults:
        return model, []
    out = onnx.ModelProto()
    out.CopyFrom(model)
    names = {t.name: t for t in defaults}
    keep = [t for t in out.graph.initializer if t.name not in names]
    del out.graph.initializer[:]
    out.graph.initializer.extend(keep)
    for v in out.graph.input:
        t = names.get(v.name)
        if t is not None and not v.type.tensor_type.HasField("shape"):
            v.type.tensor_type.elem_type = v.type.tensor_type.elem_type or t.data_type
            for d in t.dims:
                v.type.tensor_type.shape.dim.add().dim_value = d
    return out, defaults


def _names(tensors, most: int = 3) -> str:
    return _names_quoted([t.name for t in tensors], most)


def _names_quoted(names: list[str], most: int = 3) -> str:
    quoted = [f"'{n}'" for n in names[:most]]
    return ", ".join(quoted) + (f" and {len(names) - most} more" if len(names) > most else "")


def import_model(model: onnx.ModelProto, *, input_shapes: dict[str, list[int]] | None = None,
                 fix_shapes: bool = False, egraph: EGraph | None = None) -> ImportResult:
    """Translate a (checked) model into an e-graph. Dynamic input dims stay symbols (``relations/dims.py``;
    ``input_shapes`` binds them for costs) unless ``fix_shapes``, which freezes them to ``input_shapes``
    (or 1 for a batch-like dim). A model below opset 7 is upgraded first (``upgrade_opset``); when no
    conversion exists but ONNX Runtime runs it, it is passed through: every node opaque, so the input
    model is written unchanged."""
    model, defaults = _overridable(model)
    model, upgraded, passthrough = _upgraded(model)
    node_count = len(model.graph.node)
    model, split = (model, []) if passthrough else split_fusions(model)
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version for o in model.opset_import}
    opset = opsets.get("")
    if not passthrough and (opset is None or not MIN_OPSET <= opset <= MAX_OPSET):
        raise RelsatError(f"model '{model.graph.name}': default-domain opset {opset} is not supported "
                          f"(relsat supports opsets {MIN_OPSET} to {MAX_OPSET})")
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    real_inputs = [v for v in graph.input if v.name not in init_names]
    g = egraph if egraph is not None else EGraph()
    symbols = Symbols.from_egraph(g)
    shapes, notices, specialized = _input_shapes(real_inputs, input_shapes, fix_shapes, symbols)
    notices = ([upgraded] if upgraded else []) + split + notices
    if defaults:
        notices.append(f"{len(defaults)} initializer(s) also listed as graph inputs ({_names(defaults)}) kept as "
                       "inputs with their defaults, not folded: callers may override them (ONNX IR >= 4)")
    try:
        infer = functools.partial(_infer_types, shapes=shapes, symbols=symbols)
        if passthrough:
            (types, folded), inlined = infer(model), []
        else:  # an If the computed values decide: its branch in its place, then compute again
            model, types, folded, inlined = inline_all(model, infer)
            graph = model.graph
        if inlined:
            notices.append(f"If x{len(inlined)} decided at import (the condition computed from constants and static "
                           f"dims): the branch taken in its place ({_names_quoted(inlined)})")
        if not passthrough:  # and those inside the branches of the Ifs kept
            model, nested = inline_within(model, types, {**scalar_constants(model.graph), **folded},
                                          lambda m, s: _infer_types(m, s, symbols))
            graph = model.graph
            if nested:
                notices.append(f"If x{len(nested)} inside the branches of an If decided at import (the condition "
                               f"computed from constants and static dims): the branch taken in its place "
                               f"({_names_quoted(nested)})")
    except Exception as e:
        types, folded = {}, {}
        notices.append(f"ONNX shape inference failed ({error_line(e)}); every node kept opaque")
    types, assumed = propagate_dims(graph, types, symbols, {v.name for v in real_inputs})
    if assumed:
        notices.append(f"dims assumed equal where {len(assumed)} broadcasting node(s) need them so ({_names_quoted(assumed)}): "
                       "shape inference could not prove them equal; the model runs only where they are (or one is 1)")
    imp = _Importer(g, model, opset, types, opaque_all=passthrough)
    if passthrough:
        folded = {}
    weights = [(t.name, numpy_helper.to_array(t), t.data_type) for t in graph.initializer]
    nodes, computed = [], Counter()
    for node in graph.node:
        value = (_constant_value(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx")
                 and not passthrough else None)
        if value is not None:
            weights.append((node.output[0], *value))
        elif node.output and node.output[0] in folded:
            arr = folded[node.output[0]]
            weights.append((node.output[0], arr, helper.np_dtype_to_tensor_dtype(arr.dtype)))
            computed[node.op_type] += 1
        else:
            nodes.append(node)
    if computed:
        notices.append("computed at import from constants and static shapes: " + ", ".join(
            f"{op} x{n}" if n > 1 else op for op, n in computed.most_common()))
    imp.leaves.add_weights(weights)
    inputs = [(v.name, v.type.tensor_type.elem_type, shapes[v.name]) for v in real_inputs]
    imp.leaves.add_inputs(inputs)
    imp.run(nodes)
    opaque = imp.planner.opaque_ops
    if opaque:
        notices.append("kept opaque (not in relsat's catalog or not representable): "
                       + ", ".join(f"{op} x{n}" if n > 1 else op for op, n in opaque.most_common()))
    outputs = [(o.name, imp.klass(o.name, "the graph output")) for o in graph.output]
    return ImportResult(
        egraph=g, outputs=outputs, inputs=inputs, notices=notices + imp.notices, opset_imports=opsets,
        ir_version=model.ir_version, metadata={p.key: p.value for p in model.metadata_props},
        producer=(model.producer_name, model.producer_version), graph_name=graph.name, doc_string=model.doc_string,
        node_count=node_count, values=imp.cls,
        specialized=specialized,
        output_info={o.name: o for o in graph.output},
        functions=list(model.functions), domain=model.domain, model_version=model.model_version,
        symbols=symbols, upgraded=upgraded, types=types, defaults=defaults)
