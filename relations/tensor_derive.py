"""EinNet's derivation rules over tensor expressions (relations/tensor_expr.py): new equivalent programs.

Each rule takes a ``Program`` and gives the programs it derives (possibly none); ``derive`` applies
the rules to a program breadth-first to a depth, keeps each distinct result once (by canonical
form) and *checks every derived program numerically* against the original on random inputs before
it is returned: a derivation that is not exact for these inputs is dropped, whatever the rule
claimed. Implemented here:

* **summation splitting** (EinNet's expression splitting, with variable substitution):
  ``Σ_{S} A[..] · B[..]`` with a summation iterator ``c`` read by both factors becomes an
  intermediate ``T = Σ_c A·B`` over the factors' own axes, read by the rest ``Σ_{S - c} T[τ]``,
  where every affine index of a factor (``oh + r - p``) becomes a fresh iterator of ``T`` over that
  axis and ``τ`` puts the affine index back: a k x k convolution becomes a MatMul over channels
  followed by a sum of k^2 shifted slices (the seed's motivating example).
* **expression merging** (inlining, the way back): a step read by exactly one later step is
  substituted into it, its summation iterators joining the reader's.
* **variable substitution by blocks** (``split_scope``): ``i = B·ib + ii`` on an output iterator, the
  blocked tensor then reshaped back; and **access splitting** (``split_access``): an access with a
  non-plain index becomes a gather step of its own (a Reshape, a window of overlapping blocks), so the
  rest is a plain product again (a MatMul over blocks).

``canonical(program)`` orders the factors of products (and terms of sums) by tensor, renames iterators
by role and order of first use (scope ``o<k>``, summations ``s<k>``) and orders index terms, so that
programs equal up to naming and commutation compare equal: a derivation
that comes back to an operator's own expression is recognised by ``tensor_match`` as that operator.
"""

from __future__ import annotations

import itertools

import numpy as np

from .tensor_expr import Access, Call, Const, Expr, Index, Iter, Program, Term, accesses, evaluate


# -- canonical form -------------------------------------------------------------------------------------


def _map_term(t: Term, fa) -> Term:
    if isinstance(t, Access):
        return fa(t)
    if isinstance(t, Call):
        return Call(t.op, tuple(_map_term(a, fa) for a in t.args))
    return t


def _rename_index(ix: Index, names: dict) -> Index:
    terms = tuple(sorted(((names[t[0]], *t[1:]) for t in ix.terms), key=lambda t: (t[0][0] != "o", t[0], t[1:])))
    return Index(terms, ix.const, ix.div, ix.exact, ix.mod)


def _sorted_products(t: Term) -> Term:
    """``t`` with every Mul and Add flattened and its arguments ordered (accesses by tensor name, then the rest)."""
    if not isinstance(t, Call):
        return t
    args = tuple(_sorted_products(a) for a in t.args)
    if t.op in ("Mul", "Add"):  # associative too: a product of products is one product
        args = tuple(b for a in args for b in (a.args if isinstance(a, Call) and a.op == t.op else (a,)))
        args = tuple(sorted(args, key=lambda a: (0, a.tensor) if isinstance(a, Access) else (1, "")))
    return Call(t.op, args)


def canonical_expr(e: Expr) -> Expr:
    e = Expr(e.scope, e.sums, _sorted_products(e.body), e.combine)
    names = {i.name: f"o{k}" for k, i in enumerate(e.scope)}
    order = []
    for a in accesses(e.body):
        for ix in a.index:
            for t in ix.terms:
                if t[0] not in names and t[0] not in order:
                    order.append(t[0])
    order += [s.name for s in e.sums if s.name not in order]
    names.update({n: f"s{k}" for k, n in enumerate(order)})
    extent = {s.name: s.extent for s in e.sums}
    body = _map_term(e.body, lambda a: Access(a.tensor, tuple(_rename_index(ix, names) for ix in a.index), a.pad))
    return Expr(tuple(Iter(names[i.name], i.extent) for i in e.scope),
                tuple(Iter(names[n], extent[n]) for n in order), body, e.combine)


def canonical(p: Program) -> Program:
    return Program(p.inputs, tuple((n, canonical_expr(e)) for n, e in p.steps))


# -- summation splitting -----------------------------------------------------------------------------------


def _affine(ix: Index) -> bool:
    return ix.div == 1 and ix.mod is None and all(len(t) == 2 for t in ix.terms)


def split_summation(p: Program, step: int, over: str, name: str = "split") -> Program | None:
    """Split summation iterator ``over`` of step ``step`` (a product of accesses) into its own step: the factors
    that read ``over`` are summed over it into ``T`` (indexed by their other iterators: a plain one keeps its
    name and range, an affine index becomes a fresh iterator over the axis it reads), and the step becomes
    the product of ``T`` and the other factors, summed over the other iterators."""
    out_name, e = p.steps[step]
    if e.combine != "sum" or over not in {s.name for s in e.sums}:
        return None
    factors = list(e.body.args) if isinstance(e.body, Call) and e.body.op == "Mul" else [e.body]
    if not all(isinstance(f, Access) and all(_affine(ix) for ix in f.index) for f in factors):
        return None
    using = [f for f in factors if any(t[0] == over for ix in f.index for t in ix.terms)]
    others = [f for f in factors if f not in using]
    if not using or any(f.pad != 0.0 for f in using):
        return None  # T reads 0 outside its range: exact only when the factors it sums pad with 0
    shapes = dict(p.inputs) | {n: x.shape for n, x in p.steps}
    extent = {i.name: i.extent for i in (*e.scope, *e.sums)}
    fresh = (f"{name}.i{k}" for k in itertools.count())
    t_scope, outer_index, new_factors = [], [], []
    for f in using:
        idx = []
        for ix, axis in zip(f.index, shapes[f.tensor]):
            plain = ix.plain()
            if plain == over:
                idx.append(ix)
                continue
            if any(t[0] == over for t in ix.terms):
                return None  # the summed iterator inside an affine index: not separable here
            if plain is None:  # an affine index: a fresh iterator of T over the axis; T's reader puts it back
                it = Iter(next(fresh), axis)
                t_scope.append(it)
                outer_index.append(ix)
                idx.append(Index.of(it.name))
                continue
            if plain not in {i.name for i in t_scope}:
                t_scope.append(Iter(plain, extent[plain]))
                outer_index.append(ix)
            idx.append(ix)
        new_factors.append(Access(f.tensor, tuple(idx), f.pad))
    if len(e.sums) == 1 and not others and all(ix.plain() for ix in outer_index):
        return None  # nothing would be left to the reader but a copy
    t_name = f"{out_name}.{name}"
    over_iter = next(s for s in e.sums if s.name == over)
    t_body = new_factors[0] if len(new_factors) == 1 else Call("Mul", tuple(new_factors))
    t_expr = Expr(tuple(t_scope), (over_iter,), t_body)
    read = Access(t_name, tuple(outer_index))
    rest = Expr(e.scope, tuple(s for s in e.sums if s.name != over),
                read if not others else Call("Mul", (read, *others)))
    steps = list(p.steps)
    steps[step:step + 1] = [(t_name, t_expr), (out_name, rest)]
    return Program(p.inputs, tuple(steps))


# -- expression merging -------------------------------------------------------------------------------------


def _substitute(ix: Index, values: dict[str, Index]) -> Index | None:
    """``ix`` with each iterator replaced by an affine index (None when the result is not affine)."""
    if not _affine(ix):
        return None
    terms: dict[str, int] = {}
    const = ix.const
    for n, c in ix.terms:
        v = values.get(n)
        if v is None:
            terms[n] = terms.get(n, 0) + c
            continue
        if not _affine(v):
            return None
        const += c * v.const
        for m, d in v.terms:
            terms[m] = terms.get(m, 0) + c * d
    return Index(tuple((n, c) for n, c in terms.items() if c), const)


def _factor(body: Term, acc: Access) -> bool:
    """Whether ``acc`` is ``body`` or a factor of its product (a tree of Mul)."""
    if body == acc:
        return True
    return isinstance(body, Call) and body.op == "Mul" and any(_factor(a, acc) for a in body.args)


def inline(p: Program, step: int) -> Program | None:
    """Substitute step ``step`` into its only reader, when the reader reads it once with affine indices and
    every index stays in the producer's range wherever the producer's inputs are in theirs."""
    name, e = p.steps[step]
    readers = [(k, r) for k, (n, r) in enumerate(p.steps) if any(a.tensor == name for a in accesses(r.body))]
    if len(readers) != 1 or step == len(p.steps) - 1:
        return None
    k, r = readers[0]
    reads = [a for a in accesses(r.body) if a.tensor == name]
    if len(reads) != 1:
        return None  # read twice (x·x): substituting one read would leave the other reading nothing
    acc = reads[0]
    if acc.pad != 0.0 or not all(_affine(ix) for ix in acc.index):
        return None
    if e.sums and not (e.combine == "sum" and r.combine == "sum" and _factor(r.body, acc)):
        return None  # a sum moves into its reader only where the reader is a product of it (distributivity)
    if e.sums and r.sums and e.combine != r.combine:
        return None
    taken = {i.name for i in (*r.scope, *r.sums)}
    rename = {s.name: f"{s.name}.{name}" if s.name in taken else s.name for s in e.sums}
    values = {i.name: ix for i, ix in zip(e.scope, acc.index)}
    values.update({old: Index.of(new) for old, new in rename.items()})

    def fa(a: Access) -> Access:
        idx = tuple(_substitute(ix, values) for ix in a.index)
        if any(ix is None for ix in idx):
            raise ValueError("not affine")
        return Access(a.tensor, idx, a.pad)

    try:
        body = _map_term(e.body, fa)
    except ValueError:
        return None
    merged = Expr(r.scope, (*r.sums, *(Iter(rename[s.name], s.extent) for s in e.sums)),
                  _map_term(r.body, lambda a: body if a == acc else a), r.combine)
    steps = [s for j, s in enumerate(p.steps) if j != step]
    steps[k - 1] = (p.steps[k][0], merged)
    return Program(p.inputs, tuple(steps))


# -- variable substitution: blocking an iterator, and gathers split out of accesses ------------------------------


def split_scope(p: Program, step: int, iterator: str, block: int) -> Program | None:
    """Variable substitution ``i = block·ib + ii`` of a scope iterator (its extent a multiple of ``block``):
    the step computes the blocked tensor (``i``'s axis becomes two), and a Reshape step gives the old shape."""
    name, e = p.steps[step]
    pos = next((k for k, i in enumerate(e.scope) if i.name == iterator), None)
    if pos is None or block <= 1 or e.scope[pos].extent % block or e.scope[pos].extent == block:
        return None
    ib, ii = f"{iterator}.b", f"{iterator}.i"
    value = Index(((ib, block), (ii, 1)))
    try:
        body = _map_term(e.body, lambda a: Access(a.tensor, tuple(_subst_or_fail(ix, {iterator: value})
                                                                  for ix in a.index), a.pad))
    except ValueError:
        return None
    n = e.scope[pos].extent
    scope = (*e.scope[:pos], Iter(ib, n // block), Iter(ii, block), *e.scope[pos + 1:])
    blocked = f"{name}.blocked"
    back = tuple(Index.of(f"o{k}") for k in range(pos)) + (
        Index(((f"o{pos}", 1),), 0, block, False), Index(((f"o{pos}", 1),), 0, 1, False, block)) + tuple(
        Index.of(f"o{k}") for k in range(pos + 1, len(e.scope)))
    reshape = Expr(tuple(Iter(f"o{k}", i.extent) for k, i in enumerate(e.scope)), (), Access(blocked, back))
    steps = list(p.steps)
    steps[step:step + 1] = [(blocked, Expr(scope, e.sums, body, e.combine)), (name, reshape)]
    return Program(p.inputs, tuple(steps))


def _subst_or_fail(ix: Index, values: dict[str, Index]) -> Index:
    if not any(t[0] in values for t in ix.terms):
        return ix
    got = _substitute(ix, values)
    if got is None:
        raise ValueError("not affine")
    return got


def split_access(p: Program, step: int, which: int, order: str = "use") -> Program | None:
    """Expression splitting of one access ``T[τ]`` whose index is not plain: a new step ``G = T[τ]`` over the
    iterators ``τ`` uses (a gather: a Reshape, a window, a slice), and the access becomes ``G`` read plainly.
    ``order`` lays out ``G``'s axes: ``use`` (as ``τ`` first uses them), ``scope`` (the reader's output
    order, then its summation iterators: a MatMul's left operand), ``sums-last-but-one`` (the summation
    iterators before the reader's last output iterator: a MatMul's right operand)."""
    name, e = p.steps[step]
    accs = accesses(e.body)
    if which >= len(accs) or all(ix.plain() for ix in accs[which].index):
        return None
    acc = accs[which]
    used = []
    for ix in acc.index:
        for t in ix.terms:
            if t[0] not in used:
                used.append(t[0])
    if order != "use":
        scope = [i.name for i in e.scope if i.name in used]
        sums = [s.name for s in e.sums if s.name in used]
        used = scope + sums if order == "scope" or not scope else scope[:-1] + sums + scope[-1:]
    extent = {i.name: i.extent for i in (*e.scope, *e.sums)}
    g_name = f"{name}.gather{which}"
    gather = Expr(tuple(Iter(n, extent[n]) for n in used), (), acc)
    plain = Access(g_name, tuple(Index.of(n) for n in used))
    count = iter(range(len(accs)))
    body = _map_term(e.body, lambda a: plain if next(count) == which else a)
    steps = list(p.steps)
    steps[step:step + 1] = [(g_name, gather), (name, Expr(e.scope, e.sums, body, e.combine))]
    return Program(p.inputs, tuple(steps))


# -- checking and the derivation loop ----------------------------------------------------------------------------


def equivalent(a: Program, b: Program, draws: int = 2, seed: int = 0, rtol: float = 1e-4, atol: float = 1e-5,
               fixed: dict | None = None) -> bool:
    """Whether two programs over the same inputs agree on ``draws`` random inputs (standard normal), the inputs
    in ``fixed`` at their given values (a constant the derivation relied on)."""
    rng = np.random.default_rng(seed)
    for _ in range(draws):
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in a.inputs}
        feeds.update(fixed or {})
        x, y = evaluate(a, feeds), evaluate(b, feeds)
        if x.shape != y.shape or not np.allclose(x, y, rtol=rtol, atol=atol):
            return False
    return True


RULES = {
    "split-summation": lambda p: [q for k, (_, e) in enumerate(p.steps) for s in e.sums
                                  if (q := split_summation(p, k, s.name, f"split{k}")) is not None],
    "merge": lambda p: [q for k in range(len(p.steps)) if (q := inline(p, k)) is not None],
    "split-access": lambda p: [q for k, (_, e) in enumerate(p.steps) for j in range(len(accesses(e.body)))
                               if (q := split_access(p, k, j)) is not None],
}
# split_scope (blocking) takes a block size: applied by the derivations that choose one (not in the blind loop)


def derive(p: Program, depth: int = 2, rules=tuple(RULES)) -> dict[Program, list[str]]:
    """Every distinct program the rules reach from ``p`` within ``depth`` steps, checked equivalent to ``p``
    numerically, each with the rules that derived it."""
    start = canonical(p)
    seen = {start: []}
    frontier = [start]
    for _ in range(depth):
        nxt = []
        for q in frontier:
            for rule in rules:
                for r in RULES[rule](q):
                    c = canonical(r)
                    if c not in seen and equivalent(start, c):
                        seen[c] = [*seen[q], rule]
                        nxt.append(c)
        frontier = nxt
    del seen[start]
    return seen
