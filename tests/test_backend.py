"""The backend object (relsat.relations.backend): --provider resolved once, and no module deciding on the string.

Issue 27, item 1: the provider used to be a string every leaf decided on again (10 functions in 6 files
answered "is CUDA here?"). Now ``resolve`` answers once and the object is passed down.
"""

import ast
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from relsat.relations.backend import CPU, PROVIDERS, ProviderMissing, available, resolve

ROOT = Path(__file__).resolve().parent.parent
# the modules allowed to name the provider values: the flag (options, cli) and the backend itself
NAMING = {"relations/backend.py", "driver/options.py", "driver/app/cli.py"}


def _relu():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_cpu_backend_runs_times_and_profiles_here():
    assert resolve("cpu") is CPU and CPU.here and not CPU.cuda
    assert CPU.timing == "cpu" and CPU.cost_backends == ("cpu",)
    assert CPU.whole_graph == "onnxruntime" and CPU.profiles_graphs and CPU.contrib
    assert CPU.metric(1) == "cpu" and CPU.metric(2) == "wall"
    assert CPU.clock(1) is time.thread_time and CPU.clock(4) is time.perf_counter
    sess = CPU.session(_relu(), threads=1)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
    assert "cpu" in available()


def test_cuda_backend_says_what_runs_it_here():
    cuda = resolve("cuda")
    assert cuda.cuda and cuda.metric(1) == "wall" and cuda.cost_backends == ("cuda", "cuda-torch")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert cuda.timing == "cuda" and cuda.whole_graph == "onnxruntime" and cuda.profiles_graphs
    elif cuda.torch_cuda:
        assert cuda.timing == "cuda-torch" and cuda.whole_graph == "torch" and not cuda.profiles_graphs
    else:  # no CUDA at all: nothing runs it, and a session says so in one line
        assert not cuda.here and cuda.timing is None and cuda.whole_graph is None and "cuda" not in available()
        assert "no CUDA here" in cuda.unavailable() and "\n" not in cuda.unavailable()
        with pytest.raises(ProviderMissing, match="provider 'cuda'"):
            cuda.session(_relu())


def test_an_unknown_provider_is_refused_with_the_flag():
    with pytest.raises(ValueError, match="--provider tpu: expected cpu or cuda"):
        resolve("tpu")
    assert PROVIDERS == ("cpu", "cuda")


def _decides_on_provider(path: Path) -> list[str]:
    """Comparisons of a name or attribute called ``provider`` with anything, in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                name = side.id if isinstance(side, ast.Name) else side.attr if isinstance(side, ast.Attribute) else None
                if name == "provider":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_module_decides_on_the_provider_string():
    """Only the backend (and the flag's own validation) compares the provider name; everything else asks
    the Backend object."""
    bad = []
    for folder in ("relations", "programs", "extract", "driver", "benchmarks"):
        for f in sorted((ROOT / folder).rglob("*.py")):
            if str(f.relative_to(ROOT)) not in NAMING:
                bad += _decides_on_provider(f)
    assert not bad, bad


def test_the_provider_check_finds_a_decision(tmp_path, monkeypatch):
    monkeypatch.setattr("test_backend.ROOT", tmp_path)
    f = tmp_path / "leaf.py"
    f.write_text("def f(provider, o):\n    if provider != 'cuda':\n        return 1\n    return o.provider in ('cpu',)\n")
    assert _decides_on_provider(f) == ["leaf.py:2", "leaf.py:4"]
