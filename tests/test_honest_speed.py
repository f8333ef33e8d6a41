"""A run's status line says where its speed comes from: a run measured by its own computation says "this run"; one
that followed an identical request's computation says plainly that it was shared with another student, and never
that it measured anything itself; a finished computation is never handed out again (tests/test_coalesce_units.py),
so pressing Run again measures again. Synthetic events, no model, no Gradio server."""
import dataclasses

import spec_engine as se
from ui.playground import handlers, runner
from ui.playground.state import RunSettings, SessionState

from test_ui_render import LABEL, event

SETTINGS = RunSettings(target="t", draft="prompt-lookup", k=4, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=4,
                       seed=0, rule="exact", chat=False, prompt="p")
ROUNDS = [dataclasses.replace(event([1, 2], 2, [1, 2, 3], bonus=3), finished=True, stop_reason="max_new_tokens")]


def timed_result(seconds: float) -> se.GenerationResult:
    rounds = [dataclasses.replace(r, round_seconds=seconds) for r in ROUNDS]
    return se.GenerationResult(tokens=[1, 2, 3], rounds=rounds, prompt_len=1, prefill_seconds=0.0,
                               total_seconds=seconds, stop_reason="max_new_tokens", stats=None)


def plain_result(seconds: float) -> se.BaselineResult:
    return se.BaselineResult(tokens=[1, 2, 3], prompt_len=1, prefill_seconds=0.0, total_seconds=seconds,
                             step_seconds=[seconds / 3] * 2, stop_reason="max_new_tokens")


def measured_status(shared: bool, viewers: int = 1) -> str:
    state = SessionState()
    record = state.new_run(SETTINGS, "prompt-lookup", (0,))
    for r in ROUNDS:
        record.rounds.append(r)
        record.fragments.append("")
    record.stop_reason = "max_new_tokens"
    runner.keep_timing(record, state, timed_result(0.1), LABEL, shared=shared)
    runner.keep_baseline(record, state, plain_result(0.2), shared=shared)
    if viewers > 1:
        runner.add_label(record, state, handlers.shared_label(viewers))
    state.finish(record)
    return handlers.speed_note(state.summary(record))


def test_a_run_measured_by_its_own_computation_says_this_run():
    note = measured_status(shared=False)
    assert note.startswith("Speed: speculative decoded again without drawing at ")
    assert "(this run)" in note and "shared" not in note


def test_a_run_that_followed_another_students_computation_never_says_it_measured_itself():
    note = measured_status(shared=True, viewers=3)
    assert "(this run)" not in note
    assert note.count(f"({runner.SHARED_MEASUREMENT})") == 2            # the speculative side and the plain one
    assert "Shared with another student: one computation served 3 identical requests" in note
    assert "'Measure the speedup again'" in note                         # how to get a measurement of its own


def test_the_leader_of_a_shared_computation_measured_it_and_says_it_was_shared():
    note = measured_status(shared=False, viewers=2)
    assert "(this run)" in note and runner.SHARED_MEASUREMENT not in note
    assert "Shared with another student: one computation served 2 identical requests" in note
