"""EinNet-style derivations inside ``relsat optimize`` (issue 28): derived forms of subgraphs enter the
e-graph as alternatives, priced by the same costs as every rewrite, before saturation.

Owns finding the subgraphs a derivation applies to, deriving them, checking them, and adding them to the
e-graph. Three derivations run here, all removing computation whose result the constants decide (the third,
zero-block weights split into grouped or batched forms, is found in ``driver/app/derive_blocks.py``):

**Mask-aware blocking** (``relations/tensor_mask.py``). A ``Softmax`` whose input adds a constant mask to a product ``MatMul(A, B)`` (scaled by a constant or not),
and whose result is read by a ``MatMul`` alone, is lowered to one tensor-expression program
(``tensor_lower.lower_graph``); ``band_blocks`` reads the mask's values, finds the band outside which they
annihilate the Softmax, and rewrites the whole program to iterate only over it, in blocks; the result is
split into gathers (``gathers_apart``) and matched back to ONNX operators (``tensor_match.match``). Nothing
here knows attention or bands: the mask's values decide, and a mask with no band to skip derives nothing.

**Low-rank kernels** (``derive_low_rank``). A k x k ``Conv`` whose constant weight has low rank as a matrix over
(output channel, kernel column) x (input channel, kernel row) is a k x 1 convolution into R channels followed by
a 1 x k one (what GCN's separable kernels are, merged): found from the weight's singular values, used only where
the rank-R product gives the weight back exactly and costs fewer multiplications.

Every derived subgraph is checked numerically before use: the matched ONNX nodes against the original
nodes under ONNX Runtime, on the values the model itself produces at the costed binding plus random draws,
the mask at its real values (the NumPy evaluation by definition that the tensor tests use does not scale to
a sequence of 4096). Only subgraphs whose inputs have static shapes are derived (the derived gathers fix
the sizes). The derived model (the input with the subgraph replaced) is then imported into the same e-graph,
where everything it shares with the input hash-conses to the same e-classes, and the subgraph's result is
unioned with the original's: extraction chooses between them by cost, and the written model is verified
against the input as always.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relsat.driver.boundary.onnx_import import import_model
from relsat.driver.boundary.verify import compare_output
from relsat.relations import runtime
from relsat.relations.onnx_form import subgraphs
from relsat.relations.tensor_lower import NotLowerable, lower_graph
from relsat.relations.tensor_mask import band, band_blocks, gathers_apart
from relsat.relations.tensor_match import NoMatch, match

DRAWS = 2  # random draws beside the model's own values
MIN_BLOCK = 32  # rows per block at least (smaller blocks cost more in gathers than they save)
SVD_WORK = 2e9  # a weight's SVD costs about min(rows, cols)^2 * max(rows, cols): larger ones are not tried
SVD_SECONDS = 5.0  # all weights' SVDs in one run together, at most (the rest are not tried)


@dataclass
class Chain:
    """A subgraph a derivation applies to: ``nodes`` in order, ``root`` the last node's output (the value the
    derived form replaces), the constants it reads (``consts``: values the derivation uses) and its other
    inputs; ``mask`` the constant mask's name for a masked Softmax, empty for a convolution."""

    nodes: list
    root: str
    mask: str
    consts: list[str]
    inputs: list[str]
    kind: str = "mask-band-blocks"


@dataclass
class Derivation:
    """One derived subgraph: where, how, what it became, and how it was checked."""

    root: str
    kind: str
    replaced: list[str]  # the original nodes' names
    ops: dict[str, int]  # the derived nodes' op types
    detail: str
    max_error: float
    seconds: float
    nodes: list = field(default_factory=list, repr=False)
    inits: list = field(default_factory=list, repr=False)

    def as_dict(self) -> dict:
        return {"root": self.root, "kind": self.kind, "replaced": self.replaced, "ops": self.ops,
                "detail": self.detail, "max_error": self.max_error, "seconds": round(self.seconds, 3)}


def _constants(graph: onnx.GraphProto) -> set[str]:
    """Values computed from initializers and Constant nodes alone (default-domain nodes without subgraphs). An
    initializer also listed as a graph input is not one: a caller may override it (ONNX IR >= 4)."""
    const = _fixed_initializers(graph)
    for n in graph.node:
        if n.domain not in ("", "ai.onnx") or any(subgraphs(n)):
            continue
        if all(not i or i in const for i in n.input):
            const.update(o for o in n.output if o)
    return const


def _fixed_initializers(graph: onnx.GraphProto) -> set[str]:
    return {t.name for t in graph.initializer} - {v.name for v in graph.input}


def find_chains(model: onnx.ModelProto) -> list[Chain]:
    """Every ``MatMul -> [Mul|Div by a constant] -> Add(constant mask) -> Softmax -> MatMul`` whose inner values
    are read by the chain alone."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output if o}
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    for o in g.output:
        readers[o.name] = readers.get(o.name, 0) + 1
    const = _constants(g)
    out = []
    for sm in g.node:
        if sm.op_type != "Softmax" or sm.domain not in ("", "ai.onnx"):
            continue
        add = producer.get(sm.input[0])
        if add is None or add.op_type != "Add":
            continue
        masks = [i for i in add.input if i in const]
        if len(masks) != 1:
            continue
        mask, (x,) = masks[0], [i for i in add.input if i not in const]
        chain, consts = [add, sm], [mask]
        scale = producer.get(x)
        if scale is not None and scale.op_type in ("Mul", "Div") and scale.input[1] in const \
                and scale.input[0] not in const:
            chain.insert(0, scale)
            consts.append(scale.input[1])
            x = scale.input[0]
        mm1 = producer.get(x)
        if mm1 is None or mm1.op_type != "MatMul" or any(i in const for i in mm1.input):
            continue
        chain.insert(0, mm1)
        mm2 = [n for n in g.node if sm.output[0] in n.input]
        if len(mm2) != 1 or mm2[0].op_type != "MatMul" or list(mm2[0].input).index(sm.output[0]) != 0 \
                or mm2[0].input[1] in const:
            continue
        chain.append(mm2[0])
        if any(readers.get(n.output[0], 0) != 1 for n in chain[:-1]):
            continue  # an inner value read elsewhere: it must stay computed
        out.append(Chain(chain, mm2[0].output[0], mask, consts, [*mm1.input, mm2[0].input[1]]))
    return out


def find_convs(model: onnx.ModelProto) -> list[Chain]:
    """Every 2-D ``Conv`` (group 1, explicit pads) whose k x k kernel (both sides above 1) is a constant: where
    its weight has low rank as a matrix over (output channel, kernel column) x (input channel, kernel row),
    the convolution splits into a k x 1 and a 1 x k one (``derive_low_rank``)."""
    g = model.graph
    const = _constants(g)
    fixed = _fixed_initializers(g)
    inits = {t.name: t for t in g.initializer if t.name in fixed}
    out = []
    for n in g.node:
        if n.op_type != "Conv" or n.domain not in ("", "ai.onnx") or len(n.input) < 2 or n.input[1] not in inits:
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        w = inits[n.input[1]]
        if w.data_type != onnx.TensorProto.FLOAT or len(w.dims) != 4 or min(w.dims[2:]) < 2 or a.get("group", 1) != 1 \
                or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET") or n.input[0] in const:
            continue
        bias = [n.input[2]] if len(n.input) > 2 and n.input[2] else []
        if bias and bias[0] not in inits:
            continue
        out.append(Chain([n], n.output[0], "", [n.input[1], *bias], [n.input[0]], kind="low-rank-conv"))
    return out


def svd_work(c: Chain, values: dict) -> float:
    """What the SVD of ``c``'s weight costs, in multiply-adds (roughly)."""
    m, ch, kh, kw = values[c.consts[0]].shape
    a, b = sorted((m * kw, ch * kh))
    c_, d_ = sorted((m * kh, ch * kw))
    return float(a) * a * b + float(c_) * c_ * d_  # both orders


def _factor(w: np.ndarray, rows_first: bool, rtol: float):
    """``(R, first, second)``: ``w`` [M, C, kh, kw] as a kh x 1 Conv ``first`` [R, C, kh, 1] then a 1 x kw Conv
    ``second`` [M, R, 1, kw] (``rows_first``), or a 1 x kw then a kh x 1 one, through the fewest channels R that
    give it back exactly (None where that is more than it saves)."""
    m, ch, kh, kw = w.shape
    if rows_first:  # W[m, c, i, j] = sum_r A[m, r, j] B[r, c, i]: rows (m, j), columns (c, i)
        mat, a_k, b_k = w.transpose(0, 3, 1, 2).reshape(m * kw, ch * kh), kw, kh
    else:  # W[m, c, i, j] = sum_r A[m, r, i] B[r, c, j]: rows (m, i), columns (c, j)
        mat, a_k, b_k = w.transpose(0, 2, 1, 3).reshape(m * kh, ch * kw), kh, kw
    u, sv, vt = np.linalg.svd(mat, full_matrices=False)
    r = int((sv > sv[0] * rtol).sum()) if sv.size and sv[0] > 0 else 0
    if r == 0 or r * (ch * b_k + m * a_k) >= m * ch * kh * kw:
        return None
    a = (u[:, :r] * sv[:r]).reshape(m, a_k, r).transpose(0, 2, 1)  # [M, R, a_k]
    b = vt[:r].reshape(r, ch, b_k)  # [R, C, b_k]
    back = np.einsum("mrj,rci->mcij" if rows_first else "mri,rcj->mcij", a, b)
    if np.abs(back - w).max() > 1e-6 * max(np.abs(w).max(), 1e-30):
        return None
    if rows_first:
        return r, b[:, :, :, None], a[:, :, None, :]
    return r, b[:, :, None, :], a[:, :, :, None]


def low_rank_form(c: Chain, values: dict[str, np.ndarray], rtol: float = 1e-6):
    """``(R, first weight, second weight)`` of the cheaper exact split of ``c``'s Conv weight (``_factor``, both
    orders), or None: the weight alone decides (no input value needed)."""
    w = np.asarray(values[c.consts[0]], dtype=np.float64)
    m, ch = w.shape[:2]
    found = [f for f in (_factor(w, True, rtol), _factor(w, False, rtol)) if f is not None]
    if not found:
        return None
    return min(found, key=lambda f: f[0] * (ch * f[1].shape[2] * f[1].shape[3] + m * f[2].shape[2] * f[2].shape[3]))


def derive_low_rank(c: Chain, values: dict[str, np.ndarray], threads: int, seed: int = 0,
                    rtol: float = 1e-6, form=None) -> Derivation | str | None:
    """The convolution of ``c`` as two one-dimensional convolutions through ``R`` channels (a kh x 1 one then a
    1 x kw one, or the other way round, whichever needs fewer), where its weight factors exactly so (the
    singular values of W as an (m, j) x (c, i) or an (m, i) x (c, j) matrix past the first ``R`` below ``rtol``
    of the largest, the rank-R product giving W back to float32 rounding) and the split does fewer
    multiplications; why not (one line) where the weight factors but the split fails its check; None where it
    does not factor. ``form``: ``low_rank_form``'s result when already computed."""
    t0 = time.perf_counter()
    conv = c.nodes[0]
    m, ch, kh, kw = values[c.consts[0]].shape
    form = form if form is not None else low_rank_form(c, values, rtol)
    if form is None:
        return None  # full rank, or too little saved: nothing to derive (not worth a notice)
    r, w1, w2 = form
    k1, k2 = list(w1.shape[2:]), list(w2.shape[2:])
    rows = k1[1] == 1  # the first one runs down the rows (kh x 1)
    at = {x.name: helper.get_attribute_value(x) for x in conv.attribute}
    pads = list(at.get("pads") or [0, 0, 0, 0])
    strides, dil = list(at.get("strides") or [1, 1]), list(at.get("dilations") or [1, 1])
    p1 = [pads[0], 0, pads[2], 0] if rows else [0, pads[1], 0, pads[3]]
    p2 = [0, pads[1], 0, pads[3]] if rows else [pads[0], 0, pads[2], 0]
    s1, s2 = ([strides[0], 1], [1, strides[1]]) if rows else ([1, strides[1]], [strides[0], 1])
    d1, d2 = ([dil[0], 1], [1, dil[1]]) if rows else ([1, dil[1]], [dil[0], 1])
    pre = f"{c.root}.split"
    inits = [numpy_helper.from_array(w1.astype(np.float32), f"{pre}.w1"),
             numpy_helper.from_array(w2.astype(np.float32), f"{pre}.w2")]
    nodes = [helper.make_node("Conv", [conv.input[0], f"{pre}.w1"], [f"{pre}.first"], name=f"{pre}.first",
                              kernel_shape=k1, pads=p1, strides=s1, dilations=d1),
             helper.make_node("Conv", [f"{pre}.first", f"{pre}.w2", *c.consts[1:]], [c.root], name=f"{pre}.second",
                              kernel_shape=k2, pads=p2, strides=s2, dilations=d2)]
    err = check(c, nodes, inits, values, threads, seed)
    if isinstance(err, str):
        return err
    mults = r * (ch * k1[0] * k1[1] + m * k2[0] * k2[1])
    detail = (f"weight {c.consts[0]} [{m}, {ch}, {kh}, {kw}] has rank {r}: a {k1[0]}x{k1[1]} Conv into {r} channels, "
              f"then a {k2[0]}x{k2[1]} Conv ({mults} of {m * ch * kh * kw} multiplications per position)")
    return Derivation(c.root, c.kind, [conv.name or conv.output[0]], {"Conv": 2}, detail, float(err),
                      time.perf_counter() - t0, nodes, inits)


def model_values(model: onnx.ModelProto, names: list[str], shapes: dict, threads: int) -> dict[str, np.ndarray]:
    """The values of ``names``: initializers as stored, the others as the model computes them on seeded random
    inputs at ``shapes`` (the costed binding; ONNX Runtime, no graph optimizations, one session whose outputs
    include them)."""
    from relsat.driver.boundary.verify import random_inputs

    inits = {t.name: t for t in model.graph.initializer}
    got = {n: numpy_helper.to_array(inits[n]) for n in set(names) if n in inits}
    rest = sorted(set(names) - set(got))
    if rest:
        m = onnx.ModelProto()
        m.CopyFrom(model)
        have = {o.name for o in m.graph.output}
        m.graph.output.extend(helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None)
                              for n in rest if n not in have)
        sess = runtime.session(m, threads=threads, optimize=False)
        outs = dict(zip([o.name for o in sess.get_outputs()],
                        sess.run(None, random_inputs([sess], input_shapes=shapes))))
        got.update((n, outs[n]) for n in rest)
    return got


def _subgraph(nodes, inits, inputs: dict, root: str) -> onnx.ModelProto:
    g = helper.make_graph(list(nodes), "derived", [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, a.shape)
                                                   for n, a in inputs.items()],
                          [helper.make_tensor_value_info(root, onnx.TensorProto.FLOAT, None)], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _block(n: int, half: int) -> int:
    """Rows per block: the largest divisor of ``n`` at most the band's half-width (at least MIN_BLOCK)."""
    cap = max(half, MIN_BLOCK)
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def derive(c: Chain, values: dict[str, np.ndarray], threads: int, seed: int = 0,
           form=None) -> Derivation | str | None:
    """``c``'s derived form by its kind, checked against it, why there is none (one line), or None where the
    derivation does not apply (nothing worth reporting). ``form``: a convolution's ``low_rank_form``. (Zero-block
    weights, ``derive_blocks.derive_zero_blocks``, are derived there: that module builds on this one.)"""
    if c.kind == "low-rank-conv":
        return derive_low_rank(c, values, threads, seed, form=form)
    return derive_chain(c, values, threads, seed)


def derive_chain(c: Chain, values: dict[str, np.ndarray], threads: int, seed: int = 0) -> Derivation | str:
    """The banded form of ``c`` checked against it, or why there is none (one line)."""
    t0 = time.perf_counter()
    mask = values[c.mask]
    m2 = mask.reshape(mask.shape[-2:]) if mask.ndim >= 2 and int(np.prod(mask.shape[:-2])) == 1 else None
    if m2 is None:
        return f"mask {c.mask} of shape {list(mask.shape)} is not one 2-D mask"
    half = band(m2, 1)
    if half is None:
        return f"mask {c.mask} keeps no column in some row"
    block = _block(m2.shape[0], max(half))
    shapes = {n: values[n].shape for n in [*c.inputs, *c.consts]}
    consts = {n: values[n] for n in c.consts}
    try:
        p = lower_graph(c.nodes, shapes, consts)
    except NotLowerable as e:
        return str(e)
    q = band_blocks(p, c.mask, mask, block, check=False)
    if q is None:
        return f"mask {c.mask}: no band to skip (half-widths {half[0]} and {half[1]} of {m2.shape[1]} columns)"
    try:
        nodes, inits = match(gathers_apart(q), c.root, consts, prefix=f"{c.root}.banded")
    except NoMatch as e:
        return f"the banded program did not match ONNX operators ({e})"
    err = check(c, nodes, inits, values, threads, seed)
    if isinstance(err, str):
        return err
    ops: dict[str, int] = {}
    for n in nodes:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    lo, hi = half
    detail = (f"mask {c.mask}: rows {m2.shape[0]} in blocks of {block}, each over a window of "
              f"{block + lo + hi} of {m2.shape[1]} columns (band -{lo}/+{hi})")
    return Derivation(c.root, c.kind, [n.name or n.output[0] for n in c.nodes], ops, detail, float(err),
                      time.perf_counter() - t0, nodes, inits)


def check(c: Chain, nodes, inits, values: dict[str, np.ndarray], threads: int, seed: int = 0) -> float | str:
    """The derived ``nodes`` (with ``inits``) against the chain's own nodes under ONNX Runtime, on the model's
    values and ``DRAWS`` standard-normal draws of the chain's inputs, the constants at their real values, element
    by element under verification's tolerance (``verify.compare_output``: its rtol and atol plus the rounding
    floor of the output's magnitude, which a reassociated sum of many terms needs): the largest absolute
    difference, or why they disagree (one line)."""
    ins = {n: values[n] for n in c.inputs}
    const_inits = [numpy_helper.from_array(np.asarray(values[n], dtype=np.float32), n) for n in c.consts]
    used = {i for n in nodes for i in n.input}
    orig = runtime.session(_subgraph(c.nodes, const_inits, ins, c.root), threads=threads)
    new = runtime.session(_subgraph(nodes, [*inits, *(t for t in const_inits if t.name in used)], ins, c.root),
                          threads=threads)
    rng = np.random.default_rng(seed)
    err = 0.0
    for k in range(DRAWS + 1):
        feeds = ins if k == 0 else {n: rng.standard_normal(a.shape).astype(np.float32) for n, a in ins.items()}
        (y0,), (y1,) = orig.run(None, feeds), new.run(None, feeds)
        cmp = compare_output(y0, y1)
        if not cmp.ok:
            return f"the derived form disagrees with the original ({cmp.problem})"
        err = max(err, float(np.abs(y1 - y0).max()))
    return err


def derived_model(model: onnx.ModelProto, c: Chain, d: Derivation) -> onnx.ModelProto:
    """``model`` with the chain's nodes replaced by the derived ones (placed where the chain's last node was)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = {n.output[0] for n in c.nodes}
    kept = []
    for n in model.graph.node:
        if n.output and n.output[0] in names:
            if n.output[0] == c.root:
                kept.extend(d.nodes)
            continue
        kept.append(n)
    del m.graph.node[:]
    m.graph.node.extend(kept)
    m.graph.initializer.extend(d.inits)
    return m


def static(types: dict, names: list[str]) -> bool:
    """Whether every value in ``names`` has a fully known, concrete shape in import's ``types``."""
    for n in names:
        shape = (types.get(n) or (None, None))[1]
        if shape is None or any(not isinstance(s, int) or s < 0 for s in shape):
            return False
    return True
