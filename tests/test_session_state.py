"""A session's state (ui/playground/state.py) on hand-made rounds and baselines: the run summary's every field, the
history table's row, the baselines kept (most recent last, at most MAX_BASELINES), a copy per session, and what a
session leaves behind when it expires. No model is loaded."""
import copy
import dataclasses
import time
from types import SimpleNamespace

import pytest

from ui.playground import state as st
from ui.playground.state import RunRecord, RunSettings, SessionState, Timing, summarize
from test_ui_render import event

SETTINGS = RunSettings(target="t", draft="layer-skip", k=4, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=16,
                       seed=0, rule="exact", chat=True, prompt="hi")
SAMPLED = dataclasses.replace(SETTINGS, temperature=0.7, top_p=0.9, top_k=20, seed=5)


def rounds():
    """Two rounds (prefill 0.5 s, 0.03 s each): 4 drafted, 2 kept, then 4 drafted, all kept; 8 tokens."""
    first = dataclasses.replace(event([1, 2, 3, 4], 2, [1, 2, 6], correction=6, index=0), prefill_seconds=0.5)
    return [first, event([5, 6, 7, 8], 4, [5, 6, 7, 8, 9], bonus=9, index=1)]


def baseline(tokens_per_second=4.0, tokens=(1, 2, 6, 5, 9)):
    return SimpleNamespace(tokens_per_second=tokens_per_second, total_seconds=2.0, tokens=list(tokens),
                           step_seconds=[0.02, 0.02])


def record(settings=SETTINGS, run_id=3, **fields):
    return RunRecord(run_id, settings, "Layer skip", (1, 2), rounds=rounds(), **fields)


def test_a_sampled_runs_baseline_key_carries_its_sampling_and_seed():
    assert SAMPLED.baseline_key((1, 2)) == ("t", (1, 2), 0.7, 20, 0.9, 5, 16)
    assert SETTINGS.baseline_key((1, 2)) == ("t", (1, 2), 0.0, 0, 1.0, 0, 16)
    params = SAMPLED.sampling()
    assert (params.temperature, params.top_k, params.top_p) == (0.7, 20, 0.9)
    assert Timing(0.0, 5, (), 0.0, "x").tokens_per_second == 0.0
    assert Timing(2.0, 5, (), 0.0, "x").tokens_per_second == 2.5


def test_a_live_summary_says_what_it_has_and_what_it_lacks():
    out = summarize(record(dtype="", scenario="S1 · one", labels=["shared"]))
    assert {key: out[key] for key in ("run_id", "scenario", "target", "draft", "draft_label", "k", "rounds",
                                      "new_tokens", "drafted", "accepted", "tokens_per_forward")} == dict(
        run_id=3, scenario="S1 · one", target="t", draft="layer-skip", draft_label="Layer skip", k=4, rounds=2,
        new_tokens=8, drafted=8, accepted=6, tokens_per_forward=4.0)
    assert out["seconds"] == pytest.approx(0.56) and out["tokens_per_second"] == pytest.approx(8 / 0.56)
    assert out["live_tokens_per_second"] == out["tokens_per_second"] and out["timed"] is False
    assert out["timing"] is None and out["dtype"] is None and out["labels"] == ["shared"]
    assert out["tree_nodes_per_round"] is None and out["tokens"] == [1, 2, 6, 5, 6, 7, 8, 9]
    assert all(out[key] is None for key in ("baseline_timing", "baseline_tokens_per_second", "baseline_seconds",
                                            "speedup", "matches_baseline", "first_difference"))
    assert out["expected_tokens_per_forward"] == pytest.approx(st.metrics.expected_tokens_per_round(
        out["judged_acceptance"], 4))
    assert summarize(record(), baseline())["speedup"] is None               # live clocks: no speedup
    empty = summarize(RunRecord(1, SETTINGS, "x", (1,)))
    assert (empty["tokens_per_forward"], empty["tokens_per_second"], empty["live_tokens_per_second"]) == (0, 0, 0)


def test_a_timed_summary_against_its_baseline_names_both_measurements():
    timed = record(timing=Timing(0.25, 8, tuple(rounds()), 0.0, "run without drawing"), dtype="float32")
    out = summarize(timed, baseline(), {"at": None, "run_id": 3, "note": None})
    assert out["timed"] and out["seconds"] == 0.25 and out["tokens_per_second"] == 32.0
    assert out["live_tokens_per_second"] == pytest.approx(8 / 0.56) and out["dtype"] == "float32"
    assert out["timing"] == "run without drawing at " + st.clock(0.0)
    assert out["baseline_timing"] == "decoded without drawing at  (this run)"
    assert (out["baseline_tokens_per_second"], out["baseline_seconds"], out["speedup"]) == (4.0, 2.0, 8.0)
    assert out["matches_baseline"] is False and out["first_difference"] == 4      # 6 where plain decoding said 9
    assert summarize(timed, baseline(), {"at": None, "run_id": 2})["baseline_timing"].endswith("(run 2)")
    assert summarize(timed, baseline(), {"at": 0.0, "run_id": 2})["baseline_timing"] == (
        f"decoded without drawing at {st.clock(0.0)} (run 2)")
    slow = summarize(record(timing=Timing(16.0, 8, (), 0.0, "x")), baseline(tokens_per_second=0.5))
    assert (slow["tokens_per_second"], slow["speedup"]) == (0.5, 1.0)          # rates below one still compare
    assert summarize(RunRecord(1, SETTINGS, "x", (1,)), baseline())["baseline_tokens_per_second"] is None
    noted = summarize(timed, baseline(), {"at": None, "run_id": 2, "note": "shared"})
    assert noted["baseline_timing"].endswith("(shared)")
    assert summarize(timed, baseline(), {})["baseline_timing"] is None
    assert summarize(timed, baseline(tokens_per_second=0.0))["speedup"] is None     # no plain rate to divide by
    same = summarize(timed, baseline(tokens=(1, 2, 6, 5, 6, 7, 8, 9, 10)))
    assert same["matches_baseline"] is True and same["first_difference"] is None
    sampled = summarize(record(SAMPLED, timing=timed.timing), baseline())
    assert sampled["matches_baseline"] is None and sampled["speedup"] == 8.0     # sampled: no text compared
    strict = summarize(record(dataclasses.replace(SETTINGS, rule="strict"), timing=timed.timing), baseline())
    assert strict["matches_baseline"] is None


def test_a_tree_runs_summary_counts_its_nodes_per_round():
    tree = [dataclasses.replace(r, tree_parents=[-1, 0, 0, 1]) for r in rounds()]
    assert summarize(RunRecord(1, SETTINGS, "x", (1,), rounds=tree))["tree_nodes_per_round"] == 4.0


def test_the_history_row_rounds_each_column_to_its_digits():
    out = dict(summarize(record()), acceptance_rate=0.12345, tokens_per_forward=1.2345,
               expected_tokens_per_forward=2.3456, tokens_per_second=12.345, baseline_tokens_per_second=6.789,
               speedup=1.8181, stop_reason=None, scenario=None)
    assert st.history_row(out, SAMPLED) == [3, "", "t", "Layer skip", 4, 0.7, 0.9, 20, "exact", 5, 16, 8, 2, 0.123,
                                           1.23, 2.35, 12.3, 6.8, 1.82, ""]
    assert len(st.HISTORY_COLUMNS) == 20
    out.update(baseline_tokens_per_second=None, speedup=None, stop_reason="cancelled")
    assert st.history_row(out, SAMPLED)[-3:] == [None, None, "cancelled"]


def test_baselines_are_kept_most_recent_last_up_to_the_limit(monkeypatch):
    monkeypatch.setattr(st, "MAX_BASELINES", 2)
    monkeypatch.setattr(st.time, "time", lambda: 123.0)
    state = SessionState()
    state.add_baseline("a", 1, run_id=1, at=5.0, note="n")
    state.add_baseline("b", 2)
    assert state.baseline_info == {"a": {"at": 5.0, "run_id": 1, "note": "n"},
                                   "b": {"at": 123.0, "run_id": None, "note": None}}
    state.add_baseline("a", 3)                                          # measured again: now the most recent
    state.add_baseline("c", 4)
    assert state.baselines == {"a": 3, "c": 4} and list(state.baseline_info) == ["a", "c"]
    state.baselines["replayed"] = 5                                     # as a replay keeps a trace's baseline
    state.add_baseline("d", 6)
    state.add_baseline("e", 7)                                          # it goes without provenance to drop
    assert state.baselines == {"d": 6, "e": 7}


def test_a_run_keeps_its_own_plain_measurement_before_the_sessions():
    state = SessionState()
    run = record()
    sessions, own = baseline(), baseline(tokens_per_second=2.0)
    state.add_baseline(run.baseline_key, sessions, run_id=1, at=7.0)
    assert state.baseline_of(run) == (sessions, {"at": 7.0, "run_id": 1, "note": None})
    run.plain, run.plain_note = (own, 9.0), "measured after it"
    assert state.baseline_of(run) == (own, {"at": 9.0, "run_id": 3, "note": "measured after it"})
    assert state.baseline_for(run) is own and state.baseline_for(None) is None
    assert state.summary(run)["baseline_tokens_per_second"] == 2.0


def test_a_sessions_copy_keeps_its_runs_and_choices_with_locks_of_its_own():
    state = SessionState()
    run = state.new_run(SETTINGS, "Layer skip", [1, 2])
    run.rounds.extend(rounds())
    state.finish(run)
    state.add_baseline("k", "b", run_id=1)
    state.target, state.compare_axis, state.compare_runs = "t", "draft", [1]
    fresh = copy.deepcopy(state)
    assert (fresh.baselines, fresh.baseline_info, fresh.current, fresh.target, fresh.compare_axis) == (
        state.baselines, state.baseline_info, run, "t", "draft")
    assert fresh.compare_runs == [1] and fresh.compare_runs is not state.compare_runs
    assert fresh.baselines is not state.baselines and fresh.lock is not state.lock
    assert fresh.new_run(SETTINGS, "x", [1]).run_id == 2 == state.new_run(SETTINGS, "x", [1]).run_id


def test_the_history_keeps_the_newest_runs_and_lists_newest_first(monkeypatch):
    monkeypatch.setattr(st, "MAX_HISTORY", 2)
    state = SessionState()
    for _ in range(3):
        run = state.new_run(SETTINGS, "x", [1])
        run.rounds.extend(rounds())
        assert state.finish(run, "stopped")
    assert [r.run_id for r in state.history] == [2, 3] and [row[0] for row in state.history_rows()] == [3, 2]
    kept = state.new_run(SETTINGS, "x", [1])
    kept.rounds.extend(rounds())
    kept.stop_reason = "eos"
    state.finish(kept, "stopped")
    assert kept.stop_reason == "eos"                                     # a reason already given is kept
    state.compare_runs = [99]
    assert [s["run_id"] for s, _ in state.compared()] == [3, 4]         # none of the chosen left: every run


def test_an_expired_session_leaves_no_exports_and_no_runs(tmp_path):
    folders = [tmp_path / "a", tmp_path / "b"]
    for folder in folders:
        folder.mkdir()
        (folder / "trace.json").write_text("{}")
    state = SessionState()
    state.exports.extend(folders)
    state.add_baseline("k", "b")
    state.current = state.active = "running"
    state.history.append(record())
    st.expire(state)
    assert not any(folder.exists() for folder in folders) and state.exports == []
    assert (state.history, state.baselines, state.baseline_info, state.current, state.active) == ([], {}, {}, None,
                                                                                                    None)
    st.expire(None)                                                      # a session that never had state
    st.remove_exports([tmp_path / "gone"])                              # a folder already deleted is no error


def test_a_new_session_starts_empty_comparing_by_k():
    state = SessionState()
    assert (state.current, state.active, state.target, state.compare_axis, state.compare_runs) == (
        None, None, None, "k", [])


def test_the_scenario_label_is_empty_when_the_presets_cannot_be_read(monkeypatch):
    from ui.playground import presets

    def unreadable(*args):
        raise OSError("gone")
    monkeypatch.setattr(presets, "scenario_of", unreadable)
    assert st.scenario_label(SETTINGS) == ""
    monkeypatch.setattr(presets, "scenario_of", lambda *args: None)
    assert st.scenario_label(SETTINGS) == ""
    assert st.clock(None) == "" and st.clock(18062.0) == time.strftime("%H:%M:%S", time.localtime(18062.0))
    assert st.clock(18062.0) != st.clock(18063.0)
