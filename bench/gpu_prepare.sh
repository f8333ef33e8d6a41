#!/usr/bin/env bash
# Run HERE (the CPU machine) before bench/gpu_check.sh: gathers what the lent GPU machine cannot fetch into
# .gpu/ (git-ignored; under the device tool's 64 MiB limit): SmolLM2's tokenizer (the 98 MB GGUF itself is too
# big to travel, so the GPU check uses random weights of real shapes) and wheels of the exact transformers and
# gguf versions this project pins (the GPU image ships torch with CUDA but an older transformers).
#
#   bash bench/gpu_prepare.sh
#   then, with the device tool:  run(command="bash bench/gpu_check.sh", carry=[".gpu"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -rf .gpu && mkdir -p .gpu/wheels
$PY - <<'PYEOF'
import torch
torch.set_num_threads(1)
from spec_engine.models import load_model
load_model("smollm2-135m-instruct", device="cpu", dtype="float32").tokenizer.save_pretrained(".gpu/tokenizer")
PYEOF
version() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .gpu/wheels \
    "transformers==$(version transformers)" "gguf==$(version gguf)"
du -sh .gpu
