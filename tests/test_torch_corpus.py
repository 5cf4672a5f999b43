"""The real-model corpus (relsat.benchmarks.corpus) under the PyTorch runtime (driver/boundary/torch_runtime.py):
every model runs on PyTorch's CPU device (and on CUDA where a GPU is) and each output matches ONNX Runtime's element by element under
verify's tolerance, at both of the entry's bindings (so the shape arithmetic kept on the host is redone
per run); the models with operators that have no mapping are refused by name. A model not built in the
corpus cache is skipped (``python -m relsat.benchmarks.corpus build NAME`` builds it)."""

import onnx
import pytest

torch = pytest.importorskip("torch")

from relsat.benchmarks import corpus as c  # noqa: E402
from relsat.driver.boundary.torch_runtime import TorchSession  # noqa: E402
from relsat.driver.boundary.verify import INPUT_DRAWS, verify  # noqa: E402
from relsat.driver.errors import RelsatError  # noqa: E402

REFUSED = {"fasterrcnn_mobilenet_v3": "TopK", "silero_vad": "If", "silero_vad_16k": "If"}
SLOW = {"gpt2", "bert_base", "swin_tiny", "whisper_tiny_encoder", "distilbert", "t5_small_encoder",
        "convnextv2_tiny",  # 5 to 15 s each on a CPU; the others take a few seconds
        # 6 to 10 s each; their operators are all in the default run's models (mobilenetv3_large, yolo11n,
        # ppocr_det_v5, ppocr_rec_v5, ppocr_det_v3_en, ppocr_cls_v2, doc_orientation, distilhubert, vit_b16)
        "regnety_016", "convnext_tiny", "ppocr_det_v4", "ppocr_rec_v4", "yolov8n", "efficientnet_b0"}


def _path(name: str):
    path = c.path(name)
    if not path.exists():
        pytest.skip(f"{name} is not built in {path.parent} (python -m relsat.benchmarks.corpus build {name})")
    return path


def _shapes(entry: c.Entry, binding: dict) -> dict:
    return {i.name: [binding[d] if isinstance(d, str) else d for d in i.dims] for i in entry.inputs}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs an NVIDIA GPU with PyTorch CUDA")])])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in (e.name for e in c.CORPUS) if n not in REFUSED])
def test_corpus_model_matches_onnx_runtime(name, device):
    path, entry = _path(name), c.entry(name)
    res = verify(path, TorchSession(onnx.load(str(path)), device), draws=INPUT_DRAWS[:1],
                 bindings=[_shapes(entry, b) for b in entry.bindings])
    assert res.ok, res.message
    assert res.bindings == 2 and set(res.per_output) == set(entry.outputs)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_corpus_models_with_unmapped_operators_are_refused_by_name(name):
    with pytest.raises(RelsatError, match=rf"^the PyTorch runtime cannot run node \S+ \(ai.onnx::{REFUSED[name]}\): "
                                          r"no mapping for this operator$"):
        TorchSession(onnx.load(str(_path(name))), "cpu")
