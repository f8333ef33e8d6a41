"""Issue #36: the main panel's Sweep k measured the speculative side 5-10 times slower than Run. Its point for the
current settings must be the Run at those settings: the same rounds, and timed the same way (the second pass of the
decoder, by `decoder.generate` in a worker thread while the handler waits, nothing drawn or built for a view)."""
import pytest

import spec_engine as se
from ui.playground import handlers, runner, sweep
from ui.playground.state import SessionState

from test_ui_handlers import run_args


@pytest.mark.slow          # three short runs of SmolLM2 (about 12 s on two busy cores)
def test_the_sweep_point_for_the_current_settings_is_the_run(playground_registry, monkeypatch):
    timed = []
    in_worker = runner.in_worker
    monkeypatch.setattr(runner, "in_worker", lambda work, budget, label, **kw: timed.append(label) or
                        in_worker(work, budget, label, **kw))
    displays = []                                    # what each timed run builds of its events (display=...)
    generate = se.SpeculativeDecoder.generate
    monkeypatch.setattr(se.SpeculativeDecoder, "generate", lambda self, *a, **kw: displays.append(kw.get("display"))
                        or generate(self, *a, **kw))
    monkeypatch.setattr(sweep, "SWEEP_K", (3, 1))
    monkeypatch.setattr(handlers, "SETTLE_SECONDS", 0.0)
    args = run_args(draft="prompt-lookup", k=3, max_new_tokens=8, auto_baseline=True)
    state = SessionState()
    list(handlers.run(*args, state))
    run_labels, timed[:] = list(timed), []
    list(sweep.sweep_k(*args, state))
    run, point, other = state.history
    assert (run.settings, point.settings.k, other.settings.k) == (point.settings, 3, 1)
    assert point.tokens == run.tokens and len(point.rounds) == len(run.rounds)
    assert [(r.drafted, r.accepted) for r in point.rounds] == [(r.drafted, r.accepted) for r in run.rounds]
    assert point.timing.tokens / len(point.timing.rounds) == run.timing.tokens / len(run.timing.rounds)
    assert len(point.fragments) == len(point.rounds) and point.stop_reason == run.stop_reason
    # the same timing path: Run's speed and every sweep point come from a timed run in the worker thread
    assert run_labels == ["timed-run", "plain-decoding"]
    # plain decoding measured once for the sweep, back to back with its first point, as Run measures its own
    assert timed == ["timed-run", "plain-decoding", "timed-run"]
    assert point.timing.how == run.timing.how == "decoded again without drawing"
    # every timed run decodes as plain decoding does, nothing for a view: its rounds keep the first pass's display
    # parts (Run's live pass, a sweep point's first pass, not drawn), with the timed clocks
    assert displays == [False, False, False]
    for record in (run, point):
        assert all(r.target_top and len(r.target_probs) == len(r.drafted) for r in record.timing.rounds if r.drafted)
    assert [r.verify_seconds for r in run.timing.rounds] != [r.verify_seconds for r in run.rounds]
    summary = state.summary(point)
    assert summary["speedup"] is not None and summary["timed"] is not False
