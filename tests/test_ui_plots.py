"""Plots, metrics, per-session state: synthetic RoundEvents in, figures and numbers out. No model."""
import copy

import pytest

from ui.views import metrics, plots
from ui.playground import runner
from ui.playground.state import RunSettings, SessionState, history_row, summarize
from test_ui_render import event


def run_rounds():
    # round 1: 2 of 4 accepted + correction; round 2: all 4 + bonus; round 3: 0 of 4 + correction
    return [event([1, 2, 3, 4], 2, [1, 2, 6], correction=6, index=0),
            event([1, 2, 3, 4], 4, [1, 2, 3, 4, 5], bonus=5, index=1),
            event([1, 2, 3, 4], 0, [6], correction=6, index=2)]


def trace(fig, name):
    return next(t for t in fig.data if t.name == name)


def test_expected_tokens_per_round_formula():
    assert metrics.expected_tokens_per_round(0.0, 4) == pytest.approx(1.0)
    assert metrics.expected_tokens_per_round(1.0, 4) == pytest.approx(5.0)
    assert metrics.expected_tokens_per_round(0.5, 3) == pytest.approx((1 - 0.5 ** 4) / 0.5)


def test_acceptance_figure_per_round_and_running():
    fig = plots.acceptance_figure(run_rounds())
    assert list(trace(fig, "this round").y) == [0.5, 1.0, 0.0]
    assert list(trace(fig, "running").y) == pytest.approx([0.5, 0.75, 0.5])
    assert "50%" in fig.layout.title.text


def test_accepted_figure_against_what_each_chain_drafted():
    rounds = run_rounds() + [event([1, 2], 1, [1, 6], correction=6, index=3)]      # only 2 drafted under k = 4
    fig = plots.accepted_figure(rounds)
    assert list(trace(fig, "accepted drafts").y) == [2, 4, 0, 1]
    assert list(trace(fig, "rejected + discarded").y) == [2, 0, 4, 1]
    assert list(trace(fig, "most it could keep (its drafts)").y) == [4, 4, 4, 2]
    assert fig.layout.title.text == "Accepted per round: mean 1.75 of a possible 3.50"


def test_accepted_figure_measures_a_tree_against_its_depth_not_k():
    """A tree of 4 nodes under k = 12 keeps at most its depth: the walkthrough's chart read "mean 0.63 of k = 12"
    against a dashed 12. The line is each round's depth, and the title and legend say so."""
    from test_tree_view import tree_event
    rounds = [tree_event(k=12, index=0),                                                       # 5 nodes, 2 deep
              tree_event(k=12, index=1, drafted=[1, 2, 3, 4], tree_parents=[-1, 0, 1, 2], tree_path=[0, 1, 2],
                         accepted=3, emitted=[1, 2, 3, 9], tree_tried=[0, 1, 2, 3],
                         accept_probs=[0.5, 0.2, 0.1, 0.1], uniforms=[0.1, 0.1, 0.05, 0.9])]      # a chain of 4
    fig = plots.accepted_figure(rounds)
    line = next(t for t in fig.data if t.name.startswith("most it could keep"))
    assert list(line.y) == [2, 4] and "a tree: its depth" in line.name
    assert list(trace(fig, "accepted drafts").y) == [1, 3]
    assert list(trace(fig, "not kept (to the tree's depth)").y) == [1, 1]
    assert fig.layout.title.text == "Accepted per round: mean 2.00 of a possible 3.00"          # not "of k = 12"
    assert fig.layout.yaxis.range[1] < 12 and "a tree of 5 nodes, 2 deep" in line.hovertext[0]


def test_forward_figure_has_measured_theory_and_plain():
    fig = plots.forward_figure(run_rounds())
    assert list(trace(fig, "this round").y) == [3, 5, 1]
    assert list(trace(fig, "measured (running)").y) == pytest.approx([3, 4, 3])
    theory = list(trace(fig, "theory (1−a^(k+1))/(1−a)").y)
    # a = accepted / judged drafts: rounds judged 3, 4 and 1 drafts (6 accepted), not accepted / drafted = 0.5
    assert theory == pytest.approx([metrics.expected_tokens_per_round(a, 4) for a in (2 / 3, 6 / 7, 6 / 8)])
    assert list(trace(fig, "plain decoding").y) == [1, 1]


class FakeBaseline:
    tokens = list(range(9))
    prefill_seconds = 0.01
    step_seconds = [0.02] * 8
    total_seconds = 0.01 + 0.16

    @property
    def tokens_per_second(self):
        return len(self.tokens) / self.total_seconds


def test_speed_figure_pending_then_measured():
    rounds = run_rounds()
    pending = plots.speed_figure(rounds)
    assert "baseline pending" in pending.layout.title.text and len(pending.data) == 1
    assert list(pending.data[0].y) == [0, 3, 8, 9]
    measured = plots.speed_figure(rounds, FakeBaseline())
    assert len(measured.data) == 2 and "Speedup ×" in measured.layout.title.text
    assert list(measured.data[1].y) == list(range(10))


def test_kv_figure_and_rows():
    rounds = run_rounds()
    fig = plots.kv_figure(rounds)
    assert list(trace(fig, "target before trim").y) == [14, 14, 14]
    assert list(trace(fig, "target after trim").y) == [12, 14, 10]
    assert not any(t.name.startswith("draft") for t in fig.data)   # no draft cache: no draft traces
    rows = plots.kv_rows(rounds)
    assert rows[0][0] == 3 and "14 → 10 (−4)" in rows[0][4] and rows[0][5] == "–"


def test_empty_figures_say_so():
    for fig in (plots.acceptance_figure([]), plots.speed_figure([]), plots.comparison_figure([]),
                plots.mismatch_figure([])):
        assert fig.layout.annotations and not fig.data


def settings(**kw):
    base = dict(target="t", draft="layer-skip", k=4, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=16, seed=0,
                rule="exact", chat=True, prompt="hi")
    return RunSettings(**{**base, **kw})


def test_summary_speedup_only_from_a_baseline():
    state = SessionState()
    record = state.new_run(settings(), "layer-skip", [1, 2, 3])
    record.rounds.extend(run_rounds())
    s = summarize(record)
    assert s["acceptance_rate"] == 0.5 and s["new_tokens"] == 9 and s["speedup"] is None
    base = FakeBaseline()
    state.baselines[record.baseline_key] = base
    s = summarize(record, state.baseline_for(record))
    assert s["speedup"] is None and not s["timed"]      # the live run's clocks ran while the view was drawn
    runner.keep_live_timing(record, state)               # as a run driven without drawing is timed
    s = summarize(record, state.baseline_for(record))
    assert s["timed"] and s["seconds"] == record.timing.seconds
    assert s["speedup"] == pytest.approx(s["tokens_per_second"] / base.tokens_per_second)
    assert s["matches_baseline"] is False and s["first_difference"] == 0   # greedy + exact: text compared
    # the formula's terms: 0.01 s drafting and 0.02 s verifying per round against 0.02 s plain steps, a = 6 / 8
    assert s["draft_cost"] == pytest.approx(0.5) and s["verify_cost"] == pytest.approx(1.0)
    assert s["predicted_speedup"] == pytest.approx((1 - 0.75 ** 5) / (1 - 0.75) / 1.5)
    row = history_row(s, record.settings)
    assert row[0] == record.run_id and row[-2] == round(s["speedup"], 2)


def test_baseline_key_ignores_draft_and_k_and_seed_when_greedy():
    a, b = settings(k=2, draft="prompt-lookup", seed=1), settings(k=8, seed=5)
    assert a.baseline_key((1, 2)) == b.baseline_key((1, 2))
    assert settings(temperature=0.7, seed=1).baseline_key((1,)) != settings(temperature=0.7, seed=2).baseline_key((1,))


def test_session_state_records_a_run_once_and_deep_copies_fresh_locks():
    state = SessionState()
    record = state.new_run(settings(), "layer-skip", [1])
    assert not state.finish(record)            # no rounds: nothing to record
    record.rounds.append(run_rounds()[0])
    assert state.finish(record, "cancelled") and not state.finish(record)
    assert len(state.history) == 1 and record.stop_reason == "cancelled"
    copy_ = copy.deepcopy(state)
    assert copy_.stop_event is not state.stop_event and len(copy_.history) == 1
    state.stop_event.set()
    assert not copy_.stop_event.is_set()
    assert len(state.history_rows()) == 1
    state.clear_history()
    assert state.history == []


def test_comparison_figure_groups_by_draft():
    state = SessionState()
    for k, draft in ((2, "layer-skip"), (4, "layer-skip"), (4, "prompt-lookup")):
        record = state.new_run(settings(k=k, draft=draft), draft, [1])
        record.rounds.extend(run_rounds())
        state.finish(record)
    fig = plots.comparison_figure(state.summaries(), "k")
    names = {t.name for t in fig.data}
    assert names == {"layer-skip", "prompt-lookup"}
    skip_acc = next(t for t in fig.data if t.name == "layer-skip")
    assert list(skip_acc.x) == [2, 4]
    by_draft = plots.comparison_figure(state.summaries(), "draft")
    assert "prompt-lookup" in list(by_draft.data[-2].x) + list(by_draft.data[-1].x)


def test_position_figure_shows_the_engines_acceptance_by_position_against_the_iid_curve():
    """run_rounds judge position 1 three times (kept twice), 2 twice (kept twice), 3 twice (kept once), 4 once (kept):
    alpha = [2/3, 1, 1/2, 1]; E = 1 + 2/3 + 2/3 + 1/3 + 1/3 = 3.00, the measured 9 tokens / 3 forwards; a = 6/8."""
    import spec_engine as se
    rounds = run_rounds()
    fig = plots.position_figure(rounds)
    alphas = list(trace(fig, "α_i measured").y)
    assert alphas == pytest.approx([2 / 3, 1.0, 0.5, 1.0]) == se.acceptance_by_position(rounds)
    assert list(trace(fig, "i.i.d.: a = 0.75 everywhere").y) == pytest.approx([0.75] * 4)
    assert list(trace(fig, "reached and kept: Π α_j").y) == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert list(trace(fig, "i.i.d.: a^i").y) == pytest.approx([0.75 ** i for i in range(1, 5)])
    assert "E = 1 + ΣΠα = 3.00 vs 3.00 measured" in fig.layout.title.text
    assert "Acceptance by position" in plots.position_figure([]).layout.title.text


def test_compare_runs_names_scenario_runs_and_compares_the_selected_ones():
    """Issue #38: after the scenarios the comparison pooled 11 dots and nobody could tell which was scenario 5. A run
    with every setting of a scenario is named by it (in the table, the hover text and on the point: 'S5'); a run
    changed by hand is not; the teacher can pick the runs to compare, and clearing the history clears the pick."""
    from ui.playground import callbacks, handlers
    from ui.playground.presets import load_presets
    from spec_engine.models import default_model_name
    scenario = next(s for s in load_presets().scenarios if s.label.startswith("5."))
    fields = dict(target=scenario.target or default_model_name(), draft=scenario.draft, k=scenario.k,
                  temperature=scenario.temperature, top_p=scenario.top_p, top_k=scenario.top_k,
                  max_new_tokens=scenario.max_new_tokens, seed=scenario.seed, rule=scenario.rule, chat=scenario.chat,
                  prompt=scenario.prompt)
    state = SessionState()
    for change in ({}, {"k": scenario.k + 1}):
        record = state.new_run(RunSettings(**{**fields, **change}), scenario.draft, [1])
        record.rounds.extend(run_rounds())
        state.finish(record)
    first, second = state.history
    assert first.scenario.startswith("S5 · 5.") and second.scenario == ""
    assert state.history_rows()[-1][1] == first.scenario
    fig = plots.comparison_figure(state.compared(), "k")
    assert [list(t.text) for t in fig.data[:1]] == [["S5", "#2"]]
    assert "S5 · 5." in fig.data[0].hovertext[0]
    assert plots.comparison_figure(state.compared(), "draft").layout.showlegend is False
    picker = handlers.compare_choices(state)
    assert [value for _, value in picker["choices"]] == [2, 1]
    handlers.set_compare_runs([1], state)
    assert [s["run_id"] for s, _ in state.compared()] == [1]
    callbacks.clear_history(state)
    assert state.compare_runs == [] and state.compared() == []


# Where the time goes (issue #35): the timed run's clocks, not the live run's, over the plain run's mean step.
TIMED_CLOCKS = [(0.004, 0.012, 0.019), (0.006, 0.010, 0.020), (0.002, 0.011, 0.015)]    # draft, verify, round
PLAIN_STEPS = [0.008, 0.009, 0.013]                 # mean 0.010 s (the unit); the median, 0.009, would differ


def timed_record(plain: bool = True):
    """A finished run as handlers.decode leaves it: live rounds (run_rounds' clocks: 0.01, 0.02, 0.03 s), the same
    rounds re-decoded without drawing with TIMED_CLOCKS (runner.keep_timing), and plain decoding (keep_baseline)."""
    import dataclasses

    import spec_engine as se
    from test_trace import TinyLabeler
    from ui.views.render import RenderOptions
    state = SessionState()
    record = state.new_run(settings(), "layer-skip", [1, 2, 3])
    record.rounds.extend(run_rounds())
    timed = [dataclasses.replace(r, draft_seconds=d, verify_seconds=v, round_seconds=w)
             for r, (d, v, w) in zip(record.rounds, TIMED_CLOCKS)]
    runner.keep_timing(record, state, se.GenerationResult(record.tokens, timed, 3, 0.001, 0.055, "max_new_tokens",
                                                          se.run_stats(timed, 0.055)))
    if plain:
        runner.keep_baseline(record, state, se.BaselineResult(list(range(4)), 3, 0.001, 0.031, PLAIN_STEPS,
                                                              "max_new_tokens"))
    state.finish(record)
    return runner.Prepared(record.settings, record.prompt_ids, TinyLabeler(), RenderOptions(), record), state


def test_time_strip_is_the_timed_rounds_clocks_over_one_plain_step():
    from ui.playground import handlers
    prep, state = timed_record()
    fig = dict(zip(handlers.RUN_OUTPUTS, handlers.run_view(prep, state, final=True)))["time_plot"]
    assert list(trace(fig, "draft").y) == pytest.approx([0.4, 0.6, 0.2])
    assert list(trace(fig, "verify").y) == pytest.approx([1.2, 1.0, 1.1])
    assert list(trace(fig, "overhead").y) == pytest.approx([0.3, 0.4, 0.2])          # round - draft - verify
    assert list(trace(fig, "tokens emitted").y) == [3, 5, 1]
    assert list(trace(fig, "1 plain step").y) == [1, 1]
    assert "1.80 plain steps a round" in fig.layout.title.text and "1 step = 10.0 ms" in fig.layout.title.text


def test_time_strip_waits_for_the_timed_run_and_plain_decoding():
    from ui.playground import handlers
    no_plain = timed_record(plain=False)
    no_timing = timed_record()
    no_timing[0].record.timing = None                   # plain decoding measured, the timed run not (yet)
    for prep, state in (no_plain, no_timing):
        fig = dict(zip(handlers.RUN_OUTPUTS, handlers.run_view(prep, state, final=True)))["time_plot"]
        assert not fig.data and fig.layout.annotations[0].text == plots.TIME_PENDING
    assert not handlers.initial_outputs()["time_plot"].data


# ------------------------------------------------------------------- the tokenizer-mismatch chart (issue #38, item 1)

def test_acceptance_interval_resamples_rounds_and_holds_the_rate():
    rounds = run_rounds()                                   # 2/4, 4/4, 0/4: rate 0.5
    low, high = metrics.acceptance_interval(rounds)
    assert 0.0 <= low < 0.5 < high <= 1.0
    assert metrics.acceptance_interval(rounds) == (low, high)                       # seeded: a run shows one interval
    assert metrics.acceptance_interval(rounds[1:2]) == (1.0, 1.0)                    # one round: no spread
    assert metrics.acceptance_interval([]) == (0.0, 0.0)
    assert metrics.acceptance_interval(rounds * 20)[1] - metrics.acceptance_interval(rounds * 20)[0] < high - low
    # Rounds are resampled whole: ten rounds that all keep 1 of 4 have no spread, though their tokens vary.
    assert metrics.acceptance_interval([event([1, 2, 3, 4], 1, [1, 6], correction=6, index=i) for i in range(10)]) \
        == pytest.approx((0.25, 0.25))


def mismatch_result(label, rate, low, high, pair, tpf=1.0):
    return {"label": label, "acceptance_rate": rate, "low": low, "high": high, "pair": pair,
            "tokens_per_forward": tpf, "rounds": 10}


def test_mismatch_figure_contrasts_the_same_draft_two_ways_and_greys_the_others():
    results = [mismatch_result("(a) naive ids", 0.01, 0.0, 0.03, True),
               mismatch_result("(b) cross-tokenizer", 0.16, 0.10, 0.22, True),
               mismatch_result("(c) same tokenizer", 0.09, 0.05, 0.14, False),
               mismatch_result("(c') same tokenizer", 0.16, 0.12, 0.20, False)]
    fig = plots.mismatch_figure(results, "Gemma 3 270M")
    naive, retok, scale = fig.data
    pair = (naive, retok)
    assert [list(t.x) for t in pair] == [["(a) naive ids"], ["(b) cross-tokenizer"]]
    assert [list(t.y) for t in pair] == [[0.01], [0.16]]
    assert list(scale.x) == ["(c) same tokenizer", "(c') same tokenizer"] and "for scale" in scale.name
    assert all("Gemma 3 270M" in t.name for t in pair) and naive.name.startswith("(a) naive ids")
    assert [list(t.error_y.array) for t in pair] == [pytest.approx([0.02]), pytest.approx([0.06])]
    assert [list(t.error_y.arrayminus) for t in pair] == [pytest.approx([0.01]), pytest.approx([0.06])]
    assert scale.marker.color not in (naive.marker.color, retok.marker.color)   # the others are not in the contrast
    assert fig.layout.yaxis.range[1] == pytest.approx(0.22 * 1.3)           # fits the bars, not 0-100%
    assert [a.text for a in fig.layout.annotations] == ["re-tokenizing: ×16 the acceptance"]
    # Overlapping intervals are called noise, and a naive rate of zero reads "from 0".
    results[1].update(acceptance_rate=0.04, low=0.01, high=0.08)
    assert "within noise" in plots.mismatch_figure(results).layout.annotations[0].text
    results[0].update(acceptance_rate=0.0, low=0.0, high=0.0)
    assert plots.mismatch_figure(results).layout.annotations[0].text.startswith("re-tokenizing: from 0 to 4%")
    # A demo stopped after its same-tokenizer runs has no contrast to annotate.
    assert not plots.mismatch_figure(results[2:]).layout.annotations


def test_each_mismatch_legend_swatch_is_its_own_bars_colour():
    """A legend draws one swatch per trace, in the trace's first colour: with both of the pair's bars in one trace
    (red, orange) the legend said red for the orange re-tokenized bar. Every trace is one colour, and each bar's
    colour is the one its legend entry shows; the two ways of the same draft are told apart by colour."""
    results = [mismatch_result("(a) naive ids", 0.01, 0.0, 0.03, True),
               mismatch_result("(b) cross-tokenizer", 0.16, 0.10, 0.22, True),
               mismatch_result("(c) same tokenizer", 0.09, 0.05, 0.14, False)]
    fig = plots.mismatch_figure(results, "Gemma 3 270M")
    swatch = {}
    for t in fig.data:
        assert isinstance(t.marker.color, str), (t.name, t.marker.color)       # one colour: the legend's swatch
        assert t.showlegend is not False
        for x in t.x:
            swatch[x] = (t.name, t.marker.color)
    assert swatch["(b) cross-tokenizer"][1] == "#e39a26" and swatch["(a) naive ids"][1] == "#d64545"
    assert swatch["(b) cross-tokenizer"][0].startswith("(b) cross-tokenizer")
