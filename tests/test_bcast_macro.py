"""The catalog's broadcasting macros (``bcast``, and ``matmul_shape`` over it) against a Python statement of
ONNX's broadcasting rule, on random shapes with numbers, symbols (equal only to themselves), zeros and the
invalid inputs a shape rule can meet (NULL shapes, NULL or negative dims). Real DuckDB."""

import random

import pytest

from relsat.relations.egraph import EGraph

SYM = -1099511627776  # the catalog's is_sym(d): d <= this


def valid(shape):
    if shape is None or any(d is None for d in shape):
        return None
    return shape if all(d >= 0 or d <= SYM for d in shape) else None


def bcast(a, b):
    """ONNX broadcasting: align right, pad with 1; equal dims stay, a 1 gives way; else no shape. A missing
    shape broadcasts as a scalar (what the macro does with one NULL operand); two missing give none."""
    if a is None and b is None:
        return None
    if a == b:
        return a
    a, b = list(a or []), list(b or [])
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    out = []
    for x, y in zip(a, b):
        if x is not None and y is not None and (x == y or y == 1):
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            out.append(None)
    return valid(out)


def matmul(a, b):
    if not a or not b:
        return None
    if len(a) == 1 and len(b) == 1:
        return [] if a[0] == b[0] else None
    if len(a) == 1:
        return b[:-2] + [b[-1]] if a[0] == b[-2] else None
    if len(b) == 1:
        return a[:-1] if a[-1] == b[0] else None
    if a[-1] != b[-2]:
        return None
    batch = bcast(a[:-2], b[:-2])
    return None if batch is None else batch + [a[-2], b[-1]]


@pytest.fixture(scope="module")
def pairs():
    rng = random.Random(7)
    dims = [0, 1, 1, 2, 3, 768, -3, SYM, SYM - 1]
    rows = [(None, None), (None, []), ([], None), ([], []), (None, [1, 2]), ([3, 1], None), ([None], [1]),
            ([1, None], [2, 2])]
    for la in range(5):
        for lb in range(5):
            rows += [([rng.choice(dims) for _ in range(la)], [rng.choice(dims) for _ in range(lb)]) for _ in range(40)]
    return rows


@pytest.mark.parametrize("macro, reference", [("bcast", bcast), ("matmul_shape", matmul)])
def test_broadcasting_macros_follow_onnx(pairs, macro, reference):
    g = EGraph()
    g.con.execute("CREATE TEMP TABLE u (i INTEGER, a BIGINT[], b BIGINT[])")
    g.con.executemany("INSERT INTO u VALUES (?, ?, ?)", [(i, a, b) for i, (a, b) in enumerate(pairs)])
    got = dict(g.sql(f"SELECT i, {macro}(a, b) FROM u"))
    wrong = [(a, b, got[i], reference(a, b)) for i, (a, b) in enumerate(pairs) if got[i] != reference(a, b)]
    assert not wrong, wrong[:5]
    assert sum(reference(a, b) is not None for a, b in pairs) > len(pairs) // 20  # not all rejected
