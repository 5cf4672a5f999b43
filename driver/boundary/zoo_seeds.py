"""EinNet's seed models (shared/seeds/003_*): the networks its paper measures, built in code.

``relsat optimize zoo:NAME`` and ``relsat zoo build NAME`` take these names as they take the
TASO/TENSAT zoo's (zoo.py, which owns ``build`` and dispatches here); benchmarks that loop over
"the zoo" mean TASO's ten (``zoo.NAMES``), these are ``zoo.SEED_NAMES``. Weights are random
(``numpy.random.default_rng(seed)``, fan-in scaled), opset 17, ir_version 10. Where a batch is
natural (every model but the Longformer-style encoder, which the issue fixes at one sequence of
4096) the input's and output's first dim is the symbol ``batch`` (the graph has no constant that
fixes it: reshapes keep the batch with -1 or 0).

What each one is, and where it departs from its paper:

* ``dcgan``: DCGAN's generator (Radford et al.): a 100-d code through five ConvTranspose layers
  (4x4; stride 1, then 2) with BatchNormalization and ReLU to a 3x64x64 Tanh image.
* ``infogan``: InfoGAN's MNIST generator: a 74-d code (62 noise, 10 categorical, 2 continuous)
  through Gemm 1024 and Gemm 128*7*7 (each with BatchNormalization and ReLU), a Reshape, and two
  4x4 stride-2 ConvTransposes to a 1x28x28 Sigmoid image.
* ``fsrcnn``: FSRCNN(d=56, s=12, m=4) for x3 super-resolution: feature extraction 5x5, shrinking
  1x1, four 3x3 mapping layers, expanding 1x1 (each with PReLU), and a 9x9 stride-3 ConvTranspose
  (pads 4, output_padding 2). Input 1x128x128 (the paper trains on patches; any size runs).
* ``csrnet``: CSRNet (Li et al.): VGG-16's first ten 3x3 convs with three max pools, then six 3x3
  convs of dilation 2 (512, 512, 512, 256, 128, 64) and a 1x1 conv to the density map.
* ``gcn``: the Global Convolutional Network (Peng et al.) over a ResNet-18 backbone: at each of
  the four stages a GCN module (k x 1 then 1 x k, beside 1 x k then k x 1, summed; k = 15) and
  boundary refinement (x + conv3x3(relu(conv3x3(x)))), fused from the deepest stage up through
  4x4 stride-2 ConvTransposes, then two more up to the input's size. 21 classes, 256x256 input.
* ``resnet18``: ResNet-18 (basic blocks 2-2-2-2, 64-512 channels, 7x7 stem and max pool, global
  average pool and Gemm), 224x224.
* ``longformer``: a Longformer-style encoder (hidden 256, 4 heads, 2 layers, window 256 on each
  side, sequence 4096): each layer's attention is *full* attention, QK^T scaled, plus a band mask
  built in the graph from positions (``Where(|i - j| <= w, 0, float32 min)``, as exporters write a
  sliding-window mask), Softmax, times V; post-LayerNorm BERT layers with an erf GELU. No
  embeddings: the input is the hidden states.

``small=True`` gives each a reduced variant (narrower, smaller, fewer layers) of the same structure.
"""

from __future__ import annotations

import numpy as np
import onnx

from relsat.driver.boundary.zoo_builder import Builder


def _dcgan(b: Builder, nz: int, ngf: int) -> str:
    x = b.input("input", (1, nz, 1, 1))
    x = b.relu(b.bn(b.conv_transpose(x, ngf * 8, 4, 1, 0)))
    for mult in (4, 2, 1):
        x = b.relu(b.bn(b.conv_transpose(x, ngf * mult, 4, 2, 1)))
    return b.unary("Tanh", b.conv_transpose(x, 3, 4, 2, 1))


def _infogan(b: Builder, code: int, hidden: int, channels: int) -> str:
    x = b.input("input", (1, code))
    x = b.relu(b.bn(b.gemm(x, hidden)))
    x = b.relu(b.bn(b.gemm(x, channels * 2 * 7 * 7)))
    x = b.reshape(x, (-1, channels * 2, 7, 7))
    b.shape[x] = (1, channels * 2, 7, 7)
    x = b.relu(b.bn(b.conv_transpose(x, channels, 4, 2, 1)))
    return b.unary("Sigmoid", b.conv_transpose(x, 1, 4, 2, 1))


def _fsrcnn(b: Builder, size: int, d: int, s: int, m: int) -> str:
    x = b.input("input", (1, 1, size, size))
    x = b.prelu(b.conv(x, d, 5, bias=True))
    x = b.prelu(b.conv(x, s, 1, bias=True))
    for _ in range(m):
        x = b.prelu(b.conv(x, s, 3, bias=True))
    x = b.prelu(b.conv(x, d, 1, bias=True))
    return b.conv_transpose(x, 1, 9, 3, 4, output_padding=2, bias=True)


def _csrnet(b: Builder, size: int, div: int) -> str:
    x = b.input("input", (1, 3, size, size))
    for c in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512):
        x = b.maxpool(x, 2, 2) if c == "M" else b.relu(b.conv(x, c // div, 3, bias=True))
    for c in (512, 512, 512, 256, 128, 64):
        x = b.relu(b.conv(x, c // div, 3, bias=True, dilation=2))
    return b.conv(x, 1, 1, bias=True)


def _basic_block(b: Builder, x: str, c_out: int, stride: int) -> str:
    t = b.cbr(x, c_out, 3, stride=stride)
    t = b.bn(b.conv(t, c_out, 3))
    if stride > 1 or b.shape[x][1] != c_out:
        x = b.bn(b.conv(x, c_out, 1, stride=stride, pads=0))
    return b.relu(b.add(x, t))


def _resnet18_features(b: Builder, size: int, div: int, blocks: int) -> list[str]:
    """The stem and the four stages of ResNet-18; each stage's output (strides 4, 8, 16, 32)."""
    x = b.input("input", (1, 3, size, size))
    x = b.maxpool(b.cbr(x, 64 // div, 7, stride=2), 3, 2, 1)
    stages = []
    for i, c in enumerate((64, 128, 256, 512)):
        for j in range(blocks):
            x = _basic_block(b, x, c // div, 2 if i and not j else 1)
        stages.append(x)
    return stages


def _resnet18(b: Builder, size: int, div: int, blocks: int) -> str:
    return b.classifier(_resnet18_features(b, size, div, blocks)[-1])


def _gcn(b: Builder, size: int, div: int, blocks: int, k: int, classes: int) -> str:
    def gcn_module(x):
        left = b.conv(b.conv(x, classes, (k, 1), bias=True), classes, (1, k), bias=True)
        right = b.conv(b.conv(x, classes, (1, k), bias=True), classes, (k, 1), bias=True)
        return b.add(left, right)

    def refine(x):
        return b.add(x, b.conv(b.relu(b.conv(x, classes, 3, bias=True)), classes, 3, bias=True))

    def up(x):
        return b.conv_transpose(x, classes, 4, 2, 1)

    stages = _resnet18_features(b, size, div, blocks)
    x = refine(gcn_module(stages[-1]))
    for f in reversed(stages[:-1]):
        x = refine(b.add(refine(gcn_module(f)), up(x)))
    return refine(up(refine(up(x))))


def _longformer(b: Builder, seq: int, d: int, heads: int, layers: int, window: int) -> str:
    dk = d // heads
    inv_sqrt_dk, half, one, sqrt2, zero, lowest = (b.const(n, v) for n, v in [
        ("inv_sqrt_dk", dk**-0.5), ("half", 0.5), ("one", 1.0), ("sqrt2", 2**0.5), ("zero", 0.0),
        ("lowest", float(np.finfo(np.float32).min))])

    # the band mask from positions: 0 where |i - j| <= window, float32's lowest elsewhere
    pos = b.op("Range", [b.init("pos.start", np.array(0, np.int64)), b.init("pos.limit", np.array(seq, np.int64)),
                         b.init("pos.delta", np.array(1, np.int64))], (seq,))
    rows = b.op("Unsqueeze", [pos, b.init("axes_1", np.array([1], np.int64))], (seq, 1))
    cols = b.op("Unsqueeze", [pos, b.init("axes_0", np.array([0], np.int64))], (1, seq))
    near = b.binary("LessOrEqual", b.unary("Abs", b.binary("Sub", rows, cols)),
                    b.init("window", np.array(window, np.int64)))
    mask = b.op("Where", [near, zero, lowest], (seq, seq))

    def split_heads(t, perm):  # [1, seq, d] -> [1, heads, seq, dk] (perm (0,2,1,3)) or its K^T
        return b.transpose(b.reshape(t, (1, seq, heads, dk)), perm)

    x = b.input("input", (1, seq, d))
    for _ in range(layers):
        q, k, v = (split_heads(b.dense(x, d), p) for p in [(0, 2, 1, 3), (0, 2, 3, 1), (0, 2, 1, 3)])
        scores = b.add(b.mul(b.matmul(q, k), inv_sqrt_dk), mask)
        probs = b.unary("Softmax", scores, axis=-1)
        ctx = b.reshape(b.transpose(b.matmul(probs, v), (0, 2, 1, 3)), (1, seq, d))
        x = b.layernorm(b.add(x, b.dense(ctx, d)))
        h = b.dense(x, 4 * d)
        gelu = b.mul(b.mul(h, b.add(b.unary("Erf", b.binary("Div", h, sqrt2)), one)), half)
        x = b.layernorm(b.add(x, b.dense(gelu, d)))
    return x


# name -> (builder, full-size arguments, small arguments, dynamic batch)
SEEDS = {
    "dcgan": (_dcgan, (100, 64), (16, 8), True),
    "infogan": (_infogan, (74, 1024, 64), (74, 128, 8), True),
    "fsrcnn": (_fsrcnn, (128, 56, 12, 4), (24, 16, 8, 2), True),
    "csrnet": (_csrnet, (224, 1), (32, 8), True),
    "gcn": (_gcn, (256, 1, 2, 15, 21), (64, 8, 1, 7, 5), True),
    "resnet18": (_resnet18, (224, 1, 2), (64, 8, 1), True),
    "longformer": (_longformer, (4096, 256, 4, 2, 256), (128, 32, 2, 1, 16), False),
}
SEED_NAMES: tuple[str, ...] = tuple(SEEDS)


def build_seed(name: str, *, small: bool, seed: int) -> onnx.ModelProto:
    """EinNet seed model ``name`` (one of ``SEED_NAMES``); ``zoo.build`` is the public entry."""
    fn, full, reduced, dynamic = SEEDS[name]
    b = Builder(seed)
    out = fn(b, *(reduced if small else full))
    model = b.model(f"{name}_small" if small else name, out)
    if dynamic:  # the first dim of the input and the output is the symbol "batch"
        for v in (*model.graph.input, *model.graph.output):
            v.type.tensor_type.shape.dim[0].dim_param = "batch"
    return model
