"""Share links in a real browser (issue #28): a link taken in one browser session opens in a fresh one (a new
browser context: no cookies, no storage, another Gradio session) with every setting restored and, for a greedy run,
the same tokens; a hostile link is refused with the fields named and nothing of it applied. Headless Chromium at
/usr/bin/chromium, as test_app_browser.py."""
import pytest

from ui.playground import drafts

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.slow]

SCENARIO = "4. Prompt lookup on a quote from the prompt"      # greedy prompt lookup: no draft model to load
FINISHED = "(n) => document.querySelector('#spec-stats')?.innerText.includes(`Run ${n} finished`)"   # n: this session's
COMMITTED = ("[...document.querySelectorAll('#spec-tokens .tokens .tok:is(.accepted, .correction, .bonus)')]"
             ".map(t => t.dataset.tip)")


def new_page(chromium, url: str):
    """A page in its own browser context: what a student who opens a pasted link has."""
    context = chromium.new_context(viewport={"width": 1440, "height": 1000})
    page = context.new_page()
    page.goto(url)
    page.wait_for_selector("#spec-run", timeout=60_000)
    return context, page


def set_number(page, selector: str, value) -> None:
    box = page.locator(f"{selector} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")


def controls(page) -> dict:
    """What the controls show (dropdowns show their labels)."""
    value = lambda sel: page.locator(sel).first.input_value()           # noqa: E731
    return {
        "prompt": value("#spec-prompt textarea"), "draft": value("#spec-draft input"),
        "target": value("#spec-target input"), "scenario": value("#spec-scenario input"),
        "k": value("#spec-k input[type=number]"), "temperature": value("#spec-temperature input[type=number]"),
        "top_p": value("#spec-top-p input[type=number]"), "top_k": value("#spec-top-k input[type=number]"),
        "max_new_tokens": value("#spec-max-new input[type=number]"), "seed": value("#spec-seed input[type=number]"),
        "rule": page.locator("#spec-rule input:checked").first.evaluate("e => e.closest('label').innerText.trim()"),
        "chat": page.locator("#spec-chat input[type=checkbox]").first.is_checked(),
    }


def committed_tips(page) -> list[str]:
    """Each committed token's tooltip names the token and its probabilities: equal lists, equal tokens."""
    return page.evaluate(COMMITTED)


def test_a_shared_link_opens_the_same_settings_and_tokens_in_a_fresh_session(playground, chromium):
    context_a, page = new_page(chromium, playground)
    try:
        page.click("#spec-scenario input")
        page.locator("[role=option]", has_text=SCENARIO).first.click()       # sets every control, and runs
        page.wait_for_function(FINISHED, arg=1, timeout=240_000)
        set_number(page, "#spec-k", 6)
        set_number(page, "#spec-max-new", 36)
        set_number(page, "#spec-seed", 4242)
        set_number(page, "#spec-top-k", 7)
        page.click("#spec-run")
        page.wait_for_function(FINISHED, arg=2, timeout=240_000)
        tokens_a = committed_tips(page)
        assert len(tokens_a) >= 20
        shown_a = controls(page)
        page.get_by_text("Share this setting · run it elsewhere").click()
        page.click("#spec-share")
        page.wait_for_function("document.querySelector('#spec-share-link textarea')?.value.startsWith('http')",
                               timeout=30_000)
        link = page.input_value("#spec-share-link textarea")
        # The copy button (issue #38: there was none) puts the same link on the clipboard.
        context_a.grant_permissions(["clipboard-read", "clipboard-write"], origin=playground.rstrip("/"))
        page.locator("#spec-share-link button[aria-label=Copy]").click()
        assert page.evaluate("navigator.clipboard.readText()") == link
        # The equivalent code follows the settings: k = 6 in the transformers snippet.
        page.get_by_role("tab", name="transformers", exact=True).click()
        page.wait_for_function("document.querySelector('#spec-code-transformers').innerText"
                               ".includes('prompt_lookup_num_tokens=6')", timeout=30_000)
    finally:
        context_a.close()
    assert link.startswith(playground) and "k=6" in link and "scenario=quote-lookup" in link

    context_b, page = new_page(chromium, link)
    try:
        page.wait_for_function("document.querySelector('#spec-k input[type=number]')?.value === '6'",
                               timeout=60_000)
        shown_b = controls(page)
        assert shown_b == shown_a
        assert (shown_b["k"], shown_b["max_new_tokens"], shown_b["seed"], shown_b["top_k"]) == ("6", "36", "4242", "7")
        labels = {value: label for label, value in drafts.draft_choices("smollm2-135m-instruct")}
        assert shown_b["draft"] == labels["prompt-lookup"] and shown_b["scenario"] == SCENARIO
        assert "Which sentence of this text says what the KV cache stores?" in shown_b["prompt"]
        assert "4. Prompt lookup on a quote from the prompt. Look for:" in page.locator("#spec-caption").inner_text()
        page.click("#spec-run")
        page.wait_for_function(FINISHED, arg=1, timeout=240_000)
        assert committed_tips(page) == tokens_a
    finally:
        context_b.close()


def test_a_hostile_link_is_refused_with_the_fields_named_and_nothing_applied(playground, chromium):
    link = (playground + "?k=0&top_p=2&seed=-5&prompt=%3Cimg%20src%3Dx%20onerror%3D%22window.__pwned%3D1%22%3E"
            "&target=%3Cimg%20src%3Dx%20onerror%3D%22window.__pwned%3D2%22%3E")
    context, page = new_page(chromium, link)
    try:
        toast = page.locator(".toast-body", has_text="not applied").first
        toast.wait_for(timeout=60_000)
        text = toast.inner_text()
        assert all(f"{field}:" in text for field in ("target", "k", "top_p", "seed"))
        assert '<img src=x onerror="window.__pwned=2">' in text                    # shown as text
        assert page.evaluate("window.__pwned") is None
        assert page.evaluate("document.querySelectorAll('.toast-body img').length") == 0
        shown = controls(page)
        assert shown["k"] != "0" and shown["top_p"] == "1" and "<img" not in shown["prompt"]    # nothing applied
    finally:
        context.close()
