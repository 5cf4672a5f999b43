"""Whole ONNX graphs run by PyTorch: the GPU runtime for machines without onnxruntime-gpu.

Owns ``TorchSession``: an ONNX model's nodes run in graph order on a torch device (``cpu`` or
``cuda``), each through the per-node mapping of :mod:`relsat.extract.torch_cuda`, behind the part of
ONNX Runtime's ``InferenceSession`` interface that timing and verification use (``get_inputs``,
``get_outputs``, ``run``), so that ``driver.latency`` times original and written graphs on the GPU
with it, interleaved as it does ONNX Runtime sessions. A run ends with the device synchronized, so
wall-clock times are the kernels' (CUDA events would time the same span). Which runtime times whole
models for a backend here is ``relsat.relations.backend.Backend.whole_graph``. torch is not a relsat dependency: it is
imported when a session is made, and a node without a mapping (an opaque node, a catalog-less
operator) is refused with a one-line ``RelsatError`` naming the node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from relsat.driver.errors import RelsatError

_TYPES = {onnx.TensorProto.FLOAT: "tensor(float)", onnx.TensorProto.DOUBLE: "tensor(double)",
          onnx.TensorProto.FLOAT16: "tensor(float16)", onnx.TensorProto.INT64: "tensor(int64)",
          onnx.TensorProto.INT32: "tensor(int32)", onnx.TensorProto.BOOL: "tensor(bool)",
          onnx.TensorProto.INT8: "tensor(int8)", onnx.TensorProto.UINT8: "tensor(uint8)"}


@dataclass(frozen=True)
class Value:
    """A graph input or output as ONNX Runtime describes it (``NodeArg``)."""

    name: str
    shape: list  # ints, or strings for dynamic dims
    type: str


def _value(vi: onnx.ValueInfoProto) -> Value:
    t = vi.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return Value(vi.name, dims, _TYPES.get(t.elem_type, f"tensor({onnx.TensorProto.DataType.Name(t.elem_type).lower()})"))


class TorchSession:
    """An ONNX model run node by node with PyTorch on ``device``; weights moved there once."""

    def __init__(self, model: onnx.ModelProto, device: str = "cuda") -> None:
        import torch

        from relsat.extract import torch_cuda

        self.torch, self.ops, self.device = torch, torch_cuda, device
        # full-precision float32 on the GPU (cuDNN would use TF32 for convolutions): outputs are verified
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        graph = model.graph
        constants = [n for n in graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")]
        const_ids = {id(n) for n in constants}
        for k, node in enumerate(graph.node):
            if not torch_cuda.mapped(node) and id(node) not in const_ids:
                raise RelsatError(f"the PyTorch runtime cannot run node {node.name or k} "
                                  f"({node.domain or 'ai.onnx'}::{node.op_type}): no mapping for this operator")
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        self.nodes = [n for n in graph.node if id(n) not in const_ids]
        self.host = {n: numpy_helper.to_array(t) for t in graph.initializer for n in [t.name]}
        self.host.update({n.output[0]: _constant(n) for n in constants})  # Constant nodes are weights too
        self.weights = {n: torch.from_numpy(np.array(a)).to(device) for n, a in self.host.items()}
        self.inputs = [_value(i) for i in graph.input if i.name not in self.host]
        self.outputs = [_value(o) for o in graph.output]

    def get_inputs(self) -> list[Value]:
        return self.inputs

    def get_outputs(self) -> list[Value]:
        return self.outputs

    def run(self, output_names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs (all, or those named) as numpy arrays, for the inputs in ``feeds``."""
        torch = self.torch
        values = dict(self.weights)
        host = dict(self.host)
        for name, array in feeds.items():
            host[name] = np.asarray(array)
            values[name] = torch.from_numpy(np.array(array)).to(self.device)
        with torch.inference_mode():
            for node in self.nodes:
                shape_args = self.ops.SHAPE_ARGS.get(node.op_type, set())
                args = [None if not name else self._host(name, host, values) if i in shape_args else values[name]
                        for i, name in enumerate(node.input)]
                out = self.ops.node_call(node, args, self.opset)()
                outs = out if isinstance(out, (list, tuple)) else [out]
                for name, t in zip(node.output, outs):
                    if name:
                        values[name] = t
            if self.device != "cpu":
                torch.cuda.synchronize()
        names = output_names or [o.name for o in self.outputs]
        return [values[n].detach().cpu().numpy() for n in names]

    def _host(self, name: str, host: dict, values: dict) -> np.ndarray:
        """A shape-like input on the host: an initializer or feed as given, a computed one copied back."""
        if name not in host:
            host[name] = values[name].detach().cpu().numpy()
        return host[name]


def _constant(node) -> np.ndarray:
    """A Constant node's value (its ``value`` tensor, or a ``value_*`` list or scalar)."""
    from onnx import helper

    a = node.attribute[0]
    v = helper.get_attribute_value(a)
    if a.name in ("value", "sparse_value"):
        return numpy_helper.to_array(v)
    dtype = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
             "value_ints": np.int64}.get(a.name)
    if dtype is None:
        raise RelsatError(f"the PyTorch runtime cannot run Constant node {node.name!r} ({a.name})")
    return np.asarray(v, dtype=dtype)


def session(model_or_path, device: str = "cuda") -> TorchSession:
    """A ``TorchSession`` for a ModelProto, its serialized bytes or a path (weights of external data loaded)."""
    if isinstance(model_or_path, bytes):
        model = onnx.load_model_from_string(model_or_path)
    else:
        model = model_or_path if isinstance(model_or_path, onnx.ModelProto) else onnx.load_model(str(model_or_path))
    return TorchSession(model, device)
