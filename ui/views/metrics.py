"""Arithmetic over RoundEvents for the plots and the headline numbers (no token probability is computed here).

`expected_tokens_per_round` (the analytic expectation) comes from the engine, so CLI, benchmarks and UI agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from spec_engine import (acceptance_by_position, acceptance_rate, expected_tokens_by_position,  # noqa: F401
                         expected_tokens_per_round, judged_acceptance, speedup_model)           # (re-exported)


def running(values: list[float]) -> list[float]:
    return list(accumulate(values))


def round_acceptance(ev) -> float | None:
    """accepted / drafted of one round (a tree's drafts counted by its depth: RoundEvent.draft_length); None when
    nothing was drafted."""
    return ev.accepted / ev.draft_length if ev.draft_length else None


def running_acceptance(rounds) -> list[float]:
    drafted = running([r.draft_length for r in rounds])
    accepted = running([r.accepted for r in rounds])
    return [a / d if d else 0.0 for a, d in zip(accepted, drafted)]


def acceptance_interval(rounds, level: float = 0.9, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The spread of a run's acceptance (accepted / drafted over its rounds): a percentile bootstrap over rounds,
    `level` wide. Rounds, not tokens, are resampled: a round's drafts are judged in a chain that stops at its first
    rejection, so its tokens are not independent draws, and rounds are. Seeded, so a run always shows the same
    interval. (0, 0) when nothing was drafted."""
    import numpy as np
    pairs = np.array([(r.accepted, r.draft_length) for r in rounds if r.draft_length], dtype=float).reshape(-1, 2)
    if not len(pairs):
        return 0.0, 0.0
    picks = np.random.default_rng(seed).integers(0, len(pairs), size=(resamples, len(pairs)))
    rates = pairs[picks, 0].sum(axis=1) / pairs[picks, 1].sum(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(rates, [tail, 100 - tail])
    return float(low), float(high)


def running_judged_acceptance(rounds) -> list[float]:
    """The i.i.d. formula's a after each round: accepted / judged drafts
    (spec_engine.core.metrics.judged_acceptance)."""
    accepted = running([r.accepted for r in rounds])
    rejected = running([int(r.correction is not None) for r in rounds])
    return [a / (a + j) if a + j else 0.0 for a, j in zip(accepted, rejected)]


def elapsed_seconds(rounds) -> list[float]:
    """Engine time after each round: prefill + the rounds so far (UI rendering between rounds not counted)."""
    prefill = rounds[0].prefill_seconds if rounds else 0.0
    return [prefill + t for t in running([r.round_seconds for r in rounds])]


def tokens_so_far(rounds) -> list[int]:
    return running([len(r.emitted) for r in rounds])


def baseline_curve(baseline) -> tuple[list[float], list[int]]:
    """(seconds, tokens) of plain decoding: the first token after the prefill, then one per step."""
    if baseline is None or not baseline.tokens:
        return [], []
    times = [baseline.prefill_seconds + t for t in [0.0] + running(list(baseline.step_seconds))]
    times = times[:len(baseline.tokens)]
    return times, list(range(1, len(times) + 1))


COST_FIELDS = ("draft_cost", "verify_cost", "overhead_cost", "predicted_tokens_per_forward", "predicted_speedup")


def cost_fields(rounds, baseline) -> dict:
    """The measured terms of the speedup formula for a run summary (`spec_engine.core.metrics.speedup_model`): draft,
    verify and overhead cost per round in plain decoding steps, and the speedup E[tokens per round] / (verify + draft
    + overhead) they predict. The overhead (sampling, the rule, trimming, bookkeeping) is measured as the time strip
    measures it: the paper's formula leaves it out, and the card then promised x1.30 where the strip's 1.63 tokens
    a round over 1.34 steps made x1.22, as measured. All None without a plain run to take the step time from."""
    model = speedup_model(rounds, getattr(baseline, "step_seconds", None) or ()) if baseline is not None else None
    if model is None:
        return dict.fromkeys(COST_FIELDS)
    cost = model.round_cost + model.overhead_cost
    return {"draft_cost": model.draft_cost, "verify_cost": model.verify_cost, "overhead_cost": model.overhead_cost,
            "predicted_tokens_per_forward": model.expected_tokens_per_round,
            "predicted_speedup": model.expected_tokens_per_round / cost if cost > 0 else 0.0}


def plain_step_seconds(baseline) -> float | None:
    """One plain decoding step: the mean of the plain run's per-step times (the unit `speedup_model` and
    `cost_fields` use, so the strip and the cost fields agree); None without a measured step."""
    steps = [float(s) for s in (getattr(baseline, "step_seconds", None) or ())]
    step = sum(steps) / len(steps) if steps else 0.0
    return step if step > 0 else None


@dataclass(frozen=True)
class RoundCost:
    """Where one round's time went, in plain decoding steps (a round that emits more tokens than it costs steps
    beat plain decoding). Overhead is the round's time outside draft and verify (sampling, the rule, trimming,
    bookkeeping), clamped at 0 as in `speedup_model`."""

    round: int              # 1-based round number
    draft: float            # draft_seconds / plain step
    verify: float           # verify_seconds / plain step
    overhead: float         # (round_seconds - draft_seconds - verify_seconds) / plain step
    tokens: int             # tokens the round emitted


def round_costs(rounds, baseline) -> list[RoundCost]:
    """Each round's draft, verify and overhead in plain steps (`plain_step_seconds`); [] without rounds or a
    plain step. Give it the timed run's rounds: the live run's clocks ran while the browser drew them."""
    step = plain_step_seconds(baseline)
    if step is None:
        return []
    return [RoundCost(r.index + 1, r.draft_seconds / step, r.verify_seconds / step,
                      max(0.0, r.round_seconds - r.draft_seconds - r.verify_seconds) / step, len(r.emitted))
            for r in rounds]
