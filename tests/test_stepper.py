"""Step-through: the state machine on a scripted event sequence (no model), its renderers, and one live run
on the tiny models whose rounds must equal the engine's own `generate`."""
import dataclasses
import re

import pytest
import torch

import spec_engine as se
from ui import stepper
from ui.render import RenderOptions
from ui.state import RunSettings, SessionState
from ui.stepper import StepSession, Stepper
from ui.tokens import dict_labeler

from test_explain import event

LABEL = dict_labeler({1: " a", 2: " b", 3: " c", 4: " d", 5: "<b>", 6: " x", 7: " y", 8: " z", 9: " w"})
SETTINGS = RunSettings(target="tiny", draft="tiny-draft", k=4, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=20,
                       seed=0, rule="exact", chat=False, prompt="p")
SCRIPT = [event(0, [1, 2, 3, 4], 4, bonus=5), event(1, [1, 2, 3, 4], 1, correction=6),
          event(2, [1, 2], 0, correction=7, stop="max_new_tokens")]


class Scripted:
    """An `advance` that hands out the scripted rounds and counts how often the engine was asked."""

    def __init__(self, events):
        self.events, self.calls = list(events), 0

    def __call__(self):
        self.calls += 1
        return self.events[self.calls - 1]


def test_forward_computes_only_at_the_end_and_back_never_computes():
    source = Scripted(SCRIPT)
    s = Stepper(source)
    assert (s.position, s.current, s.can_back, s.can_forward, s.live) == (0, None, False, True, True)
    assert s.forward() is SCRIPT[0] and source.calls == 1
    assert s.forward() is SCRIPT[1] and source.calls == 2
    assert s.back() is SCRIPT[0] and s.position == 1 and source.calls == 2
    assert s.back() is None and s.position == 0 and not s.can_back
    assert s.back() is None and s.position == 0
    assert s.forward() is SCRIPT[0] and s.forward() is SCRIPT[1] and source.calls == 2    # replayed, not recomputed
    assert s.shown == SCRIPT[:2] and len(s.events) == 2
    assert s.forward() is SCRIPT[2] and source.calls == 3
    assert s.finished and not s.live and not s.can_forward
    assert s.forward() is None and source.calls == 3 and s.position == 3
    s.back()
    assert s.can_forward and s.forward() is SCRIPT[2] and source.calls == 3


def test_reset_forgets_everything_and_a_recording_without_engine_only_replays():
    s = Stepper(Scripted(SCRIPT))
    s.forward()
    s.reset()
    assert (s.events, s.position, s.live, s.can_forward) == ([], 0, False, False)
    replay = Stepper(None, SCRIPT[:2])
    assert replay.can_forward and not replay.live
    assert [replay.forward(), replay.forward(), replay.forward()] == [SCRIPT[0], SCRIPT[1], None]
    assert replay.position == 2


def session(events, greedy=False):
    settings = dataclasses.replace(SETTINGS, temperature=0.0) if greedy else SETTINGS
    return StepSession(Stepper(Scripted(events)), settings, "tiny-draft", [1, 2], "ab", LABEL,
                       RenderOptions(greedy=greedy, rule="exact"))


def test_round_view_shows_every_number_of_the_round():
    s = session(SCRIPT)
    v = stepper.view(s)
    assert "press Forward" in v["round"] and v["explain"] == ""
    s.stepper.forward()
    s.stepper.forward()
    v = stepper.view(s)
    ev = SCRIPT[1]
    rows = re.findall(r'<tr class="(\w+)">', v["round"])
    assert rows == ["accepted", "rejected", "discarded", "discarded", "correction"]
    assert "First rejection at position 2" in v["round"] and "&quot; b&quot;" in v["round"]
    assert "Discarded after it (never judged): &quot; c&quot;, &quot; d&quot;" in v["round"]
    assert "u ≥ min(1, p/q): rejected" in v["round"] and "u &lt; min(1, p/q): accepted" in v["round"]
    assert f"<td>{ev.target_cache_len_before}</td><td>{ev.target_cache_len}</td>" in v["kv"]
    assert v["tokens"].count('class="round"') == 2 and "Round 2 of 2 recorded" in v["status"]
    assert "2 rounds (one target forward each)" in v["explain"]
    bars = v["residual"].data[0]
    assert list(bars.y) == [p for _, p in ev.next_top] and "Residual" in v["residual"].layout.title.text
    assert "<b>" not in v["round"]                                    # token text is escaped

    s.stepper.back()
    v = stepper.view(s)
    assert v["tokens"].count('class="round"') == 1 and "bonus" in v["round"] and "Round 1 of 2" in v["status"]


def test_greedy_rounds_say_argmax_not_draws():
    greedy = [event(0, [1, 2, 3], 1, correction=9, uniforms=False)]
    s = session(greedy, greedy=True)
    s.stepper.forward()
    html = stepper.view(s)["round"]
    assert "= target argmax: accepted" in html and "argmax is &quot; a&quot;: rejected" in html
    assert "u (draw)" in html and "min(1, p/q): " not in html


def test_live_stepping_on_tiny_models_equals_generate(target, draft):
    ids = torch.tensor([[1, 2, 3]])
    sampling = se.SamplingParams(temperature=1.0)
    reference = se.SpeculativeDecoder(target, se.ModelDrafter(draft)).generate(ids, k=3, max_new_tokens=14,
                                                                               sampling=sampling, seed=5)
    decoder = se.SpeculativeDecoder(target, se.ModelDrafter(draft))
    state = decoder.start(ids, k=3, max_new_tokens=14, sampling=sampling, seed=5)
    s = StepSession(Stepper(lambda: decoder.step(state)), dataclasses.replace(SETTINGS, k=3), "tiny", [1, 2, 3], "",
                    dict_labeler({}), RenderOptions())
    for _ in range(3):
        s.stepper.forward()
    s.stepper.back()
    s.stepper.back()
    while s.stepper.forward() is not None:
        pass
    timing = ("draft_seconds", "verify_seconds", "round_seconds", "prefill_seconds")

    def strip(ev):
        return {k: v for k, v in ev.to_dict().items() if k not in timing}
    assert [strip(e) for e in s.stepper.events] == [strip(e) for e in reference.rounds]
    view = stepper.view(s)
    assert view["tokens"].count('class="round"') == len(reference.rounds)
    assert "the run ended" in view["status"]


@pytest.mark.slow
def test_step_handlers_on_smollm2_follow_the_main_run(playground_registry, monkeypatch):
    """Forward / Back / Reset through the Gradio handlers: the stepped rounds are the main run's rounds, and
    the main view's explanation states the main run's numbers."""
    from ui import classroom, handlers
    monkeypatch.setattr(handlers, "RENDER_INTERVAL", 0.0)
    controls = dict(prompt="Name three colours.", target="smollm2-135m-instruct", draft="layer-skip", k=3,
                    temperature=0, top_p=1.0, top_k=0, max_new_tokens=10, seed=0, rule="exact", chat=True,
                    skip_layers="", exit_after=0, show_spaces=False)
    values = [controls[name] for name in classroom.STEP_INPUTS]
    out = list(classroom.step_forward(*values, None))[-1]
    session = out[0]
    assert session.stepper.position == 1 and out[classroom.STEP_OUTPUTS.index("tokens") + 1].count('class="round"') == 1
    for _ in range(20):
        out = list(classroom.step_forward(*values, session))[-1]
    assert session.stepper.finished and session.stepper.position == len(session.stepper.events)
    out = classroom.step_back(session)
    assert session.stepper.position == len(session.stepper.events) - 1
    assert "the run ended" in out[1]

    main = SessionState()
    run_values = dict(controls, auto_baseline=False)
    list(handlers.run(*[run_values[name] for name in handlers.RUN_INPUTS], main))
    timing = ("draft_seconds", "verify_seconds", "round_seconds", "prefill_seconds")
    strip = lambda ev: {k: v for k, v in ev.to_dict().items() if k not in timing}   # noqa: E731
    assert [strip(e) for e in session.stepper.events] == [strip(e) for e in main.active.record.rounds]
    assert main.history == [main.active.record]                      # stepping never touched the main history

    text = classroom.explain_latest(main)
    summary = handlers.summarize(main.active.record)
    assert f"{summary['rounds']} rounds (one target forward each) produced {summary['new_tokens']} new tokens" in text
    assert f"({summary['acceptance_rate']:.0%} acceptance)" in text
    assert f"{summary['tokens_per_forward']:.2f} tokens per target forward" in text
    assert f"expects {summary['expected_tokens_per_forward']:.2f} tokens per target forward" in text   # theory chip

    reset = list(classroom.step_reset(*values, session))[-1]
    assert reset[0] is not session and reset[0].stepper.position == 0 and not reset[0].stepper.events
