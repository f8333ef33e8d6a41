"""The app's batch lane (ui/playground/batching.py) on tiny models: runs that join while others decode share one
batch, each gets the tokens it gets alone, a stopped or invalid run leaves without disturbing the others, the lane
waits for its turn at the gate like any computation and gives it back, and the choice between a lone run and the
batch follows the gate."""
import threading

import pytest
import torch

import spec_engine as se
from spec_engine.core.batch import Request
from ui.playground import batching, coalesce
from ui.playground.coalesce import Gate
from tiny import tiny_llama

VOCAB = 40
PROMPTS = [[1, 2, 3], [4, 5], [7, 8, 9, 7, 8], [2, 2, 2, 2], [9, 1, 9, 1], [3], [5, 6, 5, 6, 5, 6]]
GREEDY = se.SamplingParams(0.0)
SAMPLED = se.SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=VOCAB, layers=2, seed=11)


@pytest.fixture(scope="module")
def draft_model():
    return tiny_llama(vocab=VOCAB, layers=1, seed=12)


def drafter(i, draft_model):
    return [lambda: se.ModelDrafter(draft_model), lambda: se.PromptLookupDrafter(),
            lambda: se.ModelTreeDrafter(draft_model)][i % 3]()


def request(i, draft_model, sampling=GREEDY, tokens=16, k=3):
    return Request(("run", i), torch.tensor([PROMPTS[i]]), drafter(i, draft_model), k=k, max_new_tokens=tokens,
                   sampling=sampling, seed=50 + i)


def lone(target, draft_model, i, sampling=GREEDY, tokens=16):
    return se.SpeculativeDecoder(target, drafter(i, draft_model)).generate(
        torch.tensor([PROMPTS[i]]), k=3, max_new_tokens=tokens, sampling=sampling, seed=50 + i).tokens


def collect(lane, req, out, should_stop=lambda: False, seconds=60.0):
    items = list(lane.join(req, should_stop, seconds))
    out[req.id[1]] = items


def tokens_of(items):
    return [t for item in items if isinstance(item, se.RoundEvent) for t in item.emitted]


def take_turn(gate):
    """A turn at an empty gate, as a lone run takes it."""
    def waited(waiting):
        raise AssertionError("an empty gate made a request wait")
    ticket = coalesce.turn(gate, lambda: False, waited)
    assert ticket is not None and gate.busy == 1
    return ticket


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_runs_that_join_together_share_a_batch_and_keep_their_lone_tokens(target, draft_model, sampling):
    """Greedy: exactness. Sampled under the exact rule: the batch keeps each run's lone draft lengths, so its seed
    gives its lone text (BatchDecoder.pinned)."""
    gate = Gate(capacity=lambda: 1)
    lane = batching.Lane(target, gate, on_engine=False)
    ticket = take_turn(gate)                             # something else decodes: the runs gather in the lane
    out = {}
    threads = [threading.Thread(target=collect, args=(lane, request(i, draft_model, sampling), out))
               for i in range(len(PROMPTS))]
    for thread in threads:
        thread.start()
    for _ in range(200):
        if len(lane.pending) == len(PROMPTS):
            break
        threading.Event().wait(0.02)
    assert len(lane.pending) == len(PROMPTS) and lane.decoding() == 0     # waiting for the turn, not decoding
    gate.leave(ticket)
    for thread in threads:
        thread.join(120)
    assert sorted(out) == list(range(len(PROMPTS)))
    for i, items in out.items():
        assert tokens_of(items) == lone(target, draft_model, i, sampling), i
        sizes = [item.batch_size for item in items if isinstance(item, batching.InBatch)]
        assert sizes and max(sizes) == len(PROMPTS)     # all of them in one forward at some round
        assert isinstance(items[-1], se.GenerationResult) and items[-1].tokens == tokens_of(items)
    assert gate.busy == 0 and not lane.busy              # the turn went back with the last run


def test_a_stopped_run_leaves_and_the_others_finish(target, draft_model):
    lane = batching.Lane(target, Gate(capacity=lambda: 1), on_engine=False)
    out, stopped = {}, threading.Event()
    threads = [threading.Thread(target=collect, args=(lane, request(i, draft_model, tokens=24), out,
                                                      stopped.is_set if i == 1 else (lambda: False)))
               for i in range(3)]
    stopped.set()                                        # run 1 is stopped before its turn: it leaves at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert tokens_of(out[1]) == []
    for i in (0, 2):
        assert tokens_of(out[i]) == lone(target, draft_model, i, tokens=24)


def test_a_run_that_times_out_is_cancelled_between_rounds(target, draft_model):
    lane = batching.Lane(target, Gate(capacity=lambda: 1), on_engine=False)
    items = list(lane.join(request(0, draft_model, tokens=200), lambda: False, seconds=0.0))
    result = items[-1]
    assert isinstance(result, se.GenerationResult) and result.stop_reason == "cancelled"
    assert len(result.tokens) < 200


def test_an_invalid_run_gets_its_own_error_and_the_others_decode(target, draft_model):
    lane = batching.Lane(target, Gate(capacity=lambda: 1), on_engine=False)
    bad = Request(("run", 5), torch.tensor([[VOCAB + 3]]), se.PromptLookupDrafter(), max_new_tokens=8)
    errors, out = [], {}

    def bad_run():
        try:
            list(lane.join(bad, lambda: False, 60.0))
        except ValueError as error:
            errors.append(str(error))
    threads = [threading.Thread(target=bad_run), threading.Thread(target=collect,
                                                                  args=(lane, request(0, draft_model), out))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors and "request ('run', 5)" in errors[0]
    assert tokens_of(out[0]) == lone(target, draft_model, 0)


def test_a_run_alone_decodes_alone_and_runs_meanwhile_batch(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(batching, "monotonic", lambda: now[0])
    gate = Gate(capacity=lambda: 1)
    lanes = batching.Lanes(gate)
    assert lanes.choose() is False                       # nothing decodes: alone, measured alone
    assert lanes.choose() is True                        # the first is still on its way to the gate: batch
    ticket = take_turn(gate)                             # it holds the gate
    now[0] += batching.CLAIM_SECONDS
    assert lanes.choose() is True                        # it decodes: batch
    gate.leave(ticket)
    lanes.done_alone()
    assert lanes.choose() is False                       # it is done: the next run decodes alone at once
    assert lanes.choose() is True                        # (and holds its own claim)
    now[0] += batching.CLAIM_SECONDS                     # a claim whose run never reached the gate nor ended (its
    assert lanes.choose() is False                       # handler vanished) expires: it cannot batch every later run


def test_the_line_a_batched_run_shows():
    text = batching.describe([1, 4, 4, 3])
    assert "1-4 sequences per forward" in text and "median 3.5" in text and "up to 3 others" in text
    assert "no lone speedup" in text
    assert "(2 sequences per forward, median 2; up to 1 other)" in batching.describe([2, 2])
    assert "was alone in it" in batching.describe([1, 1]) and "sequences" not in batching.describe([1])


# ------------------------------------------------------------------------------ through the app's handlers

def app_run(seed=0, **kw):
    from test_ui_handlers import run_args
    from ui.playground import handlers
    from ui.playground.state import SessionState
    args = dict(prompt="Tell me about the sea.", draft="prompt-lookup", k=4, max_new_tokens=12, auto_baseline=True)
    args.update(kw)
    return list(handlers.run(*run_args(seed=seed, **args), SessionState()))


@pytest.mark.slow           # 5 runs, then two alone, 12 tokens on SmolLM2 (about 15 s on two cores)
def test_runs_that_arrive_while_one_decodes_share_a_batch_and_say_so(playground_registry):
    """Student 0 decodes alone; students 1-4 press Run meanwhile, 4 with 3's request (one computation for both)."""
    from test_ui_handlers import SUMMARY
    from ui.playground import coalesce
    prompts = [f"Tell me about the sea. (Student {i}.)" for i in range(4)] + ["Tell me about the sea. (Student 3.)"]
    out = {}

    def student(i):
        out[i] = app_run(prompt=prompts[i])
    threads = [threading.Thread(target=student, args=(i,)) for i in range(5)]
    threads[0].start()
    for _ in range(600):
        if coalesce.GATE.busy:
            break
        threading.Event().wait(0.05)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(300)
    finals = {i: outputs[-1][SUMMARY] for i, outputs in out.items()}
    labels = {i: " ".join(s.get("labels") or ()) for i, s in finals.items()}
    assert finals[0]["speedup"] is not None and "batch" not in labels[0]     # measured alone
    for i in range(1, 5):                                                      # batched: said, and no lone speedup
        assert "decoded in a batch" in labels[i] and finals[i]["speedup"] is None, i
    assert sum("shared with another student" in labels[i] for i in (3, 4)) == 2     # the twins: one computation
    streamed = [str(o) for i in range(1, 5) for o in out[i]]
    assert any("in a batch of" in text for text in streamed)                  # the page says so while it decodes
    assert finals[4]["tokens"] == finals[3]["tokens"]
    for i in (1, 3):                                                           # greedy: the tokens it gets alone
        assert finals[i]["tokens"] == app_run(prompt=prompts[i], auto_baseline=False)[-1][SUMMARY]["tokens"]


def test_a_run_answers_gradio_once_per_render_interval_not_once_per_round(playground_registry, monkeypatch):
    """Gradio 6 rebuilds every output component for an empty update (about 10 ms of its event loop on two cores),
    so a run does not answer every round: with a render interval longer than the run, it answers a few times only."""
    from test_ui_handlers import SUMMARY
    from ui.playground import handlers
    monkeypatch.setattr(handlers, "RENDER_INTERVAL", 1000.0)
    outputs = app_run(auto_baseline=False, max_new_tokens=24)
    rounds = outputs[-1][SUMMARY]["rounds"]
    assert rounds >= 8 and len(outputs) < rounds
