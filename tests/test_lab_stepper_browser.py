"""The classroom tabs in a real browser (Debian's headless Chromium, PyPI playwright): step three rounds, export
the step-through as a trace (a real download), load it back through the upload button, and see the replay
render the same tokens; then load the shipped example trace.

Skips (with the reason) only when /usr/bin/chromium is absent (the `chromium` fixture).
"""
import json

import pytest

from conftest import open_playground

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

@pytest.fixture(scope="module")
def page(playground, chromium):
    page = open_playground(chromium, playground, accept_downloads=True)
    yield page
    page.close()


def rounds_in(page, view: str) -> int:
    return page.evaluate(f"document.querySelectorAll('#{view} .tokens .round').length")


def test_step_three_rounds_then_export_and_replay_the_trace(page, tmp_path):
    max_new = page.locator("#spec-max-new input[type=number]")
    max_new.fill("40")
    max_new.press("Enter")
    page.get_by_role("tab", name="Step through").click()
    for n in (1, 2, 3):
        page.click("#step-forward")
        page.wait_for_function(f"document.querySelectorAll('#step-tokens .tokens .round').length === {n}",
                               timeout=60_000)
    assert "Round 3 of 3 recorded" in page.inner_text("#step-status")
    rows = page.evaluate("[...document.querySelectorAll('#step-round tr[class]')].map(r => r.className)")
    assert rows and set(rows) <= {"accepted", "rejected", "discarded", "correction", "bonus"}
    assert rows[-1] in ("correction", "bonus")
    assert "KV cache, round 3" in page.inner_text("#step-kv")
    page.wait_for_function("document.querySelector('#step-residual .js-plotly-plot')?.data?.length >= 1",
                           timeout=30_000)
    assert "3 rounds (one target forward each)" in page.inner_text("#step-explain")

    # Back shows the earlier round without computing; Forward comes back to the third.
    page.click("#step-back")
    page.wait_for_function("document.querySelectorAll('#step-tokens .tokens .round').length === 2", timeout=30_000)
    page.click("#step-forward")
    page.wait_for_function("document.querySelectorAll('#step-tokens .tokens .round').length === 3", timeout=30_000)
    stepped = page.inner_html("#step-tokens .tokens")

    # Export the step-through: a real download of a valid trace.
    page.get_by_role("tab", name="Trace export / replay").click()
    page.click("#trace-export-steps")
    link = page.locator("#trace-file a[download]").first
    link.wait_for(timeout=30_000)
    with page.expect_download(timeout=30_000) as info:
        link.click()
    path = tmp_path / "trace.json"
    info.value.save_as(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "spec-decoding-trace" and doc["source"] == "step-through" and len(doc["rounds"]) == 3

    # Load it back: the replay renders the same three rounds, token for token.
    page.set_input_files("input[type=file][data-testid='Load a trace (.json)-upload-button']", str(path))
    page.wait_for_function("document.querySelectorAll('#trace-tokens .tokens .round').length === 3", timeout=60_000)
    assert page.inner_html("#trace-tokens .tokens") == stepped
    assert "Replaying a trace (step-through" in page.inner_text("#trace-status")
    assert "3 rounds (one target forward each)" in page.inner_text("#trace-explain")

    # The shipped example replays too, with its stats.
    page.click("#trace-example")
    page.wait_for_function("document.querySelector('#trace-status').innerText.includes('(run, recorded')",
                           timeout=60_000)
    assert rounds_in(page, "trace-tokens") == len(json.loads(open("presets/traces/example.json").read())["rounds"])
    assert "speedup" in page.inner_text("#trace-stats")
    page.screenshot(path=str(tmp_path / "trace-replay.png"), full_page=True)


def test_step_and_replay_over_the_api(playground):
    """The same endpoints for a remote caller (gradio_client): /step keeps its session, /trace_replay takes a file."""
    from gradio_client import Client, handle_file
    client = Client(playground, verbose=False)
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/step", "/step_reset", "/trace_export", "/trace_replay"} <= names
    controls = ["Name three colours.", "smollm2-135m-instruct", "layer-skip", 3, 0, 1.0, 0, 12, 0, "exact", True, "", 0,
                False]
    for n in (1, 2):
        status = client.predict(*controls, api_name="/step")[0]
        assert f"Round {n} of {n} recorded" in status
    replayed = client.predict(handle_file("presets/traces/example.json"), api_name="/trace_replay")
    assert "Replaying a trace" in replayed[0] and 'class="round"' in replayed[1]


def test_finders_jump_to_the_round_the_lesson_needs(page):
    """'Next round rejecting draft i' and 'Next all-accepted round' stop at such a round, or say the run ended
    without one; the KV view shows how much each cache grew, with its sign."""
    max_new = page.locator("#spec-max-new input[type=number]")
    max_new.fill("40")
    max_new.press("Enter")
    page.get_by_role("tab", name="Step through").click()
    page.click("#step-reset")
    page.wait_for_function("document.querySelector('#step-status').innerText.includes('Round 0 of 0 recorded')",
                           timeout=60_000)
    position = page.locator("#step-position input[type=number]")
    position.fill("1")
    position.press("Enter")
    page.click("#step-find-rejection")
    page.wait_for_function("document.querySelector('#step-round').innerText.includes('First rejection at position 1')"
                           " || document.querySelector('#step-status').innerText.includes('No round')", timeout=90_000)
    assert "First rejection at position 1" in page.inner_text("#step-round"), page.inner_text("#step-status")
    kv = page.inner_text("#step-kv")
    assert "grew" in kv and "Grew: the change since the previous round" in kv
    assert "--" not in kv and "trimmed -" not in kv

    page.click("#step-find-accepted")
    page.wait_for_function("document.querySelector('#step-round').innerText.includes('All draft tokens accepted')"
                           " || document.querySelector('#step-status').innerText.includes('No round with every')",
                           timeout=90_000)
    status = page.inner_text("#step-status")
    assert ("All draft tokens accepted" in page.inner_text("#step-round")) != ("No round with every" in status)
