"""How long `python app.py` takes to serve its page and to be ready, from the process start. Not a test.

    python -m bench.startup --clone --out bench/results/startup-2threads

With `--clone` it runs from a fresh `git clone` of this checkout (the README's way on a new machine: only what is
committed), with this checkout's `.venv`. Each start is timed twice over: `first` with an empty model cache (a new
`SPEC_ENGINE_CACHE`: the GGUF is dequantized, the kernels compiled, the weights packed and the costs measured) and
`later` with the cache the first start left. Reported: seconds from the process start until the page answers (HTTP
200), and until the page's model status says "ready" (Chromium opens the page as a visitor does, as soon as it
answers; the app starts loading the default target at start-up, not at the first visit).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def one_start(root: Path, cache: Path, timeout: float = 900.0) -> dict:
    """Start app.py in `root` with model cache `cache`; seconds until the page answers and until it says ready."""
    from playwright.sync_api import sync_playwright
    port = free_port()
    env = {**os.environ, "SPEC_ENGINE_CACHE": str(cache), "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    url = f"http://127.0.0.1:{port}/"
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "app.py"], cwd=root, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        while not page_answers(url):
            if process.poll() is not None or time.perf_counter() - start > timeout:
                raise SystemExit(f"app.py did not serve {url} (exit code {process.poll()})")
            time.sleep(0.2)
        served = time.perf_counter() - start
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium")
            page = browser.new_page()
            page.goto(url)
            # The loading line says "not ready until warmed up"; the loaded one "Models: <name>: ready (cpu, ...)".
            page.wait_for_function("(document.querySelector('#spec-model-status')?.innerText || '')"
                                   ".includes(': ready (')", timeout=timeout * 1000, polling=200)
            ready = time.perf_counter() - start
            browser.close()
        return {"served_s": served, "ready_s": ready}
    finally:
        process.terminate()
        process.wait(30)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clone", action="store_true", help="run from a fresh git clone of this checkout")
    parser.add_argument("--later", type=int, default=2, help="later starts to time after the first")
    parser.add_argument("--out", default=None, help="write OUT.md")
    args = parser.parse_args(argv)
    before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        root = ROOT
        if args.clone:
            root = Path(scratch) / "clone"
            subprocess.run(["git", "clone", "-q", str(ROOT), str(root)], check=True)
            (root / ".venv").symlink_to(ROOT / ".venv")
        cache = Path(scratch) / "cache"
        rows = [("first (empty cache)", one_start(root, cache))]
        rows += [(f"later #{i + 1}", one_start(root, cache)) for i in range(args.later)]
    lines = [f"python -m bench.startup{' --clone' if args.clone else ''} --later {args.later}", "",
             f"load average (1 min) before/after: {before:.2f} / {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs", "",
             "| start | page served (s) | ready (s) |", "|---|---|---|"]
    lines += [f"| {name} | {row['served_s']:.1f} | {row['ready_s']:.1f} |" for name, row in rows]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out + ".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
