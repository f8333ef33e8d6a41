"""A script that runs in the page before Gradio's own, and the ASGI middleware that puts it there. It holds two
things: the frame limiter below, and the sentence a full queue shows (QUEUE_FULL_JS).

Why: Gradio 6's status tracker (the "processing | 1.2s" timer on an output) redraws its elapsed time on
requestAnimationFrame and stops only when its status leaves "pending". A tracker removed from the page while pending
(one is, as every Gradio page finishes loading) never stops: the page asks for a frame 60 times a second for as long
as it is open. On a 2-core machine whose browser runs beside the engine (`python app.py` and a local browser, or a
classroom laptop driving a projector) that cost the engine about a tenth of its speedup: the default run through the
API measured x1.28 (median of 10) with an idle page open and x1.42 with this script (docs/hardening.md, "An idle
page"). Gradio offers no hook that runs before its modules (`head=` is inserted by its own script, after the status
tracker has kept its reference to requestAnimationFrame), so the script goes into the served HTML.

What it does: requestAnimationFrame calls made from Gradio's status-tracker module are run at most 10 times a second
(the timer shows tenths of a second) and only while some status tracker is showing; a frame asked for when none
shows is dropped, which ends a loop whose tracker is gone or hidden (a hidden tracker's timer is invisible, and it
starts again the next time that tracker becomes pending). Every other requestAnimationFrame call (Plotly, Svelte's
transitions) is untouched. `window.__specFrames` counts what it did, for the browser tests.
It relies on the bundle's module name and markup, so requirements.txt pins gradio exactly (tests/test_pins.py).
"""
from __future__ import annotations

import json
import re

from starlette.middleware import Middleware

FRAMES_JS = r"""(() => {
  if (window.__specFrames) return;
  const native = window.requestAnimationFrame.bind(window);
  const counts = window.__specFrames = {timer: 0, dropped: 0};
  const showing = () => document.querySelector('[data-testid="status-tracker"]:not(.hide)') !== null;
  window.requestAnimationFrame = function (callback) {
    if (!(new Error().stack || "").includes("/statustracker-")) return native(callback);
    counts.timer += 1;
    setTimeout(() => native((time) => {
      if (showing()) callback(time);
      else counts.dropped += 1;
    }), 100);
    return 0;
  };
})();"""

# A full queue (app.AdmissionQueue) answers HTTP 503, and Gradio's page then shows its own fixed sentence, "This
# application is currently busy", whatever the server said; gradio_client says "Queue is full", the HTTP API's answer
# names the queue size. The page says what happened too: the toast's sentence is replaced. Its text is all it reads.
QUEUE_FULL_TEXT = ("The queue is full: as many requests as this server lets wait are waiting for the model. "
                   "Try again in a moment.")
QUEUE_FULL_JS = r"""(() => {
  const busy = "This application is currently busy", full = %s;
  new MutationObserver(() => {
    for (const text of document.querySelectorAll('[data-testid="toast-text"]')) {
      if (text.textContent.includes(busy)) text.textContent = full;
    }
  }).observe(document.documentElement, {childList: true, subtree: true, characterData: true});
})();""" % json.dumps(QUEUE_FULL_TEXT)
PAGE_JS = FRAMES_JS + "\n" + QUEUE_FULL_JS      # what the page gets

HEAD_OPEN = re.compile(rb"<head(\s[^>]*)?>", re.IGNORECASE)


def with_script(html: bytes, script: str = PAGE_JS) -> bytes:
    """`html` with `<script>script</script>` first inside its <head>; unchanged when it has no <head>."""
    found = HEAD_OPEN.search(html)
    if found is None:
        return html
    return html[:found.end()] + b"<script>" + script.encode() + b"</script>" + html[found.end():]


class EarlyScript:
    """ASGI middleware: the page itself (GET on the app's root path, an uncompressed text/html response) gets
    `script` as the first thing in its <head>; every other request and response passes through untouched."""

    def __init__(self, app, script: str = PAGE_JS):
        self.app = app
        self.script = script

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "GET" or scope.get("path") not in ("", "/"):
            await self.app(scope, receive, send)
            return
        start: dict | None = None       # the held response start of an HTML page, until its body is complete
        body: list[bytes] = []

        async def relay(message):
            nonlocal start
            if message["type"] == "http.response.start":
                headers = {key.lower(): value for key, value in message.get("headers", [])}
                if headers.get(b"content-type", b"").startswith(b"text/html") and b"content-encoding" not in headers:
                    start = message
                    return
            elif message["type"] == "http.response.body" and start is not None:
                body.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                page = with_script(b"".join(body), self.script)
                headers = [(key, value) for key, value in start.get("headers", []) if key.lower() != b"content-length"]
                await send({**start, "headers": headers + [(b"content-length", str(len(page)).encode())]})
                await send({"type": "http.response.body", "body": page})
                return
            await send(message)

        await self.app(scope, receive, relay)


def middleware() -> list[Middleware]:
    """For `launch(app_kwargs={"middleware": ...})`: a new list per launch (Gradio adds to the dict it is given)."""
    return [Middleware(EarlyScript)]
