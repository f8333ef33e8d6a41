"""The speedup a person reads in the browser is the engine's: a fresh `python app.py` (its own process, warmed up
at load as a user's is), the default run clicked twice in headless Chromium, each followed by the same run through
the API with gradio_client, then two more through the API; the page's figures must agree with the API's.

Both sides of every speedup are measured with nothing drawn (handlers.measure), so drawing the live view on
the same two cores cannot slow one side only. One run's figure varies on a shared machine: the default run's
speedup through the API spread x1.29-x1.82 within minutes in one CI run (a coefficient of variation of 9-12%,
quiet and in CI), so one page figure against one API figure would fail a 15% bound about a third of the time.
The page's runs and the API's alternate, sampling the same minutes, with the page open throughout (it first
finishes drawing, so that its plots do not slow the API's run), and the bound of issue #22 (15%) holds the mean of
the page's first and second run against the median of the API's four; each page figure must also be within 30% of
that median, which the page's old fault (x1.0 shown while the API measured x1.4, 29% below) does not pass.
"""
import re
import statistics

import pytest

# alone: the page's figures and the API's are compared, so the other test worker waits (tests/conftest.py)
pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow, pytest.mark.alone]

TOLERANCE = 0.15        # the page's mean against the API's median (issue #22)
EACH = 0.30             # each page figure against the API's median
ATTEMPTS = [(0, (1, 2, 3, 4)), (7, (5, 6, 8, 9)), (10, (11, 12, 13, 14))]   # (the page's seed, the API's seeds) of each
                        # attempt: greedy, so the same tokens, but never a replay of an earlier request (coalesce.py)
SUMMARY = 11            # handlers.RUN_OUTPUTS.index("summary"), checked below
DRAWN = 2_000           # ms the page is left to finish drawing a run's final view (its plots) before the API's run
# look for the finished run 4 times a second: polling="raf" (the default) asks for a frame 60 times a second
POLL_MS = 250


def page_speedup(page, run: int) -> float:
    """Click Run with the page's defaults and read the speedup chip once run number `run` is final."""
    page.click("#spec-run")
    page.wait_for_function(f"document.querySelector('#spec-tokens')?.innerText.includes('Run {run} finished')",
                           timeout=300_000, polling=POLL_MS)
    chip = page.locator('#spec-stats [data-stat="speedup (measured)"] .v')
    chip.wait_for(timeout=300_000)
    page.wait_for_timeout(DRAWN)
    return float(re.sub(r"[^\d.]", "", chip.inner_text()))


def measure_both(chromium, url: str, page_seed: int, api_seeds) -> tuple[list[float], list[float]]:
    """Two default runs clicked on a new page (its runs 1 and 2), each followed by one over the API, then two more
    over the API."""
    from gradio_client import Client

    from conftest import open_playground, set_number
    from ui.playground import handlers, drafts

    page = open_playground(chromium, url)
    page.wait_for_function("document.querySelector('#spec-model-status')?.innerText.startsWith('Models:')",
                           timeout=300_000)
    defaults = page.evaluate("""() => ({
        prompt: document.querySelector('#spec-prompt textarea').value,
        k: Number(document.querySelector('#spec-k input[type=number]').value)})""")
    if page_seed:
        set_number(page, "#spec-seed", page_seed)
    client = Client(url, verbose=False)
    assert handlers.RUN_OUTPUTS.index("summary") == SUMMARY
    draft, _ = drafts.default_draft("smollm2-135m-instruct")

    def over_the_api(seed: int) -> float:
        summary = client.predict(defaults["prompt"], "smollm2-135m-instruct", draft, defaults["k"], 0, 1.0, 0, 64, seed,
                                 "exact", True, "", 0, True, False, api_name="/run")[SUMMARY]
        assert summary["timed"] and summary["matches_baseline"] is True
        return summary["speedup"]

    on_page, over_api = [], []
    for run, seed in zip((1, 2), api_seeds):
        on_page.append(page_speedup(page, run))
        over_api.append(over_the_api(seed))
    over_api += [over_the_api(seed) for seed in api_seeds[2:]]
    # Closed after the API's runs, so every run of the comparison has it open. An idle page once cost the engine a
    # tenth of its speedup (API x1.12-1.20 with it, x1.49-1.53 without): Gradio's leaked frame loop, which
    # ui/page_head.py ends (tests/test_app_browser.py::test_an_idle_page_asks_for_no_frames).
    page.close()
    return on_page, over_api


def agree(on_page: list[float], over_api: list[float]) -> bool:
    reference = statistics.median(over_api)
    # Whether the default beats plain decoding is #35's benchmark's question, not this test's: on right kernel plans
    # (8d31489), with a browser on the same two cores, CI measured the page at x0.97 / x0.99 and the API at x0.93-1.03.
    return (abs(statistics.fmean(on_page) - reference) <= TOLERANCE * reference
            and all(abs(f - reference) <= EACH * reference for f in on_page))


def test_the_pages_speedup_is_the_engines(fresh_app, chromium):
    """The first and second run of a fresh app on the page agree with the API and beat plain decoding. A new attempt,
    with a new page and new seeds (so that it computes, not replays an earlier one), runs only if the one before
    disagrees: with the spread above, one attempt fails falsely with a probability of about 0.15 (its mean of two
    against a median of four differ by about 0.9 of one run's spread), three in a row about 0.003."""
    attempts = []
    for seeds in ATTEMPTS:
        attempts.append(measure_both(chromium, fresh_app, *seeds))
        print(f"\nspeedup on the page {attempts[-1][0]}, over the API {attempts[-1][1]}")
        if agree(*attempts[-1]):
            break
    assert agree(*attempts[-1]), f"the page and the API disagree in every attempt: {attempts}"
