"""Semantic checks of core rules against the operator catalog.

Owns every check that needs meaning rather than syntax: known operators, arity and
absent inputs, known attributes and their value kinds, required attributes on the
right side, tuple-valued operators only under ``getitem``, the number of right terms,
pattern roots, variable roles (e-class vs attribute value) and binding (right-side,
condition and let variables bound by the left side or an earlier let; no let
redefining a variable), and unique rule names (also across included files).  Errors
are ``RuleError`` at the offending node; errors in the generated reverse of a ``<=>``
rule say so.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from relsat.programs.ir import (
    Absent, BinOp, Cmp, Dim, Len, ListExpr, ListOf, Lit, Numel, Pred, Rank, Rule, RuleError, RuleSet, ShapeOf,
    Size, SourceLoc, Term, Var,
)  # fmt: skip
from relsat.relations import catalog

ECLASS, ATTR = "eclass", "attr"
_ROLE_NAMES = {ECLASS: "an e-class (an input)", ATTR: "an attribute value"}
_KIND_NAMES = {"int": "an int", "float": "a float", "string": "a string", "ints": "a list of ints",
               "floats": "a list of floats"}  # fmt: skip
_SCALARS = {"int": (int,), "float": (int, float), "string": (str,)}
_TYPE_NAMES = {int: "an int", float: "a float", str: "a string"}


def variables(node, role: str = ATTR) -> Iterator[tuple[Var, str]]:
    """Every variable occurrence under an IR node (not a Let or Rule), in order, with its role.

    ``role`` is the role of ``node`` itself when it is a bare ``Var``: pass ``ECLASS``
    for a pattern or right-side root.
    """
    match node:
        case Var():
            yield node, role
        case Term(attrs=attrs, children=children):
            for _, value in attrs:
                yield from variables(value)
            for child in children:
                yield from variables(child, ECLASS)
        case ListOf(items=items) | ListExpr(items=items):
            for item in items:
                yield from variables(item)
        case Dim(var=var) | Rank(var=var) | Numel(var=var) | ShapeOf(var=var) | Pred(var=var):
            yield var, ECLASS
        case BinOp(left=left, right=right) | Cmp(left=left, right=right):
            yield from variables(left)
            yield from variables(right)
        case Len(expr=expr):
            yield from variables(expr)


def check_ruleset(ruleset: RuleSet) -> None:
    """Raise ``RuleError`` for the first problem in the rule set.

    A rule that an ``include`` brought in (``ruleset.included_at``) was checked when its own file
    was loaded; here it takes part in the unique-name check only, which reports a clash that an
    include makes at that include.
    """
    origins = ruleset.included_at or (None,) * len(ruleset.rules)
    seen: dict[str, tuple[Rule, SourceLoc | None]] = {}
    for rule, via in zip(ruleset.rules, origins, strict=True):
        if rule.name in seen:
            first, first_via = seen[rule.name]
            where = f"{first.source}" + (f", included at {first_via}" if first_via else "")
            if via is None:
                raise _Checker(rule).error(rule.source, f"duplicate rule name {rule.name!r} (first defined at {where})")
            raise RuleError.at(via, f"duplicate rule name {rule.name!r}: this include brings the rule defined at "
                               f"{rule.source}, but the set already has one (defined at {where})")
        seen[rule.name] = (rule, via)
        if via is None:
            _Checker(rule).check()


class _Checker:
    def __init__(self, rule: Rule):
        self.rule = rule

    def error(self, where, reason: str) -> RuleError:
        """A RuleError at ``where`` (a node or a SourceLoc), falling back to the rule's position."""
        rule = self.rule
        loc = where if isinstance(where, SourceLoc) else getattr(where, "loc", None)
        if rule.bidirectional_of and rule.name != rule.bidirectional_of:
            reason += f" (in {rule.name}, the reverse direction of the <=> rule {rule.bidirectional_of})"
        return RuleError.at(loc or rule.source or SourceLoc("<ir>", 0, 0), reason)

    def check(self) -> None:
        rule = self.rule
        if len(rule.rhs) != len(rule.patterns):
            n, m = len(rule.patterns), len(rule.rhs)
            where = rule.rhs[n] if m > n else rule.patterns[m]
            raise self.error(where, f"{n} left pattern(s) but {m} right term(s); "
                             "the i-th right term replaces the i-th pattern")
        for pattern in rule.patterns:
            if not isinstance(pattern, Term):
                raise self.error(pattern, "the root of a left pattern must be an operator term, not a variable")
            self.term(pattern, right=False)
        for term in rule.rhs:
            self.term(term, right=True)
        self.scopes()
        self.sizes()

    def term(self, node, right: bool) -> None:
        if not isinstance(node, Term):
            return
        op = catalog.BY_TYPE.get(node.op)
        if op is None:
            close = difflib.get_close_matches(node.op, catalog.BY_TYPE, n=1)
            raise self.error(node, f"unknown operator {node.op!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
        if node.op == "getitem" and (node.index is None or node.index < 0):
            raise self.error(node, "getitem takes a non-negative integer index first, e.g. (getitem 0 ?t)")
        self.attrs(node, op, right)
        self.arity(node, op)
        for child in node.children:
            child_op = catalog.BY_TYPE.get(child.op) if isinstance(child, Term) else None
            if child_op and child_op.is_tuple != (node.op == "getitem"):
                raise self.error(child, f"getitem takes a tuple-valued input; {child.op} has one output"
                                 if node.op == "getitem" else
                                 f"{child.op} yields a tuple; select one output with (getitem i ...)")
            self.term(child, right)

    def attrs(self, node: Term, op: catalog.OpDef, right: bool) -> None:
        known = {} if node.op == "getitem" else {a.name: a for a in op.attrs}
        locs = node.attr_locs or (node.loc,) * len(node.attrs)
        given: set[str] = set()
        for (name, value), loc in zip(node.attrs, locs):
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean :{close[0]}?" if close else f"it has {', '.join(known) or 'none'}"
                raise self.error(loc, f"{node.op} has no attribute :{name}; {hint}")
            if name in given:
                raise self.error(loc, f"attribute :{name} given twice")
            given.add(name)
            kind = known[name].kind
            bad = _bad_value(value, kind)
            if bad is not None:
                raise self.error(bad, f"attribute :{name} of {node.op} takes {_KIND_NAMES[kind]}, got {_describe(bad)}")
        missing = [a.name for a in known.values() if a.name not in given and a.default is catalog.REQUIRED]
        if right and missing:
            raise self.error(node, f"{node.op} on the right side needs {' '.join(':' + m for m in missing)} "
                             "(no default; give it explicitly)")

    def arity(self, node: Term, op: catalog.OpDef) -> None:
        inputs, n = op.inputs, len(node.children)
        if op.variadic:
            inputs = inputs[:-1] + (inputs[-1],) * max(1, n - len(inputs) + 1)
        if n > len(inputs):
            names = ", ".join(i.name + "?" * i.optional for i in inputs)
            raise self.error(node.children[len(inputs)], f"{node.op} takes {len(inputs)} input(s) ({names}), got {n}")
        for i, spec in enumerate(inputs):
            child = node.children[i] if i < n else None
            if child is None and not spec.optional:
                raise self.error(node, f"{node.op} needs at least one input" if spec.variadic
                                 else f"{node.op} is missing its required input {spec.name}")
            if isinstance(child, Absent) and not spec.optional:
                raise self.error(child, f"input {spec.name} of {node.op} is required; "
                                 "'_' marks an absent optional input")

    def scopes(self) -> None:
        rule, roles, bound = self.rule, {}, set()

        def see(var: Var, role: str, unbound: str | None) -> None:
            if unbound and var.name not in bound:
                raise self.error(var, f"?{var.name} {unbound}")
            prior = roles.setdefault(var.name, role)
            if prior != role:
                raise self.error(var, f"?{var.name} is used as {_ROLE_NAMES[role]} here "
                                 f"but as {_ROLE_NAMES[prior]} before")

        for pattern in rule.patterns:
            for var, role in variables(pattern, ECLASS):
                see(var, role, None)
                bound.add(var.name)
        for let in rule.lets:
            for var, role in variables(let.expr):
                see(var, role, "in a let is not bound by the left side or an earlier let")
            if let.var.name in bound:
                raise self.error(let.var, f"let redefines ?{let.var.name}, which is already bound")
            see(let.var, ATTR, None)
            bound.add(let.var.name)
        for cond in rule.conditions:
            for var, role in variables(cond):
                see(var, role, "in a condition is not bound by the left side or a let")
        for term in rule.rhs:
            for var, role in variables(term, ECLASS):
                see(var, role, "on the right side is not bound by the left side or a let")

    def sizes(self) -> None:
        """A value computed from a ``size`` (a symbol where the dim is dynamic) stands on the right side only in a
        dims attribute (Reshape's :shape), where a symbol is a dim; anywhere else it would be read as a number."""
        symbolic: set[str] = set()
        for let in self.rule.lets:
            if any(isinstance(n, Size) for n in _walk(let.expr)) or any(v.name in symbolic for v, _ in variables(let.expr)):
                symbolic.add(let.var.name)

        def visit(node) -> None:
            if not isinstance(node, Term):
                return
            op = catalog.BY_TYPE[node.op]
            dims = {a.name for a in op.attrs if a.dims} if node.op != "getitem" else set()
            for name, value in node.attrs:
                for var, _ in variables(value):
                    if var.name in symbolic and name not in dims:
                        raise self.error(var, f"?{var.name} is computed from a size (a symbol where the dim is "
                                         f"dynamic): only a dims attribute such as Reshape's :shape takes it, not "
                                         f":{name} of {node.op}")
            for child in node.children:
                visit(child)

        for term in self.rule.rhs:
            visit(term)


def _walk(e):
    """``e`` and every expression under it."""
    yield e
    match e:
        case BinOp(left=left, right=right):
            yield from _walk(left)
            yield from _walk(right)
        case ListExpr(items=items):
            for i in items:
                yield from _walk(i)
        case Len(expr=expr):
            yield from _walk(expr)


def _bad_value(value, kind: str):
    """The offending node when ``value`` does not fit an attribute of ``kind``, else None."""
    match value:
        case Var():
            return None
        case Lit(value=v):
            return None if type(v) in _SCALARS.get(kind, ()) else value
        case ListOf(items=items) if kind in ("ints", "floats"):
            return next((i for i in items if _bad_value(i, kind[:-1]) is not None), None)
    return value


def _describe(node) -> str:
    if isinstance(node, Lit):
        return f"{_TYPE_NAMES.get(type(node.value), 'a value')} {node.value!r}"
    return "a list"
