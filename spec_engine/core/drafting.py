"""What the loop asks of a draft source: the protocol every drafter speaks (drafters/ holds the drafters):

    begin(prompt_ids, target_features)           reset state for a new run (and prefill its cache, if any)
    propose(committed, k, params, generator)     -> Proposal: up to k target-token ids + what they were drawn from,
                                                    or TreeProposal: a token tree of up to k nodes (core/tree_rule.py)
    rollback(committed, target_features)         learn how the round went; trim own state to the committed text

`target_features` is None unless the drafter lists `feature_layers` (indices into transformers' `hidden_states`,
-1 = the post-norm final states the LM head reads); then it is those layers' hidden states side by side,
[n, len(feature_layers) * hidden], for the committed tokens the target has processed since the last call, in
order: every committed token but the newest (its features come with the next round's verify forward).

A `Proposal.probs` of None means the proposals are a deterministic function of the context, i.e. q is
one-hot on each drafted token; the exact rule is then still exact. A drafter that samples must report the
very distribution it sampled from (drafting by argmax while reporting a softmax is a known bug class).

Drafters with a KV cache expose it as `.cache` and list the ids it holds as `.cache_ids`, so the engine and
the tests can see every position. Model drafters never hold weight copies of the target.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch
from torch import nn

from spec_engine.core.cache import cache_len
from spec_engine.core.sampling import SamplingParams
from spec_engine.core.tree_rule import TokenTree


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]                    # up to k target-token ids
    probs: torch.Tensor | None           # [len(tokens), target_vocab] draft distributions, or None (one-hot)
    note: str | None = None              # e.g. how a cross-tokenizer boundary was handled
    unwarped: torch.Tensor | None = None # [len(tokens), target_vocab] the draft's temperature-1 softmax before top-k /
                                         #   top-p, reported only when `propose` is given ReportUnwarped params:
                                         #   what the shipped bug rule "q_mismatch" reads as q
    source: str | None = None            # who proposed it, when a drafter combines others (else the drafter's name)


@dataclass(frozen=True)
class ReportUnwarped(SamplingParams):
    """Sampling parameters that also ask `propose` for the draft's distributions before warping
    (`Proposal.unwarped`), which the bug rule "q_mismatch" reads as q. The decoder passes them under that rule only,
    so the request travels with the call (through drafters that pass their params on) and no drafter holds it; a
    drafter that cannot report them ignores it, and the rule then says which drafters do."""

    @classmethod
    def of(cls, params: SamplingParams) -> ReportUnwarped:
        return cls(**params.as_dict())


def wants_unwarped(params: SamplingParams) -> bool:
    """Whether `propose` was asked to report `Proposal.unwarped` too (see ReportUnwarped)."""
    return isinstance(params, ReportUnwarped)


@dataclass(frozen=True)
class TreeProposal:
    """A draft tree: several continuations verified in one target forward (the engine's tree path). A chain is the
    tree with one child per node. Sampled trees must report, per node with children, the distribution its children
    were drawn from, and say in `tree.drawn` how (with or without replacement): the tree rule depends on it."""
    tree: TokenTree                      # up to k nodes
    probs: torch.Tensor | None           # [n + 1, target_vocab] q at the root and after each node, None: deterministic
    note: str | None = None
    source: str | None = None            # who proposed it, when a drafter combines others (else the drafter's name)


class Drafter:
    """Base class: a drafter without state. Subclasses override what they need."""

    name = "drafter"
    cache = None
    feature_layers: tuple[int, ...] = ()        # the target hidden states it reads (none: it drafts from ids)

    def check_target(self, target_model) -> None:
        """Raise ValueError if this drafter cannot propose ids for `target_model`."""

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        pass

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Proposal:
        raise NotImplementedError

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        pass

    def cache_len(self) -> int | None:
        return None if self.cache is None else cache_len(self.cache)

    def model_modules(self) -> list[nn.Module]:
        """The modules whose forwards are this drafter's model time (benchmarks time them apart from overhead)."""
        return [m for m in (getattr(self, name, None) for name in ("model", "head", "lm_head"))
                if isinstance(m, nn.Module)]


# Ways drafters batch their catch-ups across many sequences (a batch's round, core/batch.py): each a context manager
# factory, registered by the drafter module that owns it (drafters/eagle.py: one packed head forward for all the
# sequences whose heads catch up). Inside `catching_up_together()` such drafters' `begin` and `rollback` may leave
# their model's work pending; it runs, batched, when the block ends. Nothing may propose inside it.
TOGETHER: list[Callable[[], ContextManager]] = []


@contextlib.contextmanager
def catching_up_together():
    with contextlib.ExitStack() as stack:
        for make in TOGETHER:
            stack.enter_context(make())
        yield


# A batch that sizes a sequence's drafts itself (core/batch.py, draft_length "adaptive") prices them by the chain's
# geometric model: m drafts yield a + a^2 + ... + a^m tokens. A tree's m nodes do not: two siblings yield at most one
# token, and their acceptance, learnt as a chain's, reads as the chance that either is taken (a tree of 2 nodes
# priced at a + a^2 = 1.31 tokens where it yields 0.75). So inside `drafting_chains()` a drafter that can draft its
# tree's top-1 spine as a chain does (drafters/eagle_tree.py); a lone run, and a batch's pinned sequences, never
# enter it. Measured on the held-out prompts at batch 2 / 4 / 6, the adaptive length with the EAGLE tree gave x1.18 /
# x0.97 / x0.89 of plain batching and with the EAGLE chain x1.30 / x1.11 / x0.90 (docs/benchmarks.md).
_CHAINS = threading.local()


@contextlib.contextmanager
def drafting_chains():
    before = getattr(_CHAINS, "on", False)
    _CHAINS.on = True
    try:
        yield
    finally:
        _CHAINS.on = before


def chains_wanted() -> bool:
    """Whether this thread is inside `drafting_chains()`."""
    return getattr(_CHAINS, "on", False)
