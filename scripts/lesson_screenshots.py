"""Screenshots of the "check yourself" points of docs/lesson.md, each at most two clicks from a fresh page.

Usage: .venv/bin/python scripts/lesson_screenshots.py http://127.0.0.1:7860/ docs/lesson [names...]
A point that does not reach its result leaves NAME-failed.png beside the others.
"""
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

POINTS = ["1-reject-4-of-5", "2-distribution", "3-top-p", "3b-rules", "4-naive-ids", "5-kv-growth", "6-formula",
          "7-three-ways"]
WAIT = 900_000      # ms: a busy two-core machine


def fresh(browser, url):
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    page.goto(url)
    page.wait_for_selector("#spec-run", timeout=120_000)
    page.wait_for_function("document.querySelector('#spec-model-status')?.innerText.startsWith('Models:')",
                           timeout=WAIT)
    return page


def tab(page, name):
    page.get_by_role("tab", name=name, exact=True).click()


def shot(page, out, name, selector=None):
    if selector:
        page.locator(selector).first.scroll_into_view_if_needed()
    time.sleep(1.0)
    page.screenshot(path=str(out / f"{name}.png"))
    print("saved", name, flush=True)


def run_finished(page):
    page.wait_for_function("document.querySelector('#spec-tokens')?.innerText.includes('finished')", timeout=WAIT)


def take(page, out, name):
    if name == "1-reject-4-of-5":                     # the tab, then "Show me"
        tab(page, "Step through")
        page.click("#step-lesson")
        page.wait_for_function("document.querySelector('#step-status')?.innerText.includes('Round')", timeout=WAIT)
        shot(page, out, name, "#step-round")
    elif name in ("2-distribution", "3-top-p", "3b-rules"):      # the tab, then "Run the exactness lab"
        tab(page, "Exactness lab")
        page.click("#lab-run")
        page.wait_for_function("document.querySelector('#lab-status')?.innerText.includes('Done')", timeout=WAIT)
        shot(page, out, name, "#lab-plot-exact" if name == "2-distribution" else "#lab-table")
    elif name == "4-naive-ids":                       # the tab, then the demo's button
        tab(page, "Tokenizer mismatch")
        page.click("#spec-mismatch")
        page.wait_for_function("document.body.innerText.includes('Done: hover the tokens')", timeout=WAIT)
        shot(page, out, name, "#spec-mismatch-plot")
    elif name == "5-kv-growth":                       # Run, then the KV cache tab
        page.click("#spec-run")
        run_finished(page)
        tab(page, "KV cache")
        shot(page, out, name, "#spec-kv-table")
    elif name == "6-formula":                         # Run
        page.click("#spec-run")
        run_finished(page)
        page.wait_for_selector('#spec-stats [data-stat="speedup (measured)"]', timeout=WAIT)
        shot(page, out, name)
    elif name == "7-three-ways":                      # the tab, then Measure
        tab(page, "Three ways to share a weight read")
        page.click("#three-ways-measure")
        page.wait_for_function("document.querySelector('#three-ways-status')?.innerText.includes('Done')",
                               timeout=WAIT)
        shot(page, out, name, "#three-ways-plot")


def main(url: str, out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        for name in names or POINTS:
            page = fresh(browser, url)
            try:
                take(page, out, name)
            except Exception:
                page.screenshot(path=str(out / f"{name}-failed.png"))
                raise
            finally:
                page.close()
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
