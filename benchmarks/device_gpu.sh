#!/bin/bash
# The GPU checks in one device call (this workplace's device tool; see benchmarks/RESULTS.md "GPU"), about 9
# minutes: relsat laid out as its installed package (PYTHONPATH, no build step), the carried cp312 wheels
# (.whl: duckdb, highspy, platformdirs, onnxsim) and corpus models (.corpus, packed by benchmarks/device_pack.py;
# `pack --redraw` carries the 22 corpus models PyTorch runs in 8 MB), then
#   1. the GPU tests (-m gpu: catalog ops, the zoo and the seed models on CUDA against ONNX Runtime, profiling);
#   2. banded attention derived from a band mask (issue 28), both graphs on CUDA with PyTorch;
#   3. bench_gpu: TASO's zoo (small) and the carried corpus models end to end with --provider cuda, against
#      the original and onnxsim, timed on the GPU: JOBS models optimized at once (relsat and onnxsim, each job
#      on its own slice of the 16 cores), then each model timed alone (bench_gpu --jobs).
# Everything it reports goes to $OUT (gpu.txt, unpack.txt, tests.txt, band.txt, gpu_section.md, results.json,
# bench.log). STEPS (default "tests bench"; "band" adds step 2), BUDGET (bench_gpu's --total-budget, default 420), JOBS
# (bench_gpu's --jobs, default 8) and MODELS (default: the 22 corpus models the PyTorch runtime runs, biggest
# first, then the 17 small zoo models) choose. An empty or missing .corpus is fine: a corpus model named in MODELS
# and not carried is skipped with a line. Every log is written as it goes, so a run cut short still returns.
set -u
STEPS=${STEPS:-tests bench}; BUDGET=${BUDGET:-420}; JOBS=${JOBS:-8}  # the 39 models in under 8 minutes (RESULTS, H200)
CORPUS="gpt2 swin_tiny bert_base vit_b16 ppocr_rec_v4 ppocr_rec_v5 ppocr_det_v4 ppocr_det_v5 ppocr_det_v3_en yolo11n
  yolov8n convnextv2_tiny t5_small_encoder distilbert ppocr_cls_v2 convnext_tiny regnety_016 whisper_tiny_encoder
  efficientnet_b0 distilhubert mobilenetv3_large doc_orientation"
ZOO="nasnet_a inception_v3 bert_encoder mobilenet_v2 gcn resnext50 resnet50 nasrnn bert longformer squeezenet vgg19
  resnet18 csrnet dcgan infogan fsrcnn"
MODELS=${MODELS:-$CORPUS $ZOO}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/relsat_device_out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
mkdir -p /tmp/pkg/relsat && cp driver/_root/__init__.py /tmp/pkg/relsat/
for d in relations programs driver extract benchmarks; do ln -sfn "$PWD/$d" "/tmp/pkg/relsat/$d"; done
export PYTHONPATH=/tmp/site:/tmp/pkg
# corpus models travel with float16-stored weights (benchmarks/device_pack.py): widened back to float32 here
mkdir -p /tmp/corpus && python3 -m relsat.benchmarks.device_pack unpack .corpus /tmp/corpus > "$OUT/unpack.txt" 2>&1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc; python3 -V
  python3 -c "import torch, onnxruntime, onnx, duckdb, highspy, relsat; print('torch', torch.__version__, 'ort',
onnxruntime.__version__, 'onnx', onnx.__version__, 'duckdb', duckdb.__version__, 'relsat', relsat.__file__)"; date -u; } \
  2>&1 | tee "$OUT/gpu.txt"
[[ $STEPS == *tests* ]] && timeout 100 python3 -m pytest -m gpu -p no:cacheprovider tests/test_torch_ops.py tests/test_torch_opaque.py tests/test_torch_runtime.py \
  tests/test_profile.py tests/test_costs_e2e.py 2>&1 | tee "$OUT/tests.txt" | tail -25
[[ $STEPS == *band* ]] && timeout 100 python3 -m relsat.benchmarks.bench_band --seq 1024 2048 --window 128 --device cuda --runs 30 2>&1 \
  | tee "$OUT/band.txt"
# shellcheck disable=SC2086
[[ $STEPS == *bench* ]] && timeout $((BUDGET + 40)) python3 -m relsat.benchmarks.bench_gpu --corpus-dir /tmp/corpus \
  --total-budget "$BUDGET" --jobs "$JOBS" --out /tmp/relsat_gpu --markdown "$OUT/gpu_section.md" --models $MODELS \
  > "$OUT/bench.log" 2>&1
cp /tmp/relsat_gpu/results.json "$OUT/" 2>/dev/null
tail -30 "$OUT/bench.log"
