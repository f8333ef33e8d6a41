"""The drafter protocol (defined beside the loop that calls it, core/drafting.py) and helpers drafters share."""
from __future__ import annotations

import torch
from torch import nn

from spec_engine.core.drafting import Drafter, Proposal, ReportUnwarped, TreeProposal, wants_unwarped
from spec_engine.core.sampling import SamplingParams
from spec_engine.core.tree_rule import TokenTree

__all__ = ["Drafter", "Proposal", "TreeProposal", "TokenTree", "FirstThenFallback", "vocab_size", "common_prefix_len",
           "trie_tree", "ReportUnwarped", "wants_unwarped"]


def vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def trie_tree(branches: list[list[int]], budgets: list[int]) -> TokenTree:
    """Merge continuations into one deterministic token tree (a trie: continuations that share a prefix share its
    nodes, so siblings are distinct tokens). Branch j adds at most budgets[j] new nodes; nodes come in insertion
    order, so every parent precedes its children."""
    tokens: list[int] = []
    parents: list[int] = []
    index: dict[tuple[int, int], int] = {}
    for branch, budget in zip(branches, budgets):
        node, added = -1, 0
        for token in branch:
            if (node, token) not in index:
                if added == budget:
                    break
                index[(node, token)] = len(tokens)
                tokens.append(token)
                parents.append(node)
                added += 1
            node = index[(node, token)]
    return TokenTree.of(tokens, parents, "deterministic")


class FirstThenFallback(Drafter):
    """A model-free drafter (`first`: prompt lookup, suffix decoding) where it has a draft worth verifying, the
    `fallback` drafter everywhere else; a subclass's `propose` makes the choice. The choice must depend only on the
    committed ids and earlier rounds, fixed before the target sees the round, so each round's proposal is still a
    fixed q and the exact rule applies unchanged. The fallback keeps its state in step: it sees every begin and
    rollback, and a round drafted by `first` leaves the fallback's cache at the committed text, where rollback
    expects it. The cache is the fallback's.

    A fallback that takes the target's features (the EAGLE head) catches up on them with a forward of its own. After
    a round `first` drafted, that catch-up waits: the features are kept, and the fallback gets them all in one
    rollback before it next drafts (`fallback_propose`). So a run of rounds that copy from the prompt pays one head
    forward, not one a round, and its cache lags the committed text until then (events report what it holds). The
    fallback's drafts are still a function of the committed text alone: the same features, fed later."""

    def __init__(self, first: Drafter, fallback: Drafter, name: str):
        self.first, self.fallback = first, fallback
        self.name = f"{fallback.name}+{name}"
        self.feature_layers = fallback.feature_layers
        self.first_drafted = False                  # this round's proposal is `first`'s (set by a subclass's propose)
        self.waiting: list[torch.Tensor] = []       # features of rounds `first` drafted, not yet given to the fallback

    def fallback_propose(self, committed: list[int], k: int, params: SamplingParams,
                         generator: torch.Generator) -> Proposal:
        """The fallback's proposal, after the catch-up that waited (if any)."""
        self.first_drafted = False
        if self.waiting and k:                      # (k = 0: nothing to draft; the next rollback takes them along)
            self._catch_up(committed, None)
        return self.fallback.propose(committed, k, params, generator)

    def _catch_up(self, committed: list[int], target_features: torch.Tensor | None) -> None:
        parts = self.waiting + ([target_features] if target_features is not None else [])
        self.waiting = []
        self.fallback.rollback(committed, torch.cat(parts) if len(parts) > 1 else parts[0] if parts else None)

    @property
    def cache(self):
        return self.fallback.cache

    @property
    def cache_ids(self) -> list[int]:
        return getattr(self.fallback, "cache_ids", [])

    def check_target(self, target_model) -> None:
        self.fallback.check_target(target_model)
        self.first.check_target(target_model)

    def model_modules(self) -> list[nn.Module]:
        return self.fallback.model_modules()

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        self.first_drafted, self.waiting = False, []
        self.first.begin(prompt_ids)
        self.fallback.begin(prompt_ids, target_features)

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        self.first.rollback(committed)
        if self.first_drafted and target_features is not None:
            self.waiting.append(target_features)            # [m, F]: the fallback catches up before it drafts
        else:
            self._catch_up(committed, target_features)
        self.first_drafted = False                          # a round that proposes nothing is not `first`'s
