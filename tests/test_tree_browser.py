"""Draft trees in a real browser (Debian's headless Chromium via PyPI playwright): run a tree draft in the app and
see the Draft tree view drawn by Plotly, step a tree round in the step-through and see its tree, then run the
exactness lab with tree drafts and see the wrong tree rule in its figure and table.

Skips (with the reason) only when /usr/bin/chromium is absent (the `chromium` fixture).
"""
import pytest

from conftest import PLOT_DATA, set_number

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]


def test_a_tree_draft_runs_steps_and_goes_through_the_lab(page, tmp_path):
    page.click("#spec-draft input")
    page.click("li[data-testid=dropdown-option]:has-text('Layer-skip tree')")
    page.wait_for_function("document.querySelector('#spec-draft-info').innerText.includes('tree')", timeout=30_000)
    set_number(page, "#spec-max-new", "10")
    page.get_by_label("Measure the speedup after each run (nothing drawn)").uncheck()
    page.click("#spec-run")
    page.wait_for_function("document.querySelector('#spec-stats').innerText.includes('Run 1 finished')",
                           timeout=180_000)
    assert page.locator("#spec-tokens .tokens .round.tree").count() >= 1

    # The Draft tree tab: every node kind the rounds had, with escaped hover text carrying p and q.
    page.get_by_role("tab", name="Draft tree").click()
    plot = PLOT_DATA.format("#plot-tree")
    page.wait_for_function(f"({plot})?.length >= 4", timeout=30_000)
    traces = page.evaluate(f"({plot}).map(t => [t.name, (t.hovertext || []).join(' ')])")
    names = [name for name, _ in traces]
    assert any(name.startswith("accepted") for name in names) and any(name.startswith("root") for name in names)
    hover = " ".join(text for name, text in traces if name.startswith(("accepted", "rejected")))
    assert "p(x) target" in hover and "q(x) draft" in hover
    assert page.locator("#plot-tree .js-plotly-plot .scatterlayer .point").count() >= 4          # nodes drawn
    page.screenshot(path=str(tmp_path / "tree-view.png"))

    # The step-through shows a tree round's tree, its table and which KV entries were kept.
    page.get_by_role("tab", name="Step through").click()
    page.click("#step-forward")
    page.wait_for_function("document.querySelector('#step-round')?.innerText.includes('a draft tree of')",
                           timeout=90_000)
    page.wait_for_function(f"({PLOT_DATA.format('#step-tree')})?.length >= 3", timeout=30_000)
    assert "keep_path kept" in page.inner_text("#step-kv")
    rows = page.evaluate("[...document.querySelectorAll('#step-round tr[class]')].map(r => r.className)")
    assert set(rows) <= {"accepted", "rejected", "discarded", "correction", "bonus"} and rows[-1] in ("correction",
                                                                                                        "bonus")

    # The exactness lab with tree drafts: the exact rules (exact, strict) and the others (typical, best sibling).
    page.get_by_role("tab", name="Exactness lab").click()
    page.wait_for_selector("#lab-run", state="visible", timeout=30_000)
    set_number(page, "#lab-n", "50")
    set_number(page, "#lab-depth", "1")
    page.locator("#lab-shape label", has_text="tree:").click()
    page.click("#lab-run")
    page.wait_for_function("document.querySelector('#lab-status').innerText.includes('Done')", timeout=120_000)
    assert "draft trees" in page.inner_text("#lab-status")
    page.wait_for_function(f"({PLOT_DATA.format('#lab-plot-wrong')})?.length === 3", timeout=30_000)
    wrong = page.evaluate(f"({PLOT_DATA.format('#lab-plot-wrong')}).map(t => t.name)")
    assert "speculative tree, best sibling (wrong)" in wrong
    assert "speculative, typical acceptance (Medusa, lossy)" in wrong          # typical judges trees too (#37)
    assert "best sibling" in page.inner_text("#lab-table")
