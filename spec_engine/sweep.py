"""Sweeps: when does speculative decoding pay? The same prompt and seed, one setting varied at a time.

`sweep_points` lists the runs (k = 1..8, a list of temperatures, or a list of draft names); `run_sweep` runs
each with `SpeculativeDecoder.generate`, measures plain decoding (`autoregressive_generate`) once per distinct
sampling setting, and yields one `SweepRow` per run: measured acceptance, tokens per target forward, tokens
per second, measured speedup over plain decoding, and the analytic tokens per forward
(1 - a^(k+1)) / (1 - a) for the measured per-token acceptance a (accepted / judged drafts, see
`spec_engine.metrics.judged_acceptance`). Nothing is estimated except that analytic curve.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from .decoder import MAX_K, SpeculativeDecoder, autoregressive_generate
from .drafters import Drafter
from .events import BaselineResult
from .metrics import expected_tokens_per_round
from .sampling import SamplingParams

AXES = ("k", "temperature", "draft")
DEFAULT_KS = tuple(range(1, 9))
DEFAULT_TEMPERATURES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


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
              baselines: dict[tuple, BaselineResult] | None = None) -> Iterator[SweepRow]:
    """Run every point (same prompt, seed and rule); yields a row per finished run. `baselines` (shared by
    the caller if it likes) caches plain decoding per `baseline_key`. When `should_stop()` turns true the
    sweep ends; a run or baseline it cut short yields no row (its numbers would not be comparable)."""
    baselines = {} if baselines is None else baselines
    for point in points:
        if should_stop is not None and should_stop():
            return
        key = baseline_key(point.sampling)
        if key not in baselines:
            plain = autoregressive_generate(target_model, input_ids, max_new_tokens, point.sampling, seed,
                                            eos_token_id, should_stop)
            if plain.stop_reason == "cancelled":
                return
            baselines[key] = plain
        decoder = SpeculativeDecoder(target_model, make_drafter(point.draft), rule=rule)
        result = decoder.generate(input_ids, k=point.k, max_new_tokens=max_new_tokens, sampling=point.sampling,
                                  seed=seed, eos_token_id=eos_token_id, should_stop=should_stop)
        if result.stop_reason == "cancelled":
            return
        yield sweep_row(axis, point, result, baselines[key])


def sweep_row(axis: str, point: SweepPoint, result, baseline: BaselineResult) -> SweepRow:
    stats = result.stats
    plain = baseline.tokens_per_second
    return SweepRow(
        axis=axis, value=axis_value(axis, point), point=point, acceptance=stats.acceptance_rate,
        tokens_per_forward=stats.tokens_per_round,
        judged_acceptance=stats.judged_acceptance,
        expected_tokens_per_forward=expected_tokens_per_round(stats.judged_acceptance, point.k),
        rounds=stats.rounds, new_tokens=stats.new_tokens, seconds=result.total_seconds,
        tokens_per_second=stats.tokens_per_second, plain_tokens_per_second=plain,
        speedup=stats.tokens_per_second / plain if plain > 0 else 0.0, tokens=list(result.tokens))


def best(rows: list[SweepRow]) -> SweepRow | None:
    """The run with the highest measured speedup (the first of equals)."""
    return max(rows, key=lambda r: r.speedup, default=None)
