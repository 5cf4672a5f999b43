"""Rules that are instances of other rules: what a rule set can leave out without losing a rewrite.

Rule B is an *instance* of rule A when one substitution of A's variables turns A's patterns into B's (pattern by
pattern, in order), A's right side into B's, and each of A's conditions into one of B's conditions. Then every match
of B is a match of A (A's conditions hold wherever B's do) and builds the same right side, so in the same round A adds
every node and union that B would: B adds nothing to the e-graph. Examples from a generated set:

    (getitem 0 (Split :axis 0 :split (?n ?n) (Concat :axis 0 ?x ?x))) => ?x      an instance of the same with ?x ?y
    (Add ?x (Add ?y ?s)) => (Add ?y (Add ?x ?s))  if (const ?s)                   an instance of the same over ?z
    (Add ?y (Add ?x ?z)) => (Add ?x (Add ?y ?z))                                  a renaming of the one above

Two rules that are instances of each other (renamings, with the same conditions) cover each other: the one whose
name sorts first is kept. The test is syntactic: a substitution maps variables to terms, attribute literals and
variables (never to an absent input; a variable met twice to a term only where that term gives every attribute);
conditions are compared as written after it, and a pair of patterns that A matches in one order only (mirrored)
must be mirrored in B too. It never calls a rule redundant that is not, but it does not
find every consequence (a rule that needs two others in a row stays). Rules with ``let`` bindings are kept as they
are (their bound variables are computed, not matched).

Leaving an instance out keeps the e-graph of a saturating run; under a node limit or the backoff scheduler the
rounds can differ, as with any other change to a rule set (the covering rule has at least as many matches, so it is
banned or cut where the instance alone might not be).

    instance(b, a) -> bool
    redundant(rules) -> {name of a rule left out: name of a rule kept that it is an instance of}
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import fields, is_dataclass, replace

from relsat.relations.catalog import BY_TYPE

from .compiler import mirrored
from .ir import Absent, ListOf, Lit, Rule, Term, Var
from .parser import format_term

__all__ = ["instance", "redundant"]


def _same_lit(a: Lit, b: Lit) -> bool:
    return type(a.value) is type(b.value) and a.value == b.value


def _closed(t) -> bool:
    """Whether every node ``t`` matches is one e-class wherever ``t``'s variables are: each term in it gives every
    attribute of its op (a term that leaves one free matches nodes of different e-classes over the same children,
    ``(Softmax ?y)`` at two axes)."""
    if not isinstance(t, Term):
        return True
    op = BY_TYPE[t.op]
    given = dict(t.attrs)
    return (all(a.name in given for a in op.attrs if not (t.op == "getitem" and a.name == "index"))
            and all(_closed(c) for c in t.children))


def _match(p, t, sub: dict) -> bool:
    """Extend ``sub`` (variable name -> node of the other rule) so that ``p`` under it is ``t``. A variable never
    stands for an absent input (the compiled join asks a present one), and a variable met twice stands for a term
    only where that term's nodes are one e-class (``_closed``): the two places then hold one e-class, as the
    variable asks."""
    if isinstance(p, Var):
        if isinstance(t, Absent):
            return False
        bound = sub.get(p.name)
        if bound is None:
            sub[p.name] = t
            return True
        return format_term(bound) == format_term(t) and _closed(t)
    if isinstance(p, Absent):
        return isinstance(t, Absent)
    if isinstance(p, Lit):
        return isinstance(t, Lit) and _same_lit(p, t)
    if isinstance(p, ListOf):
        return (isinstance(t, ListOf) and len(p.items) == len(t.items)
                and all(_match(x, y, sub) for x, y in zip(p.items, t.items)))
    if isinstance(p, Term):
        return (isinstance(t, Term) and p.op == t.op and p.index == t.index and len(p.attrs) == len(t.attrs)
                and len(p.children) == len(t.children)
                and all(n == m and _match(v, w, sub) for (n, v), (m, w) in zip(p.attrs, t.attrs))
                and all(_match(x, y, sub) for x, y in zip(p.children, t.children)))
    return False


def _spell(node, sub: dict) -> str:
    """``node`` under ``sub``, in the surface syntax (``format_term``, whose variables are spelled ``?name``)."""
    return format_term(_apply(node, sub))


def _apply(node, sub: dict):
    """``node`` with its variables replaced by what ``sub`` maps them to (IR nodes, rebuilt where they change)."""
    if isinstance(node, Var):
        return sub.get(node.name, node)
    if isinstance(node, ListOf):
        return ListOf(tuple(_apply(x, sub) for x in node.items))
    if isinstance(node, Term):
        return Term(node.op, tuple((n, _apply(v, sub)) for n, v in node.attrs),
                    tuple(_apply(c, sub) for c in node.children), node.index)
    if is_dataclass(node):  # a condition or an expression: its parts replaced field by field
        changes = {}
        for f in fields(node):
            value = getattr(node, f.name)
            if isinstance(value, tuple):
                changes[f.name] = tuple(_apply(v, sub) for v in value)
            elif is_dataclass(value) and not isinstance(value, type):
                changes[f.name] = _apply(value, sub)
        return replace(node, **changes) if changes else node
    return node


def instance(b: Rule, a: Rule) -> bool:
    """Whether ``b`` is an instance of ``a`` (module docstring). Where ``a`` matches two patterns in one order only
    (``compiler.mirrored``: a swap of them gives the same application), ``b`` must too, or ``b`` applies in the
    other order as well, which ``a`` never does."""
    if a.lets or b.lets or len(a.patterns) != len(b.patterns) or len(a.rhs) != len(b.rhs):
        return False
    sub: dict = {}
    if not all(_match(p, t, sub) for p, t in zip(a.patterns, b.patterns)):
        return False
    if [_spell(x, sub) for x in a.rhs] != [format_term(x) for x in b.rhs]:
        return False
    given = {format_term(c) for c in b.conditions}
    if not all(_spell(c, sub) in given for c in a.conditions):
        return False
    # (the mirror test, a unification per pair of patterns, last: only for the few pairs that got this far)
    pairs = [(i, j) for i in range(len(a.patterns)) for j in range(i + 1, len(a.patterns))]
    return not any(mirrored(a, i, j) and not mirrored(b, i, j) for i, j in pairs)


def _root(r: Rule) -> tuple:
    """Rules with different roots cannot be instances of each other: the pairs tried are those with the same root."""
    first = r.patterns[0] if r.patterns else None
    return len(r.patterns), len(r.rhs), (first.op, first.index) if isinstance(first, Term) else None


def redundant(rules: Iterable[Rule]) -> dict[str, str]:
    """The rules of ``rules`` that are instances of another one there, each with the name of one it is an instance
    of that is not left out itself. Of rules that are instances of each other, the one whose name sorts first stays.
    Every rule left out is an instance of a rule kept (being an instance is transitive, and a rule is left out only
    for a more general one or for a renaming named before it)."""
    groups: dict[tuple, list[Rule]] = defaultdict(list)
    for r in rules:
        groups[_root(r)].append(r)
    cover: dict[str, Rule] = {}
    for group in groups.values():
        group.sort(key=lambda r: r.name)
        for b in group:
            for a in group:
                if a is not b and instance(b, a) and (a.name < b.name or not instance(a, b)):
                    cover[b.name] = a
                    break
    out = {}
    for name, a in cover.items():
        while a.name in cover:  # a rule kept stands for it (the chain ends: each step is more general or named first)
            a = cover[a.name]
        out[name] = a.name
    return out
