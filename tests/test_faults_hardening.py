"""Fault tests, second pass (issue #25): what a scripted or hostile client still got through.

1. a layer range is bounded by the model's layer count before it is expanded, and messages are capped;
2. a prompt with a lone surrogate is refused by name (it reached the tokenizer's TypeError);
3. the step-through's endpoints are validated like /run, and every endpoint is either validated or listed here
   with the reason it needs no validator;
4. strings from a trace file (models, created, status, settings) are inert where they are shown;
5. the queue's size holds under a burst of simultaneous joins (Gradio checked it before awaiting the validator);
6. errors Gradio hides reach the user as a sentence, never `error: None`, a local path or a traceback.

Figures are collected in FIGURES and printed at the end: `pytest tests/test_faults_hardening.py -s`.
"""
import asyncio
import contextlib
import concurrent.futures
import datetime
import json
import math
import re
import sys
import time
import uuid
import weakref
from collections import Counter
from pathlib import Path

import httpx
import pytest

from spec_engine.classroom import trace as tr
from ui.classroom import tabs as classroom, replay
from ui.playground import coalesce, limits, registry as reg, validate
from ui.playground import drafts
from ui.playground.handlers import RUN_OUTPUTS
from ui.playground.state import SessionState
from test_app_faults import free_port
from test_ui_handlers import run_args
from conftest import ENDLESS, app_sessions, slowed_rounds, start_endless_run

TARGET = "smollm2-135m-instruct"
PROMPT = "Write one sentence about the sea."
SUMMARY = RUN_OUTPUTS.index("summary")
FIGURES: Counter = Counter()
LOCAL_PATH = re.compile(r"(?<![\w.~/-])~?/(?:[\w.@+-]+/)+")


@pytest.fixture(scope="module", autouse=True)
def report_figures():
    yield
    if FIGURES:
        print("\nHardening figures (second pass):", dict(FIGURES), file=sys.stderr)


def args(**kw):
    return run_args(**{"prompt": PROMPT, "target": TARGET, "draft": "prompt-lookup", "k": 4, "max_new_tokens": 4, **kw})


def step_args(**kw):
    """The step-through's inputs (classroom.STEP_INPUTS): the run's controls without auto_baseline."""
    values = dict(zip(("prompt", "target", "draft", "k", "temperature", "top_p", "top_k", "max_new_tokens", "seed",
                       "rule", "chat", "skip_layers", "exit_after", "auto_baseline", "show_spaces"), args(**kw)))
    return [values[name] for name in classroom.STEP_INPUTS]


def says_something(message: str) -> bool:
    """A message a user can act on: words, no local path, no traceback, not 'None'."""
    return (len(message) > 20 and "None" not in message and "Traceback" not in message
            and not LOCAL_PATH.search(message) and len(message) <= validate.MAX_MESSAGE_CHARS + 200)


def refused(callable_, field: str, words: str) -> str:
    with pytest.raises(Exception) as err:
        callable_()
    message = str(err.value)
    FIGURES["cases tried"] += 1
    assert f"- {field}: " in message and words in message, message[:500]
    FIGURES["refused with the field named"] += 1
    return message


@pytest.fixture(scope="module")
def client(playground):
    from gradio_client import Client
    return Client(playground, verbose=False)


# ------------------------------------------------------------------------------ 1. layer ranges, message caps

def test_a_huge_layer_range_is_refused_before_it_is_expanded():
    for spec in ("1-2000000", "1-99999999", "3, 5-" + "9" * 150):
        start = time.perf_counter()
        with pytest.raises(ValueError, match=r"must lie in \[1, 29\]") as err:
            drafts.parse_layers(spec, 30)
        assert time.perf_counter() - start < 0.05 and len(str(err.value)) < 200
        FIGURES["cases tried"] += 1


def test_every_message_shown_to_a_user_is_capped():
    huge = "got [" + ", ".join(map(str, range(30, 2_000_000))) + "]"
    assert len(validate.public_message(huge)) <= validate.MAX_MESSAGE_CHARS
    assert len(validate.InputError("skip_layers", huge).message) <= validate.MAX_MESSAGE_CHARS
    FIGURES["cases tried"] += 1


def test_a_huge_layer_range_over_the_api_is_refused_by_name_at_once(client):
    start = time.perf_counter()
    message = refused(lambda: client.predict(*args(draft="layer-skip", skip_layers="1-2000000"), api_name="/run"),
                      "skip_layers", "layers to skip must lie in [1, 29]")
    assert time.perf_counter() - start < 5 and len(message) < 2000


# ---------------------------------------------------------------------------------- 2. lone surrogates

def test_a_prompt_with_a_lone_surrogate_is_refused_by_name():
    with pytest.raises(validate.InputError) as err:
        validate.check_prompt("Say hi \ud800")
    assert err.value.field == "prompt" and "surrogate" in err.value.message
    FIGURES["cases tried"] += 1
    FIGURES["refused with the field named"] += 1


@pytest.mark.parametrize("endpoint", ["run", "step_reset", "mismatch"])
def test_a_lone_surrogate_sent_as_raw_json_is_refused_by_name(playground, endpoint):
    """As the issue sent it: JSON text with '\\ud800' (gradio_client cannot even encode such a string)."""
    import app
    data = {"run": args, "step_reset": step_args}.get(endpoint, lambda prompt: [prompt, TARGET, 8, True, None])(
        prompt="Say hi \ud800")
    if endpoint != "mismatch":
        data = data + [None]                                    # the session's state
    body = json.dumps(join_body(app.demo, endpoint, data, uuid.uuid4().hex))
    assert "\\ud800" in body
    answer = httpx.post(playground + "gradio_api/queue/join", content=body,
                        headers={"content-type": "application/json"}, timeout=60)
    FIGURES["cases tried"] += 1
    assert answer.status_code == 422, answer.text[:300]
    detail = json.dumps(answer.json())
    assert "prompt" in detail and "not valid text" in detail and "TypeError" not in detail
    FIGURES["refused with the field named"] += 1


# ------------------------------------------------------------------- 3. the step-through, every endpoint

@pytest.mark.parametrize("endpoint, change, field, words", [
    ("/step", dict(k=0), "k", "k must be between 1 and 16, got 0"),
    ("/step", dict(seed=-1), "seed", "seed must be between 0 and"),
    ("/step", dict(draft="layer-skip", skip_layers="1-99999999"), "skip_layers", "must lie in [1, 29]"),
    ("/step_reset", dict(k=0), "k", "k must be between 1 and 16, got 0"),
    ("/step_reset", dict(seed=-1), "seed", "seed must be between 0 and"),
    ("/step_reset", dict(temperature="hot"), "temperature", "temperature must be a finite number"),
])
def test_the_step_endpoints_validate_like_run(client, endpoint, change, field, words):
    refused(lambda: client.predict(*step_args(**change), api_name=endpoint), field, words)


# Endpoints without a validator, each with the reason it needs none (a new endpoint must be added to one side).
NO_VALIDATOR = {
    "step_back": "its only input is the session's own state",
    "play": "the speed slider's value goes to gr.Timer, which clamps nothing it runs",
    "pause": "no inputs",
    "set_speed": "as play",
    "trace_export": "its only input is the session's own state",
    "export_steps": "its only input is the session's own state",
    "trace_replay": "a file Gradio accepted as uploaded here; spec_engine.classroom.trace.load validates every field",
    "replay_example": "no inputs",
    "step_trace": "its only input is the session's own state (a trace validated when loaded)",
    "relevel": "a radio choice and the session's state; the handler reads the choice from a fixed table",
    "copy_main": "copies the main controls into the lab's; the lab's own run validates them",
    "on_axis": "re-labels the sweep's fields; the sweep validates what it runs",
    "apply_scenario": "looks a preset up by name; unknown names change nothing",
    "baseline": "its only input is the session's state (the latest run, validated when it ran)",
    "stop": "its only input is the session's state",
    "on_target": "updates the draft choices; every run validates target and draft",
    "on_draft": "updates the draft's options; every run validates them",
    "apply_prompt": "looks a preset prompt up by name",
    "rerender": "redraws the session's runs with a show-spaces flag",
    "set_compare_axis": "redraws the comparison of the session's runs",
    "clear_history": "its only input is the session's state",
    "model_status": "no inputs",
    "update": "the what-if panel (private): pure arithmetic on its sliders and pickers, clamped to their ranges; an "
              "unknown preset or a non-number is answered in the panel's text by name (ui/classroom/whatif.py)",
    "from_run": "the what-if panel's 'use the latest run' (private): its only input is the session's state",
    "compare_choices": "lists the session's own runs for the Compare picker (private); its only input is the state",
    "set_compare_runs": "the Compare picker (private): run ids of the session's own history; unknown ids match no run",
    "share_link": "builds a link from the controls through validate.check_settings (/run's checks); runs nothing",
    "equivalent": "renders code from the controls through validate.check_settings; invalid ones change nothing",
    "restore": "the page-load event: a link's values go through validate.check_fields, or nothing is applied",
    "SessionState": "no inputs (creates the session's state)",
    "three_ways": "no inputs but the session's state: fixed settings on the offline model (ui/classroom/three_ways.py)",
    "step_lesson": "fixed settings; the target it takes is checked by the handler (validate.check_settings)",
}


def handler_name(fn) -> str:
    return getattr(getattr(fn, "func", fn), "__name__", repr(fn))


def test_every_endpoint_is_validated_or_listed_with_a_reason(playground):
    """Every event a client can call (public endpoints through gradio_client; private ones through the raw
    queue, as the page calls them) has a validator, or appears in NO_VALIDATOR with why it needs none."""
    import app
    from gradio_client import Client
    public = set(Client(playground, verbose=False).view_api(print_info=False, return_format="dict")["named_endpoints"])
    unchecked = []
    for block_fn in app.demo.fns.values():
        if block_fn.fn is None:
            continue
        names = {block_fn.api_name, handler_name(block_fn.fn)}
        if block_fn.validator is None and names.isdisjoint(NO_VALIDATOR):
            unchecked.append(block_fn.api_name)
        if f"/{block_fn.api_name}" in public:
            FIGURES["public endpoints checked"] += 1
    assert not unchecked, f"endpoints without a validator and not in NO_VALIDATOR: {unchecked}"
    assert {"/run", "/step", "/step_reset", "/mismatch", "/sweep_k"} <= public


# --------------------------------------------------------------------------------------- 4. trace strings

HOSTILE = '<img src=x onerror="alert(1)">'


def hostile_trace() -> tr.Trace:
    doc = json.loads(replay.EXAMPLE_PATH.read_text())
    doc["models"] = {"target": f"T{HOSTILE}", "draft": f"![x](http://example.invalid/a.png){HOSTILE}"}
    doc["created"] = f"2026{HOSTILE}"
    doc["display"]["status"] = f"done {HOSTILE} [link](http://example.invalid)"
    doc["stop_reason"] = f"eos{HOSTILE}"
    doc["rounds"][-1]["stop_reason"] = f"eos{HOSTILE}"
    return tr.loads(json.dumps(doc))


MARKDOWN_OUTPUTS = {"status", "explain"}    # gr.Markdown: links, images and bare URLs are markup; the rest: gr.HTML


def no_markup_from(name: str, text) -> bool:
    text = str(text)
    return "<img" not in text and (name not in MARKDOWN_OUTPUTS or not re.search(r"(?<!\\)\]\(|https?://", text))


def test_a_hostile_trace_replays_as_text():
    outputs = dict(zip(("state",) + classroom.REPLAY_OUTPUTS, classroom.replay_outputs(hostile_trace())))
    assert "&lt;img" in outputs["status"]                     # shown, as text
    for name in ("status", "tokens", "stats", "explain"):
        assert no_markup_from(name, outputs[name]), (name, str(outputs[name])[:300])
    FIGURES["cases tried"] += 1


def test_a_hostile_trace_steps_through_as_text():
    session, *outputs = classroom.step_trace(hostile_trace())[:-1]
    view = dict(zip(classroom.STEP_OUTPUTS, outputs))
    for _ in range(len(session.stepper.events)):            # to the end: the status then names the stop reason
        classroom.advance(session)
    view = dict(zip(classroom.STEP_OUTPUTS, classroom.step_view(session)[1:-1]))
    for name in ("status", "round", "kv", "tokens", "explain"):
        assert no_markup_from(name, view[name]), (name, str(view[name])[:300])
    FIGURES["cases tried"] += 1


# ------------------------------------------------------------------------------------------ 5. the queue

def join_body(demo, api_name: str, data: list, session_hash: str) -> dict:
    fn_index = next(i for i, fn in demo.fns.items() if fn.api_name == api_name)
    return {"data": data, "fn_index": fn_index, "session_hash": session_hash, "event_data": None, "trigger_id": None}


async def burst(url: str, bodies: list[dict]) -> list[int]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        answers = await asyncio.gather(*(http.post("gradio_api/queue/join", json=body) for body in bodies))
    return [answer.status_code for answer in answers]


def test_a_burst_of_joins_cannot_pass_the_queue_size(playground_registry):
    """50 sessions join /run at once against queue size 8 and one run decoding: at most 8 wait besides the one
    served, wherever they wait (Gradio's queue, a run handler loading or at the engine's gate: app.AdmissionQueue),
    so at most 9 are accepted (before: every join that arrived while others awaited the validator passed the size
    check; then 13 of 50, while handlers that had not reached the gate counted nowhere)."""
    import app
    from ui.layout import build_demo
    size, concurrency, n = 8, 1, 50
    # the first run holds the decoding slot past the burst (its 300 tokens stop at 10 s after the test, too)
    previous = limits.configure(queue_size=size, concurrency=concurrency, max_run_seconds=10.0)
    demo = app.queue(build_demo(preload=False))
    before = (coalesce.GATE.busy, coalesce.GATE.wait_line())       # runs of the session's other apps, if any
    try:
        port = free_port()
        demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        url = f"http://127.0.0.1:{port}/"
        # distinct seeds: identical requests would share one computation (coalesce.py) and wait nowhere
        bodies = [join_body(demo, "run", args(max_new_tokens=300, seed=i) + [None], uuid.uuid4().hex) for i in range(n)]
        # In its own thread: Playwright's sync API (the session's Chromium) keeps an event loop running in this one.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            codes = pool.submit(asyncio.run, burst(url, bodies)).result()
        direct = httpx.post(url + "gradio_api/run/run", json={"data": args(k=0)}, timeout=60)
        held = demo._queue.joining                 # every place held during admission was given back
    finally:
        # the accepted runs wait at the engine's gate, which outlives this demo (process-wide, as the model is), and
        # their handlers may keep running after it closes: each is stopped as its visitor's Stop would, so that the
        # one decoding frees the cores (the next test gets a fresh gate: conftest's own_class_state)
        sessions = [value for hash_ in list(demo.state_holder.session_data)
                    for value in demo.state_holder.session_data[hash_].state_data.values()
                    if isinstance(value, SessionState)]
        for session in sessions:
            session.stop_event.set()
        demo.close()
        limits.configure(previous)
    from test_app_faults import wait_until
    wait_until(lambda: coalesce.GATE.busy <= before[0], timeout=30, poll=0.2)     # best effort: the cores, not a check
    accepted = codes.count(200)
    FIGURES["burst joins"] = n
    FIGURES["burst accepted"] = accepted
    FIGURES["burst limit (queue size + decoding)"] = size + concurrency
    assert set(codes) <= {200, 503} and codes.count(503) == n - accepted
    assert 1 <= accepted <= size + concurrency and held == 0
    assert direct.status_code == 404          # no direct POST around the queue, its size and its validators


# -------------------------------------------------------------------------------- 6. errors say something

def queue_call(url: str, body: dict) -> dict:
    """Join the queue and read the event stream until the call completes; returns that message."""
    with httpx.Client(base_url=url, timeout=120) as http:
        joined = http.post("gradio_api/queue/join", json=body)
        assert joined.status_code == 200, joined.text
        with http.stream("GET", "gradio_api/queue/data", params={"session_hash": body["session_hash"]}) as stream:
            for line in stream.iter_lines():
                if line.startswith("data:"):
                    message = json.loads(line[5:])
                    if message.get("msg") == "process_completed":
                        return message
    raise AssertionError("the stream ended without process_completed")


@pytest.mark.parametrize("path", ["/etc/hostname.json", "presets/traces/example.json", "/tmp/gradio/never/x.json",
                                  None, "x"])
def test_a_file_that_was_never_uploaded_gets_a_sentence(playground, path, capfd):
    import app
    value = path if path in (None, "x") else {"path": path, "meta": {"_type": "gradio.FileData"}}
    done = queue_call(playground, join_body(app.demo, "trace_replay", [value], uuid.uuid4().hex))
    error = done["output"].get("error")
    FIGURES["cases tried"] += 1
    assert done["success"] is False and isinstance(error, str) and says_something(error), error
    FIGURES["hidden errors that now say something"] += 1
    if path is None:                                       # an ordinary refusal: no traceback in the log
        assert "Traceback" not in capfd.readouterr().err


def test_refusals_are_plain_text_without_paths():
    error = validate.refusal("cannot read /home/someone/.cache/spec/trace.json: <img src=x>")
    assert error.message == "cannot read trace.json: &lt;img src=x&gt;" and error.print_exception is False
    assert "&lt;img" in validate.shown("<img src=x>")


# ------------------------------------------------------------------------- 7. custom models, hostile names

@pytest.mark.parametrize("name, words", [
    ("../../etc/passwd", "looks like a file path"),
    ("owner/..", "looks like a file path"),
    ("https://evil.example/x", "looks like a file path"),
    ('<img src=x onerror="alert(1)">/x', "Unknown target model '&lt;img"),
    ("owner/" + "a" * 300, "names are at most 200"),
])
def test_hostile_model_names_are_refused_even_with_custom_models_allowed(client, name, words):
    previous = limits.configure(allow_custom_models=True)
    try:
        message = refused(lambda: client.predict(*args(target=name), api_name="/run"), "target", words)
    finally:
        limits.configure(previous)
    assert "<img" not in message and says_something(message)


# --------------------------------------------------------------------- 4, in a browser: no element from a trace

FROM_TRACE = ("img[src='x'], img[src*='example.invalid'], a[href*='example.invalid'], "
              "#trace-status img, #step-status img")


@pytest.mark.browser
def test_a_hostile_trace_creates_no_element_in_the_replay_or_the_step_through(playground, chromium, tmp_path):
    from conftest import open_playground
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(hostile_trace().to_dict()))
    requests = []
    page = open_playground(chromium, playground)
    try:
        page.on("request", lambda request: requests.append(request.url))
        page.get_by_role("tab", name="Trace export / replay").click()
        page.set_input_files("input[type=file][data-testid='Load a trace (.json)-upload-button']", str(path))
        page.wait_for_function("document.querySelector('#trace-status').innerText.includes('Replaying a trace')",
                               timeout=60_000)
        assert "<img src=x" in page.inner_text("#trace-status")            # shown as text
        replay_elements = page.evaluate(f"document.querySelectorAll({FROM_TRACE!r}).length")
        page.click("#trace-step")
        page.get_by_role("tab", name="Step through").click()
        page.wait_for_function("document.querySelector('#step-status').innerText.includes('Trace replay')",
                               timeout=60_000)
        for _ in range(len(hostile_trace().rounds)):                     # to the end: the stop reason is shown
            page.click("#step-forward")
        page.wait_for_function("document.querySelector('#step-status').innerText.includes('the run ended')",
                               timeout=60_000)
        assert "<img src=x" in page.inner_text("#step-status")
        step_elements = page.evaluate(f"document.querySelectorAll({FROM_TRACE!r}).length")
    finally:
        page.close()
    FIGURES["cases tried"] += 1
    assert replay_elements == 0 and step_elements == 0
    assert not [url for url in requests if "example.invalid" in url or url.rstrip("/").endswith("/x")]


# ----------------------------------------------------------------------- 7. a job cancelled while it waits

def test_a_job_cancelled_while_queued_never_runs_and_gives_its_place_back(playground_registry):
    import app
    from gradio_client import Client
    from test_app_faults import wait_until
    from ui.layout import build_demo
    previous = limits.configure(queue_size=2, concurrency=1, max_run_seconds=20.0)
    demo = app.queue(build_demo(preload=False))
    try:
        port = free_port()
        demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        clients = [Client(f"http://127.0.0.1:{port}/", verbose=False) for _ in range(4)]
        # Runs wait at the engine's gate (ui/playground/coalesce.py); distinct seeds, so that none is shared.
        gate = coalesce.GATE
        assert wait_until(lambda: gate.busy == 0 and gate.wait_line() == 0, timeout=180, poll=0.5)
        # The running job holds the gate throughout: a prompt that does not reach EOS (a one-sentence answer ended in
        # about a second on the compiled layers, and the first waiting job took its place before its cancel).
        running = clients[0].submit(*args(prompt=ENDLESS, max_new_tokens=1000, seed=0), api_name="/run")
        assert wait_until(lambda: gate.busy == 1, timeout=60)
        waiting = []
        for i, client in enumerate(clients[1:3], start=1):
            waiting.append(client.submit(*args(max_new_tokens=300, seed=i), api_name="/run"))
            assert wait_until(lambda: coalesce.queued() == i, timeout=60)
        waiting[0].cancel()
        assert wait_until(lambda: coalesce.queued() == 1)                  # its place is free again
        late = clients[3].submit(*args(max_new_tokens=300, seed=3), api_name="/run")
        assert wait_until(lambda: coalesce.queued() == 2, timeout=60)      # admitted, not "queue is full"
        for job in (running, waiting[1], late):
            job.cancel()
        assert wait_until(lambda: running.done() and waiting[1].done() and late.done(), timeout=60)
        assert wait_until(lambda: gate.busy == 0 and coalesce.queued() == 0, timeout=60)
        # the cancelled job never ran: its page only ever said where it waited
        assert all("position" in str(out) or not any(isinstance(o, dict) and o.get("rounds") for o in out)
                   for out in waiting[0].outputs())
    finally:
        demo.close()
        limits.configure(previous)
    FIGURES["cases tried"] += 1


# ------------------------------------------------------- 7. a long prefill against the time limit and Stop

def long_prompt(tokens: int, tokenizer=None) -> str:
    """Plain text (chat off) of at least `tokens` tokens of the default target (its tokenizer as the registry
    loaded it, or `tokenizer`), well inside its context."""
    tokenizer = tokenizer or reg.REGISTRY.loaded(TARGET).tokenizer
    lines = [f"Line {i}: the tide comes in and goes out again over the grey sand." for i in range(tokens // 10)]
    text = " ".join(lines)
    assert tokens <= len(tokenizer(text)["input_ids"]) < tokens * 2
    return text


def one_chunk_seconds() -> float:
    """One prefill forward of a whole chunk, measured now (the machine's load moves it by several times)."""
    import spec_engine as se
    from spec_engine.core.cache import PREFILL_CHUNK, new_cache, prefill
    model = reg.REGISTRY.loaded(TARGET).model
    start = time.perf_counter()
    prefill(model, [17] * PREFILL_CHUNK, new_cache(model), chunk=PREFILL_CHUNK)
    assert se.context_length(model) > 3 * PREFILL_CHUNK + 64
    return time.perf_counter() - start


def decode_long_prompt(state, **kw) -> tuple[float, list]:
    from ui.playground import handlers
    from spec_engine.core.cache import PREFILL_CHUNK
    prompt = long_prompt(3 * PREFILL_CHUNK)                          # three chunks and more
    start = time.perf_counter()
    outputs = list(handlers.run(*args(prompt=prompt, chat=False, max_new_tokens=64, draft="prompt-lookup", **kw),
                                state))
    return time.perf_counter() - start, outputs


def test_a_long_prompt_stops_at_the_time_limit_while_it_is_prefilled(playground_registry):
    """Before: the prompt was one forward, so a run stopped only after the whole prefill and a first round. Now the
    deadline is read between chunks: no round, the time limit named, within the limit and about one chunk."""
    from ui.playground import runner
    chunk = one_chunk_seconds()
    seconds = 0.3
    previous = limits.configure(max_run_seconds=seconds)
    state = SessionState()
    try:
        elapsed, outputs = decode_long_prompt(state)
    finally:
        limits.configure(previous)
    record = state.current                       # a run without a round stays out of the history
    status = str(outputs[-1][RUN_OUTPUTS.index("stats")])
    FIGURES["cases tried"] += 1
    FIGURES["long prefill: one chunk (s)"] = round(chunk, 1)
    FIGURES["long prefill: stopped by a 0.3 s limit after (s)"] = round(elapsed, 1)
    assert record.stop_reason == runner.TIME_LIMIT and not record.rounds, (record.stop_reason, len(record.rounds))
    assert "time limit" in status and "while reading the prompt" in status
    assert elapsed < seconds + 2.5 * chunk + 2.0


def test_stop_during_a_long_prefill_ends_the_run(playground_registry):
    from ui.playground import handlers
    from test_app_faults import wait_until
    state = SessionState()

    def press_stop():
        assert wait_until(lambda: getattr(state, "active", None) is not None, timeout=120)
        time.sleep(0.5)                                                # inside the prefill's first chunk
        list(handlers.stop(state))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stopping = pool.submit(press_stop)
        elapsed, outputs = decode_long_prompt(state)
        stopping.result()
    record = state.current                       # a run without a round stays out of the history
    status = str(outputs[-1][RUN_OUTPUTS.index("stats")])
    FIGURES["cases tried"] += 1
    FIGURES["long prefill: Stop ended it after (s)"] = round(elapsed, 1)
    assert record.stop_reason == "cancelled" and not record.rounds and "stopped while reading the prompt" in status


@pytest.mark.parametrize("chunk", [64, pytest.param(512, marks=pytest.mark.full)], ids=["chunk64", "chunk512"])
def test_chunked_prefill_of_a_real_prompt_keeps_greedy_identity(smollm2, chunk):
    """SmolLM2-135M, a prompt of more than two chunks: the same greedy tokens in chunks as with one prefill forward,
    with the CPU speed layer and without it. The default tier cuts 64-token chunks (the same code, a short prompt);
    the full tier the app's own 512 (PREFILL_CHUNK) on a prompt of over 1,024 tokens."""
    import spec_engine as se
    from conftest import speed_layer_off
    from spec_engine import accel
    from spec_engine.core import speed
    from spec_engine.core.cache import PREFILL_CHUNK
    assert chunk in (64, PREFILL_CHUNK)
    ids = smollm2.encode_prompt(long_prompt(2 * chunk + 1, smollm2.tokenizer), chat=False)
    assert ids.shape[1] > 2 * chunk
    tokens = {}
    for layer in ("cpu", "off"):
        previous = speed.install(accel.CpuSpeedLayer()) if layer == "cpu" else None
        with speed_layer_off() if layer == "off" else contextlib.nullcontext():
            for size in (chunk, 10**6):
                decoder = se.SpeculativeDecoder(smollm2.model, se.PromptLookupDrafter())
                decoder.prefill_chunk = size
                tokens[layer, size] = decoder.generate(ids, k=4, max_new_tokens=16).tokens
        if previous is not None:
            speed.install(previous)
    FIGURES["cases tried"] += 1
    assert len(set(map(tuple, tokens.values()))) == 1 and len(tokens["cpu", chunk]) == 16, tokens


# ------------------------------------------------------------- 7. many sessions opened and abandoned

def rss_mb(trim: bool = False) -> float:
    """This process's resident memory after a garbage collection; with `trim`, after glibc's malloc_trim too, which
    hands the heap's free pages back to the system (freed memory otherwise stays resident for reuse)."""
    import ctypes
    import gc
    import psutil
    gc.collect()
    if trim:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return psutil.Process().memory_info().rss / 2**20


@pytest.mark.parametrize("n", [6, pytest.param(20, marks=pytest.mark.full)])
def test_memory_stays_level_over_many_runs(client, n):
    """A figure more than a new case (the first pass measured +6 MB over 30 runs by hand): RSS of the server process
    (this one) after 2 warm-up runs and after N more in one session, each run's caches dropped when it ends. The
    default tier's 6 runs catch a leak of 5 MB a run; the full tier's soak, 1.5 MB a run."""
    for _ in range(2):
        client.predict(*args(max_new_tokens=8), api_name="/run")
    before = rss_mb(trim=True)                 # trimmed: the heap's free pages, kept for reuse, are not growth
    for seed in range(n):
        client.predict(*args(max_new_tokens=8, temperature=0.7, seed=seed), api_name="/run")
    after = rss_mb(trim=True)
    FIGURES["RSS MB (trimmed): before, after N runs"] = (round(before), round(after))
    FIGURES["N runs"] = n
    assert after - before < 30, (before, after)


def test_abandoned_sessions_expire_with_their_kv_caches_and_exports(playground_registry):
    """N sessions each run, export a trace and open a step-through (its KV caches stay in the process for the next
    step), then go idle. A time to live after their last use their states are deleted: the step-through's caches,
    the export folders and Gradio's served copies go, and the process's memory returns to its level. Before: the
    main state was only ever read, so Gradio never started its time to live, and nothing deleted the caches or the
    files. Gradio's own loop deletes expired state every second, reading each state's time of last use; the test
    moves those times a time to live into the past (an injected clock) instead of waiting one out."""
    import app
    from gradio_client import Client
    from test_app_faults import wait_until
    from ui.classroom import stepper
    from ui.layout import build_demo
    ttl, n = 3600.0, 3
    previous = limits.configure(session_ttl_seconds=ttl, queue_size=64, concurrency=1, max_run_seconds=60.0)
    demo = app.queue(build_demo(preload=False))
    prompt = long_prompt(300)                  # each step-through keeps ~300 positions of KV, ~14 MB in float32
    clients, caches = [], []

    def open_session() -> tuple[set, list[Path]]:
        client = Client(url, verbose=False)
        clients.append(client)
        client.predict(*args(max_new_tokens=8), api_name="/run")
        copies = set(demo.spec_components["trace_file"].temp_files)
        client.predict(api_name="/trace_export")
        served = Path(*set(demo.spec_components["trace_file"].temp_files) - copies)   # the copy Gradio serves
        ours = demo.state_holder.session_data[client.session_hash]
        folders = [folder for value in ours.state_data.values() if isinstance(value, SessionState)
                   for folder in value.exports]                                    # replay.write_temp's folder
        before = set(stepper._live)
        client.predict(*step_args(prompt=prompt, chat=False, max_new_tokens=64), api_name="/step_reset")
        client.predict(*step_args(prompt=prompt, chat=False, max_new_tokens=64), api_name="/step")
        assert served.exists() and len(folders) == 1 and folders[0].exists()
        # Gradio's served copy goes by its own schedule, by file age (a file's ctime cannot be moved back): it is in
        # a set Gradio sweeps, and the sweep's age is the time to live (below)
        assert any(str(served) in files for files in demo.temp_file_sets)
        keys = set(stepper._live) - before
        caches.extend(weakref.ref(stepper._live[key].state.target_cache) for key in keys)
        return keys, folders, client.session_hash

    def expired(sessions) -> bool:
        return all(not (keys & set(stepper._live)) and not any(path.exists() for path in paths)
                   for keys, paths, _ in sessions)

    def age(sessions) -> None:
        """Move every state's time of last use a time to live (and a second) into the past: Gradio's next sweep
        finds them expired, as it would after a real wait."""
        for _, _, hash_ in sessions:
            held = demo.state_holder.session_data[hash_]
            for key, (time_to_live, used) in list(held._state_ttl.items()):
                held._state_ttl[key] = (time_to_live, used - datetime.timedelta(seconds=ttl + 1))
    assert demo.delete_cache == (math.ceil(ttl / 10), math.ceil(ttl))       # served copies: gone a TTL after
    try:
        port = free_port()
        demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        url = f"http://127.0.0.1:{port}/"
        warm = [open_session()]                                # models, kernels, allocator: the level to return to
        assert not expired(warm)
        age(warm)
        assert wait_until(lambda: expired(warm), timeout=30)
        level = rss_mb(trim=True)
        sessions = [open_session() for _ in range(n)]
        assert all(keys for keys, _, _ in sessions)
        held = rss_mb(trim=True)
        assert not any(expired([session]) for session in sessions)             # nothing goes before its time
        age(sessions)
        assert wait_until(lambda: expired(sessions), timeout=30)                # idle clients, still connected
        after, trimmed = rss_mb(), rss_mb(trim=True)
        left = [value for _, _, hash_ in sessions for value in demo.state_holder.session_data[hash_].state_data.values()
                if isinstance(value, (SessionState, stepper.StepSession))]
    finally:
        for client in clients:
            client.close()
        demo.close()
        limits.configure(previous)
    FIGURES["abandoned sessions"] = n
    FIGURES["RSS MB (trimmed): level, with N abandoned sessions; after their expiry: untrimmed, trimmed"] = (
        round(level), round(held), round(after), round(trimmed))
    assert not left and not [ref for ref in caches if ref() is not None]     # states and KV caches are gone
    assert held - level > 30, (level, held)                   # the sessions' caches were there to be freed
    assert trimmed - level < 0.5 * (held - level), (level, held, after, trimmed)


# ------------------------------------------- 7. the browser's Stop and a closed tab, each then a normal run

def normal_run_completes(page) -> SessionState:
    """A short run in `page` that ends by itself (max new tokens or EOS), shown as finished. Its session is the one
    whose latest run is new since the click (earlier tests' sessions in this app may hold finished runs of PROMPT)."""
    shown_before = {id(s): s.current for s in app_sessions()}
    page.fill("#spec-prompt textarea", PROMPT)
    max_new = page.locator("#spec-max-new input[type=number]")
    max_new.fill("12")
    max_new.press("Enter")
    page.click("#spec-run")
    from test_app_faults import wait_until

    def done():
        return [s for s in app_sessions() if s.current is not None and s.current is not shown_before.get(id(s))
                and s.current.settings.prompt == PROMPT and s.current.stop_reason in ("eos", "max_new_tokens")
                and s.current.recorded]
    assert wait_until(lambda: done(), timeout=180)                       # ended by itself, on the server
    page.wait_for_function("(t => t.includes('finished') && !t.includes('Stopped'))"
                           "(document.querySelector('#spec-stats').innerText)", timeout=60_000)
    ran = done()
    assert len(ran) == 1, f"{len(ran)} sessions ran the normal run"
    return ran[0]


@pytest.mark.browser
def test_the_browser_stop_then_a_normal_run(playground, chromium):
    from conftest import open_playground
    from ui.playground import handlers
    page = open_playground(chromium, playground)
    try:
        with slowed_rounds():
            session = start_endless_run(page)
            record = session.active.record
            page.click("#spec-stop", timeout=120_000)          # the page redraws every round: slow on loaded cores
            page.wait_for_function("document.querySelector('#spec-stats').innerText.includes('Stopped after')",
                                   timeout=30_000)
            from test_app_faults import wait_until
            assert wait_until(lambda: session.active.work is None, timeout=30)    # the run's GPU function is closed
        assert record.stop_reason == "cancelled" and len(record.tokens) < 600
        time.sleep(handlers.STOP_REASSERT_SECONDS + 1)      # Stop shows its view twice (handlers.stop)
        after = normal_run_completes(page)
    finally:
        page.close()
    FIGURES["cases tried"] += 1
    assert after is session and after.current is not record and after.current.tokens


@pytest.mark.browser
def test_a_closed_tab_then_a_normal_run(playground, chromium):
    from conftest import open_playground
    from test_app_faults import wait_until
    held = reg.REGISTRY.holds(TARGET)            # other runs in this app (earlier tests) may be ending
    tab = open_playground(chromium, playground)
    with slowed_rounds():
        session = start_endless_run(tab)
        record = session.active.record
        tab.close()
        assert wait_until(lambda: session.active.work is None, timeout=30)        # released when the tab went
    assert record.stop_reason == "cancelled" and len(record.tokens) < 600
    assert wait_until(lambda: reg.REGISTRY.holds(TARGET) <= held, timeout=60)
    page = open_playground(chromium, playground)
    try:
        after = normal_run_completes(page)
    finally:
        page.close()
    FIGURES["cases tried"] += 1
    assert after is not session and after.current.tokens
