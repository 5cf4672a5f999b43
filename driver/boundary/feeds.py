"""Verification inputs a model can run on: integer inputs drawn from valid ranges, and user-given sets.

relsat runs the original and the optimized model on the same inputs (verification, timing). Random
integers in the default range (``relations.runtime.INT_RANGE``) make the *original* model fail when
an integer graph input is a shape, an index or a split: ``Expand`` to a random shape, ``Gather``
beyond the table, split sizes that do not add up. This module owns

- ``input_roles(model, shapes)``: what each integer or bool graph input's values must be, found from
  the nodes that consume it, directly or through value-preserving ops (``PASS_THROUGH``), and the
  consumer's input position (``ROLE_TABLE``: (op_type, position) -> role, one line a case). Several
  uses of one input intersect (the smallest table bounds its indices); uses that cannot all hold
  (split sizes that are also indices) fall back to the default range and say why in ``Role.why``.
  Lengths of indexed dims come from ONNX shape inference with the graph inputs fixed to ``shapes``.
- ``draw(specs, roles, rng)``: seeded random feeds for concrete (name, shape, dtype) triples that
  honor the roles; ordinary inputs come from ``relations.runtime.random_array``.
- ``load_input_sets(paths, inputs)``: user verification data (``--inputs FILE.npz``, one set of
  inputs per file), checked against the graph inputs; each problem is a one-line ``RelsatError``.

Not covered: uses inside subgraphs (If/Loop/Scan bodies), values that pass through arithmetic, and
negative indices (never drawn).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from relsat.driver.errors import RelsatError, error_line
from relsat.relations import runtime

DEFAULT, RANGE, SPLIT, AXES, RESHAPE = "default", "range", "split", "axes", "reshape"
SMALL_POSITIVE = (1, 5)


@dataclass(frozen=True)
class Role:
    """What one integer input's values must be. ``range``: uniform in [low, high) (high None: the
    default range's width from low); ``split``: sizes adding up to ``dim`` (a scalar: 1); ``axes``:
    0, 1, ..., k-1 (``dim``: the rank they index, None when any k is valid); ``reshape``: a Reshape
    target that keeps the data (zeros copy dims, ``dim``: the data's rank); ``default``: as any
    integer input. ``why``: the uses that gave the role, or why it fell back to the default."""
    kind: str = DEFAULT
    low: int = 0
    high: int | None = None
    dim: int | None = None
    why: str = ""


# --- the role of one use: (node, dims) -> Role; dims(name) is a value's list of dims (None unknown) --

def _attr(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _at(dims, axis):
    """dims[axis] (negative axes count from the end), None where unknown."""
    if dims is None or not -len(dims) <= axis < len(dims):
        return None
    return dims[axis]


def _who(node):
    return f"{node.op_type} {node.name or node.output[0]!r}"


def index(data=0, axis="axis", default_axis=0):
    """Indices into ``node.input[data]`` along the ``axis`` attribute: [0, n)."""
    def role(node, dims):
        ax = _attr(node, axis, default_axis)
        n = _at(dims(node.input[data]), ax)
        return Role(RANGE, 0, n, why=f"{_who(node)} indices: [0, {n if n is not None else '?'}) on axis {ax}")
    return role


def index_nd(data=0, indices=1, batch_dims="batch_dims"):
    """GatherND/ScatterND indices: the last index dim picks dims batch_dims.. of the data; [0, min n)."""
    def role(node, dims):
        b = _attr(node, batch_dims, 0)
        d, q = dims(node.input[data]), _at(dims(node.input[indices]), -1)
        picked = None if d is None else d[b:b + q] if q else d[b:]
        n = None if not picked or None in picked else min(picked)
        return Role(RANGE, 0, n, why=f"{_who(node)} nd indices: [0, {n if n is not None else '?'})")
    return role


def ones(what):
    """A shape or repeats that must broadcast with anything: all ones."""
    def role(node, dims):
        return Role(RANGE, 1, 2, why=f"{_who(node)} {what}: ones")
    return role


def positive(what, data=None, axis="axis", default_axis=-1):
    """Small positive values; with ``data``: at most the length of its ``axis`` (TopK's K)."""
    def role(node, dims):
        hi = SMALL_POSITIVE[1]
        if data is not None:
            n = _at(dims(node.input[data]), _attr(node, axis, default_axis))
            hi = n + 1 if n else 2
        return Role(RANGE, 1, hi, why=f"{_who(node)} {what}: [1, {hi})")
    return role


def compared(other):
    """An integer compared for equality with a constant scalar (a sample rate, a mode flag): that constant,
    so that the branch the model is built for runs (``dims.consts``: the small constants of the graph)."""
    def role(node, dims):
        c = getattr(dims, "consts", {}).get(node.input[other]) if other < len(node.input) else None
        if c is None or np.size(c) != 1 or np.asarray(c).dtype.kind not in "iub":
            return Role(why=f"{_who(node)}: compared with no constant")
        v = int(np.asarray(c).reshape(-1)[0])
        return Role(RANGE, v, v + 1, why=f"{_who(node)}: equal to the constant {v}")
    return role


def split(data=0, axis="axis", default_axis=0):
    """Split sizes of ``node.input[data]`` along ``axis``: they add up to its length."""
    def role(node, dims):
        ax = _attr(node, axis, default_axis)
        n = _at(dims(node.input[data]), ax)
        if n is None:
            return Role(why=f"{_who(node)} split sizes: length of axis {ax} unknown")
        return Role(SPLIT, dim=n, why=f"{_who(node)} split sizes adding up to {n}")
    return role


def axes(data=0):
    """Axes of ``node.input[data]`` (data None: any k distinct axes from 0 are valid, as Unsqueeze)."""
    def role(node, dims):
        r = None
        if data is not None:
            d = dims(node.input[data])
            if d is None:
                return Role(why=f"{_who(node)} axes: rank of the data unknown")
            r = len(d)
        return Role(AXES, dim=r, why=f"{_who(node)} axes 0, 1, ...")
    return role


def reshape(data=0):
    """A Reshape target for ``node.input[data]`` that always fits it (see ``_draw_one``)."""
    def role(node, dims):
        d = dims(node.input[data])
        if _attr(node, "allowzero", 0) or d is None:
            return Role(why=f"{_who(node)} shape: allowzero or unknown data rank")
        return Role(RESHAPE, dim=len(d), why=f"{_who(node)} shape keeping the data's dims")
    return role


_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")

# (consumer op_type, input position) -> role of the values fed there
ROLE_TABLE = {
    ("Gather", 1): index(),
    ("GatherElements", 1): index(),
    ("ScatterElements", 1): index(),
    ("GatherND", 1): index_nd(),
    ("ScatterND", 1): index_nd(),
    ("Expand", 1): ones("shape"),
    ("Tile", 1): ones("repeats"),
    ("ConstantOfShape", 0): ones("shape"),
    ("Split", 1): split(),
    ("SplitToSequence", 1): split(),
    ("TopK", 1): positive("K", data=0),
    ("OneHot", 1): positive("depth"),
    ("Range", 2): positive("delta"),
    ("Slice", 3): axes(),
    ("Slice", 4): positive("steps"),
    ("Unsqueeze", 1): axes(None),
    ("Reshape", 1): reshape(),
    ("Equal", 0): compared(1),
    ("Equal", 1): compared(0),
    **{(op, 1): axes() for op in _REDUCE},  # opset 18 (ReduceSum: 13)
}

# (op_type, position) whose output 0 carries the input's values on; "part": only a piece of them
PASS_THROUGH = {("Cast", 0): "whole", ("Identity", 0): "whole", ("Squeeze", 0): "whole",
                ("Unsqueeze", 0): "whole", ("Flatten", 0): "whole", ("Reshape", 0): "whole",
                ("Concat", None): "part"}


def _is_int(elem_type: int) -> bool:
    return elem_type in (onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32,
                         onnx.TensorProto.INT64, onnx.TensorProto.UINT8, onnx.TensorProto.UINT16,
                         onnx.TensorProto.UINT32, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL)


def graph_inputs(model: onnx.ModelProto) -> list[tuple[str, int, list]]:
    """The graph inputs that are not initializers: (name, TensorProto element type, declared dims:
    ints for fixed dims, dim names or None for dynamic ones)."""
    inits = {t.name for t in model.graph.initializer}
    out = []
    for vi in model.graph.input:
        if vi.name in inits or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        dims = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        out.append((vi.name, tt.elem_type, dims))
    return out


def _shape_model(model: onnx.ModelProto, shapes: dict) -> onnx.ModelProto:
    """A copy for shape inference: graph inputs fixed to ``shapes``, large initializers given as typed
    inputs (no data copied; only small ones can be shape constants)."""
    g = onnx.GraphProto(name=model.graph.name)
    g.node.extend(model.graph.node)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if vi.name in shapes and vi.type.HasField("tensor_type"):
            vi = onnx.helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type,
                                                    [int(d) for d in shapes[vi.name]])
        g.input.append(vi)
    for t in model.graph.initializer:
        if np.prod(t.dims, dtype=np.int64) <= 64:
            g.initializer.append(t)
        else:
            g.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    m = onnx.helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version)
    m.functions.extend(model.functions)
    return m


def _dims_lookup(model: onnx.ModelProto, shapes: dict):
    """dims(name): a value's dims (ints, None where unknown) or None when its rank is unknown; ``dims.consts``:
    the graph's small constants (initializers and Constant nodes) by name."""
    table, copy = {}, _shape_model(model, shapes)
    infos = list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output)
    for data_prop in (True, False):
        try:
            g = onnx.shape_inference.infer_shapes(copy, strict_mode=False, data_prop=data_prop).graph
        except Exception:  # an op shape inference does not know, a bad model: what is declared
            continue
        infos = list(g.input) + list(g.value_info) + list(g.output)
        break
    for vi in infos:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is not None and tt.HasField("shape"):
            table[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    for t in model.graph.initializer:
        table[t.name] = list(t.dims)
    for name, dims in shapes.items():
        table[name] = [int(d) for d in dims]

    def lookup(name):
        return table.get(name)

    lookup.consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer
                     if np.prod(t.dims, dtype=np.int64) <= 64}
    for n in model.graph.node:
        if n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value":
            t = n.attribute[0].t
            if np.prod(t.dims, dtype=np.int64) <= 64 and t.data_type != onnx.TensorProto.STRING:
                lookup.consts[n.output[0]] = onnx.numpy_helper.to_array(t)
    return lookup


def _uses(value, consumers, dims, part=False, depth=0):
    """The roles of every use of ``value`` (through PASS_THROUGH ops)."""
    roles = []
    for node in consumers.get(value, ()):
        for pos, name in enumerate(node.input):
            if name != value:
                continue
            through = PASS_THROUGH.get((node.op_type, pos), PASS_THROUGH.get((node.op_type, None)))
            if node.op_type == "Cast" and _attr(node, "to", 0) == onnx.TensorProto.BOOL:
                through = None  # values become 0/1
            if through and depth < 32:
                roles += _uses(node.output[0], consumers, dims, part or through == "part", depth + 1)
                continue
            rule = ROLE_TABLE.get((node.op_type, pos))
            if rule is None:
                continue
            role = rule(node, dims)
            if part and role.kind in (SPLIT, AXES, RESHAPE):
                role = Role(why=f"{role.why}, but through a Concat: only a piece of them")
            roles.append(role)
    return roles


def _merge(roles: list[Role]) -> Role:
    """The one role that satisfies all of ``roles``, or the default with the reason."""
    why = "; ".join(r.why for r in roles)
    shaped = [r for r in roles if r.kind in (SPLIT, AXES, RESHAPE)]
    if any(r.kind == DEFAULT for r in roles):
        return Role(why=why)
    if shaped:
        if len(roles) > len(shaped) or len({(r.kind, r.dim) for r in shaped}) > 1:
            return Role(why=f"conflicting uses, default range: {why}")
        return Role(shaped[0].kind, dim=shaped[0].dim, why=why)
    low = max(r.low for r in roles)
    highs = [r.high for r in roles if r.high is not None]
    high = min(highs) if highs else None
    if high is not None and high <= low:
        return Role(why=f"conflicting uses, default range: {why}")
    return Role(RANGE, low, high, why=why)


def input_roles(model: onnx.ModelProto, shapes: dict[str, list[int]] | None = None) -> dict[str, Role]:
    """The role of every integer or bool graph input (module docstring); ``shapes``: the concrete dims
    of the graph inputs (needed for dynamic dims). An input with no shape or index use is an
    attention mask (all ones) when named like one, else ``default``."""
    shapes = dict(shapes or {})
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in dict.fromkeys(node.input):
            consumers.setdefault(name, []).append(node)
    dims = None
    out = {}
    for name, elem, _ in graph_inputs(model):
        if not _is_int(elem):
            continue
        if dims is None:  # shape inference only for models with integer inputs
            dims = _dims_lookup(model, shapes)
        uses = _uses(name, consumers, dims)
        if uses:
            out[name] = _merge(uses)
        elif "mask" in name.lower():
            out[name] = Role(RANGE, 1, 2, why="named like an attention mask: ones")
        else:
            out[name] = Role(why="no shape or index use")
    return out


def range_bounds(role: Role, dtype: np.dtype) -> tuple[int, int]:
    """The integers ``low <= v < high`` a RANGE input is drawn from: the role's range (open above: as wide
    as ``runtime.INT_RANGE``) clipped to what ``dtype`` holds (the report describes the draw with it too)."""
    low = role.low
    high = role.high if role.high is not None else low + runtime.INT_RANGE[1] - runtime.INT_RANGE[0]
    top = 2 if dtype == np.bool_ else int(np.iinfo(dtype).max) + 1
    low = min(low, top - 1)
    return low, max(min(high, top), low + 1)


def _draw_one(rng, name, shape, dtype, role: Role | None, scale):
    shape = [int(d) for d in shape]
    kind = role.kind if role is not None else DEFAULT
    if dtype.kind not in "iub" or kind == DEFAULT:
        return np.asarray(runtime.random_array(rng, shape, dtype, scale=scale))
    if kind == RANGE:
        low, high = range_bounds(role, dtype)
        return rng.integers(low, high, size=shape).astype(dtype)
    if len(shape) > 1 or dtype == np.bool_:
        return np.asarray(runtime.random_array(rng, shape, dtype, scale=scale))
    k = shape[0] if shape else None
    if kind == SPLIT:
        if k is None:
            return np.asarray(1, dtype=dtype)
        sizes = [role.dim // k + (i < role.dim % k) for i in range(k)]
        return np.asarray(sizes, dtype=dtype)
    if kind == AXES:
        return np.asarray(0 if k is None else np.arange(k), dtype=dtype)
    # RESHAPE: zeros copy the data's dims; past its rank ones; short of it a -1 takes the rest
    if k is None or k == 0:
        return np.zeros(shape, dtype=dtype)
    if k >= role.dim:
        return np.asarray([0] * role.dim + [1] * (k - role.dim), dtype=dtype)
    return np.asarray([0] * (k - 1) + [-1], dtype=dtype)


def draw(specs, roles: dict[str, Role] | None, rng, *, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Random feeds for ``specs`` ((name, concrete shape, dtype) triples) honoring ``roles``
    (``input_roles`` for the same shapes); ``rng``: a numpy Generator or a seed. Floats ~ N(0, scale^2),
    inputs without a role as ``relations.runtime.random_array``. Deterministic for a seed."""
    rng = np.random.default_rng(rng)
    roles = roles or {}
    return {name: _draw_one(rng, name, shape, np.dtype(dtype), roles.get(name), scale)
            for name, shape, dtype in specs}


def model_feeds(model: onnx.ModelProto, shapes: dict[str, list[int]] | None = None, *, seed=0,
                scale: float = 1.0) -> dict[str, np.ndarray]:
    """``draw`` for every graph input of ``model``: dynamic dims from ``shapes``, else 1."""
    shapes = dict(shapes or {})
    specs = []
    for name, elem, declared in graph_inputs(model):
        shape = shapes.get(name) or [d if isinstance(d, int) and d > 0 else 1 for d in (declared or [])]
        shapes[name] = [int(d) for d in shape]
        specs.append((name, shapes[name], runtime.np_dtype(elem)))
    return draw(specs, input_roles(model, shapes), seed, scale=scale)


def _np_dtype(dtype) -> np.dtype:
    if isinstance(dtype, (int, np.integer)) or (isinstance(dtype, str) and dtype.startswith("tensor(")):
        return runtime.np_dtype(dtype)
    return np.dtype(dtype)


def _fmt(dims) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _load_set(path: Path, inputs) -> dict[str, np.ndarray]:
    where = str(path)
    if not path.is_file():
        raise RelsatError(f"{where}: no such file" if not path.exists() else f"{where}: not a file")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise RelsatError(f"{where}: not a valid .npz file: {error_line(e)}") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise RelsatError(f"{where}: not a .npz archive (a single .npy array); save the inputs with "
                          "numpy.savez(FILE, name=array, ...)")
    with archive:
        arrays = {}
        for key in archive.files:
            try:
                arrays[key] = archive[key]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
                raise RelsatError(f"{where}: array {key!r} cannot be read: {error_line(e)}") from None
    names = [name for name, _, _ in inputs]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise RelsatError(f"{where}: no array for input {missing[0]!r} (the model's inputs: "
                          f"{', '.join(names)}; the file has: {', '.join(sorted(arrays)) or 'nothing'})")
    extra = sorted(set(arrays) - set(names))
    if extra:
        raise RelsatError(f"{where}: array {extra[0]!r} is not an input of the model (its inputs: {', '.join(names)})")
    out, bound = {}, {}
    for name, dtype, dims in inputs:
        a, want = arrays[name], _np_dtype(dtype)
        if want == np.dtype(object) and a.dtype.kind in "US":
            a = a.astype(object)  # ONNX strings: .npz cannot hold object arrays without pickle
        elif a.dtype != want:
            raise RelsatError(f"{where}: input {name!r} has dtype {a.dtype}, the model wants {want}")
        if dims is not None:
            if a.ndim != len(dims):
                raise RelsatError(f"{where}: input {name!r} has rank {a.ndim} (shape {list(a.shape)}), "
                                  f"the model wants rank {len(dims)} ({_fmt(dims)})")
            for k, (got, d) in enumerate(zip(a.shape, dims)):
                if isinstance(d, (int, np.integer)) and d > 0 and got != d:
                    raise RelsatError(f"{where}: input {name!r} has shape {list(a.shape)}, the model wants "
                                      f"{_fmt(dims)} (dim {k} must be {d})")
                if isinstance(d, str) and d:
                    other = bound.setdefault(d, (got, name))
                    if other[0] != got:
                        raise RelsatError(f"{where}: input {name!r} binds dim {d!r} to {got}, input "
                                          f"{other[1]!r} binds it to {other[0]}")
        out[name] = a
    return out


def load_input_sets(paths, inputs) -> list[dict[str, np.ndarray]]:
    """User verification data: one set of inputs per ``.npz`` file (array name = graph input name).
    ``inputs``: every graph input as (name, dtype: TensorProto code / numpy dtype / 'tensor(..)',
    declared dims: ints fixed, names or None dynamic; dims None: any shape), e.g. ``graph_inputs(model)``.
    Each set binds the dynamic dims as it likes (one name, one length within a set). A missing file,
    a broken archive, a missing or extra array, another dtype (no casts), rank or fixed dim is a
    one-line RelsatError naming the file and the input."""
    inputs = [(name, dtype, None if dims is None else list(dims)) for name, dtype, dims in inputs]
    return [_load_set(Path(p), inputs) for p in paths]
