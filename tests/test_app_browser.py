"""A real browser: Debian's headless Chromium driven by PyPI playwright against the launched app.

Skips (with the reason) only when /usr/bin/chromium is absent (the `chromium` fixture).
"""
import time

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from conftest import ENDLESS, slowed_rounds, start_endless_run
from ui.playground import handlers

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]


def token_count(page) -> int:
    """Every token span shown: committed ones and the rejected or discarded drafts beside them."""
    return page.evaluate("document.querySelectorAll('#spec-tokens .tokens .tok').length")


def committed_count(page) -> int:
    """The tokens the run has committed (accepted drafts, corrections, bonus tokens): what max_new bounds."""
    return page.evaluate("document.querySelectorAll('#spec-tokens .tokens .tok:is(.accepted, .correction, .bonus)')"
                         ".length")


def test_run_hover_stop_in_a_browser(page, tmp_path):
    # A run that cannot end by itself before Stop: greedy ENDLESS does not reach EOS within 600 tokens, and its rounds
    # are slowed to 0.25 s (conftest.slowed_rounds), so it is still streaming through the hover checks however fast
    # the host decodes, and Stop then ends it. (Unslowed, a fast host decoded all 600 tokens during the hover checks,
    # and on a loaded one the page redrew so often that the Stop click waited 30 s for a stable button: CI of
    # 2026-12-07.)
    with slowed_rounds():
        session = start_endless_run(page)
        record = session.active.record

        # Coloured tokens stream in, round by round.
        kinds = set(page.evaluate("[...document.querySelectorAll('#spec-tokens .tokens .tok')]"
                                  ".map(e => e.dataset.kind)"))
        assert kinds & {"accepted", "correction", "bonus"}
        background = page.evaluate("getComputedStyle(document.querySelector('#spec-tokens .tokens .tok'))"
                                   ".backgroundColor")
        assert background not in ("", "rgba(0, 0, 0, 0)", "transparent")

        # The plots are drawn by Plotly with data.
        page.wait_for_selector("#plot-acceptance .js-plotly-plot", timeout=60_000)
        page.wait_for_function("document.querySelector('#plot-acceptance .js-plotly-plot').data?.length >= 2",
                               timeout=60_000)

        # Hovering a token shows its tooltip: a floating box filled from data-tip (the CSS ::after fallback is
        # switched off once the script runs). Tokens keep streaming while we hover, so the page may re-render
        # under the pointer: read the floating tooltip and the tip of the element actually hovered in one
        # evaluation, retrying if a re-render came between.
        floating = page.locator("#spec-tip")
        hovered = ("() => { const t = document.querySelector('#spec-tokens .tokens .tok:hover');"
                   " return [document.querySelector('#spec-tip')?.innerText ?? '', t ? t.dataset.tip : null]; }")
        # The boxes are read in the same attempt: a re-render after the evaluation can hide the tooltip again.
        for _ in range(10):
            token = page.locator("#spec-tokens .tokens .tok").first
            try:    # a re-render can also move the token away while it is hovered, or hide the box before it shows
                token.hover(timeout=10_000)
                floating.wait_for(state="visible", timeout=5_000)
            except PlaywrightTimeoutError:
                shown = tip = box = anchor = None
                continue
            shown, tip = page.evaluate(hovered)
            box, anchor = floating.bounding_box(), token.bounding_box()
            if tip and shown.split() == tip.split() and box and anchor:
                break
            page.mouse.move(0, 0)
            time.sleep(0.3)
        assert tip and "p(x)" in tip and "q(x)" in tip
        assert shown.replace("\n", " ").split() == tip.replace("\n", " ").split()
        assert abs(box["x"] - anchor["x"]) < 500 and box["width"] > 100
        page.screenshot(path=str(tmp_path / "playground-running.png"), full_page=True)

        # Stop ends the run within about one round and says so.
        stats = "document.querySelector('#spec-stats').innerText"
        assert "Decoding" in page.evaluate(stats)
        page.click("#spec-stop", timeout=120_000)          # the page redraws every round: slow on loaded cores
        page.wait_for_function(f"{stats}.includes('Stopped after')", timeout=30_000)
    # The stopped view is sent again STOP_REASSERT_SECONDS later (a live update computed before the click may land
    # after the first one); from then on nothing changes.
    time.sleep(handlers.STOP_REASSERT_SECONDS + 0.5)
    assert "Stopped after" in page.evaluate(stats)
    shown_at_stop, committed_at_stop = token_count(page), committed_count(page)
    time.sleep(2.0)
    assert (token_count(page), committed_count(page)) == (shown_at_stop, committed_at_stop)
    # Stopped before its token budget (rejected drafts are shown too, so the spans alone may pass it).
    assert record.stop_reason == "cancelled" and 0 < committed_at_stop == len(record.tokens) < 600
    page.screenshot(path=str(tmp_path / "playground-stopped.png"), full_page=True)
    assert (tmp_path / "playground-stopped.png").stat().st_size > 10_000


HOSTILE_PROMPT = ('Repeat this exactly: <img src=x onerror="window.__pwned=1">'
                  '<script>window.__pwned=2</script><b id="injected">bold</b> & "quotes"')


def test_html_in_the_prompt_stays_inert_text(page):
    page.fill("#spec-prompt textarea", HOSTILE_PROMPT)
    max_new = page.locator("#spec-max-new input[type=number]")
    max_new.fill("12")
    max_new.press("Enter")
    page.click("#spec-run")
    page.wait_for_function("document.querySelector('#spec-stats').innerText.includes('finished') && "
                           "document.querySelector('#spec-tokens .ptext').textContent.includes('Repeat this exactly')",
                           timeout=120_000)                               # this run's result, not the previous one's
    assert page.evaluate("window.__pwned") is None                        # neither handler nor script ran
    injected = "document.querySelectorAll('#spec-tokens img, #spec-tokens script, #injected').length"
    assert page.evaluate(injected) == 0
    shown = page.evaluate("document.querySelector('#spec-tokens .ptext').textContent")
    assert '<script>window.__pwned=2</script>' in shown and '<img src=x onerror="window.__pwned=1">' in shown
    tips = page.evaluate("[...document.querySelectorAll('#spec-tokens .tok')].map(t => t.dataset.tip)")
    assert tips and all("p(x)" in tip or "token" in tip for tip in tips)   # attributes survived as text
    time.sleep(1.0)
    assert page.evaluate("window.__pwned") is None


def test_a_waiting_run_shows_its_place_in_the_queue(page, playground):
    from gradio_client import Client

    from conftest import slowed_rounds
    from ui.playground import handlers
    # a run that cannot end by itself within the test (a short answer ended, and was measured, before the click)
    values = dict(prompt=ENDLESS, target="smollm2-135m-instruct", draft="prompt-lookup",
                  k=4, temperature=0, top_p=1.0, top_k=0, max_new_tokens=600, seed=0, rule="exact", chat=True,
                  skip_layers="", exit_after=0, auto_baseline=False, show_spaces=False)
    other = Client(playground, verbose=False)                     # another visitor holds the model queue
    with slowed_rounds():
        job = other.submit(*[values[n] for n in handlers.RUN_INPUTS], api_name="/run")
        summary = handlers.RUN_OUTPUTS.index("summary")
        for out in job:
            if isinstance(out[summary], dict) and out[summary].get("rounds", 0) >= 1:
                break
        page.click("#spec-run")
        # runs wait at the engine's gate (ui/playground/coalesce.py), which says where the page stands in line
        page.wait_for_function("/position \\d+ of \\d+ in line/.test(document.body.innerText)", timeout=30_000)
        assert not job.done()                                      # the other run still held the queue
        job.cancel()
    page.wait_for_function("document.querySelector('#spec-stats').innerText.includes('finished')", timeout=120_000)


def test_closing_the_tab_ends_its_run_on_the_server(page, playground):
    from conftest import slowed_rounds, start_endless_run
    from ui.playground import registry as reg
    tab = page.context.browser.new_page()
    tab.goto(playground)
    tab.wait_for_selector("#spec-run", timeout=60_000)
    with slowed_rounds():
        running = [start_endless_run(tab)]             # a run that cannot end by itself before the tab closes
        tab.close()
        record = running[0].active.record
        deadline = time.monotonic() + 30
        while running[0].active.work is not None and time.monotonic() < deadline:
            time.sleep(0.1)
    assert running[0].active.work is None                          # released: GPU function closed, caches dropped
    assert record.stop_reason == "cancelled" and len(record.tokens) < 600   # ended by the closed tab, not by itself
    assert reg.REGISTRY.holds("smollm2-135m-instruct") == 0


def animation_frames(page, seconds: float) -> int:
    """Animation frames the page ran in `seconds` (Chromium's timeline: every requestAnimationFrame callback fired,
    whoever asked for it)."""
    import json
    browser = page.context.browser
    browser.start_tracing(page=page, categories=["devtools.timeline"])
    time.sleep(seconds)
    trace = json.loads(browser.stop_tracing())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return sum(event.get("name") == "FireAnimationFrame" for event in events)


def test_an_idle_page_asks_for_no_frames(page):
    """ui/page_head.py. Without its script, Gradio's status tracker of the page's loading screen keeps asking for a
    frame 60 times a second after the page has loaded (Gradio 6.31, this page idle: 60-160 frames every second),
    which cost the engine beside it about a tenth of its speedup. With it, the page settles to no frames at all."""
    page.wait_for_function("document.querySelector('#spec-model-status')?.innerText.startsWith('Models:') && "
                           "!document.querySelector('[data-testid=status-tracker]:not(.hide)')", timeout=300_000)
    counts = page.evaluate("() => window.__specFrames")
    # it ran before Gradio's modules: their timers went through it
    assert counts is not None and counts["timer"] >= 1
    frames = []
    while len(frames) < 8 and (not frames or frames[-1] > 2):   # a finished run's last redraws settle within seconds
        frames.append(animation_frames(page, 1.0))
    assert frames[-1] <= 2, f"an idle page keeps drawing: animation frames in each second {frames}"
