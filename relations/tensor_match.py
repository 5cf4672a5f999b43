"""Matching tensor expressions back to ONNX operators: the way back of relations/tensor_lower.py.

``match(program, output, consts)`` gives ONNX nodes (and the initializers they need) computing the
program's result into the tensor ``output`` from its inputs. A candidate operator is read off the
expression's structure (which iterators index which axes, with which strides, dilations, offsets and
divisions) and accepted only when *its own lowering equals the expression*: a match is a proof by
construction, never a guess. Whole-program forms are tried first (Conv or ConvTranspose with its
bias, Gemm, Softmax); otherwise each step becomes one operator -- Transpose, Reshape, MatMul, Conv,
ConvTranspose, ReduceSum/ReduceMax, element-wise ops (one node per function, constants as scalar
initializers), and Einsum for any other sum of products of plainly indexed tensors. A step nothing
matches raises ``NoMatch`` naming it.
"""

from __future__ import annotations

import itertools
import math
import string

import numpy as np
from onnx import helper, numpy_helper

from .tensor_derive import canonical
from .tensor_expr import (Access, Call, Const, Expr, Index, Program, accesses, evaluate_expr, gather_map,
                          rename_tensors)
from .tensor_lower import NotLowerable, lower


class NoMatch(ValueError):
    """No ONNX operator (composition) here computes the expression."""


class _Out:
    """The nodes and initializers being emitted, with fresh tensor names under one prefix."""

    def __init__(self, prefix: str):
        self.prefix, self.nodes, self.inits, self._n = prefix, [], [], itertools.count()

    def fresh(self, what: str) -> str:
        return f"{self.prefix}.{what}{next(self._n)}"

    def const(self, value, dtype=np.float32) -> str:
        name = self.fresh("c")
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def node(self, op: str, inputs, output: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, list(inputs), [output], name=self.fresh(op), **attrs))
        return output


def _equal(op: str, attrs: dict, inputs, consts: dict, program: Program) -> bool:
    """Whether the operator's own lowering is the program (up to iterator names and commutation)."""
    try:
        return canonical(lower(op, attrs, inputs, consts)).steps == canonical(program).steps
    except (NotLowerable, KeyError, ValueError, TypeError, IndexError):
        return False


def _shapes(program: Program) -> dict:
    shapes = dict(program.inputs)
    for name, e in program.steps:
        shapes[name] = e.shape
    return shapes


# -- candidates read off one expression ----------------------------------------------------------------


def _coef(ix: Index, name: str) -> int:
    return sum(t[1] for t in ix.terms if t[0] == name and len(t) == 2)


def _conv_candidate(e: Expr, shapes) -> tuple | None:
    """Conv or ConvTranspose from ``Σ x[n, ch, ., .] · w[...]`` (see tensor_lower._conv/_conv_transpose)."""
    if len(e.scope) != 4 or len(e.sums) != 3 or not (isinstance(e.body, Call) and e.body.op == "Mul"):
        return None
    x, w = e.body.args if len(e.body.args) == 2 else (None, None)
    if not (isinstance(x, Access) and isinstance(w, Access)) or len(x.index) != 4:
        return None
    (n, c, h, wd), (kh, kw) = shapes[x.tensor], (e.sums[1].extent, e.sums[2].extent)
    oh, ow = e.shape[2], e.shape[3]
    m = e.shape[1]
    mg = next((t[2] for t in x.index[1].terms if len(t) == 3), m)
    group = m // mg
    ih, iw = x.index[2], x.index[3]
    if ih.div == 1:  # Conv: o·stride + s·dilation - pad
        sh, sw, dh, dw = _coef(ih, "o2"), _coef(iw, "o3"), _coef(ih, "s1"), _coef(iw, "s2")
        pt, pl = -ih.const, -iw.const
        pb = (oh - 1) * sh + dh * (kh - 1) + 1 - h - pt
        pr = (ow - 1) * sw + dw * (kw - 1) + 1 - wd - pl
        pb, pr = max(pb, 0), max(pr, 0)  # a larger end pad that the floor drops is not needed
        return "Conv", {"kernel_shape": [kh, kw], "strides": [sh, sw], "dilations": [dh, dw],
                        "pads": [pt, pl, pb, pr], "group": group}
    sh, sw, dh, dw = ih.div, iw.div, -_coef(ih, "s1"), -_coef(iw, "s2")  # ConvTranspose: (o + pad - s·dil) / stride
    pt, pl = ih.const, iw.const
    attrs = {"kernel_shape": [kh, kw], "strides": [sh, sw], "dilations": [dh, dw], "group": group}
    pads, outpad = [pt, pl, 0, 0], [0, 0]
    for k, (o, i, s, d, k_, p) in enumerate([(oh, h, sh, dh, kh, pt), (ow, wd, sw, dw, kw, pl)]):
        end = s * (i - 1) + d * (k_ - 1) + 1 - p - o
        pads[2 + k], outpad[k] = (end, 0) if end >= 0 else (0, -end)
    attrs["pads"] = pads
    if any(outpad):
        attrs["output_padding"] = outpad
    return "ConvTranspose", attrs


def _plain_product(e: Expr):
    """The accesses of a sum of products of plainly indexed tensors (Einsum's form), else None."""
    factors = [e.body] if isinstance(e.body, Access) else (
        list(e.body.args) if isinstance(e.body, Call) and e.body.op == "Mul" else [])
    if not factors or not all(isinstance(f, Access) and all(ix.plain() for ix in f.index) for f in factors):
        return None
    return factors


def _einsum_equation(e: Expr, factors) -> str:
    letters = iter(string.ascii_letters)
    names = {i.name: next(letters) for i in (*e.scope, *e.sums)}
    lhs = ",".join("".join(names[ix.plain()] for ix in f.index) for f in factors)
    return f"{lhs}->{''.join(names[i.name] for i in e.scope)}"


def _step(e: Expr, output: str, shapes, out: _Out) -> None:
    """One expression as one operator (or a chain of element-wise ones) writing ``output``."""
    single = Program(tuple((n, shapes[n]) for n in _tensors(e)), (("y", e),))
    ins = [n for n, _ in single.inputs]

    def fits(op, attrs, inputs=None, consts=None):
        inputs = inputs if inputs is not None else single.inputs
        return _equal(op, attrs, list(inputs), consts or {}, single)

    if not e.sums and isinstance(e.body, Access) and all(ix.plain() for ix in e.body.index):
        index = [ix.plain() for ix in e.body.index]
        perm = [index.index(i.name) for i in e.scope]
        if fits("Transpose", {"perm": perm}):
            out.node("Transpose", ins, output, perm=perm)
            return
    if not e.sums and isinstance(e.body, Access):
        target = np.array(e.shape, np.int64)
        src = shapes[ins[0]]
        if math.prod(src) == math.prod(e.shape) and np.array_equal(
                gather_map(e, src), gather_map(lower("Reshape", {}, [(ins[0], src), ("shape", (len(e.shape),))],
                                                     {"shape": target}).result, src)):
            out.node("Reshape", [ins[0], out.const(target, np.int64)], output)
            return
        for op, attrs in _space_depth(src, e.shape):  # a gather that is DepthToSpace / SpaceToDepth, by its map
            if np.array_equal(gather_map(e, src), gather_map(lower(op, attrs, [(ins[0], src)]).result, src)):
                out.node(op, ins, output, **attrs)
                return
        if _window_gather(e, output, shapes, out):
            return
    for pair in (ins, ins[::-1]) if len(e.sums) == 1 and len(ins) == 2 else ():
        if fits("MatMul", {}, [(n, shapes[n]) for n in pair]):
            out.node("MatMul", pair, output)
            return
    for ta, tb in itertools.product((0, 1), repeat=2) if len(e.sums) == 1 and len(ins) == 2 else ():
        if fits("Gemm", {"transA": ta, "transB": tb}):  # a product of transposed matrices
            out.node("Gemm", ins, output, transA=ta, transB=tb)
            return
    conv = _conv_candidate(e, shapes)
    if conv and fits(*conv):
        out.node(conv[0], ins, output, **conv[1])
        return
    if e.sums and isinstance(e.body, Access):
        axes = [k for k, ix in enumerate(e.body.index) if ix.plain() in {s.name for s in e.sums}]
        op = "ReduceMax" if e.combine == "max" else "ReduceSum"
        for keep in (1, 0):
            if op == "ReduceMax" and fits(op, {"axes": axes, "keepdims": keep}):
                out.node(op, ins, output, axes=axes, keepdims=keep)
                return
            a = np.array(axes, np.int64)
            if op == "ReduceSum" and fits(op, {"keepdims": keep}, [*single.inputs, ("axes", (len(axes),))], {"axes": a}):
                out.node(op, [ins[0], out.const(a, np.int64)], output, keepdims=keep)
                return
    if not e.sums and isinstance(e.body, Call) and _elementwise(e, e.body, output, shapes, out):
        return
    if _offset_sum(e, output, shapes, out):
        return
    factors = _plain_product(e) if e.combine == "sum" else None
    if factors and len(e.scope) + len(e.sums) <= len(string.ascii_letters):
        eq = _einsum_equation(e, factors)
        if fits("Einsum", {"equation": eq}, [(f.tensor, shapes[f.tensor]) for f in factors]):
            out.node("Einsum", [f.tensor for f in factors], output, equation=eq)
            return
    used = {t[0] for a in accesses(e.body) for ix in a.index for t in ix.terms}
    idle = [k for k, i in enumerate(e.scope) if i.extent == 1 and i.name not in used]
    if idle and len(idle) < len(e.scope):  # size-1 output axes nothing reads by: matched without them, unsqueezed
        inner = Expr(tuple(i for k, i in enumerate(e.scope) if k not in idle), e.sums, e.body, e.combine)
        tmp = out.fresh("core")
        _step(inner, tmp, {**shapes, tmp: inner.shape}, out)
        out.node("Unsqueeze", [tmp, out.const(np.array(idle, np.int64), np.int64)], output)
        return
    raise NoMatch(f"{output}: no ONNX operator here computes {e}")


def _space_depth(src, dst):
    """The DepthToSpace (both modes) and SpaceToDepth nodes whose output shape from ``src`` is ``dst``."""
    if len(src) != 4 or len(dst) != 4 or src[0] != dst[0]:
        return []
    if dst[2] > src[2] and dst[2] % src[2] == 0 and dst[2] // src[2] == dst[3] // src[3] \
            and dst[3] == src[3] * (dst[2] // src[2]) and src[1] == dst[1] * (dst[2] // src[2]) ** 2:
        b = dst[2] // src[2]
        return [("DepthToSpace", {"blocksize": b, "mode": m}) for m in ("DCR", "CRD")]
    if src[2] > dst[2] and src[2] % dst[2] == 0 and src[3] == dst[3] * (src[2] // dst[2]) \
            and dst[1] == src[1] * (src[2] // dst[2]) ** 2:
        return [("SpaceToDepth", {"blocksize": src[2] // dst[2]})]
    return []


MAX_OFFSETS = 64  # summation points an offset sum is unrolled into (Slices added up) at most


def _offset_sum(e: Expr, output: str, shapes, out: _Out) -> bool:
    """``Σ_S T[τ]`` where each index of ``τ`` is a scope iterator, a summation iterator, or their sum plus a
    constant (EinNet's OffsetReduce: what splitting a convolution's summation leaves) as Pad, one Slice
    of ``T`` per summation point, their sum, and a Squeeze/Transpose to the scope's order."""
    if not e.sums or e.combine != "sum" or not isinstance(e.body, Access) or e.body.pad != 0.0:
        return False
    acc, sums = e.body, {s.name: s.extent for s in e.sums}
    scope = {i.name: i.extent for i in e.scope}
    if math.prod(sums.values()) > MAX_OFFSETS:
        return False
    axes = []  # per axis of T: (scope iterator or None, summation iterator or None, constant)
    for ix in acc.index:
        if ix.div != 1 or ix.mod is not None or any(len(t) != 2 or t[1] != 1 for t in ix.terms):
            return False
        o = [t[0] for t in ix.terms if t[0] in scope]
        s_ = [t[0] for t in ix.terms if t[0] in sums]
        if len(o) > 1 or len(s_) > 1 or len(o) + len(s_) != len(ix.terms) or (not o and ix.const):
            return False
        axes.append((o[0] if o else None, s_[0] if s_ else None, ix.const))
    used = [a[0] for a in axes if a[0]]
    if sorted(used) != sorted(scope) or len(set(used)) != len(used):
        return False
    dims = shapes[acc.tensor]
    pads_begin, pads_end = [], []
    for (o, s_, c), d in zip(axes, dims):
        lo = c if o else 0
        hi = (scope[o] - 1 if o else 0) + (sums[s_] - 1 if s_ else 0) + c
        pads_begin.append(max(0, -lo) if o else 0)
        pads_end.append(max(0, hi - (d - 1)) if o else 0)
    src = acc.tensor
    if any(pads_begin) or any(pads_end):
        src = out.node("Pad", [src, out.const(np.array(pads_begin + pads_end, np.int64), np.int64)], out.fresh("pad"))
    names = list(sums)
    parts = []
    for values in itertools.product(*(range(sums[n]) for n in names)):
        at = dict(zip(names, values))
        starts, ends = [], []
        for (o, s_, c), pb in zip(axes, pads_begin):
            start = (at[s_] if s_ else 0) + (c if o else 0) + pb
            starts.append(start)
            ends.append(start + (scope[o] if o else 1))
        k = np.arange(len(axes), dtype=np.int64)
        parts.append(out.node("Slice", [src, out.const(np.array(starts, np.int64), np.int64),
                                        out.const(np.array(ends, np.int64), np.int64),
                                        out.const(k, np.int64)], out.fresh("slice")))
    total = parts[0]
    for part in parts[1:]:
        total = out.node("Add", [total, part], out.fresh("sum"))
    fixed = [k for k, a in enumerate(axes) if not a[0]]
    if fixed:
        total = out.node("Squeeze", [total, out.const(np.array(fixed, np.int64), np.int64)], out.fresh("squeeze"))
    kept = [a[0] for a in axes if a[0]]
    perm = [kept.index(i.name) for i in e.scope]
    if perm != sorted(perm):
        out.node("Transpose", [total], output, perm=perm)
    else:
        out.node("Identity", [total], output)
    return True


def _window_gather(e: Expr, output: str, shapes, out: _Out) -> bool:
    """A gather whose axes read a scope iterator each, except one that reads ``B·ob + oj + c`` (overlapping
    windows of ``oj``'s extent, ``B`` apart: what blocking a banded sum leaves) as Pad, one Slice per window
    offset reshaped into blocks, Concat, a Slice to the window, and a Transpose to the scope's order.
    Accepted only when the nodes, run by ONNX Runtime on the source's positions, read exactly what the
    expression reads (over the whole domain)."""
    acc = e.body
    scope = {i.name: i.extent for i in e.scope}
    axes, window, dropped = [], None, []
    for k, ix in enumerate(acc.index):
        if ix.plain() in scope:
            axes.append([ix.plain()])
            continue
        if ix == Index(()) and shapes[acc.tensor][k] == 1:  # a size-1 axis the gather drops
            axes.append([])
            dropped.append(k)
            continue
        if window is not None or ix.div != 1 or ix.mod is not None or len(ix.terms) != 2 or \
                any(len(t) != 2 or t[0] not in scope for t in ix.terms):
            return False
        (ob, b), (oj, one) = sorted(ix.terms, key=lambda t: -t[1])
        if one != 1 or b <= 1:
            return False
        window = (k, ob, oj, b, ix.const)
        axes.append([ob, oj])
    if window is None or sorted(n for a in axes for n in a) != sorted(scope):
        return False
    k, ob, oj, b, c = window
    src_shape = list(shapes[acc.tensor])
    nb, w, d = scope[ob], scope[oj], src_shape[k]
    t = -(-w // b)  # windows of b start every b: t of them cover w
    lo, hi = c, b * (nb - 1) + (t * b - 1) + c  # the source positions the blocks read (before cutting to w)
    pb, pe = max(0, -lo), max(0, hi - (d - 1))
    rank = len(src_shape)
    start = len(out.nodes), len(out.inits)
    src = acc.tensor
    if pb or pe:
        pads = [0] * (2 * rank)
        pads[k], pads[rank + k] = pb, pe
        src = out.node("Pad", [src, out.const(np.array(pads, np.int64), np.int64), out.const(acc.pad, np.float32)],
                       out.fresh("pad"))
    blocked_shape = src_shape[:k] + [nb, b] + src_shape[k + 1:]
    parts = []
    for j in range(t):
        first = c + pb + j * b
        piece = out.node("Slice", [src, out.const(np.array([first], np.int64), np.int64),
                                   out.const(np.array([first + nb * b], np.int64), np.int64),
                                   out.const(np.array([k], np.int64), np.int64)], out.fresh("win"))
        parts.append(out.node("Reshape", [piece, out.const(np.array(blocked_shape, np.int64), np.int64)],
                              out.fresh("blocks")))
    cat = parts[0] if len(parts) == 1 else out.node("Concat", parts, out.fresh("cat"), axis=k + 1)
    if t * b != w:
        cat = out.node("Slice", [cat, out.const(np.array([0], np.int64), np.int64),
                                 out.const(np.array([w], np.int64), np.int64),
                                 out.const(np.array([k + 1], np.int64), np.int64)], out.fresh("cut"))
    if dropped:  # positions after the blocking: axes past the window's moved one on
        gone = [a if a < k else a + 1 for a in dropped]
        cat = out.node("Squeeze", [cat, out.const(np.array(gone, np.int64), np.int64)], out.fresh("squeeze"))
    order = [n for a in axes for n in a]
    perm = [order.index(i.name) for i in e.scope]
    if perm != sorted(perm):
        out.node("Transpose", [cat], output, perm=perm)
    else:
        out.node("Identity", [cat], output)
    if not _reads_as(e, src_shape, acc.tensor, out.nodes[start[0]:], out.inits[start[1]:], output):
        del out.nodes[start[0]:], out.inits[start[1]:]
        return False
    return True


def _reads_as(e: Expr, src_shape, src: str, nodes, inits, output: str) -> bool:
    """Whether ``nodes`` (run by ONNX Runtime on the source's row-major positions, as float64) read exactly
    the positions the expression reads (and the pad where it pads)."""
    from onnx import TensorProto

    from .runtime import session

    want = gather_map(e, src_shape)
    pos = np.arange(math.prod(src_shape), dtype=np.float64).reshape(src_shape)
    casted = []
    for t in inits:
        a = numpy_helper.to_array(t)
        casted.append(numpy_helper.from_array(a.astype(np.float64) if a.dtype == np.float32 else a, t.name))
    graph = helper.make_graph(list(nodes), "gather", [helper.make_tensor_value_info(src, TensorProto.DOUBLE, src_shape)],
                              [helper.make_tensor_value_info(output, TensorProto.DOUBLE, None)], casted)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    got = session(model).run(None, {src: pos})[0]
    pad = e.body.pad
    expect = np.where(want >= 0, want.astype(np.float64), np.float64(pad))
    return got.shape == want.shape and np.array_equal(got, expect)


def _tensors(e: Expr) -> list[str]:
    seen = []

    def walk(t):
        if isinstance(t, Access) and t.tensor not in seen:
            seen.append(t.tensor)
        elif isinstance(t, Call):
            for a in t.args:
                walk(a)

    walk(e.body)
    return seen


def _elementwise(e: Expr, term, output: str, shapes, out: _Out) -> bool:
    """A tree of element-wise calls over broadcast accesses, one node per call; False if it is not one."""
    names = [i.name for i in e.scope]

    def emit(t, dest):
        if isinstance(t, Const):
            return out.const(t.value)
        if isinstance(t, Access):
            want = _bcast(shapes[t.tensor], names)
            if t.index != want:
                return _reshaped(t)
            return t.tensor
        args = [emit(a, None) for a in t.args]
        while len(args) > 2:  # a variadic call as a chain of binary ones
            args = [out.node(t.op, args[:2], out.fresh("t")), *args[2:]]
        return out.node(t.op, args, dest or out.fresh("t"))

    def _reshaped(t: Access) -> str:
        """An operand whose axes are scope axes in scope order, not right-aligned (a Conv's bias over axis 1):
        reshaped to the scope's rank, 1 on the axes it does not have, so ONNX's broadcasting reads it so."""
        at = []
        for ix, d in zip(t.index, shapes[t.tensor]):
            it = ix.plain()
            if it is None and ix == Index(()) and d == 1:
                continue
            if it is None or it not in names or e.scope[names.index(it)].extent != d:
                raise NoMatch(t.tensor)
            at.append((names.index(it), d))
        if [k for k, _ in at] != sorted({k for k, _ in at}):
            raise NoMatch(t.tensor)  # a permutation: not a reshape
        shape = [1] * len(names)
        for k, d in at:
            shape[k] = d
        return out.node("Reshape", [t.tensor, out.const(np.array(shape, np.int64), np.int64)], out.fresh("t"))

    start = len(out.nodes), len(out.inits)
    try:
        emit(term, output)
    except NoMatch:
        del out.nodes[start[0]:], out.inits[start[1]:]
        return False
    return True


def _bcast(shape, names) -> tuple[Index, ...]:
    lead = len(names) - len(shape)
    return tuple(Index(()) if d == 1 else Index.of(names[lead + k]) for k, d in enumerate(shape))


# -- whole programs ---------------------------------------------------------------------------------------


def _whole(program: Program, shapes) -> tuple | None:
    """A single operator equal to the whole (multi-step) program: Conv/ConvTranspose + bias, Gemm, Softmax."""
    steps = program.steps
    inputs = list(program.inputs)
    if len(steps) == 4 and len(inputs) == 1:  # Softmax: max, exp, sum, divide
        axis = next((k for k, ix in enumerate(steps[0][1].body.index) if ix.plain() == "s0"), None) \
            if isinstance(steps[0][1].body, Access) else None
        if axis is not None and _equal("Softmax", {"axis": axis}, inputs, {}, program):
            return "Softmax", {"axis": axis}, [n for n, _ in inputs]
    if len(steps) == 2:
        conv = _conv_candidate(steps[0][1], shapes)
        if conv and len(inputs) == 3 and _equal(*conv, inputs, {}, program):
            return (*conv, [n for n, _ in inputs])
        if len(inputs) in (2, 3):
            for ta, tb in itertools.product((0, 1), repeat=2):
                for alpha, beta in _scales(steps[1][1]):
                    attrs = {"transA": ta, "transB": tb, "alpha": alpha, "beta": beta}
                    if _equal("Gemm", attrs, inputs, {}, program):
                        return "Gemm", attrs, [n for n, _ in inputs]
    return None


def _scales(e: Expr):
    consts = [t.value for t in _consts(e.body)]
    yield 1.0, 1.0
    for a in consts:
        yield a, 1.0
        for b in consts:
            yield a, b
            yield 1.0, b


def _consts(t):
    if isinstance(t, Const):
        return [t]
    if isinstance(t, Call):
        return [c for a in t.args for c in _consts(a)]
    return []


def match(program: Program, output: str, consts: dict | None = None, prefix: str | None = None):
    """ONNX nodes and initializers computing ``program``'s result into ``output`` (see the module doc).
    ``consts``: values of the program's inputs that are constant (by name): a step that reads only
    constants is computed here and written as an initializer (the window of a mask, say)."""
    shapes = _shapes(program)
    out = _Out(prefix or output)
    whole = _whole(program, shapes)
    if whole:
        op, attrs, ins = whole
        out.node(op, ins, output, **attrs)
        return out.nodes, out.inits
    renamed = {name: (output if k == len(program.steps) - 1 else out.fresh(name))
               for k, (name, _) in enumerate(program.steps)}
    shapes = {**shapes, **{renamed[n]: shapes[n] for n in renamed}}
    known = dict(consts or {})
    steps = [(renamed[n], rename_tensors(e, renamed)) for n, e in program.steps]
    k = 0
    while k < len(steps):
        name, e = steps[k]
        reads = _tensors(e)
        if reads and all(t in known for t in reads):  # constant: computed now
            known[name] = evaluate_expr(e, known).astype(np.float32)
            out.inits.append(numpy_helper.from_array(known[name], name))
            if name == output:
                out.node("Identity", [out.const(known[name])], output)
            k += 1
            continue
        softmax = _softmax_at(steps, k, shapes)
        if softmax is not None:
            x, axis = softmax
            out.node("Softmax", [x], steps[k + 3][0], axis=axis)
            k += 4
            continue
        _step(e, name, shapes, out)
        k += 1
    return out.nodes, out.inits


def _softmax_at(steps, k: int, shapes):
    """``(x, axis)`` when steps ``k .. k+3`` are Softmax's max, exp, sum and divide of ``x`` (read by nothing
    after them but through the divide)."""
    if k + 4 > len(steps):
        return None
    four = steps[k:k + 4]
    reads = _tensors(four[0][1])
    if len(reads) != 1:
        return None
    x = reads[0]
    rename = dict(zip((n for n, _ in four), ("m", "e", "s", "y")))
    if any(n in rename for _, e in steps[k + 4:] for n in _tensors(e) if n != four[3][0]):
        return None
    sub = Program(((x, shapes[x]),), tuple((rename[n], rename_tensors(e, rename)) for n, e in four))
    for axis in range(len(shapes[x])):
        if _equal("Softmax", {"axis": axis}, list(sub.inputs), {}, sub):
            return x, axis
    return None
