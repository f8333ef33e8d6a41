"""Take the README screenshot: `python -m ui.screenshot [docs/screenshot.png]`.

Launches the playground on a free local port, drives it in headless Chromium (Debian's /usr/bin/chromium
through playwright) like a person would: the sampling scenario for the history, then the prompt-lookup scenario,
waits for the measured speedup, hovers a rejected token and saves the page.
"""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def pick_scenario(page, label_start: str) -> None:
    page.click("#spec-scenario input")
    page.click(f"li[data-testid=dropdown-option]:has-text('{label_start}')")
    page.wait_for_function(f"document.querySelector('#spec-caption').innerText.includes({label_start!r})",
                           timeout=30_000)
    time.sleep(1.0)   # let every control receive the scenario's value before Run reads them


def run_and_wait(page, run_number: int, timeout_ms: int = 600_000) -> None:
    page.click("#spec-run")
    page.wait_for_function(f"document.querySelector('#spec-stats').innerText.includes('Run {run_number} finished')",
                           timeout=timeout_ms)


def main(out: str = "docs/screenshot.png") -> None:
    from playwright.sync_api import sync_playwright

    from ui.layout import LAYOUT_CSS, THEME, build_demo
    demo = build_demo()
    demo.queue()
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, theme=THEME,
                css=LAYOUT_CSS)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1560}, device_scale_factor=1)
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#spec-run", timeout=60_000)
            page.wait_for_function("document.querySelector('#spec-model-status').innerText.includes('ready')",
                                   timeout=300_000)
            pick_scenario(page, "5. Sampling")
            run_and_wait(page, 1)
            pick_scenario(page, "3. Prompt lookup")
            run_and_wait(page, 2)
            # Hover an informative token: a rejection the target did not rule out, else a correction.
            candidates = page.locator("#spec-tokens .tokens .tok.rejected")
            index = page.evaluate("[...document.querySelectorAll('#spec-tokens .tokens .tok.rejected')]"
                                  ".findIndex(e => parseFloat(e.dataset.p) > 0.05)")
            token = candidates.nth(index) if index >= 0 else page.locator("#spec-tokens .tokens .tok.correction").first
            token.scroll_into_view_if_needed()
            page.evaluate("window.scrollTo(0, 0)")
            token.hover()
            time.sleep(0.5)
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=out)
            browser.close()
    finally:
        demo.close()
    print(f"saved {out}")


if __name__ == "__main__":
    main(*sys.argv[1:])
