"""The teacher's walkthrough, read at the viewports where it went wrong (a class projector at 1440x1000, a phone at
390x844), in headless Chromium (/usr/bin/chromium through PyPI playwright, as test_lab_browser.py): what a figure or
table draws must lie inside its own box, and a box that scrolls must say so."""
import pytest

from conftest import PLOT_DATA, open_playground, set_number

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

# Every Plotly title and legend of a figure against the figure's own SVG: text past its left, right or top edge is
# cut off, and a title that reaches below the top margin is drawn over the plot.
OVERFLOW = """(sel) => {
    const plot = document.querySelector(sel + ' .js-plotly-plot');
    const box = plot.querySelector('svg.main-svg').getBoundingClientRect(), top = plot._fullLayout.margin.t;
    return [...plot.querySelectorAll('.gtitle, .legendtext')].map(t => {
        const r = t.getBoundingClientRect(), title = t.classList.contains('gtitle');
        return {text: t.textContent, left: Math.round(r.left - box.left), right: Math.round(r.right - box.left),
                top: Math.round(r.top - box.top), bottom: Math.round(r.bottom - box.top), width: Math.round(box.width),
                room: title ? top : Infinity};
    }).filter(t => t.left < 0 || t.right > t.width || t.top < 0 || t.bottom > t.room);
}"""
# The header cells of a Gradio table that end past the right edge of the box the visitor sees it in.
CUT_COLUMNS = """(sel) => {
    const table = document.querySelector(sel);
    const view = table.querySelector('.virtual-table-viewport') || table;
    const edge = Math.min(view.getBoundingClientRect().right, table.getBoundingClientRect().right, innerWidth);
    return [...table.querySelectorAll('thead th')].map(th => [th.innerText.trim(), th.getBoundingClientRect()])
        .filter(([text, r]) => text && r.width > 0 && r.right > edge + 1).map(([text, r]) => text);
}"""


@pytest.fixture
def wide(playground, chromium):
    page = open_playground(chromium, playground, 1440, 1000)
    yield page
    page.close()


def test_the_lab_titles_and_verdicts_fit_at_1440(wide, tmp_path):
    """The lab's right-hand title ran past its plot ("q before warping (tra"), and the table's last columns, the
    verdict and the one-line reading, were cut off at the right of a 1440 px window."""
    page = wide
    page.get_by_role("tab", name="Exactness lab").click()
    page.wait_for_selector("#lab-run", state="visible", timeout=30_000)
    set_number(page, "#lab-n", "50")
    set_number(page, "#lab-depth", "1")
    page.click("#lab-run")
    page.wait_for_function("document.querySelector('#lab-status').innerText.includes('Done')", timeout=180_000)
    page.wait_for_function(f"({PLOT_DATA.format('#lab-plot-wrong')})?.length === 5", timeout=30_000)
    page.screenshot(path=str(tmp_path / "lab-1440.png"), full_page=True)
    for plot in ("#lab-plot-exact", "#lab-plot-wrong"):
        assert page.evaluate(OVERFLOW, plot) == [], plot
    assert page.evaluate(CUT_COLUMNS, "#lab-table") == []
    assert "in one line" in page.inner_text("#lab-table thead")
    page.click("#spec-present input")             # a projector: larger titles, the plots one per row
    page.wait_for_function(f"({PLOT_DATA.format('#lab-plot-wrong')}) && document.querySelector("
                           "'#lab-plot-wrong .js-plotly-plot').layout.meta === 'spec-present'", timeout=10_000)
    page.wait_for_timeout(1000)                   # the title's fit is a second relayout
    for plot in ("#lab-plot-exact", "#lab-plot-wrong"):
        assert page.evaluate(OVERFLOW, plot) == [], plot


MISMATCH_ROWS = [
    ["(a) naive ids: gemma-3-270m:naive-ids", "Gemma 3 270M's token ids, reused as SmolLM2 135M ids", 0.012, 1.05,
     20.3, 38, ""],
    ["(b) cross-tokenizer: gemma-3-270m:cross-tokenizer", "Gemma 3 270M's text, re-tokenized by SmolLM2 135M", 0.41,
     2.1, 12.2, 19, "cross-tokenizer boundary fix; stopped at its share of the time limit (60 s)"],
    ["(c) same tokenizer: prompt-lookup", "SmolLM2 135M ids copied from the context", 0.3, 1.6, 40.2, 25, ""],
    ["(c') same tokenizer: layer-skip", "SmolLM2 135M ids from the target minus some layers", 0.5, 2.0, 30.1, 20, ""]]


@pytest.fixture
def mismatch_page(chromium):
    """The page's tokenizer-mismatch panel (layout.mismatch_panel, launched with the page's own options) showing a
    table of the demo's shape: the demo itself loads a second model for minutes (test_mismatch_browser.py)."""
    import gradio as gr
    import pandas as pd

    from conftest import free_port
    from ui import layout
    from ui.playground import mismatch
    with gr.Blocks() as demo:
        with gr.Tabs():
            with gr.Tab("Tokenizer mismatch"):
                _, mm = layout.mismatch_panel()
        demo.load(lambda: pd.DataFrame(MISMATCH_ROWS, columns=mismatch.MISMATCH_COLUMNS), None, mm["mm_table"])
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **layout.launch_options())
    page = chromium.new_page(viewport={"width": 1440, "height": 1000})
    try:
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_function("(document.querySelector('#spec-mismatch-table')?.innerText || '').includes('naive')",
                               timeout=60_000)
        yield page
    finally:
        page.close()
        demo.close()


def test_the_mismatch_table_keeps_its_last_column_at_1440(mismatch_page):
    """Sized to their content, the two long first columns pushed "note" past the table's right edge at 1440 px."""
    assert mismatch_page.evaluate(CUT_COLUMNS, "#spec-mismatch-table") == []
    assert "note" in mismatch_page.inner_text("#spec-mismatch-table thead")


# The step table's box, its hint, and whether the box scrolls: the hint is shown exactly when the table is wider.
STEP_BOX = """() => {
    const box = document.querySelector('#step-round .scroll'), hint = box.previousElementSibling;
    const r = hint.getBoundingClientRect();
    return {scrolls: box.scrollWidth > box.clientWidth + 1, hinted: hint.classList.contains('scroll-hint'),
            shown: !hint.hidden && r.height > 0 && r.left >= 0 && r.right <= innerWidth, text: hint.innerText};
}"""


def test_the_step_table_says_it_scrolls_on_a_phone(playground, chromium):
    """At 390 px the decision table scrolls sideways inside its box (test_narrow_browser.py), and nothing said so:
    its last column, the decision, sat out of sight. A hint above it says so while, and only while, it scrolls."""
    page = open_playground(chromium, playground, 390, 844)
    try:
        page.get_by_role("tab", name="Step through", exact=True).click()
        page.click("#step-forward")
        page.wait_for_selector("#step-round table th", timeout=120_000)
        page.wait_for_function(f"({STEP_BOX})().shown", timeout=10_000)
        narrow = page.evaluate(STEP_BOX)
        assert narrow["hinted"] and narrow["scrolls"] and "scrolls sideways" in narrow["text"], narrow
        page.set_viewport_size({"width": 1440, "height": 1000})           # room for the table: no hint
        page.wait_for_function(f"!({STEP_BOX})().scrolls", timeout=10_000)
        page.wait_for_function(f"!({STEP_BOX})().shown", timeout=10_000)
    finally:
        page.close()


def test_a_suffix_run_draws_its_drafted_rounds_against_what_they_could_keep(wide):
    """The walkthrough's suffix decoding run (the default prompt, greedy): it drafted in 15 of 53 rounds, the Draft tree
    tab drew six rounds that drafted nothing, and the accepted-per-round chart read "of k = 12" against a dashed 12.
    Now the tab draws rounds that drafted and counts the others, and the chart's line is what each round could keep."""
    page = wide
    page.click("#spec-draft input")
    page.click("li[data-testid=dropdown-option]:has-text('Suffix decoding')")
    page.get_by_label("Measure the speedup after each run (nothing drawn)").uncheck()
    page.click("#spec-run")
    page.wait_for_function("document.querySelector('#spec-stats').innerText.includes('Run 1 finished')",
                           timeout=180_000)
    accepted = page.evaluate("""() => { const p = document.querySelector('#plot-accepted .js-plotly-plot');
        const line = p.data.find(t => t.name.startsWith('most it could keep'));
        return {title: p.layout.title.text, name: line.name, most: Math.max(...line.y)}; }""")
    assert "of a possible" in accepted["title"] and "k =" not in accepted["title"], accepted
    assert "a tree: its depth" in accepted["name"] and accepted["most"] <= 12, accepted
    assert page.evaluate(OVERFLOW, "#plot-accepted") == []
    page.get_by_role("tab", name="Draft tree").click()
    page.wait_for_function(f"({PLOT_DATA.format('#plot-tree')})?.length >= 3", timeout=30_000)
    tree = page.evaluate("""() => { const p = document.querySelector('#plot-tree .js-plotly-plot');
        return {title: p.layout.title.text, nodes: p.data.filter(t => /^(accepted|rejected)/.test(t.name))
            .reduce((n, t) => n + t.x.length, 0)}; }""")
    assert "tree rounds drafted nothing, not drawn" in tree["title"] and tree["nodes"] >= 6, tree   # 6 drafted rounds
    assert page.evaluate(OVERFLOW, "#plot-tree") == []
    assert "suffix" in page.inner_text("#spec-tree-tab")                      # the caption names suffix trees
