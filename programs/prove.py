"""Formal verification of rewrite rules with z3, in the manner of TASO (Jia et al., SOSP'19).

Owns ``prove_rule`` and its ``Proof`` verdicts, and ``axioms()``: the operator properties as
data. Operators are uninterpreted functions over a tensor sort, each property is a universally
quantified equation with triggers (so E-matching terminates), and a rule is ``proved`` only when
z3 answers UNSAT for "some inputs make a pattern differ from its right side" under the axioms.
Anything else is ``tested``: the rule is then only checked numerically (``verify.py``).

The fragment: Add and Mul (elementwise with broadcasting; Mul by a rank-0 tensor is TASO's
smul), MatMul, Transpose, Concat, Split + getitem, Relu, Identity, Conv (linear without a bias;
with one, only concatenation along channels is known), MaxPool and AveragePool; the identities
are those of real arithmetic (floating-point rounding is the numerical check's concern).
Attributes are extra arguments: ints are z3 Ints, int lists z3 sequences (Split's sizes are Int
arguments, one function per arity), so attribute variables are z3 constants and literals fixed
values. Concat/Split axes are normalised as the e-graph stores them (>= 0). Shapes are modelled
only as far as the axioms need: uninterpreted ``dim(t, i)``, ``rank(t)``, ``numel(t)`` and
``shape(t)``; the rule's lets and comparisons become hypotheses (other conditions are dropped,
which only weakens them), and each Concat/Split of a pattern, being a node of a valid graph,
adds its well-formedness facts (axis in range, sizes summing to the extent), each Transpose of a
pattern that its perm is a permutation of its axes. Axioms carry the preconditions (ranks, equal
shapes, scalar operands) that make them identities of the ONNX operators wherever both sides are
defined; ``proved`` means the sides agree wherever both are defined, the shapes being checked
numerically. Permutations get their compositions (and, when literal, identity, last-two-swap and
axis-moving facts) computed here; when a pattern's perm has variable items, the rule is proved
once per permutation they can take (up to 64 cases), which keeps the arithmetic of its lets
linear.
"""

from __future__ import annotations

import functools
import itertools
import time
from dataclasses import dataclass

from relsat.programs.ir import (FILLS, Absent, BinOp, Cmp, Dim, Len, ListExpr, ListOf, Lit, Numel, Pred, Rank, Rule,
                                ShapeOf, Term, Var)
from relsat.relations.catalog import lookup

FRAGMENT = ("Add", "Mul", "MatMul", "Relu", "Identity", "Transpose", "Concat", "Split", "getitem", "Conv",
            "MaxPool", "AveragePool")
ARITIES = (2, 3)  # Concat/Split arities the axiom schemas are written for


@dataclass(frozen=True)
class Proof:
    status: str  # "proved" | "tested" ("tested": not proved here; the rule is only checked numerically)
    reason: str  # one line: which axioms sufficed / why not


@dataclass(frozen=True)
class Axiom:
    name: str
    comment: str
    formula: object  # a z3 ForAll with triggers
    ops: frozenset  # the rule operators it is about; it is used for a rule that has all of them


class _Outside(Exception):
    """The rule leaves the fragment."""


@functools.lru_cache(maxsize=None)
def _z():
    """The sorts and functions (z3's main context), built once."""
    import z3

    class Z:
        pass

    z = Z()
    T = z.T = z3.DeclareSort("Tensor")
    I, IL = z3.IntSort(), z3.SeqSort(z3.IntSort())
    z.IL = IL
    f = z3.Function
    z.add, z.mul, z.matmul = f("add", T, T, T), f("mul", T, T, T), f("matmul", T, T, T)
    z.relu, z.identity = f("relu", T, T), f("identity", T, T)
    z.transpose = f("transpose", IL, T, T)
    z.concat = {n: f(f"concat{n}", I, *[T] * n, T) for n in range(1, 9)}
    z.split = {n: f(f"split{n}", I, *[I] * n, T, T) for n in range(1, 9)}
    z.getitem = f("getitem", I, T, T)
    z.conv = f("conv", I, IL, IL, IL, IL, T, T, T)  # group, kernel_shape, strides, pads, dilations, x, w
    z.convb = f("conv_bias", I, IL, IL, IL, IL, T, T, T, T)  # ..., x, w, b
    z.maxpool = f("maxpool", IL, IL, IL, IL, I, T, T)
    z.avgpool = f("avgpool", IL, IL, IL, IL, I, I, T, T)
    z.dim, z.rank, z.numel = f("dim", T, I, I), f("rank", T, I), f("numel", T, I)
    z.shape = f("shape", T, z3.DeclareSort("Shape"))
    z.pcomp, z.is_id, z.swap2 = f("pcomp", IL, IL, IL), f("is_id", IL, z3.BoolSort()), f("swap2", IL, z3.BoolSort())
    z.paxis = f("paxis", IL, I, I)  # paxis(p, k): the j with p[j] = k
    return z


def _seq(items, sort):
    import z3

    units = [z3.Unit(i) for i in items]
    return z3.Empty(sort) if not units else units[0] if len(units) == 1 else z3.Concat(*units)


@functools.lru_cache(maxsize=None)
def axioms() -> list[Axiom]:
    """The operator properties (TASO's table, adapted to ONNX and relsat's forms); needs z3."""
    import z3

    z = _z()
    T, IL = z.T, z.IL
    x, y, w, c, x1, x2, w1, w2 = (z3.Const(n, T) for n in ("x", "y", "w", "c", "x1", "x2", "w1", "w2"))
    p, q, ks, st, pd, dl = (z3.Const(n, IL) for n in ("p", "q", "ks", "st", "pd", "dl"))
    g, k, k2, i, cm, ip = z3.Ints("g k k2 i cm ip")
    out: list[Axiom] = []

    def ax(name, comment, ops, vs, lhs, rhs, pre=None, both=True):
        body = lhs == rhs if pre is None else z3.Implies(pre, lhs == rhs)
        pats = [lhs, rhs] if both else [lhs]
        out.append(Axiom(name, comment, z3.ForAll(vs, body, patterns=pats), frozenset(ops)))

    def fact(name, comment, ops, vs, body, trigger):
        out.append(Axiom(name, comment, z3.ForAll(vs, body, patterns=[trigger]), frozenset(ops)))

    add, mul, mm, tr, relu = z.add, z.mul, z.matmul, z.transpose, z.relu
    r, dim, shape = z.rank, z.dim, z.shape
    scalar = r(c) == 0
    ax("add-comm", "ewadd is commutative", {"Add"}, [x, y], add(x, y), add(y, x), both=False)
    ax("add-assoc", "ewadd is associative", {"Add"}, [x, y, c], add(x, add(y, c)), add(add(x, y), c))
    ax("mul-comm", "ewmul is commutative", {"Mul"}, [x, y], mul(x, y), mul(y, x), both=False)
    ax("mul-assoc", "ewmul (and smul) is associative", {"Mul"}, [x, y, c], mul(x, mul(y, c)), mul(mul(x, y), c))
    ax("mul-add-distrib", "ewmul (and smul) distributes over ewadd", {"Mul", "Add"}, [x, y, c],
       mul(add(x, y), c), add(mul(x, c), mul(y, c)))
    ax("matmul-assoc", "matmul is associative for ranks >= 2 (vectors are promoted differently)", {"MatMul"},
       [x, y, c], mm(x, mm(y, c)), mm(mm(x, y), c), z3.And(r(x) >= 2, r(y) >= 2, r(c) >= 2))
    ax("matmul-add-right", "matmul is linear in its right operand (equal shapes: no broadcasting)",
       {"MatMul", "Add"}, [x, y, c], mm(x, add(y, c)), add(mm(x, y), mm(x, c)), shape(y) == shape(c))
    ax("matmul-add-left", "matmul is linear in its left operand (equal shapes)", {"MatMul", "Add"}, [x, y, c],
       mm(add(x, y), c), add(mm(x, c), mm(y, c)), shape(x) == shape(y))
    ax("matmul-smul-right", "matmul commutes with smul on its right operand", {"MatMul", "Mul"}, [x, y, c],
       mm(x, mul(y, c)), mul(mm(x, y), c), scalar)
    ax("matmul-smul-left", "matmul commutes with smul on its left operand", {"MatMul", "Mul"}, [x, y, c],
       mm(mul(x, c), y), mul(mm(x, y), c), scalar)
    fact("dim-matmul-last", "a matmul's last extent is its right operand's (rank >= 2)", {"MatMul"}, [x, w],
         z3.Implies(r(w) >= 2, dim(mm(x, w), r(mm(x, w)) - 1) == dim(w, r(w) - 1)), mm(x, w))
    fact("rank-matmul", "a matmul's rank: its operands' broadcast (a vector left operand drops an axis)",
         {"MatMul"}, [x, w], z3.Implies(r(w) >= 2, r(mm(x, w)) == z3.If(r(x) == 1, r(w) - 1,
                                                                          z3.If(r(x) >= r(w), r(x), r(w)))), mm(x, w))
    ax("transpose-compose", "transpose(transpose(x, q), p) = transpose(x, r), r[i] = q[p[i]]", {"Transpose"},
       [p, q, x], tr(p, tr(q, x)), tr(z.pcomp(q, p), x), both=False)
    ax("transpose-identity", "transpose by the identity permutation is the identity", {"Transpose"}, [p, x],
       tr(p, x), x, z.is_id(p), both=False)
    ax("transpose-matmul", "(ab)^T = b^T a^T, transposing the last two axes", {"Transpose", "MatMul"},
       [p, x, y], tr(p, mm(x, y)), mm(tr(p, y), tr(p, x)), z.swap2(p))
    ax("transpose-ewadd", "transpose commutes with ewadd", {"Transpose", "Add"}, [p, x, y],
       tr(p, add(x, y)), add(tr(p, x), tr(p, y)))
    ax("transpose-ewmul", "transpose commutes with ewmul", {"Transpose", "Mul"}, [p, x, y],
       tr(p, mul(x, y)), mul(tr(p, x), tr(p, y)))
    ax("transpose-smul", "transpose commutes with smul", {"Transpose", "Mul"}, [p, x, c],
       tr(p, mul(x, c)), mul(tr(p, x), c), scalar)
    ax("relu-idempotent", "relu(relu x) = relu x", {"Relu"}, [x], relu(relu(x)), relu(x), both=False)
    ax("relu-transpose", "relu is elementwise: it commutes with transpose", {"Relu", "Transpose"}, [p, x],
       relu(tr(p, x)), tr(p, relu(x)))
    ax("identity", "Identity is the identity", {"Identity"}, [x], z.identity(x), x, both=False)
    conv = z.conv
    cv = lambda a, b, grp=g: conv(grp, ks, st, pd, dl, a, b)  # noqa: E731
    ax("conv-add-weight", "conv is linear in its weight (equal shapes)", {"Conv", "Add"},
       [g, ks, st, pd, dl, x, w1, w2], cv(x, add(w1, w2)), add(cv(x, w1), cv(x, w2)), shape(w1) == shape(w2))
    ax("conv-add-input", "conv is linear in its input (zero padding; equal shapes)", {"Conv", "Add"},
       [g, ks, st, pd, dl, x1, x2, w], cv(add(x1, x2), w), add(cv(x1, w), cv(x2, w)), shape(x1) == shape(x2))
    ax("conv-smul-weight", "conv commutes with smul of its weight", {"Conv", "Mul"},
       [g, ks, st, pd, dl, x, w, c], mul(cv(x, w), c), cv(x, mul(w, c)), scalar)
    ax("conv-smul-input", "conv commutes with smul of its input", {"Conv", "Mul"},
       [g, ks, st, pd, dl, x, w, c], cv(mul(x, c), w), mul(cv(x, w), c), scalar)
    fact("dim-conv", "a conv's output channels are its weight's rows", {"Conv"}, [g, ks, st, pd, dl, x, w],
         dim(cv(x, w), 1) == dim(w, 0), cv(x, w))
    fact("dim-conv-bias", "likewise with a bias", {"Conv"}, [g, ks, st, pd, dl, x, w, c],
         dim(z.convb(g, ks, st, pd, dl, x, w, c), 1) == dim(w, 0), z.convb(g, ks, st, pd, dl, x, w, c))
    cc2 = z.concat[2]
    ax("conv-concat-channels", "conv over concatenated channels is the sum of the convs (group 1)",
       {"Conv", "Concat", "Add"}, [ks, st, pd, dl, x, y, w1, w2],
       cv(cc2(1, x, y), cc2(1, w1, w2), 1), add(cv(x, w1, 1), cv(y, w2, 1)), dim(x, 1) == dim(w1, 1))
    for n in ARITIES:
        cc, sp = z.concat[n], z.split[n]
        xs = [z3.Const(f"x{j}", T) for j in range(n)]
        ss = [z3.Int(f"s{j}") for j in range(n)]
        ax(f"relu-concat{n}", "relu is elementwise: it commutes with concat", {"Relu", "Concat"}, [k, *xs],
           relu(cc(k, *xs)), cc(k, *[relu(a) for a in xs]))
        ax(f"relu-split{n}", "relu is elementwise: it commutes with split", {"Relu", "Split"}, [i, k, *ss, x],
           z.getitem(i, sp(k, *ss, relu(x))), relu(z.getitem(i, sp(k, *ss, x))))
        for j in range(n):
            pre = z3.And(k == k2, *[ss[m] == dim(xs[m], k2) for m in range(j + 1)])
            ax(f"split{n}-concat-{j}", f"split definition: piece {j} of a split at the concat's extents",
               {"Split", "Concat"}, [k, k2, *ss, *xs], z.getitem(j, sp(k, *ss, cc(k2, *xs))), xs[j], pre, both=False)
        piece = sp(k2, *ss, x)
        ax(f"concat-split{n}", "concatenating a split's pieces gives its input", {"Split", "Concat"},
           [k, k2, *ss, x], cc(k, *[z.getitem(j, piece) for j in range(n)]), x, k == k2, both=False)
        fact(f"rank-concat{n}", "concat keeps the rank", {"Concat"}, [k, *xs], r(cc(k, *xs)) == r(xs[0]), cc(k, *xs))
        fact(f"dim-concat{n}", "a concat's extent on its axis is the sum of its inputs'", {"Concat"}, [k, *xs],
             dim(cc(k, *xs), k) == z3.Sum([dim(a, k) for a in xs]), cc(k, *xs))
        fact(f"dim-concat{n}-off", "a concat's other extents are its inputs'", {"Concat"}, [k, i, *xs],
             z3.Implies(i != k, dim(cc(k, *xs), i) == dim(xs[0], i)), dim(cc(k, *xs), i))
        ax(f"transpose-concat{n}", "concat & transpose: the axis moves to where the permutation puts it",
           {"Transpose", "Concat"}, [p, k, *xs], tr(p, cc(k, *xs)), cc(z.paxis(p, k), *[tr(p, a) for a in xs]))
        ax(f"matmul-concat{n}", "matmul by columns concatenated on the last axis (rank >= 2) concatenates",
           {"MatMul", "Concat"}, [k, x, *xs], mm(x, cc(k, *xs)),
           cc(r(mm(x, xs[0])) - 1, *[mm(x, a) for a in xs]), z3.And(r(xs[0]) >= 2, k == r(xs[0]) - 1), both=False)
        ax(f"conv-concat-weights{n}", "concat of convs on channels = conv by weights concatenated on rows (group 1)",
           {"Conv", "Concat"}, [ks, st, pd, dl, x, *xs], cc(1, *[cv(x, a, 1) for a in xs]), cv(x, cc(0, *xs), 1))
        bs = [z3.Const(f"b{j}", T) for j in range(n)]
        cvb = lambda a, b, bias: z.convb(1, ks, st, pd, dl, a, b, bias)  # noqa: E731
        ax(f"conv-bias-concat-weights{n}", "the same with biases, concatenated alike", {"Conv", "Concat"},
           [ks, st, pd, dl, x, *xs, *bs], cc(1, *[cvb(x, a, b) for a, b in zip(xs, bs)]),
           cvb(x, cc(0, *xs), cc(0, *bs)))
        for name, pool, extra in (("maxpool", z.maxpool, [cm]), ("avgpool", z.avgpool, [cm, ip])):
            ax(f"{name}-concat{n}", "concat & pooling along batch or channels: pooling acts per (n, c)",
               {"MaxPool" if name == "maxpool" else "AveragePool", "Concat"}, [k, ks, st, pd, dl, *extra, *xs],
               cc(k, *[pool(ks, st, pd, dl, *extra, a) for a in xs]), pool(ks, st, pd, dl, *extra, cc(k, *xs)),
               z3.And(k >= 0, k < 2))
    return out


class _Encoder:
    """One rule in z3: its variables, hypotheses and the permutation literals it mentions."""

    def __init__(self, z3):
        self.z3, self.z = z3, _z()
        self.env: dict = {}
        self.hyps: list = []
        self.perms: set = set()
        self.fresh = 0
        self.numel = False
        self.normal: set = set()  # attribute variables bound to a pattern's (normalised) axis
        self.lists: dict = {}  # the permutations written out item by item: id -> (z3 sequence, items)

    def var(self, name, sort):
        v = self.env.get(name)
        if v is None:
            v = self.env[name] = self.z3.Const("?" + name, sort)
        elif v.sort() != sort:
            raise _Outside(f"?{name} is used with two sorts")
        return v

    def new(self, sort):
        self.fresh += 1
        return self.z3.Const(f"_any{self.fresh}", sort)

    def tensor(self, node, lhs):
        if isinstance(node, Var):
            return self.var(node.name, self.z.T)
        if isinstance(node, Term):
            return self.term(node, lhs)
        raise _Outside("an absent optional input")

    def attr(self, op, kind, value):
        z3 = self.z3
        if kind in ("ints", "floats"):
            item = z3.IntSort() if kind == "ints" else z3.RealSort()
            if isinstance(value, Var):
                return self.var(value.name, z3.SeqSort(item))
            items = [self.scalar(v, item) for v in value.items]
            if op == "Transpose" and all(z3.is_int_value(v) for v in items):
                self.perms.add(tuple(v.as_long() for v in items))
            return _seq(items, z3.SeqSort(item))
        sort = {"int": z3.IntSort(), "float": z3.RealSort(), "string": z3.StringSort()}[kind]
        return self.scalar(value, sort)

    def scalar(self, value, sort):
        z3 = self.z3
        if isinstance(value, Var):
            return self.var(value.name, sort)
        v = value.value
        if sort == z3.StringSort():
            return z3.StringVal(str(v))
        if sort == z3.IntSort():
            return z3.IntVal(int(v))
        if v != v or v in (float("inf"), float("-inf")):
            raise _Outside(f"a non-finite literal {v}")
        return z3.RealVal(v)

    def term(self, t: Term, lhs: bool):
        z3, z = self.z3, self.z
        if t.op not in FRAGMENT:
            raise _Outside(f"outside the fragment: {t.op}")
        if t.op == "getitem":
            return z.getitem(z3.IntVal(t.index), self.tensor(t.children[0], lhs))
        kids = list(t.children)
        if t.op == "Conv" and len(kids) > 2 and isinstance(kids[2], Absent):
            kids = kids[:2]
        xs = [self.tensor(c, lhs) for c in kids]
        given, vals = dict(t.attrs), {}
        for a in lookup(t.op).attrs:
            if t.op == "Split" and a.name == "split":
                continue
            v = given.get(a.name)
            sort = {"int": z3.IntSort(), "ints": z.IL, "float": z3.RealSort(), "floats": z3.SeqSort(z3.RealSort()),
                    "string": z3.StringSort()}[a.kind]
            vals[a.name] = self.new(sort) if v is None else self.attr(t.op, a.kind, v)
        if t.op in ("Concat", "Split"):
            k, rank = vals["axis"], z.rank(xs[0])
            if z3.is_int_value(k):
                k = k if k.as_long() >= 0 else rank + k.as_long()
            elif lhs:  # the e-graph stores the axis normalised
                self.normal.add(k.get_id())
            elif k.get_id() not in self.normal:
                k = z3.If(k < 0, k + rank, k)
            if lhs:  # a node of a valid graph: the axis in range, the inputs of one rank
                self.hyps += [k >= 0, k < rank] + [z.rank(a) == rank for a in xs]
        if t.op == "Split":
            sizes = given.get("split")
            if not isinstance(sizes, ListOf) or len(sizes.items) not in z.split:
                raise _Outside("Split sizes not written out item by item")
            ss = [self.scalar(v, z3.IntSort()) for v in sizes.items]
            if lhs:  # a node of a valid graph: the sizes add up to the extent
                self.hyps += [z3.Sum(ss) == z.dim(xs[0], k)] + [s >= 0 for s in ss]
            return z.split[len(ss)](k, *ss, xs[0])
        if t.op == "Concat":
            if len(xs) not in z.concat:
                raise _Outside(f"a Concat of {len(xs)} inputs")
            node = z.concat[len(xs)](k, *xs)
            if lhs and self.numel:  # equal extents off the axis: numel = extent on the axis * the rest
                rest = self.new(z3.IntSort())
                self.hyps += [rest >= 0] + [z.dim(a, k) >= 0 for a in xs + [node]]
                self.hyps += [z.numel(a) == z.dim(a, k) * rest for a in xs + [node]]
            return node
        simple = {"Add": z.add, "Mul": z.mul, "MatMul": z.matmul, "Relu": z.relu, "Identity": z.identity}
        if t.op in simple:
            return simple[t.op](*xs)
        if t.op == "Transpose":
            perm = given.get("perm")
            if isinstance(perm, ListOf):
                items = [self.scalar(v, z3.IntSort()) for v in perm.items]
                self.lists[vals["perm"].get_id()] = (vals["perm"], items)
                if lhs:  # a node of a valid graph: a permutation of its axes
                    self.hyps += [z.rank(xs[0]) == len(items)] + [z3.And(v >= 0, v < len(items)) for v in items]
                    self.hyps += [z3.Distinct(*items)] if len(items) > 1 else []
                    if len(items) <= 4 and not all(z3.is_int_value(v) for v in items):  # spelt out: a case split
                        self.hyps.append(z3.Or([z3.And([v == c for v, c in zip(items, pm)])
                                                for pm in itertools.permutations(range(len(items)))]))
            return z.transpose(vals["perm"], xs[0])
        win = [vals[n] for n in ("kernel_shape", "strides", "pads", "dilations")]
        if t.op == "Conv":
            return (z.conv if len(xs) == 2 else z.convb)(vals["group"], *win, *xs)
        if t.op == "MaxPool":
            return z.maxpool(*win, vals["ceil_mode"], xs[0])
        return z.avgpool(*win, vals["ceil_mode"], vals["count_include_pad"], xs[0])

    def expr(self, e):
        z3, z = self.z3, self.z
        if isinstance(e, Lit):
            if isinstance(e.value, str):
                raise _Outside("a string")
            return self.scalar(e, z3.IntSort() if isinstance(e.value, int) else z3.RealSort())
        if isinstance(e, Var):
            if e.name not in self.env:
                raise _Outside(f"?{e.name} unbound")
            return self.env[e.name]
        if isinstance(e, Dim):
            t = self.tensor(e.var, True)
            return z.dim(t, e.index if e.index >= 0 else z.rank(t) + e.index)
        if isinstance(e, (Rank, Numel, ShapeOf)):
            fn = {Rank: z.rank, Numel: z.numel, ShapeOf: z.shape}[type(e)]
            return fn(self.tensor(e.var, True))
        if isinstance(e, BinOp):
            a, b = self.expr(e.left), self.expr(e.right)
            if e.op in "+-*":
                return a + b if e.op == "+" else a - b if e.op == "-" else a * b
            if not (a.is_int() and b.is_int()):
                raise _Outside("real division")
            if z3.is_int_value(b) and b.as_long() > 0:  # floor(a / b) = t: b t <= a < b t + b, linear in t
                floor = self.new(z3.IntSort())
                self.hyps += [b * floor <= a, a < b * floor + b]
            else:
                floor = z3.If(b > 0, a / b, (-a) / (-b))  # Python's floor division; z3's is Euclidean
            return floor if e.op == "/" else a - b * floor
        if isinstance(e, ListExpr):
            return _seq([self.expr(i) for i in e.items], z3.SeqSort(z3.IntSort()))
        if isinstance(e, Len):
            return z3.Length(self.expr(e.expr))
        raise _Outside(f"expression {type(e).__name__}")

    def condition(self, c):
        a, b = self.expr(c.left), self.expr(c.right)
        ops = {"=": lambda: a == b, "!=": lambda: a != b, "<": lambda: a < b, "<=": lambda: a <= b,
               ">": lambda: a > b, ">=": lambda: a >= b}
        return ops[c.op]()

    def perm_facts(self):
        """is_id, swap2 and pcomp of the literal permutations and their compositions (two levels)."""
        z3, z = self.z3, self.z
        lit = lambda pm: _seq([z3.IntVal(v) for v in pm], z.IL)  # noqa: E731
        perms = {pm for pm in self.perms if sorted(pm) == list(range(len(pm)))}
        facts, done = [], set()
        for _ in range(2):
            for pm, qm in itertools.product(sorted(perms), repeat=2):
                if len(pm) == len(qm) and (pm, qm) not in done and len(done) < 400:
                    done.add((pm, qm))
                    rm = tuple(qm[v] for v in pm)  # pcomp(inner q, outer p)[i] = q[p[i]]
                    facts.append(z.pcomp(lit(qm), lit(pm)) == lit(rm))
                    perms = perms | {rm}
        pick = lambda items, i: functools.reduce(lambda e, j: z3.If(i == j, items[j], e),  # noqa: E731
                                                 range(len(items) - 1), items[-1])
        for (sq, qi), (sp, pi) in itertools.product(self.lists.values(), repeat=2):
            if len(qi) == len(pi) and not all(z3.is_int_value(v) for v in qi + pi):
                facts.append(z.pcomp(sq, sp) == _seq([pick(qi, v) for v in pi], z.IL))
        for pm in perms:
            n = len(pm)
            facts.append(z.is_id(lit(pm)) == (pm == tuple(range(n))))
            facts.append(z.swap2(lit(pm)) == (n >= 2 and pm == tuple(range(n - 2)) + (n - 1, n - 2)))
            facts += [z.paxis(lit(pm), v) == j for j, v in enumerate(pm)]
        return facts


def _ops(node, acc):
    if isinstance(node, Term):
        acc.add("Split" if node.op == "getitem" else node.op)
        for c in node.children:
            _ops(c, acc)
    return acc


def prove_rule(rule: Rule, *, timeout_ms: int = 2000) -> Proof:
    """Prove every ``patterns[i] == rhs[i]`` of ``rule`` from the axioms, or say why not."""
    try:
        import z3
    except ImportError:
        return Proof("tested", "z3-solver is not installed (pip install relsat[prove])")
    ops: set = set()
    for node in rule.patterns + rule.rhs:
        _ops(node, ops)
    if ops - set(FRAGMENT):
        return Proof("tested", "outside the fragment: " + ", ".join(sorted(ops - set(FRAGMENT))))
    fills = sorted({c.kind for c in rule.conditions if isinstance(c, Pred) and c.kind in FILLS})
    if fills:  # the axioms know tensors as opaque terms, not their values
        return Proof("tested", "outside the fragment: the value predicate(s) " + ", ".join(fills))
    cases = _perm_cases(rule)
    deadline = time.monotonic() + timeout_ms / 1000
    used: set = set()
    for fixed in cases:
        left = max(1, int((deadline - time.monotonic()) * 1000))
        proof, core = _attempt(z3, rule, ops, fixed, left)
        if proof.status != "proved" or len(cases) == 1:
            timed_out = proof.reason.startswith("z3 timed out")
            return Proof("tested", f"{proof.reason} (timeout {timeout_ms} ms)") if timed_out else proof
        used |= core
    how = "from " + ", ".join(sorted(used)) if used else "vacuously"
    return Proof("proved", f"{how}, by cases on the {len(cases)} permutations the patterns allow")


def _perm_cases(rule: Rule, limit: int = 64) -> list[dict]:
    """The values of the attribute variables in the patterns' Transpose perms, when few: a
    pattern matches permutations only, and fixed permutations keep the arithmetic linear."""
    perms: list = []

    def walk(node):
        if isinstance(node, Term):
            perm = dict(node.attrs).get("perm") if node.op == "Transpose" else None
            if isinstance(perm, ListOf) and any(isinstance(v, Var) for v in perm.items):
                perms.append(perm.items)
            for c in node.children:
                walk(c)

    for p in rule.patterns:
        walk(p)
    cases: list[dict] = [{}]
    for items in perms:
        cases = [new for case in cases for pm in itertools.permutations(range(len(items)))
                 if (new := _assign(case, items, pm)) is not None]
        if len(cases) > limit:
            return [{}]
    return cases or [{}]


def _assign(case, items, values):
    new = dict(case)
    for item, v in zip(items, values):
        if (item.value if isinstance(item, Lit) else new.setdefault(item.name, v)) != v:
            return None
    return new


def _attempt(z3, rule: Rule, ops: set, fixed: dict, timeout_ms: int) -> tuple[Proof, set]:
    """One z3 run on ``rule`` with the attribute variables of ``fixed`` set to those values."""
    enc = _Encoder(z3)
    enc.env.update({name: z3.IntVal(v) for name, v in fixed.items()})
    enc.numel = any(isinstance(e, Numel) for c in rule.conditions + tuple(lt.expr for lt in rule.lets)
                    for e in _walk(c))
    try:
        lhs = [enc.term(p, True) for p in rule.patterns]
        for lt in rule.lets:
            try:
                value = enc.expr(lt.expr)
            except (_Outside, z3.Z3Exception):
                continue  # unconstrained: a weaker hypothesis
            enc.hyps.append(enc.var(lt.var.name, value.sort()) == value)
        for c in rule.conditions:
            if isinstance(c, Cmp):
                try:
                    enc.hyps.append(enc.condition(c))
                except (_Outside, z3.Z3Exception):
                    pass  # dropped: a weaker hypothesis
        rhs = [enc.tensor(r, False) for r in rule.rhs]
    except _Outside as e:
        return Proof("tested", str(e)), set()
    except z3.Z3Exception as e:
        return Proof("tested", f"cannot encode: {str(e).splitlines()[0] if str(e) else type(e).__name__}"), set()
    facts = enc.hyps + enc.perm_facts()
    s = z3.Solver()
    s.set("timeout", max(50, timeout_ms // 10))  # a short look: finding a model can be much harder
    s.add(*facts)
    if s.check() == z3.unsat:
        return Proof("proved", "vacuously: its conditions never hold together"), set()
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.set("mbqi", False)
    for ax in axioms():
        if ax.ops <= ops:
            s.assert_and_track(ax.formula, z3.Bool(ax.name))
    s.add(*facts)
    s.add(z3.Or([a != b for a, b in zip(lhs, rhs)]))
    verdict = s.check()
    where = " for " + ", ".join(f"?{k} = {v}" for k, v in sorted(fixed.items())) if fixed else ""
    if verdict == z3.unsat:
        used = {str(b) for b in s.unsat_core()}
        return Proof("proved", "from " + ", ".join(sorted(used)) if used else "by congruence alone"), used
    if verdict == z3.sat:
        return Proof("tested", f"not entailed by the axioms{where} (z3 found a model)"), set()
    why = s.reason_unknown().strip("()")
    if "timeout" in why or "canceled" in why:
        return Proof("tested", f"z3 timed out{where}"), set()
    return Proof("tested", f"not proved from the axioms{where} (z3: {why})"), set()


def _walk(e):
    yield e
    for name in ("left", "right", "expr"):
        if hasattr(e, name):
            yield from _walk(getattr(e, name))
    for item in getattr(e, "items", ()):
        yield from _walk(item)
