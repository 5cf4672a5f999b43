"""The builder of the zoo's models: a small accumulator of ONNX nodes, initializers and static shapes.

``Builder`` names nodes ``<op>_<n>``, draws float32 weights from ``numpy.random.default_rng(seed)`` with
fan-in scaling, tracks every tensor's static shape, and assembles an ir_version 10 model with one
default-domain opset import. The TASO/TENSAT zoo (zoo.py) and EinNet's seed models (zoo_seeds.py) are
written with it; nothing else is.
"""

import math
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_SHORT = {
    "BatchNormalization": "bn",
    "LayerNormalization": "ln",
    "GlobalAveragePool": "gap",
    "AveragePool": "avgpool",
}


class Builder:
    """Accumulates nodes, initializers and static shapes; names nodes ``<op>_<n>``."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.shape: dict[str, tuple[int, ...]] = {}
        self._count: Counter[str] = Counter()

    # -- names, inputs, initializers -------------------------------------------------
    def fresh(self, op_type: str) -> str:
        base = _SHORT.get(op_type, op_type.lower())
        self._count[base] += 1
        return f"{base}_{self._count[base]}"

    def input(self, name: str, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        self.shape[name] = tuple(shape)
        return name

    def init(self, name: str, array: np.ndarray) -> str:
        if name not in self.shape:
            self.inits.append(numpy_helper.from_array(np.asarray(array), name))
            self.shape[name] = np.shape(array)
        return name

    def const(self, name: str, value: float) -> str:
        """A shared float32 scalar initializer."""
        return self.init(name, np.array(value, np.float32))

    def randn(self, shape, std: float) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)

    def op(self, op_type: str, inputs: list[str], shape, name: str | None = None, **attrs) -> str:
        name = name or self.fresh(op_type)
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        self.shape[name] = tuple(shape)
        return name

    # -- elementwise ----------------------------------------------------------------
    def unary(self, op_type: str, x: str, **attrs) -> str:
        return self.op(op_type, [x], self.shape[x], **attrs)

    def relu(self, x: str) -> str:
        return self.unary("Relu", x)

    def binary(self, op_type: str, a: str, b: str) -> str:
        return self.op(op_type, [a, b], np.broadcast_shapes(self.shape[a], self.shape[b]))

    def add(self, a: str, b: str) -> str:
        return self.binary("Add", a, b)

    def mul(self, a: str, b: str) -> str:
        return self.binary("Mul", a, b)

    def relu6(self, x: str) -> str:
        return self.op("Clip", [x, self.const("relu6.min", 0.0), self.const("relu6.max", 6.0)], self.shape[x])

    # -- layout -----------------------------------------------------------------------
    def reshape(self, x: str, shape) -> str:
        target = self.init("shape_" + "_".join(map(str, shape)), np.array(shape, np.int64))
        return self.op("Reshape", [x, target], shape)

    def transpose(self, x: str, perm) -> str:
        return self.op("Transpose", [x], [self.shape[x][p] for p in perm], perm=list(perm))

    def concat(self, xs: list[str], axis: int = 1) -> str:
        shape = list(self.shape[xs[0]])
        shape[axis] = sum(self.shape[x][axis] for x in xs)
        return self.op("Concat", xs, shape, axis=axis)

    def flatten(self, x: str) -> str:
        return self.op("Flatten", [x], (self.shape[x][0], math.prod(self.shape[x][1:])), axis=1)

    # -- dense ------------------------------------------------------------------------
    def matmul(self, a: str, b: str) -> str:
        sa, sb = self.shape[a], self.shape[b]
        batch = np.broadcast_shapes(sa[:-2], sb[:-2])
        return self.op("MatMul", [a, b], (*batch, sa[-2], sb[-1]))

    def linear(self, x: str, w: np.ndarray, bias: np.ndarray | None = None) -> str:
        """MatMul by the weight ``w`` [in, out], then Add ``bias`` if given."""
        name = self.fresh("MatMul")
        out = (*self.shape[x][:-1], w.shape[1])
        y = self.op("MatMul", [x, self.init(f"{name}.weight", w)], out, name=name)
        return y if bias is None else self.add(y, self.init(f"{name}.bias", bias))

    def dense(self, x: str, n_out: int) -> str:
        """MatMul + Add with fresh random weight and bias."""
        n_in = self.shape[x][-1]
        return self.linear(x, self.randn((n_in, n_out), n_in**-0.5), self.randn(n_out, 0.05))

    def gemm(self, x: str, n_out: int) -> str:
        name, n_in = self.fresh("Gemm"), self.shape[x][1]
        w = self.init(f"{name}.weight", self.randn((n_out, n_in), n_in**-0.5))
        b = self.init(f"{name}.bias", self.randn(n_out, 0.05))
        return self.op("Gemm", [x, w, b], (self.shape[x][0], n_out), name=name, transB=1)

    def layernorm(self, x: str) -> str:
        name, d = self.fresh("LayerNormalization"), self.shape[x][-1]
        scale = self.init(f"{name}.scale", 1 + self.randn(d, 0.1))
        bias = self.init(f"{name}.bias", self.randn(d, 0.1))
        return self.op("LayerNormalization", [x, scale, bias], self.shape[x], name=name, axis=-1, epsilon=1e-12)

    # -- convolution ------------------------------------------------------------------
    def conv(self, x: str, c_out: int, k, stride: int = 1, pads=None, group: int = 1, bias: bool = False,
             dilation: int = 1) -> str:
        """Conv with He-scaled weights; ``pads=None`` pads 'same' (``dilation * (k // 2)`` per side)."""
        n, c_in, h, w = self.shape[x]
        kh, kw = (k, k) if isinstance(k, int) else k
        pads = (dilation * (kh // 2), dilation * (kw // 2)) * 2 if pads is None else (pads,) * 4
        oh = (h + pads[0] + pads[2] - dilation * (kh - 1) - 1) // stride + 1
        ow = (w + pads[1] + pads[3] - dilation * (kw - 1) - 1) // stride + 1
        name, fan_in = self.fresh("Conv"), c_in // group * kh * kw
        ins = [x, self.init(f"{name}.weight", self.randn((c_out, c_in // group, kh, kw), (2 / fan_in) ** 0.5))]
        if bias:
            ins.append(self.init(f"{name}.bias", self.randn(c_out, 0.05)))
        extra = {"dilations": [dilation, dilation]} if dilation != 1 else {}
        return self.op(
            "Conv", ins, (n, c_out, oh, ow), name=name,
            kernel_shape=[kh, kw], strides=[stride, stride], pads=list(pads), group=group, **extra,
        )

    def conv_transpose(self, x: str, c_out: int, k: int, stride: int, pad: int, output_padding: int = 0,
                       bias: bool = False) -> str:
        """ConvTranspose (weight ``[c_in, c_out, k, k]``, scaled by its fan-in per output pixel)."""
        n, c_in, h, w = self.shape[x]
        oh, ow = ((d - 1) * stride - 2 * pad + k + output_padding for d in (h, w))
        name = self.fresh("ConvTranspose")
        fan_in = c_in * max(1, (k // stride) ** 2)
        ins = [x, self.init(f"{name}.weight", self.randn((c_in, c_out, k, k), (2 / fan_in) ** 0.5))]
        if bias:
            ins.append(self.init(f"{name}.bias", self.randn(c_out, 0.05)))
        extra = {"output_padding": [output_padding] * 2} if output_padding else {}
        return self.op("ConvTranspose", ins, (n, c_out, oh, ow), name=name, kernel_shape=[k, k],
                       strides=[stride, stride], pads=[pad] * 4, **extra)

    def prelu(self, x: str) -> str:
        """PReLU with one slope per channel (``[C, 1, 1]``), drawn near 0.25."""
        name, c = self.fresh("PRelu"), self.shape[x][1]
        slope = self.init(f"{name}.slope", (0.25 + self.randn((c, 1, 1), 0.05)).astype(np.float32))
        return self.op("PRelu", [x, slope], self.shape[x], name=name)

    def bn(self, x: str) -> str:
        name, c, r = self.fresh("BatchNormalization"), self.shape[x][1], self.rng
        stats = {
            "scale": r.uniform(0.5, 1.5, c),
            "bias": 0.1 * r.standard_normal(c),
            "mean": 0.1 * r.standard_normal(c),
            "var": r.uniform(0.5, 1.5, c),
        }
        ins = [x] + [self.init(f"{name}.{k}", v.astype(np.float32)) for k, v in stats.items()]
        return self.op("BatchNormalization", ins, self.shape[x], name=name, epsilon=1e-5)

    def cbr(self, x: str, c_out: int, k, **conv_args) -> str:
        """Conv + BatchNormalization + Relu."""
        return self.relu(self.bn(self.conv(x, c_out, k, **conv_args)))

    def pool(self, op_type: str, x: str, k: int, stride: int, pad: int = 0, **attrs) -> str:
        n, c, h, w = self.shape[x]
        rnd = math.ceil if attrs.get("ceil_mode") else math.floor
        oh, ow = (rnd((d + 2 * pad - k) / stride) + 1 for d in (h, w))
        return self.op(
            op_type, [x], (n, c, oh, ow),
            kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, **attrs,
        )

    def maxpool(self, x: str, k: int, stride: int, pad: int = 0, **attrs) -> str:
        return self.pool("MaxPool", x, k, stride, pad, **attrs)

    def avgpool(self, x: str, k: int, stride: int, pad: int = 0, **attrs) -> str:
        return self.pool("AveragePool", x, k, stride, pad, **attrs)

    def gap(self, x: str) -> str:
        return self.op("GlobalAveragePool", [x], (*self.shape[x][:2], 1, 1))

    def classifier(self, x: str, n_classes: int = 1000) -> str:
        return self.gemm(self.flatten(self.gap(x)), n_classes)

    # -- model ------------------------------------------------------------------------
    def model(self, graph_name: str, out: str) -> onnx.ModelProto:
        """Renames tensor ``out`` to ``output`` and assembles the model."""
        for node in self.nodes:
            node.output[:] = ["output" if t == out else t for t in node.output]
            node.input[:] = ["output" if t == out else t for t in node.input]
        # the producer name of the models as first shipped (kept so that a zoo model's bytes do not change)
        model = onnx.ModelProto(ir_version=10, producer_name="relsat.driver.boundary.zoo")
        model.opset_import.append(helper.make_opsetid("", 17))
        graph = model.graph  # filled in place: helper.make_graph/make_model would copy the weights twice
        graph.name = graph_name
        graph.node.extend(self.nodes)
        graph.input.extend(self.inputs)
        graph.output.append(helper.make_tensor_value_info("output", TensorProto.FLOAT, self.shape[out]))
        graph.initializer.extend(self.inits)
        return model
