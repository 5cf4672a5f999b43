"""Tensor expressions (EinNet, shared/seeds/003_*): operators as index expressions over their inputs.

An ``Expr`` is EinNet's ``L_{scope} Σ_{sums} f(T1[τ1], T2[τ2], ...)``: a *scope* of iterators, one per
output axis in order (each ranging over ``[0, extent)``), a set of *summation* iterators, and a body:
element-wise ONNX functions (``Call``: Add, Mul, Exp, Relu, ...) of constants and *accesses* ``T[τ]``,
where every axis of ``τ`` is an ``Index``: an affine combination of iterators, optionally divided
(``(Σ c·i + k) / d``: exactly, or floored and wrapped by a modulus). An access outside ``T``'s bounds,
or whose exact division has a remainder, reads the access's ``pad`` (0 unless said): that is how
padding, strides, dilation and transposed convolution's zero insertion are one form. The sums combine with ``+`` (or ``max``).

A ``Program`` is a short sequence of named expressions over named inputs (an operator that is not
one expression, e.g. Softmax = max, exp, sum, divide, lowers to a few), its last the result.
relations/tensor_lower.py lowers ONNX operators into programs, relations/tensor_match.py matches
programs back to ONNX nodes; ``evaluate`` here computes a program with NumPy, by the definition
(every scope and summation point materialised: for checking on small tensors, never for speed).

All nodes are frozen dataclasses (data only): they hash and compare by value, so derived
expressions can be deduplicated.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Union

import numpy as np


@dataclass(frozen=True)
class Iter:
    name: str
    extent: int  # ranges over [0, extent)


@dataclass(frozen=True)
class Index:
    """One axis of an access: ``(Σ coeff·⌊iter / d⌋ + const) / div`` -- exact (a remainder reads 0) or
    floored (``exact=False``, then taken modulo ``mod`` when given). A term is ``(iter, coeff)`` or
    ``(iter, coeff, d)``: the floor of an iterator by ``d`` (a grouped channel's group)."""

    terms: tuple[tuple, ...]
    const: int = 0
    div: int = 1
    exact: bool = True
    mod: int | None = None

    @staticmethod
    def of(name: str) -> "Index":
        return Index(((name, 1),))

    def plain(self) -> str | None:
        """The iterator this index is, when it is exactly one iterator (coefficient 1, no offset)."""
        if (len(self.terms) == 1 and len(self.terms[0]) == 2 and self.terms[0][1] == 1 and not self.const
                and self.div == 1 and self.mod is None):
            return self.terms[0][0]
        return None


@dataclass(frozen=True)
class Access:
    tensor: str
    index: tuple[Index, ...]
    pad: float = 0.0  # what a read outside the tensor (or an inexact division) gives


@dataclass(frozen=True)
class Const:
    value: float


@dataclass(frozen=True)
class Call:
    op: str  # an element-wise ONNX op_type
    args: tuple["Term", ...]


Term = Union[Access, Const, Call]


@dataclass(frozen=True)
class Expr:
    scope: tuple[Iter, ...]
    sums: tuple[Iter, ...]
    body: Term
    combine: str = "sum"  # how the summation iterators combine: "sum" or "max"

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(i.extent for i in self.scope)


@dataclass(frozen=True)
class Program:
    inputs: tuple[tuple[str, tuple[int, ...]], ...]  # name, shape
    steps: tuple[tuple[str, Expr], ...]  # name, expression; the last is the result

    @property
    def result(self) -> Expr:
        return self.steps[-1][1]


def accesses(term: Term) -> list[Access]:
    """Every access of ``term``, left to right."""
    if isinstance(term, Access):
        return [term]
    if isinstance(term, Call):
        return [a for t in term.args for a in accesses(t)]
    return []


def rename_tensors(e: Expr, names: dict[str, str]) -> Expr:
    """``e`` reading tensor ``names[t]`` wherever it read ``t`` (others, indices and pads as they were)."""
    def walk(t: Term) -> Term:
        if isinstance(t, Access):
            return Access(names.get(t.tensor, t.tensor), t.index, t.pad)
        if isinstance(t, Call):
            return Call(t.op, tuple(walk(a) for a in t.args))
        return t

    return Expr(e.scope, e.sums, walk(e.body), e.combine)


# -- evaluation (NumPy, by the definition) ---------------------------------------------------------------

_FUNCTIONS = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Max": np.maximum,
    "Min": np.minimum, "Pow": np.power, "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt, "Neg": np.negative,
    "Abs": np.abs, "Tanh": np.tanh, "Relu": lambda x: np.maximum(x, 0),
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)), "Identity": lambda x: x,
}
FUNCTIONS = frozenset(_FUNCTIONS)


def _index_values(ix: Index, grid: dict[str, np.ndarray], extent: int):
    """The integer index ``ix`` takes at every grid point, and where it is valid (in bounds, exact)."""
    value = sum((t[1] * (grid[t[0]] // t[2] if len(t) == 3 else grid[t[0]]) for t in ix.terms), np.int64(ix.const))
    value = np.asarray(value, dtype=np.int64)
    valid = np.ones(value.shape, bool)
    if ix.div != 1:
        if ix.exact:
            valid &= value % ix.div == 0
        value = value // ix.div
    if ix.mod is not None:
        value = value % ix.mod
    valid &= (value >= 0) & (value < extent)
    return np.where(valid, value, 0), valid


def _term(term: Term, tensors: dict[str, np.ndarray], grid: dict[str, np.ndarray]) -> np.ndarray:
    if isinstance(term, Const):
        return np.float32(term.value)
    if isinstance(term, Call):
        args = [_term(a, tensors, grid) for a in term.args]
        fn = _FUNCTIONS[term.op]
        return functools.reduce(fn, args) if len(args) > 2 else fn(*args)  # Add, Mul, Max, Min are variadic
    t = tensors[term.tensor]
    if len(term.index) != t.ndim:
        raise ValueError(f"access {term.tensor} with {len(term.index)} indices, tensor of rank {t.ndim}")
    pairs = [_index_values(ix, grid, d) for ix, d in zip(term.index, t.shape)]
    valid = np.bool_(True)
    for _, v in pairs:
        valid = valid & v
    got = t[tuple(np.broadcast_arrays(*(p for p, _ in pairs)))] if pairs else t[()]
    return np.where(valid, got, np.asarray(term.pad, t.dtype))


def gather_map(e: Expr, source_shape) -> np.ndarray | None:
    """For an expression that only reads one tensor (a single access, no summation), the row-major position
    in the source that every output element reads (-1 where it reads the pad): two such expressions with the
    same map are the same gather, over the whole finite domain. None for any other expression."""
    if e.sums or not isinstance(e.body, Access):
        return None
    flat = np.arange(int(np.prod(source_shape)), dtype=np.int64).reshape(source_shape)
    iters = e.scope
    axes = np.indices([i.extent for i in iters], sparse=True) if iters else []
    grid = {i.name: a for i, a in zip(iters, axes)}
    got = _term(Access("src", e.body.index, -1), {"src": flat}, grid)
    return np.broadcast_to(got, e.shape)


def evaluate_expr(e: Expr, tensors: dict[str, np.ndarray]) -> np.ndarray:
    iters = (*e.scope, *e.sums)
    axes = np.indices([i.extent for i in iters], sparse=True) if iters else []
    grid = {i.name: a for i, a in zip(iters, axes)}
    full = np.broadcast_to(_term(e.body, tensors, grid), tuple(i.extent for i in iters))
    if not e.sums:
        return np.array(full)
    red = tuple(range(len(e.scope), len(iters)))
    return full.sum(axis=red) if e.combine == "sum" else full.max(axis=red)


def evaluate(p: Program, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The program's result for ``inputs`` (by name), computed by the definition."""
    tensors = dict(inputs)
    for name, e in p.steps:
        tensors[name] = evaluate_expr(e, tensors).astype(np.float32, copy=False)
    return tensors[p.steps[-1][0]]
