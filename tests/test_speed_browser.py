"""The speedup a person reads in the browser is the engine's: a fresh `python app.py` (its own process, warmed up
at load as a user's is), the default run clicked twice in headless Chromium, then the same run twice through the
API with gradio_client; the page's figures must agree with the API's and beat plain decoding.

Both sides of every speedup are measured with nothing drawn (handlers.measure), so drawing the live view on
the same two cores cannot slow one side only. Timings vary on a shared machine: the bound is 15% (issue #22), and
the API's figure is the median of its runs.
"""
import re
import statistics

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

TOLERANCE = 0.15
SEEDS = iter([(1, 2, 3), (4, 5, 6)])    # the API's runs of each attempt
SUMMARY = 11           # handlers.RUN_OUTPUTS.index("summary"), checked below


def page_speedup(page, run: int) -> float:
    """Click Run with the page's defaults and read the speedup chip once run number `run` is final."""
    page.click("#spec-run")
    page.wait_for_function(f"document.querySelector('#spec-tokens')?.innerText.includes('Run {run} finished')",
                           timeout=300_000)
    chip = page.locator('#spec-stats [data-stat="speedup (measured)"] .v')
    chip.wait_for(timeout=300_000)
    return float(re.sub(r"[^\d.]", "", chip.inner_text()))


def measure_both(chromium, url: str) -> tuple[list[float], list[float]]:
    """Two default runs clicked on a new page (its runs 1 and 2), then three over the API."""
    from gradio_client import Client

    from conftest import open_playground
    from ui.playground import handlers, registry

    page = open_playground(chromium, url)
    page.wait_for_function("document.querySelector('#spec-model-status')?.innerText.startsWith('Models:')",
                           timeout=300_000)
    defaults = page.evaluate("""() => ({
        prompt: document.querySelector('#spec-prompt textarea').value,
        k: Number(document.querySelector('#spec-k input[type=number]').value)})""")
    on_page = [page_speedup(page, run) for run in (1, 2)]
    page.close()

    client = Client(url, verbose=False)
    assert handlers.RUN_OUTPUTS.index("summary") == SUMMARY
    draft, _ = registry.default_draft("smollm2-135m-instruct")
    over_api = []
    for seed in next(SEEDS):        # greedy: the same tokens, but never a replay of an earlier request (coalesce.py)
        summary = client.predict(defaults["prompt"], "smollm2-135m-instruct", draft, defaults["k"], 0, 1.0, 0, 64, seed,
                                 "exact", True, "", 0, True, False, api_name="/run")[SUMMARY]
        assert summary["timed"] and summary["matches_baseline"] is True
        over_api.append(summary["speedup"])
    return on_page, over_api


def agree(on_page: list[float], over_api: list[float]) -> bool:
    reference = statistics.median(over_api)
    return reference > 1.0 and all(f > 1.0 and abs(f - reference) <= TOLERANCE * reference for f in on_page)


def test_the_pages_speedup_is_the_engines(fresh_app, chromium):
    """The first and second run of a fresh app on the page agree with the API and beat plain decoding. Timings on
    two shared cores are noisy (the default's speedup is ~1.1-1.4 here): a second attempt, with a new page, runs
    only if the first disagrees, so a false failure needs two noisy attempts in a row."""
    attempts = [measure_both(chromium, fresh_app)]
    if not agree(*attempts[0]):
        attempts.append(measure_both(chromium, fresh_app))
    for on_page, over_api in attempts:
        print(f"\nspeedup on the page {on_page}, over the API {over_api}")
    on_page, over_api = attempts[-1]
    assert agree(on_page, over_api), f"page {on_page} vs API {over_api} (attempts: {attempts})"
