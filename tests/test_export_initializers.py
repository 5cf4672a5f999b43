"""The export writes initializers in place (driver/boundary/onnx_export.py: _add_initializers)."""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8",
                                   "uint16", "uint32", "uint64", "bool"])
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 3, 4)])
def test_an_initializer_written_in_place_is_what_from_array_writes(dtype, shape):
    """The export writes plain numeric weights into the graph directly: the same TensorProto, to the byte, as
    numpy_helper.from_array (which it used before), for every dtype it does so, C- and Fortran-ordered."""
    from relsat.driver.boundary.onnx_export import _add_initializers

    rng = np.random.default_rng(0)
    arr = (rng.standard_normal(shape) * 100).astype(dtype)
    for a in (arr, np.asfortranarray(arr)):
        graph = onnx.GraphProto()
        _add_initializers(graph, [("w", a), numpy_helper.from_array(arr, "kept")])
        assert graph.initializer[0].SerializeToString() == numpy_helper.from_array(a, "w").SerializeToString()
        assert graph.initializer[1].name == "kept"
        np.testing.assert_array_equal(numpy_helper.to_array(graph.initializer[0]), a)
