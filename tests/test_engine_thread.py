"""The app's CPU decoding runs on the engine's long-lived threads (ui/playground/engine_thread.py): GNU OpenMP slows
every parallel region by about a third once more threads than one keep a pool of OpenMP workers, and the app used to
decode on Gradio's handler threads and a fresh thread per measurement."""
import threading

import pytest

from ui.playground import engine_thread


def here() -> str:
    return threading.current_thread().name


def test_call_runs_on_an_engine_thread_and_hands_back_results_and_errors():
    assert here() == "MainThread"
    assert engine_thread.call(here).startswith("engine")
    assert engine_thread.call(here, enabled=False) == "MainThread"          # GPU work stays where it is
    with pytest.raises(ZeroDivisionError):
        engine_thread.call(lambda: 1 / 0)
    # Called from an engine thread, it runs inline: one engine thread never waits for itself.
    assert engine_thread.call(lambda: engine_thread.call(here)).startswith("engine")


def test_iterate_computes_each_item_on_an_engine_thread_and_closes_the_generator():
    closed = []

    def rounds():
        try:
            for i in range(3):
                yield i, here()
        finally:
            closed.append(here())

    items = list(engine_thread.iterate(rounds()))
    assert [i for i, _ in items] == [0, 1, 2] and all(name.startswith("engine") for _, name in items)
    assert closed and closed[0].startswith("engine")                 # ran out on the engine's thread
    stream = engine_thread.iterate(rounds())
    next(stream)
    stream.close()                                                  # a consumer that stops early closes it here
    assert closed[-1] == "MainThread"
    assert [name for _, name in engine_thread.iterate(rounds(), enabled=False)] == ["MainThread"] * 3


def test_the_pool_follows_the_servers_concurrency(monkeypatch):
    one = engine_thread.pool(1)
    assert engine_thread.pool(1) is one and engine_thread.pool(2) is not one
    engine_thread.pool(1)


@pytest.mark.slow          # one short run of SmolLM2 with its timed run and plain decoding (about 3 s)
def test_a_run_decodes_only_on_the_engine_thread(playground_registry, monkeypatch):
    """Build, prefill, rounds, the timed run and plain decoding: every step that runs the model. The prefill ran on
    the handler's thread (SpeculativeDecoder.stream prefills before its first round), which kept a second OpenMP
    pool alive and throttled every run after it."""
    import spec_engine as se
    from spec_engine.core.decoder import SpeculativeDecoder
    from ui.playground import handlers
    from ui.playground.state import SessionState
    from test_ui_handlers import run_args

    where: dict[str, set] = {}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            where.setdefault(name, set()).add(here())
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(SpeculativeDecoder, "start", spy("prefill", SpeculativeDecoder.start))
    monkeypatch.setattr(SpeculativeDecoder, "step", spy("round", SpeculativeDecoder.step))
    monkeypatch.setattr(SpeculativeDecoder, "generate", spy("timed", SpeculativeDecoder.generate))
    monkeypatch.setattr(se, "autoregressive_generate", spy("plain", se.autoregressive_generate))
    list(handlers.run(*run_args(draft="prompt-lookup", max_new_tokens=8, auto_baseline=True), SessionState()))
    assert set(where) == {"prefill", "round", "timed", "plain"}, where
    assert all(name.startswith("engine") for names in where.values() for name in names), where


@pytest.mark.slow          # the step-through's lesson button on SmolLM2 (a few rounds)
def test_the_step_through_steps_on_the_engine_thread(playground_registry, monkeypatch):
    """The step-through decoded on the handler's thread too: after a lesson's step-through every run was throttled."""
    from spec_engine.core.decoder import SpeculativeDecoder
    from ui.classroom import tabs as classroom

    where = set()
    step = SpeculativeDecoder.step
    monkeypatch.setattr(SpeculativeDecoder, "step", lambda self, *a, **k: where.add(here()) or step(self, *a, **k))
    list(classroom.step_lesson("smollm2-135m-instruct", False))
    assert where and all(name.startswith("engine") for name in where), where
