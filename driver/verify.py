"""Numerical verification under ONNX Runtime.

Owns the ONNX Runtime sessions relsat creates (``ort_session``, the one-line
``error_line`` text of a failure), the seeded random inputs, and ``verify``: the
original and the optimized model run on the same inputs and every output is
compared with a tolerance scaled to that output's magnitude
(``atol + rtol * max|ref|``).
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from .errors import RelsatError

_PROTO_LIMIT = 2_000_000_000  # protobuf cannot serialize a message of 2 GiB or more


@dataclass
class OutputCheck:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    tolerance: float
    problem: str = ""  # why it failed, when it did


@dataclass
class VerifyResult:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    per_output: dict[str, OutputCheck] = field(default_factory=dict)
    message: str = ""


def error_line(exc: BaseException) -> str:
    """The first line of an exception's message (ONNX Runtime's status prefix removed)."""
    text = str(exc).strip() or type(exc).__name__
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text.splitlines()[0])


def ort_session(model_or_path, *, optimize: bool = True) -> ort.InferenceSession:
    """A CPU session for a model file or an in-memory model (raises ONNX Runtime's errors)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if not isinstance(model_or_path, onnx.ModelProto):
        return ort.InferenceSession(str(model_or_path), opts, providers=["CPUExecutionProvider"])
    if model_or_path.ByteSize() < _PROTO_LIMIT:
        return ort.InferenceSession(model_or_path.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    from .onnx_export import save_model_atomic  # too big for one buffer: go through a file

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        save_model_atomic(model_or_path, path, external_data=True)
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _np_dtype(ort_type: str):
    elem = ort_type[len("tensor("):-1].upper() if ort_type.startswith("tensor(") else ort_type.upper()
    return onnx.helper.tensor_dtype_to_np_dtype(onnx.TensorProto.DataType.Value(elem))


def random_inputs(sessions, *, seed: int = 0, input_shapes: dict | None = None) -> dict[str, np.ndarray]:
    """Seeded random feeds for the first session's inputs; a dynamic dim takes the user's
    ``input_shapes``, else a concrete dim any other session declares, else 1."""
    rng = np.random.default_rng(seed)
    declared = [{i.name: i.shape for i in s.get_inputs()} for s in sessions]
    feeds = {}
    for inp in sessions[0].get_inputs():
        if input_shapes and inp.name in input_shapes:
            shape = [int(d) for d in input_shapes[inp.name]]
        else:
            shape = []
            for k in range(len(inp.shape)):
                known = [d[inp.name][k] for d in declared if len(d.get(inp.name) or ()) > k]
                shape.append(next((n for n in known if isinstance(n, int)), 1))
        dtype = np.dtype(_np_dtype(inp.type))
        if dtype == np.bool_:
            value = rng.random(shape) < 0.5
        elif dtype.kind in "fV":  # V: ml_dtypes such as bfloat16
            value = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":  # small non-negative values, valid as indices; attention masks all ones
            value = (np.ones(shape) if "mask" in inp.name.lower() else rng.integers(0, 8, shape)).astype(dtype)
        else:
            value = np.full(shape, "a", dtype=object)
        feeds[inp.name] = np.asarray(value)
    return feeds


def _compare(ref, got, rtol: float, atol: float) -> OutputCheck:
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape:
        return OutputCheck(False, float("inf"), float("inf"), 0.0, f"shape {list(got.shape)}, the original's {list(ref.shape)}")
    if ref.dtype == object or got.dtype == object:
        same = bool(np.array_equal(ref, got))
        return OutputCheck(same, 0.0 if same else float("inf"), 0.0 if same else float("inf"), 0.0,
                           "" if same else "values differ")
    a, b = ref.astype(np.float64), got.astype(np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        return OutputCheck(False, float("inf"), float("inf"), 0.0, "NaN where the original has none (or vice versa)")
    keep = ~nan_a & ~(np.isinf(a) & (a == b))
    err = float(np.abs(a - b)[keep].max(initial=0.0))
    finite = np.abs(a[np.isfinite(a)])
    mag = float(finite.max(initial=0.0))
    tol = atol + rtol * mag
    rel = err / mag if mag > 0 else (0.0 if err == 0 else float("inf"))
    ok = err <= tol
    return OutputCheck(ok, err, rel, tol, "" if ok else f"max abs err {err:.3g} exceeds tolerance {tol:.3g} "
                       f"(atol {atol:g} + rtol {rtol:g} x max|ref| {mag:.3g})")


def verify(original, optimized, *, seed: int = 0, rtol: float = 1e-3, atol: float = 1e-4,
           input_shapes: dict[str, list[int]] | None = None) -> VerifyResult:
    """Run ``original`` and ``optimized`` (models or paths) under ONNX Runtime on the same seeded
    random inputs and compare every output of the original."""
    label = str(original) if not isinstance(original, onnx.ModelProto) else "the original model"
    try:
        ref_sess = ort_session(original)
    except Exception as e:
        raise RelsatError(f"{label}: ONNX Runtime cannot load the model: {error_line(e)}") from None
    try:
        opt_sess = ort_session(optimized)
    except Exception as e:
        return VerifyResult(False, float("inf"), float("inf"), {},
                            f"ONNX Runtime cannot load the optimized model: {error_line(e)}")
    feeds = random_inputs([ref_sess, opt_sess], seed=seed, input_shapes=input_shapes)
    try:
        ref = ref_sess.run(None, feeds)
    except Exception as e:
        raise RelsatError(f"{label}: ONNX Runtime cannot run the model: {error_line(e)}") from None
    opt_names = [o.name for o in opt_sess.get_outputs()]
    names = [o.name for o in ref_sess.get_outputs()]
    missing = [n for n in names if n not in opt_names]
    if missing:
        return VerifyResult(False, float("inf"), float("inf"), {},
                            f"the optimized model has no output {missing[0]!r}")
    opt_feeds = {i.name: feeds[i.name] for i in opt_sess.get_inputs() if i.name in feeds}
    try:
        got = dict(zip(opt_names, opt_sess.run(None, opt_feeds)))
    except Exception as e:
        return VerifyResult(False, float("inf"), float("inf"), {},
                            f"ONNX Runtime cannot run the optimized model: {error_line(e)}")
    checks = {n: _compare(r, got[n], rtol, atol) for n, r in zip(names, ref)}
    abs_err = max((c.max_abs_err for c in checks.values()), default=0.0)
    rel_err = max((c.max_rel_err for c in checks.values()), default=0.0)
    bad = [(n, c) for n, c in checks.items() if not c.ok]
    if bad:
        msg = f"output {bad[0][0]!r}: {bad[0][1].problem}"
    else:
        msg = f"{len(checks)} outputs match (max abs err {abs_err:.3g}, max rel err {rel_err:.3g})"
    return VerifyResult(not bad, abs_err, rel_err, checks, msg)
