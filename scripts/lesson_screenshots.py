"""Screenshots of the six "check yourself" points of docs/lesson.md, each at most two clicks from a fresh page.

Usage: .venv/bin/python scripts/lesson_screenshots.py http://127.0.0.1:7860/ docs/lesson [names...]
"""
import sys, time
from pathlib import Path
from playwright.sync_api import sync_playwright
url, out = sys.argv[1], Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
only = sys.argv[3:] or None

def fresh(browser):
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.goto(url); page.wait_for_selector("#spec-run", timeout=120_000)
    page.wait_for_function("document.querySelector('#spec-model-status')?.innerText.startsWith('Models:')",
                           timeout=600_000)
    return page

def tab(page, name):
    page.get_by_role("tab", name=name, exact=True).click()

def shot(page, name, selector=None):
    if selector:
        page.locator(selector).first.scroll_into_view_if_needed()
    time.sleep(1.0)
    page.screenshot(path=str(out / f"{name}.png"))
    print("saved", name, flush=True)

with sync_playwright() as p:
    b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--headless", "--no-sandbox", "--disable-gpu"])
    todo = only or ["1-reject-4-of-5", "2-distribution", "3-top-p", "4-naive-ids", "5-kv-growth", "6-formula"]
    for name in todo:
        page = fresh(b)
        if name == "1-reject-4-of-5":          # click 1: the tab; click 2: Show me
            tab(page, "Step through"); page.click("#step-lesson")
            page.wait_for_function("document.querySelector('#step-status')?.innerText.includes('Round')", timeout=300_000)
            shot(page, name, "#step-round")
        elif name in ("2-distribution", "3-top-p"):   # click 1: the tab; click 2: Run the exactness lab
            tab(page, "Exactness lab"); page.click("#lab-run")
            page.wait_for_function("document.querySelector('#lab-status')?.innerText.includes('Done')", timeout=600_000)
            shot(page, name, "#lab-plot-exact" if name == "2-distribution" else "#lab-table")
        elif name == "4-naive-ids":            # click 1: the tab; click 2: Run the demo
            tab(page, "Tokenizer mismatch"); page.click("#spec-mismatch")
            page.wait_for_function("document.body.innerText.includes('Done: hover the tokens')", timeout=900_000)
            shot(page, name, "#spec-mismatch")
        elif name == "5-kv-growth":            # click 1: Run; click 2: the KV cache tab
            page.click("#spec-run")
            page.wait_for_function("document.querySelector('#spec-tokens')?.innerText.includes('finished')", timeout=600_000)
            tab(page, "KV cache"); shot(page, name, "#spec-kv-table")
        elif name == "6-formula":              # click 1: Run
            page.click("#spec-run")
            page.wait_for_function("document.querySelector('#spec-tokens')?.innerText.includes('finished')", timeout=600_000)
            page.wait_for_selector('#spec-stats [data-stat="speedup (measured)"]', timeout=600_000)
            shot(page, name)
        page.close()
    b.close()
