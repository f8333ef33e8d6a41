"""Handlers called directly (no server) with the real offline default, SmolLM2-135M, and short outputs."""
import time

import gradio as gr
import pytest
import torch

import spec_engine as se
from ui.playground import callbacks, handlers, mismatch, runner, sweep
from ui.playground.handlers import RUN_OUTPUTS
from ui.playground.presets import load_presets
from ui.playground.state import SessionState

PROMPT = "Name three colours."
TARGET = "smollm2-135m-instruct"
SUMMARY = RUN_OUTPUTS.index("summary")


def run_args(**kw):
    args = dict(prompt=PROMPT, target=TARGET, draft="layer-skip", k=3, temperature=0, top_p=1.0, top_k=0,
                max_new_tokens=12, seed=0, rule="exact", chat=True, skip_layers="", exit_after=0,
                auto_baseline=False, show_spaces=False)
    args.update(kw)
    return [args[name] for name in handlers.RUN_INPUTS]


def is_summary(value):
    return isinstance(value, dict) and "final" in value    # gr.skip() is a dict too


def summaries(outputs):
    return [out[SUMMARY] for out in outputs if is_summary(out[SUMMARY])]


@pytest.fixture
def every_round(monkeypatch):
    monkeypatch.setattr(handlers, "RENDER_INTERVAL", 0.0)


def engine_run(smollm2, draft, k, max_new_tokens, sampling, seed=0):
    ids = smollm2.encode_prompt(PROMPT, chat=True)
    decoder = se.SpeculativeDecoder(smollm2.model, se.make_drafter(draft, smollm2), rule="exact")
    return decoder.generate(ids, k=k, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                            eos_token_id=smollm2.model.generation_config.eos_token_id)


@pytest.mark.slow
def test_run_streams_every_round_and_matches_the_engine(playground_registry, smollm2, every_round):
    state = SessionState()
    outputs = list(handlers.run(*run_args(auto_baseline=True), state))
    streamed = [s for s in summaries(outputs) if not s["final"]]
    final = outputs[-1][SUMMARY]
    assert final["final"] and len(streamed) >= 2
    assert [s["rounds"] for s in streamed] == list(range(1, final["rounds"] + 1))
    reference = engine_run(smollm2, "layer-skip", 3, 12, se.SamplingParams(temperature=0))
    assert final["tokens"] == reference.tokens
    assert (final["accepted"], final["drafted"]) == (reference.stats.accepted, reference.stats.drafted)
    assert final["acceptance_rate"] == pytest.approx(reference.stats.acceptance_rate)
    assert final["speedup"] is not None and final["baseline_tokens_per_second"] > 0
    assert final["matches_baseline"] is True                     # greedy + exact rule = plain decoding's text
    assert final["dtype"] == "float32" and "data-note" not in outputs[-1][RUN_OUTPUTS.index("stats")]
    html = outputs[-1][RUN_OUTPUTS.index("tokens")]
    assert html.count('data-kind="accepted"') == final["accepted"]
    assert 'class="round" data-round=' in html
    history = outputs[-1][RUN_OUTPUTS.index("history")]
    assert len(history) == 1 and history.iloc[0]["draft"] == "layer-skip"
    assert len(state.history) == 1


PLOTTED = [RUN_OUTPUTS.index(name) for name in ("acceptance_plot", "accepted_plot", "forward_plot", "speed_plot",
                                                 "kv_plot", "kv_table")]


def is_skip(value):
    return isinstance(value, dict) and value.get("__type__") == "update" and len(value) == 1


@pytest.mark.slow
@pytest.mark.parametrize("plot_interval", [0.0, 1e9])
def test_streamed_updates_redraw_the_plots_only_every_plot_interval(playground_registry, every_round, monkeypatch,
                                                                    plot_interval):
    monkeypatch.setattr(handlers, "PLOT_INTERVAL", plot_interval)
    outputs = [out for out in handlers.run(*run_args(), SessionState()) if is_summary(out[SUMMARY])]
    streamed, final = outputs[:-1], outputs[-1]
    assert len(streamed) >= 3 and not any(is_skip(out[RUN_OUTPUTS.index("tokens")]) for out in streamed)
    redrawn = [not any(is_skip(out[i]) for i in PLOTTED) for out in streamed]
    assert all(redrawn[i] == all(not is_skip(out[i]) for i in PLOTTED) for i, out in enumerate(streamed))
    # every update when the interval is 0; otherwise the first one only (and the round that ends the run)
    assert redrawn[1:-1] == [plot_interval == 0.0] * (len(streamed) - 2) and redrawn[0]
    assert not any(is_skip(final[i]) for i in PLOTTED)                       # the final view always has them


@pytest.mark.slow
def test_sampling_run_matches_the_engine_with_the_same_seed(playground_registry, smollm2):
    outputs = list(handlers.run(*run_args(draft="prompt-lookup", temperature=0.8, top_p=0.9, seed=7, k=4),
                                SessionState()))
    final = outputs[-1][SUMMARY]
    reference = engine_run(smollm2, "prompt-lookup", 4, 12, se.SamplingParams(temperature=0.8, top_p=0.9), seed=7)
    assert final["tokens"] == reference.tokens
    assert "baseline pending" in outputs[-1][RUN_OUTPUTS.index("stats")]


@pytest.mark.slow
def test_stop_ends_the_run_within_one_round_and_records_it_once(playground_registry, every_round):
    state = SessionState()
    gen = handlers.run(*run_args(draft="prompt-lookup", max_new_tokens=200), state)
    seen = 0
    for out in gen:
        if is_summary(out[SUMMARY]) and out[SUMMARY]["rounds"] >= 2:
            seen = out[SUMMARY]["rounds"]
            break
    stopped = next(handlers.stop(state))                 # the view sent at once (and again, later)
    assert "Stopped after" in stopped[RUN_OUTPUTS.index("stats")]
    assert stopped[SUMMARY]["stop_reason"] == "cancelled"
    rest = summaries(gen)
    last_rounds = rest[-1]["rounds"] if rest else seen
    assert last_rounds <= seen + 1
    assert len(state.history) == 1 and state.history[0].stop_reason == "cancelled"
    assert state.history[0].tokens and len(state.history[0].tokens) < 200


def releases_here(registry, monkeypatch) -> list[str]:
    """The names `registry.release` lets go of from this thread from now on. Counted per thread, not read from the
    registry's total holds: a run another test left finishing in the app (its own thread) may let go meanwhile."""
    import threading
    here, released, release = threading.get_ident(), [], registry.release

    def recording(name):
        if threading.get_ident() == here:
            released.append(name)
        release(name)
    monkeypatch.setattr(registry, "release", recording)
    return released


def test_closing_the_run_generator_ends_the_run_at_once_and_frees_it(playground_registry, every_round, monkeypatch):
    """What Gradio does to the handler on a cancelled job or a closed tab: it closes the generator. No round runs
    after that, and the run's GPU function (its decoder) and its hold on the model are released in the same call."""
    released = releases_here(playground_registry, monkeypatch)
    state = SessionState()
    gen = handlers.run(*run_args(draft="prompt-lookup", max_new_tokens=200), state)
    for out in gen:
        if is_summary(out[SUMMARY]) and out[SUMMARY]["rounds"] >= 2:
            break
    prep = state.active
    rounds = len(prep.record.rounds)
    work = prep.work
    assert work is not None and work.gi_frame is not None and prep.held == [TARGET] and released == []
    assert playground_registry.holds(TARGET) >= 1
    gen.close()
    assert prep.work is None and work.gi_frame is None and prep.held == [] and released == [TARGET]
    assert prep.record.stop_reason == "cancelled"
    time.sleep(0.3)                                  # ~10 rounds' time: an engine left running elsewhere would show
    assert len(prep.record.rounds) == rounds and len(prep.record.tokens) < 200


def test_a_run_generator_dropped_without_closing_frees_its_hold_at_once(playground_registry, every_round, monkeypatch):
    """If a server drops a run's generator without closing it, Python finalizes it when its last reference goes:
    with the garbage collector off, that happens at once only if no reference cycle keeps the generator (or
    what it runs) alive, so the hold cannot wait for a collection that may come late (#25)."""
    import gc
    released = releases_here(playground_registry, monkeypatch)
    state = SessionState()
    gen = handlers.renewing(handlers.run)(*run_args(draft="prompt-lookup", max_new_tokens=200), state)
    for out in gen:
        if is_summary(out[SUMMARY]) and out[SUMMARY]["rounds"] >= 2:
            break
    prep = state.active
    assert prep.work is not None and prep.held == [TARGET] and released == []
    gc.collect()
    gc.disable()
    try:
        del gen, out
        assert prep.work is None and prep.held == [] and released == [TARGET]
    finally:
        gc.enable()
    assert prep.record.stop_reason == "cancelled"


@pytest.mark.slow
def test_measure_baseline_button_adds_the_speedup(playground_registry):
    state = SessionState()
    list(handlers.run(*run_args(draft="prompt-lookup", max_new_tokens=8), state))
    outputs = list(handlers.measure_baseline(state))
    final = outputs[-1][SUMMARY]
    assert final["speedup"] is not None
    assert "Speedup ×" in outputs[-1][RUN_OUTPUTS.index("speed_plot")].layout.title.text
    again = list(handlers.measure_baseline(state))[-1][SUMMARY]               # measured again, same key
    assert again["speedup"] is not None and len(state.baselines) == 1


@pytest.mark.parametrize("change, words", [
    (dict(temperature=-1), "temperature must be >= 0"),
    (dict(k=0), "k must be between 1 and 16"),
    (dict(k=2.5), "k must be a whole number"),
    (dict(top_p=0), "top_p must be in (0, 1]"),
    (dict(prompt="   "), "prompt is empty"),
    (dict(draft="no-such-model"), "Draft"),
    (dict(rule="sloppy"), "Verification rule"),
    (dict(max_new_tokens=0), "max new tokens must be between"),
    (dict(seed=-1), "seed must be between"),
])
def test_bad_parameters_raise_readable_errors(change, words):
    with pytest.raises(gr.Error) as err:
        list(handlers.run(*run_args(**change), SessionState()))
    assert words in str(err.value.message)


@pytest.mark.slow
@pytest.mark.parametrize("change, words", [
    (dict(skip_layers="0-3"), "layers to skip must lie in [1, 29]"),
    (dict(draft="early-exit", exit_after=40), "exit after 1 to 29"),
])
def test_bad_draft_options_raise_readable_errors(playground_registry, change, words):
    with pytest.raises(gr.Error) as err:
        list(handlers.run(*run_args(**change), SessionState()))
    assert words in str(err.value.message)


def test_unavailable_model_is_a_readable_error(monkeypatch):
    monkeypatch.setattr(handlers.reg, "availability", lambda name: (False, "needs the Hugging Face Hub (offline here)"))
    with pytest.raises(gr.Error) as err:
        list(handlers.run(*run_args(), SessionState()))
    assert "cannot be loaded here: needs the Hugging Face Hub" in str(err.value.message)


def test_out_of_memory_becomes_a_readable_error():
    with pytest.raises(gr.Error, match="Out of memory"):
        with handlers.friendly_errors():
            raise torch.OutOfMemoryError("CUDA out of memory")
    with pytest.raises(gr.Error, match="Something went wrong: KeyError"):
        with handlers.friendly_errors():
            raise KeyError("x")


def test_unavailable_target_warns_and_reverts(monkeypatch):
    state = SessionState()
    state.target = TARGET
    monkeypatch.setattr(handlers.reg, "availability", lambda name: (name == TARGET, "needs the Hugging Face Hub"))
    with pytest.warns(UserWarning, match="unavailable here: needs the Hugging Face Hub"):
        target_update, draft_update = callbacks.on_target("qwen2.5-1.5b-instruct", "layer-skip", state)
    assert target_update["value"] == TARGET and "choices" not in draft_update


def test_scenario_sets_every_control():
    presets = load_presets()
    values = callbacks.apply_scenario("prompt-lookup-edit", presets, TARGET)
    prompt, target, draft, k, temperature, top_p, top_k, max_new, seed, rule, chat, caption = values
    assert "Rewrite" in prompt and target == TARGET and draft["value"] == "prompt-lookup" and k == 8
    assert rule == "exact" and "Prompt lookup" in caption


@pytest.mark.slow
def test_show_spaces_rerenders_the_current_run(playground_registry):
    state = SessionState()
    list(handlers.run(*run_args(draft="prompt-lookup", max_new_tokens=6), state))
    assert "·" in callbacks.rerender(True, state)
    assert '<span class="ws">·</span>' not in callbacks.rerender(False, state)


@pytest.mark.slow
def test_tokenizer_mismatch_demo(playground_registry, gemma, monkeypatch):
    playground_registry.put(gemma)
    monkeypatch.setattr(mismatch, "MISMATCH_MAX_NEW_TOKENS", 8)
    state = SessionState()
    outputs = list(mismatch.mismatch_demo(PROMPT, TARGET, 64, True, state))
    status, table, figure, views, tokenization, history, _ = outputs[-1]
    assert list(table["draft"].str[:4]) == ["(a) ", "(b) ", "(c) ", "(c')"]
    naive = table["acceptance"][0]
    assert naive <= 0.25                      # unrelated ids: almost everything is rejected
    bars = [y for trace in figure.data for y in trace.y]    # the pair's bars (a trace each), then the others in grey
    assert bars == pytest.approx(list(table["acceptance"]), abs=1e-3)
    for trace in figure.data[:2]:                                                      # each bar inside its interval
        for rate, (low, high, *_) in zip(trace.y, trace.customdata):
            assert low <= rate <= high
    assert views.count('class="spec-view"') == 4
    assert "SmolLM2" in tokenization and "Gemma" in tokenization
    assert len(history) == 4 and len(state.history) == 4
    # Every draft runs to its end (each run of the demo has its own budget: releasing one run cancelled the
    # budget the next ones shared, and they stopped after one round), and the naive ids are the lowest.
    assert [r.stop_reason for r in state.history] != ["cancelled"] * 4
    assert all(r.stop_reason in ("max_new_tokens", "eos") for r in state.history)
    assert all(len(r.tokens) == 8 or r.stop_reason == "eos" for r in state.history)
    assert naive == min(table["acceptance"]) and naive < max(table["acceptance"])


@pytest.mark.slow
def test_sweep_k_fills_the_history_with_one_baseline(playground_registry, monkeypatch):
    monkeypatch.setattr(sweep, "SWEEP_K", (1, 3))
    state = SessionState()
    outputs = list(sweep.sweep_k(*run_args(draft="prompt-lookup", max_new_tokens=6, auto_baseline=True), state))
    assert [r.settings.k for r in state.history] == [1, 3]
    assert len(state.baselines) == 1                         # k and the draft do not change plain decoding
    # each k runs to its end: the sweep's runs share one deadline, but releasing one must not cancel the next
    assert [r.stop_reason for r in state.history] == ["max_new_tokens"] * 2
    assert all(len(r.tokens) == 6 and r.timing is not None for r in state.history)
    history = outputs[-1][RUN_OUTPUTS.index("history")]
    assert list(history["k"]) == [3, 1] and history["speedup"].notna().all()


def test_stop_while_waiting_for_a_model_stops_waiting():
    import threading
    stop = threading.Event()

    def loading():
        for i in range(100):
            if i == 2:
                stop.set()
            yield f"loading {i}"
        return "model"

    seen = []
    gen = handlers.relay(loading(), lambda m: seen.append(m) or m, stop)
    assert list(gen) == ["loading 0", "loading 1", "loading 2"] and seen[-1] == "loading 2"


def test_a_draft_that_does_not_fit_the_target_is_a_readable_error():
    with pytest.raises(gr.Error) as err:
        list(handlers.run(*run_args(target="gemma-3-270m", draft="eagle"), SessionState()))
    assert "not available for Gemma" in str(err.value.message) and "trained for smollm2" in str(err.value.message)


@pytest.mark.slow
def test_the_speedup_comes_from_runs_timed_without_drawing(playground_registry, every_round):
    """The live run is drawn round by round; its clocks never reach the speedup. The speculative run is decoded
    again with nothing drawn (same rounds) and plain decoding too, and tokens/s, costs and speedup use those."""
    state = SessionState()
    outputs = list(handlers.run(*run_args(draft="prompt-lookup", max_new_tokens=10, auto_baseline=True), state))
    record = state.active.record
    final = outputs[-1][SUMMARY]
    timing = record.timing
    assert timing is not None and final["timed"] and timing.how == "decoded again without drawing"
    assert [r.emitted for r in timing.rounds] == [r.emitted for r in record.rounds]   # the same rounds...
    assert timing.rounds[0] is not record.rounds[0]                                      # ...decoded again
    baseline = state.baseline_for(record)
    assert final["tokens_per_second"] == pytest.approx(len(record.tokens) / timing.seconds)
    assert final["speedup"] == pytest.approx(final["tokens_per_second"] / baseline.tokens_per_second)
    assert final["baseline_timing"].endswith("(this run)") and "without drawing" in final["timing"]
    stats = outputs[-1][RUN_OUTPUTS.index("stats")]
    assert "Speed: speculative decoded again without drawing" in stats
    # The first update replaces the previous run's explanation (issue #38: it stayed up to 1.4 s), and while the run
    # streams the explanation says it is running (it never describes another run); the final one is set.
    assert outputs[0][RUN_OUTPUTS.index("explain")] == handlers.RUNNING_EXPLANATION
    explains = [out[RUN_OUTPUTS.index("explain")] for out in outputs if is_summary(out[SUMMARY])]
    assert all(text == handlers.RUNNING_EXPLANATION for text in explains[:-1])
    assert explains[-1].startswith("**What happened.**")


@pytest.mark.slow
def test_export_takes_the_run_on_screen_not_the_newest_in_the_history(playground_registry, gemma, monkeypatch):
    from ui.classroom import replay
    playground_registry.put(gemma)
    monkeypatch.setattr(mismatch, "MISMATCH_MAX_NEW_TOKENS", 4)
    state = SessionState()
    list(handlers.run(*run_args(max_new_tokens=6), state))
    shown = state.active.record
    list(mismatch.mismatch_demo(PROMPT, TARGET, 64, True, state))       # adds four runs to the history
    assert state.history[-1] is not shown
    trace = replay.export_latest(state)
    assert trace.display["run_id"] == shown.run_id and trace.tokens == shown.tokens


def test_a_child_budget_with_a_share_stops_at_its_share_within_the_handlers_deadline():
    import threading
    parent = runner.Budget(threading.Event(), seconds=100.0)
    slow, fast = parent.child(0.05), parent.child()
    slow.start()
    assert fast.deadline == parent.deadline and slow.deadline < parent.deadline
    time.sleep(0.06)
    assert slow.timed_out and slow.should_stop() and not fast.timed_out and not parent.timed_out
    slow.cancel.set()                                    # release() of the slow run cancels it alone
    assert not fast.should_stop() and not parent.should_stop()
    later = parent.child(1000.0)
    later.start()
    assert later.deadline == parent.deadline             # a share never outlasts the handler's own deadline


@pytest.mark.slow
def test_each_run_keeps_the_plain_decoding_measured_right_after_it(playground_registry):
    """Plain decoding is measured again after every run (back to back with its timed run); an earlier run in the
    history keeps its own measurement rather than taking the newest one for the same key."""
    state = SessionState()
    for _ in range(2):
        list(handlers.run(*run_args(draft="prompt-lookup", max_new_tokens=6, auto_baseline=True), state))
    first, second = state.history
    assert first.plain is not None and second.plain is not None and first.plain[0] is not second.plain[0]
    assert state.baseline_for(first) is first.plain[0] and state.baseline_for(second) is second.plain[0]
    summary = state.summary(first)
    assert summary["speedup"] == pytest.approx(first.timing.tokens_per_second / first.plain[0].tokens_per_second)
    assert summary["baseline_timing"].endswith("(this run)")
