"""Issue #36 in the browser: when the verify-cost curve stops every draft, the page says so, with the numbers.

A grossly wrong curve (4 rows at 17.78 one-row forwards, as one measurement under a load of 4.3 gave it) is put on
the session's SmolLM2 for the thread count in use, with probes switched off so that every round stays paused; the
default draft then drafts nothing, and the run's explanation must say "drafting paused: ..." with the cost it read.
"""
import pytest

from spec_engine.drafters import sizing
from conftest import open_playground, set_number

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.mark.measured_costs              # the drafters read the model's curve: the wrong one put there below
def test_the_page_says_drafting_is_paused_with_the_numbers(playground, chromium, smollm2):
    model = smollm2.model
    curves = getattr(model, sizing._ATTRIBUTE, None)
    if curves is None:
        curves = {}
        object.__setattr__(model, sizing._ATTRIBUTE, curves)
    key = sizing.curve_key(model)
    before = curves.get(key)
    curves[key] = sizing.CostCurve((0.0, 1.0) + (17.78,) * 16, unsure="4 rows cost 17.78 one-row forwards",
                                   probe_every=10**9)
    page = open_playground(chromium, playground)
    try:
        page.fill("#spec-prompt textarea", "Say hello to the verify-cost curve, twice.")   # shared with no other run
        set_number(page, "#spec-max-new", 12)
        page.click("#spec-run")
        page.wait_for_function("document.querySelector('#spec-explain')?.innerText.includes('drafting paused:')",
                               timeout=180_000)
        text = page.inner_text("#spec-explain")
        assert "drafted nothing because the verify cost said so" in text
        assert "one-token forwards on this machine (measured at start-up, unsure: 4 rows cost 17.78" in text
    finally:
        page.close()
        if before is None:
            curves.pop(key, None)
        else:
            curves[key] = before
