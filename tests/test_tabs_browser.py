"""The lower tab bar in a real browser (Debian's headless Chromium via PyPI playwright): clicking each tab shows
that tab's own content and never relabels a tab. A non-Tab component created directly inside a `gr.Tabs` (a
`gr.State`, say) shifts the frontend's tab bookkeeping: "Step through" then relabelled "Exactness lab" two tabs
on, and the lab became unreachable until a reload.

Skips (with the reason) only when /usr/bin/chromium is absent (the `chromium` fixture).
"""
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

# Each lower tab, in order, and something only that tab shows.
LOWER_TABS = {
    "Compare runs": "#plot-compare",
    "KV cache": "#plot-kv",
    "Tokenizer mismatch": "#spec-mismatch",
    "Step through": "#step-forward",
    "Trace export / replay": "#trace-export",
    "Exactness lab": "#lab-run",
    "Sweeps": "#sweep-run",
    "What if: a GPU": "#whatif-result",
    "Three ways to share a weight read": "#three-ways-measure",
    "About": "text=the k proposals of a round",
}

LABELS_JS = """() => {
    const bars = [...document.querySelectorAll('[role=tablist]')]
        .filter(bar => [...bar.querySelectorAll('[role=tab]')].some(tab => tab.innerText.trim() === 'Compare runs'));
    return bars.map(bar => [...bar.querySelectorAll('[role=tab]')].map(tab => tab.innerText.trim()));
}"""


def lower_labels(page) -> list[str]:
    # The lower tab bar renders after the page's first paint: wait for it (a clean clone's CI once read none yet).
    page.wait_for_function(f"({LABELS_JS})().length > 0", timeout=30_000)
    bars = page.evaluate(LABELS_JS)
    assert len(bars) == 1, bars
    return bars[0]


def test_every_lower_tab_keeps_its_label_and_shows_its_own_content(page):
    assert lower_labels(page) == list(LOWER_TABS)
    bar = page.locator("[role=tablist]", has=page.get_by_role("tab", name="Compare runs", exact=True))
    for _ in range(2):                                                   # twice round: after every tab was visited
        for label, content in LOWER_TABS.items():
            bar.get_by_role("tab", name=label, exact=True).click()
            page.locator(content).first.wait_for(state="visible", timeout=10_000)
            assert lower_labels(page) == list(LOWER_TABS), f"after clicking {label!r}"
            selected = bar.locator("[role=tab][aria-selected=true]")
            assert selected.count() == 1 and selected.inner_text().strip() == label
            for other, other_content in LOWER_TABS.items():
                if other != label:
                    assert not page.locator(other_content).first.is_visible(), f"{other!r} shown with {label!r}"


def test_the_mismatch_tab_runs_all_four_drafts_and_naive_ids_come_lowest(page, playground_registry, gemma,
                                                                         monkeypatch):
    """The Tokenizer-mismatch tab's four runs each run to their end (they shared one budget that the first run's
    release cancelled, so three stopped after one round) and the chart's lowest bar is the naive ids."""
    from ui.playground import mismatch
    playground_registry.put(gemma)
    monkeypatch.setattr(mismatch, "MISMATCH_MAX_NEW_TOKENS", 12)
    page.get_by_role("tab", name="Tokenizer mismatch", exact=True).click()
    page.click("#spec-mismatch")
    page.wait_for_function("document.body.innerText.includes('Done: hover the tokens')", timeout=600_000)
    heads = page.evaluate("[...document.querySelectorAll('.mm-head')].map(e => e.innerText)")
    assert len(heads) == 4
    acceptance = [float(h.split("acceptance ")[1].split("%")[0]) for h in heads]
    assert acceptance[0] == min(acceptance) and acceptance[0] < max(acceptance), heads
    rounds = page.evaluate("[...document.querySelectorAll('.mm-box')].map(b => b.querySelectorAll('.round').length)")
    assert all(n >= 2 for n in rounds), f"a draft stopped after one round: {rounds}"
    bars = page.evaluate("""() => { const plot = [...document.querySelectorAll('.js-plotly-plot')]
        .find(p => (p.data || []).some(t => (t.x || []).some(x => String(x).includes('naive'))));
        return plot ? plot.data[0].y : null; }""")
    assert bars is not None and bars[0] == min(bars), bars


# The labels of every tab a visitor can see and click in place: shown, inside the window, and hit-testing to itself
# (a tab moved into Gradio's "⋯" overflow menu is in no tab bar at all).
SHOWN_TABS_JS = """() => [...document.querySelectorAll('[role=tablist] [role=tab]')].filter((tab) => {
    const box = tab.getBoundingClientRect();
    if (box.width === 0 || box.left < 0 || box.right > window.innerWidth) return false;
    tab.scrollIntoView({block: 'center', inline: 'nearest'});
    const now = tab.getBoundingClientRect();
    const hit = document.elementFromPoint(now.left + now.width / 2, now.top + now.height / 2);
    return hit !== null && (hit === tab || tab.contains(hit));
}).map((tab) => tab.innerText.trim())"""


def test_every_tab_is_in_its_bar_at_1024_wide(playground, chromium):
    """At 1024x768 (a classroom laptop or projector) Sweeps, What if and About hid behind the "⋯" menu."""
    page = chromium.new_page(viewport={"width": 1024, "height": 768})
    try:
        page.goto(playground)
        page.wait_for_selector("#spec-run", timeout=60_000)
        expected = ["Tokens", "Draft tree", "Generated text", "Run details (JSON)", *LOWER_TABS]
        try:                                            # the bars settle once the page has measured them
            page.wait_for_function(f"({SHOWN_TABS_JS})().length === {len(expected)}", timeout=10_000)
        except PlaywrightTimeout:
            pass
        assert page.evaluate(SHOWN_TABS_JS) == expected
    finally:
        page.close()
