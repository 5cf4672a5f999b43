"""Corpus models carried to a device machine with their float32 weights stored as float16, and back.

The device machine of this workplace (``benchmarks/device_gpu.sh``) has no network and takes at most 64 MiB
of files with the repository, 38 MB of which are the wheels it lacks: the corpus models it runs travel here.
``pack`` writes each model with every float32 weight of 1 KB or more (initializers and Constant nodes'
values) stored as float16 (half the bytes) and their names in the model's ``metadata_props``
(``relsat.packed_float16``); ``unpack``
widens exactly those back to float32. The graph, its shapes and its run-time dtypes are the model's own;
each weight value is rounded to float16 (relative error at most 2**-11; zeros and ones exact, values
beyond float16's range clipped to +-65504, where any is, ``pack`` says so). A GPU latency does not
depend on the weights' values; relsat's value predicates (``zeros``, ``ones``) see the same constants.

``pack --redraw`` carries the large random-like weights as no bytes at all, so that the whole corpus fits
beside the wheels: a float32 weight of ``REDRAW_MIN`` values or more, all finite, with no exact zero and
more than ``FEW`` distinct values (so not a mask, a constant fill or a weight with zero blocks) is stored
as its shape alone, with its mean, standard deviation, minimum and maximum and the places of its exact zeros (at most
``ZEROS_MAX`` of its values: an embedding's padding row) in ``metadata_props`` (``relsat.redrawn``);
``unpack`` draws it again from a normal distribution of that mean and deviation, clipped to that range,
seeded by its name (the same on every machine), with those zeros. The graph, its shapes, its
run-time dtypes and every small, masked or structured constant are the model's own; the big weights'
values are not (and the model's outputs are not its trained outputs), which no latency depends on. The
original and relsat's model are both run from the unpacked file, so the verification compares like with
like.

``python -m relsat.benchmarks.device_pack pack OUT_DIR MODEL.onnx ...`` and
``python -m relsat.benchmarks.device_pack unpack IN_DIR OUT_DIR``.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

KEY = "relsat.packed_float16"
KEY_REDRAWN = "relsat.redrawn"
F16_MAX = float(np.finfo(np.float16).max)
REDRAW_MIN = 4096  # values: a weight this big, random-like, travels as its shape and moments (--redraw)
FEW = 16  # distinct values at most in a weight kept exact although big (masks, fills)
ZEROS_MAX = 0.001  # share of exact zeros above which a big weight is kept (zero blocks); below, their places travel


def _weights(model: onnx.ModelProto):
    """(name, TensorProto) of every weight: the initializers and the ``value`` of Constant nodes (Paddle's
    exports keep their weights there), the latter named after the node's output."""
    for t in model.graph.initializer:
        yield t.name, t
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            for a in n.attribute:
                if a.name == "value" and a.HasField("t"):
                    yield n.output[0], a.t


def _zero_runs(a: np.ndarray) -> list[tuple[int, int]] | None:
    """The runs (start, length) of exact zeros in ``a`` read flat, or None where they are more than
    ``ZEROS_MAX`` of its values (zero blocks: the weight is kept)."""
    at = np.flatnonzero(a.ravel() == 0)
    if at.size > a.size * ZEROS_MAX:
        return None
    breaks = np.flatnonzero(np.diff(at) != 1) + 1
    return [(int(r[0]), int(r.size)) for r in np.split(at, breaks) if r.size]


def _redrawable(a: np.ndarray) -> list[tuple[int, int]] | None:
    """Where a float32 weight may travel as its moments (big, finite, few exact zeros, many values): the runs of
    its zeros (``_zero_runs``); else None."""
    if a.size < REDRAW_MIN or not np.all(np.isfinite(a)):
        return None
    zeros = _zero_runs(a)
    return zeros if zeros is not None and np.unique(a).size > FEW else None


def _draw(name: str, shape: tuple, moments: tuple, zeros: list[tuple[int, int]]) -> np.ndarray:
    mean, std, lo, hi = moments
    a = np.random.default_rng(zlib.crc32(name.encode())).normal(mean, std, size=shape)
    a = np.clip(a, lo, hi).astype(np.float32)
    flat = a.reshape(-1)
    for start, length in zeros:
        flat[start:start + length] = 0
    return a


def _pop_meta(model: onnx.ModelProto, key: str) -> str | None:
    """The value of ``metadata_props`` entry ``key``, which is removed (None: there was none)."""
    entry = next((p.value for p in model.metadata_props if p.key == key), None)
    if entry is not None:
        kept = [p for p in model.metadata_props if p.key != key]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
    return entry


def _set_meta(model: onnx.ModelProto, key: str, value: str) -> None:
    _pop_meta(model, key)
    model.metadata_props.add(key=key, value=value)


def pack(model: onnx.ModelProto, redraw: bool = False) -> tuple[onnx.ModelProto, int]:
    """The model with its float32 weights (initializers, Constant nodes) stored as float16 (in place), and
    how many values were beyond float16's range (clipped). With ``redraw``, the big random-like ones are
    stored as their shape and moments instead (module docstring)."""
    names, redrawn, clipped = [], [], 0
    for name, t in _weights(model):
        if t.data_type != TensorProto.FLOAT or t.data_location == TensorProto.EXTERNAL or t.ByteSize() < 1024:
            continue
        a = numpy_helper.to_array(t)
        runs = _redrawable(a) if redraw else None
        if runs is not None:
            v = a[a != 0]  # the moments of the values drawn again, not of the zeros kept in place
            moments = (float(v.mean()), float(v.std()), float(v.min()), float(v.max()))
            zeros = ",".join(f"{start}+{length}" for start, length in runs)
            redrawn.append("\t".join([name, *map(repr, moments), zeros]))
            del t.float_data[:]
            t.raw_data = b""
            continue
        clipped += int(np.count_nonzero(np.abs(a) > F16_MAX))
        t.CopyFrom(numpy_helper.from_array(np.clip(a, -F16_MAX, F16_MAX).astype(np.float16), t.name))
        names.append(name)
    _set_meta(model, KEY, "\n".join(names))
    if redrawn:
        _set_meta(model, KEY_REDRAWN, "\n".join(redrawn))
    return model, clipped


def unpack(model: onnx.ModelProto) -> onnx.ModelProto:
    """The packed model with the initializers ``pack`` narrowed widened back to float32 (in place); a model
    that was not packed is returned as it is."""
    value = _pop_meta(model, KEY)
    if value is None:
        return model
    names = set(value.split("\n")) if value else set()
    redrawn = {}
    for line in filter(None, (_pop_meta(model, KEY_REDRAWN) or "").split("\n")):
        name, *moments, zeros = line.split("\t")
        runs = [tuple(map(int, run.split("+"))) for run in filter(None, zeros.split(","))]
        redrawn[name] = (tuple(map(float, moments)), runs)
    for name, t in _weights(model):
        if name in names and t.data_type == TensorProto.FLOAT16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
        elif name in redrawn and t.data_type == TensorProto.FLOAT:
            t.raw_data = _draw(name, tuple(t.dims), *redrawn[name]).tobytes()
    return model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="write each model, weights as float16, into OUT_DIR")
    p.add_argument("out", type=Path)
    p.add_argument("models", type=Path, nargs="+")
    p.add_argument("--redraw", action="store_true", help="big random-like weights as their moments alone")
    u = sub.add_parser("unpack", help="widen every packed model of IN_DIR into OUT_DIR")
    u.add_argument("src", type=Path)
    u.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cmd == "pack":
        for path in args.models:
            model, clipped = pack(onnx.load(str(path)), redraw=args.redraw)
            dst = args.out / path.name
            onnx.save(model, str(dst))
            note = f", {clipped} values clipped to float16's range" if clipped else ""
            print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB -> {dst.stat().st_size / 1e6:.1f} MB{note}")
    else:
        for path in sorted(args.src.glob("*.onnx")):
            onnx.save(unpack(onnx.load(str(path))), str(args.out / path.name))
            print(f"{path.name}: unpacked")


if __name__ == "__main__":
    sys.exit(main())
