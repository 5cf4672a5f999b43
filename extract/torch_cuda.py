"""ONNX nodes as PyTorch calls, and CUDA operator timing with them, for machines without onnxruntime-gpu.

Owns running a single ONNX node as PyTorch on any torch device (``node_call``), used for whole
graphs by :mod:`relsat.driver.boundary.torch_runtime`, and one node's timing with CUDA events (``time_op``,
used by :mod:`relsat.extract.profile`). The mapping itself is the catalog's: each operator's
``OpDef.torch`` is a Python expression, evaluated here over the node's inputs and attributes
(``_namespace``) and the helpers below for the operators whose ONNX spellings need code (auto_pad,
opset-dependent defaults, parameter inputs). The operators the catalog leaves opaque that real models
need (Shape, Cast, Range, Resize, reductions, ...) have entries of the same form, with their helpers, in
:mod:`relsat.extract.torch_opaque`. ``MAPPED`` holds both by (domain, op_type), so a com.microsoft op and
a default-domain op of the same name are never confused. The inputs that hold parameters
(``OpDef.host_inputs``: lifted inputs such as Reshape's shape, Pad's axes, Resize's sizes) are read on
the host as numpy arrays (``host_inputs``). tests/test_torch_ops.py runs
every catalog operator's example through this mapping and compares it with ONNX Runtime,
tests/test_torch_opaque.py every opaque operator's cases. Imported lazily; importing it needs torch,
which is not a relsat dependency. A node without a mapping, or with attributes its mapping does not
implement (``refusal``), raises ``NotImplementedError``, which the profiler records as the sample's
failure reason and the runtime reports naming the node.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from onnx import helper

from relsat.relations.catalog import BY_ONNX, REQUIRED, OpDef

from . import torch_opaque


def available() -> bool:
    return torch.cuda.is_available()


# ------------------------------------------------------------------ helpers the catalog's expressions call
def _pads(a: dict, x, kernel, strides, dilations) -> tuple[list[int], list[int]]:
    """ONNX ``pads``/``auto_pad`` as (begins, ends) per spatial axis."""
    n = len(kernel)
    auto = a.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        sizes = x.shape[2:]
        total = [max(0, (math.ceil(s / st) - 1) * st + (k - 1) * d + 1 - s)
                 for s, k, st, d in zip(sizes, kernel, strides, dilations)]
        small = [t // 2 for t in total]
        big = [t - h for t, h in zip(total, small)]
        return (small, big) if auto == "SAME_UPPER" else (big, small)
    if auto == "VALID":
        return [0] * n, [0] * n
    pads = a.get("pads") or [0] * 2 * n
    return list(pads[:n]), list(pads[n:])


def _padded(x, begins, ends, value=0.0):
    """``x`` and the symmetric padding left for torch after explicit padding of the rest."""
    if begins == ends:
        return x, begins
    flat = [p for b, e in zip(reversed(begins), reversed(ends)) for p in (b, e)]
    return F.pad(x, flat, value=value), [0] * len(begins)


def conv(x, w, b, a: dict):
    """ONNX Conv (``a``: the node's attributes, auto_pad and asymmetric pads included)."""
    n = w.dim() - 2
    strides, dilations = a.get("strides") or [1] * n, a.get("dilations") or [1] * n
    begins, ends = _pads(a, x, w.shape[2:], strides, dilations)
    xp, pad = _padded(x, begins, ends)
    return getattr(F, f"conv{n}d")(xp, w, b, stride=strides, padding=pad, dilation=dilations, groups=a.get("group", 1))


def conv_transpose(x, w, b, a: dict):
    """ONNX ConvTranspose with explicit pads: the full transposed convolution, ``output_padding`` zeros at
    the end of each spatial axis, then ``pads`` cropped (as ONNX defines the output), then the bias."""
    n = w.dim() - 2
    strides, dilations = a.get("strides") or [1] * n, a.get("dilations") or [1] * n
    pads, extra = a.get("pads") or [0] * 2 * n, a.get("output_padding") or [0] * n
    if list(pads[:n]) == list(pads[n:]) and all(e < max(s, d) for e, s, d in zip(extra, strides, dilations)):
        # symmetric pads: torch's padding and output_padding mean ONNX's, and the bias goes into the same call
        # (a separate crop and bias add are two more kernels, which made a BatchNormalization folded into a
        # ConvTranspose no cheaper than the two nodes under this runtime)
        return getattr(F, f"conv_transpose{n}d")(x, w, b, stride=strides, padding=list(pads[:n]),
                                                 output_padding=list(extra), groups=a.get("group", 1),
                                                 dilation=dilations)
    y = getattr(F, f"conv_transpose{n}d")(x, w, None, stride=strides, groups=a.get("group", 1), dilation=dilations)
    if any(extra):
        y = F.pad(y, [p for e in reversed(extra) for p in (0, e)])
    y = y[(slice(None), slice(None)) + tuple(slice(pads[i], y.shape[i + 2] - pads[i + n]) for i in range(n))]
    return y if b is None else y + b.reshape((1, -1) + (1,) * n)


def _window(x, a: dict):
    kernel = a["kernel_shape"]
    n = len(kernel)
    strides, dilations = a.get("strides") or [1] * n, a.get("dilations") or [1] * n
    return (kernel, strides, dilations) + _pads(a, x, kernel, strides, dilations)


def _short(xp, kernel, strides, dilations, pad) -> list[int]:
    """Per spatial axis, the cells to add at its end so that one window fits where ONNX Runtime still
    makes one output (its output size is ``(span / stride) + 1`` in C++ integer division, truncated toward
    zero, so a span of ``-stride + 1 .. -1`` gives 1 where torch raises), 0 elsewhere. PP-OCRv4 rec at height
    32 pools [3, 2] over height 2: ONNX Runtime averages the two rows it has."""
    out = []
    for n, p, d, k, s in zip(xp.shape[2:], pad, dilations, kernel, strides):
        span = n + 2 * p - d * (k - 1) - 1
        out.append(-span if -s < span < 0 else 0)
    return out


def _end_padded(x, extra: list[int], value: float):
    return F.pad(x, [q for e in reversed(extra) for q in (0, e)], value=value)


def max_pool(x, a: dict):
    kernel, strides, dilations, begins, ends = _window(x, a)
    xp, pad = _padded(x, begins, ends, -math.inf)
    extra = _short(xp, kernel, strides, dilations, pad)
    xp = _end_padded(xp, extra, -math.inf) if any(extra) else xp
    return getattr(F, f"max_pool{len(kernel)}d")(xp, kernel, strides, pad, dilations,
                                                  ceil_mode=bool(a.get("ceil_mode", 0)))


def avg_pool(x, a: dict):
    kernel, strides, dilations, begins, ends = _window(x, a)
    xp, pad = _padded(x, begins, ends)
    pool = getattr(F, f"avg_pool{len(kernel)}d")
    ceil, include = bool(a.get("ceil_mode", 0)), bool(a.get("count_include_pad", 0))
    extra = _short(xp, kernel, strides, dilations, pad)
    if not any(extra):
        return pool(xp, kernel, strides, pad, ceil_mode=ceil, count_include_pad=include)
    if include or any(pad):
        raise NotImplementedError("AveragePool with a window longer than its padded input and count_include_pad "
                                  "or symmetric pads")
    # ONNX Runtime averages the cells the window covers: the sum over the zero-padded input by their count
    total = pool(_end_padded(xp, extra, 0.0), kernel, strides, 0, ceil_mode=ceil)
    count = pool(_end_padded(torch.ones_like(xp[:1, :1]), extra, 0.0), kernel, strides, 0, ceil_mode=ceil)
    return total / count


def gemm(x, y, c, alpha, beta, trans_a, trans_b):
    x, y = (x.T if trans_a else x), (y.T if trans_b else y)
    if c is not None:
        return torch.addmm(c, x, y, beta=beta, alpha=alpha)
    return torch.mm(x, y) if alpha == 1.0 else alpha * torch.mm(x, y)


def matmul_t(x, y, alpha, trans_a, trans_b):
    """alpha * op(A) @ op(B), op transposing the last two dims (a matmul with transA/transB)."""
    x = x.transpose(-1, -2) if trans_a else x
    y = y.transpose(-1, -2) if trans_b else y
    return torch.matmul(x, y) if alpha == 1.0 else alpha * torch.matmul(x, y)


def div(x, y):
    return torch.div(x, y, rounding_mode=None if x.is_floating_point() else "trunc")


def clip(x, lo, hi):
    lo, hi = (None if lo == -math.inf else lo), (None if hi == math.inf else hi)
    return x if lo is None and hi is None else torch.clamp(x, lo, hi)


def softmax(x, a: dict, opset: int):
    """Softmax; before opset 13 over the input flattened at ``axis`` (default 1) into a matrix."""
    if opset >= 13:
        return torch.softmax(x, a.get("axis", -1))
    axis = a.get("axis", 1) % max(x.dim(), 1)
    return torch.softmax(x.reshape(math.prod(x.shape[:axis]), -1), 1).reshape(x.shape)


def reshape(x, shape, a: dict):
    dims = [int(s) for s in shape]
    if not a.get("allowzero", 0):
        dims = [x.shape[i] if s == 0 else s for i, s in enumerate(dims)]
    return x.reshape(dims)


def chunks(x, split, axis, a: dict, outputs: int):
    """Split: the sizes given, else equal parts (opset 18: ``num_outputs`` parts, the last smaller)."""
    sizes = split if split is not None else math.ceil(x.shape[axis] / a.get("num_outputs", outputs))
    return [t.contiguous() for t in torch.split(x, sizes, axis)]


def sliced(x, starts, ends, axes, steps):
    """ONNX Slice, whose clamping is Python's; a negative step (which torch indexing lacks) as an index_select."""
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    index, backwards = [slice(None)] * x.dim(), []
    for ax, s, e, st in zip(axes, starts, ends, steps):
        if st > 0:
            index[ax] = slice(int(s), int(e), int(st))
        else:
            backwards.append((ax, slice(int(s), int(e), int(st))))
    x = x[tuple(index)]
    for ax, sl in backwards:
        x = x.index_select(ax, torch.arange(*sl.indices(x.shape[ax]), device=x.device))
    return x.contiguous()


def squeeze(x, axes):
    axes = sorted(i % x.dim() for i in axes) if axes else [i for i, d in enumerate(x.shape) if d == 1]
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


def unsqueeze(x, axes):
    rank = x.dim() + len(axes)
    for i in sorted(i % rank for i in axes):
        x = x.unsqueeze(i)
    return x


def gather(x, indices, axis):
    """ONNX Gather: the indices (any shape, negative counting from the end) taken along ``axis``."""
    axis %= x.dim()
    idx = (indices if isinstance(indices, torch.Tensor) else torch.as_tensor(np.asarray(indices))).to(x.device).long()
    flat = torch.where(idx < 0, idx + x.shape[axis], idx).reshape(-1)
    return x.index_select(axis, flat).reshape(tuple(x.shape[:axis]) + tuple(idx.shape) + tuple(x.shape[axis + 1:]))


def pad(x, pads, value, mode, axes):
    """Constant Pad; ``axes`` (opset 18) the axes that ``pads`` refer to (all when None)."""
    if mode != "constant":
        raise NotImplementedError(f"Pad mode {mode!r} has no mapping here")
    rank = x.dim()
    axes = [int(a) % rank for a in axes] if axes is not None else list(range(rank))
    full = [0] * (2 * rank)
    for j, ax in enumerate(axes):
        full[ax], full[ax + rank] = int(pads[j]), int(pads[j + len(axes)])
    flat = [p for i in reversed(range(rank)) for p in (full[i], full[i + rank])]
    return F.pad(x, flat, value=value)


# the names an expression sees besides the node's own (tests/test_torch_ops.py checks that no catalog input or
# attribute name hides one)
HELPERS: dict[str, object] = {
    "torch": torch, "F": F, "math": math, "functools": functools, **{f.__name__: f for f in (
        conv, conv_transpose, max_pool, avg_pool, gemm, matmul_t, div, clip, softmax, reshape, chunks, sliced, squeeze,
        unsqueeze, gather, pad)}, **torch_opaque.HELPERS}
NODE_NAMES = ("attrs", "opset", "outputs", "device")  # bound per node, beside its inputs and attributes

# ------------------------------------------------------------------ the mapping: the catalog's and the opaque ones'
MAPPED: dict[tuple[str, str], OpDef] = {key: op for key, op in BY_ONNX.items() if op.torch} | {
    (op.domain, op.op_type): op for op in torch_opaque.OPAQUE}


@functools.cache
def _code(expr: str):
    return compile(expr, f"<torch: {expr}>", "eval")


def op_def(node) -> OpDef | None:
    """The entry ``node`` runs by: the catalog's or ``torch_opaque``'s (None: no mapping)."""
    return MAPPED.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type))


def mapped(node) -> bool:
    """Whether ``node`` has a PyTorch mapping (its domain and op_type a catalog or ``torch_opaque`` operator's)."""
    return op_def(node) is not None


def refusal(node, opset: int) -> str | None:
    """Why ``node`` cannot run here (no mapping; attributes its mapping does not implement), or None.
    ``opset``: the default domain's."""
    if not mapped(node):
        return "no mapping for this operator"
    check = torch_opaque.REFUSALS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    return check({a.name: _attr(a) for a in node.attribute}, opset) if check else None


def host_inputs(node) -> set[int]:
    """The positions of ``node``'s inputs read on the host (numpy arrays): shapes, sizes, axes, pads, bounds."""
    op = op_def(node)
    return set(op.host_inputs) if op is not None else set()


def _attr(a):
    v = helper.get_attribute_value(a)
    return v.decode() if isinstance(v, bytes) else v


def _parameter(value, kind: str):
    """A parameter input's host value as its attribute holds it: a list for ``ints``, a scalar for a 0-d
    value or a one-element float, else the array (Gather's index tensor)."""
    arr = np.asarray(value)
    if kind == "ints":
        return [int(v) for v in arr.reshape(-1)]
    if arr.ndim == 0 or (kind == "float" and arr.size == 1):
        return arr.reshape(-1)[0].item()
    return arr


def _namespace(op: OpDef, node, args: list, opset: int, device) -> dict:
    """The names ``op.torch`` is evaluated over for ``node`` (see ``OpDef.torch``; ``device``: where an
    operator without data inputs, Range or ConstantOfShape, puts its output)."""
    attrs = {a.name: _attr(a) for a in node.attribute}
    ns = dict(HELPERS, attrs=attrs, opset=opset, outputs=len(node.output), device=device)
    ns.update((a.name, attrs.get(a.name, None if a.default is REQUIRED else a.default)) for a in op.attrs)
    ns.update((name, None) for _, name in op.host)
    lifted, extra = {lf.input_index: lf for lf in op.lifted}, dict(op.host)
    data = []
    for i, v in enumerate(args):
        lf = lifted.get(i)
        if lf is None and i not in extra:
            data.append(v)
        elif v is None:
            continue
        elif lf is None:
            ns[extra[i]] = v
        elif not lf.host:
            ns[lf.attr] = v  # a tensor on the device (Gather's indices)
        elif np.size(v) or op.attr(lf.attr).kind == "ints":  # an empty Pad value: the default
            ns[lf.attr] = _parameter(v, op.attr(lf.attr).kind)
    if op.variadic:
        ns[op.inputs[0].column] = data
    elif len(data) > len(op.inputs):
        raise NotImplementedError(f"{node.op_type} with {len(data)} data inputs has no PyTorch mapping")
    else:
        ns.update((inp.column, data[k] if k < len(data) else None) for k, inp in enumerate(op.inputs))
    return ns


def node_call(node, args: list, opset: int, device) -> Callable[[], object]:
    """A closure computing ``node`` from ``args`` (torch tensors on ``device``; numpy arrays for the
    inputs in ``host_inputs``; None for an omitted input): a tensor, or a list for Split.
    ``opset``: the default domain's opset (Softmax before 13)."""
    op = op_def(node)
    if op is None:
        raise NotImplementedError(f"no PyTorch mapping for {node.domain or 'ai.onnx'}::{node.op_type}")
    args = list(args)
    while args and args[-1] is None:
        args.pop()
    code, ns = _code(op.torch), _namespace(op, node, args, opset, device)
    return lambda: eval(code, ns)


def build(sample, values: dict[str, np.ndarray], device: str = "cuda") -> Callable[[], object]:
    """A closure running the PyTorch equivalent of ``sample.node`` on ``device``.

    ``values`` holds every named input, runtime and constant. Parameter inputs (``host_inputs``) stay
    on the host as numpy arrays; data inputs are copied to the device once, here.
    """
    node = sample.node
    why = refusal(node, sample.opset)
    if why:
        raise NotImplementedError(f"{node.domain or 'ai.onnx'}::{node.op_type}: {why}")
    host = host_inputs(node)
    args = [None if not name else values[name] if i in host
            else torch.tensor(values[name], device=device)
            for i, name in enumerate(node.input)]
    return node_call(node, args, sample.opset, device)


def time_op(sample, values: dict[str, np.ndarray], warmup: int, repeats: int, budget_s: float | None = None,
            min_repeats: int = 3) -> tuple[float, int]:
    """(median ms, runs timed) of :func:`build`'s closure on CUDA, timed with CUDA events. With ``budget_s``, a
    slow operator gets fewer runs: timing stops once the budget is spent and ``min_repeats`` runs were timed (a
    median of few runs is what makes one-node costs of a few microseconds noisy, so fast operators get them all)."""
    fn = build(sample, values)
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        times = []
        begin = time.perf_counter()
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            if budget_s is not None and len(times) >= min_repeats and time.perf_counter() - begin > budget_s:
                break
    return float(np.median(times)), len(times)
