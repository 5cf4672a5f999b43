"""SHA-256 of tensor data: what names a graph's weights in a profile's cache key without serializing the graph.

A whole-graph profile is filed under a key over everything the graph runs as (:func:`relsat.extract.context`'s
``_graph_key``). Serializing each candidate graph to hash it cost ViT-B/16 1.1 s a graph (its 330 MB of
weights copied into one buffer) and hashing it 0.25 s more, four graphs a warm run, although the candidates of
one e-graph share nearly all their weights. So a weight enters the key as the digest of its data
(:func:`tensor_digest`), and the exporter, which writes the e-graph's arrays, hashes each array once a run
(:class:`Digests`, kept by the caller across the exports of one e-graph as ``folds`` is).

:func:`array_digest` and :func:`tensor_digest` agree: an array and the TensorProto ``numpy_helper.from_array``
makes of it have the same digest, so a graph's key does not depend on whether its exporter passed digests.
Only tensors over :data:`MIN_BYTES` whose data is ``raw_data`` are named by digest; the rest are hashed as
serialized (shapes, axes, scalars: small).
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
from onnx import helper

MIN_BYTES = 1024  # smaller tensors enter a key serialized whole
# dtypes whose TensorProto from ``numpy_helper.from_array`` holds ``arr.tobytes()`` as raw_data (little-endian)
_PLAIN = {np.dtype(t) for t in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                                "uint16", "uint32", "uint64", "bool")}


def _digest(data_type: int, dims, data) -> str:
    h = hashlib.sha256(f"{data_type}:{list(dims)}:".encode())
    h.update(data)
    return h.hexdigest()


def array_digest(arr: np.ndarray) -> str | None:
    """The digest of the TensorProto ``from_array`` writes of ``arr``, or None where it is not named by one
    (small, or a dtype whose data is not written as its bytes)."""
    if arr.dtype not in _PLAIN or not arr.dtype.isnative or arr.nbytes <= MIN_BYTES:
        return None
    data = np.ascontiguousarray(arr)
    return _digest(helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape, memoryview(data).cast("B"))


def tensor_digest(t: onnx.TensorProto) -> str | None:
    """The digest of an initializer's data, or None where it enters a key serialized (small, not raw_data)."""
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return None
    data = t.raw_data  # (a copy each time it is read: 0.7 s for 400 MB)
    return _digest(t.data_type, t.dims, data) if len(data) > MIN_BYTES else None


class Digests:
    """:func:`array_digest` of each array once while this memo lives: the arrays are kept with their digests,
    so an id is never taken by another array."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[np.ndarray, str | None]] = {}

    def of(self, arr: np.ndarray) -> str | None:
        if arr.nbytes <= MIN_BYTES:  # no digest; not kept (a Constant's value is a new array each export)
            return None
        hit = self._memo.get(id(arr))
        if hit is None:
            hit = self._memo[id(arr)] = (arr, array_digest(arr))
        return hit[1]
