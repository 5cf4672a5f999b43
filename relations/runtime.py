"""ONNX Runtime, once for every layer: the session factory and the random-input generator.

Rule verification (programs/), operator profiling (extract/), model verification and the
latency guard (driver/) all run models under ONNX Runtime; they create their sessions with
``session`` and draw their inputs with ``random_array``/``random_feeds``, so the session options
(threads, sequential execution, optimization level, providers) and the input distributions
are declared here and nowhere else.

``session(model, providers=, threads=, optimize=)``: a model given as a ModelProto, bytes, a
``Runnable`` or a path; a ModelProto with big weights is made a ``Runnable`` first (``runnable``: its graph
serialized without them, the weights given to ONNX Runtime as arrays); any other ModelProto too big for one
protobuf buffer (2 GiB) goes through a temporary file with external data.  ``threads=None`` leaves ONNX
Runtime's own thread defaults; a number fixes the intra-op threads, one inter-op thread and sequential
execution, and stops the threads' spinning when a run ends (how relsat times models: see ``session_options``).

``serialize_once(model)``: while the block runs, every session made here for that ModelProto and every
``serialized(model)`` use one serialization of it, made at the first use, and its sessions without graph
optimizations (ONNX Runtime's defaults otherwise: the load check, the bindings' trial runs, verification's
reference) are one session (``relsat optimize`` makes a dozen sessions of its input model: serializing GPT-2
took 1.3 s each time, 11.5 of a 45 s run, and an unoptimized session of it 1.2-2 s); the caller does not change
the model inside the block.  A model read from a file is not serialized at all: the file's bytes are its
serialization (``serialize_once(model, blob)``; GPT-2's serialization took 1.5-2.3 s of its import).

``ReferenceSession(model)``: ONNX's reference evaluator behind the same interface, for a model ONNX
Runtime cannot run (verification of an upgraded old model against the original).

``random_array(rng, shape, dtype, ...)``: floating point ~ N(0, scale^2) (``positive``: uniform
in [0.5, 2); ``nonzero``: the same with a random sign), booleans fair coins, integers uniform in
``int_range`` (small non-negative values, valid as indices), strings random mixed-case words.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

PROTO_LIMIT = 2_000_000_000  # protobuf cannot serialize a message of 2 GiB or more
INT_RANGE = (0, 8)
CPU_PROVIDERS = ("CPUExecutionProvider",)  # for rule checks, verification and folding, which run on the CPU


def _tensors(graph: onnx.GraphProto):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("g"):
                yield from _tensors(a.g)
            for g in a.graphs:
                yield from _tensors(g)


def tensor_bytes(model: onnx.ModelProto) -> int:
    """The bytes of tensor data a model holds in itself (initializers, Constant attributes, subgraphs):
    a cheap stand-in for ``ByteSize()``, which costs as much as serializing the whole model."""
    n = 0
    for t in _tensors(model.graph):
        n += (len(t.raw_data) + 4 * (len(t.float_data) + len(t.int32_data)) + 8 * (len(t.int64_data)
              + len(t.double_data) + len(t.uint64_data)) + sum(len(x) for x in t.string_data))
    return n


def fits_one_buffer(model: onnx.ModelProto) -> bool:
    """Whether the model serializes into one protobuf buffer (under 2 GiB, with a margin for the rest
    of the message)."""
    return tensor_bytes(model) < PROTO_LIMIT - 100_000_000


_LOG_SEVERITY = [4]  # fatal only: a failing run raises anyway (a one-node probe of an opaque Gather on random
# indices printed red ONNX Runtime errors to the user); ``set_log_severity`` (relsat optimize --verbose) lowers it


def set_log_severity(level: int) -> None:
    """The severity from which ONNX Runtime's sessions (made here) and its default logger print: 4 (fatal,
    the default) keeps its lines out of the user's output, 2 (warnings) is ``--verbose``."""
    _LOG_SEVERITY[0] = level
    ort.set_default_logger_severity(level)


def session_options(*, threads: int | None = None, optimize: bool = True) -> ort.SessionOptions:
    """Quiet options; ``optimize``: graph optimizations at level ALL (else none); ``threads``: as in
    the module docstring."""
    opts = ort.SessionOptions()
    opts.log_severity_level = _LOG_SEVERITY[0]
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if threads is not None:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # A session's intra-op threads spin on after a run; with several timing sessions alive in one
        # process (the guard, the measured choice, compare.py) the idle ones' spinning took the cores from
        # the one running: squeezenet at 2 threads on 2 cores ran 6.9 ms with 2 or 4 sessions alive against
        # 2.9 ms alone. Stopping the spin when a run ends gives 2.9 ms either way.
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    return opts


_ONCE_LOCK = threading.Lock()
_ONCE: dict[int, list] = {}  # id(model) -> [the model, its bytes (or the model: over one buffer), its session
# without graph optimizations]: None before their first use


@contextlib.contextmanager
def serialize_once(model, blob: bytes | None = None):
    """Within the block, ``model`` (a ModelProto) is serialized at most once here (module docstring); the
    caller does not change it meanwhile.  ``blob``: bytes that are the model already (the file it was parsed
    from, ``onnx_import.read_model``): used as its serialization, none made.  Nested blocks over the same model
    share the outer one's bytes."""
    if not isinstance(model, onnx.ModelProto) or id(model) in _ONCE:
        yield
        return
    _ONCE[id(model)] = [model, blob, None]
    try:
        yield
    finally:
        _ONCE.pop(id(model), None)


def _registered(model) -> list | None:
    """``model``'s entry in ``_ONCE`` (inside ``serialize_once(model)``), else None."""
    entry = _ONCE.get(id(model)) if isinstance(model, onnx.ModelProto) else None
    return entry if entry is not None and entry[0] is model else None


def serialized(model: onnx.ModelProto):
    """``model``'s bytes, or the model itself when it does not fit one protobuf buffer; inside
    ``serialize_once(model)`` the same bytes every time."""
    entry = _registered(model)
    if entry is not None and entry[1] is not None:
        return entry[1]
    blob = model.SerializeToString() if fits_one_buffer(model) else model
    if entry is not None:
        entry[1] = blob
    return blob


# weights ONNX Runtime is given as arrays where a model is made runnable (``runnable``): element types
# numpy and ONNX Runtime share, and tensors big enough that serializing them is what costs
_ARRAY_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT8,
                onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
                onnx.TensorProto.BOOL}
ARRAY_MIN_BYTES = 4096  # an initializer this big or bigger goes to the session as an array ...
RUNNABLE_MIN_BYTES = 1 << 20  # ... in models whose such initializers hold this much (below: plain bytes)


@dataclass(frozen=True)
class Runnable:
    """A model as sessions load it without serializing its weights: ``graph`` the model serialized with its big
    initializers marked external data, ``arrays`` their values, which a session made here gives ONNX Runtime
    (``SessionOptions.add_external_initializers``: they replace the marked initializers before any graph
    optimization, copied into the session as a file's weights would be, so the session runs what it runs for
    the model's bytes). Serializing ViT-B/16 (346 MB) took 0.6-4 s a time, and the measured choice made a
    dozen sessions of four such graphs; a session of the bytes took 0.5-0.6 s to load, of this 0.3-0.4 s."""
    graph: bytes
    names: tuple[str, ...]
    arrays: tuple[np.ndarray, ...]

    def model(self) -> onnx.ModelProto:
        """The whole model again (for a runtime that is not ONNX Runtime)."""
        m = onnx.load_model_from_string(self.graph)
        values = dict(zip(self.names, self.arrays))
        for t in m.graph.initializer:
            if t.name in values:
                full = numpy_helper.from_array(values[t.name], t.name)
                t.ClearField("external_data")
                t.ClearField("data_location")
                t.raw_data = full.raw_data
        return m


def _array_initializer(t: onnx.TensorProto, listed: set[str], nbytes: int) -> bool:
    """Whether initializer ``t`` of ``nbytes`` bytes (its raw data, or a shell's array) goes to a session as an array."""
    return (t.data_type in _ARRAY_TYPES and t.data_location != onnx.TensorProto.EXTERNAL and t.name not in listed
            and nbytes >= ARRAY_MIN_BYTES)


def _copy_fields(src, dst, *, skip: str) -> None:
    """The fields ``src`` has set, copied into ``dst``, but ``skip``."""
    for desc, value in src.ListFields():
        if desc.name == skip:
            continue
        if desc.is_repeated:
            getattr(dst, desc.name).extend(value)
        elif desc.message_type is not None:
            getattr(dst, desc.name).CopyFrom(value)
        else:
            setattr(dst, desc.name, value)


def runnable(model, arrays: dict | None = None, *, sessions: int = 1):
    """What a session is made from fastest (``session`` takes each): ``model``'s bytes where they exist already
    (``serialize_once``) and it is made into one session or two (``sessions``: how many the caller will make), or
    where its big initializers (``ARRAY_MIN_BYTES`` each, raw data, not graph inputs) hold under
    ``RUNNABLE_MIN_BYTES``; else a :class:`Runnable`. Not a ModelProto: itself. A session of GPT-2's bytes (652 MB)
    took 1.05-1.71 s to make here, of its Runnable 0.54-0.61 s, and the Runnable 0.5 s to make: worth it from a
    few sessions on (the measured choice makes four in each timing of the input model).

    ``arrays``: the data of initializers that ``model`` holds as shells (name, dtype and dims, no data: an
    export's weights before ``fill_weights``), by name: a big one goes to the Runnable as that array itself and a
    small one is written into its graph, as filling them would write them; ``model`` is left as it is unless
    its big weights are too few for a Runnable, where its shells are filled in place (the model's bytes are
    then what a session is made from). Filling ViT-B/16's 346 MB of weights into a candidate and reading them
    back out as arrays took 2-3 s a graph on this machine, most of it the pages of the copies."""
    if not isinstance(model, onnx.ModelProto):
        return model
    entry = _registered(model)
    if entry is not None and entry[1] is not None and (sessions <= 2 or not isinstance(entry[1], bytes)):
        return entry[1]
    arrays = arrays or {}
    listed = {v.name for v in model.graph.input}

    def shell(t) -> np.ndarray | None:
        arr = arrays.get(t.name)
        return arr if arr is not None and not t.raw_data and arr.size else None

    def size(t) -> int:  # its bytes where it goes to a session as an array, else 0
        arr = shell(t)
        n = len(t.raw_data) if arr is None else arr.nbytes
        return n if _array_initializer(t, listed, n) else 0

    sizes = [size(t) for t in model.graph.initializer]
    if sum(sizes) < RUNNABLE_MIN_BYTES:
        for t in model.graph.initializer:
            arr = shell(t)
            if arr is not None:
                t.raw_data = np.ascontiguousarray(arr).tobytes()
        return serialized(model)
    light, src = onnx.ModelProto(), model.graph
    _copy_fields(model, light, skip="graph")
    g = light.graph
    _copy_fields(src, g, skip="initializer")
    names, values = [], []
    for t, n in zip(src.initializer, sizes):
        arr = shell(t)
        if not n:
            g.initializer.append(t)
            if arr is not None:
                g.initializer[-1].raw_data = np.ascontiguousarray(arr).tobytes()
            continue
        arr = np.ascontiguousarray(arr) if arr is not None else numpy_helper.to_array(t)
        stub = g.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", "relsat-runnable"), ("offset", "0"), ("length", str(arr.nbytes))):
            stub.external_data.add(key=key, value=value)
        names.append(t.name)
        values.append(arr)
    return Runnable(light.SerializeToString(), tuple(names), tuple(values))


def serialized_already(model) -> bytes | None:
    """The bytes :func:`serialized` made of ``model`` inside ``serialize_once(model)`` (or the file's bytes it was
    given), or None (none made yet, or not inside such a block): what a writer reuses without sizing the model
    again (``tensor_bytes`` copies every weight's data: 0.7 s for 400 MB)."""
    entry = _registered(model)
    return entry[1] if entry is not None and isinstance(entry[1], bytes) else None


def session(model, *, providers=CPU_PROVIDERS, threads: int | None = None, optimize: bool = True,
            options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    """An InferenceSession for a ModelProto, serialized bytes or a path on ONNX Runtime's ``providers``
    (the CPU's by default; ``relations.backend.Backend.session`` gives a backend's), raising ONNX
    Runtime's errors."""
    entry = _registered(model)
    if (entry is not None and options is None and threads is None and not optimize
            and tuple(providers) == CPU_PROVIDERS):  # the one plain session of a model in ``serialize_once``
        with _ONCE_LOCK:  # one session, also when the load check's thread and the import ask at once
            if entry[2] is None:  # alive for the whole run, beside the timing sessions: its threads never spin
                quiet = session_options(optimize=False)
                quiet.add_session_config_entry("session.intra_op.allow_spinning", "0")
                entry[2] = session(serialized(model), options=quiet)
            return entry[2]
    opts = options or session_options(threads=threads, optimize=optimize)
    prov = list(providers)
    if isinstance(model, onnx.ModelProto):
        model = runnable(model)  # bytes, a Runnable, or the model itself where it does not fit one buffer
    if isinstance(model, Runnable):  # (``opts`` is this session's own: the arrays go to this session only)
        opts.add_external_initializers(list(model.names), [ort.OrtValue.ortvalue_from_numpy(a) for a in model.arrays])
        return ort.InferenceSession(model.graph, opts, providers=prov)
    if isinstance(model, (bytes, bytearray)):
        return ort.InferenceSession(bytes(model), opts, providers=prov)
    if not isinstance(model, onnx.ModelProto):
        return ort.InferenceSession(str(model), opts, providers=prov)
    with tempfile.TemporaryDirectory() as tmp:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        path = Path(tmp) / "model.onnx"
        onnx.save_model(copy, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data", size_threshold=1024)
        return ort.InferenceSession(str(path), opts, providers=prov)


class _Arg:
    """An input or output as ONNX Runtime's NodeArg shows it: name, shape (ints, dim names or None), type."""

    def __init__(self, v: onnx.ValueInfoProto):
        tt = v.type.tensor_type
        self.name = v.name
        self.shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        self.type = f"tensor({onnx.TensorProto.DataType.Name(tt.elem_type).lower()})"


class ReferenceSession:
    """ONNX's reference evaluator (``onnx.reference``) behind ONNX Runtime's session interface
    (``get_inputs``, ``get_outputs``, ``run``): the stand-in for a model ONNX Runtime cannot run (an opset
    below 7 that relsat upgrades), slow but defined by the ONNX specification. Strings come back as
    object arrays of ``str``, as ONNX Runtime gives them."""

    def __init__(self, model: onnx.ModelProto):
        from onnx.reference import ReferenceEvaluator

        self.model = model
        self.evaluator = ReferenceEvaluator(model)
        inits = {t.name for t in model.graph.initializer}
        self._inputs = [_Arg(v) for v in model.graph.input if v.name not in inits]
        self._outputs = [_Arg(v) for v in model.graph.output]

    def get_inputs(self):
        return self._inputs

    def get_outputs(self):
        return self._outputs

    def run(self, names, feeds):
        out = self.evaluator.run(names, feeds)
        return [np.asarray(o, dtype=object) if np.asarray(o).dtype.kind in "US" else np.asarray(o) for o in out]


def np_dtype(onnx_or_ort_type) -> np.dtype:
    """The numpy dtype of a TensorProto code or an ONNX Runtime type string such as 'tensor(float)'."""
    if isinstance(onnx_or_ort_type, str):
        t = onnx_or_ort_type
        elem = t[len("tensor("):-1].upper() if t.startswith("tensor(") else t.upper()
        onnx_or_ort_type = onnx.TensorProto.DataType.Value(elem)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_or_ort_type))


def random_array(rng: np.random.Generator, shape, dtype, *, scale: float = 1.0, int_range=INT_RANGE,
                 positive: bool = False, nonzero: bool = False) -> np.ndarray:
    """One random input (module docstring)."""
    dtype = np.dtype(dtype)
    shape = [int(d) for d in shape]
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(int_range[0], int_range[1], size=shape).astype(dtype)
    if dtype.kind in "fV":  # V: ml_dtypes such as bfloat16
        if positive or nonzero:
            value = rng.uniform(0.5, 2.0, shape)
            if nonzero and not positive:
                value = value * rng.choice((-1, 1), shape)
        else:
            value = rng.standard_normal(shape) * scale
        return np.asarray(value).astype(dtype)
    if dtype.kind in "OUS":  # mixed-case words of 1 to 5 letters, so that a string op's output varies
        letters = np.array(list("aBcDeFgH xYz"), dtype=object)
        size = int(np.prod(shape, dtype=np.int64))
        lengths = rng.integers(1, 6, size=size)
        words = ["".join(rng.choice(letters, n)) for n in lengths]
        return np.array(words, dtype=object).reshape(shape)
    raise ValueError(f"cannot draw a random {dtype} input")


def is_mask_input(name: str, dtype) -> bool:
    """An integer input named like an attention mask (``random_feeds(masks_ones=True)`` feeds it ones)."""
    return np.dtype(dtype).kind in "iu" and "mask" in name.lower()


def random_feeds(specs, *, rng: np.random.Generator, scale: float = 1.0, int_range=INT_RANGE,
                 masks_ones: bool = False, int_ranges: dict | None = None) -> dict[str, np.ndarray]:
    """Feeds for ``specs``: (name, shape, dtype) triples. ``masks_ones``: integer inputs named like an
    attention mask are all ones; ``int_ranges``: a per-input integer range (e.g. divisors from 1)."""
    feeds = {}
    for name, shape, dtype in specs:
        dtype = np.dtype(dtype)
        if masks_ones and is_mask_input(name, dtype):
            feeds[name] = np.ones([int(d) for d in shape], dtype=dtype)
            continue
        rng_int = (int_ranges or {}).get(name, int_range)
        feeds[name] = np.asarray(random_array(rng, shape, dtype, scale=scale, int_range=rng_int))
    return feeds
