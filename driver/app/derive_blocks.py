"""Zero-block weights split (issue 28, item 3): the third derivation inside ``relsat optimize``, beside
mask-aware blocking and low-rank kernels (``driver/app/derive.py``, which checks and adds what this finds).

Owns finding constant weights whose exact zeros make them block-diagonal over channels, and the derived forms
that do not multiply the zeros:

- a ``Conv`` (group 1) whose weight [O, I, ...], after a permutation of its output channels and of its input
  channels, is g blocks of O/g x I/g (every other entry exactly 0) becomes a grouped ``Conv`` (group g), with a
  constant-index ``Gather`` on the channel axis before it (input channels) and after it (output channels) only
  where the permutation is not the identity (a grouped or depthwise convolution a merging tool exported dense
  needs none);
- a ``MatMul`` (or a ``Gemm`` without transA) whose constant right operand [K, N] is block-diagonal so becomes
  either a batched form (Reshape to [.., g, K/g], Transpose, one MatMul with a [g, K/g, N/g] weight, back) or g
  Slices, g small MatMuls and a Concat: both are timed under ONNX Runtime on the model's own input and the faster
  is used.

The structure is read from the weight's values alone: the connected components of the nonzero pattern of its
[out, in] channel matrix (hook-and-shortcut labelling in NumPy, linear in the nonzeros per pass), packed first
fit into g equal blocks (the largest g that packs); the contiguous split is kept as found where it is exact, so
identity permutations need no Gather. A weight with more than half its entries nonzero cannot split into two or
more equal blocks and is not looked at further. Used only where exact (the zeros are exact by construction) and
the derived subgraph passes ``derive.check`` under ONNX Runtime.

Not done: block-triangular weights (zero blocks on one side of the diagonal) and whole output channels that are
zero (they pack as blocks of their own here, but are still computed); a Conv already grouped is not split further.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relsat.driver.app.derive import Chain, Derivation, _constants, _fixed_initializers, _subgraph, check

KIND = "zero-blocks"
MAX_SPLIT = 16  # the split MatMul form (g MatMuls and a Concat) is built and timed only up to this many blocks
TIME_BUDGET_S = 0.1  # timed seconds per MatMul form when choosing between the two


@dataclass(frozen=True)
class Blocks:
    """A weight's block structure: ``g`` blocks; ``out``/``inp`` the output / input channels in block order
    (block b's are the b-th O/g resp. I/g of them); ``identity``: both orders as stored."""

    g: int
    out: np.ndarray
    inp: np.ndarray

    @property
    def identity(self) -> bool:
        return bool((self.out == np.arange(self.out.size)).all() and (self.inp == np.arange(self.inp.size)).all())


def find_blocks(model: onnx.ModelProto) -> list[Chain]:
    """Every group-1 ``Conv``, ``MatMul`` and ``Gemm`` (transA 0) whose weight is a fixed float initializer and whose
    data input is not constant: the candidates (``block_form`` decides from the weight's values)."""
    g = model.graph
    const = _constants(g)
    fixed = _fixed_initializers(g)
    inits = {t.name: t for t in g.initializer if t.name in fixed}
    out = []
    for n in g.node:
        if n.domain not in ("", "ai.onnx") or n.op_type not in ("Conv", "MatMul", "Gemm") or len(n.input) < 2:
            continue
        w = inits.get(n.input[1])
        if w is None or w.data_type != onnx.TensorProto.FLOAT or n.input[0] in const:
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        extra = [i for i in n.input[2:] if i]
        if n.op_type == "Conv" and (len(w.dims) < 3 or a.get("group", 1) != 1):
            continue
        if n.op_type != "Conv" and (len(w.dims) != 2 or a.get("transA", 0)):
            continue
        if any(i not in inits for i in extra):
            continue
        out.append(Chain([n], n.output[0], "", [n.input[1], *extra], [n.input[0]], kind=KIND))
    return out


def _matrix(c: Chain, values: dict) -> np.ndarray:
    """The weight as [out, in, ...]: a Conv's as stored, a MatMul's [K, N] transposed (a Gemm's per transB)."""
    w = np.asarray(values[c.consts[0]])
    n = c.nodes[0]
    if n.op_type == "Conv":
        return w
    trans_b = n.op_type == "Gemm" and any(a.name == "transB" and a.i for a in n.attribute)
    return w if trans_b else w.T


def components(nz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Component labels of the bipartite graph of the bool [O, I] pattern ``nz``: (labels of the O rows, labels
    of the I columns), each the smallest node id of its component (rows 0..O-1, columns O..O+I-1)."""
    o, i = nz.shape
    r, col = np.nonzero(nz)
    u, v = r, col + o
    lab = np.arange(o + i)
    while True:
        old = lab.copy()
        lu, lv = lab[u], lab[v]
        m = np.minimum(lu, lv)
        np.minimum.at(lab, lu, m)  # hook each root to the smaller neighbour's label
        np.minimum.at(lab, lv, m)
        while True:  # shortcut to the roots
            nxt = lab[lab]
            if (nxt == lab).all():
                break
            lab = nxt
        if (lab == old).all():
            return lab[:o], lab[o:]


def _contiguous(nz: np.ndarray, g: int) -> bool:
    o, i = nz.shape
    b = nz.reshape(g, o // g, g, i // g).any(axis=(1, 3))
    return not (b & ~np.eye(g, dtype=bool)).any()


def blocks(w: np.ndarray) -> Blocks | None:
    """The block structure of ``w`` [O, I, ...] (exact zeros): the most equal blocks its nonzero pattern's
    components pack into, the contiguous split as stored where it is as fine; None where there are fewer than 2."""
    o, i = w.shape[:2]
    nz = (w != 0).reshape(o, i, -1).any(axis=2)
    if not nz.any() or 2 * int(nz.sum()) > o * i or np.gcd(o, i) < 2:
        return None  # two or more equal blocks leave at least half the entries zero
    divisors = [g for g in range(np.gcd(o, i), 1, -1) if o % g == 0 and i % g == 0]
    as_is = next((g for g in divisors if _contiguous(nz, g)), 1)
    lr, lc = components(nz)
    labels = np.unique(np.concatenate([lr, lc]))
    if labels.size < 2:
        return None
    rows = {k: np.flatnonzero(lr == k) for k in labels}
    cols = {k: np.flatnonzero(lc == k) for k in labels}
    # the channel order as found: components by their first channel (stable, so equal sizes keep it)
    order = sorted(labels, key=lambda k: (-(rows[k].size + cols[k].size), k))
    for g in divisors:
        if g <= as_is:
            break
        if g > labels.size:
            continue
        cap_o, cap_i = o // g, i // g
        bins: list[list] = [[] for _ in range(g)]
        fill = np.zeros((g, 2), dtype=np.int64)
        for k in order:  # first fit, largest components first
            need = np.array([rows[k].size, cols[k].size])
            room = np.flatnonzero(((fill + need) <= [cap_o, cap_i]).all(axis=1))
            if room.size == 0:
                break
            bins[room[0]].append(k)
            fill[room[0]] += need
        else:
            found = []
            for side in (rows, cols):  # the blocks in output channel order, or in input channel order
                bins.sort(key=lambda b: min(int(side[k].min(initial=o + i)) for k in b))
                found.append(Blocks(g, *(np.concatenate([np.sort(np.concatenate([s[k] for k in b])) for b in bins])
                                         for s in (rows, cols))))
            return max(found, key=lambda f: ((f.out == np.arange(o)).all(), (f.inp == np.arange(i)).all()))
    return Blocks(as_is, np.arange(o), np.arange(i)) if as_is > 1 else None


def block_form(c: Chain, values: dict[str, np.ndarray]) -> Blocks | None:
    """``c``'s weight's block structure (``blocks``), or None: the weight alone decides."""
    return blocks(_matrix(c, values))


def _gather(x: str, idx: np.ndarray, axis: int, name: str, out: str):
    t = numpy_helper.from_array(idx.astype(np.int64), f"{name}.idx")
    return helper.make_node("Gather", [x, t.name], [out], name=name, axis=axis), t


def _conv(c: Chain, values: dict, b: Blocks):
    """The grouped Conv (with Gathers where the permutation is not the identity)."""
    n, pre = c.nodes[0], f"{c.root}.blocks"
    w = np.asarray(values[c.consts[0]], dtype=np.float32)
    o, i = w.shape[:2]
    bo, bi = o // b.g, i // b.g
    wp = w[b.out][:, b.inp].reshape(b.g, bo, b.g, bi, *w.shape[2:])
    wg = np.stack([wp[k, :, k] for k in range(b.g)]).reshape(o, bi, *w.shape[2:])
    nodes, inits = [], [numpy_helper.from_array(np.ascontiguousarray(wg), f"{pre}.w")]
    x = n.input[0]
    if not (b.inp == np.arange(i)).all():
        node, t = _gather(x, b.inp, 1, f"{pre}.in", f"{pre}.in")
        nodes.append(node), inits.append(t)
        x = node.output[0]
    ins = [x, f"{pre}.w"]
    if len(c.consts) > 1:
        bias = np.asarray(values[c.consts[1]], dtype=np.float32)[b.out]
        inits.append(numpy_helper.from_array(bias, f"{pre}.b"))
        ins.append(f"{pre}.b")
    permuted = not (b.out == np.arange(o)).all()
    attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute if a.name != "group"}
    y = f"{pre}.grouped" if permuted else c.root
    nodes.append(helper.make_node("Conv", ins, [y], name=f"{pre}.conv", group=b.g, **attrs))
    if permuted:
        node, t = _gather(y, np.argsort(b.out), 1, f"{pre}.out", c.root)
        nodes.append(node), inits.append(t)
    return nodes, inits


def _matmul(c: Chain, values: dict, b: Blocks, batched: bool):
    """A block-diagonal MatMul (or Gemm) as one batched MatMul over the blocks (``batched``) or as g Slices (or
    Gathers) of the input, g MatMuls and a Concat; a Gemm's alpha folded into the weight, its beta * C added."""
    n, pre = c.nodes[0], f"{c.root}.blocks"
    a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
    wm = _matrix(c, values).astype(np.float64) * a.get("alpha", 1.0)  # [N, K]
    nn, k = wm.shape
    bn, bk = nn // b.g, k // b.g
    wb = np.stack([wm[b.out[j * bn:(j + 1) * bn]][:, b.inp[j * bk:(j + 1) * bk]].T for j in range(b.g)])
    x, r = n.input[0], values[n.input[0]].ndim
    nodes, inits = [], []
    tail = len(c.consts) > 1 or not (b.out == np.arange(nn)).all()
    y = f"{pre}.y" if tail else c.root
    in_id = (b.inp == np.arange(k)).all()
    if batched:
        if not in_id:
            node, t = _gather(x, b.inp, -1, f"{pre}.in", f"{pre}.in")
            nodes.append(node), inits.append(t)
            x = node.output[0]
        inits += [numpy_helper.from_array(np.array([0] * (r - 1) + [b.g, bk], np.int64), f"{pre}.split_shape"),
                  numpy_helper.from_array(np.array([0] * (r - 1) + [nn], np.int64), f"{pre}.join_shape"),
                  numpy_helper.from_array(wb.reshape(b.g, *[1] * (r - 2), bk, bn).astype(np.float32), f"{pre}.w")]
        nodes += [helper.make_node("Reshape", [x, f"{pre}.split_shape"], [f"{pre}.split"], name=f"{pre}.split"),
                  helper.make_node("Transpose", [f"{pre}.split"], [f"{pre}.front"], name=f"{pre}.front",
                                   perm=[r - 1, *range(r - 1), r]),
                  helper.make_node("MatMul", [f"{pre}.front", f"{pre}.w"], [f"{pre}.mm"], name=f"{pre}.mm"),
                  helper.make_node("Transpose", [f"{pre}.mm"], [f"{pre}.back"], name=f"{pre}.back",
                                   perm=[*range(1, r), 0, r]),
                  helper.make_node("Reshape", [f"{pre}.back", f"{pre}.join_shape"], [y], name=f"{pre}.join")]
    else:
        outs = []
        for j in range(b.g):
            cols = b.inp[j * bk:(j + 1) * bk]
            if in_id:
                for s, v in (("starts", j * bk), ("ends", (j + 1) * bk), ("axes", -1)):
                    inits.append(numpy_helper.from_array(np.array([v], np.int64), f"{pre}.{j}.{s}"))
                nodes.append(helper.make_node("Slice", [x, *(f"{pre}.{j}.{s}" for s in ("starts", "ends", "axes"))],
                                              [f"{pre}.{j}.x"], name=f"{pre}.{j}.x"))
            else:
                node, t = _gather(x, cols, -1, f"{pre}.{j}.x", f"{pre}.{j}.x")
                nodes.append(node), inits.append(t)
            inits.append(numpy_helper.from_array(wb[j].astype(np.float32), f"{pre}.{j}.w"))
            nodes.append(helper.make_node("MatMul", [f"{pre}.{j}.x", f"{pre}.{j}.w"], [f"{pre}.{j}.y"],
                                          name=f"{pre}.{j}.mm"))
            outs.append(f"{pre}.{j}.y")
        nodes.append(helper.make_node("Concat", outs, [y], name=f"{pre}.concat", axis=-1))
    if not (b.out == np.arange(nn)).all():
        last = c.root if len(c.consts) == 1 else f"{pre}.unperm"
        node, t = _gather(y, np.argsort(b.out), -1, f"{pre}.out", last)
        nodes.append(node), inits.append(t)
        y = last
    if len(c.consts) > 1:  # Gemm's C
        bias = np.asarray(values[c.consts[1]], dtype=np.float64) * a.get("beta", 1.0)
        inits.append(numpy_helper.from_array(bias.astype(np.float32), f"{pre}.c"))
        nodes.append(helper.make_node("Add", [y, f"{pre}.c"], [c.root], name=f"{pre}.c"))
    return nodes, inits


def _faster(c: Chain, forms: list, values: dict, threads: int) -> tuple[int, list[float]]:
    """Which of the derived ``forms`` (nodes, inits) ONNX Runtime runs faster on ``c``'s input (medians of
    interleaved runs: CPU time at one thread, else wall clock), and each one's ms."""
    from relsat.driver.boundary.latency import time_models

    ins = {n: values[n] for n in c.inputs}
    used = [{i for n in nodes for i in n.input} for nodes, _ in forms]
    consts = [numpy_helper.from_array(np.asarray(values[n], dtype=np.float32), n) for n in c.consts]
    models = [_subgraph(nodes, [*inits, *(t for t in consts if t.name in u)], ins, c.root)
              for (nodes, inits), u in zip(forms, used)]
    lat = time_models(models, threads=threads, input_shapes={n: list(a.shape) for n, a in ins.items()},
                      budget_s=TIME_BUDGET_S, min_runs=5)
    ms = [x.cpu_ms if threads == 1 else x.median_ms for x in lat]
    return int(np.argmin(ms)), ms


def derive_zero_blocks(c: Chain, values: dict[str, np.ndarray], threads: int, seed: int = 0,
                       form: Blocks | None = None) -> Derivation | str | None:
    """``c``'s Conv as a grouped Conv, or its MatMul / Gemm as a batched or split one (the faster under ONNX
    Runtime), where its weight is block-diagonal up to channel permutations (``blocks``); checked against the
    original (``derive.check``); why not (one line) where the check fails; None where there are no blocks."""
    t0 = time.perf_counter()
    b = form if form is not None else block_form(c, values)
    if b is None:
        return None
    n = c.nodes[0]
    w = _matrix(c, values)
    o, i = w.shape[:2]
    perm = "as stored" if b.identity else "after a permutation of the channels (Gathers)"
    if n.op_type == "Conv":
        nodes, inits = _conv(c, values, b)
        how = f"a Conv with group {b.g}"
    elif values[n.input[0]].ndim < 2:
        return None
    else:
        forms = [_matmul(c, values, b, batched=True)]
        if b.g <= MAX_SPLIT:
            forms.append(_matmul(c, values, b, batched=False))
        pick, ms = _faster(c, forms, values, threads) if len(forms) > 1 else (0, [])
        nodes, inits = forms[pick]
        how = ("one batched MatMul over the blocks" if pick == 0 else f"{b.g} MatMuls and a Concat") + (
            f" (ONNX Runtime: batched {ms[0]:.3f} ms, split {ms[1]:.3f} ms)" if ms else "")
    err = check(c, nodes, inits, values, threads, seed)
    if isinstance(err, str):
        return err
    ops: dict[str, int] = {}
    for x in nodes:
        ops[x.op_type] = ops.get(x.op_type, 0) + 1
    detail = (f"weight {c.consts[0]} {list(np.asarray(values[c.consts[0]]).shape)} is {b.g} blocks of {o // b.g} x "
              f"{i // b.g} channels {perm}: {how} ({o * i // b.g} of {o * i} channel products)")
    return Derivation(c.root, c.kind, [n.name or n.output[0]], ops, detail, float(err), time.perf_counter() - t0,
                      nodes, inits)
