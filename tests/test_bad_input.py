"""Bad model files and bad input-shape overrides give one-line RelsatErrors and leave the files alone."""

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from relsat.driver.app.optimize import optimize
from relsat.driver.errors import RelsatError
from relsat.driver.boundary.onnx_import import check_ort_loadable, import_model, load_model

F = TensorProto.FLOAT


def small_model(opset=17, x_shape=(2, 8)) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((8, 4), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, list(x_shape))],
                              [helper.make_tensor_value_info("y", F, [x_shape[0], 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def load_error(path, *names) -> str:
    """The message of the RelsatError that load_model raises; the file is unchanged."""
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(RelsatError) as info:
        load_model(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    for name in names:
        assert name in msg
    assert (path.read_bytes() if path.is_file() else None) == before
    return msg


def test_missing_file(tmp_path):
    assert "no such file" in load_error(tmp_path / "absent.onnx")


def test_directory(tmp_path):
    assert "not a file" in load_error(tmp_path)


def test_truncated_file(tmp_path):
    path = tmp_path / "cut.onnx"
    data = small_model().SerializeToString()
    path.write_bytes(data[: len(data) // 2])
    assert "not an ONNX model" in load_error(path)


def test_text_file(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a model\n")
    assert "not an ONNX model" in load_error(path)


@pytest.mark.parametrize("location", ["../outside.bin", "/etc/passwd"])
def test_external_data_outside_the_folder(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "outside.bin").write_bytes(np.ones(32, dtype=np.float32).tobytes())
    model = small_model()
    onnx.external_data_helper.set_external_data(model.graph.initializer[0], location=location)
    model.graph.initializer[0].ClearField("raw_data")
    model.graph.initializer[0].data_location = TensorProto.EXTERNAL
    path = folder / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert "outside the model's folder" in load_error(path, "'w'", location)


def test_model_that_fails_the_checker(tmp_path):
    model = small_model()
    model.graph.node[0].input[1] = "undefined"
    path = tmp_path / "broken.onnx"
    path.write_bytes(model.SerializeToString())
    msg = load_error(path)
    assert "ONNX checker" in msg and "'undefined'" in msg
    assert msg.endswith("is not output of any previous nodes.")  # the whole reason, not cut at "of node:"


def test_model_onnx_runtime_refuses(tmp_path):
    model = small_model()
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((8, 4), dtype=np.int64), "w"))
    path = tmp_path / "mismatch.onnx"  # MatMul of float and int64: the checker lets it through
    path.write_bytes(model.SerializeToString())
    assert "ONNX Runtime cannot load" in load_error(path)
    with pytest.raises(RelsatError, match="ONNX Runtime cannot load"):
        check_ort_loadable(model)
    # relsat optimize checks it after loading, once the model's sessions are shared: the same one line, naming the file
    with pytest.raises(RelsatError, match="ONNX Runtime cannot load") as info:
        optimize(path, cost_model="analytic", measure=False)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
    assert path.read_bytes() == model.SerializeToString()


def test_model_with_an_op_without_kernel(tmp_path):
    graph = helper.make_graph([helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")], "g",
                              [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("y", F, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
                              ir_version=8)
    path = tmp_path / "custom.onnx"
    path.write_bytes(model.SerializeToString())
    assert "ONNX Runtime cannot load" in load_error(path)
    # relsat optimize imports it (an opaque node) while ONNX Runtime's check runs beside the import; the
    # check's refusal is the error, the same one line, and no check is left running
    db = tmp_path / "new" / "dir" / "e.duckdb"
    with pytest.raises(RelsatError, match="ONNX Runtime cannot load") as info:
        optimize(path, cost_model="analytic", measure=False, db=db)
    assert str(info.value).startswith(f"{path}: ") and "\n" not in str(info.value)
    assert not [t for t in threading.enumerate() if t.name.startswith("relsat-load-check")]
    assert not (tmp_path / "new").exists()  # the folders made for the e-graph go with it


def test_input_shape_override_naming_no_input():
    with pytest.raises(RelsatError) as info:
        import_model(small_model(), input_shapes={"images": [1, 8]})
    msg = str(info.value)
    assert "\n" not in msg and "'images'" in msg and "inputs: x" in msg


def test_input_shape_override_that_does_not_fit():
    with pytest.raises(RelsatError, match="does not fit"):
        import_model(small_model(), input_shapes={"x": [2, 9]})


def test_dynamic_dim_without_override_when_fixing_shapes():
    with pytest.raises(RelsatError) as info:
        import_model(small_model(x_shape=("batch", "features")), fix_shapes=True)
    msg = str(info.value)
    assert "\n" not in msg and "'x'" in msg and "dim 1" in msg and "--input-shape x=" in msg


def test_unsupported_opset():
    with pytest.raises(RelsatError, match="opset 27"):
        import_model(small_model(opset=27))


def test_a_kept_input_model_is_written_as_the_input_file_byte_for_byte(tmp_path):
    """A model file read whole is never serialized again: its bytes are the run's serialization of it (sessions,
    the comparison's key, the written model when it is kept). A file whose bytes are not protobuf's own
    serialization of what they parse to (a field given twice: the last one counts) is written back as it is."""
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", F, [2, 8])],
                              [helper.make_tensor_value_info("y", F, [2, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    blob = model.SerializeToString() + b"\x08\x0a"  # ir_version again, 10: the parsed model's, not 9
    parsed = onnx.load_model_from_string(blob)
    assert parsed.ir_version == 10 and parsed.SerializeToString() != blob
    path, out = tmp_path / "twice.onnx", tmp_path / "out.onnx"
    path.write_bytes(blob)
    res = optimize(path, output=out, cost_model="analytic", measure=False)
    assert res.report["written"] == "original"
    assert out.read_bytes() == blob and path.read_bytes() == blob
