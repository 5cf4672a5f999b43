"""Whole ONNX graphs run by PyTorch: the GPU runtime for machines without onnxruntime-gpu.

Owns ``TorchSession``: an ONNX model's nodes run in graph order on a torch device (``cpu`` or
``cuda``), each through the per-node mapping of :mod:`relsat.extract.torch_cuda`, behind the part of
ONNX Runtime's ``InferenceSession`` interface that timing and verification use (``get_inputs``,
``get_outputs``, ``run``), so that ``driver.latency`` times original and written graphs on the GPU
with it, interleaved as it does ONNX Runtime sessions. A run ends with the device synchronized, so
wall-clock times are the kernels' (CUDA events would time the same span). Which runtime times whole
models for a backend here is ``relsat.relations.backend.Backend.whole_graph``. torch is not a relsat dependency: it is
imported when a session is made, and a node without a mapping (an operator neither the catalog nor
``torch_opaque`` maps), or whose attributes its mapping does not implement (a Resize mode), is refused
with a one-line ``RelsatError`` naming the node.

Shape arithmetic stays on the host. Exported models compute reshape targets, masks and anchor grids
from the input's dims (Shape -> Gather -> Concat -> Reshape, Range -> Expand, ...). A node's outputs
are *host values* when it is a Shape node (which reads only dims, never data) or when every input is a
host value or a constant and at least one is a host value: the session decides this once, when it is
made (``Step.on_host``). Such nodes run on PyTorch's CPU device over numpy memory (the same mapping,
no second implementation), and their results stay numpy arrays. A parameter input (``host_inputs``:
Reshape's shape, Expand's shape, Resize's sizes) that is a host value is read without any transfer,
so a run has no device-to-host synchronisation for them; only a host value that a device node reads
as data (an anchor grid added to a feature map, an index tensor) is copied to the device, once per
run. A parameter computed on the device (which the corpus does not have) is still copied back.
Constant-only nodes are folded once, when the session is made, as ONNX Runtime does.
"""

from __future__ import annotations

from dataclasses import dataclass

import time

import numpy as np
import onnx
from onnx import helper, numpy_helper

from relsat.driver.errors import RelsatError
from relsat.extract.profile import NODE_TIMERS
from relsat.relations import runtime
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


@dataclass(frozen=True)
class Step:
    """One node of the run, as decided when the session is made."""

    node: onnx.NodeProto
    name: str  # how errors name it: its name or position, and its operator
    on_host: bool  # its outputs are host values (module docstring)
    params: frozenset  # the positions of its inputs read on the host as numpy arrays (``host_inputs``)


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
        self.steps: list[Step] = []
        derived: set[str] = set()  # the host values computed from shapes (module docstring)
        for k, node in enumerate(graph.node):
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                self.host[node.output[0]] = _constant(node)  # Constant nodes are weights too
            elif (node.domain in ("", "ai.onnx") and any(node.input) and not any(subgraphs(node))
                  and all(not i or i in self.host for i in node.input)):
                # over constants only (a mask built by Range, Sub, Abs, Where): folded once, here, as ONNX Runtime does
                self.host.update(_reference(model, node, self.host))
            else:
                why = torch_cuda.refusal(node, self.opset)
                if why:
                    raise RelsatError(f"the PyTorch runtime cannot run {_named(node, k)}: {why}")
                ins = [i for i in node.input if i]
                on_host = (node.op_type == "Shape" and node.domain in ("", "ai.onnx")) or (
                    all(i in derived or i in self.host for i in ins) and any(i in derived for i in ins))
                if on_host:
                    derived.update(o for o in node.output if o)
                self.steps.append(Step(node, _named(node, k), on_host, frozenset(torch_cuda.host_inputs(node))))
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
        """Every device value of one run: the weights, ``inputs`` (device tensors), each device node's outputs
        and the graph outputs; the host values (constants, feeds, host nodes' outputs) go to ``host``."""
        torch = self.torch
        values = dict(self.weights)
        values.update(inputs)
        host = dict(self.host) | host
        with torch.inference_mode():
            for step in self.steps:
                node = step.node
                args = [None if not name else self._host(name, host, values) if i in step.params
                        else self._cpu(name, host, values) if step.on_host else self._device(name, host, values)
                        for i, name in enumerate(node.input)]
                try:
                    out = self.ops.node_call(node, args, self.opset, "cpu" if step.on_host else self.device)()
                except NotImplementedError as e:  # what the mapping finds only when it runs (a Pad mode)
                    raise RelsatError(f"the PyTorch runtime cannot run {step.name}: {e}") from None
                outs = out if isinstance(out, (list, tuple)) else [out]
                for name, t in zip(node.output, outs):
                    if name:
                        if step.on_host:
                            host[name] = t.numpy()
                        else:
                            values[name] = t
            for o in self.outputs:
                self._device(o.name, host, values)
            if self.device != "cpu":
                torch.cuda.synchronize()
        return values

    def _host(self, name: str, host: dict, values: dict) -> np.ndarray:
        """A parameter input on the host: a constant, feed or host value as it is, a device value copied back."""
        if name not in host:
            host[name] = values[name].detach().cpu().numpy()
        return host[name]

    def _cpu(self, name: str, host: dict, values: dict):
        """A host node's data input: a host value as a CPU tensor over its memory (a read-only constant
        copied); a device value (what a Shape node reads the dims of) as it is."""
        if name not in host:
            return values[name]
        a = host[name]
        return self.torch.from_numpy(a) if a.flags.writeable else self.torch.tensor(a)

    def _device(self, name: str, host: dict, values: dict):
        """A device node's data input; a host value is copied to the device once per run."""
        if name not in values:
            values[name] = self.torch.from_numpy(np.array(host[name])).to(self.device)
        return values[name]


def _named(node, k: int) -> str:
    return f"node {node.name or k} ({node.domain or 'ai.onnx'}::{node.op_type})"


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
    """A ``TorchSession`` for a ModelProto, its serialized bytes, a ``Runnable`` or a path (weights of external
    data loaded)."""
    if isinstance(model_or_path, runtime.Runnable):
        model = model_or_path.model()
    elif isinstance(model_or_path, bytes):
        model = onnx.load_model_from_string(model_or_path)
    else:
        model = model_or_path if isinstance(model_or_path, onnx.ModelProto) else onnx.load_model(str(model_or_path))
    return TorchSession(model, device)


# ------------------------------------------------------------------ the per-node cost of the PyTorch runtime
RUNTIME_CHAIN = 64  # nodes of the shorter chain; the longer has twice as many


def _chain(op_type: str, nodes: int):
    """A model of ``nodes`` ``op_type`` nodes in a chain over a one-element float (Add: plus a one-element
    constant), as the runtime would run it: what one more node costs when it does (next to) nothing."""
    from onnx import TensorProto, numpy_helper

    f = TensorProto.FLOAT
    inits, names = [], [f"v{i}" for i in range(nodes + 1)]
    if op_type == "Add":
        inits.append(numpy_helper.from_array(np.ones(1, np.float32), "one"))
    body = [helper.make_node(op_type, [names[i]] + (["one"] if op_type == "Add" else []), [names[i + 1]])
            for i in range(nodes)]
    graph = helper.make_graph(body, f"{op_type}_chain", [helper.make_tensor_value_info(names[0], f, [1])],
                              [helper.make_tensor_value_info(names[-1], f, [1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def runtime_node_ms(op_type: str = "Identity", nodes: int = RUNTIME_CHAIN, rounds: int = 100, warmup: int = 10,
                    device: str = "cuda") -> dict:
    """What one more ``op_type`` node costs a whole-graph run of the PyTorch runtime
    (:class:`TorchSession`, which times and runs ``--provider cuda`` models here): chains of ``nodes`` and ``2 * nodes`` such nodes, each run ``rounds`` times by the wall clock (the run
    ends with the device synchronized), the two interleaved so that drift falls on both;
    ``ms = (q10(long) - q10(short)) / nodes``, which leaves out what a run costs whatever its nodes (feeds, the
    final synchronize). The 10th percentile, not the median: other processes and the garbage collector only add
    time to a run, and on a loaded machine (2 cores, load 4) the medians gave 8-30 us per Identity node from one
    call to the next where the 10th percentiles of 100 runs gave 7.6-9.4 us. Returns ``ms`` and the percentiles
    behind it (10th, 25th, 50th, 75th; ms per run).

    The runtime pays this for every node on every run (the step's inputs gathered, the operator's namespace
    built from its attributes, its expression evaluated), where :func:`relsat.extract.torch_cuda.time_op` builds the closure once and
    times only its call; with ``op_type`` Identity (no kernel) it is the part of a node's cost that one-node
    timings minus the call overhead (an Identity timed by ``time_op``) do not see. Registered with
    :data:`relsat.extract.profile.NODE_TIMERS` (extract measures it through this runtime without importing driver)."""
    import torch

    short, long = (TorchSession(_chain(op_type, n), device) for n in (nodes, 2 * nodes))
    x = {"v0": torch.zeros(1, device=device)}
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    for _ in range(warmup):
        short.run_on_device(x)
        long.run_on_device(x)
    sync()
    times: dict[str, list[float]] = {"short": [], "long": []}
    for i in range(rounds):
        for name in (("short", "long") if i % 2 == 0 else ("long", "short")):
            session = short if name == "short" else long
            t = time.perf_counter()
            session.run_on_device(x)
            times[name].append((time.perf_counter() - t) * 1e3)
    stats = {name: [float(v) for v in np.percentile(t, [10, 25, 50, 75])] for name, t in times.items()}
    return {"ms": max((stats["long"][0] - stats["short"][0]) / nodes, 0.0), "op_type": op_type, "nodes": nodes,
            "rounds": rounds, "short_ms": stats["short"], "long_ms": stats["long"]}


NODE_TIMERS["cuda-torch"] = runtime_node_ms  # the per-node cost extract's CUDA pricing adds (profile)
