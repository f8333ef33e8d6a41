"""Draft sources. Every drafter speaks one small protocol:

    begin(prompt_ids, target_features)           reset state for a new run (and prefill its cache, if any)
    propose(committed, k, params, generator)     -> Proposal: up to k target-token ids + what they were drawn from
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

import copy
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from .cache import cache_len, check_invariant, forward_logits, new_cache, trim_cache
from .costs import best_draft_length, verify_costs
from .sampling import SamplingParams, choose_token


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]                    # up to k target-token ids
    probs: torch.Tensor | None           # [len(tokens), target_vocab] draft distributions, or None (one-hot)
    note: str | None = None              # e.g. how a cross-tokenizer boundary was handled


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
        return [m for m in (getattr(self, name, None) for name in ("model", "head", "lm_head")) if isinstance(m, nn.Module)]


def vocab_size(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ModelDrafter(Drafter):
    """A separate causal LM with the target's tokenizer and its own KV cache.

    Greedy: proposes its argmax. Sampling: draws each proposal from its own warped distribution (same
    temperature / top-k / top-p as the target) and reports exactly that distribution as q.
    """

    def __init__(self, draft_model, name: str = "model"):
        self.model = draft_model
        self.name = name
        self.cache = None
        self.cache_ids: list[int] = []

    def check_target(self, target_model) -> None:
        draft_vocab, target_vocab = vocab_size(self.model), vocab_size(target_model)
        if draft_vocab != target_vocab:
            raise ValueError(
                f"draft vocabulary ({draft_vocab}) differs from the target's ({target_vocab}): ModelDrafter needs the "
                "same tokenizer; use CrossTokenizerDrafter for a draft with another tokenizer")
        if self.model.device != target_model.device:
            raise ValueError(f"draft is on {self.model.device} but the target is on {target_model.device}; load both on one device")

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        self.cache = new_cache(self.model)
        self.cache_ids = []
        if len(prompt_ids) > 1:
            self._feed(prompt_ids[:-1])

    def _feed(self, token_ids: list[int]) -> torch.Tensor:
        logits = forward_logits(self.model, self._model_ids(token_ids), self.cache, logits_to_keep=1)[-1]   # [vocab]
        self.cache_ids += token_ids
        return logits

    def _model_ids(self, token_ids: list[int]) -> list[int]:
        return token_ids

    def _target_id(self, draft_id: int) -> int:
        return draft_id

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Proposal:
        pending = committed[len(self.cache_ids):]          # the newest committed token(s) not yet in the cache
        tokens, probs = [], []
        for _ in range(k):
            logits = self._feed(pending)
            token, token_probs = choose_token(logits, params, generator)
            tokens.append(self._target_id(token))
            probs.append(token_probs)
            pending = [token]
        # The last proposal's KV is never computed: the cache holds committed + tokens[:-1].
        return Proposal(tokens, None if params.greedy or not probs else torch.stack(probs))   # [k, vocab]

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        keep = common_prefix_len(self.cache_ids, committed[:-1])
        trim_cache(self.cache, keep)
        del self.cache_ids[keep:]
        check_invariant(self.cache, len(self.cache_ids), f"draft ({self.name})")


def layer_skip_view(target_model, skip_layers) -> nn.Module:
    """The target with some decoder layers skipped, sharing every weight (no copies).

    Built from shallow copies of the model objects whose module dicts are copied, so the target itself is
    untouched and can keep serving while the view drafts. Early exit is the case of skipping a tail.
    """
    layers = target_model.model.layers
    n_layers = len(layers)
    skip = sorted(set(int(i) for i in skip_layers))
    if any(i < 0 or i >= n_layers for i in skip):
        raise ValueError(f"skip_layers must be layer indices in [0, {n_layers - 1}], got {skip}")
    if 0 in skip:
        raise ValueError("layer 0 cannot be skipped: the cache length and attention mask are read from it")
    keep = [i for i in range(n_layers) if i not in skip]
    inner = copy.copy(target_model.model)
    inner._modules = dict(inner._modules)
    inner.layers = nn.ModuleList([layers[i] for i in keep])
    inner.config = copy.copy(target_model.model.config)
    if getattr(inner.config, "layer_types", None):
        inner.config.layer_types = [inner.config.layer_types[i] for i in keep]
    inner.config.num_hidden_layers = len(keep)
    view = copy.copy(target_model)
    view._modules = dict(view._modules)
    view.model = inner
    return view


class LayerSkipDrafter(ModelDrafter):
    """Self-speculative drafting: the target's own weights with `skip_layers` left out of the forward."""

    def __init__(self, target_model, skip_layers):
        self.skip_layers = sorted(set(int(i) for i in skip_layers))
        self.target = target_model
        super().__init__(layer_skip_view(target_model, self.skip_layers), name=f"layer-skip{self.skip_layers}")

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        # Its own cache, laid out for the full model: skipped layers simply stay empty.
        self.cache = new_cache(self.target)
        self.cache_ids = []
        if len(prompt_ids) > 1:
            self._feed(prompt_ids[:-1])

    def check_target(self, target_model) -> None:
        if target_model is not self.target:
            raise ValueError("a LayerSkipDrafter drafts for the model it was built from; build one for this target")


# Chosen by measurement on the offline default (SmolLM2-135M, 30 layers): bench/choose_skip_layers.py ranks
# layers by greedy acceptance when skipped alone, then times sets of the most skippable ones against plain
# decoding (bench/results/choose_skip_layers.txt). No set pays on this small model: the best were 0.76x
# (skip [17], k=1) and 0.74x (these four, k=1, acceptance 0.48), equal within noise; we ship the four-layer
# set because it is a real draft (13% cheaper per token) rather than the target minus one layer.
DEFAULT_SKIP_LAYERS = [10, 12, 17, 18]


def early_exit_layers(n_layers: int, exit_after: int) -> list[int]:
    """The skip set of an early exit after `exit_after` layers."""
    return list(range(exit_after, n_layers))


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
        self.odds = LookupOdds()
        self.pending: tuple[int, int, list[int]] | None = None   # (match length, committed length, proposed)

    def check_target(self, target_model) -> None:
        if self.sizing == "cost":
            self.costs = verify_costs(target_model)

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        self.odds, self.pending = LookupOdds(), None

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Proposal:
        match_len, begin = longest_suffix_match(committed, self.max_ngram)
        copied = committed[begin:begin + k] if match_len >= self.min_ngram else []
        if copied and self.costs is not None:
            copied = copied[:best_draft_length(self.odds.chances(match_len, len(copied)), self.costs)]
        self.pending = (match_len, len(committed), copied) if copied else None
        return Proposal(copied, None)

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        if self.pending is not None:
            match_len, start, copied = self.pending
            self.odds.observe(match_len, len(copied), common_prefix_len(copied, committed[start:]))
            self.pending = None


LOOKUP_NOTE = "copied by prompt lookup"
# A 1-token match copies the right token 26% of the time, less often than the EAGLE head drafts (see
# LookupOdds), so LookupFirstDrafter leaves those rounds to its fallback.
LOOKUP_FIRST_MIN_NGRAM = 2


class LookupFirstDrafter(Drafter):
    """Prompt lookup where the text repeats itself, another drafter everywhere else.

    Each round proposes the n-gram continuation when the committed text has one and the lookup finds it worth
    a verify row (see PromptLookupDrafter), else asks `fallback`. The choice is made before the target sees the
    round (from the committed ids and earlier rounds), so each round's proposal distribution is still a fixed q and
    the exact rule applies unchanged (lookup rounds are one-hot). The fallback keeps its state in step every
    round: it sees every begin / rollback (with the target's features when it uses them), and a lookup round
    simply leaves its cache at the committed text, where rollback expects it. Grounded prompts (summarise,
    edit) get the long copies of prompt lookup, ordinary prompts the fallback's drafts.
    """

    def __init__(self, fallback: Drafter, lookup: PromptLookupDrafter | None = None):
        self.fallback = fallback
        self.lookup = lookup or PromptLookupDrafter(min_ngram=LOOKUP_FIRST_MIN_NGRAM)
        self.name = f"{fallback.name}+lookup"
        self.feature_layers = fallback.feature_layers

    @property
    def cache(self):
        return self.fallback.cache

    @property
    def cache_ids(self) -> list[int]:
        return getattr(self.fallback, "cache_ids", [])

    def check_target(self, target_model) -> None:
        self.fallback.check_target(target_model)
        self.lookup.check_target(target_model)

    def model_modules(self) -> list[nn.Module]:
        return self.fallback.model_modules()

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        self.lookup.begin(prompt_ids)
        self.fallback.begin(prompt_ids, target_features)

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Proposal:
        copied = self.lookup.propose(committed, k, params, generator).tokens if k else []
        if copied:
            return Proposal(copied, None, note=LOOKUP_NOTE)
        return self.fallback.propose(committed, k, params, generator)

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        self.lookup.rollback(committed)
        self.fallback.rollback(committed, target_features)


def fixed_length_lookup() -> PromptLookupDrafter:
    """LookupFirstDrafter's lookup with cost sizing off: a match proposes up to k copied tokens."""
    return PromptLookupDrafter(min_ngram=LOOKUP_FIRST_MIN_NGRAM, sizing="full")


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


class NaiveIdDrafter(ModelDrafter):
    """The deliberate mistake of the tokenizer-mismatch demo: a draft with another tokenizer whose ids are
    passed to and from the target unchanged.

    The target's ids are fed to the draft as if they were its own (ids beyond the draft's vocabulary wrap
    around: id % draft_vocab); the draft's argmax ids are handed to the target, ids beyond the target's
    vocabulary wrapping the same way (id % target_vocab). Proposals are argmax, so q is one-hot and the
    result is still exact: the target verifies every id, it just rejects almost all of them.
    """

    def __init__(self, draft_model, name: str = "naive-ids"):
        super().__init__(draft_model, name=name)
        self.draft_vocab = vocab_size(draft_model)
        self.target_vocab = self.draft_vocab

    def check_target(self, target_model) -> None:
        self.target_vocab = vocab_size(target_model)
        if self.model.device != target_model.device:
            raise ValueError(f"draft is on {self.model.device} but the target is on {target_model.device}; load both on one device")

    def _model_ids(self, token_ids: list[int]) -> list[int]:
        return [t % self.draft_vocab for t in token_ids]

    def _target_id(self, draft_id: int) -> int:
        return draft_id % self.target_vocab

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Proposal:
        greedy = SamplingParams(temperature=0.0)
        return Proposal(super().propose(committed, k, greedy, generator).tokens, None)


class CrossTokenizerDrafter(Drafter):
    """A draft with its own tokenizer: it continues the committed *text*, and its text is re-tokenized with
    the target's tokenizer.

    Each round: decode the committed target ids to text, encode that text with the draft tokenizer, reuse
    the draft's KV cache for the common prefix of draft ids, greedily draft k + 1 draft tokens, decode them,
    and re-tokenize with the target tokenizer after a short anchor of committed text. Boundary effects are
    handled honestly: if re-tokenizing anchor + draft text changes the anchor's ids (the draft text merged
    with the last committed token), the draft text is tokenized on its own instead, and the last target
    token is dropped when it may be a cut-off word piece. Proposals are deterministic (q one-hot).
    """

    ANCHOR_TOKENS = 8

    def __init__(self, draft_model, draft_tokenizer, target_tokenizer, name: str = "cross-tokenizer"):
        self.model = draft_model
        self.draft_tokenizer = draft_tokenizer
        self.target_tokenizer = target_tokenizer
        self.name = name
        self.cache = None
        self.cache_ids: list[int] = []

    def check_target(self, target_model) -> None:
        if self.model.device != target_model.device:
            raise ValueError(f"draft is on {self.model.device} but the target is on {target_model.device}; load both on one device")

    def begin(self, prompt_ids: list[int], target_features: torch.Tensor | None = None) -> None:
        self.cache = new_cache(self.model)
        self.cache_ids = []
        self._context = (0, [])

    def _draft_context(self, committed: list[int]) -> list[int]:
        """The committed text in draft ids (memoised per committed length: rollback and propose share it)."""
        if self._context[0] != len(committed):
            text = self.target_tokenizer.decode(committed, skip_special_tokens=False)
            self._context = (len(committed), self.draft_tokenizer.encode(text, add_special_tokens=True))
        return self._context[1]

    def propose(self, committed: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Proposal:
        if k == 0:
            return Proposal([], None)
        context = self._draft_context(committed)
        keep = min(common_prefix_len(self.cache_ids, context), len(context) - 1)
        trim_cache(self.cache, keep)
        del self.cache_ids[keep:]
        pending, drafted = context[keep:], []
        for _ in range(k + 1):
            logits = forward_logits(self.model, pending, self.cache, logits_to_keep=1)[-1]   # [draft_vocab]
            self.cache_ids += pending
            pending = [int(logits.argmax())]
            drafted.append(pending[0])
        draft_text = self.draft_tokenizer.decode(drafted, skip_special_tokens=True)
        tokens, note = self._retokenize(committed, draft_text)
        check_invariant(self.cache, len(self.cache_ids), "draft (cross-tokenizer)")
        return Proposal(tokens[:k], None, note)

    def _retokenize(self, committed: list[int], draft_text: str) -> tuple[list[int], str | None]:
        anchor = committed[-self.ANCHOR_TOKENS:]
        anchor_text = self.target_tokenizer.decode(anchor, skip_special_tokens=False)
        ids = self.target_tokenizer.encode(anchor_text + draft_text, add_special_tokens=False)
        if ids[:len(anchor)] == anchor:
            tokens, note = ids[len(anchor):], None
        else:
            tokens = self.target_tokenizer.encode(draft_text, add_special_tokens=False)
            note = "draft text merged with the committed text at the boundary; re-tokenized it on its own"
        if len(tokens) > 1:
            tokens = tokens[:-1]   # the draft stopped mid-text: its last target token may be a cut-off piece
        return tokens, note

    def rollback(self, committed: list[int], target_features: torch.Tensor | None = None) -> None:
        # The draft's cache is in draft-token space; it is reconciled with the new text at the next propose.
        # Positions past the committed text are dropped now so no rejected text survives the round.
        context = self._draft_context(committed)
        keep = min(common_prefix_len(self.cache_ids, context), max(len(context) - 1, 0))
        trim_cache(self.cache, keep)
        del self.cache_ids[keep:]
