"""Lowering ONNX operators into tensor expressions (relations/tensor_expr.py): one function per op_type.

``lower(op_type, attrs, inputs, consts)`` gives the ``Program`` that computes the operator: ``inputs``
are the operator's inputs as (name, static shape) pairs in ONNX order, ``attrs`` its attributes (ONNX
names, defaults filled in here), ``consts`` the values of constant inputs that fix a shape (Reshape's
shape, ReduceSum's axes). Lowered: MatMul (rank >= 2, batch broadcasting), Gemm, Conv and
ConvTranspose over 2-D images (strides, pads, dilations, groups, bias; ConvTranspose's
output_padding), Einsum (no ellipsis), Transpose, Reshape, element-wise unary and binary ops with
broadcasting, ReduceSum and ReduceMax, Softmax, DepthToSpace (DCR, CRD) and SpaceToDepth. Anything else raises ``NotLowerable`` naming what.

Iterators are named by role: ``o<k>`` for the output's axes, ``s<k>`` for summations, so that two
lowerings of the same computation are equal as values.
"""

from __future__ import annotations

import math

from .tensor_expr import FUNCTIONS, Access, Call, Const, Expr, Index, Iter, Program, accesses, rename_tensors


class NotLowerable(ValueError):
    """The operator (or this instance of it) has no tensor expression here."""


def _scope(shape) -> tuple[Iter, ...]:
    return tuple(Iter(f"o{k}", int(d)) for k, d in enumerate(shape))


def _bcast_index(shape, out_rank: int, names) -> tuple[Index, ...]:
    """The indices of an operand of ``shape`` broadcast to an output whose axes are ``names`` (right-aligned):
    a size-1 axis against a larger one reads its only element."""
    lead = out_rank - len(shape)
    return tuple(Index(()) if d == 1 else Index.of(names[lead + k]) for k, d in enumerate(shape))


def _broadcast(*shapes) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        dims = {s[k - rank + len(s)] for s in shapes if k - rank + len(s) >= 0} - {1}
        if len(dims) > 1:
            raise NotLowerable(f"shapes {shapes} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _program(inputs, expr: Expr, *more) -> Program:
    return Program(tuple((n, tuple(s)) for n, s in inputs), (("y", expr),) if not more else (("t", expr), *more))


def _elementwise(op_type, attrs, inputs, consts) -> Program:
    out = _broadcast(*(s for _, s in inputs))
    scope = _scope(out)
    names = [i.name for i in scope]
    args = tuple(Access(n, _bcast_index(s, len(out), names)) for n, s in inputs)
    return _program(inputs, Expr(scope, (), Call(op_type, args)))


def _matmul(op_type, attrs, inputs, consts) -> Program:
    (a, sa), (b, sb) = inputs
    if len(sa) < 2 or len(sb) < 2 or sa[-1] != sb[-2]:
        raise NotLowerable(f"MatMul of shapes {sa} and {sb}: only rank >= 2 operands are lowered")
    batch = _broadcast(sa[:-2], sb[:-2])
    scope = _scope((*batch, sa[-2], sb[-1]))
    names = [i.name for i in scope]
    k = Iter("s0", sa[-1])
    i, j = Index.of(names[-2]), Index.of(names[-1])
    body = Call("Mul", (Access(a, (*_bcast_index(sa[:-2], len(batch), names), i, Index.of("s0"))),
                        Access(b, (*_bcast_index(sb[:-2], len(batch), names), Index.of("s0"), j))))
    return _program(inputs, Expr(scope, (k,), body))


def _gemm(op_type, attrs, inputs, consts) -> Program:
    (a, sa), (b, sb), *c = inputs
    ta, tb = attrs.get("transA", 0), attrs.get("transB", 0)
    if len(sa) != 2 or len(sb) != 2 or (sa[0] if ta else sa[1]) != (sb[1] if tb else sb[0]):
        raise NotLowerable(f"Gemm of shapes {sa} and {sb} (transA={ta}, transB={tb}) is not a matrix product")
    m, kk = (sa[1], sa[0]) if ta else sa
    n = sb[0] if tb else sb[1]
    scope = _scope((m, n))
    i, j, k = Index.of("o0"), Index.of("o1"), Index.of("s0")
    prod = Call("Mul", (Access(a, (k, i) if ta else (i, k)), Access(b, (j, k) if tb else (k, j))))
    step = Expr(scope, (Iter("s0", kk),), prod)
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    body = Access("t", (i, j))
    if alpha != 1.0:
        body = Call("Mul", (Const(alpha), body))
    if c:
        (cn, cs), = c
        cterm = Access(cn, _bcast_index(cs, 2, ["o0", "o1"]))
        body = Call("Add", (body, cterm if beta == 1.0 else Call("Mul", (Const(beta), cterm))))
    if body == Access("t", (i, j)):
        return _program(inputs, step)
    return _program(inputs, step, ("y", Expr(scope, (), body)))


def _window(attrs, kernel, rank=2):
    strides = attrs.get("strides") or [1] * rank
    dil = attrs.get("dilations") or [1] * rank
    pads = attrs.get("pads") or [0] * (2 * rank)
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
        raise NotLowerable("auto_pad is not lowered (explicit pads only)")
    return list(strides), list(dil), list(pads)


def _with_bias(inputs, conv: Expr, bias) -> Program:
    if not bias:
        return _program(inputs, conv)
    (bn, _), = bias
    names = [i.name for i in conv.scope]
    body = Call("Add", (Access("t", tuple(Index.of(n) for n in names)), Access(bn, (Index.of("o1"),))))
    return _program(inputs, conv, ("y", Expr(conv.scope, (), body)))


def _conv(op_type, attrs, inputs, consts) -> Program:
    (x, sx), (w, sw), *bias = inputs
    if len(sx) != 4:
        raise NotLowerable(f"Conv over rank {len(sx)}: only 2-D images are lowered")
    g = attrs.get("group", 1)
    (m, cg, kh, kw), (n, c, h, wd) = sw, sx
    (sh, sw_), (dh, dw), (pt, pl, pb, pr) = _window(attrs, (kh, kw))
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw_ + 1
    scope = _scope((n, m, oh, ow))
    mg = m // g
    channel = Index((("o1", cg, mg), ("s0", 1))) if g > 1 else Index.of("s0")
    xi = Access(x, (Index.of("o0"), channel, Index((("o2", sh), ("s1", dh)), -pt), Index((("o3", sw_), ("s2", dw)), -pl)))
    wi = Access(w, (Index.of("o1"), Index.of("s0"), Index.of("s1"), Index.of("s2")))
    conv = Expr(scope, (Iter("s0", cg), Iter("s1", kh), Iter("s2", kw)), Call("Mul", (xi, wi)))
    return _with_bias(inputs, conv, bias)


def _conv_transpose(op_type, attrs, inputs, consts) -> Program:
    (x, sx), (w, sw), *bias = inputs
    if len(sx) != 4:
        raise NotLowerable(f"ConvTranspose over rank {len(sx)}: only 2-D images are lowered")
    if attrs.get("output_shape"):
        raise NotLowerable("ConvTranspose with output_shape is not lowered (pads only)")
    g = attrs.get("group", 1)
    (c, mg, kh, kw), (n, _, h, wd) = sw, sx
    (sh, sw_), (dh, dw), (pt, pl, pb, pr) = _window(attrs, (kh, kw))
    oph, opw = attrs.get("output_padding") or [0, 0]
    oh = sh * (h - 1) + oph + dh * (kh - 1) + 1 - pt - pb
    ow = sw_ * (wd - 1) + opw + dw * (kw - 1) + 1 - pl - pr
    m, cg = mg * g, c // g
    scope = _scope((n, m, oh, ow))
    # out[n, m, oh, ow] = Σ x[n, c, ih, iw] w[c, m', r, s] over oh = ih·sh + r·dh - pt: ih = (oh + pt - r·dh) / sh, exactly
    channel = Index((("o1", cg, mg), ("s0", 1))) if g > 1 else Index.of("s0")
    xi = Access(x, (Index.of("o0"), channel, Index((("o2", 1), ("s1", -dh)), pt, sh), Index((("o3", 1), ("s2", -dw)), pl, sw_)))
    wm = Index((("o1", 1), ("o1", -mg, mg))) if g > 1 else Index.of("o1")
    wi = Access(w, (channel, wm, Index.of("s1"), Index.of("s2")))
    conv = Expr(scope, (Iter("s0", cg), Iter("s1", kh), Iter("s2", kw)), Call("Mul", (xi, wi)))
    return _with_bias(inputs, conv, bias)


def _einsum(op_type, attrs, inputs, consts) -> Program:
    eq = attrs["equation"]
    eq = eq.decode() if isinstance(eq, bytes) else eq
    if "..." in eq or "->" not in eq:
        raise NotLowerable(f"Einsum {eq!r}: only explicit equations without an ellipsis are lowered")
    lhs, out = eq.replace(" ", "").split("->")
    terms = lhs.split(",")
    extent: dict[str, int] = {}
    for t, (_, s) in zip(terms, inputs):
        for ch, d in zip(t, s):
            extent[ch] = max(extent.get(ch, 1), d)
    name = {ch: f"o{k}" for k, ch in enumerate(out)}
    summed = [ch for ch in dict.fromkeys("".join(terms)) if ch not in name]
    name.update({ch: f"s{k}" for k, ch in enumerate(summed)})
    accs = [Access(n, tuple(Index(()) if d == 1 and extent[ch] > 1 else Index.of(name[ch]) for ch, d in zip(t, s)))
            for t, (n, s) in zip(terms, inputs)]
    body = accs[0] if len(accs) == 1 else Call("Mul", tuple(accs))
    return _program(inputs, Expr(_scope([extent[ch] for ch in out]), tuple(Iter(name[ch], extent[ch]) for ch in summed),
                                 body))


def _transpose(op_type, attrs, inputs, consts) -> Program:
    (x, sx), = inputs
    perm = attrs.get("perm") or list(reversed(range(len(sx))))
    index = [None] * len(sx)
    for k, p in enumerate(perm):
        index[p] = Index.of(f"o{k}")
    return _program(inputs, Expr(_scope([sx[p] for p in perm]), (), Access(x, tuple(index))))


def _reshape(op_type, attrs, inputs, consts) -> Program:
    (x, sx), (shape_name, _) = inputs
    if shape_name not in consts:
        raise NotLowerable("Reshape to a shape computed in the graph is not lowered")
    target = [int(d) for d in consts[shape_name]]
    target = [sx[k] if d == 0 and not attrs.get("allowzero", 0) else d for k, d in enumerate(target)]
    if -1 in target:
        known = math.prod(d for d in target if d != -1)
        target[target.index(-1)] = math.prod(sx) // known
    if math.prod(target) != math.prod(sx):
        raise NotLowerable(f"Reshape of {sx} to {target}: sizes differ")
    return _program(inputs, Expr(_scope(target), (), Access(x, reshape_index(sx, target))))


def reshape_index(src, target) -> tuple[Index, ...]:
    """The indices into a tensor of shape ``src`` read by element ``o`` of its reshape to ``target``:
    the row-major flat position of ``o``, unflattened over ``src``."""
    out_strides = [math.prod(target[k + 1:]) for k in range(len(target))]
    flat = tuple((f"o{k}", st) for k, st in enumerate(out_strides) if target[k] != 1)
    in_strides = [math.prod(src[k + 1:]) for k in range(len(src))]
    return tuple(Index(flat, 0, st, False, d) for st, d in zip(in_strides, src))


def _reduce(op_type, attrs, inputs, consts) -> Program:
    (x, sx), *axes_in = inputs
    axes = attrs.get("axes")
    if axes is None and axes_in:
        if axes_in[0][0] not in consts:
            raise NotLowerable(f"{op_type} over axes computed in the graph is not lowered")
        axes = [int(a) for a in consts[axes_in[0][0]]]
    rank = len(sx)
    axes = sorted({a % rank for a in (axes if axes else range(rank))})
    keep = attrs.get("keepdims", 1)
    out, index, sums = [], [], []
    for k, d in enumerate(sx):
        if k in axes:
            index.append(Index.of(f"s{len(sums)}"))
            sums.append(Iter(f"s{len(sums)}", d))
            if keep:
                out.append(1)
        else:
            index.append(None)
            out.append(d)
    scope = _scope(out)
    free = iter(i.name for i in scope)
    for k in range(rank):  # the kept axes take the output's iterators in order
        if k in axes:
            if keep:
                next(free)
            continue
        index[k] = Index.of(next(free))
    return _program(inputs, Expr(scope, tuple(sums), Access(x, tuple(index)),
                                 "max" if op_type == "ReduceMax" else "sum"))


def _softmax(op_type, attrs, inputs, consts) -> Program:
    (x, sx), = inputs
    rank = len(sx)
    axis = attrs.get("axis", -1) % rank
    scope = _scope(sx)
    full = tuple(Index.of(i.name) for i in scope)
    over = tuple(Index.of("s0") if k == axis else ix for k, ix in enumerate(full))
    kept = tuple(Index(()) if k == axis else ix for k, ix in enumerate(full))
    red_scope = tuple(Iter(i.name, 1) if k == axis else i for k, i in enumerate(scope))
    m = Expr(red_scope, (Iter("s0", sx[axis]),), Access(x, over), "max")
    e = Expr(scope, (), Call("Exp", (Call("Sub", (Access(x, full), Access("m", kept))),)))
    s = Expr(red_scope, (Iter("s0", sx[axis]),), Access("e", over))
    y = Expr(scope, (), Call("Div", (Access("e", full), Access("s", kept))))
    return Program(tuple((n, tuple(s_)) for n, s_ in inputs), (("m", m), ("e", e), ("s", s), ("y", y)))


_UNARY = {"Exp", "Log", "Sqrt", "Neg", "Abs", "Tanh", "Relu", "Sigmoid", "Identity"}
_BINARY = {"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"}
assert _UNARY | _BINARY <= FUNCTIONS

def _depth_to_space(op_type, attrs, inputs, consts) -> Program:
    """DepthToSpace (DCR or CRD) and SpaceToDepth: pure gathers whose channel index mixes a floor and a remainder,
    written as floor terms (``h % b = h - b·⌊h / b⌋``)."""
    (x, sx), = inputs
    b = int(attrs.get("blocksize", 0))
    if len(sx) != 4 or b < 1:
        raise NotLowerable(f"{op_type} over rank {len(sx)} (or blocksize {b}) is not lowered")
    n, c, h, w = sx
    if op_type == "SpaceToDepth":
        if h % b or w % b:
            raise NotLowerable(f"SpaceToDepth: {h}x{w} does not split into blocks of {b}")
        # out[n, (bh·b + bw)·C + c, h, w] = x[n, c, h·b + bh, w·b + bw], with q = the output channel
        index = (Index.of("o0"), Index((("o1", 1), ("o1", -c, c))),
                 Index((("o2", b), ("o1", 1, c * b))), Index((("o3", b), ("o1", 1, c), ("o1", -b, c * b))))
        return _program(inputs, Expr(_scope((n, c * b * b, h // b, w // b)), (), Access(x, index)))
    if c % (b * b):
        raise NotLowerable(f"DepthToSpace: {c} channels do not split by {b}x{b}")
    cc = c // (b * b)
    hm, wm = (("o2", 1), ("o2", -b, b)), (("o3", 1), ("o3", -b, b))  # h % b, w % b
    if str(attrs.get("mode", "DCR")) == "CRD":  # channel c·b² + (h % b)·b + (w % b)
        chan = (("o1", b * b), *((t[0], t[1] * b, *t[2:]) for t in hm), *wm)
    else:  # DCR: channel (h % b)·b·C' + (w % b)·C' + c
        chan = (*((t[0], t[1] * b * cc, *t[2:]) for t in hm), *((t[0], t[1] * cc, *t[2:]) for t in wm), ("o1", 1))
    index = (Index.of("o0"), Index(tuple(chan)), Index((("o2", 1, b),)), Index((("o3", 1, b),)))
    return _program(inputs, Expr(_scope((n, cc, h * b, w * b)), (), Access(x, index)))


LOWERINGS = {
    **{op: _elementwise for op in _UNARY | _BINARY},
    "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "ConvTranspose": _conv_transpose, "Einsum": _einsum,
    "Transpose": _transpose, "Reshape": _reshape, "ReduceSum": _reduce, "ReduceMax": _reduce, "Softmax": _softmax,
    "DepthToSpace": _depth_to_space, "SpaceToDepth": _depth_to_space,
}


def lower(op_type: str, attrs: dict, inputs, consts: dict | None = None) -> Program:
    """The program of one operator (see the module doc); ``NotLowerable`` when there is none here."""
    fn = LOWERINGS.get(op_type)
    if fn is None:
        raise NotLowerable(f"{op_type} has no tensor expression")
    inputs = [(n, tuple(int(d) for d in s)) for n, s in inputs if n]
    if any(d <= 0 for _, s in inputs for d in s):
        raise NotLowerable(f"{op_type}: lowering needs static positive dims, got {[s for _, s in inputs]}")
    return fn(op_type, dict(attrs), inputs, consts or {})


def lower_graph(nodes, shapes: dict, consts: dict | None = None) -> Program:
    """One program for a subgraph: ``nodes`` (ONNX NodeProtos in topological order, one output each) over the
    tensors of known ``shapes`` (its inputs; ``consts``: those that are constant, by name). Each node's
    program becomes steps named ``<output>`` (its result) and ``<output>.<step>`` (the others); the last
    node's output is the program's result. ``NotLowerable`` names the node that has no expression."""
    from onnx import helper

    consts = dict(consts or {})
    known = {n: tuple(s) for n, s in shapes.items()}
    inputs, steps = {}, []
    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        args = []
        for name in node.input:
            if not name:
                continue
            if name not in known:
                raise NotLowerable(f"node {node.name or node.op_type}: input {name!r} has no known shape")
            if name not in {s for s, _ in steps} and name not in consts:
                inputs.setdefault(name, known[name])
            args.append((name, known[name]))
        try:
            p = lower(node.op_type, attrs, args, consts)
        except NotLowerable as e:
            raise NotLowerable(f"node {node.name or node.op_type}: {e}") from None
        out = node.output[0]
        names = {n: (out if k == len(p.steps) - 1 else f"{out}.{n}") for k, (n, _) in enumerate(p.steps)}

        steps += [(names[n], rename_tensors(e, names)) for n, e in p.steps]
        known[out] = p.result.shape
    for name in list(consts):  # constant inputs the steps read (a mask) are inputs too, with their values known
        if any(a.tensor == name for _, e in steps for a in accesses(e.body)) and name not in inputs:
            inputs[name] = known[name]
    return Program(tuple(inputs.items()), tuple(steps))
