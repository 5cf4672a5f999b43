"""PyTorch mappings of the ONNX operators that the catalog leaves opaque, so that whole real models run.

relsat imports these operators as opaque nodes (relations/catalog.py: no table, no rules; shape from ONNX's
inference), yet the PyTorch runtime (:mod:`relsat.driver.boundary.torch_runtime`) must run the models that hold
them: the shape arithmetic of exported transformers and detectors (Shape, Cast, Range, ConstantOfShape, Expand,
comparisons, Where), reductions, Resize, InstanceNormalization, elementwise math. ``OPAQUE`` holds one entry per
operator in the catalog's own form (an ``OpDef`` of which only op_type, domain, inputs, attrs, lifted, host and
torch are read), so :mod:`relsat.extract.torch_cuda` evaluates them exactly as it evaluates catalog operators; an
operator that the catalog gains leaves this table (tests/test_torch_opaque.py checks that they are disjoint).
Integer and boolean results keep their ONNX dtypes (Shape int64, Cast the ``to`` type, comparisons bool).

``REFUSALS`` holds, per operator, the attribute combinations that are not implemented here (a Resize mode,
a Cast to a type torch has no dtype for): ``torch_cuda.refusal`` reports them and the runtime refuses such a
node when the session is made, rather than compute something else. Resize implements ONNX's nearest and
linear modes with every coordinate transformation but tf_crop_and_resize and half_pixel_symmetric: the source
coordinates are computed on the host in float32 as ONNX Runtime does, then gathered on the device.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from onnx import TensorProto, numpy_helper

from relsat.relations.catalog import Attr, Input, Lifted, OpDef

DTYPES = {TensorProto.FLOAT: torch.float32, TensorProto.DOUBLE: torch.float64, TensorProto.FLOAT16: torch.float16,
          TensorProto.BFLOAT16: torch.bfloat16, TensorProto.INT8: torch.int8, TensorProto.INT16: torch.int16,
          TensorProto.INT32: torch.int32, TensorProto.INT64: torch.int64, TensorProto.UINT8: torch.uint8,
          TensorProto.BOOL: torch.bool}


# ------------------------------------------------------------------ helpers the expressions call
def _dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype)).dtype


def shape_of(data, start, end):
    """ONNX Shape: the dims ``start:end`` (clamped, negative from the end) as int64, always on the host."""
    return torch.tensor(list(data.shape)[start:end], dtype=torch.int64)


def constant_of_shape(shape, attrs: dict, device):
    """ONNX ConstantOfShape: ``shape`` filled with the one element of ``value`` (default float32 0)."""
    value = attrs.get("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    return torch.full([int(s) for s in np.reshape(shape, -1)], fill[0].item(), dtype=_dtype(fill.dtype),
                      device=device)


def arange(start, limit, delta, device):
    """ONNX Range: max(ceil((limit - start) / delta), 0) elements start + i * delta, of the inputs' dtype."""
    start, limit, delta = (np.asarray(v).reshape(-1) for v in (start, limit, delta))
    n = max(math.ceil((limit[0].item() - start[0].item()) / delta[0].item()), 0)
    return torch.arange(n, dtype=_dtype(start.dtype), device=device) * delta[0].item() + start[0].item()


def expand(x, shape):
    """ONNX Expand: ``x`` broadcast with ``shape`` both ways (either may hold the larger dim or rank), written out."""
    return x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(int(s) for s in shape))).contiguous()


def reduce(kind: str, x, axes, keepdims, noop):
    """ONNX ReduceMean/L2/Min/Max/Prod (the first two catalog operators) over ``axes`` (all when empty, none with ``noop_with_empty_axes``)."""
    if not axes:
        if noop:
            return x
        axes = range(x.dim())
    dims, keep = sorted({a % x.dim() for a in axes}), bool(keepdims)
    if kind == "prod":
        for d in reversed(dims):
            x = x.prod(d, keepdim=keep)
        return x
    if kind == "l2":
        return torch.sqrt(torch.sum(x * x, dims, keep))
    return {"mean": torch.mean, "min": torch.amin, "max": torch.amax}[kind](x, dims, keep)


def gather_elements(data, indices, axis):
    """ONNX GatherElements: ``torch.gather`` with negative indices counted from the end of ``axis``."""
    idx = indices.long()
    return torch.gather(data, axis, torch.where(idx < 0, idx + data.shape[axis], idx))


def _source(mode: str, out: int, size: int, scale: np.float32) -> np.ndarray:
    """The input coordinate of each output position along one axis, in float32 as ONNX Runtime computes it."""
    x = np.arange(out, dtype=np.float32)
    half = np.float32(0.5)
    if mode == "asymmetric":
        return x / scale
    if mode == "half_pixel":
        return (x + half) / scale - half
    if mode == "pytorch_half_pixel":
        return (x + half) / scale - half if out > 1 else np.zeros(out, np.float32)
    if mode == "tf_half_pixel_for_nn":
        return (x + half) / scale
    # align_corners
    return x * np.float32(size - 1) / np.float32(out - 1) if out > 1 else np.zeros(out, np.float32)


_NEAREST = {"round_prefer_floor": lambda c: np.ceil(c - np.float32(0.5)),
            "round_prefer_ceil": lambda c: np.floor(c + np.float32(0.5)), "floor": np.floor, "ceil": np.ceil}


def resize(x, scales, sizes, attrs: dict):
    """ONNX Resize (opset 11 on), nearest or linear, axis by axis over the axes whose size changes; the modes
    ``REFUSALS`` names are refused before a run."""
    rank = x.dim()
    axes = [a % rank for a in attrs.get("axes", range(rank))]
    mode = attrs.get("mode", "nearest")
    coords = attrs.get("coordinate_transformation_mode", "half_pixel")
    nearest = _NEAREST[attrs.get("nearest_mode", "round_prefer_floor")]
    if sizes is not None and np.size(sizes):
        outs = [int(s) for s in np.reshape(sizes, -1)]
        factors = [np.float32(o) / np.float32(x.shape[a]) for o, a in zip(outs, axes)]
    else:
        factors = [np.float32(s) for s in np.reshape(scales, -1)]
        outs = [int(f * np.float32(x.shape[a])) for f, a in zip(factors, axes)]
    for axis, out, factor in zip(axes, outs, factors):
        size = x.shape[axis]
        if out == size and factor == 1:
            continue
        src = _source(coords, out, size, factor)
        if mode == "nearest":
            idx = np.clip(nearest(src), 0, size - 1).astype(np.int64)
            x = x.index_select(axis, torch.from_numpy(idx).to(x.device))
            continue
        src = np.clip(src, 0, size - 1)
        lo = np.minimum(src.astype(np.int64), size - 1)
        hi = np.minimum(lo + 1, size - 1)
        w = torch.from_numpy(src - lo.astype(np.float32)).to(x.device, x.dtype)
        w = w.reshape((-1,) + (1,) * (rank - axis - 1))
        a, b = (x.index_select(axis, torch.from_numpy(i).to(x.device)) for i in (lo, hi))
        x = a + (b - a) * w
    return x


def _refuse_resize(attrs: dict, opset: int) -> str | None:
    if opset < 11:
        return "Resize before opset 11 has no mapping here"
    checks = [("mode", "nearest", ("nearest", "linear")),
              ("coordinate_transformation_mode", "half_pixel",
               ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn")),
              ("nearest_mode", "round_prefer_floor", tuple(_NEAREST)), ("antialias", 0, (0,)),
              ("keep_aspect_ratio_policy", "stretch", ("stretch",))]
    for name, default, known in checks:
        if attrs.get(name, default) not in known:
            return f"Resize with {name}={attrs[name]!r} has no mapping here"
    return None


def _refuse_cast(attrs: dict, opset: int) -> str | None:
    to = attrs.get("to")
    return None if to in DTYPES else f"Cast to {TensorProto.DataType.Name(to) if to else to} has no mapping here"


HELPERS = {f.__name__: f for f in (shape_of, constant_of_shape, arange, expand, reduce, gather_elements, resize)}
HELPERS["DTYPES"] = DTYPES

# ------------------------------------------------------------------ the table
_X, _AB = (Input("X"),), (Input("A"), Input("B"))


def _reduce(op: str, kind: str) -> OpDef:
    # axes: an attribute before opset 18, the second input from 18 (lifted, as Squeeze's)
    return OpDef(op, (Input("data"),), (Attr("axes", "ints", None), Attr("keepdims", "int", 1),
                                        Attr("noop_with_empty_axes", "int", 0)),
                 lifted=(Lifted(1, "axes", 18),), torch=f"reduce({kind!r}, data, axes, keepdims, noop_with_empty_axes)")


OPAQUE: tuple[OpDef, ...] = (
    OpDef("Shape", (Input("data"),), (Attr("start", "int", 0), Attr("end", "int", None)),
          torch="shape_of(data, start, end)"),
    OpDef("Cast", (Input("input"),), (Attr("to", "int"),), torch="input.to(DTYPES[to])"),
    OpDef("ConstantOfShape", (), host=((0, "shape"),), torch="constant_of_shape(shape, attrs, device)"),
    OpDef("Range", (), host=((0, "start"), (1, "limit"), (2, "delta")), torch="arange(start, limit, delta, device)"),
    OpDef("Expand", (Input("input"),), host=((1, "shape"),), torch="expand(input, shape)"),
    OpDef("Equal", _AB, torch="torch.eq(a, b)"),
    OpDef("Less", _AB, torch="torch.lt(a, b)"),
    OpDef("Greater", _AB, torch="torch.gt(a, b)"),
    OpDef("LessOrEqual", _AB, torch="torch.le(a, b)"),
    OpDef("GreaterOrEqual", _AB, torch="torch.ge(a, b)"),
    OpDef("And", _AB, torch="torch.logical_and(a, b)"),
    OpDef("Where", (Input("condition"), Input("X"), Input("Y")), torch="torch.where(condition, x, y)"),
    OpDef("Mod", _AB, (Attr("fmod", "int", 0),), torch="torch.fmod(a, b) if fmod else torch.remainder(a, b)"),
    OpDef("Min", (Input("inputs", variadic=True),), torch="functools.reduce(torch.minimum, inputs)"),
    OpDef("Max", (Input("inputs", variadic=True),), torch="functools.reduce(torch.maximum, inputs)"),
    OpDef("Abs", _X, torch="torch.abs(x)"),
    OpDef("Log", _X, torch="torch.log(x)"),
    OpDef("Exp", _X, torch="torch.exp(x)"),
    OpDef("Floor", _X, torch="torch.floor(x)"),
    OpDef("Ceil", _X, torch="torch.ceil(x)"),
    OpDef("Reciprocal", _X, torch="torch.reciprocal(x)"),
    _reduce("ReduceMin", "min"),
    _reduce("ReduceMax", "max"),
    _reduce("ReduceProd", "prod"),
    OpDef("GatherElements", (Input("data"), Input("indices")), (Attr("axis", "int", 0),), indexes=(1, 0),
          torch="gather_elements(data, indices, axis)"),
    OpDef("InstanceNormalization", (Input("input"), Input("scale"), Input("B")), (Attr("epsilon", "float", 1e-5),),
          torch="F.instance_norm(input, weight=scale, bias=b, eps=epsilon)"),
    # roi (input 1) matters only to tf_crop_and_resize, which is refused
    OpDef("Resize", (Input("X"),), host=((1, "roi"), (2, "scales"), (3, "sizes")),
          torch="resize(x, scales, sizes, attrs)"),
)

REFUSALS = {"Resize": _refuse_resize, "Cast": _refuse_cast}
