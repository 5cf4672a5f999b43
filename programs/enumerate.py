"""Enumerating a family's terms and grouping them by fingerprint (TASO's generator, set-oriented).

``enumerate_family`` builds every term of up to ``max_ops`` operators over a ``Family``
(``programs.universe``), level by level (a level is a term size), and gives each term a
fingerprint: a 64-bit hash of its values at every assignment on random data.  Terms with
equal fingerprints compute the same function: the first term of a fingerprint group is its
representative, and every other member is a candidate rule ``member = representative``.

Only representatives become children of larger terms (a term with a non-representative child
is equal, by the smaller rule and congruence, to one built from the representative, so its
rules follow from those), which is TASO's and Ruler's pruning of the search itself.

Nothing here iterates over terms or pairs in Python: an operator is applied to all pairs of
two (shape class, size) blocks of representatives in one numpy call, fingerprints are a
vectorised hash, and grouping is ``np.unique``/``searchsorted`` over each level.  Python
loops over operators and shape classes only.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

import numpy as np

from .universe import ASSIGNMENTS, Family

CHUNK = 1 << 15  # term pairs evaluated per numpy call
_SCALE = float(1 << 20)  # fingerprint resolution: values agree to about 1e-6


@dataclass
class Enumeration:
    """Columnar terms (leaves first, then each level) and the candidate rules found."""

    family: Family
    max_ops: int
    op: np.ndarray  # operator index into family.ops; -1 for a leaf
    kid: np.ndarray  # [n, 2] child term ids (-1 when absent); for a leaf, kid[:, 0] is its index in family.leaves
    size: np.ndarray  # operators in the term
    cls: np.ndarray  # shape class id
    fp: np.ndarray  # fingerprint (uint64)
    rep: np.ndarray  # id of the term's group representative (itself for a representative)
    classes: list = field(default_factory=list)  # class id -> per-assignment shapes
    seconds: float = 0.0

    @property
    def candidates(self) -> np.ndarray:
        """Ids of the terms that are not their group's representative: each is a rule ``t = rep[t]``."""
        return np.flatnonzero(self.rep != np.arange(len(self.rep)))

    @property
    def groups(self) -> int:
        return int((self.rep == np.arange(len(self.rep))).sum())


class _Hasher:
    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.weights: np.ndarray = np.zeros(0, dtype=np.uint64)

    def __call__(self, values: list[np.ndarray], cls: int) -> np.ndarray:
        t = values[0].shape[0]
        h = np.full(t, (cls * 0x9E3779B97F4A7C15) % 2**64, dtype=np.uint64)
        for v in values:
            flat = v.reshape(t, -1)
            if flat.shape[1] > len(self.weights):
                extra = self.rng.integers(1, 2**63, flat.shape[1] - len(self.weights), dtype=np.uint64) | np.uint64(1)
                self.weights = np.concatenate([self.weights, extra])
            q = np.rint(flat * _SCALE).astype(np.int64).view(np.uint64)
            with np.errstate(over="ignore"):
                h = h * np.uint64(1099511628211) + (q * self.weights[:flat.shape[1]]).sum(axis=1, dtype=np.uint64)
        return h


def enumerate_family(family: Family, max_ops: int, *, seed: int = 0) -> Enumeration:
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    leaf_values = family.leaf_values(rng)
    hasher = _Hasher(rng)
    classes: dict[tuple, int] = {}

    def class_of(shapes: tuple) -> int:
        return classes.setdefault(shapes, len(classes))

    # the leaves: level 0
    free = [i for i, leaf in enumerate(family.leaves) if not leaf.fixed]
    n0 = len(free)
    op = [np.full(n0, -1, np.int32)]
    kid = [np.stack([np.array(free, np.int64), np.full(n0, -1, np.int64)], axis=1)]
    size = [np.zeros(n0, np.int16)]
    cls_l, fps = [], []
    reps: dict[tuple[int, int], tuple[np.ndarray, list]] = {}  # (class, size) -> (ids, values per assignment)
    for j, i in enumerate(free):
        leaf = family.leaves[i]
        c = class_of(tuple(family.shape(leaf, k) for k in range(ASSIGNMENTS)))
        vals = [leaf_values[leaf.name][k][None] for k in range(ASSIGNMENTS)]
        cls_l.append(c)
        fps.append(hasher(vals, c)[0])
        _append(reps, (c, 0), np.array([j]), vals)
    cls = [np.array(cls_l, np.int32)]
    fp = [np.array(fps, np.uint64)]
    rep = [np.arange(n0, dtype=np.int64)]
    known_fp, known_rep = np.sort(fp[0]), np.arange(n0)[np.argsort(fp[0])]
    next_id = n0

    extras = [[[leaf_values[name][k][None] for name in o.extra] for k in range(ASSIGNMENTS)] for o in family.ops]
    out_class: dict[tuple, int | None] = {}

    def result_class(oi: int, kids: tuple) -> int | None:
        """The class of ``op(kids)`` (None when the op rejects the shapes), from a dry run on zeros."""
        key = (oi, kids)
        if key not in out_class:
            o, shapes = family.ops[oi], []
            try:
                for k in range(ASSIGNMENTS):
                    args = [np.zeros((1,) + classes_by_id[c][k]) for c in kids]
                    y = o.apply(k, args, extras[oi][k])
                    if 0 in y.shape:
                        raise ValueError("empty")
                    shapes.append(y.shape[1:])
                out_class[key] = class_of(tuple(shapes))
            except (ValueError, IndexError):
                out_class[key] = None
        return out_class[key]

    for level in range(1, max_ops + 1):
        classes_by_id = {v: k for k, v in classes.items()}
        blocks = []  # (op index, child ids per input, class, fingerprints, child (class, size) keys, row indices)
        for oi, o in enumerate(family.ops):
            for sizes in _splits(level - 1, o.arity):
                keys = [[key for key in reps if key[1] == s] for s in sizes]
                for combo in itertools.product(*keys):
                    c = result_class(oi, tuple(key[0] for key in combo))
                    if c is None:
                        continue
                    ids = [reps[key][0] for key in combo]
                    grid = np.meshgrid(*[np.arange(len(i)) for i in ids], indexing="ij")
                    flat = [g.ravel() for g in grid]
                    for lo in range(0, len(flat[0]), CHUNK):
                        part = [f[lo:lo + CHUNK] for f in flat]
                        vals = _evaluate(o, oi, combo, part, reps, extras)
                        blocks.append((oi, [i[p] for i, p in zip(ids, part)], c, hasher(vals, c), combo, part))
        if not blocks:
            break
        lop = np.concatenate([np.full(len(b[3]), b[0], np.int32) for b in blocks])
        lkid = np.concatenate([np.stack(b[1] + [np.full(len(b[3]), -1, np.int64)] * (2 - len(b[1])), axis=1)
                               for b in blocks])
        lcls = np.concatenate([np.full(len(b[3]), b[2], np.int32) for b in blocks])
        lfp = np.concatenate([b[3] for b in blocks])
        ids = np.arange(next_id, next_id + len(lfp))
        # a fingerprint seen at a smaller size: the term is a candidate rule to that representative
        pos = np.minimum(np.searchsorted(known_fp, lfp), len(known_fp) - 1)
        hit = known_fp[pos] == lfp
        lrep = np.where(hit, known_rep[pos], -1)
        # new fingerprints: the first term of each is the representative
        new = np.flatnonzero(~hit)
        uniq, first, inverse = np.unique(lfp[new], return_index=True, return_inverse=True)
        lrep[new] = ids[new[first]][inverse]
        op.append(lop), kid.append(lkid), size.append(np.full(len(lfp), level, np.int16))
        cls.append(lcls), fp.append(lfp), rep.append(lrep)
        known_fp = np.concatenate([known_fp, uniq])
        known_rep = np.concatenate([known_rep, ids[new[first]]])
        order = np.argsort(known_fp, kind="stable")
        known_fp, known_rep = known_fp[order], known_rep[order]
        # the new representatives' values, for the next level's children
        if level < max_ops:
            is_rep = lrep == ids
            start = 0
            for oi, _, c, hashes, combo, part in blocks:
                mask = is_rep[start:start + len(hashes)]
                bid = ids[start:start + len(hashes)][mask]
                start += len(hashes)
                if not mask.any():
                    continue
                vals = _evaluate(family.ops[oi], oi, combo, [p[mask] for p in part], reps, extras)
                _append(reps, (c, level), bid, vals)
        next_id += len(lfp)
    classes_list = [None] * len(classes)
    for shapes, c in classes.items():
        classes_list[c] = shapes
    return Enumeration(family, max_ops, np.concatenate(op), np.concatenate(kid), np.concatenate(size),
                       np.concatenate(cls), np.concatenate(fp), np.concatenate(rep), classes_list,
                       time.perf_counter() - t0)


def _append(reps: dict, key: tuple, ids: np.ndarray, vals: list[np.ndarray]) -> None:
    """Add representatives (their ids and values per assignment) to block ``key`` of ``reps``."""
    old = reps.get(key)
    reps[key] = (ids, vals) if old is None else (np.concatenate([old[0], ids]),
                                                  [np.concatenate([a, b]) for a, b in zip(old[1], vals)])


def _evaluate(o, oi, combo, part, reps, extras) -> list[np.ndarray]:
    return [o.apply(k, [reps[key][1][k][p] for key, p in zip(combo, part)], extras[oi][k]) for k in range(ASSIGNMENTS)]


def _splits(total: int, parts: int):
    """Ordered tuples of ``parts`` sizes >= 0 summing to ``total``."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _splits(total - first, parts - 1):
            yield (first,) + rest
