"""The playground on a phone-sized screen (390x844, issue #38) in headless Chromium: the results follow Run instead
of coming after every control, and the step-through's decision table keeps each column reachable (it scrolls
sideways inside its own box). As test_ui_presets_browser.py: /usr/bin/chromium through PyPI playwright."""
import pytest

from conftest import open_playground

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

WIDTH, HEIGHT = 390, 844


@pytest.fixture
def page(playground, chromium):
    page = open_playground(chromium, playground, WIDTH, HEIGHT)
    yield page
    page.close()


def page_top(page, selector: str) -> float:
    return page.evaluate("(sel) => document.querySelector(sel).getBoundingClientRect().top + window.scrollY", selector)


def test_the_results_follow_run_on_a_narrow_screen(page):
    """With Run scrolled to the top of the window, the numbers and the first 100 px of the token view are on that
    same screen (they came about 1,870 px below Run, after the prompt, the models, the sliders and every option)."""
    run_top = page_top(page, "#spec-run")
    below = {sel: round(page_top(page, sel) - run_top) for sel in ("#spec-stats", "#spec-tokens")}
    assert 0 < below["#spec-stats"] < below["#spec-tokens"] <= HEIGHT - 100, below
    assert page_top(page, "#spec-prompt") > page_top(page, "#spec-tokens")     # the controls come after the results


# Bring the cell to the middle of the window the way a visitor can: scroll the page vertically, then every
# ancestor the visitor can scroll sideways (overflow-x auto or scroll) as far as `side` says. Returns where the
# cell is and whether its centre hit-tests to it (a cell clipped by an ancestor that cannot scroll does not).
REACH = """([sel, side]) => {
    const cell = document.querySelector(sel);
    window.scrollBy(0, cell.getBoundingClientRect().top - window.innerHeight / 2);
    for (let e = cell.parentElement; e; e = e.parentElement) {
        const overflow = getComputedStyle(e).overflowX;
        if (overflow === 'auto' || overflow === 'scroll') e.scrollLeft = side === 'end' ? e.scrollWidth : 0;
    }
    const box = cell.getBoundingClientRect(), x = box.left + box.width / 2, y = box.top + box.height / 2;
    const hit = x >= 0 && x <= window.innerWidth ? document.elementFromPoint(x, y) : null;
    return {left: Math.round(box.left), right: Math.round(box.right),
            hit: hit !== null && (hit === cell || cell.contains(hit)),
            table: Math.round(cell.closest('table').getBoundingClientRect().width),
            box: Math.round(document.querySelector('#step-round').getBoundingClientRect().width)};
}"""


def test_every_column_of_the_step_table_is_reachable_on_a_narrow_screen(page):
    """The decision table (7 columns, about 500 px) in a 300 px column: its last column, the decision, was cut off
    and nothing scrolled to it."""
    page.get_by_role("tab", name="Step through", exact=True).click()
    page.click("#step-forward")
    page.wait_for_selector("#step-round table th", timeout=120_000)
    first = page.evaluate(REACH, ["#step-round table th:first-child", "start"])
    last = page.evaluate(REACH, ["#step-round table th:last-child", "end"])
    assert page.inner_text("#step-round table th:last-child") == "decision"
    assert first["hit"] and last["hit"], (first, last)
    assert 0 <= first["left"] and last["right"] <= WIDTH, (first, last)
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH      # the page itself does not widen
