"""spec_engine/drafters/sizing.py's arithmetic on injected clocks: how the measurement turns timed forwards into a
curve (passes, the dropped warm-up, the budget, the slope beyond it), where a drafter's view comes from, and the
draft length that buys the most tokens. No real clock is read; the tiny model only supplies its shape."""
from types import SimpleNamespace

import pytest
import torch

import spec_engine as se
from spec_engine.drafters import sizing
from spec_engine.drafters.lookup import LookupFirstDrafter, PromptLookupDrafter
from spec_engine.drafters.sizing import CostCurve, CostView, Sizing, check_curve
from tiny import tiny_llama


class FakeForwards:
    """Forwards that take `cost(rows, pass)` seconds on a clock of their own (the measurement's and its deadline's)."""

    def __init__(self, cost, rows: int):
        self.cost, self.rows, self.now, self.calls = cost, rows, 0.0, []

    def forward(self, model, ids, cache, n):
        measured = len(self.calls) - 1                 # the first call is the prefill
        self.calls.append(len(ids))
        self.now += self.cost(len(ids), measured // self.rows) if measured >= 0 else 1.0
        return torch.zeros(1)

    def clock(self, device=None):
        return self.now


@pytest.fixture
def fake(monkeypatch):
    made = {}

    def install(cost, rows):
        forwards = FakeForwards(cost, rows)
        monkeypatch.setattr(sizing, "forward_logits", forwards.forward)
        monkeypatch.setattr(sizing, "new_cache", lambda model: None)
        monkeypatch.setattr(sizing, "trim_cache", lambda cache, n: None)
        monkeypatch.setattr(sizing.timing, "clock", forwards.clock)
        monkeypatch.setattr(sizing, "time", SimpleNamespace(perf_counter=forwards.clock))
        made["forwards"] = forwards
        return forwards
    return install


MODEL = tiny_llama(vocab=8, layers=1, seed=0)


def test_the_curve_is_each_row_counts_median_over_one_rows_once_passes_agree(fake):
    # every pass as slow as its number says (the warm-up ten times so): the ratios between row counts never move
    forwards = fake(lambda rows, p: (10.0 if p == 0 else 1.0 + p) * rows ** 0.5, rows=5)
    costs = sizing.measure_verify_costs(MODEL, rows=5, context=4, repeats=2, budget_s=1e9)
    assert costs == pytest.approx((0.0,) + tuple(r ** 0.5 for r in range(1, 6)))
    assert forwards.calls[0] == 4 and forwards.calls[1:6] == [1, 2, 3, 4, 5]
    assert len(forwards.calls) == 1 + 5 * 4           # the warm-up, 2 passes, and one that found the ratios stable


def test_the_warm_up_pass_is_left_out(fake):
    # the warm-up pass is dear for many rows only: kept in, a median of three would move by half of it
    fake(lambda rows, p: (1.0 + 9.0 * (rows > 1) if p == 0 else 1.0) * rows, rows=3)
    costs = sizing.measure_verify_costs(MODEL, rows=3, context=4, repeats=1, budget_s=1e9)
    assert costs == pytest.approx((0.0, 1.0, 2.0, 3.0))


def test_passes_go_on_while_the_curve_moves(fake):
    # row 2 costs 3, 2, 3, 2, ... one-row forwards (the first pass a warm-up), then 2 from pass 6: its median is
    # back at 2 there, where pass 5 left it, so pass 6 is the last
    forwards = fake(lambda rows, p: 1.0 if rows == 1 else (2.0 if p % 2 or p >= 6 else 3.0), rows=2)
    sizing.measure_verify_costs(MODEL, rows=2, context=4, repeats=1, budget_s=1e9)
    assert len(forwards.calls) == 1 + 2 * 7
    forwards = fake(lambda rows, p: 1.0 if rows == 1 else 2.0 ** p, rows=2)     # never stable: the pass cap
    sizing.measure_verify_costs(MODEL, rows=2, context=4, repeats=3, budget_s=1e9)
    assert len(forwards.calls) == 1 + 2 * (3 + 1 + sizing.CALIBRATION_MAX_REPEATS)


def test_past_the_budget_the_unmeasured_row_counts_continue_the_last_slope(fake):
    # prefill 1 s; one row 1 s, two rows 1.5 s: the budget of 2 s is spent after two row counts of the first pass
    forwards = fake(lambda rows, p: 0.5 + 0.5 * rows, rows=6)
    costs = sizing.measure_verify_costs(MODEL, rows=6, context=4, repeats=3, budget_s=2.0)
    assert forwards.calls[1:] == [1, 2]
    assert costs == pytest.approx((0.0, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5))
    forwards = fake(lambda rows, p: 2.0 - 0.5 * rows, rows=4)                  # falling: flat from the last
    assert sizing.measure_verify_costs(MODEL, rows=4, context=4, repeats=3, budget_s=2.0) == pytest.approx(
        (0.0, 1.0, 2 / 3, 2 / 3, 2 / 3))


def test_a_drafters_view_and_its_parts():
    curve = CostCurve((0.0, 1.0, 1.3, 1.7))
    lookup = PromptLookupDrafter()
    combined = LookupFirstDrafter(se.LayerSkipDrafter(MODEL, []), lookup)
    parts = sizing.sub_drafters(combined)
    assert parts[0] is combined and lookup in parts and len(parts) == 3
    assert sizing.drafter_sizing(combined) is None                     # no decoder built: no view yet
    sizing.pin_sizing(combined, Sizing((0.0, 1.0, 2.0, 3.0), "pinned"))
    assert lookup.pinned_sizing == Sizing((0.0, 1.0, 2.0, 3.0), "pinned")
    lookup.costs = sizing.sizing_view(curve, lookup.pinned_sizing)
    assert sizing.drafter_sizing(combined) == Sizing((0.0, 1.0, 2.0, 3.0), "pinned")
    assert sizing.sizing_view((0.0, 1.0, 1.0), None) == (0.0, 1.0, 1.0)         # a fixed curve as it is
    view = sizing.sizing_view(curve)
    assert isinstance(view, CostView) and tuple(view) == (0.0, 1.0, 1.3, 1.7) and view.source == curve.source()


def test_reset_and_size_by_kind_of_curve():
    view = CostView((0.0, 1.0, 2.0, 3.0), probe_every=5)
    assert view.size([0.9])[0] == view.size([0.9])[0] == 0 and view.paused_rounds == 2
    sizing.reset_view(view)
    assert (view.paused_rounds, view.probes) == (0, 0)
    sizing.reset_view((0.0, 1.0))                                       # a fixed curve: nothing to reset
    assert sizing.size_draft([0.9, 0.9], (0.0, 1.0, 1.0, 1.0)) == (2, None)
    curve = CostCurve((0.0, 1.0, 2.0, 3.0), probe_every=5)
    length, note = sizing.size_draft([0.9], curve)
    assert length == 0 and note.startswith(sizing.PAUSED)
    assert view.size([]) == (0, None) and view.size([0.01]) == (0, None)    # nothing pays on any machine


def test_the_best_length_prefers_the_shorter_among_equals_and_stops_at_the_curves_end():
    assert sizing.expected_tokens([0.5, 0.5]) == [1.0, 1.5, 1.75]
    assert sizing.best_draft_length([0.5], (0.0, 1.0, 1.5)) == 0            # 1.5 / 1.5 ties 1 / 1
    assert sizing.best_draft_length([0.6], (0.0, 1.0, 1.5)) == 1
    assert sizing.best_draft_length([1.0] * 5, (0.0, 1.0, 1.0, 1.0)) == 2   # two drafts fill the three rows


@pytest.mark.measured_costs
def test_the_kept_curve_is_per_thread_count_on_a_cpu_and_observed_there(monkeypatch):
    model = SimpleNamespace(device=torch.device("cpu"))
    assert sizing.kept_curve(model) is None
    monkeypatch.setattr(sizing, "measure_verify_costs", lambda m: (0.0, 1.0, 1.2, 1.4))
    monkeypatch.setattr(sizing.timing, "watch_forwards", lambda m, observer: None)
    curve = sizing.verify_costs(model)
    assert sizing.kept_curve(model) is curve and sizing.verify_costs(model) is curve
    assert sizing.curve_key(model) == torch.get_num_threads()
    assert sizing.curve_key(SimpleNamespace(device=torch.device("meta"))) is None
    for rows in (1, 1, 1, 2):
        sizing.observe(model, rows, 0.01 if rows == 1 else 0.015)
    assert curve.observed == 4 and curve[2] == pytest.approx(1.5)
    sizing.observe(SimpleNamespace(device=torch.device("cpu")), 1, 0.01)       # no curve kept: nothing happens
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert sizing.kept_curve(model) is None                                  # another thread count, unmeasured
    finally:
        torch.set_num_threads(threads)


class RecordingForwards:
    """Forwards of one second per row on a clock of their own that record what the measurement hands them."""

    def __init__(self):
        self.now, self.forwards, self.trims, self.clocks, self.warmed, self.caches = 0.0, [], [], [], [], []

    def install(self, monkeypatch):
        monkeypatch.setattr(sizing, "forward_logits", self.forward)
        monkeypatch.setattr(sizing, "new_cache", lambda model: self.caches.append(model) or "the cache")
        monkeypatch.setattr(sizing, "trim_cache", lambda cache, n: self.trims.append((cache, n)))
        monkeypatch.setattr(sizing.timing, "clock", self.clock)
        monkeypatch.setattr(sizing, "time", SimpleNamespace(perf_counter=lambda: self.now))
        monkeypatch.setattr(sizing.speed, "active", lambda: SimpleNamespace(warm=self.warmed.append))
        return self

    def forward(self, model, ids, cache, n):
        self.forwards.append((model, list(ids), cache, n))
        self.now += float(len(ids))
        return torch.zeros(1)

    def clock(self, device=None):
        self.clocks.append(device)
        return self.now


def test_the_measurement_feeds_the_model_its_cache_and_seeded_ids(monkeypatch):
    # MODEL's output embedding is 8 tokens by its hidden size: the ids are drawn below 8 from a generator seeded 0
    forwards = RecordingForwards().install(monkeypatch)
    sizing.measure_verify_costs(MODEL, rows=3, context=4, repeats=1, budget_s=1e9)
    vocab, hidden = MODEL.get_output_embeddings().weight.shape
    assert hidden != vocab
    ids = torch.randint(0, vocab, (4 + 3,), generator=torch.Generator().manual_seed(0)).tolist()
    assert ids != torch.randint(0, vocab, (7,), generator=torch.Generator().manual_seed(1)).tolist()
    assert forwards.warmed == [MODEL] and forwards.caches == [MODEL]
    assert forwards.forwards[0] == (MODEL, ids[:4], "the cache", 1)            # the prefill: the context, one row
    assert forwards.forwards[1:4] == [(MODEL, ids[4:4 + r], "the cache", r) for r in (1, 2, 3)]
    assert len(forwards.trims) == len(forwards.forwards) - 1 and set(forwards.trims) == {("the cache", 4)}
    assert forwards.clocks and all(device == torch.device("cpu") for device in forwards.clocks)


def test_a_deadline_reached_exactly_is_not_yet_passed(fake):
    # prefill 1 s, then r rows cost r / 2 + 1/2 s: the budget of 2.5 s runs out exactly after two row counts, so the
    # third is still measured (and the fourth is not)
    forwards = fake(lambda rows, p: 0.5 + 0.5 * rows, rows=5)
    sizing.measure_verify_costs(MODEL, rows=5, context=4, repeats=3, budget_s=2.5)
    assert forwards.calls[1:] == [1, 2, 3]
    # two rows of 1 s: the first pass ends exactly at the deadline, so one more row count is measured after it
    forwards = fake(lambda rows, p: 1.0, rows=2)
    assert sizing.measure_verify_costs(MODEL, rows=2, context=4, repeats=3, budget_s=2.0) == (0.0, 1.0, 1.0)
    assert forwards.calls[1:] == [1, 2, 1]


def test_two_rows_are_measured_however_short_the_budget(fake):
    forwards = fake(lambda rows, p: 1.0 * rows, rows=4)
    costs = sizing.measure_verify_costs(MODEL, rows=4, context=4, repeats=3, budget_s=0.5)
    assert forwards.calls[1:] == [1, 2] and costs == (0.0, 1.0, 2.0, 3.0, 4.0)


def test_a_row_count_timed_twice_keeps_its_second_time_not_the_warm_ups(fake):
    # the warm-up pass is 5x dear; the budget ends during the second pass after one and two rows: those two row
    # counts have the warm-up and one real time each (the warm-up kept in, their median would be 3x the real one)
    fake(lambda rows, p: (5.0 if p == 0 else 1.0) * rows, rows=3)
    costs = sizing.measure_verify_costs(MODEL, rows=3, context=4, repeats=3, budget_s=32.5)
    assert costs == pytest.approx((0.0, 1.0, 2.0, 15.0))          # 3 rows: its warm-up time alone, 15 s


def test_a_pass_is_stable_when_every_ratio_moves_by_at_most_the_stable_share_of_the_last(fake, monkeypatch):
    # one row always 1 s; two rows 2 s in pass 1, 4 s in pass 2 (median 3): the ratio 2 -> 3 moves by exactly half
    # of 2, which is stable at STABLE = 0.5, so pass 2 is the last
    monkeypatch.setattr(sizing, "STABLE", 0.5)
    forwards = fake(lambda rows, p: 1.0 if rows == 1 else (2.0 if p <= 1 else 4.0), rows=2)
    sizing.measure_verify_costs(MODEL, rows=2, context=4, repeats=1, budget_s=1e9)
    assert len(forwards.calls) == 1 + 2 * 3
    # 2 -> 3.2 moves by 1.2, more than half of 2 (though less than half of 3.2): one more pass, where it stays
    forwards = fake(lambda rows, p: 1.0 if rows == 1 else (2.0 if p <= 1 else 4.4), rows=2)
    sizing.measure_verify_costs(MODEL, rows=2, context=4, repeats=1, budget_s=1e9)
    assert len(forwards.calls) == 1 + 2 * 4


def test_an_unsure_curve_names_each_problem_once_and_counts_the_rest():
    assert check_curve((0.0, 1.0, 0.8)) == ((0.0, 1.0, 1.0), "2 rows cost 0.80, less than 1 rows (1.00)")
    assert check_curve((0.0, 1.0, 2.0, 1.7))[1] is None             # a dip of exactly 15% is not a fall
    assert check_curve((0.0, 1.0, 3.0))[1] is None                  # exactly 1.5 times the row count is possible
    assert check_curve((0.0, 1.0, 4.0, 1.0, 5.0))[1] == ("2 rows cost 4.00 one-row forwards; "
                                                         "3 rows cost 1.00, less than 2 rows (4.00)")
    assert check_curve((0.0, 1.0, 4.0, 1.0, 5.0, 1.0))[1].endswith("less than 2 rows (4.00) (+1 more)")
    assert check_curve((0.0, 1.0, 4.0, 1.0, 5.0, 1.0, 12.0))[1].endswith("(4.00) (+2 more)")


def test_a_curve_keeps_a_window_of_recent_times_and_scales_an_untimed_row_by_the_nearest_timed_one():
    curve = CostCurve((0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0))
    for _ in range(3):
        curve.observe(1, 1.0)
    curve.observe(2, 1.0)                               # 2 rows timed at half of the measured cost
    curve.observe(8, 8.0)                               # 8 rows as measured
    assert curve[3] == pytest.approx(1.5) and curve[6:8] == (6.0, 7.0)            # scaled by 2's and by 8's error
    assert curve[5] == pytest.approx(2.5)               # 3 from both: the smaller row count's error wins the tie
    for seconds in [9.0] * sizing.WINDOW + [4.0] * sizing.WINDOW:
        curve.observe(8, seconds)
    assert curve[8] == pytest.approx(4.0)               # the older times have left the window
    curve.observe(len(curve), 1.0)                      # beyond the curve: ignored
    assert curve.observed == 5 + 2 * sizing.WINDOW


def test_curves_and_views_compare_as_tuples_and_print_their_costs():
    curve, view = CostCurve((0.0, 1.0, 1.234)), CostView((0.0, 1.0, 2.0))
    assert view == (0.0, 1.0, 2.0) and view != (0.0, 1.0, 3.0) and view != (0.0, 1.0)
    assert view != 2.0 and curve != 2.0 and not view == None and not curve == None      # noqa: E711
    assert repr(curve) == "CostCurve(0.00, 1.00, 1.23)"
    assert repr(CostCurve((0.0, 1.0), unsure="why")) == "CostCurve(0.00, 1.00, unsure)"


def test_a_views_notes_count_the_rounds_to_the_next_probe_and_name_its_rows():
    view = CostView((0.0, 1.0, 9.0), probe_every=2)
    assert (view.probes, view.source) == (0, "given")
    notes = [view.size([0.9]) for _ in range(3)]
    assert notes[0] == (0, f"{sizing.PAUSED}verifying 2 rows costs 9.00 one-token forwards on this machine "
                           "(given), more than the 1.90 tokens they would yield; probing again in 2 rounds")
    assert notes[1][1].endswith("probing again in 1 round")
    assert notes[2] == (1, f"{sizing.PROBE}2 rows (drafting was paused)") and view.probes == 1
    view.size([0.9]), view.size([0.9]), view.size([0.9])
    assert view.probes == 2


def test_a_pinned_view_probes_as_often_as_its_curve():
    view = sizing.sizing_view(CostCurve((0.0, 1.0, 9.0), probe_every=3), Sizing((0.0, 1.0, 8.0), "pinned"))
    assert view.probe_every == 3 and tuple(view) == (0.0, 1.0, 8.0)


@pytest.mark.measured_costs
def test_the_model_is_measured_and_its_forwards_reach_its_curve(monkeypatch):
    model = SimpleNamespace(device=torch.device("cpu"))
    measured, observers = [], []
    answers = iter([(0.0, 1.0, 9.0), (0.0, 1.0, 1.5)])               # impossible, then sane
    monkeypatch.setattr(sizing, "measure_verify_costs", lambda m: measured.append(m) or next(answers))
    monkeypatch.setattr(sizing.timing, "watch_forwards", lambda m, observer: observers.append((m, observer)))
    curve = sizing.verify_costs(model)
    assert measured == [model, model] and curve == (0.0, 1.0, 1.5)
    assert len(observers) == 1 and observers[0][0] is model
    for rows, seconds in ((1, 0.01), (1, 0.01), (1, 0.01), (2, 0.012)):
        observers[0][1](rows, seconds)
    assert curve.observed == 4 and curve[2] == pytest.approx(1.2)


class Slotted:
    """A drafter without a __dict__ (its attributes in slots): it holds no drafters that sub_drafters can see."""
    __slots__ = ("inner",)

    def check_target(self, target_model):
        pass

    def propose(self, committed, k, params, generator):
        pass


def test_only_held_drafters_are_parts_and_a_drafter_without_a_dict_has_none():
    lookup = PromptLookupDrafter()
    slotted = Slotted()
    slotted.inner = PromptLookupDrafter()
    lookup.me, lookup.checker, lookup.held = lookup, SimpleNamespace(check_target=None), slotted
    assert sizing.sub_drafters(lookup) == [lookup, slotted]        # not itself again, nor a checker that drafts not
