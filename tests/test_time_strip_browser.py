"""Issue #35 in a real browser (Debian's headless Chromium via PyPI playwright): the "where the time goes" strip
says it will appear, then, once the speed is measured, shows each round's draft, verify and overhead in plain steps,
and those are the engine's clocks of the timed run over the mean plain step the session recorded for the run.

Skips (with the reason) only when /usr/bin/chromium is absent (the `chromium` fixture).
"""
import statistics

import pytest

from conftest import app_sessions, open_playground, set_number
from ui.views import plots

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

strip = "document.querySelector('#plot-time .js-plotly-plot')"     # the Plotly div (its data and layout)
MAX_NEW = 14            # small, and unlike the other browser tests' runs, so this test finds its own record


def test_the_time_strip_shows_the_timed_runs_clocks_in_plain_steps(playground, chromium):
    page = open_playground(chromium, playground)
    try:
        page.wait_for_function(f"({strip})?.layout?.annotations?.length > 0", timeout=60_000)
        pending = page.evaluate(f"({strip}).layout.annotations[0].text")
        assert pending == plots.TIME_PENDING
        set_number(page, "#spec-max-new", MAX_NEW)
        page.click("#spec-run")
        page.wait_for_function(f"({strip})?.data?.length === 5", timeout=300_000)      # after the speed measurement
        records = [r for s in app_sessions() for r in s.history if r.settings.max_new_tokens == MAX_NEW]
        assert len(records) == 1
        record = records[0]
        assert record.timing is not None and record.plain is not None
        step = statistics.fmean(record.plain[0].step_seconds)
        timed = record.timing.rounds
        shown = dict(page.evaluate(f"({strip}).data.map(t => [t.name, t.y])"))
        assert shown["draft"] == pytest.approx([r.draft_seconds / step for r in timed], rel=1e-9)
        assert shown["verify"] == pytest.approx([r.verify_seconds / step for r in timed], rel=1e-9)
        assert shown["overhead"] == pytest.approx(
            [max(0.0, r.round_seconds - r.draft_seconds - r.verify_seconds) / step for r in timed], rel=1e-9)
        assert shown["tokens emitted"] == [len(r.emitted) for r in timed]
        # the timed run, not the live one drawn in the browser (same rounds, other clocks)
        assert shown["draft"] != pytest.approx([r.draft_seconds / step for r in record.rounds], rel=1e-9)
        title = page.evaluate(f"({strip}).layout.title.text")
        assert title.startswith(plots.TIME_TITLE) and f"1 step = {1000 * step:.1f} ms" in title
        assert page.locator("#spec-time-caption").is_visible()
    finally:
        page.close()
