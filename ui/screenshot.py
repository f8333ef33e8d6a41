"""Take the README screenshot: `python -m ui.screenshot [docs/screenshot.png]`; the draft tree view's:
`python -m ui.screenshot tree [docs/tree-view.png]`; presentation mode at 1440x1000, a 390x844 phone and the tab bar at
1024x768 (issue #38): `python -m ui.screenshot classroom [docs]`.

Launches the playground on a free local port, drives it in headless Chromium (Debian's /usr/bin/chromium
through playwright) like a person would: the sampling scenario for the history, then the prompt-lookup scenario,
waits for the measured speedup, hovers a rejected token and saves the page. The tree view: the draft-tree scenario
(13), its Draft tree tab, a hovered node that the target refused.
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


def wait_finished(page, run_number: int, timeout_ms: int = 600_000) -> None:
    page.wait_for_function(f"document.querySelector('#spec-stats').innerText.includes('Run {run_number} finished')",
                           timeout=timeout_ms)


def run_and_wait(page, run_number: int, timeout_ms: int = 600_000) -> None:
    page.click("#spec-run")
    wait_finished(page, run_number, timeout_ms)


def launched():
    """The playground, launched on a free local port: (demo, url)."""
    from ui.layout import LAYOUT_CSS, THEME, build_demo
    demo = build_demo()
    demo.queue()
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True, theme=THEME,
                css=LAYOUT_CSS)
    return demo, f"http://127.0.0.1:{port}/"


def open_ready(browser, url: str, height: int, width: int = 1440):
    page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
    page.goto(url)
    page.wait_for_selector("#spec-run", timeout=60_000)
    page.wait_for_function("document.querySelector('#spec-model-status').innerText.includes(': ready (')",
                           timeout=300_000)
    return page


def tree_view(out: str = "docs/tree-view.png") -> None:
    """The draft-tree scenario's Draft tree tab, with a refused node hovered (its p, q and the decision)."""
    from playwright.sync_api import sync_playwright
    demo, url = launched()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = open_ready(browser, url, 1100)
            page.get_by_label("Measure the speedup after each run (nothing drawn)").uncheck()
            pick_scenario(page, "13. Draft tree")
            wait_finished(page, 1)
            page.get_by_role("tab", name="Draft tree").click()
            page.wait_for_selector("#plot-tree .js-plotly-plot .scatterlayer .point", timeout=30_000)
            time.sleep(1.0)
            index = page.evaluate("document.querySelector('#plot-tree .js-plotly-plot').data"
                                  ".findIndex(t => t.name.startsWith('rejected'))")      # SVG traces follow data order
            box = (page.locator("#plot-tree .scatterlayer .trace").nth(index).locator("path.point").first.bounding_box()
                   if index >= 0 else None)
            if box:
                page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                time.sleep(0.8)
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            page.locator("#plot-tree").screenshot(path=out)
            browser.close()
    finally:
        demo.close()
    print(f"saved {out}")


PLOTS_PRESENTED = ("[...document.querySelectorAll('[id^=plot-] .js-plotly-plot')].filter(gd => gd.offsetParent)"
                   ".every(gd => gd.layout.meta === 'spec-present')")


def classroom_views(out_dir: str = "docs") -> None:
    """presentation-mode.png: scenario 4 in presentation mode at 1440x1000 (the first 2,000 px: numbers, tokens and
    the plots, one per row); narrow-390.png: the same run on a 390x844 phone, scrolled to Run (the results follow
    it); tabs-1024.png: the lower tab bar at 1024x768, every tab in it."""
    from playwright.sync_api import sync_playwright
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    demo, url = launched()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = open_ready(browser, url, 1000)
            pick_scenario(page, "4. Prompt lookup")
            wait_finished(page, 1)
            page.click("#spec-present input")
            page.wait_for_function(PLOTS_PRESENTED, timeout=30_000)
            time.sleep(1.0)
            page.screenshot(path=str(out / "presentation-mode.png"), full_page=True,
                            clip={"x": 0, "y": 0, "width": 1440, "height": 2000})
            page.close()

            page = open_ready(browser, url, 844, width=390)
            pick_scenario(page, "4. Prompt lookup")
            wait_finished(page, 1)
            page.evaluate("window.scrollTo(0, document.querySelector('#spec-run').getBoundingClientRect().top"
                          " + window.scrollY - 8)")
            time.sleep(0.5)
            page.screenshot(path=str(out / "narrow-390.png"))
            page.close()

            page = open_ready(browser, url, 768, width=1024)
            bar = page.locator(".tabs", has=page.get_by_role("tab", name="Compare runs", exact=True)).first
            bar.locator("[role=tablist]").first.screenshot(path=str(out / "tabs-1024.png"))
            browser.close()
    finally:
        demo.close()
    print(f"saved {out}/presentation-mode.png, narrow-390.png, tabs-1024.png")


def main(out: str = "docs/screenshot.png") -> None:
    from playwright.sync_api import sync_playwright
    demo, url = launched()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = open_ready(browser, url, 1560)
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
    if sys.argv[1:2] == ["tree"]:
        tree_view(*sys.argv[2:])
    elif sys.argv[1:2] == ["classroom"]:
        classroom_views(*sys.argv[2:])
    else:
        main(*sys.argv[1:])
