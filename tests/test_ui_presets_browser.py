"""The classroom in a real browser (issue #22): choosing a scenario runs it with the results in view, and
presentation mode enlarges what a projector shows. Headless Chromium at /usr/bin/chromium, as test_app_browser.py."""
import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from conftest import open_playground

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

# Prompt lookup needs no draft model: the quickest lesson, and one that runs faster than plain decoding.
SCENARIO = "4. Prompt lookup on a quote from the prompt"
FINISHED = "document.querySelector('#spec-stats').innerText.includes('finished')"
TOKEN = "#spec-tokens .tokens .tok"


def choose_scenario(page, label: str) -> None:
    page.click("#spec-scenario input")
    page.locator("[role=option]", has_text=label).first.click()
    # Playwright scrolls what it clicks into view first, which a visitor's click does not. Once, on a busy machine
    # (two test workers), the page was found 298 px down during the run; whether this click or the page moved it
    # was not established. Back to the top right after the click: a scroll the page makes itself while the scenario
    # runs is still caught (IN_VIEW asks for scrollY 0).
    page.evaluate("window.scrollTo(0, 0)")


# Seen: the page is not scrolled and, for each selector, some matching element's centre lies in the window and
# hit-tests to the element itself (not clipped by the token view's own scrolling, not covered).
IN_VIEW = """(selectors) => window.scrollY === 0 && selectors.every((sel) =>
    [...document.querySelectorAll(sel)].some((e) => {
        const box = e.getBoundingClientRect();
        const x = box.left + box.width / 2, y = box.top + box.height / 2;
        if (box.height === 0 || y < 0 || y > window.innerHeight || x < 0 || x > window.innerWidth) return false;
        const hit = document.elementFromPoint(x, y);
        return hit !== null && (e === hit || e.contains(hit));
    }))"""


WHERE = """(selectors) => selectors.map((sel) => {
    const e = document.querySelector(sel);
    if (!e) return sel + ': missing';
    const b = e.getBoundingClientRect(), hit = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
    return `${sel}: top ${Math.round(b.top)} bottom ${Math.round(b.bottom)}, `
        + `centre hits ${hit ? hit.outerHTML.slice(0, 80) : null}`;
}).concat([`scrollY ${window.scrollY}, window ${window.innerWidth}x${window.innerHeight}`])"""


def wait_in_view(page, *selectors: str, timeout: int = 15_000) -> None:
    """Each selector comes to rest on the first screen within `timeout` ms (the page may still be laying out
    just after the Run button appears); on failure the message says where each element is and what covers it."""
    try:
        page.wait_for_function(IN_VIEW, arg=list(selectors), timeout=timeout)
    except Exception as error:
        raise AssertionError(f"not all in view: {page.evaluate(WHERE, list(selectors))}") from error


def font_px(page, selector: str, pseudo: str | None = None) -> float:
    return page.evaluate("([sel, pseudo]) => "
                         "parseFloat(getComputedStyle(document.querySelector(sel), pseudo).fontSize)",
                         [selector, pseudo])


def test_choosing_a_scenario_runs_it_with_the_results_in_view(playground, chromium):
    page = open_playground(chromium, playground, 1024, 768)
    try:
        wait_in_view(page, "#spec-present", "#spec-scenario", "#spec-run")
        choose_scenario(page, SCENARIO)          # one click: no Run press
        page.wait_for_selector(TOKEN, timeout=180_000)
        assert "KV cache stores" in page.input_value("#spec-prompt textarea")       # the scenario set the controls
        assert "Which sentence of this text" in page.locator("#spec-tokens .ptext").text_content()   # and ran them
        assert "4. Prompt lookup on a quote from the prompt. Look for:" in page.locator("#spec-caption").inner_text()
        # While it runs, the numbers and the tokens are on the first screen (a re-render may replace them between
        # two reads, hence the short wait rather than one read).
        wait_in_view(page, "#spec-stats .spec-stats", TOKEN, timeout=10_000)
        page.wait_for_function(FINISHED, timeout=180_000)
        wait_in_view(page, "#spec-stats .chip", TOKEN, timeout=10_000)
    finally:
        page.close()


def test_presentation_mode_enlarges_tokens_stats_and_plots(playground, chromium, tmp_path):
    page = open_playground(chromium, playground, 1440, 1000)
    try:
        choose_scenario(page, SCENARIO)
        page.wait_for_function(FINISHED, timeout=180_000)
        page.wait_for_selector("#plot-acceptance .xtick text", timeout=60_000)
        sizes = {"token": (TOKEN, None), "stat label": ("#spec-stats .chip .k", None),
                 "round number": ("#spec-tokens .round", "::before"),
                 "plot tick": ("#plot-acceptance .xtick text", None),
                 "axis title": ("#plot-acceptance .g-xtitle text", None)}
        before = {name: font_px(page, *where) for name, where in sizes.items()}
        assert before["token"] == 14 and before["stat label"] == 11 and before["round number"] == 9

        page.click("#spec-present input")
        page.wait_for_function("document.documentElement.classList.contains('spec-present')", timeout=10_000)
        after = {name: font_px(page, *where) for name, where in sizes.items()}
        assert after["token"] >= 22 and after["stat label"] >= 16 and after["round number"] >= 14, after
        assert after["plot tick"] >= 16 and after["axis title"] >= 16, after
        # High contrast that keeps the redundant coding: dark 2 px borders, struck-through rejections, bold
        # corrections and bonuses, dashed discarded drafts (the legend shows every kind).
        legend = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#spec-legend .lg')].map(e => {
            const s = getComputedStyle(e);
            return [e.className.replace('lg', '').trim(), {border: s.borderTopWidth, style: s.borderTopStyle,
                    line: s.textDecorationLine, weight: s.fontWeight, bg: s.backgroundColor}]; }))""")
        assert legend["rejected"]["line"] == "line-through" and legend["discarded"]["style"] == "dashed"
        assert int(legend["correction"]["weight"]) >= 700 and int(legend["bonus"]["weight"]) >= 700
        assert all(style["border"] == "2px" for style in legend.values() if style["bg"] != "rgba(0, 0, 0, 0)")
        assert legend["accepted"]["bg"] == "rgb(74, 222, 128)"                  # saturated, not the pastel
        page.screenshot(path=str(tmp_path / "presentation-mode.png"))

        page.click("#spec-present input")                                       # and back
        page.wait_for_function("!document.documentElement.classList.contains('spec-present')", timeout=10_000)
        assert font_px(page, TOKEN) == 14 and font_px(page, "#plot-acceptance .xtick text") == before["plot tick"]
    finally:
        page.close()


# For each plot shown, what a projector would lose: a title outside the figure (clipped), a legend over the plot
# area, the title or the x-axis title, legend entries on top of each other. Boxes are relative to the figure's SVG.
PLOT_CLASHES = """() => {
    const clashes = [];
    const overlap = (a, b) => a && b && a.left < b.right - 1 && b.left < a.right - 1
        && a.top < b.bottom - 1 && b.top < a.bottom - 1;
    for (const gd of document.querySelectorAll('[id^=plot-] .js-plotly-plot')) {
        if (!gd.offsetParent) continue;
        const id = gd.closest('[id^=plot-]').id, svg = gd.querySelector('.main-svg').getBoundingClientRect();
        const box = (sel) => {
            const e = gd.querySelector(sel);
            if (!e) return null;
            const b = e.getBoundingClientRect();
            return b.width ? {left: b.left - svg.left, right: b.right - svg.left, top: b.top - svg.top,
                              bottom: b.bottom - svg.top} : null;
        };
        const inside = (b) => b.left >= -0.5 && b.top >= -0.5 && b.right <= svg.width + 0.5
            && b.bottom <= svg.height + 0.5;
        const title = box('.gtitle'), legend = box('.legend .bg'), plot = box('.nsewdrag');
        const xtitle = box('.g-xtitle text');
        if (title && !inside(title))
            clashes.push(`${id}: title ${JSON.stringify(title)} outside ${svg.width}x${svg.height}`);
        if (legend && !inside(legend)) clashes.push(`${id}: legend outside the figure`);
        for (const [name, other] of [['plot area', plot], ['title', title], ['x-axis title', xtitle]])
            if (overlap(legend, other)) clashes.push(`${id}: legend over the ${name}`);
        const items = [...gd.querySelectorAll('.legend .traces')].map((e) => e.getBoundingClientRect());
        items.forEach((a, i) => items.slice(i + 1).forEach((b) => {
            if (overlap(a, b)) clashes.push(`${id}: legend entries overlap`);
        }));
    }
    return clashes;
}"""


def test_presentation_mode_fits_plot_titles_and_legends_and_enlarges_the_step_through(playground, chromium):
    """Issue #38 at 1440x1000: in presentation mode the enlarged legends ran into each other and the plots, titles
    were cut off, and the step-through table (13.5 px) and small buttons (12 px) kept their desk sizes."""
    page = open_playground(chromium, playground, 1440, 1000)
    try:
        choose_scenario(page, SCENARIO)
        page.wait_for_function(FINISHED, timeout=180_000)
        page.wait_for_selector("#plot-acceptance .legend .traces", timeout=60_000)
        page.click("#spec-present input")
        page.wait_for_function("document.documentElement.classList.contains('spec-present')", timeout=10_000)
        page.wait_for_function("parseFloat(getComputedStyle(document.querySelector('#plot-acceptance .legendtext'))"
                               ".fontSize) >= 16", timeout=10_000)
        try:                                            # Plotly redraws at the new sizes: let it settle
            page.wait_for_function(f"({PLOT_CLASHES})().length === 0", timeout=10_000)
        except PlaywrightTimeout:
            pass
        assert page.evaluate(PLOT_CLASHES) == []
        assert font_px(page, "#plot-acceptance .gtitle") >= 18

        page.get_by_role("tab", name="Step through", exact=True).click()
        page.click("#step-forward")
        page.wait_for_selector("#step-round table td.decision", timeout=120_000)
        for cell in ("#step-round table td.decision", "#step-round table th", "#step-round .facts"):
            assert font_px(page, cell) >= 18, cell
        for button in ("#step-reset", "#step-forward", "#step-lesson", "#spec-sweep", "#spec-baseline"):
            assert font_px(page, button) >= 16, button
    finally:
        page.close()
