#!/usr/bin/env bash
# Run HERE (a machine with pip's index) before bench/gpu_check.sh. A lent GPU machine cannot fetch anything, and its
# image (Python 3.12, torch with CUDA, an older transformers, no Gradio) lacks part of what the check runs: the engine
# on this project's transformers, and the app's own path (Gradio handlers, Plotly figures). This gathers into .gpu/
# (git-ignored):
#   .gpu/tokenizer/      SmolLM2's tokenizer (the 98 MB GGUF is too big to travel: the check uses random weights of
#                        real shapes with the real tokenizer)
#   .gpu/site.tar.xz     the dependency closure of requirements.txt minus torch, resolved by pip for CPython 3.12 on
#                        manylinux x86_64, without the distributions the GPU image already has (IMAGE_HAS, from the
#                        device library's KINDS.md as read on 2026-12-04: no pytz, which Gradio imports, and no tzdata),
#                        except the pinned ones whose image version is too old; unpacked, Gradio's browser bundle
#                        removed (the check serves no page), compressed under the device tool's 64 MiB carry limit
#                        with the working tree.
#
#   bash bench/gpu_prepare.sh
#   then, with the device tool:  run(command="bash bench/gpu_check.sh", carry=[".gpu"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
rm -rf .gpu && mkdir -p .gpu/wheels .gpu/site
$PY - <<'PYEOF'
import torch
torch.set_num_threads(1)
from spec_engine.models import load_model
load_model("smollm2-135m-instruct", device="cpu", dtype="float32").tokenizer.save_pretrained(".gpu/tokenizer")
PYEOF
version() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
PLATFORMS=()
for tag in manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34; do
    PLATFORMS+=(--platform "${tag}_x86_64")
done
# Requirements.txt's app dependencies at the versions tested here (torch and bitsandbytes come with the image or
# are optional), with everything they need.
$PY -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" -d .gpu/wheels \
    "transformers==$(version transformers)" "huggingface_hub==$(version huggingface_hub)" \
    "gradio==$(version gradio)" "plotly==$(version plotly)" "gguf==$(version gguf)"
IMAGE_HAS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click cloudpickle colorama filelock fsspec h11 hf-xet httpcore httpx idna jinja2 markdown
markdown-it-py markupsafe mdurl numpy packaging pandas pillow protobuf psutil pygments python-dateutil pyyaml
regex requests rich safetensors sentencepiece shellingham six sympy tokenizers tqdm typer typing-extensions urllib3
uvloop werkzeug wrapt yarl zipp"
$PY - "$IMAGE_HAS" <<'PYEOF'
import pathlib, re, sys
has = set(sys.argv[1].split())
for wheel in sorted(pathlib.Path(".gpu/wheels").glob("*.whl")):
    name = re.split(r"-\d", wheel.name, maxsplit=1)[0].lower().replace("_", "-")
    if name in has:
        wheel.unlink()
PYEOF
$PY -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" --target .gpu/site .gpu/wheels/*.whl
rm -rf .gpu/site/gradio/templates .gpu/site/gradio/_frontend_code .gpu/site/bin
tar -cJf .gpu/site.tar.xz -C .gpu/site .
rm -rf .gpu/wheels .gpu/site
du -sh .gpu .gpu/site.tar.xz
