"""End to end over HTTP: app.py's demo launched on 127.0.0.1 (session fixture `playground`), driven by
gradio_client exactly as a remote caller would; the streamed numbers are checked against the engine."""
import time

import pytest

import spec_engine as se
from ui.playground import handlers
from ui.playground.handlers import RUN_OUTPUTS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPT = "Write one sentence about the sea."
SUMMARY = RUN_OUTPUTS.index("summary")


def args(**kw):
    values = dict(prompt=PROMPT, target="smollm2-135m-instruct", draft="layer-skip", k=4, temperature=0, top_p=1.0,
                  top_k=0, max_new_tokens=16, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0,
                  auto_baseline=True, show_spaces=False)
    values.update(kw)
    return [values[name] for name in handlers.RUN_INPUTS]


@pytest.fixture(scope="module")
def client(playground):
    from gradio_client import Client
    return Client(playground, verbose=False)


def summaries(outputs):
    return [out[SUMMARY] for out in outputs if isinstance(out[SUMMARY], dict) and "final" in out[SUMMARY]]


def test_api_lists_the_public_endpoints(client):
    names = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/run", "/stop", "/baseline", "/sweep_k", "/mismatch"} <= names
    assert not any(name.startswith(("/on_", "/apply_", "/rerender")) for name in names)


def test_streamed_run_arrives_round_by_round_and_matches_the_engine(client, smollm2, monkeypatch):
    monkeypatch.setattr(handlers, "RENDER_INTERVAL", 0.0)      # same process: one update per round
    job = client.submit(*args(), api_name="/run")
    seen = [out for out in job]                              # iterate as updates stream in
    outputs = job.outputs()
    assert job.status().success
    rounds = [s["rounds"] for s in summaries(outputs) if not s["final"]]
    assert len(rounds) >= 2 and rounds == sorted(rounds) and len(set(rounds)) == len(rounds)
    assert len(seen) >= 2
    final = outputs[-1][SUMMARY]
    assert final["final"] and final["stop_reason"] in ("eos", "max_new_tokens")

    ids = smollm2.encode_prompt(PROMPT, chat=True)
    reference = se.SpeculativeDecoder(smollm2.model, se.make_drafter("layer-skip", smollm2)).generate(
        ids, k=4, max_new_tokens=16, sampling=se.SamplingParams(temperature=0), seed=0,
        eos_token_id=smollm2.model.generation_config.eos_token_id)
    assert final["tokens"] == reference.tokens
    assert final["rounds"] == reference.stats.rounds
    assert final["acceptance_rate"] == pytest.approx(reference.stats.acceptance_rate)
    assert final["new_tokens"] == len(reference.tokens)
    assert final["speedup"] is not None and final["matches_baseline"] is True
    assert f'{final["acceptance_rate"]:.0%}' in outputs[-1][RUN_OUTPUTS.index("stats")]
    tokens_html = outputs[-1][RUN_OUTPUTS.index("tokens")]
    assert tokens_html.count('class="round" data-round=') == final["rounds"]


def test_a_bad_request_is_a_readable_error_and_the_app_keeps_serving(client):
    job = client.submit(*args(skip_layers="0-3"), api_name="/run")
    with pytest.raises(Exception, match=r"layers to skip must lie in \[1, 29\]"):
        job.result()
    with pytest.raises(Exception, match="temperature must be >= 0"):     # the validator, before the queue
        client.submit(*args(temperature=-1), api_name="/run").result()
    good = client.submit(*args(draft="prompt-lookup", max_new_tokens=4, auto_baseline=False), api_name="/run")
    assert good.result()[SUMMARY]["new_tokens"] >= 1


def test_stop_over_the_api_ends_the_run_within_one_round(client):
    job = client.submit(*args(draft="prompt-lookup", max_new_tokens=400, auto_baseline=False), api_name="/run")
    started = None
    for out in job:
        summary = out[SUMMARY]
        if isinstance(summary, dict) and summary.get("rounds", 0) >= 2:
            started = summary["rounds"]
            break
    assert started is not None
    stopped = client.submit(api_name="/stop").result()
    assert "Stopped after" in stopped[RUN_OUTPUTS.index("stats")]
    final = stopped[SUMMARY]
    assert final["stop_reason"] == "cancelled" and final["rounds"] >= started and final["new_tokens"] < 400
    deadline = time.monotonic() + 10
    while not job.done() and time.monotonic() < deadline:     # the streamed job ends too (cancelled or stopped)
        time.sleep(0.1)
    assert job.done()
