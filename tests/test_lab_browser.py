"""The Exactness lab in a real browser (Debian's headless Chromium via PyPI playwright): open the tab, run a small
N on the toy pair, and see both histograms drawn by Plotly with data, and the table of tests.

Skips (with the reason) only when /usr/bin/chromium is absent (the `chromium` fixture).
"""

import pytest

import spec_engine as se
from conftest import PLOT_DATA, set_number
from spec_engine.classroom import lab, toy
from ui.views import lab_plots

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]


def test_exactness_lab_draws_both_histograms(page, tmp_path):
    page.get_by_role("tab", name="Exactness lab").click()
    page.wait_for_selector("#lab-run", state="visible", timeout=30_000)
    set_number(page, "#lab-n", "50")
    set_number(page, "#lab-depth", "1")
    page.click("#lab-run")
    page.wait_for_function("document.querySelector('#lab-status').innerText.includes('Done')", timeout=120_000)
    assert "toy pair" in page.inner_text("#lab-status")

    for plot, samplers, count in (("#lab-plot-exact", "speculative, strict (target's own draw)", 5),
                                  ("#lab-plot-wrong", "speculative, no residual (wrong)", 5)):
        page.wait_for_function(f"({PLOT_DATA.format(plot)})?.length === {count}", timeout=30_000)
        traces = page.evaluate(f"({PLOT_DATA.format(plot)}).map(t => [t.name, t.y.length, t.type])")
        assert traces[0][0] == "exact (from the model)" and samplers in [t[0] for t in traces]
        assert all(kind == "bar" and n >= 2 for _, n, kind in traces)
        assert page.locator(f"{plot} .js-plotly-plot .bars path").count() >= 6       # bars are drawn

    # Every rule side by side, and the numbers on the page are the engine's: the same draws made here directly.
    table = page.inner_text("#lab-table")
    pair = toy.toy_pair()
    prompt, sampling = pair.encode(toy.DEFAULT_PROMPT), se.SamplingParams(1.0, top_p=0.8)
    exact = lab.exact_distribution(pair.target.model, prompt[0].tolist(), 1, sampling)
    for sampler in lab.SAMPLERS:
        assert lab_plots.SAMPLER_NAMES[sampler] in table, sampler
        for draws in lab.draw(pair.target.model, lambda: se.ModelDrafter(pair.draft.model), prompt, 1, 2, sampling,
                              50, sampler, seed=0):
            pass
        report = lab.report(exact, draws)
        assert lab_plots.one_line(report) in table and f"{report.tv:.4f}".rstrip("0") in table, sampler
    page.screenshot(path=str(tmp_path / "exactness-lab.png"), full_page=True)


def test_lab_endpoints_answer_over_http(playground):
    """api_name="lab_exactness" and "lab_sweep" as a remote caller sees them (gradio_client, no browser)."""
    from gradio_client import Client
    client = Client(playground, verbose=False)
    status, exact_plot, wrong_plot, table = client.predict(
        "toy", "the cat", 50, 1, 2, 1.0, 0.9, 0, 0, True, "next", "Hi", "smollm2-135m-instruct", "layer-skip", True,
        "", 0, api_name="/lab_exactness")
    assert "Done: 400 continuations" in status                  # plain and the seven chain rules, 50 each
    assert [row[0] for row in table["data"]][1] == "speculative, exact rule"
    with pytest.raises(Exception, match="needs sampling"):
        client.predict("toy", "the cat", 50, 1, 2, 0, 0.9, 0, 0, True, "next", "Hi", "smollm2-135m-instruct",
                       "layer-skip", True, "", 0, api_name="/lab_exactness")
    status, plot, table = client.predict("k", "1, 2", "Say hi.", "smollm2-135m-instruct", "prompt-lookup", 4, 0, 1.0,
                                         0, 4, 0, "exact", True, "", 0, api_name="/lab_sweep")
    assert status.startswith("Done: 2 settings, 6 runs") and len(table["data"]) == 2     # 3 repeats by default
