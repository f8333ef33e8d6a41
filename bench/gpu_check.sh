#!/usr/bin/env bash
# The GPU check, for a lent CUDA machine (bench/gpu_prepare.sh first, here). Under 8 minutes on one H200:
#   1. the CUDA tests (tests/test_cuda.py): exactness on tiny models and on a random-weight SmolLM2-135M-shaped
#      model in fp32, bf16 runs, bitsandbytes 8/4-bit and device_map="auto" targets, syncs per round;
#   2. the benchmark on CUDA in bf16: the SmolLM2-135M shape with its self-draft and prompt lookup, then a
#      random-weight 1.7B Llama (SmolLM2-1.7B's shape) to show the memory-bound regime, where verifying k + 1
#      tokens costs about one forward. Results land in $OUT (or bench/results/gpu/ when $OUT is unset).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/gpu}
mkdir -p "$OUT"
PY=${PY:-python3}
if [ -d .gpu/wheels ] && ls .gpu/wheels/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl && export PYTHONPATH=/tmp/site
fi
export SPEC_TOKENIZER_DIR=${SPEC_TOKENIZER_DIR:-$PWD/.gpu/tokenizer} PYTHONUNBUFFERED=1
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')" | tee "$OUT/env.txt"
status=0
timeout 180 $PY -m pytest -q -s -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.txt" || status=1
# DEVICE=cpu TOKENS=8 REPEATS=1 K=2 BIG=none bash bench/gpu_check.sh: a dry run of this script's plumbing on a CPU
DEVICE=${DEVICE:-cuda} TOKENS=${TOKENS:-128} REPEATS=${REPEATS:-3} K=${K:-2 4 8} BIG=${BIG:-random-llama-1b}
bench() { timeout "$1" $PY -m spec_engine.bench --device "$DEVICE" --dtype bfloat16 --no-eos --repeats "$REPEATS" \
          --tokens "$TOKENS" --k $K "${@:2}" 2>&1 | grep -v "Loading weights"; }
bench 150 --target random-smollm2-135m --drafts random-smollm2-135m prompt-lookup layer-skip \
    --temperatures 0 0.7 --prompts chat edit --out "$OUT/gpu-smollm2-135m-shape" | tee "$OUT/bench-135m.txt" || status=1
if [ "$BIG" != none ]; then
    bench 150 --target "$BIG" --drafts random-smollm2-135m prompt-lookup \
        --temperatures 0 --prompts chat edit --out "$OUT/gpu-${BIG}" | tee "$OUT/bench-big.txt" || status=1
fi
exit $status
