"""Issue #37 in a real browser (Debian's headless Chromium via PyPI playwright): a run under the strict rule draws
its acceptance by position, and the bars on the page are the engine's numbers for the rounds the session recorded.
(The exactness lab's side-by-side rules are checked in the browser by test_lab_browser.py.)

Skips (with the reason) only when /usr/bin/chromium is absent (the `chromium` fixture).
"""
import pytest

import spec_engine as se
from conftest import PLOT_DATA, app_sessions, open_playground, set_number

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]


def test_a_strict_run_plots_acceptance_by_position_from_the_engines_rounds(playground, chromium):
    page = open_playground(chromium, playground)
    try:
        page.fill("#spec-prompt textarea", "List the days of the week, then list them again.")
        set_number(page, "#spec-max-new", "32")
        page.get_by_label("strict (target's own draw)").check()
        page.click("#spec-run")
        page.wait_for_function("document.querySelector('#spec-stats').innerText.includes('finished')",
                               timeout=120_000)
        records = [r for s in app_sessions() for r in s.history
                   if r.settings.rule == "strict" and r.settings.max_new_tokens == 32]
        assert len(records) == 1
        want = se.acceptance_by_position(records[0].rounds)
        assert want
        page.wait_for_function(f"({PLOT_DATA.format('#plot-position')})?.length === 4", timeout=30_000)
        traces = page.evaluate(f"({PLOT_DATA.format('#plot-position')}).map(t => [t.name, t.y])")
        bars = dict(traces)["α_i measured"]
        assert bars == pytest.approx(want)
        title = page.evaluate("document.querySelector('#plot-position .gtitle').textContent")
        assert f"E = 1 + ΣΠα = {se.expected_tokens_by_position(want):.2f}" in title
    finally:
        page.close()
