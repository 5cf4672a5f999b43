"""ONNX nodes as PyTorch calls, and CUDA operator timing with them, for machines without onnxruntime-gpu.

Owns the mapping from a single ONNX node to an equivalent PyTorch call on any torch device
(``node_call``: every operator of relsat's catalog), used for whole graphs by
:mod:`relsat.driver.torch_runtime`, and one node's timing with CUDA events (``time_op``, used by
:mod:`relsat.extract.profile`). Imported lazily; importing it needs torch, which is not a relsat
dependency. An operator without a mapping raises ``NotImplementedError``, which the profiler
records as the sample's failure reason and the runtime reports naming the node.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from onnx import helper

from relsat.relations.catalog import BY_TYPE, OPS


def available() -> bool:
    return torch.cuda.is_available()


def _pads(a: dict, x, kernel, strides, dilations) -> tuple[list[int], list[int]]:
    """ONNX ``pads``/``auto_pad`` as (begins, ends) per spatial axis."""
    n = len(kernel)
    auto = a.get("auto_pad", b"NOTSET").decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        sizes = x.shape[2:]
        total = [max(0, (math.ceil(s / st) - 1) * st + (k - 1) * d + 1 - s)
                 for s, k, st, d in zip(sizes, kernel, strides, dilations)]
        small = [t // 2 for t in total]
        big = [t - h for t, h in zip(total, small)]
        return (small, big) if auto == "SAME_UPPER" else (big, small)
    if auto == "VALID":
        return [0] * n, [0] * n
    pads = a.get("pads", [0] * 2 * n)
    return list(pads[:n]), list(pads[n:])


def _padded(x, begins, ends, value=0.0):
    """``x`` and the symmetric padding left for torch after explicit padding of the rest."""
    if begins == ends:
        return x, begins
    flat = [p for b, e in zip(reversed(begins), reversed(ends)) for p in (b, e)]
    return F.pad(x, flat, value=value), [0] * len(begins)


def _conv(v, a):
    x, w, b = (v + [None])[:3]
    n = w.dim() - 2
    strides, dilations = a.get("strides", [1] * n), a.get("dilations", [1] * n)
    begins, ends = _pads(a, x, w.shape[2:], strides, dilations)
    conv = getattr(F, f"conv{n}d")
    group = a.get("group", 1)

    def run():
        xp, pad = _padded(x, begins, ends)
        return conv(xp, w, b, stride=strides, padding=pad, dilation=dilations, groups=group)
    return run


def _pool(kind):
    def make(v, a):
        x = v[0]
        kernel = a["kernel_shape"]
        n = len(kernel)
        strides, dilations = a.get("strides", [1] * n), a.get("dilations", [1] * n)
        begins, ends = _pads(a, x, kernel, strides, dilations)
        ceil = bool(a.get("ceil_mode", 0))
        if kind == "max":
            pool = getattr(F, f"max_pool{n}d")

            def run():
                xp, pad = _padded(x, begins, ends, -math.inf)
                return pool(xp, kernel, strides, pad, dilations, ceil_mode=ceil)
            return run
        pool, include = getattr(F, f"avg_pool{n}d"), bool(a.get("count_include_pad", 0))

        def run():
            xp, pad = _padded(x, begins, ends)
            return pool(xp, kernel, strides, pad, ceil_mode=ceil, count_include_pad=include)
        return run
    return make


def _gemm(v, a):
    x, y, c = (v + [None])[:3]
    x, y = (x.T if a.get("transA", 0) else x), (y.T if a.get("transB", 0) else y)
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    if c is not None:
        return lambda: torch.addmm(c, x, y, beta=beta, alpha=alpha)
    return (lambda: torch.mm(x, y)) if alpha == 1.0 else (lambda: alpha * torch.mm(x, y))


def _reshape(v, a):
    x, shape = v
    dims = [int(s) for s in shape.tolist()]
    if not a.get("allowzero", 0):
        dims = [x.shape[i] if s == 0 else s for i, s in enumerate(dims)]
    return lambda: x.reshape(dims)


def _split(v, a):
    x, sizes = (v + [None])[:2]
    axis = a.get("axis", 0)
    if sizes is not None:
        sizes = sizes.tolist()
    else:
        sizes = a.get("split") or math.ceil(x.shape[axis] / a["num_outputs"])
    return lambda: [t.contiguous() for t in torch.split(x, sizes, axis)]


def _slice(v, a):
    x, starts, ends, axes, steps = (v + [None] * 3)[:5]
    axes = axes.tolist() if axes is not None else list(range(len(starts)))
    steps = steps.tolist() if steps is not None else [1] * len(starts)
    if any(s < 0 for s in steps):
        raise NotImplementedError("Slice with negative steps has no PyTorch equivalent")
    index = [slice(None)] * x.dim()
    for ax, s, e, st in zip(axes, starts.tolist(), ends.tolist(), steps):
        index[ax] = slice(int(s), int(e), int(st))
    return lambda: x[tuple(index)].contiguous()


def _clip(v, a):
    x, lo, hi = (v + [None, None])[:3]
    lo = lo.item() if lo is not None else a.get("min")
    hi = hi.item() if hi is not None else a.get("max")
    return lambda: torch.clamp(x, lo, hi)


def _layer_norm(v, a):
    x, scale, bias = (v + [None])[:3]
    shape = x.shape[a.get("axis", -1) % x.dim():]
    eps = a.get("epsilon", 1e-5)
    return lambda: F.layer_norm(x, shape, scale, bias, eps)


def _pad(v, a):
    x, pads, value = (v + [None, None])[:3]
    pads = [int(p) for p in (pads.tolist() if pads is not None else a["pads"])]
    fill = float(value.item()) if value is not None and value.size else a.get("value", 0.0)
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode != "constant":
        raise NotImplementedError(f"Pad mode {mode!r} has no mapping here")
    n = len(pads) // 2
    flat = [p for i in reversed(range(n)) for p in (pads[i], pads[i + n])]
    return lambda: F.pad(x, flat, value=fill)


def _axes(v, a):
    """Squeeze/Unsqueeze axes: the input (opset 13 on) or the attribute."""
    return [int(i) for i in (v[1].tolist() if len(v) > 1 and v[1] is not None else a.get("axes", []))]


def _squeeze(v, a):
    x, axes = v[0], _axes(v, a)
    axes = sorted(i % x.dim() for i in axes) if axes else [i for i, d in enumerate(x.shape) if d == 1]
    return lambda: x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


def _unsqueeze(v, a):
    x, axes = v[0], _axes(v, a)
    rank = x.dim() + len(axes)
    axes = sorted(i % rank for i in axes)

    def run():
        y = x
        for i in axes:
            y = y.unsqueeze(i)
        return y
    return run


def _flatten(v, a):
    x = v[0]
    axis = a.get("axis", 1) % (x.dim() + 1)
    return lambda: x.reshape(int(math.prod(x.shape[:axis])), -1)


def _matmul_t(v, a):
    """alpha * op(A) @ op(B), op transposing the last two dims (a catalog matmul with transA/transB)."""
    x, y = v
    x = x.transpose(-1, -2) if a.get("transA", 0) else x
    y = y.transpose(-1, -2) if a.get("transB", 0) else y
    alpha = a.get("alpha", 1.0)
    return (lambda: torch.matmul(x, y)) if alpha == 1.0 else (lambda: alpha * torch.matmul(x, y))


def _gather(v, a):
    """ONNX Gather: the indices (any shape, negative counting from the end) taken along ``axis``."""
    x, idx = v
    axis = a.get("axis", 0) % x.dim()
    idx = torch.as_tensor(idx, device=x.device).long()
    flat = torch.where(idx < 0, idx + x.shape[axis], idx).reshape(-1)
    shape = tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1:])
    return lambda: x.index_select(axis, flat).reshape(shape)


def _gelu(v, a):
    approx = a.get("approximate", b"none")
    approx = approx.decode() if isinstance(approx, bytes) else approx
    return lambda: F.gelu(v[0], approximate=approx)


def _div(x, y):
    return torch.div(x, y, rounding_mode=None if x.is_floating_point() else "trunc")


def _elementwise(f, v, a):
    return lambda: f(*v)


_OPS: dict[str, Callable] = {
    **{op: partial(_elementwise, f) for op, f in [
        ("Relu", torch.relu), ("Sigmoid", torch.sigmoid), ("Tanh", torch.tanh),
        ("Erf", torch.erf), ("Sqrt", torch.sqrt), ("Add", torch.add), ("Sub", torch.sub), ("Mul", torch.mul),
        ("Div", _div), ("MatMul", torch.matmul), ("Identity", lambda x: x)]},
    "Gelu": _gelu,
    "Gather": _gather,
    "Flatten": _flatten,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Pad": _pad,
    "Conv": _conv,
    "Gemm": _gemm,
    "LeakyRelu": lambda v, a: lambda: F.leaky_relu(v[0], a.get("alpha", 0.01)),
    "HardSigmoid": lambda v, a: lambda: torch.clamp(v[0] * a.get("alpha", 0.2) + a.get("beta", 0.5), 0.0, 1.0),
    "HardSwish": lambda v, a: lambda: F.hardswish(v[0]),
    "Softmax": lambda v, a: lambda: torch.softmax(v[0], a.get("axis", -1)),
    "Concat": lambda v, a: lambda: torch.cat(v, a["axis"]),
    "MaxPool": _pool("max"),
    "AveragePool": _pool("avg"),
    "GlobalAveragePool": lambda v, a: lambda: v[0].mean(tuple(range(2, v[0].dim())), True),
    "BatchNormalization": lambda v, a: lambda: F.batch_norm(
        v[0], v[3], v[4], v[1], v[2], False, 0.0, a.get("epsilon", 1e-5)),
    "Transpose": lambda v, a: lambda: v[0].permute(
        a.get("perm", list(range(v[0].dim()))[::-1])).contiguous(),
    "Reshape": _reshape,
    "Split": _split,
    "Slice": _slice,
    "Clip": _clip,
    "LayerNormalization": _layer_norm,
}
# the catalog's contrib matmuls (alpha, transA, transB), whatever their name
_OPS.update({op.op_type: _matmul_t for op in OPS if op.draw == "matmul" and op.domain
             and {a.name for a in op.attrs} == {"alpha", "transA", "transB"}})
# inputs read on the host (numpy): shapes, sizes, axes, pads, bounds
SHAPE_ARGS = {"Reshape": {1}, "Split": {1}, "Slice": {1, 2, 3, 4}, "Clip": {1, 2}, "Squeeze": {1}, "Unsqueeze": {1},
              "Pad": {1, 2}}
def mapped(node) -> bool:
    """Whether ``node`` has a PyTorch mapping (in its operator's domain)."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    return node.op_type in _OPS and domain == (BY_TYPE[node.op_type].domain if node.op_type in BY_TYPE else "")


def node_call(node, args: list, opset: int) -> Callable[[], object]:
    """A closure computing ``node`` from ``args`` (torch tensors on one device; numpy arrays for the
    inputs in ``SHAPE_ARGS``; None for an omitted input): a tensor, or a list for Split.
    ``opset``: the default domain's opset (Softmax's axis before 13)."""
    if not mapped(node):
        raise NotImplementedError(f"no PyTorch mapping for {node.domain or 'ai.onnx'}::{node.op_type}")
    args = list(args)
    while args and args[-1] is None:
        args.pop()
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs.setdefault("num_outputs", len(node.output))  # Split without sizes, as in opset 18
    if node.op_type == "Softmax" and opset < 13:
        attrs.setdefault("axis", 1)
    return _OPS[node.op_type](args, attrs)


def build(sample, values: dict[str, np.ndarray], device: str = "cuda") -> Callable[[], object]:
    """A closure running the PyTorch equivalent of ``sample.node`` on ``device``.

    ``values`` holds every named input, runtime and constant. Shape-like inputs stay on the
    host as numpy arrays; data inputs are copied to the device once, here.
    """
    node = sample.node
    if not mapped(node):
        raise NotImplementedError(f"no PyTorch mapping for {node.domain or 'ai.onnx'}::{node.op_type}")
    host = SHAPE_ARGS.get(node.op_type, set())
    args = [None if not name else values[name] if i in host
            else torch.tensor(values[name], device=device)
            for i, name in enumerate(node.input)]
    return node_call(node, args, sample.opset)


def time_op(sample, values: dict[str, np.ndarray], warmup: int, repeats: int) -> float:
    """Median ms of :func:`build`'s closure on CUDA, timed with CUDA events."""
    fn = build(sample, values)
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    return float(np.median(times))
