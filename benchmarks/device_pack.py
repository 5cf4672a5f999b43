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

``python -m relsat.benchmarks.device_pack pack OUT_DIR MODEL.onnx ...`` and
``python -m relsat.benchmarks.device_pack unpack IN_DIR OUT_DIR``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

KEY = "relsat.packed_float16"
F16_MAX = float(np.finfo(np.float16).max)


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


def pack(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The model with its float32 weights (initializers, Constant nodes) stored as float16 (in place), and
    how many values were beyond float16's range (clipped)."""
    names, clipped = [], 0
    for name, t in _weights(model):
        if t.data_type != TensorProto.FLOAT or t.data_location == TensorProto.EXTERNAL or t.ByteSize() < 1024:
            continue
        a = numpy_helper.to_array(t)
        clipped += int(np.count_nonzero(np.abs(a) > F16_MAX))
        t.CopyFrom(numpy_helper.from_array(np.clip(a, -F16_MAX, F16_MAX).astype(np.float16), t.name))
        names.append(name)
    kept = [p for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=KEY, value="\n".join(names))
    return model, clipped


def unpack(model: onnx.ModelProto) -> onnx.ModelProto:
    """The packed model with the initializers ``pack`` narrowed widened back to float32 (in place); a model
    that was not packed is returned as it is."""
    entry = next((p for p in model.metadata_props if p.key == KEY), None)
    if entry is None:
        return model
    names = set(entry.value.split("\n")) if entry.value else set()
    for name, t in _weights(model):
        if name in names and t.data_type == TensorProto.FLOAT16:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
    kept = [p for p in model.metadata_props if p.key != KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    return model


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="write each model, weights as float16, into OUT_DIR")
    p.add_argument("out", type=Path)
    p.add_argument("models", type=Path, nargs="+")
    u = sub.add_parser("unpack", help="widen every packed model of IN_DIR into OUT_DIR")
    u.add_argument("src", type=Path)
    u.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.cmd == "pack":
        for path in args.models:
            model, clipped = pack(onnx.load(str(path)))
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
