"""Rule verification: both sides of every core rule evaluated on random instances with ONNX Runtime.

Owns ``check_rule``/``check_ruleset`` and their ``RuleCheck`` results (``relsat rules check``).
An instance is drawn by walking the left patterns: each operator's planner gives the e-class
variables below it shapes that make it valid (conv inputs ``[1, C, S, S]`` with weights
``[M, C/group, k, k]`` and biases ``[M]``, matmul operands of rank 1-3 with matching inner dims,
elementwise siblings equal or broadcastable, concat inputs equal off the axis, BN parameters
``[C]``, ...), attribute variables and attributes the pattern leaves open get small values
(the values the conditions compare them with, half of the time), and every term's shape comes
from the catalog's own SQL shape rule, so a draw the e-graph would reject is rejected here too.
Lets and conditions are evaluated with the compiler's semantics; failing draws are redrawn.
On an instance, every right side must pass its shape rules with its pattern's shape (else the
rule is unsound as written), and the ONNX models of the patterns' roots and of the right sides
must agree under ONNX Runtime on the same random data (positive for variances and square roots,
away from zero for divisors), within a tolerance scaled to the outputs' magnitude.
"""

from __future__ import annotations

import functools
import itertools
import math
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from relsat.relations import runtime
from relsat.relations.catalog import BY_TYPE, REQUIRED, OpDef
from relsat.relations.onnx_form import catalog_nodes
from relsat.relations.rules import shape_rule as _shape_rule  # the catalog's shape rules without an e-graph

from .ir import (FILLS, Absent, BinOp, Cmp, Dim, Len, ListExpr, ListOf, Lit, Numel, Pred, Rank, Rule, RuleSet, ShapeOf,
                 Term, Var)
from .parser import format_term

OPSET = 20  # Gelu exists from opset 20; every lifted attribute is an input there
RTOL = 1e-4  # tolerance: RTOL * max(1, largest magnitude of either side)
_DIMS = (2, 3, 4)
_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "=": "=", "!=": "!="}


@dataclass(frozen=True)
class RuleCheck:
    """The verdict on one core rule; ``ok`` only when instances were checked and all agreed."""

    rule: str
    ok: bool
    max_abs_err: float = 0.0
    message: str = ""
    skipped: str | None = None  # why no instance of the rule could be drawn


class _Reject(Exception):
    """The draw is not an instance of the rule (the reason is tallied for a skip message)."""


class _Unsound(Exception):
    """The rule fails on an instance that satisfies its conditions."""


def check_ruleset(ruleset: RuleSet, *, trials: int = 3, seed: int = 0) -> list[RuleCheck]:
    """``check_rule`` on every core rule of the set, in order."""
    return [check_rule(rule, trials=trials, seed=seed) for rule in ruleset.rules]


def check_rule(rule: Rule, *, trials: int = 3, seed: int = 0, draws: int = 400) -> RuleCheck:
    """Check ``rule`` on ``trials`` random instances (out of at most ``draws`` draws)."""
    rng = np.random.default_rng([seed, zlib.crc32(rule.name.encode())])
    reasons: Counter[str] = Counter()
    worst, done, offsets = 0.0, 0, {}
    # a second pass, only for a rule the first found no instance of, also draws one-axis operands
    for k in range(2 * draws):
        if k == draws and done:
            break
        draw = _Draw(rule, rng, done, offsets, per_channel=k >= draws)
        try:
            worst = max(worst, draw.check())
        except _Reject as e:
            reasons[str(e)] += 1
            continue
        except _Unsound as e:
            return RuleCheck(rule.name, False, worst, str(e))
        done += 1
        if done == trials:
            break
    if not done:
        reason = f"no instance in {2 * draws} draws; most often: {reasons.most_common(1)[0][0]}"
        return RuleCheck(rule.name, False, 0.0, reason, skipped=reason)
    return RuleCheck(rule.name, True, worst, f"{done} instance(s) agree (max abs error {worst:.2e})")


# ---------------------------------------------------------------- drawing an instance


class _Attrs:
    """The attribute values of one left-side term, drawn on demand (planners ask in dependency order)."""

    def __init__(self, draw: _Draw, term: Term, op: OpDef):
        self.draw, self.op = draw, op
        self.given = dict(term.attrs)
        self.values: dict[str, object] = {"index": term.index} if term.op == "getitem" else {}

    def known(self, name: str):
        """The value if the pattern already fixes it (literals, bound variables), else None."""
        v, values = self.given.get(name), self.draw.values
        if isinstance(v, Lit):
            return v.value
        if isinstance(v, Var):
            return values.get(v.name)
        if isinstance(v, ListOf) and all(isinstance(i, Lit) or i.name in values for i in v.items):
            return [i.value if isinstance(i, Lit) else values[i.name] for i in v.items]
        return None

    def get(self, name: str, **ctx):
        if name in self.values:
            return self.values[name]
        d, v = self.draw, self.given.get(name)
        if isinstance(v, Lit):
            value = v.value
        elif isinstance(v, Var):
            if v.name not in d.values:
                d.values[v.name] = d.hinted(v.name, lambda: d.candidate(self.op, name, ctx))
            value = d.values[v.name]
        elif isinstance(v, ListOf):
            cand = None
            for i, item in enumerate(v.items):
                if isinstance(item, Var) and item.name not in d.values:
                    cand = cand or d.candidate(self.op, name, dict(ctx, length=len(v.items)))
                    d.values[item.name] = d.hinted(item.name, lambda: cand[i] if i < len(cand) else d.pick())
            value = self.known(name)
        else:  # left open by the pattern: any value matches, so vary it
            value = d.candidate(self.op, name, ctx)
        self.values[name] = value
        return value

    def all(self, kids: list) -> dict:
        first = next((k for k in kids if isinstance(k, tuple)), None)
        ctx = {} if first is None else {"rank": len(first), "shape": first}
        return {a.name: self.get(a.name, **ctx) for a in self.op.attrs}


class _Draw:
    """One random instance of a rule: shapes of its e-class variables, values of its attribute variables."""

    def __init__(self, rule: Rule, rng: np.random.Generator, trial: int, offsets: dict, per_channel: bool = False):
        self.rule, self.rng, self.per_channel = rule, rng, per_channel
        self.trial, self.offsets = trial, offsets  # the instances found so far; choice() rotates through options
        self.shapes: dict[str, tuple] = {}
        self.values: dict[str, object] = {}
        self.fills = {c.var.name: FILLS[c.kind] for c in rule.conditions if isinstance(c, Pred) and c.kind in FILLS}
        self.const = {c.var.name for c in rule.conditions if isinstance(c, Pred) and c.kind == "const"} | set(self.fills)
        self.spatial = int(rng.choice((4, 5, 6)))
        self.lhs: dict[Term, tuple] = {}  # term -> (shape, attrs)
        self.rhs: dict[Term, tuple] = {}
        self.hints, self.ranks = _hints(rule)

    # -- the whole check
    def check(self) -> float:
        rule = self.rule
        roots = [self.pattern(p) for p in rule.patterns]
        try:
            for let in rule.lets:
                self.values[let.var.name] = self.eval(let.expr)
            false = next((c for c in rule.conditions if not self.holds(c)), None)
        except (IndexError, ZeroDivisionError, TypeError) as e:  # as SQL's NULL: the rule does not match
            raise _Reject(f"a let or condition has no value ({e})") from None
        if false is not None:
            raise _Reject(f"the condition {format_term(false)} is false")
        for root, pattern, right in zip(roots, rule.patterns, rule.rhs):
            shape = self.right(right)
            if shape != root:
                raise _Unsound(f"{format_term(right)} has shape {list(shape)} but {format_term(pattern)} has {list(root)} "
                               f"(a union the e-graph rejects) on {self.describe()}")
        return _compare(self)

    def describe(self) -> str:
        shapes = [f"?{v}: {list(s)}" for v, s in self.shapes.items()]
        return "{" + ", ".join(shapes + [f"?{v} = {x!r}" for v, x in self.values.items()]) + "}"

    # -- conditions, lets and right sides
    def eval(self, e):
        match e:
            case Lit(value=v):
                return v
            case Var(name=n):
                return self.values[n]
            case Dim(var=v, index=i):
                return self.shapes[v.name][i]
            case Rank(var=v):
                return len(self.shapes[v.name])
            case Numel(var=v):
                return math.prod(self.shapes[v.name])
            case ShapeOf(var=v):
                return list(self.shapes[v.name])
            case BinOp(op=op, left=left, right=right):
                a, b = self.eval(left), self.eval(right)
                match op:
                    case "+":
                        return a + b
                    case "-":
                        return a - b
                    case "*":
                        return a * b
                    case "/":  # floor division, as the compiler's floor(a / b)
                        return a // b if isinstance(a, int) and isinstance(b, int) else math.floor(a / b)
                return a % b  # Python's sign convention, as the compiler's ((a % b) + b) % b
            case ListExpr(items=items):
                return [self.eval(i) for i in items]
            case Len(expr=x):
                return len(self.eval(x))
        raise TypeError(f"unknown expression {e!r}")

    def holds(self, c) -> bool:
        if isinstance(c, Pred):
            if c.kind in FILLS:
                return self.fills.get(c.var.name) == FILLS[c.kind]
            # dynamic: the drawn sizes stand for any binding of the symbols, so the equation is checked on them
            return {"const": c.var.name in self.const, "not-const": c.var.name not in self.const, "dynamic": True,
                    "dtype": c.dtype == TensorProto.FLOAT}[c.kind]
        a, b = self.eval(c.left), self.eval(c.right)
        return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[c.op]

    def right(self, t):
        """The shape of a right-side term (raises _Unsound when a shape rule rejects it)."""
        if isinstance(t, Var):
            return self.shapes[t.name]
        if t in self.rhs:
            return self.rhs[t][0]
        op = BY_TYPE[t.op]
        kids = [None if isinstance(c, Absent) else self.right(c) for c in t.children]
        if op.variadic:
            kids = [kids]
        attrs = {"index": t.index} if t.op == "getitem" else {}
        for name, v in t.attrs:
            items = v.items if isinstance(v, ListOf) else (v,)
            value = [self.values[i.name] if isinstance(i, Var) else i.value for i in items]
            attrs[name] = value if isinstance(v, ListOf) else value[0]
        shape, _ = _shape_rule(op, kids, attrs)
        if shape is None:
            raise _Unsound(f"the right side {format_term(t)} fails the {t.op} shape rule although the conditions hold, "
                           f"on {self.describe()}")
        self.rhs[t] = (shape, attrs)
        return shape

    # -- random values
    def pick(self) -> int:
        return int(self.rng.choice(_DIMS))

    def free(self, rank: int | None = None, min_rank: int = 1) -> tuple:
        if rank is None:
            rank = max(min_rank, int(self.rng.choice((1, 2, 2, 3, 3, 4))))
        return tuple(self.pick() for _ in range(rank))

    def variant(self, shape):
        """``shape``, or now and then a shape that broadcasts to it; None (draw freely) for a scalar."""
        if not shape:
            return None
        r = self.rng.random()
        if self.per_channel and r >= 0.5:  # the second pass, for a rule no plain draw gave an instance of:
            # half the time one axis kept, ones elsewhere (a per-channel [1, C, 1, 1], or [C, 1, 1] with the
            # leading ones dropped)
            i = int(self.rng.integers(len(shape)))
            one_axis = tuple(d if j == i else 1 for j, d in enumerate(shape))
            return one_axis[i:] if self.rng.random() < 0.5 else one_axis
        if r < 0.6:
            return shape
        if r < 0.7:
            return ()
        if r < 0.8:
            return shape[-1:]
        if r < 0.9 and len(shape) > 2:  # of a lower rank, but not a vector: the trailing dims, the first of them
            # now and then 1 (a rank-3 [1, 1, 1] beside a rank-4 [2, 1, 1, 1]: Concat's axis 1 is another dim of
            # each, and matrix-1009, Concat of two Adds as the Add of two Concats, ran into a shape conflict there)
            tail = shape[int(self.rng.integers(1, len(shape) - 1)):]
            return ((1,) + tail[1:]) if self.rng.random() < 0.5 else tail
        i = int(self.rng.integers(len(shape)))
        return shape[:i] + (1,) + shape[i + 1:]

    def partition(self, total: int, n: int) -> list[int]:
        if total < n:
            raise _Reject(f"cannot split {total} into {n} parts")
        cuts = sorted(self.rng.choice(np.arange(1, total), n - 1, replace=False).tolist())
        return [b - a for a, b in zip([0] + cuts, cuts + [total])]

    def hinted(self, var: str, make):
        return self.hints[var] if var in self.hints and self.rng.random() < 0.5 else make()

    def choice(self, key, *options):
        """Mostly the next option for each trial (so a few trials see them all), else a random one."""
        if self.rng.random() < 0.25:
            return options[int(self.rng.integers(len(options)))]
        offset = self.offsets.setdefault(key, int(self.rng.integers(len(options))))
        return options[(offset + self.trial) % len(options)]

    def candidate(self, op: OpDef, name: str, ctx: dict):
        """A small valid value for attribute ``name`` of ``op`` in context ``ctx`` (shapes, rank, length)."""
        rng, o = self.rng, op.op_type
        rank, shape, n = ctx.get("rank", 2), ctx.get("shape", ()), ctx.get("length")
        nsp = ctx.get("nsp", 2)
        choice = functools.partial(self.choice, (o, name))

        if o == "ConvTranspose" and name == "output_padding":
            return [0] * nsp
        if o == "ConvTranspose":
            o = "Conv"  # kernel, strides, pads, dilations and group drawn as a Conv's
        if o in ("Conv", "MaxPool", "AveragePool") and name in ("kernel_shape", "strides", "pads", "dilations"):
            if name == "kernel_shape":
                return list(ctx["w"][2:]) if ctx.get("w") else [choice(1, 3) if o == "Conv" else choice(2, 3)] * nsp
            if name == "strides":
                return [choice(1, 2)] * nsp
            if name == "dilations":
                return [choice(1, 1, 1, 2) if o == "Conv" else 1] * nsp
            k = ctx.get("kernel") or [3] * nsp
            return [choice(0, 1) if o == "Conv" else int(rng.integers(min(2, ki))) for ki in k] * 2
        match name:
            case "group":
                return choice(1, 1, 2)
            case "ceil_mode" | "count_include_pad" | "transA" | "transB" | "keepdims":
                return choice(0, 1)
            case "axis":
                return int(rng.integers(rank + (o == "Flatten")))
            case "indices":
                return int(rng.integers(shape[ctx["axis"]])) if shape and 0 <= ctx.get("axis", -1) < len(shape) else 0
            case "perm":
                return [int(p) for p in rng.permutation(n or rank)]
            case "split":
                return self.partition(ctx.get("dim", 4), n or 2)
            case "shape" if n is not None and shape and n != len(shape):
                return self.regroup(tuple(shape), n) or list(shape)
            case "shape":
                numel = math.prod(shape)
                return list(choice(shape, (numel,), (shape[0], numel // shape[0]) if shape else (1,)))
            case "axes" if o == "Unsqueeze":
                return sorted(int(a) for a in rng.choice(rank + (n or 1), n or 1, replace=False))
            case "axes" if o == "Squeeze":
                return [i for i, d in enumerate(shape) if d == 1]
            case "axes" if o.startswith("Reduce"):
                return sorted(int(a) for a in rng.choice(rank, n or int(rng.integers(1, rank + 1)), replace=False))
            case "axes":
                return [int(rng.integers(rank))]
            case "starts":
                return [choice(0, 1)]
            case "ends":
                return [shape[ctx["axis"]] if shape else 1]
            case "steps":
                return [1]
            case "pads":
                return [choice(0, 1) for _ in range(2 * rank)]
            case "value" | "value_float":
                return choice(0.5, 1.5, -0.75)
            case "min":
                return choice(float("-inf"), 0.0, -0.5)
            case "max":
                return choice(float("inf"), 6.0, 0.5)
            case "alpha" | "beta":
                return choice(1.0, 0.5) if o == "Gemm" else 0.1
            case "epsilon":
                return choice(1e-5, 1e-3)
            case "approximate":
                return choice("none", "tanh")
        default = op.attr(name).default
        if default is REQUIRED:
            raise _Reject(f"no generator for the attribute {o}:{name}")
        return default

    # -- the left side
    def kid(self, child, target=None, make=None):
        """The shape of a child: a term's planned shape, or a variable's (drawn on first use)."""
        if isinstance(child, Absent):
            return None
        if isinstance(child, Term):
            return self.pattern(child, target)
        if child.name not in self.shapes:
            shape = tuple(target) if target is not None else (make() if make else self.free())
            rank = self.ranks.get(child.name)
            if rank is not None and len(shape) != rank:
                shape = shape[len(shape) - rank:] if len(shape) > rank else self.free(rank - len(shape)) + shape
            self.shapes[child.name] = shape
        return self.shapes[child.name]

    def pattern(self, t: Term, target=None):
        if t in self.lhs:
            return self.lhs[t][0]
        op = BY_TYPE[t.op]
        if op.leaf and t.op != "Constant":
            raise _Reject(f"{t.op} terms are not generated")
        attrs = _Attrs(self, t, op)
        kids = _PLANNERS[op.draw](self, t, attrs, target)
        if op.variadic:
            kids = [kids]
        values = attrs.all(kids)
        shape, stored = _shape_rule(op, kids, values)
        if shape is None:
            raise _Reject(f"the {t.op} shape rule rejects the draw")
        if not op.is_tuple and 0 in shape:
            raise _Reject("a zero-size tensor")
        for name, _ in t.attrs:
            if stored[name] != values[name]:
                raise _Reject(f"the e-graph stores :{name} {values[name]} as {stored[name]}, "
                              "so the pattern never matches")
        self.lhs[t] = (shape, values)
        return shape

    def elementwise(self, t: Term, attrs: _Attrs, target):
        """Terms first; then variables get the reference shape, or now and then one that broadcasts to it."""
        kids, ref = [None] * len(t.children), target
        order = sorted(range(len(t.children)), key=lambda i: isinstance(t.children[i], Var))
        for j, i in enumerate(order):
            kids[i] = self.kid(t.children[i], target if j == 0 else self.variant(ref))
            if not ref:
                ref = kids[i]
        return kids

    def conv(self, t: Term, attrs: _Attrs, target, transposed: bool = False):
        x_, w_, b_ = t.children
        g = attrs.get("group")
        x = self.kid(x_, ((target or (1,))[0], g * self.pick(), self.spatial, self.spatial))
        if len(x) < 3 or x[1] % g:
            raise _Reject(f"{t.op} input channels do not fit the group")
        w_known = self.shapes.get(w_.name) if isinstance(w_, Var) else None
        k = attrs.get("kernel_shape", w=w_known, nsp=len(x) - 2)
        attrs.get("pads", kernel=k, nsp=len(k))
        if transposed:  # ConvTranspose's weight is [C_in, C_out / group, k...]
            m = target[1] // g if target and len(target) > 1 and target[1] % g == 0 else self.pick()
            w = self.kid(w_, (x[1], m, *k))
            return [x, w, self.kid(b_, (w[1] * g,))]
        m = target[1] if target and len(target) > 1 else g * self.pick()
        w = self.kid(w_, (m, x[1] // g, *k))
        return [x, w, self.kid(b_, w[:1])]

    def deconv(self, t: Term, attrs: _Attrs, target):
        return self.conv(t, attrs, target, transposed=True)

    def window(self, t: Term, attrs: _Attrs, target):
        n, c = target[:2] if target and len(target) > 1 else (1, self.pick())
        x = self.kid(t.children[0], (n, c, self.spatial, self.spatial))
        if t.op != "GlobalAveragePool":
            attrs.get("pads", kernel=attrs.get("kernel_shape", nsp=len(x) - 2), nsp=len(x) - 2)
        return [x]

    def batchnorm(self, t: Term, attrs: _Attrs, target):
        x = self.kid(t.children[0], target or (1, self.pick(), self.spatial, self.spatial))
        if len(x) < 2:
            raise _Reject("BatchNormalization over a vector")
        return [x] + [self.kid(p, x[1:2]) for p in t.children[1:]]

    def layernorm(self, t: Term, attrs: _Attrs, target):
        x = self.kid(t.children[0], target)
        axis = attrs.get("axis", rank=len(x))
        return [x] + [self.kid(p, x[axis:]) for p in t.children[1:]]

    def matmul(self, t: Term, attrs: _Attrs, target):
        a_, b_ = t.children
        b_known = self.shapes.get(b_.name) if isinstance(b_, Var) else None
        k = b_known[-2 if len(b_known) > 1 else 0] if b_known else self.pick()
        a = self.kid(a_, make=lambda: (target[:-1] + (k,) if target and len(target) > 1
                                       else self.free(rank=int(self.rng.choice((0, 1, 1, 2)))) + (k,)))
        if not a:
            raise _Reject("MatMul of a scalar")
        if isinstance(b_, Term) and self.rng.random() < 0.5:  # a term planned by itself (its shape may be fixed)
            return [a, self.kid(b_)]
        k, n, r = a[-1], (target[-1] if target else self.pick()), self.rng.random()
        b = self.kid(b_, (k,) if r < 0.1 else (*a[:-2], k, n) if r < 0.3 else (k, n))
        return [a, b]

    def gemm(self, t: Term, attrs: _Attrs, target):
        ta, tb = attrs.get("transA"), attrs.get("transB")
        a = self.kid(t.children[0], make=lambda: (self.pick(), self.pick()))
        if len(a) != 2:
            raise _Reject("Gemm over a non-matrix")
        m, k, n = a[ta], a[1 - ta], self.pick()
        b = self.kid(t.children[1], (n, k) if tb else (k, n))
        c = self.kid(t.children[2], [(n,), (m, n), ()][int(self.rng.integers(3))])
        return [a, b, c]

    def concat(self, t: Term, attrs: _Attrs, target):
        children = t.children
        if target:
            axis = attrs.get("axis", rank=len(target))
            if not -len(target) <= axis < len(target):
                raise _Reject("Concat axis out of range")
            axis %= len(target)
            parts = self.partition(target[axis], len(children))
            return [self.kid(c, target[:axis] + (p,) + target[axis + 1:]) for c, p in zip(children, parts)]
        first = next((i for i, c in enumerate(children) if isinstance(c, Term)), 0)
        known = attrs.known("axis")
        ref = self.kid(children[first], make=lambda: self.free(min_rank=(known or 0) + 1))
        axis = attrs.get("axis", rank=len(ref))
        if not -len(ref) <= axis < len(ref):
            raise _Reject("Concat axis out of range")
        axis %= len(ref)
        return [ref if i == first else self.kid(c, ref[:axis] + (self.pick(),) + ref[axis + 1:])
                for i, c in enumerate(children)]

    def split(self, t: Term, attrs: _Attrs, target):
        known = attrs.known("axis")
        x = self.kid(t.children[0], make=lambda: self.free(min_rank=(known or 0) + 1))
        axis = attrs.get("axis", rank=len(x))
        attrs.get("split", dim=x[axis] if -len(x) <= axis < len(x) else 1)
        return [x]

    def getitem(self, t: Term, attrs: _Attrs, target):
        return [self.pattern(t.children[0])]

    def transpose(self, t: Term, attrs: _Attrs, target):
        perm, given = attrs.known("perm"), attrs.given.get("perm")
        hint = None  # the data's shape that transposes to the target: dim perm[i] is target dim i
        if perm is not None and target is not None and sorted(perm) == list(range(len(target))):
            hint = tuple(target[perm.index(j)] for j in range(len(perm)))
        n = len(given.items) if isinstance(given, ListOf) else None
        x = self.kid(t.children[0], hint, make=lambda: self.free(rank=n))
        attrs.get("perm", rank=len(x))
        return [x]

    def reduce(self, t: Term, attrs: _Attrs, target):
        """A reduction: with the axes and keepdims fixed and the output's shape known, the data is that shape
        with each reduced axis drawn; otherwise as :meth:`reshaping` (the data first, then the axes from its rank)."""
        axes, keep = attrs.known("axes"), attrs.known("keepdims")
        if target is not None and axes is not None and keep == 1 and len(target) >= 1:
            hint = tuple(self.pick() if i in {a % len(target) for a in axes} else d for i, d in enumerate(target))
            return [self.kid(t.children[0], hint)]
        return self.reshaping(t, attrs, target)

    def regroup(self, shape: tuple, rank: int) -> list | None:
        """``shape`` as ``rank`` dims of the same number of elements: trailing dims merged, or the last dim
        split into factors (heads x head size); None where it cannot be split."""
        shape = list(shape)
        if rank < 1:
            return None
        if rank <= len(shape):
            return shape[:rank - 1] + [math.prod(shape[rank - 1:])]
        while len(shape) < rank:
            last = shape[-1] if shape else 1
            factors = [f for f in range(2, last) if last % f == 0]
            if not factors:
                return None
            f = int(self.rng.choice(factors))
            shape[-1:] = [f, last // f]
        return shape

    def _reshape_from_target(self, t: Term, attrs: _Attrs, target):
        """:meth:`_Draw.reshaping` for a Reshape whose output shape is known; None where it is not."""
        given = attrs.given.get("shape")
        if attrs.known("shape") is None and target is not None and isinstance(given, ListOf) \
                and len(given.items) == len(target):
            for item, d in zip(given.items, target):
                if isinstance(item, Var) and item.name not in self.values:
                    self.values[item.name] = int(d)
        out = attrs.known("shape")
        if out is None or not all(isinstance(d, int) and d > 0 for d in out):
            return None
        data = t.children[0]
        rank = self.ranks.get(data.name) if isinstance(data, Var) else None
        if rank is None and isinstance(data, Var):
            rank = int(self.rng.integers(1, len(out) + 1))
        shape = self.regroup(tuple(out), rank) if rank is not None else None
        if isinstance(data, Var):
            if shape is None:
                raise _Reject(f"cannot draw data of rank {rank} for a Reshape to {out}")
            x = self.kid(data, make=lambda: tuple(shape))
        else:
            x = self.kid(data)
        attrs.get("shape")
        return [x]

    def reshaping(self, t: Term, attrs: _Attrs, target):
        """Reshape, Flatten, Squeeze, Unsqueeze, Slice, Pad: the data first, then attributes from its shape.
        A Reshape whose target shape is fixed (by the pattern's bound variables, or by the shape its
        parent needs) draws its data from that shape instead: the same elements, regrouped to the rank
        the data must have (so that a pattern splitting heads, ``(Reshape :shape (?b ?s ?h ?d) ?q)`` beside
        ``(Reshape :shape (?b ?l ?h ?d) ?k)``, has instances)."""
        if t.op == "Reshape":
            planned = self._reshape_from_target(t, attrs, target)
            if planned is not None:
                return planned
        make = (lambda: self.free() + (1,)) if t.op == "Squeeze" else None
        x = self.kid(t.children[0], make=make)
        ctx = {"rank": len(x), "shape": x}
        if t.op == "Slice":
            ctx["axis"] = attrs.get("axes", **ctx)[0]
        if t.op == "Gather":
            ctx["axis"] = attrs.get("axis", **ctx)
        for a in attrs.op.attrs:
            attrs.get(a.name, **ctx)
        return [x]


_PLANNERS = {  # the catalog's ``draw`` names
    "elementwise": _Draw.elementwise, "conv": _Draw.conv, "deconv": _Draw.deconv, "window": _Draw.window, "batchnorm": _Draw.batchnorm,
    "layernorm": _Draw.layernorm, "matmul": _Draw.matmul, "gemm": _Draw.gemm, "concat": _Draw.concat,
    "split": _Draw.split, "getitem": _Draw.getitem, "transpose": _Draw.transpose, "reshaping": _Draw.reshaping,
    "reduce": _Draw.reduce,
}


def _hints(rule: Rule) -> tuple[dict[str, object], dict[str, int]]:
    """Values that satisfy the conditions comparing an attribute variable with a literal, and
    the ranks that ``(rank ?v N)`` requires."""
    bounds: dict[str, dict[str, object]] = {}
    ranks = {}
    for c in rule.conditions:
        if not isinstance(c, Cmp):
            continue
        left, op, right = c.left, c.op, c.right
        if isinstance(left, Lit):
            left, op, right = right, _FLIP[op], left
        if isinstance(left, Var) and isinstance(right, Lit):
            bounds.setdefault(left.name, {})[op] = right.value
        elif isinstance(left, Rank) and isinstance(right, Lit) and op == "=":
            ranks[left.var.name] = right.value
    hints = {}
    for var, b in bounds.items():
        lo, hi = b.get(">=", b.get(">")), b.get("<=", b.get("<"))
        step = 1 if isinstance(lo if lo is not None else hi, int) else 0.5
        if "=" in b:
            hints[var] = b["="]
        elif lo is not None and hi is not None:
            hints[var] = (lo + hi) // 2 if step == 1 else (lo + hi) / 2
        elif lo is not None:
            hints[var] = lo if ">=" in b else lo + step
        elif hi is not None:
            hints[var] = hi if "<=" in b else hi - step
    return hints, ranks


# ---------------------------------------------------------------- ONNX models of both sides


def _data_roles(rule: Rule) -> tuple[set[str], set[str]]:
    """Variables that need positive data (variances, square roots) and non-zero data (divisors): the
    catalog's ``positive`` and ``nonzero`` inputs."""
    positive, nonzero = set(), set()

    def walk(t):
        if not isinstance(t, Term):
            return
        op = BY_TYPE[t.op]
        for i, c in enumerate(t.children):
            if isinstance(c, Var):
                if i in op.positive:
                    positive.add(c.name)
                elif i in op.nonzero:
                    nonzero.add(c.name)
            walk(c)

    for t in rule.patterns + rule.rhs:
        walk(t)
    return positive, nonzero


class _Onnx:
    """Emits the nodes of one side; variables are graph inputs, or initializers when const."""

    def __init__(self, memo: dict):
        self.memo, self.nodes, self.inits, self.names = memo, [], [], {}
        self.domains: dict[str, int] = {}  # other domains the nodes use -> their opset
        self.fresh_names = itertools.count()  # the values inside a node written as several (a definition)

    def tensor(self, value, dtype: int) -> str:
        name = f"c{len(self.inits)}"
        arr = np.array(value, dtype=np.int64 if dtype == TensorProto.INT64 else np.float32)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def value(self, t):
        if isinstance(t, Var):
            return "v_" + t.name
        if t in self.names:
            return self.names[t]
        op, attrs = BY_TYPE[t.op], self.memo[t][1]
        if t.op == "getitem":
            name = self.value(t.children[0])[t.index]
        elif t.op == "Constant":
            name = self.tensor(attrs["value_float"], TensorProto.FLOAT)
        else:
            inputs = [self.value(c) if not isinstance(c, Absent) else "" for c in t.children]
            outputs = [f"t{len(self.nodes)}_{i}" for i in range(op.arity(attrs))]
            self.nodes += catalog_nodes(op, inputs, outputs, attrs, opset=OPSET if not op.domain else op.since,
                                        data_dtype=TensorProto.FLOAT, data_shape=None, const=self.tensor,
                                        fresh=lambda hint: f"{hint}_f{next(self.fresh_names)}")
            if op.domain:
                self.domains[op.domain] = op.since
            name = outputs if op.is_tuple else outputs[0]
        self.names[t] = name
        return name


def _run(draw: _Draw, roots, memo: dict, data: dict) -> list[np.ndarray]:
    b = _Onnx(memo)
    outs = [b.value(r) for r in roots]
    b.nodes += [helper.make_node("Identity", [o], [f"out{i}"]) for i, o in enumerate(outs)]
    inputs, inits = [], list(b.inits)
    for v, arr in data.items():
        if v in draw.const:
            inits.append(numpy_helper.from_array(arr, "v_" + v))
        else:
            inputs.append(helper.make_tensor_value_info("v_" + v, TensorProto.FLOAT, arr.shape))
    outputs = [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, None) for i in range(len(outs))]
    graph = helper.make_graph(b.nodes, "side", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, v) for d, v in sorted(b.domains.items())]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    feeds = {"v_" + v: arr for v, arr in data.items() if v not in draw.const}
    return [np.asarray(o, dtype=np.float64) for o in runtime.session(model, optimize=False).run(None, feeds)]


def _compare(draw: _Draw) -> float:
    """Run both sides on the same random data; the largest difference (raises _Unsound beyond tolerance)."""
    rule, rng = draw.rule, draw.rng
    positive, nonzero = _data_roles(rule)
    data = {v: np.full(shape, draw.fills[v], np.float32) if v in draw.fills
            else runtime.random_array(rng, shape, np.float32, positive=v in positive, nonzero=v in nonzero)
            for v, shape in draw.shapes.items()}
    try:
        left = _run(draw, rule.patterns, draw.lhs, data)
    except Exception as e:  # the catalog accepts what ONNX Runtime does not: not a real graph
        raise _Reject(f"ONNX Runtime rejects the left side: {str(e).splitlines()[0][:200]}") from None
    if not all(np.isfinite(x).all() for x in left):
        raise _Reject("the left side is not finite")
    try:
        right = _run(draw, rule.rhs, draw.rhs, data)
    except Exception as e:
        raise _Unsound(f"ONNX Runtime fails on the right side: {str(e).splitlines()[0][:300]} on "
                       f"{draw.describe()}") from None
    worst = 0.0
    for i, (x, y) in enumerate(zip(left, right)):
        if x.shape != y.shape:
            raise _Unsound(f"output {i}: shapes {list(x.shape)} and {list(y.shape)} under ONNX Runtime")
        if not np.isfinite(y).all():
            raise _Unsound(f"output {i} of the right side is not finite on {draw.describe()}")
        err = float(np.max(np.abs(x - y), initial=0.0))
        scale = max(1.0, float(np.max(np.abs(x), initial=0.0)), float(np.max(np.abs(y), initial=0.0)))
        if err > RTOL * scale:
            raise _Unsound(f"the sides differ by {err:.3g} (tolerance {RTOL * scale:.3g}) in output {i} "
                           f"on {draw.describe()}")
        worst = max(worst, err)
    return worst

