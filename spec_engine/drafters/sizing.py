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

On a shared machine one measurement can be wildly off (issue #36: at a load of 4.3 the cost of 4 rows came out 1.2,
1.29 and 17.78 in three tries, and a 17.78 stops every draft for the whole session). So the measurement repeats
passes until the curve is stable, `check_curve` rejects what cannot be true (a cost that falls with more rows, one
far beyond the row count) and says the curve is unsure, and the curve kept on the model is a `CostCurve` that the
engine corrects online: every verify forward's seconds by row count (core/timing.report_forward, from the decoder's
rounds) against one-row forwards timed in the same process (rounds that drafted nothing, plain decoding's steps).
When the curve says no draft pays where a typical machine's would, the round drafts nothing and its note says
"drafting paused: ..." with the numbers; every PROBE_EVERY such rounds one round drafts anyway (a probe), so a wrong
curve is corrected by the probe's own timing.

A decoder sizes by a `CostView`: the curve as it stood when the decoder was built, with its own count of paused
rounds (reset when a run begins). A run's rounds must not depend on the timing of the run itself: the playground
decodes a run twice (drawn live, then timed without drawing) and checks that both gave the same rounds, and with
the same seed a sampled run must give the same text. So a correction reaches the next decoder built (the next Run,
the next sweep point): a wrong curve pauses one run at most, which probes, and the runs after it draft again.
"""
from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections import deque
from typing import NamedTuple, Sequence

import torch

from spec_engine.core import speed, timing
from spec_engine.core.cache import forward_logits, new_cache, trim_cache

MAX_ROWS = 17            # decoder.MAX_K + 1: a round verifies at most 16 drafts and the token before them
CALIBRATION_CONTEXT = 64
CALIBRATION_REPEATS = 3
CALIBRATION_BUDGET_S = 6.0      # about what all passes take for the offline default on one CPU thread
CALIBRATION_MAX_REPEATS = 9     # passes beyond CALIBRATION_REPEATS while the curve is not yet stable
STABLE = 0.1                    # a pass that moves no cost by more than this fraction ends the measurement
FALL_TOLERANCE = 0.15           # a cost may dip this much below the one before it (the blocked kernel: 15 / 14 ms)
IMPOSSIBLE = 1.5                # a cost beyond this many times the row count is a measurement gone wrong
# A typical CPU's curve (bench/results/verify-cost-fp32*.md: 2 / 4 / 8 rows 1.46 / 1.78 / 2.04 on an EPYC, 8 rows
# 1.43 on a Xeon), rounded up: what a probe sizes its draft by, and the yardstick of "drafting paused".
TYPICAL = (0.0,) + tuple(1.0 + 0.15 * (r - 1) for r in range(1, MAX_ROWS + 1))
PROBE_EVERY = 8                 # paused rounds between two probes
WINDOW = 24                     # recent verify times kept per row count
ONE_ROW_MIN = 3                 # one-row forwards timed before online ratios are used
PAUSED = "drafting paused: "    # how a paused round's note begins (the page shows it)
PROBE = "probing the verify cost: "
_ATTRIBUTE = "_spec_engine_verify_costs"
_NOT_OBSERVED = "_spec_engine_not_observed"     # how many `not_observed` blocks are open on the model
_LOCK = threading.Lock()


def measure_verify_costs(model, rows: int = MAX_ROWS, context: int = CALIBRATION_CONTEXT,
                         repeats: int = CALIBRATION_REPEATS,
                         budget_s: float = CALIBRATION_BUDGET_S) -> tuple[float, ...]:
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
    previous = None
    for done in range(repeats + 1 + CALIBRATION_MAX_REPEATS):
        for r in range(1, rows + 1):
            if time.perf_counter() > deadline and len(seconds[2]) > 0:
                break
            start = timing.clock(device)                # on CUDA: after the queued work (timing.py)
            logits = forward_logits(model, ids[context:context + r], cache, r)
            seconds[r].append(timing.clock(logits.device) - start)
            trim_cache(cache, context)
        if time.perf_counter() > deadline:
            break
        if done >= repeats:             # the minimum passes are done: go on only while the curve still moves
            current = [statistics.median(s[1:]) for s in seconds[1:]]
            ratios = [c / current[0] for c in current]
            if previous is not None and all(abs(a - b) <= STABLE * b for a, b in zip(ratios, previous)):
                break
            previous = ratios
    medians = [statistics.median(s[1:] if len(s) > 1 else s) if s else None for s in seconds]
    measured = max(r for r in range(1, rows + 1) if medians[r] is not None)
    slope = max(0.0, medians[measured] - medians[measured - 1])
    for r in range(measured + 1, rows + 1):
        medians[r] = medians[measured] + slope * (r - measured)
    return (0.0,) + tuple(m / medians[1] for m in medians[1:])


def sane(costs: Sequence[float]) -> tuple[float, ...]:
    """`costs` with what cannot be true replaced: costs[1] is 1, r rows cost at least one row and at most r one-row
    forwards, and a cost never falls with more rows.

    The last is enforced from the right: r rows cost no more than r + 1 rows do (a running minimum from the largest
    row count down), not "at least what r - 1 rows cost". On a shared machine noise only adds time, so a wrong
    measurement is almost always one too high; a running maximum carried one such outlier to every larger row count
    (measured here: 4 rows at 1.35 where 4-8 rows cost 1.04-1.18 in four other passes made every tree of 3-7 nodes
    look a third dearer, and the trees shrank), while a running minimum drops it."""
    out = [0.0] + [min(max(float(c), 1.0), float(r)) for r, c in enumerate(costs[1:], 1)]
    for r in range(len(out) - 2, 1, -1):        # costs[1] is already 1: the clamp above leaves it nothing else
        out[r] = min(out[r], out[r + 1])
    return tuple(out[:len(costs)])                 # an empty curve stays empty


def check_curve(costs: Sequence[float]) -> tuple[tuple[float, ...], str | None]:
    """(the curve made sane, why it is unsure or None): a cost that falls by more than FALL_TOLERANCE with one more
    row, or exceeds IMPOSSIBLE times its row count, was measured while the machine did something else."""
    problems = []
    for r in range(2, len(costs)):
        if costs[r] < costs[r - 1] * (1 - FALL_TOLERANCE):
            problems.append(f"{r} rows cost {costs[r]:.2f}, less than {r - 1} rows ({costs[r - 1]:.2f})")
        elif costs[r] > IMPOSSIBLE * r:
            problems.append(f"{r} rows cost {costs[r]:.2f} one-row forwards")
    return sane(costs), ("; ".join(problems[:2]) + (f" (+{len(problems) - 2} more)" if len(problems) > 2 else "")
                         if problems else None)


class CostCurve(Sequence):
    """A verify-cost curve that corrects itself: costs[r] for r = 0..len - 1, read like the tuple it started from.

    `measured` is the start-up measurement (made sane); `observe(rows, seconds)` adds one timed verify forward.
    Once ONE_ROW_MIN one-row forwards are timed, a row count with timed forwards costs the median of its recent
    times over the median one-row time; a row count without any is the measured cost scaled by how far the measured
    curve was off at the nearest timed row count. Shared by every run on the model (a lock guards it); each
    decoder sizes by a `view()` of it (see the module's docstring). Only sizes change with it, never what a round
    verifies."""

    def __init__(self, measured: Sequence[float], unsure: str | None = None, probe_every: int = PROBE_EVERY):
        self.measured = sane(measured)
        self.unsure = unsure
        self.probe_every = probe_every
        self.observed = 0               # timed forwards seen
        self._samples = [deque(maxlen=WINDOW) for _ in self.measured]
        self._costs = self.measured
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._costs)

    def __getitem__(self, index):
        return self._costs[index]

    def __eq__(self, other):
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"CostCurve({', '.join(f'{c:.2f}' for c in self._costs)}{', unsure' if self.unsure else ''})"

    def observe(self, rows: int, seconds: float) -> None:
        """One verify forward over `rows` rows took `seconds` (a plain step is a one-row forward)."""
        if not 1 <= rows < len(self.measured) or not seconds > 0:
            return
        with self._lock:
            self._samples[rows].append(seconds)
            self.observed += 1
            self._costs = self._corrected()

    def _corrected(self) -> tuple[float, ...]:
        if len(self._samples[1]) < ONE_ROW_MIN:
            return self.measured
        one = statistics.median(self._samples[1])
        timed = {r: statistics.median(s) / one for r, s in enumerate(self._samples) if r > 1 and s}
        if not timed:
            return self.measured
        costs = list(self.measured)
        for r in range(2, len(costs)):
            if r in timed:
                costs[r] = timed[r]
            else:
                near = min(timed, key=lambda t: (abs(t - r), t))
                costs[r] = self.measured[r] * timed[near] / self.measured[near]
        return sane(costs)

    @property
    def corrected(self) -> bool:
        return self._costs != self.measured

    def source(self) -> str:
        if self.corrected:
            return f"corrected from {self.observed} timed forwards"
        return "measured at start-up" + (f", unsure: {self.unsure}" if self.unsure else "")

    def view(self) -> "CostView":
        """The curve as it stands now, for one decoder (see the module's docstring)."""
        with self._lock:
            return CostView(self._costs, self.source(), self.probe_every)


class CostView(Sequence):
    """A CostCurve frozen for one decoder: costs[r] as it stood, where they came from, and this decoder's count of
    rounds it paused (reset by `reset()` when a run begins, so a run sized twice is sized alike)."""

    def __init__(self, costs: Sequence[float], source: str = "given", probe_every: int = PROBE_EVERY):
        self.costs, self.source, self.probe_every = tuple(costs), source, probe_every
        self.paused_rounds = 0          # rounds sized to nothing since the last probe, in this run
        self.probes = 0

    def __len__(self) -> int:
        return len(self.costs)

    def __getitem__(self, index):
        return self.costs[index]

    def __eq__(self, other):
        return tuple(self) == tuple(other) if isinstance(other, Sequence) else NotImplemented

    __hash__ = None

    def reset(self) -> None:
        self.paused_rounds = self.probes = 0

    def size(self, chances: Sequence[float]) -> tuple[int, str | None]:
        """(draft length, note): the best length under these costs; when that is none but a typical machine's curve
        would draft, a paused round ("drafting paused: ...", the numbers) or, every probe_every of them, a probe
        sized by the typical curve."""
        best = best_draft_length(chances, self.costs)
        if best or not chances:
            return best, None
        typical = best_draft_length(chances, TYPICAL[:len(self)])
        if not typical:
            return 0, None                          # no draft pays on any machine: nothing is paused
        self.paused_rounds += 1
        if self.paused_rounds > self.probe_every:
            self.paused_rounds, self.probes = 0, self.probes + 1
            return typical, f"{PROBE}{typical + 1} rows (drafting was paused)"
        rows, left = typical + 1, self.probe_every - self.paused_rounds + 1
        expected = expected_tokens(chances[:typical])[typical]
        return 0, (f"{PAUSED}verifying {rows} rows costs {self.costs[rows]:.2f} one-token forwards on "
                   f"this machine ({self.source}), more than the {expected:.2f} tokens they would yield; "
                   f"probing again in {left} round{'s' if left != 1 else ''}")


class Sizing(NamedTuple):
    """A decoder's verify-cost curve as it sized its drafts: the costs and where they came from."""
    costs: tuple[float, ...]
    source: str


def sizing_view(costs, pinned: Sizing | None = None):
    """What a drafter sizes by for one decoder: a CostCurve's view (or, given `pinned`, a view of those costs: the
    playground's "measure again" sizes a run's drafts as its first pass did, though the session's forwards have
    corrected the curve since), or a fixed curve as it is."""
    if not isinstance(costs, CostCurve):
        return costs
    if pinned is not None and len(pinned.costs) == len(costs):
        return CostView(pinned.costs, pinned.source, costs.probe_every)
    return costs.view()


def sub_drafters(drafter) -> list:
    """`drafter` and the drafters it holds (a lookup-first drafter's two, ...), depth first."""
    found = [drafter]
    for value in getattr(drafter, "__dict__", {}).values():
        if hasattr(value, "check_target") and hasattr(value, "propose") and value is not drafter:
            found.extend(sub_drafters(value))
    return found


def pin_sizing(drafter, sizing: Sizing | None) -> None:
    """Every drafter in `drafter` that sizes by a verify-cost curve sizes by `sizing` (None: the curve as it stands
    when the decoder is built). Set before the decoder is built (its check_target takes the view)."""
    for part in sub_drafters(drafter):
        if hasattr(part, "pinned_sizing"):
            part.pinned_sizing = sizing


def drafter_sizing(drafter) -> Sizing | None:
    """The verify-cost curve `drafter` sizes its drafts by, once its decoder is built (None if it sizes by none)."""
    for part in sub_drafters(drafter):
        costs = getattr(part, "costs", None)
        if isinstance(costs, CostView):
            return Sizing(costs.costs, costs.source)
    return None


def reset_view(costs) -> None:
    """A run begins: a CostView forgets the rounds it paused in the last one."""
    if isinstance(costs, CostView):
        costs.reset()


def size_draft(chances: Sequence[float], costs: Sequence[float]) -> tuple[int, str | None]:
    """(draft length, note) under `costs`: a CostView pauses and probes (see CostView.size); a plain sequence
    (a fixed curve: tests, benchmarks) gives best_draft_length and no note."""
    if isinstance(costs, (CostView, CostCurve)):
        return (costs.view() if isinstance(costs, CostCurve) else costs).size(chances)
    return best_draft_length(chances, costs), None


def curve_key(model) -> int | None:
    """What the curve depends on besides the model: on a CPU the thread count in use, because the products' cost by
    row count changes with it (bench/results/kernel-cost-fp32-epyc.md vs kernel-cost-fp32-2threads-epyc.md: the
    engine's blocked product over 1 / 5 / 9 rows 14.9 / 14.8 / 22.9 ms at one thread, 13.4 / 13.1 / 15.7 at two);
    elsewhere nothing."""
    return torch.get_num_threads() if model.device.type == "cpu" else None


def verify_costs(model) -> CostCurve:
    """The model's verify-cost curve (see measure_verify_costs) at the thread count in use, measured on first use
    at that count and kept on the model as a CostCurve, which the engine's timed forwards correct (the model's
    forward observer). A measurement `check_curve` finds impossible is made once more and the saner one kept."""
    with _LOCK:
        curves = getattr(model, _ATTRIBUTE, None)
        if curves is None:
            curves = {}
            object.__setattr__(model, _ATTRIBUTE, curves)       # a plain attribute, not a module or a buffer
            timing.watch_forwards(model, lambda rows, seconds: observe(model, rows, seconds))
        key = curve_key(model)
        if key not in curves:
            costs, unsure = check_curve(measure_verify_costs(model))
            if unsure is not None:
                again, unsure_again = check_curve(measure_verify_costs(model))
                if unsure_again is None:
                    costs, unsure = again, None
            curves[key] = CostCurve(costs, unsure)
        return curves[key]


def kept_curve(model) -> CostCurve | None:
    """The curve `verify_costs` keeps on `model` at the thread count in use, or None if none was measured yet (it
    measures nothing)."""
    curve = getattr(model, _ATTRIBUTE, {}).get(curve_key(model))
    return curve if isinstance(curve, CostCurve) else None


def startup_sizing(model) -> Sizing | None:
    """The curve `verify_costs` keeps on `model`, as measured at start-up, without the corrections timed forwards
    made since (None before it is measured: a drafter then measures it and sizes by that very measurement). A
    sampled run's text depends on its draft lengths (the exact rule draws per drafted token), so a seeded sampled
    run pinned to this (`pin_sizing`) gives the same text whatever the runs before it or beside it timed."""
    curve = kept_curve(model)
    return None if curve is None else Sizing(curve.measured, "measured at start-up")


@contextlib.contextmanager
def not_observed(model):
    """Forwards of `model` made inside correct nothing of its curve: a warm-up's, whose first uses (lazy packing,
    compiled kernels and searches, cold caches) are not the machine's steady state. Measured: the playground's
    warm-up run fed 14 such forwards to the curve at start-up, and 5-8 rows went from 1.00 to 1.34 one-row forwards,
    so the first runs after start-up drafted trees of 4 nodes instead of 7 (35 rounds for the default prompt's 57
    tokens against 31, x1.19 against x1.44-1.50 of plain decoding). Nests; held on the model, so a curve measured
    inside is left alone too."""
    with _LOCK:
        object.__setattr__(model, _NOT_OBSERVED, getattr(model, _NOT_OBSERVED, 0) + 1)
    try:
        yield
    finally:
        with _LOCK:
            object.__setattr__(model, _NOT_OBSERVED, getattr(model, _NOT_OBSERVED) - 1)


def observe(model, rows: int, seconds: float) -> None:
    """A timed forward of `model` over `rows` rows, for its curve at the thread count in use (if measured)."""
    curve = kept_curve(model)
    if curve is not None and not getattr(model, _NOT_OBSERVED, 0):
        curve.observe(rows, seconds)


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
