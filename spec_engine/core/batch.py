"""Many sequences at once: continuous batching with speculation inside the batch.

Batching shares one weight read across users; speculation shares one across future positions of one user. A round
here does both: every active sequence drafts (its own drafter, k, rule, sampling and seed), then ONE target forward
scores all their rows packed together (core/packed.py: each row attends only to its own sequence's cache), then each
sequence verifies, commits and trims on its own, with the KV invariant checked for every sequence every round. The
per-sequence steps are `SpeculativeDecoder.plan` and `.settle`, the same code a lone run takes, so a sequence in a
batch is verified exactly as it is alone. Requests join between rounds (their prompts are prefilled before the next
round's forward, in a lone run's chunks and by its forward) and leave when they finish or are cancelled: nobody waits
for the batch to drain.

How many drafts a batch should verify depends on the batch. Verify work grows as (rows of all sequences), and a
CPU's forward grows with rows much sooner than a GPU's: at batch 1 four extra rows are almost free, at batch 32 they
cost what they yield. `draft_caps` sizes each sequence's drafts from measured numbers (`BatchCosts`: one sequence's
forward by rows in all, with the steps where the kernels' row tiles end, plus what more sequences add, timed on this
machine and corrected by the batch's own forwards; each sequence's acceptance so far), for the most expected tokens
per second of the whole batch. Where no plan of drafts promises 10% over plain (DRAFT_MARGIN), every cap is 0:
plain batched decoding (vLLM's dynamic speculative decoding and TensorRT-LLM's `draft_len_schedule` do this from a
fixed table). A sequence whose drafts the batch sizes drafts a chain, which that model prices
(drafting.drafting_chains: an EAGLE tree drafts its spine).

Seeds: under the exact rule a sampled sequence's draws depend on how many drafts each round had, so the batch leaves
a sampled sequence's draft lengths to its own drafter, as alone (`pinned`): its seed then fixes its text in any batch,
as long as its drafter sizes alike (the app sizes sampled runs by the start-up curve). Rule "invariant" (core/rule.py)
makes the text a function of the seed alone, whatever the draft lengths: the same alone, in any batch, under any load
and after a restart, and equal to `autoregressive_generate(invariant=True)`; the batch sizes those freely.
"""
from __future__ import annotations

import bisect
import contextlib
import heapq
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from spec_engine.core import timing
from spec_engine.core.cache import PREFILL_CHUNK, cache_len, check_invariant, new_cache
from spec_engine.core.decoder import DecodeState, SpeculativeDecoder, eos_set, validate_request
from spec_engine.core.drafting import Drafter, Proposal, catching_up_together, drafting_chains
from spec_engine.core.events import GenerationResult, RoundEvent, run_stats
from spec_engine.core.packed import Segment, forward_packed, one_forward
from spec_engine.core.sampling import SamplingParams, make_generator

DRAFT_LENGTHS = ("adaptive", "fixed", "off")
# prompt rows a round feeds (whole chunks), so joiners never stall a batch long
PREFILL_ROWS_PER_ROUND = PREFILL_CHUNK
ACCEPT_PRIOR = (1.5, 0.5)                   # a sequence's acceptance before its first rounds: Beta(1.5, 0.5), mean 0.75
COST_MEMORY = 0.9                           # per observed forward: the old scale's weight (in logs) at its point
ACCEPT_MEMORY = 0.9                         # per round: older rounds' weight in a sequence's acceptance estimate
# A plan with drafts must promise this much more than plain decoding's tokens per second to be taken (draft_caps:
# the estimates lean toward drafting). At 2-4 sequences on the 2-core EPYC the plans taken promise +20-40%.
DRAFT_MARGIN = 1.1


@dataclass(frozen=True)
class Request:
    """One sequence to decode in a batch: everything a lone `SpeculativeDecoder.stream` call takes, plus an id."""
    id: object
    input_ids: torch.Tensor                 # [1, T]
    drafter: Drafter                        # its own instance: drafters hold one run's state
    k: int = 4
    max_new_tokens: int = 64
    sampling: SamplingParams | None = None
    seed: int = 0
    eos_token_id: object = None
    rule: str = "exact"
    display: bool = False


@dataclass(frozen=True)
class BatchEvent:
    """A sequence's round inside a batch: its RoundEvent, and the batch it ran in."""
    request_id: object
    event: RoundEvent
    batch_size: int                         # sequences whose rows the round's packed forward scored
    rows: int                               # rows of that forward, all sequences together
    draft_cap: int                          # drafts the batch allowed this sequence this round (at most its k)


class Idle(Drafter):
    """A drafter that proposes nothing and keeps no state: a sequence's stand-in drafter under draft_length "off"."""

    def __init__(self, name: str):
        self.name = name

    def propose(self, committed: list[int], k: int, params, generator) -> Proposal:
        return Proposal([], None)


class Deferred(Drafter):
    """A sequence's drafter inside a batch. In a round the batch gives it no drafts (cap 0), the committed tokens'
    features wait here instead of going through the drafter's catch-up: for an EAGLE head that is a head forward per
    sequence per round, which made a batch with speculation sized off slower than plain batched decoding (x0.90 at
    8 sequences, x0.89 at 32). The next round it drafts, they go in first, in one catch-up of all their rows (as
    drafters/base.py's FirstThenFallback does after a lookup round), together with the other sequences' catch-ups
    (`BatchDecoder.catch_up`: one EAGLE head forward for the batch). Only a pinned sequence (`BatchDecoder.pinned`)
    catches up as soon as a round it drafted ends, as alone: its drafter is then fed exactly as in a lone run."""

    def __init__(self, drafter: Drafter):
        self.inner = drafter
        self.name = drafter.name
        self.feature_layers = drafter.feature_layers
        self.hold = False                           # rollback keeps what it is given (BatchDecoder.step sets it)
        self.held = False                           # a rollback was kept back: catch up before the next draft
        self.waiting: list[torch.Tensor] = []       # [m, F] features of those rounds, in order
        self.starting = None                        # (prompt ids, their features) until the drafter begins

    @property
    def cache(self):
        return self.inner.cache

    def check_target(self, target_model) -> None:
        self.inner.check_target(target_model)

    def model_modules(self):
        return self.inner.model_modules()

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        """The drafter begins when it first drafts: an EAGLE head's begin runs it over the whole prompt, which a
        sequence the batch never gives drafts would pay for nothing (at 32 sequences of 40-145 tokens, a few
        percent of the batch's time)."""
        self.hold, self.held, self.waiting = False, True, []
        self.starting = (list(prompt_ids), target_features)

    def propose(self, committed: list[int], k: int, params, generator) -> Proposal:
        if k and self.held:
            self.catch_up(committed)
        return self.inner.propose(committed, k, params, generator)

    def cache_len(self) -> int | None:
        return None if self.starting is not None else self.inner.cache_len()

    @property
    def pending_rows(self) -> int:
        """Rows a catch-up would feed the drafter now: the waiting rounds' (and the prompt's, before it begins)."""
        rows = sum(part.shape[0] for part in self.waiting)
        return rows + self.prompt_rows if self.held else 0

    @property
    def prompt_rows(self) -> int:
        """The prompt's rows, while the drafter waits for its begin (0 once it has begun)."""
        return len(self.starting[0]) if self.starting is not None else 0

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        if target_features is not None and target_features.shape[0]:
            self.waiting.append(target_features)
        self.held = True
        if not self.hold:
            self.catch_up(committed)

    def catch_up(self, committed: list[int]) -> None:
        if self.starting is not None:
            (prompt_ids, features), self.starting = self.starting, None
            self.inner.begin(prompt_ids, features)
        parts, self.waiting, self.held = self.waiting, [], False
        self.inner.rollback(committed, torch.cat(parts) if len(parts) > 1 else parts[0] if parts else None)


@dataclass
class Member:
    """A request in the batch: its decoder (the lone-run code), its state, and what the sizing has learnt of it."""
    request: Request
    decoder: SpeculativeDecoder
    state: DecodeState
    fed: int = 0                            # prompt tokens prefilled so far (all but the last are fed)
    features: list = field(default_factory=list)
    kept: float = ACCEPT_PRIOR[0]           # decayed counts of drafts kept and refused
    refused: float = ACCEPT_PRIOR[1]
    draft_seconds: float = 0.0              # per drafted token (decayed over the rounds that drafted)
    plain_host: float | None = None         # host seconds of its plan + settle in a round without drafts (decayed)
    drafting_extra: float = 0.0             # ... more in a round with drafts, beyond its drafts' own seconds: the
                                            # drafter's catch-up and the heavier verification (decayed)
    resume_per_row: float = 0.0             # seconds per waiting row of a catch-up before drafting again (decayed)
    rounds: list = field(default_factory=list)
    started: float = 0.0

    @property
    def prefilling(self) -> bool:
        return self.fed < self.state.prompt_len - 1

    @property
    def acceptance(self) -> float:
        return self.kept / (self.kept + self.refused)

    def learn_resume(self, seconds: float, rows: int) -> None:
        """A catch-up of `rows` waiting rows took `seconds` (BatchDecoder.step)."""
        if rows:
            self.resume_per_row = decayed(self.resume_per_row, seconds / rows)

    def resume_seconds(self, known_per_row: float = 0.0) -> float:
        """What drafting in the next round would cost first: the catch-up of the rows waiting (0 when none wait), at
        its own seconds a row, or at `known_per_row` (what its drafter kind's begins took here a row,
        BatchCosts.begin_row) before it has any.

        A drafter not begun yet waits for its begin over the whole prompt: a one-off that serves every round the
        sequence drafts after it, so the prompt's rows count spread over the rounds it has left (drafting one token
        a round). Charged whole to one round, a begin would never pay and a sequence joining a running batch would
        never draft; charged nothing, as before any catch-up was timed, a batch of 16 began drafters for one or two
        rounds in its first rounds and its tail, ~5 ms each, and ran x0.93 of plain batched decoding with
        speculation otherwise sized off."""
        drafter = self.decoder.drafter
        if not isinstance(drafter, Deferred) or not drafter.pending_rows:
            return 0.0
        rounds_left = max(1.0, (self.state.max_new_tokens - self.state.generated) / (1.0 + self.acceptance))
        rows = drafter.pending_rows - drafter.prompt_rows + drafter.prompt_rows / rounds_left
        return (self.resume_per_row or known_per_row) * rows

    def learn(self, event: RoundEvent, host_seconds: float, prior: tuple[float, float] = ACCEPT_PRIOR) -> None:
        """Update the estimates from a round: acceptance (each kept draft a success, a correction one failure), and
        what the sequence's own host work (its plan and settle, `host_seconds`) costs with and without drafts.
        `prior`: the counts a round without drafts ages the estimate toward (BatchDecoder.prior)."""
        if not event.drafted:
            self.plain_host = decayed(self.plain_host, host_seconds)
            # No drafts, no evidence: what the counts hold ages by the same memory, toward the prior. Kept as it was,
            # a sequence whose estimate fell low enough for the sizing to give it no drafts never drafted again (its
            # estimate moved only in rounds that drafted), however predictable its text became. From 0.5 (2 kept, 2
            # refused) toward 0.75 it is 0.59 after 7 plain rounds and 0.66 after 15: the sizing tries it again where
            # that pays, as the lone drafters' pause probes every PROBE_EVERY rounds (drafters/sizing.py).
            self.kept = ACCEPT_MEMORY * self.kept + (1 - ACCEPT_MEMORY) * prior[0]
            self.refused = ACCEPT_MEMORY * self.refused + (1 - ACCEPT_MEMORY) * prior[1]
            return
        extra = max(0.0, host_seconds - event.draft_seconds - (self.plain_host or 0.0))
        self.drafting_extra = decayed(self.drafting_extra, extra)
        kept, refused = evidence(event)
        self.kept = ACCEPT_MEMORY * self.kept + kept
        self.refused = ACCEPT_MEMORY * self.refused + refused
        # decayed, not the last round's: a lookup round's drafts cost ~0, a head's not
        self.draft_seconds = decayed(self.draft_seconds, event.draft_seconds / len(event.drafted))


def evidence(event: RoundEvent) -> tuple[float, float]:
    """What a drafted round says of acceptance: (drafts kept, drafts refused), a correction being the one refusal."""
    return float(event.accepted), 1.0 if event.correction is not None else 0.0


def decayed(average: float | None, value: float) -> float:
    """A running estimate after one more value: older values keep ACCEPT_MEMORY of their weight; the first value
    (no estimate yet: None or 0) stands alone."""
    return value if not average else ACCEPT_MEMORY * average + (1 - ACCEPT_MEMORY) * value


class BatchCosts:
    """What a packed forward costs here, in two measured parts:

        predict(S, R) = P(R) + O(S)      S sequences, R rows in all

    P(R), the forward of ONE sequence's R rows (its products, mostly), on a dense grid of row counts; O(S), what S
    sequences of one row each cost beyond P(S) (attention over S caches, and the per-sequence work of the packed
    call), on a grid of sequence counts. Each is interpolated linearly between its measured points.

    Why rows in all, densely: a packed forward's time is nearly a function of its rows in all (32 rows: 70-80 ms
    whether 2 x 16 or 32 x 1 on the 2-core EPYC), and that function has steps where the kernels' row tiles end. There
    one sequence's forward took 20-23 ms for 1-8 rows, 28-36 ms for 9-16 and 51-58 ms from 17; 8 sequences' took
    28 ms at 8 rows, 33 at 9 and 57 at 17. The table this replaced was timed at 1, 2, 4, 8 and 16 rows per sequence
    and interpolated between them: it put 4 sequences' 11 rows at 27 ms (measured 33) and 8 sequences' 17 at 43
    (measured 57), and the adaptive length drafted into those steps (docs/benchmarks.md, batch section).

    `observe` corrects the prediction by what the batch's own forwards took: measured once, the points hold the
    host's state of that moment (a one-row forward ran at ~14 ms or ~18-19 ms, switching within a process), and O(S)
    was timed after `context` cached tokens, not the batch's own. An observed forward moves the level of the nearest
    sequence count a step (COST_MEMORY) toward making its prediction what it took, and leaves P's shape, its steps,
    alone. (Correcting P's point at the observed rows instead, a batch of 8 that mostly ran 8-row forwards raised P(8)
    above the never-observed P(9), and the sizing then read a ninth row as free: the adaptive length drafted at batch
    8 and gave x0.90 of plain batching.)"""

    def __init__(self, rows: Sequence[int], row_seconds: Sequence[float], sequences: Sequence[int] = (1,),
                 sequence_seconds: Sequence[float] | None = None, corrected: bool = False):
        assert len(rows) == len(row_seconds) >= 1 and list(rows) == sorted(set(rows)) and rows[0] >= 1, rows
        self.rows, self.row_seconds = list(rows), [float(s) for s in row_seconds]
        self.corrected = corrected      # measured here: `observe` corrects it (a table given by hand stays as given)
        self.sequences = list(sequences)
        assert self.sequences == sorted(set(self.sequences)) and self.sequences[0] >= 1, sequences
        # O(S): sequence_seconds minus P(S), never below 0 (more sequences for the same rows cost no less); none: 0
        assert sequence_seconds is None or len(sequence_seconds) == len(self.sequences)
        self.overhead = [0.0] * len(self.sequences) if sequence_seconds is None else \
            [max(0.0, float(t) - self.row_at(s)) for s, t in zip(self.sequences, sequence_seconds)]
        self.shift = [0.0] * len(self.sequences)                # observed - predicted, by sequence point (decayed)
        # What a drafter's begin took here, a prompt row, by drafter name, over every batch's sequences sharing these
        # costs (decayed): a sequence that has not caught up yet is priced by it (its begin was otherwise free to the
        # sizing, and the tail of a batch of 16 began drafters at ~5 ms each for a round or two of drafts).
        self.begins: dict[str, float] = {}

    @classmethod
    def measure(cls, model, sequences: Sequence[int] = (1, 2, 4, 8, 16, 32),
                rows: Sequence[int] = tuple(range(1, 34)) + (40, 48, 64, 96, 128, 192, 256), context: int = 64,
                repeats: int = 2) -> "BatchCosts":
        """Time one sequence's forward of R rows for every R in `rows`, and S sequences' of one row each for every S
        in `sequences`, after `context` cached tokens each (median of `repeats`, after one warm-up), the points
        interleaved so a passing slowdown touches all of them alike."""
        vocab = model.get_output_embeddings().weight.shape[0]
        generator = torch.Generator().manual_seed(0)
        caches = []
        for _ in range(max(sequences)):
            cache = new_cache(model)
            forward_packed(model, [Segment(torch.randint(0, vocab, (context,), generator=generator).tolist(),
                                           cache, 1)])
            caches.append(cache)
        ids = torch.randint(0, vocab, (max(rows),), generator=generator).tolist()
        points = [(1, r) for r in rows] + [(s, s) for s in sequences]
        times: dict = {point: [] for point in points}
        for attempt in range(repeats + 1):
            for s, r in points:
                segments = [Segment(ids[:r // s], cache, r // s) for cache in caches[:s]]
                start = timing.clock(model.device)
                forward_packed(model, segments)
                seconds = timing.clock(model.device) - start
                for cache in caches[:s]:
                    cache.crop(context - cache_len(cache))
                if attempt:
                    times[s, r].append(seconds)
        median = {point: statistics.median(seconds) for point, seconds in times.items()}
        return cls(rows, [median[1, r] for r in rows], sequences, [median[s, s] for s in sequences], corrected=True)

    def row_at(self, rows: float) -> float:
        """P(rows): one sequence's forward of `rows` rows, as measured."""
        i, w = bracket(self.rows, rows)
        at = self.row_seconds
        return at[i] + w * (at[i + 1] - at[i]) if len(at) > 1 else at[0]

    def predict(self, sequences: int, total_rows: int) -> float:
        """Seconds of a packed forward over `sequences` sequences with `total_rows` rows in all."""
        assert sequences >= 1 and total_rows >= sequences, (sequences, total_rows)
        i, w = bracket(self.sequences, sequences)
        level = self.overhead[i] + self.shift[i]
        if len(self.sequences) > 1:
            level += w * (self.overhead[i + 1] + self.shift[i + 1] - level)
        rows = max(0.0, self.row_at(total_rows))
        return max(0.1 * rows, rows + level)        # a level shifted below 0 (a faster host) never zeroes a forward

    def summary(self) -> str:
        """The measured points in ms, for logs and benchmark headers."""
        rows = " ".join(f"{r}:{1000 * t:.1f}" for r, t in zip(self.rows, self.row_seconds))
        overhead = " ".join(f"{s}:{1000 * t:.1f}" for s, t in zip(self.sequences, self.overhead))
        return f"one sequence's forward by rows P(R) {rows}; beyond it by sequences O(S) {overhead}"

    def begin_row(self, name: str) -> float:
        """Seconds a prompt row that the begins of drafters called `name` took here; 0 where none has been timed."""
        return self.begins.get(name, 0.0)

    def learn_begin(self, name: str, seconds_per_row: float) -> None:
        """A catch-up with a begin of a drafter called `name` took `seconds_per_row` a row."""
        if math.isfinite(seconds_per_row) and seconds_per_row > 0:
            self.begins[name] = decayed(self.begins.get(name), seconds_per_row)

    def observe(self, sequences: int, total_rows: int, seconds: float) -> None:
        """A packed forward over `sequences` sequences and `total_rows` rows took `seconds`: the level of the nearest
        sequence count moves a step (COST_MEMORY) toward making its prediction that."""
        if not self.corrected or not math.isfinite(seconds) or not seconds > 0 or sequences < 1 \
                or total_rows < sequences:
            return
        i = nearest(self.sequences, sequences)
        self.shift[i] += (1 - COST_MEMORY) * (seconds - self.predict(sequences, total_rows))


def nearest(points: list[int], x: float) -> int:
    """The index of the point of `points` (ascending) nearest x."""
    return min(range(len(points)), key=lambda i: abs(points[i] - x))


def bracket(points: list[int], x: float) -> tuple[int, float]:
    """(i, w): x lies w of the way from points[i] to points[i + 1] (w beyond [0, 1] extrapolates past the ends)."""
    if len(points) == 1:
        return 0, 0.0
    i = min(max(bisect.bisect_left(points, x) - 1, 0), len(points) - 2)
    return i, (x - points[i]) / (points[i + 1] - points[i])


def kept(a: float, m: int) -> float:
    """Drafts kept, expected, of m drafts at acceptance a (the geometric model): a + a^2 + ... + a^m."""
    return (a - a ** (m + 1)) / (1 - a) if a < 1 else float(m)


def draft_caps(acceptance: Sequence[float], draft_seconds: Sequence[float], limits: Sequence[int],
               forward_seconds: Callable[[int], float], fixed_seconds: Sequence[float] | None = None,
               other_tokens: float = 0.0, margin: float = DRAFT_MARGIN) -> list[int]:
    """How many drafts each of the batch's sequences may propose this round, for the most expected tokens per
    second of the whole batch. Sequence i with acceptance a_i yields sum_{j <= m} a_i^j tokens from m drafts (the
    geometric model E = (1 - a^(m+1)) / (1 - a)), each draft costs it draft_seconds[i] and one verify row, and
    drafting at all costs it fixed_seconds[i] a round (its drafter's catch-up, the heavier verification);
    forward_seconds(R) is the packed forward over R rows of these sequences (and of the others it scores, whose
    caps are not sized here and whose tokens, expected, are `other_tokens`: the rate is the whole forward's).

    The plans scored, the best winning: drafts added in greedy order (the best marginal tokens per marginal second
    first), at every length of that order, not only while each draft raises the rate; and every sequence at the
    same cap c (its limit at most), for every c. The best is taken only if it promises `margin` times all plain's
    rate (every cap 0); else all plain. The margin is for the estimates' error, which leans toward drafting: the
    drafts go to the sequences whose acceptance estimate is high that round, so the plan picked is the one most
    over-estimated (measured at 8 sequences: acceptance estimated 0.73-0.77 where 0.59-0.68 came, plans promising
    1-3% over plain and giving x0.80). Why not stop at the first draft that lowers
    the rate: a forward's time has steps where the kernels' row tiles end (BatchCosts), so the draft that crosses one
    costs a step and the next seven cost little. At 4 sequences of acceptance 0.8 with the forward 1.0 up to 8 rows,
    1.3 up to 16 and 3.0 beyond, stopping there gives each sequence 1 draft (7.2 tokens a unit of time); 3 each give
    9.1."""
    n = len(acceptance)
    base_rows = n
    fixed = list(fixed_seconds) if fixed_seconds is not None else [0.0] * n

    def rate(caps: list[int]) -> float:
        tokens = other_tokens + sum(1 + kept(a, m) for a, m in zip(acceptance, caps))
        seconds = forward_seconds(base_rows + sum(caps)) + sum(d * m + (f if m else 0.0)
                                                               for d, m, f in zip(draft_seconds, caps, fixed))
        return tokens / seconds

    caps = [0] * n
    tokens, rows, spent = n + other_tokens, base_rows, 0.0
    plain_rate = tokens / forward_seconds(rows)
    best, best_rate = list(caps), plain_rate
    row_seconds = forward_seconds(n) / n                     # what one more row costs, roughly, at this batch

    def value(i: int, j: int) -> tuple[float, float, int]:   # (-gain per second, -gain, i) of sequence i's j-th draft
        gain = acceptance[i] ** j
        return -gain / (row_seconds + draft_seconds[i] + (fixed[i] if j == 1 else 0.0)), -gain, i

    heap = [value(i, 1) for i in range(n) if limits[i] > 0]
    heapq.heapify(heap)
    # every draft not yet added, all kept: what no longer prefix can exceed (a forward costs no less with more rows)
    unclaimed = sum(kept(a, m) for a, m in zip(acceptance, limits))
    while heap:
        _, gain, i = heapq.heappop(heap)
        spent += draft_seconds[i] + (fixed[i] if caps[i] == 0 else 0.0)
        caps[i], tokens, rows, unclaimed = caps[i] + 1, tokens - gain, rows + 1, unclaimed + gain
        seconds = forward_seconds(rows) + spent
        if (current := tokens / seconds) > best_rate:
            best, best_rate = list(caps), current
        elif (tokens + unclaimed) / seconds <= best_rate:
            break
        if caps[i] < limits[i]:
            heapq.heappush(heap, value(i, caps[i] + 1))
    plans = [best] + [[min(c, limit) for limit in limits] for c in range(1, max(limits, default=0) + 1)]
    chosen = max(plans, key=rate)                            # the first best
    return chosen if rate(chosen) > margin * plain_rate else [0] * n


class BatchDecoder:
    """Decode many requests together on one target model (module docstring). `draft_length`: "adaptive" (the batch
    sizes each sequence's drafts by `draft_caps` under `costs`, measured on first use when not given), "fixed" (each
    sequence drafts as it would alone, up to its k) or "off" (plain batched decoding: no drafts).

        batch = BatchDecoder(target)
        for item in batch.stream([Request("a", ids_a, make_drafter("eagle", target)), ...]):
            item.request_id, item.event        # add() more between rounds: they join the next one
    """

    def __init__(self, target_model, draft_length: str = "adaptive", costs: BatchCosts | None = None,
                 max_batch: int = 64):
        if draft_length not in DRAFT_LENGTHS:
            raise ValueError(f"draft_length must be one of {DRAFT_LENGTHS}, got {draft_length!r}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        self.target = target_model
        self.device = target_model.device           # looked up once (SpeculativeDecoder.__init__ says why)
        self.draft_length = draft_length
        self.costs = costs
        self.max_batch = max_batch
        self.members: dict[object, Member] = {}
        self.finished: dict[object, GenerationResult] = {}
        self.kept = self.refused = 0.0              # every sequence's drafts kept and refused so far (prior)

    @property
    def prior(self) -> tuple[float, float]:
        """What a sequence's acceptance estimate ages toward in rounds it does not draft (Member.learn): the
        acceptance this batch's drafts have had so far, all sequences together, as counts of ACCEPT_PRIOR's weight
        (ACCEPT_PRIOR itself before any draft). ACCEPT_PRIOR's 0.75 is a guess for a sequence nobody has seen
        draft; once the batch's drafts say otherwise (at 8 sequences, 0.59-0.68 came where 0.73-0.77 was estimated),
        aging toward the guess would offer drafts again on an estimate the batch's own drafts contradict."""
        weight = sum(ACCEPT_PRIOR)
        a = (self.kept + ACCEPT_PRIOR[0]) / (self.kept + self.refused + weight)
        return a * weight, (1 - a) * weight

    @property
    def active(self) -> int:
        return len(self.members)

    def add(self, request: Request) -> None:
        """Admit a request: validated now (ValueError names the request), prefilled inside the next rounds."""
        if request.id in self.members:
            raise ValueError(f"request id {request.id!r} is already decoding")
        if len(self.members) >= self.max_batch:
            raise ValueError(f"the batch is full ({self.max_batch} sequences): request {request.id!r} must wait")
        try:
            # Plain batched decoding never drafts: its sequences skip their drafters' bookkeeping too (an EAGLE head
            # would run a catch-up step per sequence per round to stay ready for drafts that never come).
            drafter = Idle(request.drafter.name) if self.draft_length == "off" else Deferred(request.drafter)
            decoder = SpeculativeDecoder(self.target, drafter, request.rule)
            sampling = request.sampling or SamplingParams()
            committed = validate_request(self.target, request.input_ids, request.k, request.max_new_tokens, sampling)
        except ValueError as error:
            raise ValueError(f"request {request.id!r}: {error}") from None
        device = self.device
        state = DecodeState(committed, len(committed), new_cache(self.target), make_generator(device, request.seed),
                            eos_set(request.eos_token_id), request.k, request.max_new_tokens, sampling,
                            prefill_seconds=0.0, display=request.display, seed=request.seed)
        member = Member(request, decoder, state, started=timing.clock(device))
        if not member.prefilling:                       # a one-token prompt: nothing to feed before its first round
            decoder.drafter.begin(committed, None)
        self.members[request.id] = member

    def cancel(self, request_id) -> None:
        """Stop a request between rounds; its result says "cancelled"."""
        member = self.members.pop(request_id, None)
        if member is not None:
            member.state.stop_reason = "cancelled"
            self.finished[request_id] = self.result(member)

    def step(self) -> list[BatchEvent]:
        """One round for every active sequence: prompt chunks of those still prefilling and the drafted rows of the
        rest, in one packed forward; then each decoding sequence verifies, commits and trims."""
        if not self.members:
            return []
        device = self.device
        decoding = [m for m in self.members.values() if not m.prefilling]
        caps = self.caps(decoding)
        self.catch_up([m for m, cap in zip(decoding, caps)
                       if cap and isinstance(m.decoder.drafter, Deferred) and m.decoder.drafter.held])
        sized = self.draft_length == "adaptive" and len(decoding) > 1
        planned = []
        for member, cap in zip(decoding, caps):
            # a sequence whose drafts the batch sizes drafts chains, which its model prices (drafting_chains)
            with drafting_chains() if sized and not self.pinned(member) else contextlib.nullcontext():
                planned.append(member.decoder.plan(member.state, cap))
        feature_layers = self.feature_layers()
        budget = PREFILL_ROWS_PER_ROUND
        for member in [m for m in self.members.values() if m.prefilling]:
            if budget <= 0:
                break
            # The prompt in the chunks a lone run feeds (cache.prefill), through the lone forward: its cache is then
            # the lone run's bit for bit, on every path, whatever else is in the batch.
            ids = member.state.committed[member.fed:member.fed + min(PREFILL_CHUNK, member.state.prompt_len - 1
                                                                      - member.fed)]
            chunk_start = timing.clock(device)
            out = one_forward(self.target, Segment(ids, member.state.target_cache, 1), feature_layers)
            self.prefilled(member, ids, out, timing.clock(device) - chunk_start)
            budget -= len(ids)
        segments = [p.segment for p in planned]
        forward_start = timing.clock(device)
        scored = forward_packed(self.target, segments, feature_layers) if segments else []
        rows = sum(len(segment.tokens) for segment in segments)
        if segments and self.costs is not None and self.draft_length == "adaptive":
            # Only a batch the costs size corrects them: a fixed batch's forwards are not what the sizing prices (in
            # bench_batch, the fixed tree arm's 8 sequences of 13-node trees moved the level at 8 sequences by -24 ms,
            # and the adaptive arm run next priced 8 rows at 2 ms).
            self.costs.observe(len(segments), rows, timing.clock(device) - forward_start)
        events = []
        prior = self.prior          # as the round began: a sequence's aging does not depend on its place in the batch
        for member, cap, plan, out in zip(decoding, caps, planned, scored):
            own = self.own_output(member, out, feature_layers)
            if isinstance(member.decoder.drafter, Deferred):    # its catch-up waits for the next round it drafts
                member.decoder.drafter.hold = cap == 0 or not self.pinned(member)
            settle_start = timing.clock(device)
            event = member.decoder.settle(member.state, plan, own, report=False)
            check_invariant(member.state.target_cache, len(member.state.committed) - 1,
                            f"request {member.request.id!r}")
            member.learn(event, timing.clock(device) - settle_start + plan.drafted - plan.start, prior)
            if event.drafted:
                kept, refused = evidence(event)
                self.kept, self.refused = self.kept + kept, self.refused + refused
            member.rounds.append(event)
            events.append(BatchEvent(member.request.id, event, len(segments), rows, cap))
            if member.state.stop_reason is not None:
                del self.members[member.request.id]
                self.finished[member.request.id] = self.result(member)
        return events

    def catch_up(self, members: list[Member]) -> None:
        """The drafters of `members`, about to draft, catch up on the rows that waited (their first time: the
        drafter's begin over the whole prompt). A pinned sequence alone, as its lone run feeds its drafter (its
        seed's text depends on its drafts, bit for bit); the others together (drafting.catching_up_together: one
        EAGLE head forward for all of them).

        It is the price of drafting again, paid by the rows that waited, so it is timed apart, per row, and weighed
        when the sequence would draft (`caps`, `Member.resume_seconds`): inside the drafts' time it read as 6-8 ms
        a drafted token for an EAGLE chain at batch 4 (1-2 ms is what a draft costs), and the sizing, which learns
        that price only from rounds that draft, never drafted again."""
        device = self.device
        together = [m for m in members if not self.pinned(m)]
        for group in [[m] for m in members if self.pinned(m)] + ([together] if together else []):
            rows, start = sum(m.decoder.drafter.pending_rows for m in group), timing.clock(device)
            beginning = {m.decoder.drafter.name for m in group if m.decoder.drafter.prompt_rows}
            with catching_up_together() if group is together else contextlib.nullcontext():
                for member in group:
                    member.decoder.drafter.catch_up(member.state.committed)
            seconds = timing.clock(device) - start
            for member in group:
                member.learn_resume(seconds, rows)
            if rows and self.costs is not None:
                for name in beginning:
                    self.costs.learn_begin(name, seconds / rows)

    def caps(self, decoding: list[Member]) -> list[int]:
        """Each decoding sequence's draft cap this round (its k at most)."""
        limits = [min(m.state.k, m.state.max_new_tokens - m.state.generated - 1) for m in decoding]
        if self.draft_length == "off":
            return [0] * len(decoding)
        if self.draft_length == "fixed" or len(decoding) <= 1:
            # A batch of one is a lone run (its forward is the lone forward): the drafter's own sizing, by the lone
            # verify-cost curve, already sizes its drafts; capping them by the batch model only cut good drafts
            # (measured at batch 1: x1.93 of plain where the uncapped default tree gave x2.08).
            return limits
        if self.costs is None:
            self.costs = BatchCosts.measure(self.target)
        count = len(decoding)
        # A sampled sequence under a rule whose draws depend on its draft lengths ("exact" draws per drafted token)
        # drafts as it would alone: its seed then fixes its text in any batch (its drafter's own sizing decides, as
        # alone). Greedy text and the "invariant" rule's do not depend on the draft lengths: the batch sizes those.
        free = [i for i, m in enumerate(decoding) if not self.pinned(m)]
        pinned = [i for i, m in enumerate(decoding) if self.pinned(m)]
        pinned_rows = sum(limits[i] + 1 for i in pinned)                             # their rows, drafts and all
        # Sequences still prefilling decode from the next round or so: their rows are priced in now, for the drafts
        # sized here begin drafters for the batch as it will run. Left out, a batch of 16 whose first 6 had their
        # prompts in drafted (and began 6 drafters) into a forward that was nearly free only until the rest joined.
        joining = len(self.members) - count
        others = joining + sum(1 + kept(decoding[i].acceptance, limits[i]) for i in pinned)
        caps = list(limits)
        if free:
            sized = draft_caps([decoding[i].acceptance for i in free], [decoding[i].draft_seconds for i in free],
                               [limits[i] for i in free],
                               lambda rows: self.costs.predict(count + joining, rows + pinned_rows + joining),
                               [decoding[i].drafting_extra + decoding[i].resume_seconds(
                                   self.costs.begin_row(decoding[i].decoder.drafter.name)) for i in free], others)
            for i, cap in zip(free, sized):
                caps[i] = cap
        return caps

    @staticmethod
    def pinned(member: Member) -> bool:
        """Whether a sequence keeps its lone draft lengths in a batch: sampled, under a rule other than "invariant"
        (whose text depends on how many drafts each round had)."""
        return not member.state.sampling.greedy and member.request.rule != "invariant"

    def feature_layers(self) -> tuple[int, ...]:
        """Every hidden-state layer any member's drafter reads (each gets its own back, `own_output`)."""
        wanted = []
        for member in self.members.values():
            wanted += [i for i in member.decoder.drafter.feature_layers if i not in wanted]
        return tuple(wanted)

    @staticmethod
    def own_output(member: Member, out, feature_layers: tuple[int, ...]):
        """A segment's packed output as its own drafter's forward would give it: logits, and (logits, features of
        its drafter's layers) when it reads any."""
        logits, features = out if feature_layers else (out, None)
        own = member.decoder.drafter.feature_layers
        if not own:
            return logits
        width = features.shape[-1] // len(feature_layers)
        parts = [features[:, feature_layers.index(i) * width:(feature_layers.index(i) + 1) * width] for i in own]
        return logits, torch.cat(parts, dim=-1)

    def prefilled(self, member: Member, ids: list[int], out, forward_seconds: float) -> None:
        """A prompt chunk went through; once the whole prompt has, the drafter begins."""
        member.fed += len(ids)
        features = self.own_output(member, out, self.feature_layers())
        if member.decoder.drafter.feature_layers:
            member.features.append(features[1])
        member.state.prefill_seconds += forward_seconds
        if not member.prefilling:
            check_invariant(member.state.target_cache, len(member.state.committed) - 1,
                            f"request {member.request.id!r}")
            features = torch.cat(member.features) if member.features else None
            member.decoder.drafter.begin(member.state.committed, features)
            member.features = []

    def result(self, member: Member) -> GenerationResult:
        total = timing.clock(self.device) - member.started
        rounds = member.rounds
        return GenerationResult(tokens=[t for r in rounds for t in r.emitted], rounds=rounds,
                                prompt_len=member.state.prompt_len, prefill_seconds=member.state.prefill_seconds,
                                total_seconds=total, stop_reason=member.state.stop_reason or "cancelled",
                                stats=run_stats(rounds, total))

    def stream(self, requests: Sequence[Request] = ()) -> Iterator[BatchEvent]:
        """Add `requests`, then yield every round's events until no request is left (add() more meanwhile)."""
        for request in requests:
            self.add(request)
        while self.members:
            yield from self.step()

    def run(self, requests: Sequence[Request]) -> dict:
        """Decode `requests` together; {request id: GenerationResult}."""
        for _ in self.stream(requests):
            pass
        return {request.id: self.finished.pop(request.id) for request in requests}
