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
The original's run without optimizations is made only for a draw where an output fails the
comparison without that floor: a wider floor passes whatever a narrower one passes, so the verdict is
the same, and a draw that passes is reported against the narrower floor (ViT-B/16 against a candidate that
matches, six draws at two bindings, twice each: 14.5 and 12.8 s before, 11.1 and 8.7 s without those runs); its
session is made then too (GPT-2: 1.5 s a session). A caller that holds sessions of both models already (the
measured choice, from its last timing) passes them in (``optimized``, ``reference``), and none is made.
Integer, boolean and string elements must be equal (strings compared as text,
never as numbers); NaN must match NaN and an infinity the same infinity.

An original that ONNX Runtime cannot run (a model below opset 7, which relsat
upgrades) is run under ONNX's reference evaluator instead
(``runtime.ReferenceSession``), without the noise floor of the second run.  A failure names the output, the input draw, the worst
element's index and both values.

What was checked stays in the result (``VerifyResult.as_report()``, the report's ``verification``): the
tolerance as used, the draws, bindings and input sets compared, each graph input's distribution as the
feeds drew it (``describe_inputs``) and the worst element over every output and draw: the one nearest
to, or furthest past, its tolerance (largest ``|got - ref| / tolerance``), with its output, index, input
draw, both values, and its absolute and relative (``|got - ref| / |ref|``) error.
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
    ratio: float = 0.0  # |got - ref| / tolerance at the worst element (above 1: it fails; inf: compared exactly)
    abs_err: float = 0.0  # |got - ref| at the worst element
    rel_err: float = 0.0  # |got - ref| / |ref| at the worst element (0 when equal, inf when ref is 0 and got not)
    got: object = None  # the optimized model's value there (a Python scalar), None for a shape mismatch
    ref: object = None  # the original's value there
    floor: float = 0.0  # the rounding floor used for this output (module docstring)


@dataclass
class VerifyResult:
    ok: bool
    max_abs_err: float
    max_rel_err: float
    per_output: dict[str, OutputCheck] = field(default_factory=dict)
    message: str = ""
    draws: int = 0  # input draws compared (random draws at every binding, then the user's input sets)
    rtol: float = RTOL  # the tolerance as used
    atol: float = ATOL
    noise_floor: bool = True  # the floor includes ONNX Runtime's own optimization difference (False: the
    # original ran under ONNX's reference evaluator, one run only, or its session without optimizations could not
    # be made)
    bindings: int = 0  # bindings of the dynamic dims whose random draws were compared
    random_draws: list = field(default_factory=list)  # (seed, scale) of the random draws made at each binding
    input_sets: int = 0  # the user's input sets compared
    inputs: dict = field(default_factory=dict)  # each graph input as drawn (``describe_inputs``)
    worst: dict | None = None  # the worst element over every output and draw; None: nothing compared

    def tolerance(self) -> dict:
        """The tolerance as used: per element ``|got - ref| <= atol + rtol * |ref| + floor`` (module docstring)."""
        return {"rtol": self.rtol, "atol": self.atol, "floor_ulps": FLOOR_ULPS,
                "noise_factor": NOISE_FACTOR if self.noise_floor else None,
                "rule": "|got - ref| <= atol + rtol * |ref| + floor per floating-point element; floor: the larger "
                        "of floor_ulps units in the last place of the output's largest |ref| and noise_factor "
                        "times how far ONNX Runtime's own graph optimizations move the original (none under "
                        "the reference evaluator); integer, boolean and string elements equal"}

    def as_report(self) -> dict:
        """The report's ``verification`` entry, JSON-ready (the README's Safety section lists the fields)."""
        return {"ok": self.ok, "max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err,
                "message": self.message, "draws": self.draws, "bindings": self.bindings,
                "random_draws": [{"seed": int(s), "scale": float(c)} for s, c in self.random_draws],
                "input_sets": self.input_sets, "tolerance": self.tolerance(), "inputs": self.inputs,
                "worst": self.worst}


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


def _scalar(v):
    """An element as a JSON-ready Python value (numbers as numbers, anything else as text)."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    return v if isinstance(v, (bool, int, float, str)) else str(v)


def _element_rel(diff: float, ref: float) -> float:
    """|got - ref| / |ref| at one element: 0 when equal, inf when ref is 0 and got is not."""
    if diff == 0:
        return 0.0
    return diff / abs(ref) if ref != 0 and np.isfinite(ref) else float("inf")


def compare_output(ref, got, *, rtol: float = RTOL, atol: float = ATOL, noise=None) -> OutputCheck:
    """Element-by-element comparison of one output; ``noise`` is the original's own output under
    another ONNX Runtime optimization level (its distance from ``ref`` widens the floor).  The worst
    element is the one nearest to, or furthest past, its tolerance; the check keeps its index, values,
    absolute and relative error and ``ratio`` (its error over its tolerance)."""
    ref, got = np.asarray(ref), np.asarray(got)
    inf = float("inf")
    if ref.shape != got.shape:
        return OutputCheck(False, inf, inf, 0.0, f"shape {list(got.shape)}, the original's {list(ref.shape)}",
                           ratio=inf, abs_err=inf, rel_err=inf)
    if ref.size == 0:
        return OutputCheck(True, 0.0, 0.0, 0.0)
    exact = ref.dtype == object or got.dtype == object or ref.dtype.kind in "biuSU" or got.dtype.kind in "biuSU"
    if exact:
        if ref.dtype == object or got.dtype == object:
            differ = np.asarray(ref != got, dtype=bool).reshape(ref.shape)
        else:
            differ = ref != got
        if not differ.any():
            first = (0,) * ref.ndim
            return OutputCheck(True, 0.0, 0.0, 0.0, "", first, got=_scalar(got[first]), ref=_scalar(ref[first]))
        idx = np.unravel_index(int(np.argmax(differ)), ref.shape)
        n = int(differ.sum())
        numeric = ref.dtype.kind in "biuf" and got.dtype.kind in "biuf"
        err = float(abs(float(got[idx]) - float(ref[idx]))) if numeric else inf
        return OutputCheck(False, err, inf, 0.0,
                           f"{n} of {ref.size} elements differ (compared exactly); element {_fmt_index(idx)} "
                           f"is {got[idx]!r}, the original's {ref[idx]!r}", tuple(int(i) for i in idx),
                           ratio=inf, abs_err=err, rel_err=_element_rel(err, float(ref[idx])) if numeric else inf,
                           got=_scalar(got[idx]), ref=_scalar(ref[idx]))
    a, b = ref.astype(np.float64), got.astype(np.float64)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    inf_mismatch = (np.isinf(a) | np.isinf(b)) & (a != b) & ~nan_a & ~nan_b
    special = (nan_a != nan_b) | inf_mismatch
    if special.any():
        idx = np.unravel_index(int(np.argmax(special)), a.shape)
        return OutputCheck(False, inf, inf, 0.0,
                           f"element {_fmt_index(idx)} is {b[idx]:g}, the original's {a[idx]:g} "
                           f"({int(special.sum())} elements with NaN or infinity on one side only)",
                           tuple(int(i) for i in idx), ratio=inf, abs_err=inf, rel_err=inf,
                           got=float(b[idx]), ref=float(a[idx]))
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
    rel = err / mag if mag > 0 else (0.0 if err == 0 else inf)
    ok = bool(ratio.flat[k] <= 1.0)
    problem = "" if ok else (
        f"{int((ratio > 1).sum())} of {a.size} elements differ; worst element {_fmt_index(idx)} is "
        f"{b[idx]:.6g}, the original's {a[idx]:.6g} (|diff| {diff[idx]:.3g} > tolerance {tol[idx]:.3g} = "
        f"atol {atol:g} + rtol {rtol:g} x |ref| + rounding floor {floor:.3g})")
    return OutputCheck(ok, err, rel, float(tol[idx]), problem, tuple(int(i) for i in idx),
                       ratio=float(ratio.flat[k]), abs_err=float(diff[idx]),
                       rel_err=_element_rel(float(diff[idx]), float(a[idx])), got=float(b[idx]), ref=float(a[idx]),
                       floor=float(floor))


def _default_distribution(dtype: np.dtype) -> dict:
    """What ``relations.runtime.random_array`` draws for an integer or boolean input without a role."""
    if dtype == np.bool_:
        return {"distribution": "bernoulli", "p": 0.5}
    return {"distribution": "uniform integers", "low": runtime.INT_RANGE[0], "high": runtime.INT_RANGE[1]}


def _distribution(name: str, shape, dtype: np.dtype, role, roles_known: bool, scales: list) -> dict:
    """The distribution one input's random draws come from, as ``feeds.draw`` (``roles_known``) or
    ``runtime.random_feeds`` (no model to find roles in) draws it; integer ranges are ``low <= v < high``;
    ``constant``'s value is filled in from the draw (``describe_inputs``)."""
    if dtype.kind in "fV":  # V: ml_dtypes such as bfloat16
        return {"distribution": "normal", "mean": 0.0, "std": [float(s) for s in scales]}
    if dtype.kind in "OUS":
        return {"distribution": "words", "letters": "aBcDeFgH xYz", "length": [1, 5]}
    if not roles_known:
        if runtime.is_mask_input(name, dtype):
            return {"distribution": "constant", "value": 1, "why": "named like an attention mask: ones"}
        return _default_distribution(dtype)
    kind = role.kind if role is not None else feeds.DEFAULT
    why = {"why": role.why} if role is not None and role.why else {}
    if kind == feeds.DEFAULT:
        return {**_default_distribution(dtype), **why}
    if kind == feeds.RANGE:
        low, high = feeds.range_bounds(role, dtype)
        if high - low == 1:
            return {"distribution": "constant", "value": bool(low) if dtype == np.bool_ else int(low), **why}
        if dtype == np.bool_:
            return {"distribution": "bernoulli", "p": 0.5, **why}
        return {"distribution": "uniform integers", "low": int(low), "high": int(high), **why}
    if len(shape) > 1 or dtype == np.bool_:
        return {**_default_distribution(dtype), **why}
    return {"distribution": "constant", "role": kind, "value": None, **why}  # split sizes, axes, a Reshape target


def _seen(into: dict, value) -> None:
    """Note one drawn array in ``into`` (``describe_inputs``'s per-binding entry): the first array kept (its
    shape, dtype and, for a constant, its value), the smallest and largest number drawn updated."""
    a = np.asarray(value)
    if "first" not in into:
        into["first"] = a
    if a.size and a.dtype.kind in "biufV":
        lo, hi = np.min(a), np.max(a)
        into["min"] = lo if "min" not in into else min(into["min"], lo)
        into["max"] = hi if "max" not in into else max(into["max"], hi)


def describe_inputs(drawn: list[dict], roles: list, draws) -> dict:
    """Each graph input as the random draws fed it: ``drawn``, one dict per binding compared, input name ->
    what ``_seen`` noted of its arrays there; ``roles``, the roles per binding (None: no model to find them
    in); ``draws``, the (seed, scale) pairs.  Per input: ``dtype``, ``shapes`` (one per binding), the
    distribution (``_distribution``; ``per_binding``, a list, when it differs between bindings), and the
    smallest and largest value drawn (``min``, ``max``; numbers only)."""
    scales = [scale for _, scale in draws]
    out: dict[str, dict] = {}
    for name in dict.fromkeys(n for at in drawn for n in at):
        seen = [(b, at[name]) for b, at in enumerate(drawn) if name in at]
        first = seen[0][1]["first"]
        entry = {"dtype": str(first.dtype), "shapes": [list(s["first"].shape) for _, s in seen]}
        dists = []
        for b, s in seen:
            a, r = s["first"], roles[b] if b < len(roles) else None
            dist = _distribution(name, a.shape, a.dtype, (r or {}).get(name), r is not None, scales)
            if dist["distribution"] == "constant" and dist.get("value") is None:
                dist["value"] = a.tolist()
            dists.append(dist)
        if all(d == dists[0] for d in dists):
            entry.update(dists[0])
        else:
            entry.update(distribution="per binding", per_binding=dists)
        lows, highs = [s["min"] for _, s in seen if "min" in s], [s["max"] for _, s in seen if "max" in s]
        if lows:
            cast = bool if first.dtype == np.bool_ else float if first.dtype.kind in "fV" else int
            entry["min"], entry["max"] = cast(min(lows)), cast(max(highs))
        out[name] = entry
    return out


def _worst(check: OutputCheck, output: str, draw: int, label: str) -> dict:
    """The report's worst element: ``check``'s, for ``output`` on input draw ``draw`` (0-based)."""
    return {"output": output, "index": [int(i) for i in check.worst], "draw": draw + 1, "draw_label": label,
            "abs_err": check.abs_err, "rel_err": check.rel_err, "got": check.got, "expected": check.ref,
            "tolerance": check.tolerance, "floor": check.floor, "tolerance_used": check.ratio}


def verify(original, optimized, *, rtol: float = RTOL, atol: float = ATOL,
           input_shapes: dict[str, list[int]] | None = None, draws=INPUT_DRAWS, bindings=None,
           input_sets=(), reference=None) -> VerifyResult:
    """Run ``original`` and ``optimized`` (models or paths; ``optimized`` may also be an ONNX Runtime
    session already made for it, and ``reference`` one made for ``original`` at level ALL) under ONNX Runtime
    on the same random inputs (every ``(seed, scale)`` of ``draws`` at every binding of ``bindings``, a list of input shapes dicts, default
    ``[input_shapes]``) and on the user's ``input_sets`` (feeds dicts), and compare every output of
    the original, element by element (module docstring).  The result records what was compared: the
    tolerance, the draws, bindings and input sets, the inputs' distributions and the worst element."""
    bindings = list(bindings or [input_shapes])
    source = _model_of(original)
    cases = []  # (label, feeds maker, binding index or None for a user's set)
    roles_at = []
    for bi, b in enumerate(bindings):
        roles = feeds.input_roles(source, b) if source is not None else None
        roles_at.append(roles)
        at = f" at {_fmt_binding(b)}" if len(bindings) > 1 else ""
        for seed, scale in draws:
            cases.append((f"(seed {seed}, scale {scale:g}){at}",
                          lambda sessions, b=b, seed=seed, scale=scale, roles=roles: random_inputs(
                              sessions, seed=seed, input_shapes=b, scale=scale, roles=roles), bi))
    for k, given in enumerate(input_sets):
        cases.append((f"(the user's input set {k + 1})", lambda sessions, given=given: dict(given), None))
    label = str(original) if not isinstance(original, onnx.ModelProto) else "the original model"
    try:
        ref_sess = reference if reference is not None else runtime.session(original)
        evaluator = False
    except Exception as e:
        ref_sess = _reference(source)  # an old model ONNX Runtime cannot run: the spec's evaluator
        if ref_sess is None:
            raise RelsatError(f"{label}: ONNX Runtime cannot load the model: {error_line(e)}") from None
        evaluator = True
    plain = []  # the original's session without graph optimizations, made at the first draw that needs it (None:
    # it cannot be made, and the draw is judged without the floor it gives)

    def plain_sess():
        if not plain:
            try:
                plain.append(runtime.session(original, optimize=False))
            except Exception:
                plain.append(None)
        return plain[0]
    drawn: list[dict] = []  # per binding compared: input name -> what _seen noted of its random draws
    sets, worst = 0, None

    def result(ok, abs_err, rel_err, checks, msg, n) -> VerifyResult:
        return VerifyResult(
            ok, abs_err, rel_err, checks, msg, n, rtol=rtol, atol=atol, noise_floor=not evaluator and plain != [None],
            bindings=len(drawn), random_draws=[(int(s), float(c)) for s, c in draws], input_sets=sets,
            inputs=describe_inputs(drawn, roles_at, draws), worst=_worst(*worst) if worst is not None else None)

    try:
        opt_sess = optimized if hasattr(optimized, "run") else runtime.session(optimized)
    except Exception as e:
        return result(False, float("inf"), float("inf"), {},
                      f"ONNX Runtime cannot load the optimized model: {error_line(e)}", 0)
    opt_names = [o.name for o in opt_sess.get_outputs()]
    names = [o.name for o in ref_sess.get_outputs()]
    missing = [n for n in names if n not in opt_names]
    if missing:
        return result(False, float("inf"), float("inf"), {}, f"the optimized model has no output {missing[0]!r}", 0)
    checks: dict[str, OutputCheck] = {}
    d = -1
    for d, (what, make, bi) in enumerate(cases):
        fed = make([ref_sess, opt_sess])

        def original_run(sess):
            try:
                return sess.run(None, fed)
            except Exception as e:
                raise RelsatError(f"{label}: ONNX Runtime cannot run the model on input draw {what}: "
                                  f"{error_line(e)}") from None

        ref = original_run(ref_sess)
        if bi is None:
            sets += 1
        else:
            while len(drawn) <= bi:
                drawn.append({})
            for name, value in fed.items():
                _seen(drawn[bi].setdefault(name, {}), value)
        opt_feeds = {i.name: fed[i.name] for i in opt_sess.get_inputs() if i.name in fed}
        try:
            got = dict(zip(opt_names, opt_sess.run(None, opt_feeds)))
        except Exception as e:
            return result(False, float("inf"), float("inf"), checks,
                          f"ONNX Runtime cannot run the optimized model: {error_line(e)}", d)
        compared = [compare_output(r, got[n], rtol=rtol, atol=atol) for n, r in zip(names, ref)]
        if not evaluator and not all(c.ok for c in compared) and (unopt := plain_sess()) is not None:  # the
            # noise floor, where it can matter
            unoptimized = original_run(unopt)
            compared = [compare_output(r, got[n], rtol=rtol, atol=atol, noise=p)
                        for n, r, p in zip(names, ref, unoptimized)]
        for n, c in zip(names, compared):
            c.draw = d
            if worst is None or c.ratio > worst[0].ratio:
                worst = (c, n, d, what)
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
    return result(not bad, abs_err, rel_err, checks, msg, d + 1)
