"""The core rule IR: frozen dataclasses shared by the rule front end and the SQL compiler.

This module owns the data model only (plus ``RuleError``, the one error type of the
front end, also raised for a bad ``include``).  ``parser.py`` turns rule files into it
(desugaring ``<=>`` and the predicate shorthands, splicing in included files),
``checker.py`` validates it against the operator catalog, and the compiler reads it.
What the compiler may rely on once a ``RuleSet`` is checked:

Rule
    One direction: match every pattern of ``patterns`` jointly (shared variables mean
    the same value), evaluate ``lets`` in order, keep the match when every
    ``conditions`` entry holds, then for each i build ``rhs[i]`` (hash-consed) and
    union it with the e-class of ``patterns[i]``'s root.  A bare ``Var`` in ``rhs``
    means "union that bound e-class".  ``len(patterns) == len(rhs)``, every pattern
    root is a ``Term``.
Term on the left (a pattern)
    ``attrs`` lists only the attributes the rule constrains: a ``Lit``/``ListOf``
    must be equal, a ``Var`` binds (or, when repeated, must equal) the value; an
    attribute not listed matches ANY value, not the default (so ``(Relu (Conv ?x ?w))``
    matches every bias-less Conv).  ``children`` has one entry per catalog input of a
    fixed-arity op: ``Absent()`` means the optional input must be absent; an optional
    input omitted at the end in the source is ``Absent()`` too (absent, not "anything").
    A variadic op (Concat) matches nodes with exactly ``len(children)`` inputs.
Term on the right (a builder)
    ``attrs`` lists EVERY attribute of the op, catalog defaults filled in, so the
    compiler never needs defaults; ``children`` as on the left.
Both sides
    ``attrs`` are in catalog order.  ``getitem`` keeps its index in ``Term.index``
    (the catalog's ``index`` column) and has ``attrs == ()`` and one child.
    Float attribute values are Python floats (a ``1`` written for a float attribute is 1.0).
Variables
    A variable is either an e-class variable (in child position, a bare right side,
    ``Pred.var``, the argument of ``Dim``/``Rank``/``Numel``/``ShapeOf``) or an
    attribute variable (an attribute value or list item, an expression leaf, a
    ``Let`` target); never both in one rule.  Every variable used in ``lets`` (before
    its own binding), ``conditions`` or ``rhs`` is bound by the patterns or a let.
Expressions
    ``Lit | Var | Dim | Rank | Numel | ShapeOf | BinOp | ListExpr | Len``.  ``Dim``
    counts negative indices from the end; ``BinOp`` ``/`` and ``%`` are integer floor
    division and modulo (as Python ``//`` and ``%``).
Conditions
    ``Pred`` (const, not-const, dtype) and ``Cmp``.  The surface forms
    ``(rank ?v N)`` and ``(same-shape ?a ?b)`` arrive as ``Cmp("=", Rank(v), N)`` and
    ``Cmp("=", ShapeOf(a), ShapeOf(b))``.

Every node has a ``loc`` (its source token, ``None`` when built by hand) that is left
out of equality, hashing and repr; so is ``Rule.source`` and ``Rule.bidirectional_of``
(provenance, not meaning), which makes hand-built IR compare equal to parsed IR.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


def _loc():
    return field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int  # 1-based
    column: int  # 1-based, in characters

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


class RuleError(Exception):
    """A syntax or semantic error in a rule file, at the offending token."""

    def __init__(self, file: str, line: int, column: int, reason: str):
        super().__init__(f"{file}:{line}:{column}: {reason}")
        self.file, self.line, self.column, self.reason = file, line, column, reason

    @classmethod
    def at(cls, loc: SourceLoc, reason: str) -> RuleError:
        return cls(loc.file, loc.line, loc.column, reason)


# ---------------------------------------------------------------- terms and values


@dataclass(frozen=True)
class Var:
    """A pattern variable ``?name`` (the name without the ``?``)."""

    name: str
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class Absent:
    """An absent optional input (``_``, or an optional input omitted at the end)."""

    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class Lit:
    """A literal: int, float or str."""

    value: int | float | str
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class ListOf:
    """A list attribute value ``(1 2 ?n)``: literals and attribute variables."""

    items: tuple[Lit | Var, ...]
    loc: SourceLoc | None = _loc()


AttrValue = Union[Lit, ListOf, Var]


@dataclass(frozen=True)
class Term:
    """An operator application ``(op :attr value ... children...)``."""

    op: str  # catalog op_type, ONNX spelling, or "getitem"
    attrs: tuple[tuple[str, AttrValue], ...] = ()
    children: tuple[Term | Var | Absent, ...] = ()
    index: int | None = None  # getitem only: which output of the tuple child
    loc: SourceLoc | None = _loc()  # the op name token
    attr_locs: tuple[SourceLoc | None, ...] = field(default=(), compare=False, repr=False)  # the :name tokens


# ---------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Dim:
    """``(dim ?v i)``: dimension i of ?v's shape (negative i counts from the end)."""

    var: Var
    index: int
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class Size(Dim):
    """``(size ?v i)``: dimension i of ?v's shape as it is stored, a symbol where the dim is dynamic (``dim``
    is no number there). ``*`` of a size and a number is a product dim (``batch * 197``); other arithmetic
    on a symbol, and orderings, prove nothing. A value computed from a size may stand only in a dims
    attribute on the right side (Reshape's ``:shape``) or in an equality."""


@dataclass(frozen=True)
class Rank:
    """``(rank ?v)``: the number of dimensions of ?v."""

    var: Var
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class Numel:
    """``(numel ?v)``: the number of elements of ?v."""

    var: Var
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class ShapeOf:
    """``(shape ?v)``: the whole shape of ?v as a list of ints."""

    var: Var
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class BinOp:
    """``(op l r)`` with op one of ``+ - * / %`` (``/`` floors, ``%`` as Python)."""

    op: str
    left: Expr
    right: Expr
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class ListExpr:
    """``(list e1 e2 ...)``: a list built from expressions."""

    items: tuple[Expr, ...]
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class Len:
    """``(len e)``: the length of a list-valued expression."""

    expr: Expr
    loc: SourceLoc | None = _loc()


Expr = Union[Lit, Var, Dim, Size, Rank, Numel, ShapeOf, BinOp, ListExpr, Len]


# ---------------------------------------------------------------- conditions and rules

CMP_OPS = ("=", "!=", "<", "<=", ">", ">=")
ARITH_OPS = ("+", "-", "*", "/", "%")

# dtype names accepted by (dtype ?v NAME) -> ONNX TensorProto element type
DTYPES: dict[str, int] = {
    "float32": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7, "string": 8,
    "bool": 9, "float16": 10, "float64": 11, "uint32": 12, "uint64": 13, "complex64": 14,
    "complex128": 15, "bfloat16": 16,
}  # fmt: skip


FILLS = {"zeros": 0.0, "ones": 1.0}  # the value predicates: the one value of every element of the constant


@dataclass(frozen=True)
class Pred:
    """A predicate on an e-class: kind ``const`` | ``not-const`` | ``dtype`` (then ``dtype`` is the ONNX code)
    | ``zeros`` | ``ones`` (a constant whose every element is 0, resp. 1: a weight whose elements are all that
    value, or a scalar Constant of it) | ``dynamic`` (a dim of its shape is a symbol: for a rewrite that pays
    only where the runtime cannot see the shapes, as ONNX Runtime fuses MatMul+Add only over static ones)."""

    kind: str
    var: Var
    dtype: int | None = None
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class Cmp:
    """A comparison ``(op l r)``, op in ``CMP_OPS``; lists compare element-wise and by length."""

    op: str
    left: Expr
    right: Expr
    loc: SourceLoc | None = _loc()


Condition = Union[Pred, Cmp]


@dataclass(frozen=True)
class Let:
    """``(let ?var e)``: binds a new attribute variable for the conditions and the right side."""

    var: Var
    expr: Expr
    loc: SourceLoc | None = _loc()


@dataclass(frozen=True)
class Rule:
    """One core (one-directional) rule; see the module docstring for its meaning."""

    name: str
    patterns: tuple[Term, ...]
    rhs: tuple[Term | Var, ...]
    conditions: tuple[Condition, ...] = ()
    lets: tuple[Let, ...] = ()
    source: SourceLoc | None = _loc()  # the NAME: token
    # the name of the `<=>` declaration this rule was desugared from, set on both
    # directions (NAME and NAME-rev); None for a `=>` rule
    bidirectional_of: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RuleSet:
    """The rules of one file, in file order (a ``<=>`` rule gives NAME then NAME-rev); an
    ``include`` puts the included rules at its place, in their order, each keeping the
    ``source`` of its definition (in the included file)."""

    name: str  # the file's stem
    rules: tuple[Rule, ...]
    source: str  # the file name
    # provenance, left out of equality: per rule, the location of the ``include`` that brought it
    # into this file (the set name or path token), None for a rule written here (empty: all written
    # here); and every rule file read to make the set, this one first, then the included ones
    # transitively, each once, in the order first read
    included_at: tuple[SourceLoc | None, ...] = field(default=(), compare=False, repr=False)
    files: tuple[str, ...] = field(default=(), compare=False, repr=False)
