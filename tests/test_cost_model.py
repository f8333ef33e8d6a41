"""The verify-cost curve on a noisy machine (issue #36): a measurement that cannot be true is rejected and marked
unsure, the curve is corrected online from the engine's own timed forwards, and a grossly wrong curve pauses
drafting only until a probe times the truth. Every timing here is injected: no test reads a real clock."""
import itertools
from types import SimpleNamespace

import pytest
import torch

import spec_engine as se
from spec_engine.core import timing
from spec_engine.core.drafting import Drafter, Proposal
from spec_engine.classroom.explain import explain
from spec_engine.drafters import sizing
from spec_engine.drafters.sizing import PAUSED, PROBE, CostCurve, check_curve, size_draft

WRONG = (0.0, 1.0) + (17.78,) * 16        # issue #36: 4 rows measured at 17.78 one-row forwards under a load of 4.3


def test_a_curve_that_falls_or_runs_far_beyond_its_rows_is_unsure_and_made_sane():
    costs, unsure = check_curve((0.0, 1.0, 1.2, 17.78, 1.29, 1.4))
    assert unsure is not None and "3 rows cost 17.78" in unsure and "4 rows cost 1.29" in unsure
    assert costs == (0.0, 1.0, 1.2, 1.29, 1.29, 1.4)      # never above the row count, never falling
    good, none = check_curve((0.0, 1.0, 1.1, 1.25, 1.24, 1.5))   # a dip within the kernels' noise is fine
    assert none is None and good == (0.0, 1.0, 1.1, 1.24, 1.24, 1.5)


def test_one_slow_row_count_does_not_make_every_larger_one_dear():
    """Noise on a shared machine only adds time: a pass measured here gave 4 rows 1.35 where 4-8 rows cost 1.04-1.18
    in four others. The curve keeps the larger row counts' own costs and lowers the outlier to the next one's."""
    measured = (0.0, 1.0, 0.95, 1.04, 1.35, 1.31, 1.28, 1.17, 1.12, 1.44, 1.52, 1.48)
    costs, _ = check_curve(measured)
    assert costs[4:9] == (1.12,) * 5 and costs[9:] == (1.44, 1.48, 1.48)
    assert costs[1:4] == (1.0, 1.0, 1.04)                 # one row is the unit; nothing costs less
    assert all(a <= b for a, b in zip(costs[1:], costs[2:]))
    # capped at its row count (2), then lowered to what 3 rows cost
    assert sizing.sane((0.0, 1.0, 9.0, 1.1)) == (0.0, 1.0, 1.1, 1.1)


@pytest.mark.measured_costs
def test_an_impossible_measurement_is_made_again_and_the_sane_one_kept(monkeypatch):
    answers = iter([(0.0, 1.0, 1.1, 30.0), (0.0, 1.0, 1.1, 1.2)])
    monkeypatch.setattr(sizing, "measure_verify_costs", lambda model: next(answers))
    curve = sizing.verify_costs(SimpleNamespace(device=torch.device("cpu")))
    assert curve == (0.0, 1.0, 1.1, 1.2) and curve.unsure is None
    monkeypatch.setattr(sizing, "measure_verify_costs", lambda model: (0.0, 1.0, 1.1, 30.0))
    curve = sizing.verify_costs(SimpleNamespace(device=torch.device("cpu")))
    assert curve == (0.0, 1.0, 1.1, 3.0) and "3 rows cost 30.00" in curve.unsure
    assert "unsure" in curve.source()


def test_the_curve_is_corrected_from_timed_forwards():
    curve = CostCurve((0.0, 1.0, 1.5, 2.0, 2.5, 3.0))
    for _ in range(2):
        curve.observe(1, 0.010)
    curve.observe(3, 0.012)
    assert curve == (0.0, 1.0, 1.5, 2.0, 2.5, 3.0)       # too few one-row forwards to divide by yet
    curve.observe(1, 0.010)
    assert curve[3] == pytest.approx(1.2)                # timed: 12 ms over 10 ms
    assert curve[2] == 1.0           # untimed: measured, scaled by the error at 3 rows (0.9), never below one row
    assert curve[5] == pytest.approx(3.0 * 1.2 / 2.0)
    assert curve.corrected and "corrected from 4 timed forwards" in curve.source()
    curve.observe(2, 0.0)                                # nothing that cannot be a time
    curve.observe(99, 0.01)
    assert curve.observed == 4


def test_a_paused_curve_says_why_with_the_numbers_and_probes_every_few_rounds():
    view = CostCurve(WRONG, probe_every=3).view()
    chances = [0.9, 0.9, 0.9]
    sized = [size_draft(chances, view) for _ in range(8)]
    assert [n for n, _ in sized] == [0, 0, 0, 3, 0, 0, 0, 3]    # the typical machine's length, every 4th round
    note = sized[0][1]
    assert note.startswith(PAUSED) and "verifying 4 rows costs 4.00 one-token forwards" in note
    assert "3.44 tokens" in note and "probing again in 3 rounds" in note
    assert sized[3][1].startswith(PROBE)
    assert size_draft([0.01], view) == (0, None)         # a draft that pays on no machine is not a pause
    view.reset()                                         # a run begins: it pauses PROBE_EVERY rounds again
    assert [size_draft(chances, view)[0] for _ in range(4)] == [0, 0, 0, 3]
    assert size_draft(chances, (0.0, 1.0, 1.1, 1.2, 1.3)) == (3, None)   # a fixed curve: no pause, no note


class SteadyDrafter(Drafter):
    """Proposes token 1 up to k times, each with a 90% chance, sized by `curve` as the real drafters size theirs:
    by a view of it taken when the decoder is built (of `pinned_sizing`'s costs where set), reset when a run begins."""

    name = "steady"

    def __init__(self, curve):
        self.curve = curve
        self.pinned_sizing = None

    def check_target(self, target_model):
        self.costs = sizing.sizing_view(self.curve, self.pinned_sizing)

    def begin(self, prompt_ids, target_features=None):
        sizing.reset_view(self.costs)

    def propose(self, committed, k, params, generator):
        n, note = size_draft([0.9] * k, self.costs)
        return Proposal([1] * n, None, note=note)


def test_a_grossly_wrong_curve_pauses_one_run_which_probes_and_the_next_drafts_again(monkeypatch):
    """The engine's rounds correct the curve: every forward takes one tick of a fake clock, so verifying any row
    count costs one plain step. Under the wrong curve a run pauses, probes after PROBE_EVERY paused rounds and
    pauses again (a run's rounds never depend on its own timing: decoded twice, it gives the same rounds); the
    probe's timing corrects the curve, and the next decoder drafts every round from its first."""
    from tiny import tiny_llama
    model = tiny_llama(vocab=8, layers=1, seed=3)            # its own model: the curve watches its forwards
    curve = CostCurve(WRONG)
    timing.watch_forwards(model, curve.observe)
    ticks = itertools.count()
    monkeypatch.setattr(timing, "perf_counter", lambda: next(ticks) * 0.01)
    prompt = torch.tensor([[1, 2, 3]])
    decoder = se.SpeculativeDecoder(model, SteadyDrafter(curve))
    paused = decoder.generate(prompt, k=3, max_new_tokens=24)
    drafted = [bool(r.drafted) for r in paused.rounds]
    first = drafted.index(True)
    assert first == sizing.PROBE_EVERY and paused.rounds[first].note.startswith(PROBE)
    assert all(r.note.startswith(PAUSED) for r in paused.rounds[:first])
    assert curve[4] == pytest.approx(1.0) and curve.corrected          # corrected by the probe's own timing
    again = decoder.generate(prompt, k=3, max_new_tokens=24)            # the same decoder: the same rounds
    assert [(r.drafted, r.note) for r in again.rounds] == [(r.drafted, r.note) for r in paused.rounds]
    notes = [(r.note or "").split(":")[0] for r in paused.rounds]
    assert notes == ["drafting paused"] * 8 + ["probing the verify cost"] + ["drafting paused"] * 8 + \
        ["probing the verify cost"] + ["drafting paused"] * 5 + [""]     # the last round has room for no draft
    text = " ".join(explain(paused.rounds, k=3, greedy=True))
    assert "21 rounds drafted nothing because the verify cost said so (2 probes drafted to time it again): " \
           "drafting paused: verifying " in text

    resumed = se.SpeculativeDecoder(model, SteadyDrafter(curve)).generate(prompt, k=3, max_new_tokens=24)
    assert all(r.drafted for r in resumed.rounds[:-1]) and not any(r.note for r in resumed.rounds)


def test_a_run_built_again_under_its_first_pass_pin_drafts_the_same_rounds_though_the_curve_moved(monkeypatch):
    """The playground's "measure again" builds a new decoder for a run whose first pass corrected the curve (issue
    #36, found in the whole suite): pinned (sizing.pin_sizing) to the first pass's costs it sizes its drafts as
    the first pass did; built without, it sizes by the corrected curve and its rounds differ."""
    from tiny import tiny_llama
    model = tiny_llama(vocab=8, layers=1, seed=3)
    curve = CostCurve(WRONG)
    timing.watch_forwards(model, curve.observe)
    ticks = itertools.count()
    monkeypatch.setattr(timing, "perf_counter", lambda: next(ticks) * 0.01)
    prompt = torch.tensor([[1, 2, 3]])
    drafter = SteadyDrafter(curve)
    first = se.SpeculativeDecoder(model, drafter).generate(prompt, k=3, max_new_tokens=24)
    pinned = se.drafter_sizing(drafter)
    assert pinned.costs == curve.measured and curve.corrected             # the first pass's rounds corrected the curve
    again_drafter = SteadyDrafter(curve)
    sizing.pin_sizing(again_drafter, pinned)
    again = se.SpeculativeDecoder(model, again_drafter).generate(prompt, k=3, max_new_tokens=24)
    assert se.drafter_sizing(again_drafter) == pinned
    assert [(r.drafted, r.note) for r in again.rounds] == [(r.drafted, r.note) for r in first.rounds]
    unpinned = se.SpeculativeDecoder(model, SteadyDrafter(curve)).generate(prompt, k=3, max_new_tokens=24)
    assert [r.drafted for r in unpinned.rounds] != [r.drafted for r in first.rounds]
