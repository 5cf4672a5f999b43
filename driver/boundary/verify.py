"""Numerical verification under ONNX Runtime.

Owns ``verify``: the original and the optimized model run under ONNX Runtime
(sessions and random inputs from ``relsat.relations.runtime``) on the same inputs,
several of them, and every output is compared element by element.

The inputs (``INPUT_DRAWS``): two standard-normal draws and one wide draw (normal
x 10, so negative and large values are reached: a rewrite that is only right on
small or positive values is caught); integer inputs get small non-negative values
(valid as indices; inputs named like a mask get ones), booleans fair coins.

The comparison: floating-point elements must satisfy
``|got - ref| <= atol + rtol * |ref| + floor``, per element, where ``floor`` is
the rounding noise allowed for that output: the larger of ``FLOOR_ULPS`` units in
the last place of the output's largest magnitude and ``NOISE_FACTOR`` times how
far ONNX Runtime's own optimizations move the original (the original run with
graph optimizations on and off, on the same inputs: BatchNormalization folding
and friends round differently, and relsat's rewrites may round like them).
Integer, boolean and string elements must be equal (strings compared as text,
never as numbers); NaN must match NaN and an infinity the same infinity.

An original that ONNX Runtime cannot run (a model below opset 7, which relsat
upgrades) is run under ONNX's reference evaluator instead
(``runtime.ReferenceSession``), without the noise floor of the second run.  A failure names the output, the input draw, the worst
element's index and both values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from relsat.relations import runtime

from relsat.driver.boundary import feeds
from relsat.driver.errors import RelsatError, error_line  # noqa: F401  (error_line re-exported)

INPUT_DRAWS = ((0, 1.0), (1, 1.0), (2, 10.0))  # (seed, scale of floating-point inputs)
RTOL, ATOL = 1e-3, 1e-4
FLOOR_ULPS = 16
NOISE_FACTOR = 8.0


@dataclass
class OutputCheck:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    tolerance: float  # the tolerance at the worst element
    problem: str = ""  # why it failed, when it did
    worst: tuple = ()  # index of the worst element (the one closest to, or furthest past, its tolerance)
    draw: int = 0  # the input draw (index into INPUT_DRAWS) the worst element comes from


@dataclass
class VerifyResult:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    per_output: dict[str, OutputCheck] = field(default_factory=dict)
    message: str = ""
    draws: int = 0  # input draws compared


def random_inputs(sessions, *, seed: int = 0, input_shapes: dict | None = None,
                  scale: float = 1.0, roles: dict | None = None) -> dict[str, np.ndarray]:
    """Seeded random feeds for the first session's inputs (``relsat.driver.boundary.feeds.draw``: floats
    ~ N(0, scale^2), integers in the range ``roles`` gives them (valid indices, shapes, split sizes;
    ``feeds.input_roles``), else small non-negative ones, attention masks all ones); a dynamic dim
    takes ``input_shapes``, else a concrete dim any other session declares, else 1."""
    declared = [{i.name: i.shape for i in s.get_inputs()} for s in sessions]
    specs = []
    for inp in sessions[0].get_inputs():
        if input_shapes and inp.name in input_shapes:
            shape = [int(d) for d in input_shapes[inp.name]]
        else:
            shape = []
            for k in range(len(inp.shape)):
                known = [d[inp.name][k] for d in declared if len(d.get(inp.name) or ()) > k]
                shape.append(next((n for n in known if isinstance(n, int)), 1))
        specs.append((inp.name, shape, runtime.np_dtype(inp.type)))
    if roles is None:
        return runtime.random_feeds(specs, rng=np.random.default_rng(seed), scale=scale, masks_ones=True)
    return feeds.draw(specs, roles, seed, scale=scale)


def _model_of(original):
    """The original as a ModelProto (for the roles of its integer inputs), or None."""
    if isinstance(original, onnx.ModelProto):
        return original
    try:
        return onnx.load_model(str(original), load_external_data=False)
    except Exception:
        return None


def _reference(model):
    """ONNX's reference evaluator for ``model`` (``runtime.ReferenceSession``), or None when it cannot
    take it either."""
    if model is None:
        return None
    try:
        return runtime.ReferenceSession(model)
    except Exception:
        return None


def _fmt_binding(shapes: dict | None) -> str:
    return " ".join(f"{k}={'x'.join(map(str, v))}" for k, v in (shapes or {}).items())


def _eps(dtype: np.dtype) -> float:
    try:
        return float(np.finfo(dtype).eps)
    except (TypeError, ValueError):  # ml_dtypes (bfloat16, float8): 8 mantissa bits or fewer
        return 2.0 ** -7


def _fmt_index(idx) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def compare_output(ref, got, *, rtol: float = RTOL, atol: float = ATOL, noise=None) -> OutputCheck:
    """Element-by-element comparison of one output; ``noise`` is the original's own output under
    another ONNX Runtime optimization level (its distance from ``ref`` widens the floor)."""
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape:
        return OutputCheck(False, float("inf"), float("inf"), 0.0,
                           f"shape {list(got.shape)}, the original's {list(ref.shape)}")
    if ref.size == 0:
        return OutputCheck(True, 0.0, 0.0, 0.0)
    exact = ref.dtype == object or got.dtype == object or ref.dtype.kind in "biuSU" or got.dtype.kind in "biuSU"
    if exact:
        if ref.dtype == object or got.dtype == object:
            differ = np.asarray(ref != got, dtype=bool).reshape(ref.shape)
        else:
            differ = ref != got
        if not differ.any():
            return OutputCheck(True, 0.0, 0.0, 0.0)
        idx = np.unravel_index(int(np.argmax(differ)), ref.shape)
        n = int(differ.sum())
        err = (float(abs(float(got[idx]) - float(ref[idx]))) if ref.dtype.kind in "biuf" and got.dtype.kind in "biuf"
               else float("inf"))
        return OutputCheck(False, err, float("inf"), 0.0,
                           f"{n} of {ref.size} elements differ (compared exactly); element {_fmt_index(idx)} "
                           f"is {got[idx]!r}, the original's {ref[idx]!r}", tuple(int(i) for i in idx))
    a, b = ref.astype(np.float64), got.astype(np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    inf_mismatch = (np.isinf(a) | np.isinf(b)) & (a != b) & ~nan_a & ~nan_b
    special = (nan_a != nan_b) | inf_mismatch
    if special.any():
        idx = np.unravel_index(int(np.argmax(special)), a.shape)
        return OutputCheck(False, float("inf"), float("inf"), 0.0,
                           f"element {_fmt_index(idx)} is {b[idx]:g}, the original's {a[idx]:g} "
                           f"({int(special.sum())} elements with NaN or infinity on one side only)",
                           tuple(int(i) for i in idx))
    finite = np.isfinite(a)
    diff = np.where(finite, np.abs(a - b), 0.0)
    mag = float(np.abs(a[finite]).max(initial=0.0))
    floor = FLOOR_ULPS * _eps(ref.dtype) * mag
    if noise is not None:
        n = np.asarray(noise, dtype=np.float64)
        if n.shape == a.shape:
            both = finite & np.isfinite(n)
            floor = max(floor, NOISE_FACTOR * float(np.abs(a - n)[both].max(initial=0.0)))
    tol = atol + floor + rtol * np.abs(np.where(finite, a, 0.0))
    ratio = diff / tol
    k = int(np.argmax(ratio))
    idx = np.unravel_index(k, a.shape)
    err = float(diff.max())
    rel = err / mag if mag > 0 else (0.0 if err == 0 else float("inf"))
    ok = bool(ratio.flat[k] <= 1.0)
    problem = "" if ok else (
        f"{int((ratio > 1).sum())} of {a.size} elements differ; worst element {_fmt_index(idx)} is "
        f"{b[idx]:.6g}, the original's {a[idx]:.6g} (|diff| {diff[idx]:.3g} > tolerance {tol[idx]:.3g} = "
        f"atol {atol:g} + rtol {rtol:g} x |ref| + rounding floor {floor:.3g})")
    return OutputCheck(ok, err, rel, float(tol[idx]), problem, tuple(int(i) for i in idx))


def verify(original, optimized, *, rtol: float = RTOL, atol: float = ATOL,
           input_shapes: dict[str, list[int]] | None = None, draws=INPUT_DRAWS, bindings=None,
           input_sets=()) -> VerifyResult:
    """Run ``original`` and ``optimized`` (models or paths; ``optimized`` may also be an ONNX Runtime
    session already made for it) under ONNX Runtime on the same random inputs (every ``(seed, scale)``
    of ``draws`` at every binding of ``bindings``, a list of input shapes dicts, default
    ``[input_shapes]``) and on the user's ``input_sets`` (feeds dicts), and compare every output of
    the original, element by element (module docstring)."""
    bindings = list(bindings or [input_shapes])
    source = _model_of(original)
    cases = []  # (label, feeds maker)
    for b in bindings:
        roles = feeds.input_roles(source, b) if source is not None else None
        at = f" at {_fmt_binding(b)}" if len(bindings) > 1 else ""
        for seed, scale in draws:
            cases.append((f"(seed {seed}, scale {scale:g}){at}",
                          lambda sessions, b=b, seed=seed, scale=scale, roles=roles: random_inputs(
                              sessions, seed=seed, input_shapes=b, scale=scale, roles=roles)))
    for k, given in enumerate(input_sets):
        cases.append((f"(the user's input set {k + 1})", lambda sessions, given=given: dict(given)))
    label = str(original) if not isinstance(original, onnx.ModelProto) else "the original model"
    try:
        ref_sess = runtime.session(original)
        plain_sess = runtime.session(original, optimize=False)
    except Exception as e:
        ref_sess = plain_sess = _reference(source)  # an old model ONNX Runtime cannot run: the spec's evaluator
        if ref_sess is None:
            raise RelsatError(f"{label}: ONNX Runtime cannot load the model: {error_line(e)}") from None
    try:
        opt_sess = optimized if hasattr(optimized, "run") else runtime.session(optimized)
    except Exception as e:
        return VerifyResult(False, float("inf"), float("inf"), {},
                            f"ONNX Runtime cannot load the optimized model: {error_line(e)}")
    opt_names = [o.name for o in opt_sess.get_outputs()]
    names = [o.name for o in ref_sess.get_outputs()]
    missing = [n for n in names if n not in opt_names]
    if missing:
        return VerifyResult(False, float("inf"), float("inf"), {},
                            f"the optimized model has no output {missing[0]!r}")
    checks: dict[str, OutputCheck] = {}
    for d, (what, make) in enumerate(cases):
        fed = make([ref_sess, opt_sess])
        try:
            ref = ref_sess.run(None, fed)
            plain = ref if plain_sess is ref_sess else plain_sess.run(None, fed)
        except Exception as e:
            raise RelsatError(f"{label}: ONNX Runtime cannot run the model on input draw {what}: "
                              f"{error_line(e)}") from None
        opt_feeds = {i.name: fed[i.name] for i in opt_sess.get_inputs() if i.name in fed}
        try:
            got = dict(zip(opt_names, opt_sess.run(None, opt_feeds)))
        except Exception as e:
            return VerifyResult(False, float("inf"), float("inf"), checks,
                                f"ONNX Runtime cannot run the optimized model: {error_line(e)}", d)
        for n, r, p in zip(names, ref, plain):
            c = compare_output(r, got[n], rtol=rtol, atol=atol, noise=None if plain_sess is ref_sess else p)
            c.draw = d
            prev = checks.get(n)
            if prev is None or (prev.ok and (not c.ok or c.max_abs_err > prev.max_abs_err)):
                checks[n] = c
        if any(not c.ok for c in checks.values()):
            break  # the first draw that shows a difference is the one reported
    abs_err = max((c.max_abs_err for c in checks.values()), default=0.0)
    rel_err = max((c.max_rel_err for c in checks.values()), default=0.0)
    bad = [(n, c) for n, c in checks.items() if not c.ok]
    if bad:
        name, c = bad[0]
        msg = f"output {name!r}, input draw {c.draw + 1} of {len(cases)} {cases[c.draw][0]}: {c.problem}"
    else:
        where = f" at {len(bindings)} bindings of the dynamic dims" if len(bindings) > 1 else ""
        msg = (f"{len(checks)} outputs match element by element on {len(cases)} input draws{where} "
               f"(max abs err {abs_err:.3g}, max rel err {rel_err:.3g})")
    return VerifyResult(not bad, abs_err, rel_err, checks, msg, d + 1)
