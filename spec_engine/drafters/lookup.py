"""Prompt lookup: drafts copied from the text itself (the longest earlier match of the newest tokens), sized by
the measured odds of acceptance and the measured cost of verifying each extra row; and lookup-first, which
tries it before a fallback drafter."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from spec_engine.core.sampling import SamplingParams
from spec_engine.drafters.base import (Drafter, FirstThenFallback, Proposal, TreeProposal, common_prefix_len,
                                       trie_tree)
from spec_engine.drafters.sizing import reset_view, size_draft, sizing_view, verify_costs


PROMPT_LOOKUP_MAX_NGRAM = 8     # see PromptLookupDrafter
PROMPT_LOOKUP_MIN_NGRAM = 1


class LookupOdds:
    """How often copied tokens turn out right, by the length n of the match they were copied after: Beta
    estimates per run, starting from priors measured on the greedy answers of SmolLM2-135M to 16 chat, code and
    grounded prompts (`python -m bench.lookup_policy`, bench/results/lookup-policy-fp32.md). The first copied
    token is right 26% of the time after a 1-token match, 53% after 2, 73-87% after 3-7 and 92% after 8 or
    more; once one is right, the next is right 75-94% of the time, more after longer matches. Each run updates
    the estimates with what its own rounds accepted, so text that copies its input soon trusts short matches."""

    PRIORS = {1: (0.26, 0.75), 2: (0.53, 0.82), 3: (0.78, 0.85), 8: (0.92, 0.94)}   # bucket: (first, next)
    PRIOR_WEIGHT = 4.0                                                                # in observed tokens

    def __init__(self):
        self.counts = {b: [self.PRIOR_WEIGHT * first, self.PRIOR_WEIGHT, self.PRIOR_WEIGHT * nxt, self.PRIOR_WEIGHT]
                       for b, (first, nxt) in self.PRIORS.items()}                   # hits, trials (first, next)

    @staticmethod
    def bucket(match_len: int) -> int:
        return 1 if match_len <= 1 else 2 if match_len == 2 else 3 if match_len < 8 else 8

    def chances(self, match_len: int, length: int) -> list[float]:
        """Chance that copied token i is right given tokens before it are, i = 0..length-1."""
        first_hits, first_trials, next_hits, next_trials = self.counts[self.bucket(match_len)]
        return [first_hits / first_trials] + [next_hits / next_trials] * (length - 1)

    def observe(self, match_len: int, drafted: int, accepted: int) -> None:
        c = self.counts[self.bucket(match_len)]
        if drafted:
            c[0] += int(accepted > 0)
            c[1] += 1
        if accepted:
            c[2] += accepted - 1                      # right tokens after the first ...
            c[3] += accepted - 1 + (accepted < drafted)   # ... and the one that was wrong, if any


class PromptLookupDrafter(Drafter):
    """n-gram lookup (Saxena 2023): find the longest suffix of the committed text (up to max_ngram tokens,
    at least min_ngram) that occurred earlier, take its latest occurrence and propose what followed it. No
    model and no cache.

    sizing="cost" (the default) proposes the length with the most expected tokens per verify cost: the odds
    of each copied token from `LookupOdds` (by match length, updated with this run's outcomes) against the
    target's measured cost curve (`costs.verify_costs`, measured when the decoder is built). Weak 1-token
    matches then propose a token or two, long copies as many as pay, and a row count where the kernels step
    up (9 rows on this CPU) is avoided. sizing="full" always proposes up to k tokens, as transformers'
    `prompt_lookup_num_tokens` does. The length is fixed before the target sees the round, so the exact
    rule stays exact."""

    def __init__(self, max_ngram: int = PROMPT_LOOKUP_MAX_NGRAM, min_ngram: int = PROMPT_LOOKUP_MIN_NGRAM,
                 sizing: str = "cost"):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if sizing not in ("cost", "full"):
            raise ValueError(f"sizing must be 'cost' or 'full', got {sizing!r}")
        self.max_ngram, self.min_ngram, self.sizing = max_ngram, min_ngram, sizing
        self.name = f"prompt-lookup(n<={max_ngram})"
        self.costs: tuple[float, ...] | None = None      # the target's verify-cost curve, from check_target
        self.pinned_sizing = None                   # sizing.pin_sizing: a run's earlier curve
        self.odds = LookupOdds()
        self.pending: tuple[int, int, list[int]] | None = None   # (match length, committed length, proposed)

    def check_target(self, target_model) -> None:
        if self.sizing == "cost":
            self.costs = sizing_view(verify_costs(target_model), self.pinned_sizing)

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        self.odds, self.pending = LookupOdds(), None
        reset_view(self.costs)

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Proposal:
        match_len, begin = longest_suffix_match(committed, self.max_ngram)
        copied = committed[begin:begin + k] if match_len >= self.min_ngram else []
        note = None
        if copied and self.costs is not None:
            keep, note = size_draft(self.odds.chances(match_len, len(copied)), self.costs)
            copied = copied[:keep]
        self.pending = (match_len, len(committed), copied) if copied else None
        return Proposal(copied, None, note=note)

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        if self.pending is not None:
            match_len, start, copied = self.pending
            self.odds.observe(match_len, len(copied), common_prefix_len(copied, committed[start:]))
            self.pending = None


LOOKUP_NOTE = "copied by prompt lookup"
# A 1-token match copies the right token 26% of the time, less often than the EAGLE head drafts (see
# LookupOdds), so LookupFirstDrafter leaves those rounds to its fallback.
LOOKUP_FIRST_MIN_NGRAM = 2


class LookupFirstDrafter(FirstThenFallback):
    """Prompt lookup where the text repeats itself, another drafter everywhere else.

    Each round proposes the n-gram continuation when the committed text has one and the lookup finds it worth
    a verify row (see PromptLookupDrafter), else asks `fallback`. The choice is made from the committed ids and
    earlier rounds, so each round stays exact (lookup rounds are one-hot; see FirstThenFallback). Grounded prompts
    (summarise, edit) get the long copies of prompt lookup, ordinary prompts the fallback's drafts.
    """

    def __init__(self, fallback: Drafter, lookup: PromptLookupDrafter | None = None):
        super().__init__(lookup or PromptLookupDrafter(min_ngram=LOOKUP_FIRST_MIN_NGRAM), fallback, "lookup")

    @property
    def lookup(self) -> PromptLookupDrafter:
        return self.first

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Proposal:
        copied = self.lookup.propose(committed, k, params, generator).tokens if k else []
        if copied:
            self.first_drafted = True
            return Proposal(copied, None, note=LOOKUP_NOTE, source=self.lookup.name)
        proposal = self.fallback_propose(committed, k, params, generator)
        return dataclasses.replace(proposal, source=proposal.source or self.fallback.name)


def fixed_length_lookup() -> PromptLookupDrafter:
    """LookupFirstDrafter's lookup with cost sizing off: a match proposes up to k copied tokens."""
    return PromptLookupDrafter(min_ngram=LOOKUP_FIRST_MIN_NGRAM, sizing="full")


TREE_LOOKUP_BRANCHES = 3      # not yet measured (issue #26 item 3 sizes trees from the verify-cost curve)
TREE_LOOKUP_NOTE = "copied by prompt lookup, several matches as branches"


class TreeLookupDrafter(Drafter):
    """Prompt lookup as a draft tree: the continuations of up to `branches` earlier occurrences of the text's
    newest tokens (longest matches first, the latest occurrence first among equals), merged into one deterministic
    tree of at most k nodes (`base.trie_tree`). Where one match copies the wrong continuation, another may copy the
    right one, and the target judges all of them in one forward. The first branch gets what the others leave
    of the k nodes (each other branch gets k // branches). No model, no cache; every round is a TreeProposal
    (possibly of no nodes: the target then adds one token)."""

    def __init__(self, branches: int = TREE_LOOKUP_BRANCHES, max_ngram: int = PROMPT_LOOKUP_MAX_NGRAM,
                 min_ngram: int = PROMPT_LOOKUP_MIN_NGRAM):
        if isinstance(branches, bool) or not isinstance(branches, int) or branches < 1:
            raise ValueError(f"branches must be an integer >= 1, got {branches!r}")
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.branches, self.max_ngram, self.min_ngram = branches, max_ngram, min_ngram
        self.name = f"tree-lookup(branches<={branches})"

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> TreeProposal:
        found = lookup_branches(committed, k, self.branches, self.max_ngram, self.min_ngram)
        share = k // len(found) if found else 0
        budgets = [k - share * (len(found) - 1)] + [share] * (len(found) - 1)
        tree = trie_tree(found, budgets)
        return TreeProposal(tree, None, note=TREE_LOOKUP_NOTE if tree.tokens else None)


def lookup_branches(tokens: list[int], k: int, branches: int, max_ngram: int, min_ngram: int) -> list[list[int]]:
    """Up to `branches` distinct continuations (each up to k tokens) that followed earlier occurrences of the
    text's last n tokens, n from the longest match down to min_ngram, the latest occurrence first."""
    longest, _ = longest_suffix_match(tokens, max_ngram)
    seq = np.asarray(tokens, dtype=np.int64)
    found: list[list[int]] = []
    for n in range(longest, min_ngram - 1, -1):
        for end in match_ends(seq, n)[::-1].tolist():
            continuation = tokens[end + 1:end + 1 + k]
            if continuation and continuation not in found:
                found.append(continuation)
                if len(found) == branches:
                    return found
    return found


def match_ends(seq: np.ndarray, n: int) -> np.ndarray:
    """Ascending positions e < len - 1 where seq[e - n + 1 .. e] equals the last n tokens."""
    ends = np.flatnonzero(seq[:-1] == seq[-1])
    for back in range(1, n):
        ends = ends[ends >= back]
        ends = ends[seq[ends - back] == seq[-1 - back]]
    return ends


def longest_suffix_match(tokens: list[int], max_ngram: int) -> tuple[int, int]:
    """(n, begin): the longest n <= max_ngram such that the last n tokens also occur earlier, and where the
    continuation of their latest earlier occurrence begins; (0, -1) when even the last token is new."""
    longest = min(max_ngram, len(tokens) - 1)
    if longest < 1:
        return 0, -1
    seq = np.asarray(tokens, dtype=np.int64)
    ends = np.flatnonzero(seq[:-1] == seq[-1])       # where earlier 1-gram matches end
    n = 1
    # Grow the matches backwards one token at a time (an n-gram match contains the (n-1)-gram match ending at the
    # same place), keeping those that still match: a few compares over the survivors, not a pass per length.
    while ends.shape[0] and n < longest:
        longer = ends[ends >= n]
        longer = longer[seq[longer - n] == seq[-1 - n]]
        if not longer.shape[0]:
            break
        ends, n = longer, n + 1
    return (n, int(ends[-1]) + 1) if ends.shape[0] else (0, -1)


def lookup_continuation(tokens: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix (>= min_ngram)."""
    n, begin = longest_suffix_match(tokens, max_ngram)
    return tokens[begin:begin + k] if n >= min_ngram else []
