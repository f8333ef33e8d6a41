"""spec_engine/drafters/sizing.py's arithmetic on injected clocks: how the measurement turns timed forwards into a
curve (passes, the dropped warm-up, the budget, the slope beyond it), where a drafter's view comes from, and the
draft length that buys the most tokens. No real clock is read; the tiny model only supplies its shape."""
from types import SimpleNamespace

import pytest
import torch

import spec_engine as se
from spec_engine.drafters import sizing
from spec_engine.drafters.lookup import LookupFirstDrafter, PromptLookupDrafter
from spec_engine.drafters.sizing import CostCurve, CostView, Sizing
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
