"""The real-model corpus (relsat.benchmarks.corpus): its table, its checks, and building torch models."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from relsat.benchmarks import corpus as c

REPO = Path(__file__).resolve().parents[1]


def test_table():
    names = [e.name for e in c.entries("issue11")]
    assert len(names) == len(set(names)) == 15
    assert c.entries() is c.CORPUS
    assert {e.group for e in c.entries("issue11")} == {"transformers", "timm", "torchvision", "rapidocr", "silero"}
    for e in c.CORPUS:
        assert callable(e.builder) and e.how and e.outputs
        assert set(e.needs) <= set(c.available())
        named = {d for _, dims in e.dims for d in dims if isinstance(d, str)}
        assert named, f"{e.name} declares no dynamic dim"
        assert all(isinstance(d, (int, str)) for _, dims in e.dims for d in dims)
        assert len(e.bindings) == 2 and e.bindings[0] != e.bindings[1]
        for b in e.bindings:
            assert named <= set(b), f"{e.name}: binding {b} leaves dims unbound"
        assert c.entry(e.name) is e
    text = [e for e in c.entries("issue11") if e.group == "transformers" and e.inputs[0].name == "input_ids"]
    assert {e.name for e in text} == {"bert_base", "distilbert", "gpt2"}
    for e in text:
        assert e.dims == [("input_ids", ("batch", "sequence")), ("attention_mask", ("batch", "sequence"))]
        assert all(i.dtype == "int64" for i in e.inputs)
    with pytest.raises(KeyError):
        c.entry("nope")


def test_cache_outside_repository():
    cache = c.default_cache().resolve()
    assert cache.name == "corpus" and REPO not in cache.parents
    assert c.path("gpt2", "/x") == Path("/x/gpt2.onnx")
    assert all(isinstance(v, bool) for v in c.available().values())


def test_cli_list(capsys):
    assert c.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(c.CORPUS) and lines[0].startswith("bert_base")
    assert "input_ids[batch,sequence]" in lines[0]


def _tiny(tmp_path, batch_dim):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "t",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch_dim, 4])])
    p = tmp_path / f"tiny_{batch_dim}.onnx"
    onnx.save(helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]), p)
    return p


def test_check_needs_dynamic_dims(tmp_path):
    e = c.Entry("tiny", "timm", "a Relu", (c.Input("x", ("batch", 4)),), {"y": ("batch", 4)},
                ({"batch": 1}, {"batch": 3}), builder=lambda: None)
    c.check(e, _tiny(tmp_path, "batch"))
    assert c.declared_inputs(_tiny(tmp_path, "batch")) == [("x", ("batch", 4))]
    with pytest.raises(ValueError, match="declared dims"):
        c.check(e, _tiny(tmp_path, 1))  # batch static in the file
    with pytest.raises(ValueError, match="declared dims"):
        c.check(e, _tiny(tmp_path, "n"))  # dynamic but named otherwise


def test_failure_is_reported_and_others_go_on(tmp_path, monkeypatch):
    monkeypatch.setattr(c, "available", lambda: dict.fromkeys(("torch", "torchvision", "transformers", "timm"), False))
    lines = []
    assert c.build(["mobilenetv3_large", "distilbert"], tmp_path, log=lines.append) == {}
    assert len(lines) == 2 and lines[0].startswith("mobilenetv3_large: FAILED") and "needs torch" in lines[0]
    assert list(tmp_path.iterdir()) == []


def _runs_at(path, feeds_list):
    import onnxruntime as ort

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [s.run(None, feeds)[0].shape for feeds in feeds_list]


@pytest.mark.slow
def test_build_mobilenetv3(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("timm")
    built = c.build(["mobilenetv3_large"], tmp_path)
    p = built["mobilenetv3_large"]
    assert p == tmp_path / "mobilenetv3_large.onnx" and sorted(tmp_path.iterdir()) == [p]
    m = onnx.load(str(p))
    assert m.ir_version == 10 and m.opset_import[0].version == 17
    assert c.declared_inputs(p) == [("input", ("batch", 3, 224, 224))]
    assert [d.dim_param or d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == ["batch", 1000]
    rng = np.random.default_rng(0)
    shapes = _runs_at(p, [{"input": rng.standard_normal((b, 3, 224, 224), dtype=np.float32)} for b in (1, 3)])
    assert shapes == [(1, 1000), (3, 1000)]
    mtime = p.stat().st_mtime_ns
    assert c.build(["mobilenetv3_large"], tmp_path) == built and p.stat().st_mtime_ns == mtime  # cached


@pytest.mark.slow
def test_build_distilbert(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    p = c.build(["distilbert"], tmp_path)["distilbert"]
    assert c.declared_inputs(p) == [("input_ids", ("batch", "sequence")), ("attention_mask", ("batch", "sequence"))]
    rng = np.random.default_rng(0)
    feeds = [{"input_ids": rng.integers(0, 1000, (b, s)), "attention_mask": np.ones((b, s), np.int64)}
             for b, s in ((1, 128), (3, 96))]
    assert _runs_at(p, feeds) == [(1, 128, 768), (3, 96, 768)]
