"""The built-in model zoo: seeded ONNX builders for the TASO/TENSAT benchmark networks (``NAMES``)
and, through zoo_seeds.py, EinNet's seed models (``SEED_NAMES``).

The zoo is part of the command line (``relsat optimize zoo:NAME``, ``relsat zoo build``), so it
lives in the driver layer, at its ONNX boundary; the benchmarks import it from here.
This module owns the construction of the benchmark models as ``onnx.ModelProto``:
ir_version 10, one default-domain opset import (17), batch 1, static shapes, float32
weights drawn from ``numpy.random.default_rng(seed)`` with fan-in scaling. Graph inputs
are named ``input`` (NasRNN: ``input0`` .. ``input{T-1}``), the graph output ``output``.
``build(name, small=True)`` gives a reduced variant of the same architecture (fewer
layers/blocks/steps, narrower, smaller spatial size) that keeps its characteristic
structure, for fast tests.

Simplifications and deviations from the reference architectures:

* ``bert`` is TASO's stripped attention benchmark (no softmax, no biases), except
  that each layer's final linear layer is applied to the attention output: in TASO's
  ``bert.py`` it is applied to the layer input, which leaves the attention dead.
  Without normalisation the network is positively homogeneous of degree ``3**layers``
  (6561 at full size) in its input, so no weight scaling keeps it finite for arbitrary
  inputs: its weights are calibrated at build time to give unit-RMS activations at
  every layer on the calibration input
  ``np.random.default_rng(seed).standard_normal((seq, d), dtype=np.float32)``; other
  standard-normal draws already over/underflow at full size (the small variant, of
  degree 9, is fine with any standard-normal input). Relative rounding differences
  grow about 3x per layer, so compare this model's outputs with a loose rtol.
* ``bert_encoder`` has 4 layers (BERT-base has 12) and no embeddings or mask.
* ``nasrnn`` starts from a zero hidden-state initializer ``h0`` and shares its 16
  weight matrices across time steps.
* ``resnet50`` starts at TASO's [1,64,56,56] input (no stem).
* ``nasnet_a`` follows TASO's cell wiring: every cell starts with ReLU-conv1x1-BN on
  both of its inputs (prev and cur are the same tensor in a stage's first cell, and
  always have the same resolution, so no factorized reduction is needed), separable
  convs are a single ReLU-depthwise-pointwise-BN with NASNet-A's kernel sizes
  (3/5/7), each cell concatenates its five combined pairs, and the model ends with
  ReLU, global average pool and Gemm.
* ``vgg19``'s fully connected layers have 512 hidden units instead of 4096.
* Dropout is omitted everywhere; ``squeezenet`` ends with its 1x1 classifier conv,
  ReLU and global average pool, the other CNNs with GlobalAveragePool+Flatten+Gemm.
* BatchNormalization statistics are random (near identity), not activation
  statistics, so activations grow along residual and concat paths: full-size
  ResNet/ResNeXt/NASNet outputs have an RMS of about 1e3..1e5 (finite in float32).
"""

from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from relsat.driver.boundary.zoo_builder import Builder as _Builder
from relsat.driver.boundary.zoo_seeds import SEED_NAMES, build_seed

NAMES: tuple[str, ...] = (
    "bert",
    "bert_encoder",
    "nasrnn",
    "resnext50",
    "resnet50",
    "nasnet_a",
    "inception_v3",
    "squeezenet",
    "vgg19",
    "mobilenet_v2",
)
ALL_NAMES: tuple[str, ...] = NAMES + SEED_NAMES  # TASO's ten, then EinNet's seed models (zoo_seeds.py)

_EXTERNAL_DATA_BYTES = 1_500_000_000


# -- transformers / RNN -------------------------------------------------------------


def _bert(b: _Builder, seq: int, d: int, heads: int, layers: int) -> str:
    dk = d // heads

    def split_heads(t):  # [seq, d] -> [heads, seq, dk]
        return b.transpose(b.reshape(t, (seq, heads, dk)), (1, 0, 2))

    def rms(a):
        return float(np.sqrt(np.mean(a * a)))

    def ref_heads(a):
        return a.reshape(seq, heads, dk).transpose(1, 0, 2)

    x = b.relu(b.input("input", (seq, d)))
    ref = np.maximum(b.rng.standard_normal((seq, d), dtype=np.float32), 0)  # calibration input, see module doc
    for _ in range(layers):
        wq, wk, wv, wo = (b.randn((d, d), d**-0.5) for _ in range(4))
        q, k, v = (ref_heads(ref @ w) for w in (wq, wk, wv))
        att = (q @ k.transpose(0, 2, 1) @ v).transpose(1, 0, 2).reshape(seq, d)
        gain = rms(att) / rms(ref)  # the attention is cubic in (wq, wk, wv): rescale to keep the RMS
        wq, wk, wv = (w * gain ** (-1 / 3) for w in (wq, wk, wv))
        att /= gain
        wo /= rms(att @ wo)
        ref = att @ wo

        q, k, v = (split_heads(b.linear(x, w)) for w in (wq, wk, wv))
        logits = b.matmul(q, b.transpose(k, (0, 2, 1)))
        out = b.reshape(b.transpose(b.matmul(logits, v), (1, 0, 2)), (seq, d))
        x = b.linear(out, wo)
    return x


def _bert_encoder(b: _Builder, seq: int, d: int, heads: int, layers: int) -> str:
    dk = d // heads
    inv_sqrt_dk, half, one, sqrt2 = (b.const(n, v) for n, v in
                                     [("inv_sqrt_dk", dk**-0.5), ("half", 0.5), ("one", 1.0), ("sqrt2", 2**0.5)])

    def split_heads(t, perm):  # [1, seq, d] -> [1, heads, seq, dk] (perm (0,2,1,3)) or its K^T
        return b.transpose(b.reshape(t, (1, seq, heads, dk)), perm)

    x = b.input("input", (1, seq, d))
    for _ in range(layers):
        q, k, v = (split_heads(b.dense(x, d), p) for p in [(0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3)])
        probs = b.unary("Softmax", b.mul(b.matmul(q, k), inv_sqrt_dk), axis=-1)
        ctx = b.reshape(b.transpose(b.matmul(probs, v), (0, 2, 1, 3)), (1, seq, d))
        x = b.layernorm(b.add(x, b.dense(ctx, d)))
        h = b.dense(x, 4 * d)
        gelu = b.mul(b.mul(h, b.add(b.unary("Erf", b.binary("Div", h, sqrt2)), one)), half)
        x = b.layernorm(b.add(x, b.dense(gelu, d)))
    return x


def _nasrnn(b: _Builder, steps: int, hidden: int) -> str:
    xs = [b.input(f"input{i}", (1, hidden)) for i in range(steps)]
    weights = [
        [b.init(f"block{j}.w_{s}", b.randn((hidden, hidden), hidden**-0.5)) for s in "xh"] for j in range(8)
    ]
    h = b.init("h0", np.zeros((1, hidden), np.float32))
    sig, tanh = (lambda t: b.unary("Sigmoid", t)), (lambda t: b.unary("Tanh", t))
    for x in xs:
        t = [b.add(b.matmul(x, wx), b.matmul(h, wh)) for wx, wh in weights]
        m0 = b.add(b.relu(t[0]), sig(t[3]))
        m1 = b.add(sig(t[1]), tanh(t[2]))
        m2 = b.mul(sig(t[4]), tanh(t[5]))
        m3 = b.mul(sig(t[6]), b.relu(t[7]))
        m4 = b.add(sig(m1), tanh(m2))
        m5 = b.mul(tanh(m0), tanh(m3))
        h = tanh(b.mul(tanh(m4), tanh(m5)))
    return h


# -- CNNs ---------------------------------------------------------------------------


def _resnet(b: _Builder, shape, stem: int, blocks, widths, expansion: int, groups: int) -> str:
    """ResNet/ResNeXt: bottleneck stages, stride 2 on the first block of stages 2+."""
    x = b.input("input", shape)
    if stem:
        x = b.maxpool(b.cbr(x, stem, 7, stride=2), 3, 2, 1)
    for stage, (n, width) in enumerate(zip(blocks, widths)):
        for i in range(n):
            stride, c_out = (2 if stage and not i else 1), width * expansion
            t = b.cbr(x, width, 1)
            t = b.cbr(t, width, 3, stride=stride, group=groups)
            t = b.bn(b.conv(t, c_out, 1))
            if stride > 1 or b.shape[x][1] != c_out:
                x = b.bn(b.conv(x, c_out, 1, stride=stride))
            x = b.relu(b.add(x, t))
    return b.classifier(x)


def _nasnet_a(b: _Builder, size: int, stem: int, channels: int, normal_cells: int) -> str:
    def squeeze(t, c):  # ReLU-conv1x1-BN
        return b.bn(b.conv(b.relu(t), c, 1))

    def sep(t, c, k, stride=1):  # ReLU-depthwise-pointwise-BN
        c_in = b.shape[t][1]
        return b.bn(b.conv(b.conv(b.relu(t), c_in, k, stride=stride, group=c_in), c, 1))

    def avg(t, stride=1):
        return b.avgpool(t, 3, stride, 1)

    def normal(prev, cur, c):
        cur, prev = squeeze(cur, c), squeeze(prev, c)
        return b.concat([
            b.add(sep(cur, c, 5), sep(prev, c, 3)),
            b.add(sep(prev, c, 5), sep(prev, c, 3)),
            b.add(avg(cur), prev),
            b.add(avg(prev), avg(prev)),
            b.add(sep(cur, c, 3), cur),
        ])

    def reduction(prev, cur, c):
        cur, prev = squeeze(cur, c), squeeze(prev, c)
        c0 = b.add(sep(cur, c, 5, 2), sep(prev, c, 7, 2))
        c1 = b.add(b.maxpool(cur, 3, 2, 1), sep(prev, c, 7, 2))
        c2 = b.add(avg(cur, 2), sep(prev, c, 5, 2))
        c3 = b.add(avg(c0), c1)
        c4 = b.add(sep(c0, c, 3), b.maxpool(cur, 3, 2, 1))
        return b.concat([c0, c1, c2, c3, c4])

    x = b.maxpool(b.cbr(b.input("input", (1, 3, size, size)), stem, 7, stride=2), 3, 2, 1)
    for _ in range(3):
        prev = cur = x
        for _ in range(normal_cells):
            prev, cur = cur, normal(prev, cur, channels)
        channels *= 2
        x = reduction(prev, cur, channels)
    return b.classifier(b.relu(x))


def _inception_v3(b: _Builder, size: int, div: int, a_pools, c_widths, n_e: int) -> str:
    def cbr(t, c, k, **kw):
        return b.cbr(t, c // div, k, **kw)

    def avg(t):
        return b.avgpool(t, 3, 1, 1, count_include_pad=1)

    x = b.input("input", (1, 3, size, size))
    x = cbr(cbr(x, 32, 3, stride=2, pads=0), 32, 3, pads=0)
    x = b.maxpool(cbr(x, 64, 3), 3, 2)
    x = b.maxpool(cbr(cbr(x, 80, 1), 192, 3, pads=0), 3, 2)
    for pool in a_pools:  # InceptionA
        x = b.concat([
            cbr(x, 64, 1),
            cbr(cbr(x, 48, 1), 64, 5),
            cbr(cbr(cbr(x, 64, 1), 96, 3), 96, 3),
            cbr(avg(x), pool, 1),
        ])
    x = b.concat([  # InceptionB
        cbr(x, 384, 3, stride=2, pads=0),
        cbr(cbr(cbr(x, 64, 1), 96, 3), 96, 3, stride=2, pads=0),
        b.maxpool(x, 3, 2),
    ])
    for c7 in c_widths:  # InceptionC
        d = cbr(x, c7, 1)
        for c, k in [(c7, (7, 1)), (c7, (1, 7)), (c7, (7, 1)), (192, (1, 7))]:
            d = cbr(d, c, k)
        x = b.concat([
            cbr(x, 192, 1),
            cbr(cbr(cbr(x, c7, 1), c7, (1, 7)), 192, (7, 1)),
            d,
            cbr(avg(x), 192, 1),
        ])
    x = b.concat([  # InceptionD
        cbr(cbr(x, 192, 1), 320, 3, stride=2, pads=0),
        cbr(cbr(cbr(cbr(x, 192, 1), 192, (1, 7)), 192, (7, 1)), 192, 3, stride=2, pads=0),
        b.maxpool(x, 3, 2),
    ])
    for _ in range(n_e):  # InceptionE
        t3 = cbr(x, 384, 1)
        td = cbr(cbr(x, 448, 1), 384, 3)
        x = b.concat([
            cbr(x, 320, 1),
            b.concat([cbr(t3, 384, (1, 3)), cbr(t3, 384, (3, 1))]),
            b.concat([cbr(td, 384, (1, 3)), cbr(td, 384, (3, 1))]),
            cbr(avg(x), 192, 1),
        ])
    return b.classifier(x)


def _squeezenet(b: _Builder, size: int, div: int) -> str:
    def conv_relu(t, c, k, **kw):
        return b.relu(b.conv(t, c, k, bias=True, **kw))

    def pool(t):
        return b.maxpool(t, 3, 2, ceil_mode=1)

    x = pool(conv_relu(b.input("input", (1, 3, size, size)), 64 // div, 3, stride=2, pads=0))
    for i, (s, e) in enumerate([(16, 64), (16, 64), (32, 128), (32, 128), (48, 192), (48, 192), (64, 256), (64, 256)]):
        x = pool(x) if i in (2, 4) else x
        s = conv_relu(x, s // div, 1)
        x = b.concat([conv_relu(s, e // div, 1), conv_relu(s, e // div, 3)])
    return b.flatten(b.gap(conv_relu(x, 1000, 1)))


def _vgg19(b: _Builder, size: int, div: int, hidden: int) -> str:
    x = b.input("input", (1, 3, size, size))
    for n, c in zip((2, 2, 4, 4, 4), (64, 128, 256, 512, 512)):
        for _ in range(n):
            x = b.relu(b.conv(x, c // div, 3, bias=True))
        x = b.maxpool(x, 2, 2)
    x = b.relu(b.gemm(b.relu(b.gemm(b.flatten(x), hidden)), hidden))
    return b.gemm(x, 1000)


_MBV2_TABLE = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _mobilenet_v2(b: _Builder, size: int, div: int, max_repeat: int) -> str:
    def cbr6(t, c, k, **kw):
        return b.relu6(b.bn(b.conv(t, c, k, **kw)))

    x = cbr6(b.input("input", (1, 3, size, size)), 32 // div, 3, stride=2)
    for t, c, n, s in _MBV2_TABLE:
        for i in range(min(n, max_repeat)):
            c_in, stride = b.shape[x][1], (s if i == 0 else 1)
            y = cbr6(x, c_in * t, 1) if t != 1 else x
            y = cbr6(y, c_in * t, 3, stride=stride, group=c_in * t)
            y = b.bn(b.conv(y, c // div, 1))
            x = b.add(x, y) if stride == 1 and c_in == c // div else y
    return b.classifier(cbr6(x, 1280 // div, 1))


# name -> (builder, full-size arguments, small arguments)
_ZOO = {
    "bert": (_bert, (64, 1024, 16, 8), (16, 256, 4, 2)),
    "bert_encoder": (_bert_encoder, (128, 768, 12, 4), (32, 256, 4, 2)),
    "nasrnn": (_nasrnn, (5, 512), (2, 64)),
    "resnext50": (
        lambda b, *a: _resnet(b, *a, expansion=2, groups=32),
        ((1, 3, 224, 224), 64, (3, 4, 6, 3), (128, 256, 512, 1024)),
        ((1, 3, 64, 64), 16, (2, 1, 1, 1), (32, 64, 128, 256)),
    ),
    "resnet50": (
        lambda b, *a: _resnet(b, *a, expansion=4, groups=1),
        ((1, 64, 56, 56), 0, (3, 4, 6, 3), (64, 128, 256, 512)),
        ((1, 16, 16, 16), 0, (2, 1, 1, 1), (8, 16, 32, 64)),
    ),
    "nasnet_a": (_nasnet_a, (224, 64, 128, 5), (64, 16, 8, 1)),
    "inception_v3": (_inception_v3, (299, 1, (32, 64, 64), (128, 160, 160, 192), 2), (75, 8, (32,), (128,), 1)),
    "squeezenet": (_squeezenet, (224, 1), (64, 4)),
    "vgg19": (_vgg19, (224, 1, 512), (32, 8, 64)),
    "mobilenet_v2": (_mobilenet_v2, (224, 1, 4), (64, 4, 2)),
}


def build(name: str, *, small: bool = False, seed: int = 0) -> onnx.ModelProto:
    """Builds zoo model ``name`` (one of ``ALL_NAMES``: TASO's ``NAMES`` or EinNet's ``SEED_NAMES``);
    ``small`` gives the reduced variant."""
    if name in SEED_NAMES:
        return build_seed(name, small=small, seed=seed)
    if name not in _ZOO:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(ALL_NAMES)}")
    fn, full, reduced = _ZOO[name]
    b = _Builder(seed)
    out = fn(b, *(reduced if small else full))
    return b.model(f"{name}_small" if small else name, out)


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Node counts by op type, sorted by op type."""
    return dict(sorted(Counter(n.op_type for n in model.graph.node).items()))


def save(model: onnx.ModelProto, path: str | Path) -> None:
    """Saves ``model``; weights over 1.5 GB go to an external ``<file>.data`` next to it."""
    path = Path(path)
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    if weight_bytes > _EXTERNAL_DATA_BYTES:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # saving with external data strips the weights from the proto it is given
        onnx.save(copy, path, save_as_external_data=True, all_tensors_to_one_file=True, location=f"{path.name}.data")
    else:
        onnx.save(model, path)
