#!/usr/bin/env bash
# The GPU check, for a lent CUDA machine with no network (bench/gpu_prepare.sh first, on a machine with pip's index).
# One prepared script, in two device calls of under 5 minutes each on one H200 (STEPS below):
#   1. the CUDA tests (tests/test_cuda.py): exactness on tiny models and a random-weight SmolLM2-135M shape in fp32,
#      bf16 runs, quantized and device_map="auto" targets, syncs per round;
#   2. the app's own path on CUDA (bench/app_path_smoke.py): the registry, every same-tokenizer draft through the
#      Gradio handlers with the speed measurement, "measure again" and the step-through, in fp32 (greedy must
#      match plain decoding) and in bf16 (reported: near-ties may differ);
#   3. what a verify forward of n tokens costs against a one-token forward (bench/gpu_verify_cost.py: SmolLM2-135M's
#      shape in fp32, SmolLM2-1.7B's and Llama-3.1-8B's in bf16), beside the What-if tab's projection for the card;
#   4. benchmarks of the engine vs plain decoding vs Hugging Face generate() on random weights of real shapes
#      (SmolLM2-135M in $SMALL_DTYPES; $BIG, by default SmolLM2-1.7B's Llama shape, in $BIG_DTYPES);
#   5. (STEPS=static, a call of its own) the static path's captured forwards against eager ones
#      (bench/gpu_static.py on $STATIC_MODELS): plain decoding tok/s and GB/s, the verify cost by rows, and prompt
#      lookup's and the EAGLE head's speedup on the captured path; on DEVICE=cpu its fallback runs (plumbing only).
# Each step has its own time limit (a step that runs out leaves the next ones their time), and results land in $OUT
# (or bench/results/gpu/ when $OUT is unset).
#   DEVICE=cpu TOKENS=8 REPEATS=1 BIG=none SMOKE_TOKENS=6 SMOKE_SECONDS=900 BENCH_SECONDS=900 PY=.venv/bin/python \
#       bash bench/gpu_check.sh                   # a dry run of the plumbing on a CPU
#   STEPS=static bash bench/gpu_check.sh         # step 5 alone: one device call, under 5 minutes on one H200
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
# The H200 lent on 2026-12-04 decoded at batch 1 in ~20 ms a token (bound by the host's kernel launches), so these
# limits fit two calls of under 5 minutes each: STEPS="tests cost", then STEPS="app bench".
DEVICE=${DEVICE:-cuda} TOKENS=${TOKENS:-48} REPEATS=${REPEATS:-2} BIG=${BIG:-random-llama-1b} SMOKE_TOKENS=${SMOKE_TOKENS:-24}
SMOKE_SECONDS=${SMOKE_SECONDS:-120} BENCH_SECONDS=${BENCH_SECONDS:-75} COST_SECONDS=${COST_SECONDS:-100}   # per step
SMALL_DTYPES=${SMALL_DTYPES:-float32} BIG_DTYPES=${BIG_DTYPES:-bfloat16}
STATIC_MODELS=${STATIC_MODELS:-random-smollm2-135m:float32 random-llama-1b:bfloat16 random-llama-8b:bfloat16}
STATIC_TOKENS=${STATIC_TOKENS:-64} STATIC_REPEATS=${STATIC_REPEATS:-3} STATIC_ROWS=${STATIC_ROWS:-1 2 4 8 16 32}
STATIC_CONTEXT=${STATIC_CONTEXT:-256} STATIC_SECONDS=${STATIC_SECONDS:-270}
STEPS=${STEPS:-tests cost app bench}
step() { [[ " $STEPS " == *" $1 "* ]]; }
status=0
if [ "$DEVICE" = cuda ] && step tests; then
    timeout 120 $PY -m pytest -q -s -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.txt" || status=1
fi
if [ "$DEVICE" = cuda ] && step cost; then
    timeout "$COST_SECONDS" $PY -m bench.gpu_verify_cost --out "$OUT/verify-cost" 2>&1 | grep -v "Loading weights" \
        | tee "$OUT/verify-cost.txt" || status=1
fi
for dtype in float32 bfloat16; do
    step app || continue
    timeout "$SMOKE_SECONDS" $PY bench/app_path_smoke.py --device "$DEVICE" --dtype "$dtype" --tokens "$SMOKE_TOKENS" 2>&1 \
        | grep -v "Loading weights" | tee "$OUT/app-path-$dtype.txt" || status=1
done
bench() { timeout "$1" $PY -m spec_engine.bench --device "$DEVICE" --no-eos --repeats "$REPEATS" --tokens "$TOKENS" \
          --k 4 --temperatures 0 --prompts chat edit "${@:2}" 2>&1 | grep -v "Loading weights"; }
for dtype in float32 bfloat16; do
    step bench || continue
    if [[ " $SMALL_DTYPES " == *" $dtype "* ]]; then
        bench "$BENCH_SECONDS" --dtype "$dtype" --target random-smollm2-135m --drafts random-smollm2-135m prompt-lookup \
            eagle --out "$OUT/gpu-smollm2-135m-shape-$dtype" | tee "$OUT/bench-135m-$dtype.txt" || status=1
    fi
    if [ "$BIG" != none ] && [[ " $BIG_DTYPES " == *" $dtype "* ]]; then
        bench "$BENCH_SECONDS" --dtype "$dtype" --target "$BIG" --drafts random-smollm2-135m prompt-lookup \
            --out "$OUT/gpu-$BIG-$dtype" | tee "$OUT/bench-big-$dtype.txt" || status=1
    fi
done
if step static; then
    # shellcheck disable=SC2086       # the model and row lists are words
    timeout "$STATIC_SECONDS" $PY -m bench.gpu_static --device "$DEVICE" --models $STATIC_MODELS \
        --tokens "$STATIC_TOKENS" --repeats "$STATIC_REPEATS" --rows $STATIC_ROWS --context "$STATIC_CONTEXT" \
        --out "$OUT/static" 2>&1 | grep -v "Loading weights" | tee "$OUT/static.txt" || status=1
fi
exit $status
