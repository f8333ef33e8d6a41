"""Sweeps: when does speculative decoding pay? The same prompt and seed, one setting varied at a time.

`sweep_points` lists the runs (k = 1..8, a list of temperatures, or a list of draft names); `run_sweep` runs
each `repeats` times with `SpeculativeDecoder.generate` (in passes over all points, so that a slow spell of the
machine touches every point alike), measures plain decoding (`autoregressive_generate`) once per distinct sampling
setting and pass, and yields a `SweepRow` per finished run: measured acceptance, tokens per target forward,
tokens per second and speedup over plain decoding (median and min-max over the repeats), the analytic tokens per
forward (1 - a^(k+1)) / (1 - a) at the measured per-token acceptance a (accepted / judged drafts, see
`spec_engine.core.metrics.judged_acceptance`), and the speedup that formula predicts from the measured draft and
verify costs (`spec_engine.core.metrics.speedup_model`).

Only the timings vary between repeats (same seed, same drafts), so `verdict` names a best setting only when its
slowest repeat beats the fastest repeat of every setting whose rounds differ, and says which settings gave
identical rounds (a drafter that cuts its drafts to what pays stops growing them at some k).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from spec_engine.core.decoder import MAX_K, SpeculativeDecoder, autoregressive_generate
from spec_engine.drafters import Drafter
from spec_engine.core.events import BaselineResult
from spec_engine.core.metrics import expected_tokens_per_round, speedup_model
from spec_engine.core.sampling import SamplingParams

AXES = ("k", "temperature", "draft")
DEFAULT_KS = tuple(range(1, 9))
DEFAULT_TEMPERATURES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
DEFAULT_REPEATS = 3
MAX_REPEATS = 10


@dataclass(frozen=True)
class SweepPoint:
    """The settings of one run of a sweep."""

    draft: str
    k: int
    sampling: SamplingParams


@dataclass(frozen=True)
class SweepRow:
    axis: str                           # "k" | "temperature" | "draft"
    value: object                       # the varied setting's value in this run
    point: SweepPoint
    acceptance: float                   # accepted / drafted
    tokens_per_forward: float           # emitted tokens per target verify forward (= per round)
    expected_tokens_per_forward: float  # (1 - a^(k+1)) / (1 - a) at the measured judged acceptance a
    rounds: int
    new_tokens: int
    seconds: float                      # prefill + rounds
    tokens_per_second: float
    plain_tokens_per_second: float      # plain decoding, same prompt, sampling and seed
    speedup: float                      # tokens_per_second / plain_tokens_per_second
    tokens: list[int]
    judged_acceptance: float = 0.0      # accepted / judged drafts: the a of the formula
    index: int = 0                      # the point's position in the sweep
    repeats: int = 1                    # runs measured so far; timings are medians over them
    speedup_min: float | None = None    # the spread of the repeats' speedups (None: speedup)
    speedup_max: float | None = None
    draft_cost: float | None = None     # mean draft seconds per round / plain step (median over repeats)
    verify_cost: float | None = None    # mean verify seconds per round / plain step
    predicted_speedup: float | None = None   # E[tokens per round] / (verify_cost + draft_cost)
    longest_draft: int = 0              # the most tokens any round drafted
    signature: tuple = ()               # (drafted, accepted) of every round: equal signatures, identical rounds

    @property
    def low(self) -> float:
        return self.speedup if self.speedup_min is None else self.speedup_min

    @property
    def high(self) -> float:
        return self.speedup if self.speedup_max is None else self.speedup_max


def sweep_points(axis: str, values, draft: str, k: int, sampling: SamplingParams) -> list[SweepPoint]:
    """One point per value of `axis`, the other settings as given. ValueError for a bad axis or value."""
    if axis not in AXES:
        raise ValueError(f"sweep axis must be one of {AXES}, got {axis!r}")
    values = list(values)
    if not values:
        raise ValueError(f"the {axis} sweep needs at least one value")
    if axis == "k":
        bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_K]
        if bad:
            raise ValueError(f"k values must be whole numbers in [1, {MAX_K}], got {bad[0]!r}")
        return [SweepPoint(draft, v, sampling) for v in values]
    if axis == "temperature":
        return [SweepPoint(draft, k, SamplingParams(float(v), sampling.top_k, sampling.top_p)) for v in values]
    return [SweepPoint(str(v), k, sampling) for v in values]


def axis_value(axis: str, point: SweepPoint):
    return {"k": point.k, "temperature": point.sampling.temperature, "draft": point.draft}[axis]


def baseline_key(sampling: SamplingParams) -> tuple:
    """Plain decoding depends on the sampling only (greedy ignores top-k and top-p)."""
    return ("greedy",) if sampling.greedy else (sampling.temperature, sampling.top_k, sampling.top_p)


def run_sweep(target_model, make_drafter: Callable[[str], Drafter], input_ids: torch.Tensor, axis: str,
              points: list[SweepPoint], max_new_tokens: int, seed: int = 0, rule: str = "exact", eos_token_id=None,
              should_stop: Callable[[], bool] | None = None,
              baselines: dict[tuple, list[BaselineResult]] | None = None, repeats: int = 1) -> Iterator[SweepRow]:
    """Run every point `repeats` times (same prompt, seed and rule), in passes over all points; after each run
    yields that point's row over its runs so far (`row.index`, `row.repeats`; `latest` keeps the newest per
    point). `baselines` (shared by the caller if it likes) caches plain decoding per `baseline_key`, one run per
    pass. When `should_stop()` turns true the sweep ends; a run or baseline it cut short yields no row (its numbers
    would not be comparable)."""
    if not 1 <= repeats <= MAX_REPEATS:
        raise ValueError(f"repeats must be in [1, {MAX_REPEATS}], got {repeats!r}")
    baselines = {} if baselines is None else baselines
    runs: list[list[tuple]] = [[] for _ in points]
    for repeat in range(repeats):
        for index, point in enumerate(points):
            if should_stop is not None and should_stop():
                return
            plain = baselines.setdefault(baseline_key(point.sampling), [])
            if len(plain) <= repeat:
                result = autoregressive_generate(target_model, input_ids, max_new_tokens, point.sampling, seed,
                                                 eos_token_id, should_stop)
                if result.stop_reason == "cancelled":
                    return
                plain.append(result)
            decoder = SpeculativeDecoder(target_model, make_drafter(point.draft), rule=rule)
            result = decoder.generate(input_ids, k=point.k, max_new_tokens=max_new_tokens, sampling=point.sampling,
                                      seed=seed, eos_token_id=eos_token_id, should_stop=should_stop, display=False)
            if result.stop_reason == "cancelled":
                return
            runs[index].append((result, plain[repeat]))
            yield sweep_row(axis, point, runs[index], index)


def sweep_row(axis: str, point: SweepPoint, runs: list[tuple], index: int = 0) -> SweepRow:
    """One point's row from its (GenerationResult, BaselineResult) pairs, one per repeat. Counts come from the
    first run (the repeats draft and emit the same tokens); timings are medians, the speedup's spread min-max of
    the repeats' own speedups (each against the plain run of its pass)."""
    result = runs[0][0]
    stats = result.stats
    speedups = [r.stats.tokens_per_second / b.tokens_per_second if b.tokens_per_second > 0 else 0.0
                for r, b in runs]
    models = [m for m in (speedup_model(r.rounds, b.step_seconds) for r, b in runs) if m is not None]

    def median_of(values):
        return statistics.median(values) if values else None

    return SweepRow(
        axis=axis, value=axis_value(axis, point), point=point, acceptance=stats.acceptance_rate,
        tokens_per_forward=stats.tokens_per_round,
        judged_acceptance=stats.judged_acceptance,
        expected_tokens_per_forward=expected_tokens_per_round(stats.judged_acceptance, point.k),
        rounds=stats.rounds, new_tokens=stats.new_tokens, seconds=statistics.median(r.total_seconds for r, _ in runs),
        tokens_per_second=statistics.median(r.stats.tokens_per_second for r, _ in runs),
        plain_tokens_per_second=statistics.median(b.tokens_per_second for _, b in runs),
        speedup=statistics.median(speedups), tokens=list(result.tokens), index=index, repeats=len(runs),
        speedup_min=min(speedups), speedup_max=max(speedups),
        draft_cost=median_of([m.draft_cost for m in models]), verify_cost=median_of([m.verify_cost for m in models]),
        predicted_speedup=median_of([m.predicted_speedup for m in models]),
        longest_draft=max((len(r.drafted) for r in result.rounds), default=0),
        signature=tuple((tuple(r.drafted), r.accepted) for r in result.rounds))


def latest(rows) -> list[SweepRow]:
    """The newest row of each point, in sweep order (run_sweep yields a point's row again after each repeat)."""
    newest = {row.index: row for row in rows}
    return [newest[i] for i in sorted(newest)]


def best(rows: list[SweepRow]) -> SweepRow | None:
    """The run with the highest measured (median) speedup (the first of equals)."""
    return max(rows, key=lambda r: r.speedup, default=None)


def identical_groups(rows: list[SweepRow]) -> list[list[SweepRow]]:
    """Rows whose runs drafted, accepted and emitted exactly the same tokens, grouped (sweep order; only groups of
    two or more). Their timings differ by noise alone."""
    groups: dict[tuple, list[SweepRow]] = {}
    for row in rows:
        if row.signature:
            groups.setdefault((row.signature, tuple(row.tokens)), []).append(row)
    return [group for group in groups.values() if len(group) > 1]


@dataclass(frozen=True)
class Verdict:
    best: SweepRow | None        # named only when it beats the others beyond the spread of the repeats
    text: str                    # one or two sentences for people: the best, or why none is named


def values_text(rows: list[SweepRow]) -> str:
    return ", ".join(str(r.value) for r in rows)


def cut_text(rows: list[SweepRow], axis: str, sized: bool = True) -> str:
    """What identical rounds mean: on a k sweep, the k above which nothing changes."""
    groups = identical_groups(rows)
    if not groups:
        return ""
    if axis == "k":
        top = max(rows, key=lambda r: r.point.k)
        group = next((g for g in groups if top in g), None)
        if group is not None:
            n = min(r.point.k for r in group)
            if all(r in group for r in rows if r.point.k >= n):
                why = "The draft cut its drafts to what pays" if sized else "The drafter never drafted more"
                return (f"{why}: k above {n} changes nothing (k = {values_text(group)} gave identical rounds; the "
                        f"longest draft was {top.longest_draft} tokens).")
    return " ".join(f"{axis} = {values_text(g)} gave identical rounds." for g in groups)


def verdict(rows: list[SweepRow], axis: str, sized: bool = True) -> Verdict:
    """Name the best setting only when its slowest repeat beats the fastest repeat of every setting whose rounds
    differ from its own; settings with identical rounds count as one (the smallest value is named). Otherwise say
    that the differences are within noise. `sized`: the drafts were sized by the drafter (not fixed-length)."""
    cut = cut_text(rows, axis, sized)
    if len(rows) < 2:
        return Verdict(None, cut)
    top = best(rows)
    twins = next((g for g in identical_groups(rows) if top in g), [top])
    others = [r for r in rows if r not in twins]
    named = twins[0]
    noun = f"{axis} = {named.value}"
    if len(twins) > 1:
        noun += f" (same rounds as {axis} = {values_text(twins[1:])})"
    if not others:
        return Verdict(None, f"No best {axis}: every run gave identical rounds, so their differences are timing "
                             f"noise. {cut}".strip())
    if min(r.repeats for r in rows) < 2:
        return Verdict(None, f"Fastest: {noun} (×{top.speedup:.2f}), measured once: repeat the runs to tell it "
                             f"from noise. {cut}".strip())
    rival = max(others, key=lambda r: r.high)
    if top.low > rival.high:
        return Verdict(named, f"Best {noun}: ×{top.speedup:.2f} (×{top.low:.2f}-{top.high:.2f} over {top.repeats} "
                              f"repeats), beyond the spread of every other {axis}. {cut}".strip())
    overlap = [r for r in others if r.high >= top.low]
    return Verdict(None, f"No best {axis}: within noise. The fastest median, {axis} = {top.value} (×{top.speedup:.2f}, "
                         f"×{top.low:.2f}-{top.high:.2f} over {top.repeats} repeats), overlaps {axis} = "
                         f"{values_text(overlap)}. {cut}".strip())
