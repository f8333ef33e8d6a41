"""The exactness lab: is speculative sampling really lossless? Count and compare.

Three pieces, all free of any UI:
  exact_distribution   P(first `depth` tokens) under plain target sampling, enumerated from the model: every
                       prefix with positive probability is fed once (batched), and the warped next-token
                       distributions (`sampling.warp`, the code the engine samples with) are multiplied along.
  draws                N short continuations of the same prompt with plain decoding (`autoregressive_generate`)
                       or with `SpeculativeDecoder` under a verification rule, seeds seed..seed + N - 1.
  tests                total-variation distance and a chi-square goodness-of-fit test against the exact
                       distribution.

A speculative draw runs whole rounds of k drafts (max_new_tokens = depth + k, so every round drafts k, as in a
real run) until at least `depth` tokens are emitted, and keeps the first `depth`. EOS is not a stop here: the
enumeration does not stop at it either. With the exact rule the draws follow the exact distribution, so the
chi-square p-value is uniform on [0, 1]; with a wrong rule ("topp_membership", "no_residual") it drifts, and
the p-value collapses as N grows. With a tree drafter (drafters/tree.py) the rounds are draft trees, judged by
every rule that judges trees (core/tree_rule.py): exact, strict, typical, and the tree's own mistake
("tree_best_sibling": every sibling judged against p itself, no residual between them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from spec_engine.core import timing
from spec_engine.core.decoder import SpeculativeDecoder, autoregressive_generate, validate_request
from spec_engine.drafters import Drafter
from spec_engine.core.sampling import SamplingParams, warp
from spec_engine.core.tree_rule import TREE_RULES, WRONG_TREE
from spec_engine.core.verify import RULES

PLAIN = "plain"
SAMPLERS = (PLAIN,) + RULES                             # with a chain drafter
TREE_SAMPLERS = (PLAIN,) + TREE_RULES                 # with a tree drafter: plain, then every rule that judges trees
MAX_DEPTH = 3
MAX_FORWARD_SEQUENCES = 4096      # prefixes fed to the model per level of the enumeration
MAX_OUTCOMES = 1_000_000          # sequences with positive probability kept in the exact distribution
BATCH = 256
MIN_EXPECTED = 5.0                # chi-square cells expected below this are pooled (the usual rule of thumb)

Sequence = tuple[int, ...]


# ------------------------------------------------------------------------------------------- exact side

@torch.inference_mode()
def next_token_probs(model, prefix_ids: list[int], continuations: list[Sequence],
                     sampling: SamplingParams) -> torch.Tensor:
    """Warped next-token distributions after prefix + each continuation (all of one length): [B, vocab] float64.

    Warped in the model's dtype, exactly as the engine warps, then renormalised in float64 (the engine's sampler
    draws in proportion to those probabilities)."""
    rows = []
    for start in range(0, len(continuations), BATCH):
        chunk = continuations[start:start + BATCH]
        rows_ids = [prefix_ids + list(c) for c in chunk]
        ids = torch.tensor(rows_ids, dtype=torch.long, device=model.device)                             # [b, T + len]
        logits = model(input_ids=ids, logits_to_keep=1).logits[:, -1]                                   # [b, vocab]
        probs = warp(logits, sampling).to(torch.float64)
        rows.append(probs / probs.sum(dim=-1, keepdim=True))
    return torch.cat(rows)


def exact_distribution(target_model, prefix_ids: list[int], depth: int, sampling: SamplingParams,
                       max_forward: int = MAX_FORWARD_SEQUENCES) -> dict[Sequence, float]:
    """{first `depth` tokens: probability} under plain sampling from `target_model` after `prefix_ids`.

    Only sequences of positive probability are listed (top-k / top-p make most of them zero). ValueError when
    the enumeration would feed more than `max_forward` prefixes at one level: lower the depth or set top-k."""
    check_depth(depth)
    if not prefix_ids:
        raise ValueError("the prompt is empty: give at least one token")
    frontier: dict[Sequence, float] = {(): 1.0}
    for level in range(depth):
        if len(frontier) > max_forward:
            raise ValueError(f"exact enumeration of {depth} tokens would feed {len(frontier)} prefixes of length "
                             f"{level} (limit {max_forward}): lower the depth, or set top-k / top-p")
        continuations = list(frontier)
        probs = next_token_probs(target_model, list(prefix_ids), continuations, sampling)   # [B, vocab]
        rows, tokens = (probs > 0).nonzero(as_tuple=True)
        if rows.numel() > MAX_OUTCOMES:
            raise ValueError(f"exact enumeration of {depth} tokens has {rows.numel()} outcomes (limit "
                             f"{MAX_OUTCOMES}): lower the depth, or set top-k / top-p")
        weights = torch.tensor([frontier[c] for c in continuations], dtype=torch.float64, device=probs.device)
        joint = weights[rows] * probs[rows, tokens]                                          # [outcomes]
        frontier = {continuations[r] + (t,): p for r, t, p in zip(rows.tolist(), tokens.tolist(), joint.tolist())}
    return frontier


def marginal(dist: dict[Sequence, float], length: int) -> dict[Sequence, float]:
    """The distribution of the first `length` tokens (sums the rest out)."""
    out: dict[Sequence, float] = {}
    for seq, prob in dist.items():
        out[seq[:length]] = out.get(seq[:length], 0.0) + prob
    return out


def check_depth(depth) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_DEPTH:
        raise ValueError(f"depth (tokens per continuation) must be an integer in [1, {MAX_DEPTH}], got {depth!r}")


# ----------------------------------------------------------------------------------------------- draws

def plain_prefix(target_model, input_ids: torch.Tensor, depth: int, sampling: SamplingParams, seed: int) -> Sequence:
    """The first `depth` tokens of plain decoding."""
    return tuple(autoregressive_generate(target_model, input_ids, max_new_tokens=depth, sampling=sampling,
                                         seed=seed).tokens)


def speculative_prefix(decoder: SpeculativeDecoder, input_ids: torch.Tensor, depth: int, k: int,
                       sampling: SamplingParams, seed: int) -> tuple[Sequence, int, int]:
    """(first `depth` tokens, drafted, accepted) of whole speculative rounds of k drafts (a tree round's drafts
    counted by its depth, as RoundEvent.draft_length does)."""
    state = decoder.start(input_ids, k=k, max_new_tokens=depth + k, sampling=sampling, seed=seed)
    drafted = accepted = 0
    while state.generated < depth:
        event = decoder.step(state)
        drafted += event.draft_length
        accepted += event.accepted
    return tuple(state.committed[state.prompt_len:state.prompt_len + depth]), drafted, accepted


@dataclass
class SamplerDraws:
    """What one sampler produced so far: counts of the first `depth` tokens, and the rounds' acceptance."""

    sampler: str                          # "plain" or a verification rule
    counts: dict[Sequence, int] = field(default_factory=dict)
    n: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0

    def add(self, seq: Sequence, drafted: int = 0, accepted: int = 0) -> None:
        self.counts[seq] = self.counts.get(seq, 0) + 1
        self.n += 1
        self.drafted += drafted
        self.accepted += accepted

    @property
    def acceptance(self) -> float | None:
        """accepted / drafted over all rounds of the draws (None for plain decoding)."""
        return self.accepted / self.drafted if self.drafted else None


def draw(target_model, make_drafter: Callable[[], Drafter] | None, input_ids: torch.Tensor, depth: int, k: int,
         sampling: SamplingParams, n: int, sampler: str, seed: int = 0,
         should_stop: Callable[[], bool] | None = None) -> Iterator[SamplerDraws]:
    """N draws with one sampler; yields the growing `SamplerDraws` after every draw (the same object).

    `make_drafter` builds the drafter once; a drafter's `begin` resets it for each draw."""
    if sampler not in SAMPLERS + WRONG_TREE:
        raise ValueError(f"sampler must be one of {SAMPLERS + WRONG_TREE}, got {sampler!r}")
    check_depth(depth)
    validate_request(target_model, input_ids, k, depth + k, sampling)
    if sampling.greedy:
        raise ValueError("the lab compares distributions: greedy decoding has none, set temperature > 0")
    decoder = None if sampler == PLAIN else SpeculativeDecoder(target_model, make_drafter(), rule=sampler)
    out, device = SamplerDraws(sampler), target_model.device
    for i in range(n):
        if should_stop is not None and should_stop():
            return
        start = timing.clock(device)
        if decoder is None:
            out.add(plain_prefix(target_model, input_ids, depth, sampling, seed + i))
        else:
            out.add(*speculative_prefix(decoder, input_ids, depth, k, sampling, seed + i))
        out.seconds += timing.clock(device) - start
        yield out


def identical_draws(draws: list[SamplerDraws]) -> list[list[str]]:
    """Groups (two or more) of samplers whose draws came out the same: the same number of draws, the same count of
    every outcome and the same acceptance. Different rules can choose alike on a small model (on the toy pair at
    top-p 0.8 typical acceptance and top-p membership do), and then every figure of theirs coincides."""
    groups: dict[tuple, list[str]] = {}
    for d in draws:
        if d.n:
            key = (d.n, tuple(sorted(d.counts.items())), d.drafted, d.accepted)
            groups.setdefault(key, []).append(d.sampler)
    return [names for names in groups.values() if len(names) > 1]


# ----------------------------------------------------------------------------------------------- tests

def frequencies(counts: dict[Sequence, int]) -> dict[Sequence, float]:
    total = sum(counts.values())
    return {seq: c / total for seq, c in counts.items()} if total else {}


def total_variation(a: dict, b: dict) -> float:
    """Half the L1 distance between two distributions given as {outcome: probability}; in [0, 1]."""
    return 0.5 * sum(abs(a.get(x, 0.0) - b.get(x, 0.0)) for x in set(a) | set(b))


@dataclass(frozen=True)
class ChiSquare:
    statistic: float
    dof: int
    pvalue: float
    bins: int                   # cells after pooling
    impossible: int = 0         # draws of a sequence the target gives probability 0 (p-value 0)


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof): the regularised upper incomplete gamma Q(dof/2, statistic/2)."""
    if dof <= 0:
        return 1.0
    if math.isinf(statistic):
        return 0.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


def pooled_cells(counts: dict[Sequence, int], exact: dict[Sequence, float], n: int,
                 min_expected: float = MIN_EXPECTED) -> list[tuple[float, int]]:
    """(expected, observed) cells: every outcome expected at least `min_expected` times is its own cell; the
    rarer ones are pooled into one cell, which takes the next-rarest outcomes too until it reaches
    `min_expected` (or nothing is left)."""
    cells = sorted(((n * p, counts.get(seq, 0)) for seq, p in exact.items() if p > 0), key=lambda c: c[0])
    pool_expected, pool_observed, i = 0.0, 0, 0
    while i < len(cells) and (cells[i][0] < min_expected or 0 < pool_expected < min_expected):
        pool_expected += cells[i][0]
        pool_observed += cells[i][1]
        i += 1
    return cells[i:] + ([(pool_expected, pool_observed)] if i else [])


def chi_square(counts: dict[Sequence, int], exact: dict[Sequence, float],
               min_expected: float = MIN_EXPECTED) -> ChiSquare:
    """Pearson's goodness-of-fit of the draws `counts` to `exact`, cells pooled as in `pooled_cells`.

    A draw the target could never produce makes the statistic infinite and the p-value 0."""
    n = sum(counts.values())
    impossible = sum(c for seq, c in counts.items() if exact.get(seq, 0.0) <= 0)
    cells = pooled_cells(counts, exact, n, min_expected)
    dof = max(len(cells) - 1, 0)
    if impossible:
        return ChiSquare(math.inf, dof, 0.0, len(cells), impossible)
    statistic = sum((observed - expected) ** 2 / expected for expected, observed in cells if expected > 0)
    return ChiSquare(statistic, dof, chi2_sf(statistic, dof), len(cells))


@dataclass(frozen=True)
class SamplerReport:
    sampler: str
    n: int
    tv: float                   # total variation, first `depth` tokens, empirical vs exact
    tv_next: float              # the same for the next token only
    chi: ChiSquare              # on the first `depth` tokens
    acceptance: float | None
    seconds: float


def report(exact: dict[Sequence, float], draws: SamplerDraws) -> SamplerReport:
    empirical = frequencies(draws.counts)
    return SamplerReport(draws.sampler, draws.n, total_variation(empirical, exact),
                         total_variation(marginal(empirical, 1), marginal(exact, 1)),
                         chi_square(draws.counts, exact), draws.acceptance, draws.seconds)


@dataclass(frozen=True)
class Histogram:
    """Bars for one figure: the most likely outcomes (of `length` tokens) under the exact distribution."""

    outcomes: list[Sequence]            # most likely first; the last is () for "every other outcome" if any
    exact: list[float]
    empirical: dict[str, list[float]]   # sampler -> frequency of each outcome


def histogram(exact: dict[Sequence, float], draws: list[SamplerDraws], length: int, top: int = 12) -> Histogram:
    exact_m = marginal(exact, length)
    shown = sorted(exact_m, key=lambda s: (-exact_m[s], s))[:top]
    empirical = {d.sampler: marginal(frequencies(d.counts), length) for d in draws}
    exact_row = [exact_m[s] for s in shown]
    rows = {name: [freq.get(s, 0.0) for s in shown] for name, freq in empirical.items()}
    if len(exact_m) > len(shown):
        shown = shown + [()]
        exact_row.append(max(0.0, 1.0 - sum(exact_row)))
        for name, freq in empirical.items():
            rows[name].append(max(0.0, sum(freq.values()) - sum(rows[name])))
    return Histogram(shown, exact_row, rows)
