"""Mask-aware derivations (issue 28 item 3): computation whose result a constant mask throws away is not done.

A constant additive mask ``M[i, j]`` whose entries outside a band are *annihilating* (so negative that
``exp`` of anything plus them is 0 in float32: Softmax gives those positions exactly 0) makes every
step of the program that iterates ``j`` beside ``i`` need only the ``j`` near ``i``. ``band_blocks``
finds the band from M's values, then rewrites the whole program at once by variable substitution and
boundary relaxing: ``i = B·ib + ii`` and ``j = B·ib - lo + jj`` with ``jj`` over a window of
``W = lo + B + hi`` positions (the band of the block's rows, relaxed to one window for all blocks),
every tensor of the program indexed by both ``i`` and ``j`` stored in the blocked layout
``[.., ib, ii, jj]``, the inputs read through the substituted indices (K and V windows padded with 0,
the mask with its own annihilating value), and the result reshaped back. Which iterator of each step
is ``i`` or ``j`` is found by following the accesses from the mask through the program (forwards and
backwards). The work of a banded attention drops from ``L²`` to ``L·W`` per head.

The derived program is accepted only when it agrees with the original numerically, the mask at its
real values (``tensor_derive.equivalent`` with the mask fixed; or, in ``relsat optimize``, the ONNX nodes
it is matched to against the original nodes under ONNX Runtime: driver/app/derive.py).
"""

from __future__ import annotations

import numpy as np

from .tensor_derive import _map_term, _subst_or_fail, equivalent, split_access
from .tensor_expr import Access, Expr, Index, Iter, Program, accesses

ANNIHILATING = -1e4  # exp(x + m - max) is 0 in float32 for m at or below this, x - max of moderate size


def band(mask: np.ndarray, block: int, threshold: float = ANNIHILATING) -> tuple[int, int] | None:
    """``(lo, hi)``: the rows of block ``ib`` (``[B·ib, B·ib + B)``) keep only the columns
    ``[B·ib - lo, B·ib + B + hi)``: every entry outside that is annihilating. None when ``mask`` is not 2-D,
    its rows do not split into blocks, or a row keeps no column at all."""
    if mask.ndim != 2 or mask.shape[0] % block:
        return None
    keep = mask > threshold
    if not keep.any(axis=1).all():
        return None
    lo = hi = None
    for ib in range(mask.shape[0] // block):
        cols = np.flatnonzero(keep[ib * block:(ib + 1) * block].any(axis=0))
        first, last = int(cols[0]), int(cols[-1])
        lo = max(ib * block - first, lo if lo is not None else -mask.shape[1])
        hi = max(last - (ib * block + block - 1), hi if hi is not None else -mask.shape[1])
    return max(lo, 0), max(hi, 0)


def _roles(p: Program, mask: str) -> tuple[dict, dict] | None:
    """Which iterator of each step is ``i`` or ``j`` (by step: iterator -> role), and which axis of each
    step's tensor is (by tensor: axis -> role), following plain accesses from the mask forwards and
    backwards; None where one iterator or axis would take both roles."""
    it_role: dict[str, dict[str, str]] = {n: {} for n, _ in p.steps}
    rank = {n: len(s) for n, s in p.inputs} | {n: len(e.scope) for n, e in p.steps}
    axis_role: dict[str, dict[int, str]] = {mask: {rank[mask] - 2: "i", rank[mask] - 1: "j"}}
    steps = {n for n, _ in p.steps}
    changed = True
    while changed:
        changed = False
        for name, e in p.steps:
            roles, mine = it_role[name], axis_role.setdefault(name, {})
            for ax, r in mine.items():  # what readers said of this tensor's axes
                it = e.scope[ax].name
                if roles.get(it) is None:
                    roles[it], changed = r, True
                elif roles[it] != r:
                    return None
            for a in accesses(e.body):
                known = axis_role.setdefault(a.tensor, {})
                for ax, ix in enumerate(a.index):
                    it = ix.plain()
                    if it is None:
                        continue
                    r_ax, r_it = known.get(ax), roles.get(it)
                    if r_ax and not r_it:
                        roles[it], changed = r_ax, True
                    elif r_it and not r_ax and a.tensor in steps:
                        known[ax], changed = r_it, True
                    elif r_ax and r_it and r_ax != r_it:
                        return None
            for ax, i in enumerate(e.scope):
                r = roles.get(i.name)
                if r and mine.get(ax) is None:
                    mine[ax], changed = r, True
                elif r and mine[ax] != r:
                    return None
    return it_role, axis_role


def band_blocks(p: Program, mask: str, values: np.ndarray, block: int,
                threshold: float = ANNIHILATING, check: bool = True) -> Program | None:
    """The program computed over the band of ``mask`` (values ``values``) in blocks of ``block`` rows (see
    the module doc), or None where it does not apply or would not be exact. ``check=False`` leaves the
    numeric check to the caller (NumPy evaluation by definition costs minutes past a sequence of ~2048:
    ``relsat optimize`` checks the ONNX nodes the program is matched to under ONNX Runtime instead)."""
    m2 = values.reshape(values.shape[-2:]) if values.ndim >= 2 and np.prod(values.shape[:-2]) == 1 else None
    if m2 is None:
        return None
    found = band(m2, block, threshold)
    found_roles = _roles(p, mask)
    if found is None or found_roles is None:
        return None
    (lo, hi), (it_role, axis_role) = found, found_roles
    n, cols = m2.shape
    width = lo + block + hi
    if width >= cols:
        return None  # no position to skip
    nb = n // block
    steps_names = {s for s, _ in p.steps}
    pad_mask = float(values.min())
    new_steps = []
    for name, e in p.steps:
        roles = it_role[name]
        role_of = {i.name: roles.get(i.name) for i in (*e.scope, *e.sums)}
        if "j" in role_of.values() and "i" not in role_of.values():
            return None
        if any(roles.get(s.name) == "i" for s in e.sums):
            return None
        sub = {}
        scope: list[Iter] = []
        for i in e.scope:
            r = roles.get(i.name)
            if r == "i":
                scope += [Iter(f"{i.name}.b", nb), Iter(f"{i.name}.i", block)]
            elif r == "j":
                scope.append(Iter(f"{i.name}.w", width))
            else:
                scope.append(i)
        i_it = next((i.name for i in e.scope if roles.get(i.name) == "i"), None)
        if i_it is not None:
            sub[i_it] = Index(((f"{i_it}.b", block), (f"{i_it}.i", 1)))
        for i in (*e.scope, *e.sums):
            if roles.get(i.name) == "j":
                sub[i.name] = Index(((f"{i_it}.b", block), (f"{i.name}.w", 1)), -lo)
        sums = tuple(Iter(f"{s.name}.w", width) if roles.get(s.name) == "j" else s for s in e.sums)

        def access(a: Access) -> Access:
            if a.tensor in steps_names and axis_role.get(a.tensor):
                idx = []
                for ax, ix in enumerate(a.index):
                    r = axis_role[a.tensor].get(ax)
                    it = ix.plain()
                    if r is None:
                        idx.append(ix)
                    elif it is None or roles.get(it) != r:
                        raise ValueError("a blocked tensor read other than plainly")
                    elif r == "i":
                        idx += [Index.of(f"{it}.b"), Index.of(f"{it}.i")]
                    else:
                        idx.append(Index.of(f"{it}.w"))
                return Access(a.tensor, tuple(idx), a.pad)
            idx = tuple(_subst_or_fail(ix, sub) for ix in a.index)
            return Access(a.tensor, idx, pad_mask if a.tensor == mask else a.pad)

        try:
            body = _map_term(e.body, access)
        except ValueError:
            return None
        new_steps.append((name, Expr(tuple(scope), sums, body, e.combine)))
    # the result back in its own layout: a reshape of its blocked i axis
    last, e_last = p.steps[-1]
    roles = it_role[last]
    if any(roles.get(i.name) == "j" for i in e_last.scope):
        return None
    if any(roles.get(i.name) == "i" for i in e_last.scope):
        blocked = f"{last}.blocked"
        new_steps[-1] = (blocked, new_steps[-1][1])
        idx = []
        for k, i in enumerate(e_last.scope):
            if roles.get(i.name) == "i":
                idx += [Index(((f"o{k}", 1),), 0, block, False), Index(((f"o{k}", 1),), 0, 1, False, block)]
            else:
                idx.append(Index.of(f"o{k}"))
        back = Expr(tuple(Iter(f"o{k}", i.extent) for k, i in enumerate(e_last.scope)), (), Access(blocked, tuple(idx)))
        new_steps.append((last, back))
    derived = Program(p.inputs, tuple(new_steps))
    return derived if not check or equivalent(p, derived, fixed={mask: values}) else None


def gathers_apart(p: Program) -> Program:
    """Every access with a non-plain index, in a step that is more than that access, split into a gather step of
    its own (``split_access``), laid out for the reader: a summing reader's first operand in its output order
    then the summation (a MatMul's left side), the others with the summation before the last output axis
    (its right side). What is left are plain products and element-wise steps; the gathers are Reshapes,
    windows of blocks, or constants (the mask's window)."""
    k = 0
    while k < len(p.steps):
        _, e = p.steps[k]
        accs = accesses(e.body)
        j = None if isinstance(e.body, Access) else next(
            (j for j, a in enumerate(accs) if not all(ix.plain() or ix == Index(()) for ix in a.index)), None)
        if j is None:
            k += 1
            continue
        order = "use" if not e.sums else ("scope" if j == 0 else "sums-last-but-one")
        p = split_access(p, k, j, order)
    return p
