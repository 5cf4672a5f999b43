"""The term universe of rule generation: leaves, operator instances and their numpy semantics.

A ``Family`` is what TASO's generator enumerates over: a few input tensors and weights
(``Leaf``: a shape template over named dim symbols, a data role), and operator instances
(``OpInst``: an ONNX operator with fixed or symbolic attributes) from relsat's catalog.
Every family is evaluated at ``ASSIGNMENTS`` concrete assignments at once: each dim symbol
has one value per assignment (so a dim is a vector, and two dims are the same symbol
exactly when their vectors are equal), and so do the symbolic attributes (a Conv's
kernel, strides and pads; a pooling window), so an identity that survives all
assignments holds for the symbols, not for one size.

The numpy semantics follow ONNX for the forms used here.  Arrays carry a leading term
axis: an operator is applied to many terms in one call (``OpInst.apply``), which is what
keeps the enumeration set-oriented.  ``FAMILIES`` lists the shipped families.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

ASSIGNMENTS = 3  # concrete assignments every term is evaluated at


@dataclass(frozen=True)
class Leaf:
    """An input tensor or weight: ``shape`` items are dim symbol names or ints."""

    name: str
    shape: tuple
    role: str = "data"  # data | const (a weight: the rule says (const ?v)) | positive (const, data > 0)
    fixed: bool = False  # only an operator instance's own extra input (a bias, BN parameters), not a free leaf

    @property
    def const(self) -> bool:
        return self.role in ("const", "positive")

    @property
    def kind(self) -> tuple:
        """Leaves of one kind are interchangeable (renaming them gives the same rule)."""
        return (self.shape, self.role)


@dataclass(frozen=True)
class OpInst:
    """One operator with its attributes: ``attrs`` is the rule text of the attributes (symbolic
    ones as ``?var``), ``extra`` the fixed leaves appended as further inputs (a Conv's bias)."""

    key: str
    op: str
    arity: int
    fn: object = field(compare=False)  # fn(k, *arrays with a leading term axis) -> array
    attrs: str = ""
    extra: tuple = ()
    index: int | None = None  # getitem index of a Split output
    split: tuple = ()  # (axis, symbol, symbol) of a Split: sizes written through dims of the rule's variables
    params: tuple = ()  # attribute variables this instance binds (?k ?s ...), which a right side cannot invent

    def apply(self, k: int, arrays, extra_values) -> np.ndarray:
        return self.fn(k, *arrays, *extra_values)


@dataclass
class Family:
    name: str
    dims: dict  # symbol -> values per assignment
    leaves: tuple
    ops: tuple

    @functools.cached_property
    def by_leaf(self) -> dict:
        return {leaf.name: leaf for leaf in self.leaves}

    def shape(self, leaf: Leaf, k: int) -> tuple:
        return tuple(self.dims[d][k] if isinstance(d, str) else d for d in leaf.shape)

    def symbol(self, values: tuple) -> str | None:
        """The dim symbol whose values per assignment are ``values``."""
        return self._symbols.get(tuple(values))

    @functools.cached_property
    def _symbols(self) -> dict:
        return {tuple(v): s for s, v in self.dims.items()}

    def leaf_values(self, rng: np.random.Generator) -> dict:
        """Random data for every leaf at every assignment: {name: [array per assignment]}."""
        out = {}
        for leaf in self.leaves:
            vals = []
            for k in range(ASSIGNMENTS):
                shape = self.shape(leaf, k)
                vals.append(rng.uniform(0.5, 2.0, shape) if leaf.role == "positive" else rng.standard_normal(shape))
            out[leaf.name] = vals
        return out


# ---------------------------------------------------------------- numpy semantics (leading term axis)


def _align(a: np.ndarray, b: np.ndarray):
    """Pad the lower-rank operand with 1s after the term axis (ONNX broadcasting aligns from the right)."""
    ra, rb = a.ndim, b.ndim
    if ra < rb:
        a = a.reshape(a.shape[:1] + (1,) * (rb - ra) + a.shape[1:])
    elif rb < ra:
        b = b.reshape(b.shape[:1] + (1,) * (ra - rb) + b.shape[1:])
    return a, b


def _add(k, a, b):
    a, b = _align(a, b)
    return a + b


def _mul(k, a, b):
    a, b = _align(a, b)
    return a * b


def _matmul(k, a, b):
    if a.ndim < 3 or b.ndim < 3:
        raise ValueError("MatMul of a vector")
    a, b = _align(a, b)
    return np.matmul(a, b)


def _gemm(ta, tb, with_c):
    def fn(k, a, b, *c):
        if a.ndim != 3 or b.ndim != 3:
            raise ValueError("Gemm of a non-matrix")
        a = a.transpose(0, 2, 1) if ta else a
        b = b.transpose(0, 2, 1) if tb else b
        y = np.matmul(a, b)
        if with_c:
            c = c[0]
            y2, c2 = _align(y, c if c.ndim > 1 else c.reshape(1, *c.shape))
            z = y2 + c2
            if z.shape[1:] != y.shape[1:]:
                raise ValueError("Gemm bias does not broadcast to the product")
            return z
        return y
    return fn


def _pad_hw(x, p, value=0.0):
    return np.pad(x, ((0, 0),) * (x.ndim - 2) + ((p, p), (p, p)), constant_values=value)


def _windows(x, kk, s, p, value=0.0):
    """x [T, n, c, h, w] -> [T, n, c, oh, ow, kk, kk] (windows at stride s over x padded by p)."""
    xp = _pad_hw(x, p, value)
    if xp.shape[-1] < kk or xp.shape[-2] < kk:
        raise ValueError("window larger than the padded input")
    return sliding_window_view(xp, (kk, kk), axis=(-2, -1))[..., ::s, ::s, :, :]


CONV_ATTRS = ((3, 1, 1), (1, 1, 0), (3, 2, 1))  # (kernel, stride, pad) of a symbolic Conv per assignment
POOL_ATTRS = ((2, 2, 0), (3, 1, 1), (3, 2, 1))  # (kernel, stride, pad) of a symbolic pooling window


def _conv(k, x, w, *b):
    kk, s, p = CONV_ATTRS[k]
    if x.ndim != 5 or w.ndim != 5 or w.shape[-1] != kk or w.shape[-2] != kk or x.shape[2] != w.shape[2]:
        raise ValueError("Conv shapes")
    y = np.einsum("tnchwij,tmcij->tnmhw", _windows(x, kk, s, p), w, optimize=True)
    if b:
        if b[0].shape[1:] != (w.shape[1],):
            raise ValueError("Conv bias shape")
        y = y + b[0][:, None, :, None, None]
    return y


def _pool(kind):
    def fn(k, x):
        kk, s, p = POOL_ATTRS[k]
        if x.ndim != 5:
            raise ValueError("pooling of a non-image")
        if kind == "max":
            return _windows(x, kk, s, p, -np.inf).max(axis=(-2, -1))
        total = _windows(x, kk, s, p).sum(axis=(-2, -1))
        count = _windows(np.ones_like(x[:1]), kk, s, p).sum(axis=(-2, -1))  # count_include_pad = 0
        return total / count
    return fn


def _global_average(k, x):
    if x.ndim != 5:
        raise ValueError("GlobalAveragePool of a non-image")
    return x.mean(axis=(-2, -1), keepdims=True)


def _batchnorm(k, x, scale, bias, mean, var):
    if x.ndim != 5 or scale.shape[1:] != (x.shape[2],):
        raise ValueError("BatchNormalization shapes")
    c = (slice(None), None, slice(None), None, None)
    return (x - mean[c]) / np.sqrt(var[c] + 1e-5) * scale[c] + bias[c]


def _transpose(perm):
    return lambda k, a: a.transpose(0, *(p + 1 for p in perm)) if a.ndim == len(perm) + 1 else _bad("rank")


def _concat(axis):
    def fn(k, a, b):
        if a.ndim != b.ndim or a.ndim <= axis + 1:
            raise ValueError("Concat ranks")
        return np.concatenate([a, b], axis=axis + 1)
    return fn


def _split(family_dims, axis, s1, s2, index):
    def fn(k, a):
        n1, n2 = family_dims[s1][k], family_dims[s2][k]
        if a.ndim <= axis + 1 or a.shape[axis + 1] != n1 + n2:
            raise ValueError("Split sizes")
        return a[(slice(None),) * (axis + 1) + ((slice(0, n1) if index == 0 else slice(n1, n1 + n2)),)]
    return fn


RESHAPE = ":shape ?r"  # a rule can only keep a Reshape's target as it is (both sides share ?r)


def _reshape(keep: int):
    """Reshape evaluated as the target that keeps the first ``keep - 1`` dims and flattens the rest; in
    a rule the target is the variable ?r, which both sides must bind alike (verification draws others)."""
    def fn(k, a):
        if a.ndim < keep + 1:
            raise ValueError("Reshape of a lower rank")
        return a.reshape(a.shape[:keep] + (-1,))
    return fn


def _bad(what):
    raise ValueError(what)


def _elementwise(f):
    return lambda k, a: f(a)


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


# ---------------------------------------------------------------- the shipped families

def _common_ops(dims: dict, splits) -> list[OpInst]:
    ops = [
        OpInst("Add", "Add", 2, _add),
        OpInst("Mul", "Mul", 2, _mul),
        OpInst("Relu", "Relu", 1, _elementwise(lambda a: np.maximum(a, 0.0))),
        OpInst("Sigmoid", "Sigmoid", 1, _elementwise(_sigmoid)),
    ]
    for axis, s1, s2 in splits:
        for i in (0, 1):
            ops.append(OpInst(f"Split{axis}_{s1}_{s2}[{i}]", "Split", 1, _split(dims, axis, s1, s2, i),
                              index=i, split=(axis, s1, s2)))
    return ops


def _matrix() -> Family:
    dims = {"a": (2, 3, 2), "b": (3, 2, 4), "c": (4, 5, 3)}
    leaves = (Leaf("x", ("a", "b")), Leaf("y", ("a", "b")), Leaf("z", ("a", "b")),
              Leaf("w", ("b", "c"), "const"), Leaf("v", ("b", "c"), "const"),
              Leaf("s", (), "const"), Leaf("t", ("c",), "const", fixed=True), Leaf("t2", ("c",), "const", fixed=True))
    ops = _common_ops(dims, [(0, "a", "a"), (1, "b", "b"), (1, "c", "c")]) + [
        OpInst("MatMul", "MatMul", 2, _matmul),
        OpInst("GemmT", "Gemm", 2, _gemm(0, 1, False), ":alpha 1.0 :beta 1.0 :transA 0 :transB 1"),
        OpInst("Gemm+t", "Gemm", 2, _gemm(0, 0, True), ":alpha 1.0 :beta 1.0 :transA 0 :transB 0", extra=("t",)),
        OpInst("Gemm+t2", "Gemm", 2, _gemm(0, 0, True), ":alpha 1.0 :beta 1.0 :transA 0 :transB 0", extra=("t2",)),
        OpInst("Tanh", "Tanh", 1, _elementwise(np.tanh)),
        OpInst("Transpose", "Transpose", 1, _transpose((1, 0)), ":perm (1 0)"),
        OpInst("Concat0", "Concat", 2, _concat(0), ":axis 0"),
        OpInst("Concat1", "Concat", 2, _concat(1), ":axis 1"),
        OpInst("Reshape", "Reshape", 1, _reshape(1), RESHAPE, params=("r",)),
    ]
    return Family("matrix", dims, leaves, tuple(ops))


CONV_PARAMS = ("k", "st", "p", "d")
POOL_PARAMS = ("pk", "ps", "pp", "pd")


def _image() -> Family:
    dims = {"n": (1, 2, 1), "c": (2, 3, 3), "m": (3, 2, 4), "h": (5, 6, 7), "K": tuple(a[0] for a in CONV_ATTRS)}
    leaves = (Leaf("x", ("n", "c", "h", "h")), Leaf("y", ("n", "c", "h", "h")),
              Leaf("w", ("m", "c", "K", "K"), "const"), Leaf("u", ("m", "c", "K", "K"), "const"),
              Leaf("s", (), "const"), Leaf("b", ("m",), "const", fixed=True), Leaf("b2", ("m",), "const", fixed=True),
              Leaf("g", ("c",), "const", fixed=True), Leaf("e", ("c",), "const", fixed=True),
              Leaf("mu", ("c",), "const", fixed=True), Leaf("var", ("c",), "positive", fixed=True))
    conv = ":group 1 :kernel_shape ?k :strides ?st :pads ?p :dilations ?d"
    pool = ":kernel_shape ?pk :strides ?ps :pads ?pp :dilations ?pd :ceil_mode 0"
    ops = _common_ops(dims, [(1, "c", "c"), (1, "m", "m")]) + [
        OpInst("Conv", "Conv", 2, _conv, conv, params=CONV_PARAMS),
        OpInst("Conv+b", "Conv", 2, _conv, conv, extra=("b",), params=CONV_PARAMS),
        OpInst("Conv+b2", "Conv", 2, _conv, conv, extra=("b2",), params=CONV_PARAMS),
        OpInst("MaxPool", "MaxPool", 1, _pool("max"), pool, params=POOL_PARAMS),
        OpInst("AveragePool", "AveragePool", 1, _pool("avg"), pool + " :count_include_pad 0", params=POOL_PARAMS),
        OpInst("GlobalAveragePool", "GlobalAveragePool", 1, _global_average),
        OpInst("BatchNormalization", "BatchNormalization", 1, _batchnorm, ":epsilon 1e-05 :momentum 0.9",
               extra=("g", "e", "mu", "var")),
        OpInst("Concat0", "Concat", 2, _concat(0), ":axis 0"),
        OpInst("Concat1", "Concat", 2, _concat(1), ":axis 1"),
        OpInst("Reshape", "Reshape", 1, _reshape(2), RESHAPE, params=("r",)),
    ]
    return Family("image", dims, leaves, tuple(ops))


FAMILIES = {"matrix": _matrix, "image": _image}
