"""Sampling settings and the warping that turns logits into the distribution we sample from.

The same `warp` is used by plain decoding, by every drafter and by the verifier, so "the target's
distribution" means one thing everywhere: temperature, then top-k, then top-p (the order Hugging Face's
`generate` applies them in). Randomness always comes from an explicit `torch.Generator`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from spec_engine.core import speed

MAX_TOP_K = 1_000_000


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0 means off; top_p 1.0 means off."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be an integer in [0, {MAX_TOP_K}] (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not math.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def as_dict(self) -> dict:
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}


def warp(logits: torch.Tensor, params: SamplingParams, members: list | None = None) -> torch.Tensor:
    """Logits [..., vocab] -> probabilities [..., vocab] after temperature, top-k and top-p.

    Computed in float32 (float64 input stays float64). Greedy params give the one-hot argmax, so a
    greedy caller that asks for "the distribution" gets the one that greedy decoding actually uses.
    `members`: a list to which a speed layer's top-p search appends each row's members, most likely first, so that
    the sampler and the residual need not pass over whole rows again (core/speed.py); it stays empty otherwise.
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(dtype)
    if params.greedy:
        return one_hot_argmax(logits)
    found = speed.active().warp_rows(logits, params)
    if found is not None:
        return kept_with_members(found, members)
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = top_p_filter(probs, params.top_p, members)
    return probs


TOP_P_CANDIDATES = 256                           # first topk width of the generic top-p search


def top_p_filter(probs: torch.Tensor, top_p: float, members: list | None = None) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised.

    probs: [..., vocab]. The token that crosses the threshold is kept, so the set is never empty. The set is
    searched among candidates instead of sorting the whole vocabulary (a sort of 5 x 49k probabilities cost 18 ms
    on a CPU): any set of the most likely tokens whose mass reaches top_p contains it, since every token outside has
    at least the candidates' mass before it. Generic code: `topk_top_p`; a speed layer may search instead
    (core/speed.py) and then append each row's members, most likely first, to `members`.
    """
    found = speed.active().top_p_rows(probs, top_p)
    return kept_with_members(found, members) if found is not None else topk_top_p(probs, top_p)


def kept_with_members(found: tuple, members: list | None) -> torch.Tensor:
    """A speed layer's (probs, each row's members) -> probs, the members appended to `members` when it is a list."""
    probs, rows_members = found
    if members is not None:
        members.extend(rows_members)
    return probs


def topk_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """top_p_filter for any device and dtype: candidates are the top-256 of each row, widened 8x at a time until
    their mass reaches top_p in every row (one search for all rows: a per-row search would make the host wait on
    the device for every row)."""
    vocab = probs.shape[-1]
    count = min(vocab, TOP_P_CANDIDATES)
    while True:
        values, order = torch.topk(probs, count, dim=-1)                    # [..., count], descending
        mass_through = torch.cumsum(values, dim=-1)
        if count == vocab or bool((mass_through[..., -1] >= top_p).all()):
            break
        count = min(vocab, count * 8)
    keep_sorted = (mass_through - values) < top_p                             # mass before each candidate
    kept = torch.zeros_like(probs).scatter(-1, order, values * keep_sorted)
    return kept / kept.sum(dim=-1, keepdim=True)


def top_probability(logits: torch.Tensor) -> tuple[float, int]:
    """(the largest entry of softmax(logits), its index) for logits [vocab]: a drafter's confidence and its greedy
    pick (the first of equal maxima, as torch.argmax)."""
    found = speed.active().top_probability(logits)
    if found is not None:
        return found
    value, index = torch.softmax(logits.float(), -1).max(-1)
    return float(value), int(index)


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """logits [rows, vocab] -> the index of each row's largest entry (the first of equal maxima, as torch.argmax), on
    the host: the greedy decisions' search, which a speed layer may do faster."""
    found = speed.active().argmax_rows(logits)
    return found if found is not None else logits.argmax(dim=-1).tolist()


def top_entries(probs: torch.Tensor, n: int, members: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(probs, n, dim=-1)` for probabilities [..., vocab] -> (values, ids) [..., n], descending, ties
    lowest id first. Paid for every event (the display's top-3 of every verified position); `members`: what warp
    recorded for these rows, which a speed layer may use."""
    n = min(n, probs.shape[-1])
    found = speed.active().top_entries(probs, n, members)
    return found if found is not None else torch.topk(probs, n, dim=-1)


def top_p_members(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean mask [..., vocab] of the top-p set of `probs` (used only by the deliberately wrong rule)."""
    return top_p_filter(probs, top_p) > 0


def one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[..., vocab] -> one-hot of the argmax, same dtype (float)."""
    out = torch.zeros_like(logits)
    return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)


def sample(probs: torch.Tensor, generator: torch.Generator, support=None) -> int:
    """One token id from probs [vocab] (need not sum to 1) with the run's generator, by inverting the CDF.

    Written by hand because torch.multinomial costs ~4 ms per call over a 49k vocabulary on a CPU (measured),
    against ~0.1 ms here. One draw of the generator (`unit_draw`), then `sample_at`.
    """
    return sample_at(probs, unit_draw(generator, probs.device), support)


def unit_draw(generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """The uniform [0, 1) float64 draw that `sample` inverts the CDF at (0-d, on `device`)."""
    return torch.rand((), generator=generator, device=device, dtype=torch.float64)


def sample_at(probs: torch.Tensor, unit, support=None) -> int:
    """The token whose CDF step holds `unit` [0, 1) (a float or a 0-d float64 tensor) times the total of probs
    [vocab]: `sample` with its draw given, so tests can enumerate the draw. The CDF is accumulated in float64, in id
    order; a token of probability zero is never returned (its CDF step is empty). `support`: ids holding every
    nonzero entry of probs (a speed layer's top-p members), which a speed layer may accumulate over alone: the
    zeros between add nothing, so the token is the same.
    """
    if support is not None:
        found = speed.active().sample_at(probs, unit, support)
        if found is not None:
            return found
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)                                  # [vocab]
    point = unit * cdf[-1]
    return min(int(torch.searchsorted(cdf, point, right=True)), probs.shape[-1] - 1)


def choose_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
                 members: list | None = None) -> tuple[int, torch.Tensor]:
    """Next token from logits [vocab]: argmax when greedy, else a draw from the warped distribution.

    Returns (token, probs [vocab]) so callers that need q (drafters) report exactly what they drew from. With a
    list as `members`, the top-p members of probs (most likely first) are appended when a speed layer found them.
    """
    if params.greedy:                                  # warp's one-hot argmax, from one search
        token = argmax_rows(logits.reshape(1, -1))[0]
        probs = torch.zeros_like(logits, dtype=torch.float64 if logits.dtype == torch.float64 else torch.float32)
        probs[token] = 1.0
        return token, probs
    found = []
    probs = warp(logits, params, found)
    support = found[0] if len(found) == 1 else None
    if members is not None and support is not None:
        members.append(support)
    return sample(probs, generator, support), probs


def make_generator(device: torch.device | str, seed: int) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(seed)
    return generator
