"""The tokenizer-mismatch lesson on a cold start (issue #38, item 1): a fresh `python app.py`, nothing loaded but the
default target, the demo clicked once at its default 40 tokens. While the other-tokenizer draft loads the page says
what loads; then no run is cut at the time limit (loading does not count against it), naive ids are the lowest of
the four drafts, and re-tokenizing the same draft recovers clearly: its 90% interval over rounds lies above the naive
one's, and the chart says so. A teacher's first click, so it runs a whole `python app.py` and a cold Gemma load: the
full tier (pytest --full)."""
import time

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.full]

STATUS = "document.querySelector('#spec-mismatch-status')?.innerText || ''"
PAIR = """() => { const plot = document.querySelector('#spec-mismatch-plot .js-plotly-plot');
    if (!plot || !plot.data.length) return null;
    const pair = plot.data.filter(t => t.meta === 'pair');
    return {x: pair.flatMap(t => t.x), y: pair.flatMap(t => t.y), interval: pair.flatMap(t => t.customdata),
        others: plot.data.filter(t => t.meta !== 'pair').flatMap(t => t.y),
        notes: (plot.layout.annotations || []).map(a => a.text)}; }"""


def test_a_cold_mismatch_demo_says_what_loads_and_reads_right(fresh_app, chromium):
    from conftest import open_playground
    page = open_playground(chromium, fresh_app)
    try:
        page.get_by_role("tab", name="Tokenizer mismatch", exact=True).click()
        page.click("#spec-mismatch")
        said, deadline = [], time.monotonic() + 900
        while "Done" not in (status := page.evaluate(STATUS)):
            assert time.monotonic() < deadline, f"the demo did not finish: {said[-3:]}"
            if status and (not said or said[-1] != status):
                said.append(status)
            time.sleep(0.5)
        loading = [s for s in said if "Loading Gemma 3 270M" in s]
        assert loading, f"nothing said what was loading: {said[:5]}"
        assert "time limit" not in status, status                # loading did not eat the decoding budget
        table = page.locator("#spec-mismatch-table").inner_text()
        assert "stopped at its share" not in table, table

        chart = page.evaluate(PAIR)
        assert chart is not None and [x[:3] for x in chart["x"]] == ["(a)", "(b)"], chart
        (naive, retok), ((_, naive_high, *_), (retok_low, *_)) = chart["y"], chart["interval"]
        assert naive == min([naive, retok, *chart["others"]]), chart          # naive ids: the lowest of the four
        assert retok_low > naive_high, chart                                    # re-tokenizing: clearly above
        assert chart["notes"] and chart["notes"][0].startswith("re-tokenizing: ") and "noise" not in chart["notes"][0]
    finally:
        page.close()
