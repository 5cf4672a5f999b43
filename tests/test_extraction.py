"""Tests for relsat.extract.extraction: greedy and ILP extraction against brute force."""

import itertools
import time

import highspy
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from relsat.extract.extraction import (
    Extraction,
    ExtractionProblem,
    dag_cost,
    greedy_extract,
    ilp_extract,
    is_acyclic,
    validate_choice,
)


def make(nodes, roots):
    """Problem from [(class id, cost, [child class ids])] and root class ids."""
    ptr = np.cumsum([0] + [len(kids) for _, _, kids in nodes])
    return ExtractionProblem(
        node_class=np.array([c for c, _, _ in nodes], dtype=np.int64),
        node_cost=np.array([x for _, x, _ in nodes], dtype=np.float64),
        child_ptr=ptr.astype(np.int64),
        child_class=np.array([k for _, _, kids in nodes for k in kids], dtype=np.int64),
        roots=np.array(roots, dtype=np.int64),
    )


def brute_force(nodes, roots):
    """Minimum DAG cost over every assignment class -> node, or None if none is valid."""
    by_class = {}
    for i, (c, _, _) in enumerate(nodes):
        by_class.setdefault(c, []).append(i)
    classes = sorted(by_class)
    best = None
    for pick in itertools.product(*(by_class[c] for c in classes)):
        choice = dict(zip(classes, pick))
        seen, stack, ok = set(), list(roots), True
        while stack and ok:
            c = stack.pop()
            if c in seen:
                continue
            if c not in choice:
                ok = False
                break
            seen.add(c)
            stack.extend(nodes[choice[c]][2])
        if not ok:
            continue
        state = {}  # DFS colouring: 1 on stack, 2 done

        def cyclic(c):
            state[c] = 1
            for k in nodes[choice[c]][2]:
                if state.get(k) == 1 or (k not in state and cyclic(k)):
                    return True
            state[c] = 2
            return False

        if any(c not in state and cyclic(c) for c in seen):
            continue
        cost = sum(nodes[choice[c]][1] for c in seen)
        best = cost if best is None else min(best, cost)
    return best


@st.composite
def egraphs(draw, costs=st.integers(0, 6).map(float)):
    n_classes = draw(st.integers(1, 8))
    ids = draw(st.lists(st.integers(-10**12, 10**12), min_size=n_classes, max_size=n_classes, unique=True))
    cls = st.sampled_from(ids)
    nodes = draw(st.lists(st.tuples(cls, costs, st.lists(cls, max_size=3)), min_size=1, max_size=14))
    roots = draw(st.lists(st.sampled_from([c for c, _, _ in nodes]), min_size=1, max_size=3))
    return nodes, roots


# HiGHS mis-evaluated the greedy MIP start (cost 6) after presolve and reported it "optimal" with bound 1.
MIP_START_MISREAD = ([(1, 0.0, [0]), (-1, 0.0, [0, -2]), (0, 1.0, []), (1, 1.0, []), (-1, 0.0, [-2]),
                      (-2, 4.0, [0]), (-2, 5.0, [])], [1, -1])


@settings(max_examples=100, deadline=None)
@given(egraphs())
@example(MIP_START_MISREAD)
def test_against_brute_force(graph):
    nodes, roots = graph
    p = make(nodes, roots)
    opt = brute_force(nodes, roots)
    if opt is None:
        with pytest.raises(ValueError, match="no acyclic extraction"):
            greedy_extract(p)
        with pytest.raises(ValueError, match="no acyclic extraction"):
            ilp_extract(p)
        return
    ilp = ilp_extract(p)
    for ext in (greedy_extract(p, share=False), greedy_extract(p), ilp):
        validate_choice(p, ext.choice)
        assert ext.cost == pytest.approx(dag_cost(p, ext.choice))
        assert ext.cost >= opt - 1e-9
    assert ilp.cost == pytest.approx(opt, abs=1e-6)
    assert ilp.method == "ilp" and ilp.bound is not None and ilp.bound <= ilp.cost + 1e-6


@settings(max_examples=200, deadline=None)
@given(egraphs(costs=st.sampled_from([0.0, 0.5, 1.0, 3.0, 1e16, 1e17, 1e300])))
def test_greedy_acyclic_with_ties_and_rounding(graph):
    # Zero costs (ties) and magnitudes where sums round: greedy must still be acyclic.
    nodes, roots = graph
    p = make(nodes, roots)
    if brute_force(nodes, roots) is None:
        with pytest.raises(ValueError):
            greedy_extract(p)
    else:
        validate_choice(p, greedy_extract(p, share=False).choice)
        validate_choice(p, greedy_extract(p).choice)


def test_ilp_beats_greedy_through_sharing():
    # R needs P and Q. Each is a cheap leaf (3) or a free node over the shared S (5).
    # Tree costs pick both leaves (DAG cost 6); sharing S costs 5.
    nodes = [("R", 0, ["P", "Q"]), ("P", 0, ["S"]), ("P", 3, []), ("Q", 0, ["S"]), ("Q", 3, []), ("S", 5, [])]
    ids = {"R": 0, "P": 1, "Q": 2, "S": 3}
    p = make([(ids[c], x, [ids[k] for k in kids]) for c, x, kids in nodes], [ids["R"]])
    greedy, ilp = greedy_extract(p), ilp_extract(p)
    assert greedy.cost == 6.0
    assert ilp.cost == 5.0 < greedy.cost
    assert ilp.status == "optimal" and ilp.bound == pytest.approx(5.0) and ilp.gap == pytest.approx(0.0)
    assert ilp.choice == {0: 0, 1: 1, 2: 3, 3: 5}


def test_ilp_not_fooled_by_misread_warm_start():
    # With the greedy choice (cost 6) as MIP start, HiGHS's presolve judged the start in its reduced
    # space at objective 1 and stopped at once: "optimal", bound 1, returning the start. The optimum
    # shares class 0 between the roots: 1 -> f(0), -1 -> g(-2), -2 -> h(0), cost 5.
    nodes, roots = MIP_START_MISREAD
    p = make(nodes, roots)
    greedy = greedy_extract(p)
    assert greedy.cost == 6.0 and brute_force(nodes, roots) == 5.0
    ilp = ilp_extract(p, warm_start=greedy)
    validate_choice(p, ilp.choice)
    assert (ilp.cost, ilp.status, ilp.choice) == (5.0, "optimal", {1: 0, -1: 4, -2: 5, 0: 2})
    assert ilp.bound == pytest.approx(5.0) and ilp.gap == pytest.approx(0.0)


def test_greedy_sharing_pass():
    # Q's leaf (2) is cheaper than Q -> T (0 + 5) by tree cost, but T is already chosen under P.
    p = make([(0, 0, [1, 2]), (1, 1, [3]), (2, 2, []), (2, 0, [3]), (3, 5, [])], [0])
    assert greedy_extract(p, share=False).cost == 8.0
    shared = greedy_extract(p)
    assert shared.cost == 6.0 and shared.choice == {0: 0, 1: 1, 2: 3, 3: 4}


def test_cyclic_egraph_extracts_acyclically():
    # A = f(B) | a, B = g(A) | b: the class graph has the cycle A <-> B.
    A, B = 7, -3
    p = make([(A, 1, [B]), (A, 5, []), (B, 1, [A]), (B, 4, []), (A, 0, [A])], [A, B])
    for ext in (greedy_extract(p), ilp_extract(p)):
        validate_choice(p, ext.choice)
        assert is_acyclic(p, ext.choice)
        assert ext.cost == 5.0
    assert ilp_extract(p).choice == {A: 0, B: 3}
    assert not is_acyclic(p, {A: 0, B: 2})
    with pytest.raises(ValueError, match="cycle"):
        validate_choice(p, {A: 0, B: 2})
    with pytest.raises(ValueError, match="cycle"):
        validate_choice(p, {A: 4, B: 3})


def test_no_acyclic_extraction_raises():
    p = make([(0, 1, [1]), (1, 1, [0]), (2, 1, [])], [0, 2])
    with pytest.raises(ValueError, match=r"root classes \[0\] have no acyclic extraction"):
        greedy_extract(p)
    with pytest.raises(ValueError, match="no acyclic extraction"):
        ilp_extract(p)


def test_validate_choice_messages():
    p = make([(0, 1, [1]), (1, 2, []), (1, 3, []), (5, 1, [])], [0])
    validate_choice(p, {0: 0, 1: 1})
    assert dag_cost(p, {0: 0, 1: 2}) == 4.0
    for bad, msg in [({1: 1}, "root classes"), ({0: 0}, "child class 1"), ({0: 0, 1: 3}, "belongs to class 5"),
                     ({0: 0, 1: 1, 5: 3}, "unreachable"), ({0: 0, 1: 9}, "out of range")]:
        with pytest.raises(ValueError, match=msg):
            validate_choice(p, bad)


def test_empty_roots():
    p = make([(0, 1, [])], [])
    assert greedy_extract(p).choice == {} and ilp_extract(p).cost == 0.0
    validate_choice(p, {})


def test_warm_start_kept_without_ilp_solution(monkeypatch):
    p = make([(0, 0, [1, 2]), (1, 0, [3]), (1, 3, []), (2, 0, [3]), (2, 3, []), (3, 5, [])], [0])
    greedy = greedy_extract(p)
    monkeypatch.setattr(highspy.Highs, "run", lambda self: None)  # HiGHS returns no incumbent
    kept = ilp_extract(p, warm_start=greedy)
    assert (kept.status, kept.method, kept.choice, kept.cost) == ("warm_start_kept", "ilp", greedy.choice, 6.0)
    with pytest.raises(ValueError, match="not chosen"):
        ilp_extract(p, warm_start=Extraction({0: 0}, 0.0, "greedy", "greedy", None, None, 0.0))


def random_dag(n_classes, seed):
    """Acyclic problem: each class has 1-3 nodes whose children lie in the next 20 classes."""
    rng = np.random.default_rng(seed)
    node_class = np.repeat(np.arange(n_classes), rng.integers(1, 4, n_classes))
    n = len(node_class)
    n_kids = np.where(rng.random(n) < 0.05, 0, rng.integers(1, 4, n))
    parent = np.repeat(np.arange(n), n_kids)
    kids = node_class[parent] + 1 + rng.integers(0, 20, len(parent))
    ok = kids < n_classes
    ptr = np.concatenate([[0], np.cumsum(np.bincount(parent[ok], minlength=n))])
    ids = rng.permutation(n_classes).astype(np.int64) * 11 + 5
    return ExtractionProblem(ids[node_class], rng.random(n) * 10, ptr, ids[kids[ok]], ids[:3])


def test_large_problem():
    p = random_dag(10_000, seed=1)
    assert 15_000 <= len(p.node_class) <= 25_000
    t = time.perf_counter()
    greedy = greedy_extract(p)
    assert time.perf_counter() - t < 1.0
    validate_choice(p, greedy.choice)
    ilp = ilp_extract(p, time_limit=1.0, warm_start=greedy)
    validate_choice(p, ilp.choice)
    assert ilp.cost <= greedy.cost
    assert ilp.status in ("optimal", "time_limit", "warm_start_kept")
    assert ilp.seconds < 5.0
    assert isinstance(ilp, Extraction) and ilp.method == "ilp"
