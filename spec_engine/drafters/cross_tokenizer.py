"""Drafts from a model with another tokenizer: naive ids (deliberately wrong: the draft's ids read as the
target's) and cross-tokenizer (text re-tokenized at the boundary, the correct way)."""
from __future__ import annotations

import torch

from spec_engine.core.cache import check_invariant, forward_logits, new_cache, trim_cache
from spec_engine.core.sampling import SamplingParams
from spec_engine.drafters.base import Drafter, Proposal, common_prefix_len, vocab_size
from spec_engine.drafters.model import ModelDrafter


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
            raise ValueError(f"draft is on {self.model.device} but the target is on {target_model.device}; "
                             "load both on one device")

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
            raise ValueError(f"draft is on {self.model.device} but the target is on {target_model.device}; "
                             "load both on one device")

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
