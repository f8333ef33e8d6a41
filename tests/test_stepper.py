"""Step-through: the state machine on a scripted event sequence (no model), its renderers, and one live run
on the tiny models whose rounds must equal the engine's own `generate`."""
import dataclasses
import re

import pytest
import torch

import spec_engine as se
from ui.views import plots
from ui.classroom import stepper
from ui.views.render import RenderOptions
from ui.playground.state import RunSettings, SessionState
from ui.classroom.stepper import StepSession, Stepper
from ui.views.tokens import dict_labeler

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
    from ui.classroom import tabs as classroom
    from ui.playground import handlers
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
    main_outputs = list(handlers.run(*[run_values[name] for name in handlers.RUN_INPUTS], main))
    timing = ("draft_seconds", "verify_seconds", "round_seconds", "prefill_seconds")
    strip = lambda ev: {k: v for k, v in ev.to_dict().items() if k not in timing}   # noqa: E731
    assert [strip(e) for e in session.stepper.events] == [strip(e) for e in main.active.record.rounds]
    assert main.history == [main.active.record]                      # stepping never touched the main history

    text = main_outputs[-1][handlers.RUN_OUTPUTS.index("explain")]
    summary = main.summary(main.active.record)
    assert f"{summary['rounds']} rounds (one target forward each) produced {summary['new_tokens']} new tokens" in text
    assert f"({summary['acceptance_rate']:.0%} acceptance)" in text
    assert f"{summary['tokens_per_forward']:.2f} tokens per target forward" in text
    assert f"expects {summary['expected_tokens_per_forward']:.2f} tokens per target forward" in text   # theory chip

    reset = list(classroom.step_reset(*values, session))[-1]
    assert reset[0] is not session and reset[0].stepper.position == 0 and not reset[0].stepper.events


# ------------------------------------------------------------------------------------------ finders, KV growth

def test_find_goes_to_the_next_matching_round_and_stays_put_when_there_is_none():
    source = Scripted(SCRIPT)            # all 4 accepted; first rejection at draft 2; at draft 1 (the run ends)
    s = Stepper(source)
    assert s.find(stepper.rejects_at(2)) is SCRIPT[1] and s.position == 2 and source.calls == 2
    assert s.find(stepper.all_accepted) is None and s.position == 2 and source.calls == 3   # computed, recorded
    assert s.finished and len(s.events) == 3
    s.back()
    s.back()
    assert s.find(stepper.rejects_at(1)) is SCRIPT[2] and s.position == 3 and source.calls == 3   # no recompute
    s.reset(None, SCRIPT)
    assert s.find(stepper.all_accepted) is SCRIPT[0] and s.position == 1
    assert s.find(stepper.all_accepted) is None and s.position == 1            # only the next rounds count
    assert [stepper.rejects_at(i)(SCRIPT[1]) for i in (1, 2, 3, 4)] == [False, True, False, False]
    assert not stepper.all_accepted(event(0, [], 0, bonus=5))                 # nothing drafted: not "all accepted"


def live_session(target, draft, seed, max_new_tokens=40, k=4):
    ids = torch.tensor([[1, 2, 3]])
    sampling = se.SamplingParams(temperature=1.0)
    reference = se.SpeculativeDecoder(target, se.ModelDrafter(draft)).generate(
        ids, k=k, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed).rounds
    decoder = se.SpeculativeDecoder(target, se.ModelDrafter(draft))
    state = decoder.start(ids, k=k, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed)
    s = StepSession(Stepper(lambda: decoder.step(state)), dataclasses.replace(SETTINGS, k=k), "tiny", [1, 2, 3], "",
                    dict_labeler({}), RenderOptions())
    return s, reference


def strip(ev):
    return {k: v for k, v in ev.to_dict().items() if k not in ("draft_seconds", "verify_seconds", "round_seconds",
                                                                  "prefill_seconds")}


def test_finders_on_tiny_models_stop_at_the_engines_own_round(target, draft):
    """The rounds found are the rounds `generate` makes with the same seed: the engine, not a staged round."""
    s, reference = live_session(target, draft, seed=3)
    wanted = [(f"rejects {i}", stepper.rejects_at(i)) for i in (1, 2, 3, 4)] + [("all", stepper.all_accepted)]
    found_any = 0
    for name, rule in wanted:
        s.stepper.reset(s.stepper._advance, s.stepper.events)            # same recording, back to the start
        first = next((r for r in reference if rule(r)), None)
        ev = s.stepper.find(rule)
        if first is None:
            assert ev is None and s.stepper.position == 0, name
            continue
        found_any += 1
        assert strip(ev) == strip(first) and s.stepper.position == first.index + 1, name
        following = next((r for r in reference[first.index + 1:] if rule(r)), None)
        again = s.stepper.find(rule)
        assert (again is None) == (following is None) and (again is None or strip(again) == strip(following)), name
    assert found_any == 4          # this seed: first rejections at drafts 1, 2, 3 and all-accepted rounds; none at 4
    assert s.stepper.finished and [strip(e) for e in s.stepper.events] == [strip(e) for e in reference]


def test_kv_growth_is_accepted_plus_one_for_the_target(target, draft):
    s, reference = live_session(target, draft, seed=1)
    while s.stepper.forward() is not None:
        html = stepper.view(s)["kv"]
        ev, previous = s.stepper.current, s.stepper.previous
        target_grew, draft_grew = plots.cache_growth(ev, previous)
        assert target_grew == ev.accepted + 1 == len(ev.emitted)           # the tiny models have no EOS
        assert f"<td>+{ev.accepted + 1}</td>" in html and "(accepted + 1)" in html
        if previous is None:
            assert draft_grew is None
        else:
            assert draft_grew == ev.draft_cache_len - previous.draft_cache_len
        assert not re.search(r"--|−-|-−|trimmed -|\(−?-", html)
    rows = plots.kv_rows(s.stepper.events)
    assert rows[-1][0] == 1 and rows[-1][-1] == "–"                       # round 1: the draft's prefill isn't recorded
    for row, ev in zip(rows[::-1], s.stepper.events):
        assert row[plots.KV_COLUMNS.index("target grew")] == f"+{ev.accepted + 1}"
    assert len(plots.KV_COLUMNS) == len(rows[0])


def test_cache_changes_are_signed_right():
    """A drafter that feeds positions in after trimming (EAGLE) ends the trim step longer: that is "+5" and
    "added 5", never "(−-5)" or "trimmed -5"."""
    fed_back = dataclasses.replace(SCRIPT[1], draft_cache_len_before=10, draft_cache_len=15)
    trimmed = dataclasses.replace(SCRIPT[1], index=2, draft_cache_len_before=15, draft_cache_len=12)
    html = stepper.kv_html(fed_back, SCRIPT[0])
    assert "added 5" in html and "trimmed 1" in html and "trimmed -" not in html    # target: 10 -> 9
    assert "trimmed 3" in stepper.kv_html(trimmed, fed_back) and "<td>−3</td>" in stepper.kv_html(trimmed, fed_back)
    rows = plots.kv_rows([fed_back, trimmed])
    assert rows[1][5] == "10 → 15 (+5)" and rows[0][5] == "15 → 12 (−3)"
    assert rows[0][plots.KV_COLUMNS.index("draft grew")] == "−3" and rows[0][-1] == "–"     # no tree: no tree column
    assert rows[1][4] == "10 → 9 (−1)"
    for text in [html] + [str(cell) for row in rows for cell in row]:
        assert not re.search(r"--|−-|-−|trimmed -", text), text
    assert [plots.signed(n) for n in (3, 0, -2)] == ["+3", "0", "−2"]


def test_finder_handlers_say_when_the_run_ends_without_the_round():
    import gradio as gr
    from ui.classroom import tabs as classroom
    s = session(SCRIPT)
    out = list(classroom.find_round({}, s, "reject:4", "round rejecting draft 4"))
    status = out[-1][1 + classroom.STEP_OUTPUTS.index("status")]
    assert "No round rejecting draft 4 in this run (the run ended: max_new_tokens, 3 rounds)" in status
    assert s.stepper.position == 0 and s.stepper.finished
    out = list(classroom.step_find_accepted(*[None] * len(classroom.STEP_INPUTS), s))
    assert out[-1][0] is s and s.stepper.position == 1 and "Round 1 of 3 recorded" in out[-1][1]
    for bad in (0, 2.5, None, True, se.MAX_K + 1):
        with pytest.raises(gr.Error, match="whole number"):
            list(classroom.step_find_rejection(*[None] * len(classroom.STEP_INPUTS), bad, s))
    with pytest.raises(gr.Error, match="past k = 4"):
        list(classroom.step_find_rejection(*[None] * len(classroom.STEP_INPUTS), 5, s))
    out = list(classroom.step_find_rejection(*[None] * len(classroom.STEP_INPUTS), 1, s))
    assert s.stepper.position == 3 and "First rejection at position 1" in out[-1][2]


def test_finder_buttons_are_private_and_queue_with_the_engine():
    from ui.layout import build_demo
    demo = build_demo(preload=False)
    fns = {getattr(fn.fn, "__name__", None): fn for fn in demo.fns.values()}
    for name in ("step_find_rejection", "step_find_accepted"):
        assert fns[name].api_visibility == "private"
        assert (fns[name].concurrency_id, fns[name].concurrency_limit) == (fns["step_forward"].concurrency_id,
                                                                          fns["step_forward"].concurrency_limit)


@pytest.mark.slow
def test_show_me_finds_the_4th_of_5_drafts_rejected_in_one_click(playground_registry):
    """The step-through's lesson button: the controls are set to the lesson's settings and the view shows a round
    that drafted 5 tokens, accepted the first 3 and rejected the 4th (a correction drawn in its place)."""
    from ui.classroom import tabs as classroom
    outputs = list(classroom.step_lesson("smollm2-135m-instruct", False))
    session = outputs[-1][0]
    shown = session.stepper.current
    assert len(shown.drafted) == 5 and shown.accepted == 3 and shown.correction is not None
    assert shown.rejected == shown.drafted[3]
    controls = dict(zip(classroom.LESSON_CONTROLS + ("position",), outputs[0][-len(classroom.LESSON_CONTROLS) - 1:]))
    assert controls["k"] == 5 and controls["draft"] == "layer-skip" and controls["position"] == 4
    assert session.settings.k == 5 and session.settings.prompt == controls["prompt"]
