"""A real browser: Debian's headless Chromium driven by PyPI playwright against the launched app.

Skips (with the reason) only when /usr/bin/chromium is absent: `apt-get install -y chromium`.
"""
import os
import time

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def page(playground):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(playground)
        page.wait_for_selector("#spec-run", timeout=60_000)
        yield page
        browser.close()


def token_count(page) -> int:
    return page.evaluate("document.querySelectorAll('#spec-tokens .tokens .tok').length")


def test_run_hover_stop_in_a_browser(page, tmp_path):
    max_new = page.locator("#spec-max-new input[type=number]")
    max_new.fill("300")
    max_new.press("Enter")
    page.click("#spec-run")

    # Coloured tokens stream in, round by round.
    page.wait_for_function("document.querySelectorAll('#spec-tokens .tokens .round').length >= 3", timeout=120_000)
    kinds = set(page.evaluate("[...document.querySelectorAll('#spec-tokens .tokens .tok')].map(e => e.dataset.kind)"))
    assert kinds & {"accepted", "correction", "bonus"}
    background = page.evaluate("getComputedStyle(document.querySelector('#spec-tokens .tokens .tok')).backgroundColor")
    assert background not in ("", "rgba(0, 0, 0, 0)", "transparent")

    # The plots are drawn by Plotly with data.
    page.wait_for_selector("#plot-acceptance .js-plotly-plot", timeout=60_000)
    page.wait_for_function("document.querySelector('#plot-acceptance .js-plotly-plot').data?.length >= 2",
                           timeout=60_000)

    # Hovering a token shows its tooltip: a floating box filled from data-tip (the CSS ::after fallback is
    # switched off once the script runs). Tokens keep streaming while we hover, so the page may re-render
    # under the pointer: read the floating tooltip and the tip of the element actually hovered in one
    # evaluation, retrying if a re-render came between.
    floating = page.locator("#spec-tip")
    hovered = ("() => { const t = document.querySelector('#spec-tokens .tokens .tok:hover');"
               " return [document.querySelector('#spec-tip')?.innerText ?? '', t ? t.dataset.tip : null]; }")
    for _ in range(10):
        token = page.locator("#spec-tokens .tokens .tok").first
        token.hover()
        floating.wait_for(state="visible", timeout=5_000)
        shown, tip = page.evaluate(hovered)
        if tip and shown.split() == tip.split():
            break
        page.mouse.move(0, 0)
        time.sleep(0.3)
    assert tip and "p(x)" in tip and "q(x)" in tip
    assert shown.replace("\n", " ").split() == tip.replace("\n", " ").split()
    box, anchor = floating.bounding_box(), token.bounding_box()
    assert abs(box["x"] - anchor["x"]) < 500 and box["width"] > 100
    page.screenshot(path=str(tmp_path / "playground-running.png"), full_page=True)

    # Stop ends the run within about one round and says so.
    page.click("#spec-stop")
    page.wait_for_function("document.querySelector('#spec-stats').innerText.includes('Stopped after')", timeout=30_000)
    stopped_at = token_count(page)
    time.sleep(2.0)
    assert token_count(page) == stopped_at
    assert stopped_at < 300
    page.screenshot(path=str(tmp_path / "playground-stopped.png"), full_page=True)
    assert (tmp_path / "playground-stopped.png").stat().st_size > 10_000
