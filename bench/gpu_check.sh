#!/usr/bin/env bash
# The GPU check, for a lent CUDA machine with no network (bench/gpu_prepare.sh first, on a machine with pip's index).
# One prepared script, under 8 minutes on one H200:
#   1. the CUDA tests (tests/test_cuda.py): exactness on tiny models and a random-weight SmolLM2-135M shape in fp32,
#      bf16 runs, quantized and device_map="auto" targets, syncs per round;
#   2. the app's own path on CUDA (bench/app_path_smoke.py): the registry, every same-tokenizer draft through the
#      Gradio handlers with the speed measurement, "measure again" and the step-through, in fp32 (greedy must
#      match plain decoding) and in bf16 (reported: near-ties may differ);
#   3. benchmarks, fp32 and bf16, of the engine vs plain decoding vs Hugging Face generate() on random weights of
#      real shapes (SmolLM2-135M; SmolLM2-1.7B's Llama shape, where verifying k + 1 tokens costs about one forward).
# Results land in $OUT (or bench/results/gpu/ when $OUT is unset).
#   DEVICE=cpu TOKENS=8 REPEATS=1 BIG=none SMOKE_TOKENS=6 SMOKE_SECONDS=900 BENCH_SECONDS=900 PY=.venv/bin/python \
#       bash bench/gpu_check.sh                   # a dry run of the plumbing on a CPU
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
if [ -f .gpu/site.tar.xz ] && $PY -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
    mkdir -p /tmp/site && tar -xJf .gpu/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
fi
export SPEC_TOKENIZER_DIR=${SPEC_TOKENIZER_DIR:-$PWD/.gpu/tokenizer} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
$PY -c "import torch, transformers, gradio; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gradio', gradio.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')" | tee "$OUT/env.txt"
DEVICE=${DEVICE:-cuda} TOKENS=${TOKENS:-128} REPEATS=${REPEATS:-3} BIG=${BIG:-random-llama-1b} SMOKE_TOKENS=${SMOKE_TOKENS:-32}
SMOKE_SECONDS=${SMOKE_SECONDS:-75} BENCH_SECONDS=${BENCH_SECONDS:-70}      # per step; the whole check under 8 minutes
status=0
if [ "$DEVICE" = cuda ]; then
    timeout 120 $PY -m pytest -q -s -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.txt" || status=1
fi
for dtype in float32 bfloat16; do
    timeout "$SMOKE_SECONDS" $PY bench/app_path_smoke.py --device "$DEVICE" --dtype "$dtype" --tokens "$SMOKE_TOKENS" 2>&1 \
        | grep -v "Loading weights" | tee "$OUT/app-path-$dtype.txt" || status=1
done
bench() { timeout "$1" $PY -m spec_engine.bench --device "$DEVICE" --no-eos --repeats "$REPEATS" --tokens "$TOKENS" \
          --k 4 --temperatures 0 --prompts chat edit "${@:2}" 2>&1 | grep -v "Loading weights"; }
for dtype in float32 bfloat16; do
    bench "$BENCH_SECONDS" --dtype "$dtype" --target random-smollm2-135m --drafts random-smollm2-135m prompt-lookup eagle \
        --out "$OUT/gpu-smollm2-135m-shape-$dtype" | tee "$OUT/bench-135m-$dtype.txt" || status=1
    if [ "$BIG" != none ]; then
        bench "$BENCH_SECONDS" --dtype "$dtype" --target "$BIG" --drafts random-smollm2-135m prompt-lookup \
            --out "$OUT/gpu-$BIG-$dtype" | tee "$OUT/bench-big-$dtype.txt" || status=1
    fi
done
exit $status
