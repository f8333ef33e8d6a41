"""Fault tests against the launched app, driven as remote callers drive it (gradio_client, raw HTTP).

- every invalid input is refused with a message that names the field and the problem, and the server then
  answers a valid run;
- eight sessions submitted at once, sampled with different seeds, each stream their own run and end with
  exactly the tokens of that seed's solo run (once through the single model queue, once decoding in parallel);
- a cancelled run and an abandoned one (the stream closed, as when a tab closes) end within about one round,
  free their caches and let go of their models, and the same session runs again;
- a model that fails to load (a missing file) is reported, without local paths, and the app keeps serving;
- custom Hub ids are refused unless the host allowed them.

The counts behind README's "Hardening" section are collected in FIGURES and printed at the end (pytest -s).
"""
import contextlib
import gc
import re
import socket
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml

import spec_engine as se
from ui.playground import coalesce, limits
from ui.playground.handlers import RUN_OUTPUTS
from ui.playground.state import SessionState
from test_ui_handlers import run_args

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TARGET = "smollm2-135m-instruct"
PROMPT = "Write one sentence about the sea."
SUMMARY = RUN_OUTPUTS.index("summary")
SEEDS = tuple(range(1, 9))
SAMPLED = dict(draft="layer-skip", k=2, temperature=1.0, top_p=0.95, max_new_tokens=6)
FIGURES: Counter = Counter()


def args(**kw):
    """The run endpoint's positional inputs: this file's prompt, prompt lookup, k = 4, 8 tokens, then `kw`."""
    return run_args(**{"prompt": PROMPT, "target": TARGET, "draft": "prompt-lookup", "k": 4, "max_new_tokens": 8, **kw})


def summaries(outputs):
    return [out[SUMMARY] for out in outputs if isinstance(out[SUMMARY], dict) and "final" in out[SUMMARY]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def engine_tokens(smollm2, seed=0, draft="prompt-lookup", k=4, temperature=0.0, top_p=1.0, max_new_tokens=8):
    """The solo run: the engine alone, in this process, with the app's settings."""
    ids = smollm2.encode_prompt(PROMPT, chat=True)
    decoder = se.SpeculativeDecoder(smollm2.model, se.make_drafter(draft, smollm2))
    return decoder.generate(ids, k=k, max_new_tokens=max_new_tokens, seed=seed,
                            sampling=se.SamplingParams(temperature=temperature, top_p=top_p),
                            eos_token_id=smollm2.model.generation_config.eos_token_id).tokens


@pytest.fixture(scope="module", autouse=True)
def report_figures():
    yield
    if FIGURES:
        print("\nHardening figures:", dict(FIGURES), file=sys.stderr)


@pytest.fixture(scope="module")
def client(playground):
    from gradio_client import Client
    return Client(playground, verbose=False)


def answers_a_valid_run(client) -> bool:
    final = client.predict(*args(max_new_tokens=4), api_name="/run")[SUMMARY]
    return final["final"] and final["new_tokens"] >= 1


def live_run_objects() -> int:
    """Decoder states and KV caches still alive anywhere in the process (after a full collection)."""
    from transformers import DynamicCache
    gc.collect()
    return sum(type(obj) in (se.DecodeState, DynamicCache) for obj in gc.get_objects())


def server_session(demo, session_hash: str) -> SessionState | None:
    holder = demo.server_app.state_holder
    if session_hash not in holder:
        return None
    return next((v for v in holder[session_hash].state_data.values() if isinstance(v, SessionState)), None)


def wait_until(condition, timeout=15.0, poll=0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return condition()


# ----------------------------------------------------------------------------------- invalid inputs

LONG_IN_TOKENS = "3;" * 9_000          # 18,000 characters (under the cap), 18,030 tokens (over the context)
INVALID_RUN = [
    (dict(k=0), "k", "k must be between 1 and 16, got 0"),
    (dict(k=2.5), "k", "k must be a whole number"),
    (dict(k=40), "k", "k must be between 1 and 16, got 40"),
    (dict(k="four"), "k", "k must be a whole number, got 'four'"),
    (dict(temperature=-1), "temperature", "temperature must be >= 0 and <= 2"),
    (dict(temperature=7), "temperature", "temperature must be >= 0 and <= 2 (0 = greedy), got 7"),
    (dict(temperature="hot"), "temperature", "temperature must be a finite number"),
    (dict(top_p=0), "top_p", "top_p must be in (0, 1]"),
    (dict(top_p=1.5), "top_p", "top_p must be in (0, 1]"),
    (dict(top_k=-1), "top_k", "top-k must be between 0 and 1000000"),
    (dict(top_k=10**400), "top_k", "top-k must be between 0 and 1000000"),
    (dict(max_new_tokens=0), "max_new_tokens", "max new tokens must be between 1 and 1024, got 0"),
    (dict(max_new_tokens=5000), "max_new_tokens", "max new tokens must be between 1 and 1024, got 5000"),
    (dict(seed=-1), "seed", "seed must be between 0 and 9223372036854775807"),
    (dict(seed=2**70), "seed", "seed must be between 0 and 9223372036854775807"),
    (dict(seed=None), "seed", "seed must be a whole number"),
    (dict(prompt=""), "prompt", "The prompt is empty"),
    (dict(prompt=None), "prompt", "The prompt is empty"),
    (dict(prompt="x" * 20_001), "prompt", "The prompt has 20,001 characters; this server takes at most 20,000"),
    (dict(prompt=LONG_IN_TOKENS), "prompt", "18,030 tokens long"),
    (dict(prompt="3;" * 4_000, max_new_tokens=512), "prompt", "shorten the prompt to 7,680 tokens or fewer"),
    (dict(target="no-such-model"), "target", "Unknown target model 'no-such-model'"),
    (dict(target="/etc/passwd"), "target", "looks like a file path"),
    (dict(target="HuggingFaceTB/SmolLM2-360M"), "target", "custom Hub models are switched off"),
    (dict(draft="no-such-model"), "draft", "Unknown draft model 'no-such-model'"),
    (dict(draft="gemma-3-270m"), "draft", "Use 'gemma-3-270m:cross-tokenizer'"),
    (dict(draft="gemma-3-270m:sideways"), "draft", "unknown draft mode 'sideways'"),
    (dict(draft="prompt-lookup:0"), "draft", "prompt-lookup:N needs N between 1 and 16"),
    (dict(draft="../../weights:cross-tokenizer"), "draft", "looks like a file path"),
    (dict(draft="owner/drafter"), "draft", "custom Hub models are switched off"),
    (dict(target="gemma-3-270m", draft="eagle"), "draft", "not available for Gemma 3 270M"),
    (dict(rule="sloppy"), "rule", "Verification rule must be one of exact"),
    (dict(chat="yes"), "chat", "apply the chat template must be true or false"),
    (dict(skip_layers="0-3", draft="layer-skip"), "skip_layers", "layers to skip must lie in [1, 29]"),
    (dict(skip_layers="3-x", draft="layer-skip"), "skip_layers", "is not a layer number or a range like 5-9"),
    (dict(draft="early-exit", exit_after=40), "exit_after", "exit after 1 to 29 of the target's 30 layers"),
    (dict(exit_after=-2), "exit_after", "exit after must be between 0 and 1000"),
    (dict(auto_baseline="sure"), "auto_baseline", "must be true or false"),
]


@pytest.mark.parametrize("change, field, words", INVALID_RUN,
                         ids=[f"{f}={str(list(c.values())[0])[:12]!r}" for c, f, _ in INVALID_RUN])
def test_an_invalid_run_is_refused_by_name_and_the_server_still_answers(client, change, field, words):
    with pytest.raises(Exception) as err:
        client.predict(*args(**change), api_name="/run")
    message = str(err.value)
    assert f"- {field}: " in message and words in message           # HTTP 422 naming every bad parameter
    FIGURES["invalid inputs tried"] += 1
    assert answers_a_valid_run(client)


def test_every_bad_field_of_one_request_is_named_at_once(client):
    with pytest.raises(Exception) as err:
        client.predict(*args(k=0, top_p=9, seed=-5), api_name="/run")
    message = str(err.value)
    assert message.startswith("3 parameter(s) failed validation")
    assert "- k: " in message and "- top_p: " in message and "- seed: " in message
    FIGURES["invalid inputs tried"] += 1


@pytest.mark.parametrize("endpoint, values, words", [
    ("/sweep_k", args(seed=-1), "- seed: seed must be between"),
    ("/sweep_k", args(draft="gemma-3-270m"), "cross-tokenizer"),
    ("/mismatch", ["", TARGET, 8, True], "- prompt: The prompt is empty"),
    ("/mismatch", [PROMPT, TARGET, 0, True], "- max_new_tokens: max new tokens must be between"),
    ("/mismatch", [PROMPT, "no-such-model", 8, True], "- target: Unknown target model"),
    ("/mismatch", [PROMPT, TARGET, 8, "maybe"], "- chat: apply the chat template must be true or false"),
])
def test_the_other_endpoints_validate_too(client, endpoint, values, words):
    with pytest.raises(Exception) as err:
        client.predict(*values, api_name=endpoint)
    assert words in str(err.value)
    FIGURES["invalid inputs tried"] += 1
    assert answers_a_valid_run(client)


def test_a_baseline_before_any_run_is_a_readable_error(playground):
    from gradio_client import Client
    fresh = Client(playground, verbose=False)                     # a new session: no run yet
    with pytest.raises(Exception, match="Run something first"):
        fresh.predict(api_name="/baseline")
    FIGURES["invalid inputs tried"] += 1
    assert answers_a_valid_run(fresh)


# ------------------------------------------------------------------------------------------ models

@pytest.fixture
def faulty_presets(tmp_path, monkeypatch):
    """The real presets plus two that cannot load: a packaged model whose GGUF parts are missing (fails while
    loading) and one whose GGUF file is missing (known unavailable before loading)."""
    package = tmp_path / "spec_fault_parts"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(f"""
        def assemble():
            raise FileNotFoundError("{package}/part-2-of-4.gguf: no such file")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    catalog = yaml.safe_load(Path(se.models.presets_path()).read_text())
    common = dict(kind="gguf-package", package="spec_fault_parts", tokenizer_family="smollm2", params="135M")
    catalog["models"] += [dict(common, name="broken-parts", display_name="Broken parts", assemble="assemble"),
                          dict(common, name="missing-file", display_name="Missing file", gguf_file="missing.gguf")]
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump(catalog))
    monkeypatch.setenv("SPEC_ENGINE_PRESETS", str(path))
    return tmp_path


@pytest.mark.parametrize("change, words", [
    (dict(target="broken-parts"), "the GGUF parts are incomplete (part-2-of-4.gguf: no such file)"),
    (dict(draft="broken-parts"), "the GGUF parts are incomplete"),
    (dict(target="missing-file"), "Missing file cannot be loaded here: missing.gguf is missing from package"),
])
def test_a_model_that_fails_to_load_is_reported_and_the_app_keeps_serving(client, faulty_presets, change, words):
    with pytest.raises(Exception) as err:
        client.predict(*args(**change), api_name="/run")
    message = str(err.value)
    assert words in message
    assert str(faulty_presets) not in message                        # no local paths in what users see
    FIGURES["model load failures reported"] += 1
    assert answers_a_valid_run(client)


def test_custom_hub_ids_pass_validation_only_with_the_flag(client, playground_registry):
    previous = limits.configure(allow_custom_models=True)
    try:
        with pytest.raises(Exception) as err:                        # allowed, but this machine is offline
            client.predict(*args(target="HuggingFaceTB/SmolLM2-360M"), api_name="/run")
    finally:
        limits.configure(previous)
    assert "- target:" not in str(err.value)                          # validation passed: the load said why not
    assert "cannot be loaded here" in str(err.value) and "Hugging Face Hub" in str(err.value)
    FIGURES["invalid inputs tried"] += 1
    assert answers_a_valid_run(client)


def test_no_model_is_ever_loaded_with_remote_code(monkeypatch):
    import re
    root = Path(__file__).resolve().parent.parent
    settings = [m.group(1) for folder in ("spec_engine", "ui") for path in (root / folder).rglob("*.py")
                for m in re.finditer(r"trust_remote_code[\"']?\s*[:=]\s*(\w+)", path.read_text())]
    assert settings and set(settings) == {"False"}
    seen = {}                                                        # and what from_pretrained really receives

    def recorder(kind):
        def from_pretrained(source, **kwargs):
            seen[kind] = kwargs
            return _Stub()
        return from_pretrained

    import transformers
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", recorder("model"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", recorder("tokenizer"))
    se.models.loading._from_pretrained("owner/name", "cpu", "float32", use_safetensors=True)
    assert seen["model"]["trust_remote_code"] is False and seen["tokenizer"]["trust_remote_code"] is False
    assert seen["model"]["use_safetensors"] is True                  # Hub downloads: safetensors or nothing


class _Stub:
    def to(self, *args, **kwargs):
        return self


# ------------------------------------------------------------------------------------- concurrency

def submit_sessions(url: str, seeds) -> list[tuple[int, object]]:
    """One gradio_client session per seed, all submitted at once; polls their status while they run.
    Returns [(seed, job)], and the figures it saw in `observed`."""
    from gradio_client import Client
    clients = [Client(url, verbose=False) for _ in seeds]
    jobs = [(seed, c.submit(*args(seed=seed, **SAMPLED), api_name="/run")) for seed, c in zip(seeds, clients)]
    observed = {"max_position": 0, "max_running": 0}
    from gradio_client.utils import Status
    while not all(job.done() for _, job in jobs):
        statuses = [job.status() for _, job in jobs]
        observed["max_running"] = max(observed["max_running"],
                                      sum(s.code in (Status.PROCESSING, Status.ITERATING) for s in statuses))
        ranks = [s.rank for s in statuses if s.code == Status.IN_QUEUE and s.rank is not None]
        observed["max_position"] = max([observed["max_position"]] + [r + 1 for r in ranks])
        time.sleep(0.02)
    # runs wait at the engine's gate, whose page says "position P of N" (ui/playground/coalesce.py): read from every
    # update each stream sent, not only the newest one a poll happened to see (under CI's load, the poll every 20 ms
    # once saw no wait at all: max_position 1)
    shown = [int(m.group(1)) for _, job in jobs for out in job.outputs()
             for m in [re.search(r"position (\d+) of \d+", str(out))] if m]
    observed["max_position"] = max([observed["max_position"]] + shown)
    return jobs, observed


def check_each_session_got_its_own_run(jobs, references):
    for seed, job in jobs:
        outputs = job.outputs()
        final = outputs[-1][SUMMARY]
        assert final["final"] and final["settings"]["seed"] == seed
        assert final["tokens"] == references[seed], f"seed {seed}: not its solo run"
        for streamed in summaries(outputs):                       # every update of this stream is this run's
            assert streamed["settings"]["seed"] == seed
            assert final["tokens"][:len(streamed["tokens"])] == streamed["tokens"]


@pytest.fixture(scope="module")
def references(smollm2):
    refs = {seed: engine_tokens(smollm2, seed=seed, **SAMPLED) for seed in SEEDS}
    assert len({tuple(tokens) for tokens in refs.values()}) == len(SEEDS)     # mixing could not hide
    return refs


def test_eight_sessions_through_the_single_model_queue_each_get_their_solo_run(playground, references):
    jobs, observed = submit_sessions(playground, SEEDS)
    check_each_session_got_its_own_run(jobs, references)
    assert observed["max_position"] >= 2                          # waiting callers are told their position
    FIGURES["highest queue position reported"] = max(FIGURES["highest queue position reported"],
                                                     observed["max_position"])
    FIGURES["sessions held at once (queued, 1 decoding)"] = max(FIGURES["sessions held at once (queued, 1 decoding)"],
                                                                len(SEEDS))
    FIGURES["runs checked against their solo run"] += len(SEEDS)


@contextlib.contextmanager
def launched(**limit_changes):
    """A second app in this process with other limits and the app's own queue (app.queue), the limits in force
    while it serves (the engine's gate reads the concurrency at each run: ui/playground/coalesce.py)."""
    with launched_demo(**limit_changes) as (url, _demo):
        yield url


@contextlib.contextmanager
def launched_demo(**limit_changes):
    """`launched`, yielding (its URL, its demo)."""
    import app
    from ui.layout import build_demo
    previous = limits.configure(**limit_changes)
    try:
        demo = app.queue(build_demo(preload=False))
        port = free_port()
        demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
        try:
            yield f"http://127.0.0.1:{port}/", demo
        finally:
            demo.close()
    finally:
        limits.configure(previous)


def test_eight_sessions_decoding_in_parallel_do_not_mix(playground_registry, references):
    with launched(concurrency=8) as url:
        jobs, observed = submit_sessions(url, SEEDS)
    check_each_session_got_its_own_run(jobs, references)
    assert observed["max_running"] >= 2                            # they really overlapped
    FIGURES["sessions decoding in parallel (max seen)"] = observed["max_running"]
    FIGURES["runs checked against their solo run"] += len(SEEDS)
    assert playground_registry.holds(TARGET) == 0


def test_a_full_queue_answers_busy_and_the_server_keeps_serving(playground_registry):
    from gradio_client import Client
    with launched(concurrency=1, queue_size=2) as url:
        clients = [Client(url, verbose=False) for _ in range(5)]
        # distinct seeds (identical requests would share one computation); one decodes, two wait (for the batch that
        # will serve them once the run ends: ui/playground/batching.py)
        jobs = []
        for i, client in enumerate(clients[:3]):        # one at a time: three joins at once could fill the queue
            jobs.append(client.submit(*args(max_new_tokens=300, seed=i), api_name="/run"))
            assert wait_until(lambda: coalesce.GATE.busy + coalesce.queued() == i + 1, timeout=60)
        assert coalesce.queued() == 2 and coalesce.GATE.busy == 1
        with pytest.raises(Exception, match="Queue is full"):
            clients[3].predict(*args(), api_name="/run")
        for job in jobs:
            job.cancel()
        assert wait_until(lambda: all(job.done() for job in jobs))
        assert clients[4].predict(*args(max_new_tokens=4), api_name="/run")[SUMMARY]["new_tokens"] >= 1
    FIGURES["queue-full refusals"] += 1
    assert wait_until(lambda: playground_registry.holds(TARGET) == 0)


def refused(job) -> bool:
    from gradio_client.utils import QueueError
    return job.done() and isinstance(job.exception(), QueueError)


def decided(job) -> bool:
    """Refused, or holding its place on the server (its join was answered)."""
    from gradio_client.utils import Status
    return refused(job) or job.status().code not in (Status.STARTING, Status.JOINING_QUEUE)


def test_a_burst_is_admitted_up_to_the_queue_size_exactly_and_every_client_kind_hears_full(playground_registry):
    """Issue #59: with --queue-size 8 a burst of 50 had 13 accepted, and a gradio_client call made while the queue
    was full was served. At most `queue_size` requests wait, besides those being served (a run's turn at the gate,
    and the followers of a computation whose results come): counted from Gradio's queue, the joins in progress and
    every request a model endpoint's handler holds unserved (app.AdmissionQueue)."""
    from gradio_client import Client
    size = 3
    with launched_demo(concurrency=1, queue_size=size) as (url, demo):
        clients = [Client(url, verbose=False) for _ in range(12)]
        # long runs, some identical (the followers of a computation that waits, wait too)
        jobs = [c.submit(*args(max_new_tokens=300, seed=i % 6), api_name="/run") for i, c in enumerate(clients[:10])]
        assert wait_until(lambda: all(decided(job) for job in jobs) and demo._queue.joining == 0, timeout=120)
        assert wait_until(lambda: coalesce.serving() >= 1, timeout=120)          # one run decodes
        for extra in clients[10:]:          # top the line up: one may have started since the burst
            jobs.append(extra.submit(*args(max_new_tokens=300, seed=10 + len(jobs)), api_name="/run"))
            assert wait_until(lambda: decided(jobs[-1]), timeout=60)
        accepted = [job for job in jobs if not refused(job)]
        assert len(accepted) - coalesce.serving() == demo._queue.waiting() == size      # full, and not one more
        assert len(accepted) <= size + coalesce.serving()
        with pytest.raises(Exception, match="Queue is full"):                  # gradio_client
            Client(url, verbose=False).predict(*args(seed=99), api_name="/run")
        config = httpx.get(f"{url}config").json()
        fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "run")
        body = {"data": args(seed=98) + [None], "fn_index": fn_index, "session_hash": uuid.uuid4().hex[:12],
                "event_data": None, "trigger_id": None}
        answer = httpx.post(f"{url}gradio_api/queue/join", json=body)           # the HTTP API
        assert answer.status_code == 503 and "Queue is full" in answer.json()["detail"]
        for job in accepted:
            job.cancel()
        assert wait_until(lambda: all(job.done() for job in jobs), timeout=120)
    FIGURES["queue-full refusals"] += len(jobs) - len(accepted) + 2
    assert wait_until(lambda: playground_registry.holds(TARGET) == 0)


# ------------------------------------------------------------------------------------ cancellation

def running_session(client, demo, min_rounds=3, max_new_tokens=None):
    """Submit a long run and wait until it has streamed `min_rounds` rounds; returns (job, server-side state)."""
    max_new_tokens = max_new_tokens or limits.current().max_new_tokens
    job = client.submit(*args(max_new_tokens=max_new_tokens), api_name="/run")
    for out in job:
        summary = out[SUMMARY]
        if isinstance(summary, dict) and summary.get("rounds", 0) >= min_rounds:
            break
    state = server_session(demo, client.session_hash)
    assert state is not None and state.active is not None
    return job, state


def ended_and_freed(state, registry) -> bool:
    return state.active.work is None and registry.holds(TARGET) == 0


@pytest.fixture
def endless(monkeypatch):
    """Runs that cannot end on their own within a test: the app gets no EOS id (ui.playground.registry.eos_ids -> None),
    so only max_new_tokens (the limit, 1,024 tokens: many seconds) could end them; the prompt alone ends at EOS after 32
    tokens, which let these tests pass with the cancel removed. Returns how each engine stream of the test ended, in
    order: its own stop_reason ("cancelled", "max_new_tokens", ...) or "closed" when the caller closed it mid-run (a
    cancelled or abandoned handler closes the engine's stream: it never reaches an end of its own)."""
    from ui.playground import registry
    monkeypatch.setattr(registry, "eos_ids", lambda loaded: None)
    ends: list[str] = []
    stream = se.SpeculativeDecoder.stream

    def watched(self, *a, **kw):
        inner = stream(self, *a, **kw)                     # validates and prefills now, as the real one does

        def rounds():
            reason = "closed"
            try:
                for event in inner:
                    reason = event.stop_reason or reason
                    yield event
            finally:
                ends.append(reason)
        return rounds()
    monkeypatch.setattr(se.SpeculativeDecoder, "stream", watched)
    return ends


def test_cancel_mid_run_ends_it_frees_it_and_the_session_runs_again(client, playground, smollm2, playground_registry,
                                                                    endless):
    """A cancelled API job. How many ~30 ms rounds run before the server sees the cancel depends on its load, so
    that count is only reported; that no round runs once the handler is closed is tested without a server
    (test_ui_handlers.py::test_closing_the_run_generator_ends_the_run_at_once_and_frees_it)."""
    import app
    before = live_run_objects()
    job, state = running_session(client, app.demo)
    rounds_at_cancel = len(state.active.record.rounds)
    job.cancel()
    assert wait_until(lambda: ended_and_freed(state, playground_registry))
    extra = len(state.active.record.rounds) - rounds_at_cancel
    assert endless and endless[0] in ("cancelled", "closed"), endless       # ended from outside, not by itself
    assert state.active.record.stop_reason == "cancelled", state.active.record.stop_reason
    assert state.active.record.tokens and len(state.active.record.tokens) < limits.current().max_new_tokens
    assert live_run_objects() <= before                            # its caches are gone
    FIGURES["cancellations"] += 1
    FIGURES["most rounds after a cancel"] = max(FIGURES["most rounds after a cancel"], extra)

    final = client.predict(*args(), api_name="/run")[SUMMARY]      # the same session, at once
    assert final["tokens"] == engine_tokens(smollm2)                # (8 tokens: EOS comes later for this prompt)


def test_a_closed_stream_ends_the_run_and_frees_it(playground, playground_registry, endless):
    """What a closed tab does to the server: the event stream disconnects mid-run."""
    import app
    config = httpx.get(f"{playground}config").json()
    fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "run")
    session = uuid.uuid4().hex[:12]
    before = live_run_objects()
    body = {"data": args(max_new_tokens=limits.current().max_new_tokens) + [None], "fn_index": fn_index,
            "session_hash": session, "event_data": None, "trigger_id": None}
    assert httpx.post(f"{playground}gradio_api/queue/join", json=body).status_code == 200
    seen = 0
    with httpx.stream("GET", f"{playground}gradio_api/queue/data", params={"session_hash": session},
                      timeout=60) as stream:
        for line in stream.iter_lines():
            if '"process_generating"' in line:
                seen += 1
                if seen >= 5:
                    break                                           # and the connection closes, mid-run
    state = server_session(app.demo, session)
    rounds_at_close = len(state.active.record.rounds)
    assert wait_until(lambda: ended_and_freed(state, playground_registry))
    extra = len(state.active.record.rounds) - rounds_at_close
    assert endless == ["closed"] or endless == ["cancelled"], endless       # ended from outside, not by itself
    assert state.active.record.stop_reason == "cancelled", state.active.record.stop_reason
    assert len(state.active.record.tokens) < limits.current().max_new_tokens   # extra: reported only (see above)
    assert live_run_objects() <= before
    FIGURES["cancellations"] += 1
    FIGURES["most rounds after a cancel"] = max(FIGURES["most rounds after a cancel"], extra)


PLAIN_TOKENS = 60
PLAIN_TOKEN_SECONDS = 0.25      # added to each plain decoding step: 60 tokens take >= 15 s, so Stop must end them


def test_stop_during_plain_decoding_ends_it_too(client, playground_registry, endless, monkeypatch):
    """The baseline runs in a worker thread; Stop (its cancels=) ends it within one token: plain decoding reports
    stop_reason "cancelled". It cannot end first: no EOS (`endless`) and each of its 60 steps slowed by 0.25 s
    (its should_stop poll, once a token); the test stays well inside the handler's time limit, so the limit cannot
    be what ended it."""
    began = time.monotonic()
    plain = []
    generate = se.autoregressive_generate

    def slow_plain(*a, should_stop, **kw):
        plain.append(generate(*a, should_stop=lambda: time.sleep(PLAIN_TOKEN_SECONDS) or should_stop(), **kw))
        return plain[-1]
    monkeypatch.setattr(se, "autoregressive_generate", slow_plain)
    job = client.submit(*args(draft="prompt-lookup", max_new_tokens=PLAIN_TOKENS, auto_baseline=True), api_name="/run")
    seen = []
    for out in job:
        stats = out[RUN_OUTPUTS.index("stats")]
        seen.append(stats)
        if isinstance(stats, str) and "without drawing: plain decoding" in stats:
            break
    else:
        pytest.fail(f"plain decoding never started; the last status lines: {seen[-3:]}")
    client.predict(api_name="/stop")
    assert wait_until(job.done)
    assert wait_until(lambda: playground_registry.holds(TARGET) == 0)
    assert not any(t.name == "plain-decoding" for t in threading.enumerate())
    assert [r.stop_reason for r in plain] == ["cancelled"] and len(plain[0].tokens) < PLAIN_TOKENS, plain
    assert time.monotonic() - began < 0.8 * limits.current().max_run_seconds
    FIGURES["cancellations"] += 1
    assert answers_a_valid_run(client)


def test_launch_flags_override_the_environment(playground, monkeypatch):
    import app
    monkeypatch.setenv("SPEC_MAX_EXTRA_MODELS", "3")
    monkeypatch.setenv("SPEC_CONCURRENCY", "2")
    flags = app.parse_args(["--allow-custom-models", "--concurrency", "4", "--max-run-seconds", "30"])
    got = limits.from_env(**vars(flags))
    assert got.allow_custom_models and got.concurrency == 4 and got.max_run_seconds == 30
    assert got.max_extra_models == 3                                # not given as a flag: the environment's
    monkeypatch.delenv("SPEC_ALLOW_CUSTOM_MODELS", raising=False)
    assert limits.from_env(**vars(app.parse_args([]))).allow_custom_models is False   # off unless asked for
    assert limits.current().allow_custom_models is False             # the test app: presets only


def test_port_and_host_flags_are_the_variables_gradio_reads(playground):
    import app
    environ = {}
    rest = app.listen_where(vars(app.parse_args(["--port", "7999", "--host", "0.0.0.0", "--concurrency", "2"])),
                            environ)
    assert environ == {"GRADIO_SERVER_PORT": "7999", "GRADIO_SERVER_NAME": "0.0.0.0"}
    assert "port" not in rest and "host" not in rest and rest["concurrency"] == 2
    environ = {}
    app.listen_where(vars(app.parse_args([])), environ)
    assert environ == {}                                            # not given: Gradio's defaults or the variables


def test_an_upload_over_the_trace_limit_is_refused_before_it_is_stored(playground):
    """The only uploads are traces: Gradio itself refuses a file over their 20 MiB limit (HTTP 413)."""
    from spec_engine.classroom.trace import MAX_BYTES
    upload = playground + "gradio_api/upload"
    with httpx.Client(timeout=120) as http:
        small = http.post(upload, files={"files": ("trace.json", b"{}")})
        big = http.post(upload, files={"files": ("trace.json", b" " * (MAX_BYTES + 1))})
        alive = http.get(playground)
    assert small.status_code == 200 and len(small.json()) == 1
    assert big.status_code == 413 and "maximum allowed size" in big.text
    assert alive.status_code == 200
