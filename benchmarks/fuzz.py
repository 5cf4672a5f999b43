"""Differential fuzzing: random valid ONNX models through ``optimize``, compared under ONNX Runtime.

**The generator** (``generate(seed)``) builds a random float32 model over the operators of
relsat's catalog (``relsat.relations.catalog.OPS``) forward, NNSmith's way: it keeps the
tensors made so far with their shapes (a dynamic batch dim is a string, a ``dim_param``) and
only ever adds a node whose inputs, attributes and weights are valid for the shapes it
picks, so every model ONNX Runtime runs (each one is checked by ONNX's checker with strict
shape inference and run once under ONNX Runtime, its output shapes compared with the
tracked ones; the rare model that fails is drawn again from the next sub-seed).  Besides
single operators it draws the patterns relsat's fold and fusion rules look for: Conv
followed by Mul/Add by constants or BatchNormalization, ``x * clip(x + 3, 0, 6) / 6``, the
erf form of Gelu, transposes around MatMul, parallel MatMuls sharing an input, constant
chains.  Models have ~3-25 nodes, opset 17 (some 13 and 21), IR version 10, and some a
dynamic batch dim.  The same seed gives the same model.

**The campaign** (``python -m relsat.benchmarks.fuzz --models N --seed S --out FILE.jsonl``)
runs each model through ``relsat.driver.app.optimize.optimize`` with every shipped rule set
(cheap settings: analytic costs, no timing, a small node limit) and, for a fraction of the
models, the mcts and backtracking searches and (``--measure-every``) the measured choice with its
timings; then runs the written model and the original
under ONNX Runtime on fresh random inputs and compares them element by element
(``|got - ref| <= atol + rtol |ref| + floor``, rtol 1e-3, atol 1e-4, the floor a few ulps of
the output's largest magnitude plus 8x how far ONNX Runtime's own graph optimizations move
the original).  Each run is one of

- ``ok``: optimized or passed through, and the outputs agree;
- ``refused``: a ``RelsatError`` (its one line, and the reason with names and numbers masked);
- ``crash``: any other exception (type, message, traceback tail), or the worker process dying
  or running past ``--timeout``;
- ``wrong``: the written model does not load or run, or its outputs differ.

One JSON line per model goes to ``--out`` (flushed as it goes); failing models are saved
as ``.onnx`` beside it (``FILE.failures/``) to reproduce them; a summary is printed at the end.
Models run in a worker process (``--jobs`` of them), so that no model's failure, hang or
crash stops the campaign.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.boundary.import_dims import bcast as import_bcast

RULE_SETS = ("default", "taso", "generated", "fold", "merge", "runtime")
SEARCHES = ("mcts", "backtrack")
OPSETS = (17,) * 7 + (13,) * 2 + (21,)
FEATURES = ("const_nodes", "exposed", "sym")  # model-wide choices ``avoid`` can turn off (sym: dynamic batch)
RTOL, ATOL, FLOOR_ULPS, NOISE_FACTOR = 1e-3, 1e-4, 16, 8.0
CHEAP = dict(cost_model="analytic", measure=False, candidates=0, node_limit=400, iter_limit=8, time_limit=10.0,
             ilp_time_limit=5.0, threads=1)
MEASURED_CANDIDATES = 3  # candidates of a ``measured`` run (``plan``): the CLI's default


# ------------------------------------------------------------------------------------------ generator
@dataclass
class Val:
    name: str
    shape: tuple  # ints, or strings for dynamic dims
    nonneg: bool = False


def _conc(d) -> bool:
    return isinstance(d, (int, np.integer))


def _numel(shape) -> int | None:
    return math.prod(shape) if all(_conc(d) for d in shape) else None


def bcast(a: tuple, b: tuple) -> tuple | None:
    """NumPy broadcasting of two static shapes (the importer's rule, ``import_dims.bcast``), as a tuple."""
    out = import_bcast(list(a), list(b))
    return None if out is None else tuple(out)


class Skip(Exception):
    """The op drawn does not apply to the tensor drawn."""


class Gen:
    """One random model, built forward (module docstring)."""

    def __init__(self, seed: int, max_nodes: int | None = None, avoid=()):
        self.rng = np.random.default_rng(seed)
        r = self.rng
        self.opset = int(r.choice(OPSETS))
        self.max_nodes = max_nodes or int(r.integers(3, 26))
        self.nodes, self.inits, self.inputs = [], [], []
        self.vals: list[Val] = []
        self.used: Counter = Counter()
        self.ms = False  # uses com.microsoft
        self.sym = "N" if r.random() < 0.35 else None
        self.family = str(r.choice(["conv", "mlp", "seq", "mixed"], p=[0.35, 0.25, 0.2, 0.2]))
        self.counter = 0
        self.const_nodes = r.random() < 0.15  # constants as Constant nodes rather than initializers
        self.exposed = r.random() < 0.08  # some weights also graph inputs (overridable: never constants)
        self.free: list[str] = []  # weights a caller may override with any values
        for feature in avoid:  # drawn above all the same: the other choices of a seed do not change
            assert feature in FEATURES, feature
            setattr(self, feature, None if feature == "sym" else False)

    # helpers -------------------------------------------------------------------------------
    def fresh(self, prefix="t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def const(self, arr, prefix="w") -> str:
        name = self.fresh(prefix)
        arr = np.asarray(arr)
        self.inits.append(numpy_helper.from_array(arr.astype(np.float32) if arr.dtype.kind == "f" else arr, name))
        return name

    def ints(self, values) -> str:
        return self.const(np.array(values, dtype=np.int64), "k")

    def node(self, op, inputs, shape, nonneg=False, domain="", n_out=1, shapes=None, **attrs) -> list[Val]:
        outs = [self.fresh() for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.fresh("n"), domain=domain or None, **attrs))
        for i in inputs:
            if i:
                self.used[i] += 1
        vals = [Val(o, tuple(s), nonneg) for o, s in zip(outs, shapes or [shape])]
        self.vals += vals
        return vals

    def pick(self, pred=lambda v: True) -> Val:
        cands = [v for v in self.vals if pred(v)]
        if not cands:
            raise Skip
        if self.rng.random() < 0.7:  # mostly extend the recent tensors: depth
            cands = cands[-3:]
        return cands[int(self.rng.integers(len(cands)))]

    def weight(self, shape, scale=1.0, positive=False, away=False) -> str:
        r = self.rng
        if positive:
            arr = r.uniform(0.5, 2.0, shape)
        elif away:
            arr = r.uniform(0.5, 2.0, shape) * r.choice([-1.0, 1.0], shape)
        else:
            arr = r.standard_normal(shape) * scale
        name = self.const(np.asarray(arr, np.float32))
        if not positive and not away:
            self.free.append(name)
        return name

    def bshape(self, shape) -> tuple:
        """A constant's shape that broadcasts to ``shape`` without changing it."""
        r = self.rng
        keep = int(r.integers(0, len(shape) + 1))
        out = []
        for d in shape[len(shape) - keep:]:
            out.append(d if _conc(d) and r.random() < 0.6 else 1)
        return tuple(out)

    # primitive ops -------------------------------------------------------------------------
    def unary(self, v: Val, op=None) -> Val:
        r = self.rng
        choices = ["Relu", "Sigmoid", "Tanh", "Erf", "LeakyRelu", "HardSigmoid", "Identity", "Sqrt"]
        if self.opset >= 14:
            choices.append("HardSwish")
        if self.opset >= 20:
            choices.append("Gelu")
        op = op or str(r.choice(choices))
        attrs, nonneg = {}, op in ("Relu", "Sigmoid", "HardSigmoid", "Sqrt")
        if op == "Sqrt" and not v.nonneg:
            v = self.unary(v, str(r.choice(["Relu", "Sigmoid"])))
        if op == "LeakyRelu" and r.random() < 0.7:
            attrs["alpha"] = float(r.choice([0.01, 0.1, 0.2, 1.5]))
        if op == "HardSigmoid" and r.random() < 0.7:
            attrs.update(alpha=float(r.choice([0.2, 1 / 6, 0.5])), beta=float(r.choice([0.5, 0.3])))
        if op == "Gelu" and r.random() < 0.4:
            attrs["approximate"] = "tanh"
        if op == "Identity":
            nonneg = v.nonneg
        return self.node(op, [v.name], v.shape, nonneg, **attrs)[0]

    def clip(self, v: Val, lo=None, hi=None) -> Val:
        r = self.rng
        if lo is None and hi is None:
            lo = float(r.choice([0.0, -1.0, -0.5])) if r.random() < 0.8 else None
            hi = float(r.choice([6.0, 1.0, 0.5])) if r.random() < 0.8 else None
        ins = [v.name, self.const(np.array(lo, np.float32), "c") if lo is not None else ""]
        if hi is not None:
            ins.append(self.const(np.array(hi, np.float32), "c"))
        while ins and ins[-1] == "":
            ins.pop()
        return self.node("Clip", ins, v.shape, nonneg=lo is not None and lo >= 0)[0]

    def binary(self, v: Val, op=None, other=None) -> Val:
        r = self.rng
        op = op or str(r.choice(["Add", "Sub", "Mul", "Div"]))
        if other is None and op != "Div" and r.random() < 0.4:  # another tensor of a compatible shape
            cands = [w for w in self.vals if bcast(v.shape, w.shape) == v.shape]
            if cands:
                other = cands[int(r.integers(len(cands)))]
        if other is not None:
            ins, shape = [v.name, other.name], bcast(v.shape, other.shape)
            nonneg = op == "Mul" and other.name == v.name or (op in ("Add", "Mul") and v.nonneg and other.nonneg)
        else:
            cs = self.bshape(v.shape)
            c = self.weight(cs, away=op == "Div", positive=op in ("Add", "Mul") and v.nonneg and r.random() < 0.5)
            ins = [c, v.name] if op != "Div" and r.random() < 0.3 else [v.name, c]
            shape, nonneg = v.shape, False
        if shape is None:
            raise Skip
        return self.node(op, ins, shape, nonneg)[0]

    def softmax(self, v: Val) -> Val:
        r = len(v.shape)
        if r == 0:
            raise Skip
        attrs = {"axis": int(self.rng.integers(-r, r))} if self.rng.random() < 0.8 else {}
        return self.node("Softmax", [v.name], v.shape, True, **attrs)[0]

    def layernorm(self, v: Val) -> Val:
        if self.opset < 17 or not v.shape:
            raise Skip
        r = len(v.shape)
        axes = [a for a in range(r) if all(_conc(d) for d in v.shape[a:])]
        if not axes:
            raise Skip
        axis = int(self.rng.choice(axes))
        ins = [v.name, self.weight(v.shape[axis:], 1.0)]
        if self.rng.random() < 0.7:
            ins.append(self.weight(v.shape[axis:], 0.5))
        attrs = {"axis": axis - r if self.rng.random() < 0.5 else axis}
        if self.rng.random() < 0.3:
            attrs["epsilon"] = 1e-3
        return self.node("LayerNormalization", ins, v.shape, **attrs)[0]

    def batchnorm(self, v: Val) -> Val:
        if len(v.shape) < 2 or not _conc(v.shape[1]):
            raise Skip
        c = (v.shape[1],)
        ins = [v.name, self.weight(c), self.weight(c, 0.5), self.weight(c, 0.5), self.weight(c, positive=True)]
        attrs = {"epsilon": 1e-3} if self.rng.random() < 0.3 else {}
        return self.node("BatchNormalization", ins, v.shape, **attrs)[0]

    def matmul(self, v: Val, w_shape_out=None) -> Val:
        r = self.rng
        s = v.shape
        if not s or not _conc(s[-1]):
            raise Skip
        k = s[-1]
        m = w_shape_out or int(r.choice([1, 2, 4, 8, 16]))
        if len(s) >= 3 and _conc(s[-3]) and r.random() < 0.2:
            wshape, out = (s[-3], k, m), s[:-1] + (m,)
        else:
            wshape, out = (k, m), (s[:-1] + (m,)) if len(s) >= 2 else (m,)
        same = [i.name for i in self.inits if tuple(i.dims) == wshape and i.name in self.free]
        w = same[0] if same and r.random() < 0.3 else self.weight(wshape, 1 / math.sqrt(k))
        ins = [v.name, w]
        return self.node("MatMul", ins, out)[0]

    def attention(self, v: Val) -> Val:
        """x @ transpose(y) for y of x's shape (maybe x itself): a tensor-tensor MatMul."""
        if len(v.shape) < 2:
            raise Skip
        cands = [w for w in self.vals if w.shape == v.shape]
        y = cands[int(self.rng.integers(len(cands)))]
        r = len(v.shape)
        perm = list(range(r - 2)) + [r - 1, r - 2]
        yt = self.node("Transpose", [y.name], tuple(y.shape[p] for p in perm), perm=perm)[0]
        return self.node("MatMul", [v.name, yt.name], v.shape[:-1] + (v.shape[-2],))[0]

    def gemm(self, v: Val) -> Val:
        r = self.rng
        if len(v.shape) != 2:
            raise Skip
        ta = int(_conc(v.shape[0]) and r.random() < 0.3)
        tb = int(r.random() < 0.4)
        k = v.shape[0] if ta else v.shape[1]
        mdim = v.shape[1] if ta else v.shape[0]
        if not _conc(k):
            raise Skip
        n = int(r.choice([1, 3, 4, 8, 16]))
        ins = [v.name, self.weight((n, k) if tb else (k, n), 1 / math.sqrt(k))]
        if r.random() < 0.7:
            opts = [(n,), (1, n), ()] + ([(mdim, n)] if _conc(mdim) else [])
            ins.append(self.weight(opts[int(r.integers(len(opts)))], 0.5))
        attrs = {}
        if ta:
            attrs["transA"] = 1
        if tb:
            attrs["transB"] = 1
        if r.random() < 0.3:
            attrs["alpha"] = float(r.choice([0.5, 2.0]))
        if r.random() < 0.3 and len(ins) == 3:
            attrs["beta"] = float(r.choice([0.5, 2.0, 0.0]))
        return self.node("Gemm", ins, (mdim, n), **attrs)[0]

    def fused_matmul(self, v: Val) -> Val:
        r = self.rng
        s = v.shape
        if len(s) < 2:
            raise Skip
        ta, tb = int(r.random() < 0.4), int(r.random() < 0.5)
        k, rows = (s[-2], s[-1]) if ta else (s[-1], s[-2])
        if not _conc(k):
            raise Skip
        n = int(r.choice([2, 4, 8]))
        w = self.weight((n, k) if tb else (k, n), 1 / math.sqrt(k))
        attrs = {"transA": ta, "transB": tb}
        if r.random() < 0.5:
            attrs["alpha"] = float(r.choice([0.5, 0.125, 2.0]))
        self.ms = True
        return self.node("FusedMatMul", [v.name, w], s[:-2] + (rows, n), domain="com.microsoft", **attrs)[0]

    def _window(self, v: Val, pool: bool):
        """kernel, strides, pads, dilations and output spatial dims for a window over v's spatial dims."""
        r = self.rng
        spatial = v.shape[2:]
        ks, ss, ds, p0, p1, out = [], [], [], [], [], []
        for i in spatial:
            k = int(r.choice([1, 2, 3, 3, 5]))
            d = int(r.choice([1, 1, 1, 2]))
            s = int(r.choice([1, 1, 2, 3] if pool else [1, 1, 2]))
            if pool and d > 1 and self.op_now == "AveragePool":
                d = 1
            pa, pb = (int(r.integers(0, k)), int(r.integers(0, k))) if r.random() < 0.5 else (0, 0)
            if pool:  # pads must be smaller than the kernel
                pa, pb = min(pa, k - 1), min(pb, k - 1)
            span = d * (k - 1) + 1
            if i + pa + pb < span:
                k, d, pa, pb, span = 1, 1, 0, 0, 1
            ks.append(k), ss.append(s), ds.append(d), p0.append(pa), p1.append(pb)
            out.append((i + pa + pb - span) // s + 1)
        return ks, ss, p0 + p1, ds, out

    def conv(self, v: Val) -> Val:
        r = self.rng
        s = v.shape
        if len(s) not in (3, 4) or not all(_conc(d) for d in s[1:]):
            raise Skip
        c = s[1]
        divs = [g for g in range(1, c + 1) if c % g == 0]
        g = int(r.choice(divs)) if r.random() < 0.4 else 1
        oc = g * int(r.choice([1, 2, 3])) if g > 1 else int(r.choice([1, 2, 4, 8]))
        self.op_now = "Conv"
        ks, ss, pads, ds, out = self._window(v, pool=False)
        ins = [v.name, self.weight((oc, c // g, *ks), 1 / math.sqrt(c // g * math.prod(ks)))]
        if r.random() < 0.6:
            ins.append(self.weight((oc,), 0.5))
        attrs = {}
        if r.random() < 0.6:
            attrs["kernel_shape"] = ks
        if any(x != 1 for x in ss) or r.random() < 0.3:
            attrs["strides"] = ss
        if any(pads) or r.random() < 0.3:
            attrs["pads"] = pads
        if any(x != 1 for x in ds) or r.random() < 0.2:
            attrs["dilations"] = ds
        if g > 1 or r.random() < 0.2:
            attrs["group"] = g
        if r.random() < 0.08 and all(x == 1 for x in ds):  # auto_pad instead of pads
            mode = str(r.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
            attrs.pop("pads", None)
            attrs["auto_pad"] = mode
            if mode == "VALID":
                out = [(i - k) // st + 1 for i, k, st in zip(s[2:], ks, ss)]
                if min(out) < 1:
                    raise Skip
            else:
                out = [-(-i // st) for i, st in zip(s[2:], ss)]
        return self.node("Conv", ins, (s[0], oc, *out), **attrs)[0]

    def pool(self, v: Val) -> Val:
        r = self.rng
        s = v.shape
        if len(s) not in (3, 4) or not all(_conc(d) for d in s[2:]):
            raise Skip
        op = str(r.choice(["MaxPool", "AveragePool"]))
        self.op_now = op
        ks, ss, pads, ds, out = self._window(v, pool=True)
        attrs = {"kernel_shape": ks}
        if any(x != 1 for x in ss) or r.random() < 0.3:
            attrs["strides"] = ss
        if any(pads) or r.random() < 0.2:
            attrs["pads"] = pads
        if op == "MaxPool" and (any(x != 1 for x in ds) or r.random() < 0.1):
            attrs["dilations"] = ds
        if op == "AveragePool" and r.random() < 0.4:
            attrs["count_include_pad"] = 1
        if r.random() < 0.2:
            attrs["ceil_mode"] = 1
            n = len(ks)
            out = []
            for i, k, st, d, pa, pb in zip(s[2:], ks, ss, ds, pads[:n], pads[n:]):
                o = -(-(i + pa + pb - d * (k - 1) - 1) // st) + 1
                if (o - 1) * st >= i + pa:
                    o -= 1
                out.append(o)
        return self.node(op, [v.name], (s[0], s[1], *out), v.nonneg and op == "MaxPool", **attrs)[0]

    def gap(self, v: Val) -> Val:
        if len(v.shape) < 3:
            raise Skip
        return self.node("GlobalAveragePool", [v.name], v.shape[:2] + (1,) * (len(v.shape) - 2), v.nonneg)[0]

    def transpose(self, v: Val, perm=None) -> Val:
        r = len(v.shape)
        if r < 2:
            raise Skip
        if perm is None and self.rng.random() < 0.05:
            return self.node("Transpose", [v.name], v.shape[::-1], v.nonneg)[0]
        perm = list(perm) if perm is not None else [int(p) for p in self.rng.permutation(r)]
        return self.node("Transpose", [v.name], tuple(v.shape[p] for p in perm), v.nonneg, perm=perm)[0]

    def reshape(self, v: Val) -> Val:
        r = self.rng
        s = v.shape
        syms = [i for i, d in enumerate(s) if not _conc(d)]
        if len(syms) > 1 or (syms and syms[0] != 0):
            raise Skip
        rest = list(s[1:]) if syms else list(s)
        n = math.prod(rest)
        kind = r.integers(4)
        if kind == 0:  # flatten the rest
            tgt = [n]
        elif kind == 1 and rest:  # split one dim into two factors
            i = int(r.integers(len(rest)))
            f = [d for d in range(2, rest[i]) if rest[i] % d == 0]
            if not f:
                raise Skip
            a = int(r.choice(f))
            tgt = rest[:i] + [a, rest[i] // a] + rest[i + 1:]
        elif kind == 2 and len(rest) >= 2:  # merge two adjacent dims
            i = int(r.integers(len(rest) - 1))
            tgt = rest[:i] + [rest[i] * rest[i + 1]] + rest[i + 2:]
        else:  # add or drop ones
            tgt = [d for d in rest if d != 1] + ([1] if r.random() < 0.5 else [])
        out = ([s[0]] if syms else []) + tgt
        spelled = list(tgt)
        if syms and r.random() < 0.4:
            spelled = [-1] + spelled  # the batch dim inferred
        else:
            if spelled and r.random() < 0.3:
                spelled[int(r.integers(len(spelled)))] = -1
            if syms:
                spelled = [0] + spelled
        return self.node("Reshape", [v.name, self.ints(spelled)], tuple(out), v.nonneg)[0]

    def flatten(self, v: Val) -> Val:
        r = len(v.shape)
        a = int(self.rng.integers(0, r + 1))
        left, right = v.shape[:a], v.shape[a:]
        def p(dims):
            return math.prod(dims) if all(_conc(d) for d in dims) else (dims[0] if dims == (self.sym,) else "?")
        out = (p(left), p(right))
        attrs = {"axis": a - r if self.rng.random() < 0.3 and r else a} if a != 1 or self.rng.random() < 0.5 else {}
        return self.node("Flatten", [v.name], out, v.nonneg, **attrs)[0]

    def squeeze(self, v: Val) -> Val:
        ones = [i for i, d in enumerate(v.shape) if d == 1]
        if not ones:
            raise Skip
        axes = sorted(set(int(a) for a in self.rng.choice(ones, int(self.rng.integers(1, len(ones) + 1)), replace=False)))
        out = tuple(d for i, d in enumerate(v.shape) if i not in axes)
        spelled = [a - len(v.shape) if self.rng.random() < 0.3 else a for a in axes]
        return self.node("Squeeze", [v.name, self.ints(spelled)], out, v.nonneg)[0]

    def unsqueeze(self, v: Val) -> Val:
        r = len(v.shape)
        if r >= 5:
            raise Skip
        a = int(self.rng.integers(0, r + 1))
        out = v.shape[:a] + (1,) + v.shape[a:]
        spelled = a - (r + 1) if self.rng.random() < 0.3 else a
        return self.node("Unsqueeze", [v.name, self.ints([spelled])], out, v.nonneg)[0]

    def concat(self, v: Val) -> Val:
        r = len(v.shape)
        if r == 0:
            raise Skip
        axis = int(self.rng.integers(r))
        if not _conc(v.shape[axis]):
            raise Skip
        like = [w for w in self.vals if len(w.shape) == r and _conc(w.shape[axis])
                and all(w.shape[i] == v.shape[i] for i in range(r) if i != axis)]
        if len(like) < 2 and self.rng.random() < 0.7:
            like.append(self.unary(v))
        k = int(self.rng.integers(2, 4))
        parts = [v] + [like[int(self.rng.integers(len(like)))] for _ in range(k - 1)]
        out = list(v.shape)
        out[axis] = sum(p.shape[axis] for p in parts)
        spelled = axis - r if self.rng.random() < 0.3 else axis
        return self.node("Concat", [p.name for p in parts], tuple(out), all(p.nonneg for p in parts), axis=spelled)[0]

    def split(self, v: Val) -> Val:
        r = self.rng
        axes = [i for i, d in enumerate(v.shape) if _conc(d) and d >= 2]
        if not axes:
            raise Skip
        axis = int(r.choice(axes))
        d = v.shape[axis]
        k = int(r.integers(2, min(d, 3) + 1))
        cuts = sorted(int(c) for c in r.choice(np.arange(1, d), k - 1, replace=False))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [d])]
        ins, attrs = [v.name], {"axis": axis - len(v.shape) if r.random() < 0.3 else axis}
        if self.opset >= 18 and r.random() < 0.3:  # num_outputs: equal chunks, the last smaller
            chunk = -(-d // k)
            sizes = [chunk] * (d // chunk) + ([d % chunk] if d % chunk else [])
            if len(sizes) != k:
                raise Skip
            attrs["num_outputs"] = k
        elif self.opset < 18 and r.random() < 0.15 and d % k == 0:  # no split: equal parts, as many as outputs
            sizes = [d // k] * k
        else:
            ins.append(self.ints(sizes))
        shapes = [tuple(sz if i == axis else x for i, x in enumerate(v.shape)) for sz in sizes]
        outs = self.node("Split", ins, None, v.nonneg, n_out=len(sizes), shapes=shapes, **attrs)
        return outs[int(r.integers(len(outs)))]

    def slice(self, v: Val) -> Val:
        r = self.rng
        axes = [i for i, d in enumerate(v.shape) if _conc(d) and d >= 2]
        if not axes:
            raise Skip
        chosen = sorted(int(a) for a in r.choice(axes, int(r.integers(1, len(axes) + 1)), replace=False))
        starts, ends, steps, out = [], [], [], list(v.shape)
        for a in chosen:
            d = v.shape[a]
            for _ in range(20):
                step = int(r.choice([1, 1, 1, 2, -1, -2]))
                st = int(r.integers(-d - 1, d + 2))
                en = int(r.choice([int(r.integers(-d - 1, d + 2)), 2**63 - 1 if step > 0 else -(2**63)]))
                n = len(range(*slice(st, en, step).indices(d)))
                if n >= 1:
                    break
            else:
                raise Skip
            starts.append(st), ends.append(en), steps.append(step)
            out[a] = n
        spelled = [a - len(v.shape) if r.random() < 0.2 else a for a in chosen]
        ins = [v.name, self.ints(starts), self.ints(ends)]
        if r.random() < 0.8 or any(s != 1 for s in steps):
            ins.append(self.ints(spelled))
            if r.random() < 0.7 or any(s != 1 for s in steps):
                ins.append(self.ints(steps))
        elif spelled != list(range(len(chosen))):
            raise Skip
        return self.node("Slice", ins, tuple(out), v.nonneg)[0]

    def pad(self, v: Val) -> Val:
        r = self.rng
        rank = len(v.shape)
        if rank == 0:
            raise Skip
        mode = str(r.choice(["constant", "constant", "reflect", "edge"]))
        pads = []
        for side in range(2):
            for d in v.shape:
                if not _conc(d):
                    pads.append(0)
                elif mode == "reflect":
                    pads.append(int(r.integers(0, min(2, d - 1) + 1)))
                else:
                    pads.append(int(r.choice([0, 0, 1, 2] + ([-1] if d >= 3 and mode == "constant" else []))))
        out = tuple(d if not _conc(d) else d + pads[i] + pads[i + rank] for i, d in enumerate(v.shape))
        if any(_conc(d) and d < 1 for d in out):
            raise Skip
        ins = [v.name, self.ints(pads)]
        if mode == "constant" and r.random() < 0.5:
            ins.append(self.const(np.array(r.choice([0.0, 1.0, -2.5]), np.float32), "c"))
        attrs = {"mode": mode} if mode != "constant" or r.random() < 0.3 else {}
        return self.node("Pad", ins, out, v.nonneg and (mode != "constant" or len(ins) == 2), **attrs)[0]

    # patterns the fold and fusion rules look for ------------------------------------------
    def conv_affine(self, v: Val) -> Val:
        c = self.conv(v)
        oc = c.shape[1]
        if self.rng.random() < 0.4:
            return self.batchnorm(c)
        cs = (oc, 1, 1)[: len(c.shape) - 1]
        m = self.node("Mul", [c.name, self.weight(cs)], c.shape)[0]
        return self.node("Add", [m.name, self.weight(cs, 0.5)], c.shape)[0] if self.rng.random() < 0.8 else m

    def hardswish_pattern(self, v: Val) -> Val:
        three = self.const(np.array(3.0, np.float32), "c")
        a = self.node("Add", [v.name, three], v.shape)[0]
        c = self.clip(a, 0.0, 6.0)
        m = self.node("Mul", [v.name, c.name] if self.rng.random() < 0.5 else [c.name, v.name], v.shape)[0]
        if self.rng.random() < 0.5:
            return self.node("Div", [m.name, self.const(np.array(6.0, np.float32), "c")], v.shape)[0]
        return self.node("Mul", [m.name, self.const(np.array(1 / 6, np.float32), "c")], v.shape)[0]

    def gelu_pattern(self, v: Val) -> Val:
        if self.rng.random() < 0.5:
            d = self.node("Div", [v.name, self.const(np.array(math.sqrt(2), np.float32), "c")], v.shape)[0]
        else:
            d = self.node("Mul", [v.name, self.const(np.array(1 / math.sqrt(2), np.float32), "c")], v.shape)[0]
        e = self.node("Erf", [d.name], v.shape)[0]
        one = self.node("Add", [e.name, self.const(np.array(1.0, np.float32), "c")], v.shape)[0]
        m = self.node("Mul", [v.name, one.name], v.shape)[0]
        return self.node("Mul", [m.name, self.const(np.array(0.5, np.float32), "c")], v.shape)[0]

    def transpose_matmul(self, v: Val) -> Val:
        r = len(v.shape)
        if r < 2:
            raise Skip
        swap = list(range(r - 2)) + [r - 1, r - 2]
        if self.rng.random() < 0.5:
            t = self.transpose(v, swap)
            return self.matmul(t)
        m = self.matmul(v)
        return self.transpose(m, swap)

    def parallel_matmul(self, v: Val) -> Val:
        outs = [self.matmul(v) for _ in range(int(self.rng.integers(2, 4)))]
        if self.rng.random() < 0.5 and len({o.shape for o in outs}) == 1:
            return self.node("Add", [outs[0].name, outs[1].name], outs[0].shape)[0]
        return outs[-1]

    def double_transpose(self, v: Val) -> Val:
        t = self.transpose(v)
        return self.transpose(t)

    def const_chain(self, v: Val) -> Val:
        a = self.binary(v, str(self.rng.choice(["Add", "Mul", "Sub"])), None)
        return self.binary(a, str(self.rng.choice(["Add", "Mul", "Div"])), None)

    def rms_pattern(self, v: Val) -> Val:
        """T5's RMS norm over the last axis (x * (1 / sqrt(mean(x^2) + eps)), or x / sqrt(...)), times a weight of
        ones (a freshly initialised model: the fold rules drop its Mul) or of random values."""
        if not v.shape or not _conc(v.shape[-1]):
            raise Skip
        r, ms = self.rng, v.shape[:-1] + (1,)
        p = self.node("Pow", [v.name, self.const(np.array(2.0, np.float32), "c")], v.shape, True)[0]
        if self.opset >= 18:
            m = self.node("ReduceMean", [p.name, self.ints([-1])], ms, True, keepdims=1)[0]
        else:
            m = self.node("ReduceMean", [p.name], ms, True, axes=[-1], keepdims=1)[0]
        a = self.node("Add", [m.name, self.const(np.array(1e-6, np.float32), "c")], ms, True)[0]
        s = self.node("Sqrt", [a.name], ms, True)[0]
        if r.random() < 0.5:
            inv = self.node("Div", [self.const(np.array(1.0, np.float32), "c"), s.name], ms, True)[0]
            n = self.node("Mul", [v.name, inv.name], v.shape)[0]
        else:
            n = self.node("Div", [v.name, s.name], v.shape)[0]
        w = self.const(np.ones(v.shape[-1:], np.float32)) if r.random() < 0.5 else self.weight(v.shape[-1:])
        return self.node("Mul", [w, n.name] if r.random() < 0.5 else [n.name, w], v.shape)[0]

    def silu(self, v: Val) -> Val:
        s = self.unary(v, "Sigmoid")
        return self.node("Mul", [v.name, s.name], v.shape)[0]

    # the model ------------------------------------------------------------------------------
    def start(self) -> None:
        r = self.rng
        b = self.sym or int(r.choice([1, 2, 3]))
        if self.family == "conv":
            shapes = [(b, int(r.choice([1, 2, 3, 4, 8])), *([int(r.integers(4, 13))] * (2 if r.random() < 0.8 else 1)))]
            if r.random() < 0.3:
                h = shapes[0]
                shapes[0] = h[:2] + tuple(int(r.integers(4, 13)) for _ in h[2:])
        elif self.family == "mlp":
            shapes = [(b, int(r.choice([4, 8, 16, 32])))]
        elif self.family == "seq":
            shapes = [(b, int(r.integers(2, 9)), int(r.choice([4, 8, 16])))]
        else:
            rank = int(r.integers(1, 5))
            shapes = [tuple([b] + [int(r.integers(1, 7)) for _ in range(rank - 1)])]
        if r.random() < 0.25:
            shapes.append(shapes[0] if r.random() < 0.6 else shapes[0][:1] + (1,) * (len(shapes[0]) - 1))
        for s in shapes:
            name = f"x{len(self.inputs)}"
            self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(s)))
            self.vals.append(Val(name, tuple(s)))

    OPS = {  # op -> weight by family (conv, mlp, seq, mixed)
        "unary": (3, 3, 3, 3), "clip": (1, 1, 1, 1), "binary": (3, 3, 3, 4), "softmax": (0.5, 1, 1.5, 1),
        "layernorm": (0.3, 1, 1.5, 0.8), "batchnorm": (1, 0.3, 0.3, 0.5), "matmul": (0.3, 3, 3, 1.5),
        "attention": (0, 0.3, 1, 0.5), "gemm": (0, 2, 0, 0.5), "fused_matmul": (0.1, 0.5, 0.5, 0.3),
        "conv": (4, 0, 0, 0.5), "pool": (2, 0, 0, 0.4), "gap": (0.5, 0, 0, 0.2), "transpose": (0.5, 0.5, 1.5, 1),
        "reshape": (0.8, 0.8, 1, 1), "flatten": (0.5, 0.3, 0.3, 0.5), "squeeze": (0.3, 0.3, 0.3, 0.5),
        "unsqueeze": (0.3, 0.3, 0.3, 0.5), "concat": (1, 1, 1, 1), "split": (0.8, 0.8, 0.8, 0.8),
        "slice": (0.8, 0.8, 0.8, 1), "pad": (0.6, 0.3, 0.3, 0.6),
        "conv_affine": (3, 0, 0, 0.3), "hardswish_pattern": (1, 0.7, 0.7, 0.7), "gelu_pattern": (0.5, 1, 1, 0.7),
        "transpose_matmul": (0.1, 1, 1.5, 0.7), "parallel_matmul": (0.1, 1.5, 1.5, 0.5),
        "double_transpose": (0.3, 0.3, 0.8, 0.6), "const_chain": (1, 1, 1, 1), "silu": (0.5, 0.5, 0.5, 0.5),
        "rms_pattern": (0.2, 0.6, 1, 0.5),
    }

    def build(self) -> onnx.ModelProto:
        self.start()
        fam = ["conv", "mlp", "seq", "mixed"].index(self.family)
        names = list(self.OPS)
        w = np.array([self.OPS[n][fam] for n in names], float)
        tries = 0
        while len(self.nodes) < self.max_nodes and tries < 200:
            tries += 1
            op = names[int(self.rng.choice(len(names), p=w / w.sum()))]
            v = self.pick(lambda v: not v.name.startswith("x") or len(self.nodes) == 0 or self.rng.random() < 0.3)
            state = (len(self.nodes), len(self.inits), len(self.vals), self.counter, self.ms, Counter(self.used))
            try:
                getattr(self, op)(v)
            except Skip:
                self.nodes[state[0]:], self.inits[state[1]:], self.vals[state[2]:] = [], [], []
                self.counter, self.ms, self.used = state[3], state[4], state[5]
        return self.finish()

    def finish(self) -> onnx.ModelProto:
        produced = [v for v in self.vals if not v.name.startswith("x")]
        if not produced:
            self.unary(self.vals[0])
            produced = self.vals[-1:]
        leaves = [v for v in produced if not self.used[v.name]]
        outs = leaves[-int(self.rng.integers(1, 4)):] if leaves else produced[-1:]
        if self.rng.random() < 0.1:
            extra = [v for v in produced if v not in outs]
            if extra:
                outs = outs + [extra[int(self.rng.integers(len(extra)))]]

        def vi(v: Val):
            dims = [d if _conc(d) else (d if d == self.sym else None) for d in v.shape]
            return helper.make_tensor_value_info(v.name, TensorProto.FLOAT, dims)

        inits, nodes, inputs = list(self.inits), list(self.nodes), list(self.inputs)
        if self.exposed:
            free = [i for i in inits if i.name in self.free and any(i.name in n.input for n in nodes)]
            for i in free[: int(self.rng.integers(1, 3))]:
                inputs.append(helper.make_tensor_value_info(i.name, TensorProto.FLOAT, list(i.dims)))
        if self.const_nodes:
            made = [helper.make_node("Constant", [], [i.name], name=i.name + "_const", value=i)
                    for i in inits if self.rng.random() < 0.7 and i.name not in {x.name for x in inputs}]
            made_names = {n.output[0] for n in made}
            inits = [i for i in inits if i.name not in made_names]
            nodes = made + nodes
        graph = helper.make_graph(nodes, "fuzz", inputs, [vi(v) for v in outs], inits)
        opsets = [helper.make_opsetid("", self.opset)] + ([helper.make_opsetid("com.microsoft", 1)] if self.ms else [])
        model = helper.make_model(graph, opset_imports=opsets, ir_version=10, producer_name="relsat-fuzz")
        model.metadata_props.add(key="fuzz_family", value=self.family)
        self.outputs = outs
        return model


def _session(model: onnx.ModelProto, optimized: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 4
    if not optimized:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def feeds(model: onnx.ModelProto, seed: int, batch: int = 2, scale: float = 1.0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else batch for d in i.type.tensor_type.shape.dim]
        out[i.name] = np.asarray(rng.standard_normal(dims) * scale, dtype=np.float32)  # rank 0: an array too
    return out


def _check(gen: Gen, model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    for batch in (1, 3) if gen.sym else (None,):
        got = _session(model).run(None, feeds(model, 0, batch or 1))
        for v, g in zip(gen.outputs, got):
            want = tuple(batch if d == gen.sym else d for d in v.shape)
            if any(_conc(w) and w != x for w, x in zip(want, g.shape)) or len(want) != g.ndim:
                raise ValueError(f"generator: {v.name} has shape {g.shape}, tracked {v.shape}")


def generate(seed: int, *, max_nodes: int | None = None, attempts: int = 20, avoid=()) -> onnx.ModelProto:
    """A random model that ONNX Runtime runs; the same seed gives the same model. A draw that ONNX's checker
    or ONNX Runtime rejects (rare: a slip of the generator's shape tracking) is drawn again from the next
    sub-seed; ``model.metadata_props`` records the sub-seed (``fuzz_attempt``)."""
    last = None
    for attempt in range(attempts):
        gen = Gen(seed * 1000 + attempt if attempt else seed, max_nodes, avoid)
        model = gen.build()
        try:
            _check(gen, model)
        except Exception as e:  # noqa: BLE001 - drawn again
            last = e
            continue
        model.metadata_props.add(key="fuzz_attempt", value=str(attempt))
        return model
    raise RuntimeError(f"generator: no valid model for seed {seed} in {attempts} attempts: {last}")


# ------------------------------------------------------------------------------------------ comparison
def compare(original: onnx.ModelProto, written: onnx.ModelProto, seed: int) -> str | None:
    """None when ``written`` agrees with ``original`` under ONNX Runtime on fresh random inputs (two draws,
    and for a dynamic batch dim two sizes), else why not."""
    o_names = [o.name for o in original.graph.output]
    w_names = [o.name for o in written.graph.output]
    if o_names != w_names:
        return f"outputs {w_names} instead of {o_names}"
    try:
        ref_s, plain_s, got_s = _session(original), _session(original, optimized=False), None
        got_s = _session(written)
    except Exception as e:  # noqa: BLE001
        if got_s is None and "ref_s" in locals():
            return f"the written model does not load: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        raise
    dynamic = any(not d.HasField("dim_value") for i in original.graph.input for d in i.type.tensor_type.shape.dim)
    for k, (batch, scale) in enumerate([(2, 1.0), (5 if dynamic else 2, 4.0)]):
        f = feeds(original, 10_000 + seed * 7 + k, batch, scale)
        ref = ref_s.run(None, f)
        plain = plain_s.run(None, f)
        try:
            got = got_s.run(None, f)
        except Exception as e:  # noqa: BLE001
            return f"the written model does not run (batch {batch}): {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        for name, r, p, g in zip(o_names, ref, plain, got):
            if r.shape != g.shape or r.dtype != g.dtype:
                return f"{name}: shape {g.shape} {g.dtype}, want {r.shape} {r.dtype} (batch {batch})"
            r64, g64, p64 = (x.astype(np.float64) for x in (r, g, p))
            nan = np.isnan(r64) | np.isnan(g64)
            if (np.isnan(r64) != np.isnan(g64)).any():
                i = np.unravel_index(np.argmax(np.isnan(r64) != np.isnan(g64)), r.shape)
                return f"{name}: NaN mismatch at {i}: got {g[i]}, want {r[i]} (batch {batch}, scale {scale})"
            fin = np.isfinite(r64) & ~nan
            if (np.isinf(r64) != np.isinf(g64)).any() or (np.isinf(r64) & (r64 != g64)).any():
                i = np.unravel_index(np.argmax(np.isinf(r64) != np.isinf(g64)), r.shape)
                return f"{name}: infinity mismatch at {i}: got {g[i]}, want {r[i]}"
            if not fin.any():
                continue
            mag = float(np.abs(r64[fin]).max())
            noise = float(np.abs(np.where(fin, r64 - p64, 0)).max())
            floor = FLOOR_ULPS * np.finfo(np.float32).eps * mag + NOISE_FACTOR * noise
            err = np.where(fin, np.abs(g64 - r64), 0.0)
            tol = ATOL + RTOL * np.abs(np.where(fin, r64, 0.0)) + floor
            if (err > tol).any():
                i = np.unravel_index(np.argmax(err - tol), r.shape)
                return (f"{name}: differs at {i}: got {g[i]!r}, want {r[i]!r} (|err| {err[i]:.3g} > tol {tol[i]:.3g}; "
                        f"batch {batch}, scale {scale})")
    return None


# ------------------------------------------------------------------------------------------ campaign
_MASK = [(re.compile(r"'[^']*'|\"[^\"]*\""), "'…'"), (re.compile(r"-?\d+(\.\d+)?(e-?\d+)?"), "#"),
         (re.compile(r"\b[tnwckx]\d+\b"), "#")]


def reason_of(message: str) -> str:
    """A refusal's reason with its names and numbers masked, so that refusals group."""
    text = re.sub(r"^<model>:\s*", "", message)
    for pat, rep in _MASK:
        text = pat.sub(rep, text)
    return text[:160]


def model_info(model: onnx.ModelProto) -> dict:
    dyn = any(d.dim_param for i in model.graph.input for d in i.type.tensor_type.shape.dim)
    return {"nodes": len(model.graph.node), "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "dynamic": dyn, "ops": dict(sorted(Counter(n.op_type for n in model.graph.node).items()))}


def plan(index: int, seed: int, per_model: str, search_every: int, measure_every: int = 0) -> list[dict]:
    """The optimize settings a model runs with: every rule set (``per_model == 'all'``) or one, by turns;
    for every ``search_every``-th model also the mcts and backtracking searches (default rules); for every
    ``measure_every``-th model also the measured choice (``measured``: one-node costs profiled, candidates
    profiled whole, timed against the input model, the fastest verified: what ``relsat optimize`` does by
    default, and what the cheap settings leave out), with a rule set by turns."""
    sets = RULE_SETS if per_model == "all" else (RULE_SETS[index % len(RULE_SETS)],)
    runs = [{"rules": [s]} for s in sets]
    if search_every and index % search_every == search_every - 1:
        rs = RULE_SETS[(index // search_every) % len(RULE_SETS)]
        runs += [{"rules": [rs], "search": "mcts", "budget": 4, "seed": seed},
                 {"rules": [rs], "search": "backtrack", "budget": 6}]
    if measure_every and index % measure_every == measure_every - 1:
        runs.append({"rules": [RULE_SETS[(index // measure_every) % len(RULE_SETS)]], "measured": True})
    return runs


def run_one(model: onnx.ModelProto, settings: dict, seed: int, workdir: Path) -> dict:
    """One optimize of ``model`` under ``settings``, classified (module docstring)."""
    from relsat.driver.errors import RelsatError
    from relsat.driver.app.optimize import optimize

    rec = {"settings": settings, "status": "ok"}
    out = workdir / f"out-{os.getpid()}-{time.monotonic_ns()}.onnx"
    overrides, cache = dict(settings), None
    if overrides.pop("measured", False):  # a cost cache of the worker's own: never the user's, never shared
        overrides.update(cost_model="measured", measure=True, candidates=MEASURED_CANDIDATES)
        cache = workdir / f"costs-{os.getpid()}.duckdb"
    t = time.perf_counter()
    try:
        res = optimize(model, output=out, cost_cache=cache, **{**CHEAP, **overrides})
        rec["written"] = res.report.written
        rec["nodes_out"] = res.report.nodes_out
        if cache is not None:  # what the measured choice did (a run that timed nothing did not test it)
            rec["verdict"] = res.report["verdict"]
            rec["timed"] = len([c for c in res.report["candidates"] or [] if c.get("measured_ms") is not None])
        fb = [n for n in res.report.notices if "cannot be used" in n]
        if fb:
            rec["fallbacks"] = fb
        written = onnx.load(str(out))
        why = compare(model, written, seed)
        if why is not None:
            rec.update(status="wrong", detail=why)
    except RelsatError as e:
        rec.update(status="refused", error=str(e), reason=reason_of(str(e)))
        if "\n" in str(e):
            rec.update(status="crash", type="RelsatError", message="a RelsatError of several lines")
    except Exception as e:  # noqa: BLE001 - every other exception is a crash, recorded
        rec.update(status="crash", type=type(e).__name__, message=" ".join(str(e).split())[:500],
                   traceback=traceback.format_exc().splitlines()[-12:])
    finally:
        out.unlink(missing_ok=True)
    rec["seconds"] = round(time.perf_counter() - t, 3)
    return rec


RANK = {"ok": 0, "refused": 1, "wrong": 2, "crash": 3}


def fuzz_model(index: int, seed: int, *, per_model: str = "all", search_every: int = 10, workdir=None,
               save_dir=None, max_nodes: int | None = None, avoid=(), measure_every: int = 0) -> dict:
    """Generate model ``index`` of the campaign of ``seed`` and run it through every planned setting."""
    mseed = seed * 1_000_003 + index
    rec = {"index": index, "seed": mseed}
    try:
        model = generate(mseed, max_nodes=max_nodes, avoid=avoid)
    except Exception as e:  # noqa: BLE001
        rec.update(status="crash", runs=[], generator=f"{type(e).__name__}: {e}")
        return rec
    rec.update(model_info(model))
    with tempfile.TemporaryDirectory(prefix="relsat-fuzz-") as tmp:
        rec["runs"] = [run_one(model, s, mseed, Path(workdir or tmp))
                       for s in plan(index, mseed, per_model, search_every, measure_every)]
    rec["status"] = max((r["status"] for r in rec["runs"]), key=RANK.get, default="ok")
    if rec["status"] in ("crash", "wrong") and save_dir is not None:
        Path(save_dir).mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(Path(save_dir) / f"model-{index}-seed-{mseed}.onnx"))
    return rec


def summarize(records: list[dict]) -> dict:
    runs = [r for rec in records for r in rec.get("runs", [])]
    by = Counter(r["status"] for r in runs)
    return {
        "models": len(records),
        "runs": len(runs),
        "models_by_status": dict(Counter(rec["status"] for rec in records)),
        "runs_by_status": {k: by.get(k, 0) for k in ("ok", "refused", "crash", "wrong")},
        "written_optimized": sum(r.get("written") == "optimized" for r in runs),
        "refusals": dict(Counter(r["reason"] for r in runs if r["status"] == "refused").most_common()),
        "crashes": dict(Counter(f"{r.get('type')}: {reason_of(r.get('message', ''))[:120]}"
                                for r in runs if r["status"] == "crash").most_common())
        | {f"worker: {rec.get('generator') or rec.get('worker')}": 1 for rec in records if not rec.get("runs")},
        "wrong": dict(Counter(reason_of(r["detail"])[:120] for r in runs if r["status"] == "wrong").most_common()),
        "fallbacks": sum(bool(r.get("fallbacks")) for r in runs),
        "ops": dict(Counter(op for rec in records for op in rec.get("ops", {})).most_common()),
    }


def print_summary(s: dict, file=sys.stdout) -> None:
    p = lambda *a: print(*a, file=file)  # noqa: E731
    rs = s["runs_by_status"]
    p(f"models {s['models']}, optimize runs {s['runs']}: ok {rs['ok']}, refused {rs['refused']}, "
      f"crash {rs['crash']}, wrong {rs['wrong']} (models by worst run: {s['models_by_status']}; "
      f"{s['written_optimized']} runs wrote an optimized graph, {s['fallbacks']} fell back past an extraction)")
    for title, key in (("refusals by reason", "refusals"), ("crashes", "crashes"), ("wrong", "wrong")):
        if s[key]:
            p(f"{title}:")
            for k, n in s[key].items():
                p(f"  {n:6d}  {k}")


def _worker(conn, opts):
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(fuzz_model(job, **opts))


def campaign(models: int, seed: int, out=None, *, jobs: int = 1, timeout: float = 300.0, per_model: str = "all",
             search_every: int = 10, start: int = 0, isolate: bool = True, progress=None, save_dir=None,
             deadline: float | None = None, max_nodes: int | None = None, avoid=(), measure_every: int = 0) -> list[dict]:
    """Run ``models`` models (indices ``start``..) and return their records (written to ``out`` as they come).
    ``isolate``: each model in a worker process, killed past ``timeout`` seconds (recorded as a crash);
    ``deadline`` (``time.monotonic()``): no model is started after it."""
    more = lambda: deadline is None or time.monotonic() < deadline  # noqa: E731
    save_dir = save_dir or (Path(str(out) + ".failures") if out else None)
    opts = dict(seed=seed, per_model=per_model, search_every=search_every, save_dir=save_dir, max_nodes=max_nodes,
                avoid=tuple(avoid), measure_every=measure_every)
    fh = open(out, "w") if out else None
    records: list[dict] = []

    def done(rec):
        records.append(rec)
        if fh:
            fh.write(json.dumps(rec, default=str) + "\n")
            fh.flush()
        if progress:
            progress(rec)

    try:
        if not isolate:
            for i in range(start, start + models):
                if not more():
                    break
                done(fuzz_model(i, **opts))
            return records
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        todo = list(range(start, start + models))[::-1]
        workers = []  # [process, conn, job, started]

        def spawn():
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(b, opts), daemon=True)
            p.start()
            return [p, a, None, 0.0]

        workers = [spawn() for _ in range(max(1, min(jobs, models)))]
        while todo or any(w[2] is not None for w in workers):
            for k, w in enumerate(workers):
                p, conn, job, t0 = w
                if job is None and todo and not more():
                    todo.clear()
                if job is None and todo:
                    w[2], w[3] = todo.pop(), time.monotonic()
                    conn.send(w[2])
                    continue
                if job is None:
                    continue
                if conn.poll(0.05):
                    try:
                        done(conn.recv())
                        w[2] = None
                        continue
                    except EOFError:
                        pass
                if not p.is_alive() or time.monotonic() - t0 > timeout:
                    why = (f"worker exited with code {p.exitcode}" if not p.is_alive()
                           else f"timeout: more than {timeout:.0f} s")
                    p.kill()
                    p.join()
                    done({"index": job, "seed": seed * 1_000_003 + job, "status": "crash", "runs": [], "worker": why})
                    workers[k] = spawn()
        for p, conn, _, _ in workers:
            conn.send(None)
            p.join(5)
            if p.is_alive():
                p.kill()
        return records
    finally:
        if fh:
            fh.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m relsat.benchmarks.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first model index (to resume or split a campaign)")
    ap.add_argument("--out", default="fuzz.jsonl", help="one JSON line per model")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one model (all its runs) may take")
    ap.add_argument("--per-model", choices=("all", "one"), default="all",
                    help="all: every shipped rule set on every model; one: one rule set per model, by turns")
    ap.add_argument("--search-every", type=int, default=10, help="every Nth model also runs mcts and backtrack (0: never)")
    ap.add_argument("--measure-every", type=int, default=0,
                    help="every Nth model also runs the measured choice, timings included (0: never)")
    ap.add_argument("--avoid", action="append", default=[], choices=FEATURES,
                    help="turn off a model-wide feature (e.g. one a known bug trips on); repeatable")
    ap.add_argument("--max-nodes", type=int, default=None, help="nodes per model (default: drawn, 3-25)")
    ap.add_argument("--minutes", type=float, default=None, help="stop starting models after this long")
    ap.add_argument("--summarize", metavar="FILE.jsonl", help="only print the summary of an earlier campaign's file")
    a = ap.parse_args(argv)
    if a.summarize:
        print_summary(summarize([json.loads(line) for line in open(a.summarize) if line.strip()]))
        return 0
    t0 = time.monotonic()
    counts = Counter()

    def progress(rec):
        counts[rec["status"]] += 1
        n = sum(counts.values())
        if rec["status"] in ("crash", "wrong") or n % 25 == 0:
            print(f"[{n}/{a.models} {time.monotonic() - t0:.0f}s] {dict(counts)}"
                  + (f" model {rec['index']}: {rec['status']}" if rec["status"] in ("crash", "wrong") else ""), flush=True)

    deadline = t0 + a.minutes * 60 if a.minutes is not None else None
    records = campaign(a.models, a.seed, a.out, jobs=a.jobs, timeout=a.timeout, per_model=a.per_model,
                       search_every=a.search_every, start=a.start, progress=progress, deadline=deadline,
                       max_nodes=a.max_nodes, avoid=a.avoid, measure_every=a.measure_every)
    s = summarize(records)
    print_summary(s)
    print(f"{time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
