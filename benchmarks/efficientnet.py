"""EfficientNet-B0-like ONNX models, built with onnx.helper (no PyTorch needed).

``build(small=False)`` follows EfficientNet-B0's layout as timm exports it at opset 17 with
BatchNormalization kept: a stride-2 3x3 stem, seven stages of MBConv blocks (1x1 expansion,
depthwise k x k conv, squeeze-and-excitation, 1x1 projection, residual Add when the shape
allows), a 1x1 head conv, GlobalAveragePool, Flatten and Gemm. Every conv outside the SE block
has no bias and is followed by BatchNormalization; SiLU is written as ``x * Sigmoid(x)``; the SE
block is GlobalAveragePool -> Conv (bias) -> SiLU -> Conv (bias) -> Sigmoid -> Mul with the
feature map. ``build(small=True)`` is a reduced variant (32x32 input, three stages, 10 classes)
that keeps that structure, and an SE block whose 1x1 convs, zero-padded to 3x3 by the
``enlarge-conv-1x1*`` rules, have weights above the export's folding size (65,536 elements).

Weights are float32, drawn from ``numpy.random.default_rng(seed)`` with fan-in scaling; the
graph input is ``input`` [1, 3, H, W], the output ``output`` [1, classes]. ir_version 10.
"""

from __future__ import annotations

import onnx

from relsat.driver.boundary.zoo import _Builder

# (expansion, output channels, repeats, stride, kernel) of each stage: EfficientNet-B0
B0_STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
             (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))
SMALL_STAGES = ((1, 16, 1, 1, 3), (6, 32, 1, 2, 3), (6, 96, 2, 2, 5))
SE_RATIO = 0.25  # SE width: a quarter of the block's input channels


def _silu(b: _Builder, x: str) -> str:
    return b.mul(x, b.unary("Sigmoid", x))


def _conv_bn(b: _Builder, x: str, c: int, k: int, stride: int = 1, group: int = 1, act: bool = True) -> str:
    y = b.bn(b.conv(x, c, k, stride=stride, group=group))
    return _silu(b, y) if act else y


def _se(b: _Builder, x: str, c_se: int) -> str:
    """Squeeze-and-excitation: x * Sigmoid(Conv(SiLU(Conv(GlobalAveragePool(x)))))."""
    s = _silu(b, b.conv(b.gap(x), c_se, 1, bias=True))
    return b.mul(x, b.unary("Sigmoid", b.conv(s, b.shape[x][1], 1, bias=True)))


def _mbconv(b: _Builder, x: str, expand: int, c_out: int, stride: int, k: int) -> str:
    c_in = b.shape[x][1]
    mid = c_in * expand
    y = _conv_bn(b, x, mid, 1) if expand != 1 else x
    y = _conv_bn(b, y, mid, k, stride=stride, group=mid)  # depthwise
    y = _se(b, y, max(1, int(c_in * SE_RATIO)))
    y = _conv_bn(b, y, c_out, 1, act=False)
    return b.add(y, x) if stride == 1 and c_in == c_out else y


def build(*, small: bool = False, seed: int = 0) -> onnx.ModelProto:
    """EfficientNet-B0 (224x224, 1000 classes) or, with ``small``, its reduced variant."""
    size, stem, stages, head, classes = (32, 16, SMALL_STAGES, 320, 10) if small else (224, 32, B0_STAGES, 1280, 1000)
    b = _Builder(seed)
    x = _conv_bn(b, b.input("input", (1, 3, size, size)), stem, 3, stride=2)
    for expand, c, repeats, stride, k in stages:
        for i in range(repeats):
            x = _mbconv(b, x, expand, c, stride if i == 0 else 1, k)
    x = _conv_bn(b, x, head, 1)
    return b.model("efficientnet_b0_small" if small else "efficientnet_b0", b.classifier(x, classes))
