"""Sampling settings and the warping that turns logits into the distribution we sample from.

The same `warp` is used by plain decoding, by every drafter and by the verifier, so "the target's
distribution" means one thing everywhere: temperature, then top-k, then top-p (the order Hugging Face's
`generate` applies them in). Randomness always comes from an explicit `torch.Generator`.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import torch

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
    With a list as `members`, the CPU top-p search appends each row's members, most likely first (numpy ids), so
    that the display's top entries need not search the rows again (see top_entries); it stays empty otherwise.
    """
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    logits = logits.to(dtype)
    if params.greedy:
        return one_hot_argmax(logits)
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, -math.inf)
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = top_p_filter(probs, params.top_p, members)
    return probs


TOP_P_CANDIDATES = 256                           # first topk width off the CPU
TOP_P_FLOORS = (2.0 ** -6, 2.0 ** -10, 2.0 ** -14)   # candidate floors tried in turn on the CPU


def top_p_filter(probs: torch.Tensor, top_p: float, members: list | None = None) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised.

    probs: [..., vocab]. The token that crosses the threshold is kept, so the set is never empty. The set is
    searched among candidates instead of sorting the whole vocabulary (a sort of 5 x 49k probabilities cost 18 ms
    here): any set of the most likely tokens whose mass reaches top_p contains it, since every token outside has
    at least the candidates' mass before it. On the CPU (`cpu_top_p_row`) the candidates are the tokens above a
    probability floor; elsewhere they are the top-256, widened until their mass suffices, for all rows at once
    (a per-row search would make the host wait on the device for every row). `members`: see warp.
    """
    if on_cpu_as_numpy(probs):
        rows = probs.reshape(-1, probs.shape[-1])                                 # [R, vocab]
        kept = torch.zeros_like(rows)
        for row, out in zip(rows.numpy(), kept.numpy()):
            ids = cpu_top_p_row(row, top_p, out)
            if members is not None:
                members.append(ids)
        return kept.reshape(probs.shape)
    return topk_top_p(probs, top_p)


def topk_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """top_p_filter for any device and dtype: candidates are the top-256 of each row, widened 8x at a time until
    their mass reaches top_p in every row."""
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


def cpu_top_p_row(row: np.ndarray, top_p: float, out: np.ndarray) -> np.ndarray:
    """Write the top-p members of `row` [vocab], renormalised, into `out` [vocab] (zeros, left alone elsewhere);
    returns the members' ids, most likely first (ties by id).

    Candidates: the tokens at or above the first floor of TOP_P_FLOORS whose tokens carry top_p of the mass (all
    tokens if none does); only they are sorted. In numpy, by hand, because it is the cheap tool for this size
    here: a compare over a 49k row costs ~35 us in torch and ~5 us in numpy, and torch.topk(256) ~200 us, which
    was 1-2% of a sampled round on the offline default.
    """
    candidates = above_a_floor(row, lambda ids: row[ids].sum() >= top_p)
    if candidates is None:
        candidates = np.arange(row.shape[0])
    order = np.argsort(-row[candidates], kind="stable")
    ids, values = candidates[order], row[candidates[order]]                    # descending
    inside = (np.cumsum(values) - values) < top_p                                # mass before each candidate
    members = values[inside]
    out[ids[inside]] = members / members.sum()              # normalised over the members only, not the vocabulary
    return ids[inside]


def on_cpu_as_numpy(probs: torch.Tensor) -> bool:
    """Whether `probs` can be searched in numpy in place: a float32 / float64 CPU tensor outside autograd."""
    return probs.device.type == "cpu" and probs.dtype in (torch.float32, torch.float64) and not probs.requires_grad


def above_a_floor(row: np.ndarray, enough, floors: tuple[float, ...] = TOP_P_FLOORS) -> np.ndarray | None:
    """Ids of the entries of `row` at or above the first of `floors` for which `enough(ids)` holds (None if no floor
    gives enough). Every entry left out is below every entry kept."""
    for floor in floors:
        ids = np.flatnonzero(row >= floor)
        if enough(ids):
            return ids
    return None


def top_entries(probs: torch.Tensor, n: int, members: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(probs, n, dim=-1)` for probabilities [..., vocab] -> (values, ids) [..., n], descending.

    On the CPU the n largest are sought among the tokens above the floors of TOP_P_FLOORS, in numpy (see
    cpu_top_p_row): once n tokens clear a floor, nothing below it can be among the n largest. ~10 us a row
    against ~100 us for torch.topk over 49k, paid for every event (the display's top-3 of every verified position).
    `members`, what warp recorded for these rows (each row's nonzero ids, most likely first), makes it a lookup.
    """
    n = min(n, probs.shape[-1])
    if not on_cpu_as_numpy(probs):
        return torch.topk(probs, n, dim=-1)
    rows = probs.reshape(-1, probs.shape[-1])                                     # [R, vocab]
    ids = np.empty((rows.shape[0], n), dtype=np.int64)
    for i, row in enumerate(rows.numpy()):
        candidates = largest_candidates(row, n) if members is None else with_zeros(members[i][:n], row.shape[0], n)
        ids[i] = candidates[np.argsort(-row[candidates], kind="stable")[:n]]
    ids = torch.from_numpy(ids).reshape(*probs.shape[:-1], n)
    return torch.gather(probs, -1, ids), ids


def with_zeros(ids: np.ndarray, vocab: int, n: int) -> np.ndarray:
    """`ids` (the nonzero entries of a row) completed to n ids with the first ids not among them (zeros)."""
    if ids.shape[0] >= n:
        return ids
    taken = set(ids.tolist())
    zeros = itertools.islice((i for i in range(vocab) if i not in taken), n - ids.shape[0])
    return np.concatenate([ids, np.fromiter(zeros, dtype=np.int64)])


SPARSE_SUPPORT = 4096       # a row with at most this many nonzero entries is searched among them directly


def largest_candidates(row: np.ndarray, n: int) -> np.ndarray:
    """At least n ids of `row` [vocab] (probabilities) among which are its n largest, in few passes over the row.

    Most rows have n entries above the first floor (one pass). A warped row (after top-p or top-k) may have fewer:
    its nonzero entries are then searched directly, and when there are fewer than n of them, zeros complete the set
    (a full argpartition of such a row cost ~0.2 ms, and each floor pass ~25 us, a millisecond of every sampled
    round before). Dense rows go on to the lower floors, and to argpartition when even those give too few."""
    candidates = np.flatnonzero(row >= TOP_P_FLOORS[0])
    if candidates.shape[0] >= n:
        return candidates
    support = np.flatnonzero(row)
    if support.shape[0] <= SPARSE_SUPPORT:
        return with_zeros(support, row.shape[0], n)
    candidates = above_a_floor(row, lambda found: found.shape[0] >= n, TOP_P_FLOORS[1:])
    return candidates if candidates is not None else np.argpartition(-row, n - 1)[:n]


def top_p_members(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean mask [..., vocab] of the top-p set of `probs` (used only by the deliberately wrong rule)."""
    return top_p_filter(probs, top_p) > 0


def one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[..., vocab] -> one-hot of the argmax, same dtype (float)."""
    out = torch.zeros_like(logits)
    return out.scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id from probs [vocab] (need not sum to 1) with the run's generator, by inverting the CDF.

    Written by hand because torch.multinomial costs ~4 ms per call over a 49k vocabulary on this CPU
    (measured), against ~0.1 ms here. The CDF is accumulated in float64; a token of probability zero
    is never returned (its CDF step is empty).
    """
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)                                  # [vocab]
    point = torch.rand((), generator=generator, device=probs.device, dtype=torch.float64) * cdf[-1]
    return min(int(torch.searchsorted(cdf, point, right=True)), probs.shape[-1] - 1)


def choose_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> tuple[int, torch.Tensor]:
    """Next token from logits [vocab]: argmax when greedy, else a draw from the warped distribution.

    Returns (token, probs [vocab]) so callers that need q (drafters) report exactly what they drew from.
    """
    probs = warp(logits, params)
    if params.greedy:
        return int(logits.argmax().item()), probs
    return sample(probs, generator), probs


def make_generator(device: torch.device | str, seed: int) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be an integer in [0, 2**63), got {seed!r}")
    generator = torch.Generator(device=torch.device(device))
    generator.manual_seed(seed)
    return generator
