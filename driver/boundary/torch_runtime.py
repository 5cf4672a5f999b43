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
from relsat.relations.onnx_form import subgraphs

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
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
        self.host = {n: numpy_helper.to_array(t) for t in graph.initializer for n in [t.name]}
        self.nodes = []
        for k, node in enumerate(graph.node):
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.host[node.output[0]] = _constant(node)  # Constant nodes are weights too
            elif (node.domain in ("", "ai.onnx") and any(node.input) and not any(subgraphs(node))
                  and all(not i or i in self.host for i in node.input)):
                # over constants only (a mask built by Range, Sub, Abs, Where): folded once, here, as ONNX Runtime does
                self.host.update(_reference(model, node, self.host))
            elif torch_cuda.mapped(node):
                self.nodes.append(node)
            else:
                raise RelsatError(f"the PyTorch runtime cannot run node {node.name or k} "
                                  f"({node.domain or 'ai.onnx'}::{node.op_type}): no mapping for this operator")
        self.weights = {n: torch.from_numpy(np.array(a)).to(device) for n, a in self.host.items()}
        self.inputs = [_value(i) for i in graph.input if i.name not in self.host]
        self.outputs = [_value(o) for o in graph.output]

    def get_inputs(self) -> list[Value]:
        return self.inputs

    def get_outputs(self) -> list[Value]:
        return self.outputs

    def run(self, output_names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs (all, or those named) as numpy arrays, for the inputs in ``feeds``."""
        host = {name: np.asarray(array) for name, array in feeds.items()}
        values = self._execute({n: self.torch.from_numpy(np.array(a)).to(self.device) for n, a in host.items()}, host)
        names = output_names or [o.name for o in self.outputs]
        return [values[n].detach().cpu().numpy() for n in names]

    def run_on_device(self, feeds: dict) -> list:
        """The outputs as torch tensors left on the device, for inputs already there (no host copies:
        what a kernel benchmark times), the device synchronized at the end."""
        values = self._execute(dict(feeds), {})
        return [values[o.name] for o in self.outputs]

    def _execute(self, inputs: dict, host: dict) -> dict:
        """Every value of one run: the weights, ``inputs`` (device tensors), and each node's outputs."""
        torch = self.torch
        values = dict(self.weights)
        values.update(inputs)
        host = dict(self.host) | host
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
        return values

    def _host(self, name: str, host: dict, values: dict) -> np.ndarray:
        """A shape-like input on the host: an initializer or feed as given, a computed one copied back."""
        if name not in host:
            host[name] = values[name].detach().cpu().numpy()
        return host[name]


def _reference(model: onnx.ModelProto, node, host: dict) -> dict[str, np.ndarray]:
    """The outputs of ``node``, whose inputs are all in ``host``, by ONNX's reference evaluator."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    ins = [i for i in node.input if i]
    g = helper.make_graph([node], "one", [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(
        host[i].dtype), host[i].shape) for i in ins], [helper.make_value_info(o, onnx.TypeProto()) for o in node.output if o])
    one = helper.make_model(g, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    outs = ReferenceEvaluator(one).run(None, {i: host[i] for i in ins})
    return {o: np.asarray(v) for o, v in zip([o for o in node.output if o], outs)}


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
