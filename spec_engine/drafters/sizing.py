"""What a verify forward costs on this machine, and the draft length that buys the most tokens for it.

A speculative round costs one target forward over the drafted tokens plus one, and that cost is not linear in
the row count: on an Intel Xeon with the engine's kernels, 8 rows cost 1.43 one-token forwards and 9 rows 1.92
(bench/results/verify-cost-fp32.md), on an AMD EPYC 2 / 4 / 8 rows 1.46 / 1.78 / 2.04 (verify-cost-fp32-epyc.md);
on a GPU the first dozen rows are nearly free. So the best draft length
depends on the kernels as much as on the odds of acceptance. `verify_costs` measures the curve once per model
(at most CALIBRATION_BUDGET_S seconds, cached on the model object), and `best_draft_length` picks the length
with the most expected tokens per unit of that cost. Prompt lookup (odds by match length) and the EAGLE head
(its own top probabilities) size their drafts with it. The choice only changes how many tokens are proposed,
never how they are verified, so exactness is untouched.
"""
from __future__ import annotations

import statistics
import threading
import time
from typing import Sequence

import torch

from spec_engine.core import speed, timing
from spec_engine.core.cache import forward_logits, new_cache, trim_cache

MAX_ROWS = 17            # decoder.MAX_K + 1: a round verifies at most 16 drafts and the token before them
CALIBRATION_CONTEXT = 64
CALIBRATION_REPEATS = 3
CALIBRATION_BUDGET_S = 6.0      # about what all passes take for the offline default on one CPU thread
_ATTRIBUTE = "_spec_engine_verify_costs"
_LOCK = threading.Lock()


def measure_verify_costs(model, rows: int = MAX_ROWS, context: int = CALIBRATION_CONTEXT,
                         repeats: int = CALIBRATION_REPEATS, budget_s: float = CALIBRATION_BUDGET_S) -> tuple[float, ...]:
    """costs[r] = median time of a forward over r new tokens after `context` cached ones / that of one token,
    r = 1..rows (costs[0] is 0.0, a placeholder).

    Row counts are interleaved within each pass so that a passing slowdown of the machine touches all of them
    alike; the first pass warms up and is dropped. Measuring stops once `budget_s` is spent (a large target on a
    CPU gets fewer passes, or part of one): row counts left unmeasured continue the slope of the last two
    measured ones, so the first request never waits long for the curve."""
    speed.active().warm(model)                      # lazy packing on first use would land inside a measured forward
    vocab = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (context + rows,), generator=generator).tolist()
    cache, device = new_cache(model), model.device
    forward_logits(model, ids[:context], cache, 1)
    seconds: list[list[float]] = [[] for _ in range(rows + 1)]
    deadline = time.perf_counter() + budget_s
    for _ in range(repeats + 1):
        for r in range(1, rows + 1):
            if time.perf_counter() > deadline and len(seconds[2]) > 0:
                break
            start = timing.clock(device)                # on CUDA: after the queued work (timing.py)
            logits = forward_logits(model, ids[context:context + r], cache, r)
            seconds[r].append(timing.clock(logits.device) - start)
            trim_cache(cache, context)
    medians = [statistics.median(s[1:] if len(s) > 1 else s) if s else None for s in seconds]
    measured = max(r for r in range(1, rows + 1) if medians[r] is not None)
    slope = max(0.0, medians[measured] - medians[measured - 1])
    for r in range(measured + 1, rows + 1):
        medians[r] = medians[measured] + slope * (r - measured)
    return (0.0,) + tuple(m / medians[1] for m in medians[1:])


def curve_key(model) -> int | None:
    """What the curve depends on besides the model: on a CPU the thread count in use, because the products' cost by
    row count changes with it (bench/results/kernel-cost-fp32-epyc.md vs kernel-cost-fp32-2threads-epyc.md: the
    engine's blocked product over 1 / 5 / 9 rows 14.9 / 14.8 / 22.9 ms at one thread, 13.4 / 13.1 / 15.7 at two);
    elsewhere nothing."""
    return torch.get_num_threads() if model.device.type == "cpu" else None


def verify_costs(model) -> tuple[float, ...]:
    """The model's verify-cost curve (see measure_verify_costs) at the thread count in use, measured on first use
    at that count and kept on the model."""
    with _LOCK:
        curves = getattr(model, _ATTRIBUTE, None)
        if curves is None:
            curves = {}
            object.__setattr__(model, _ATTRIBUTE, curves)       # a plain attribute, not a module or a buffer
        key = curve_key(model)
        if key not in curves:
            curves[key] = measure_verify_costs(model)
        return curves[key]


def expected_tokens(chances: Sequence[float]) -> list[float]:
    """expected[m] = tokens a round yields when it drafts the first m tokens, whose chances of being right
    given all earlier ones are right are `chances`: the accepted drafts plus the correction or bonus token."""
    expected, survive = [1.0], 1.0
    for chance in chances:
        survive *= chance
        expected.append(expected[-1] + survive)
    return expected


def best_draft_length(chances: Sequence[float], costs: Sequence[float]) -> int:
    """The m in 0..len(chances) with the most expected tokens per verify cost (costs[r] = cost of r rows);
    the shorter length wins a tie."""
    expected = expected_tokens(chances[:len(costs) - 2])
    return max(range(len(expected)), key=lambda m: (expected[m] / costs[m + 1], -m))
