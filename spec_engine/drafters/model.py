"""Model drafters: a separate small causal LM with the target's tokenizer, and views of the target itself
that skip layers (layer skip, early exit). Each keeps its own KV cache, trimmed to the committed text every round."""
from __future__ import annotations

import copy

import torch
from torch import nn

from spec_engine.core.cache import check_invariant, forward_logits, new_cache, trim_cache
from spec_engine.core.sampling import SamplingParams, choose_token
from spec_engine.drafters.base import Drafter, Proposal, common_prefix_len, vocab_size, wants_unwarped


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
            raise ValueError(f"draft is on {self.model.device} but the target is on {target_model.device}; "
                             "load both on one device")

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
        tokens, probs, unwarped = [], [], []
        for _ in range(k):
            logits = self._feed(pending)
            token, token_probs = choose_token(logits, params, generator)
            tokens.append(self._target_id(token))
            probs.append(token_probs)
            if wants_unwarped(params):
                unwarped.append(torch.softmax(logits.to(token_probs.dtype), dim=-1))   # before T, top-k, top-p
            pending = [token]
        # The last proposal's KV is never computed: the cache holds committed + tokens[:-1].
        if params.greedy or not probs:
            return Proposal(tokens, None)
        return Proposal(tokens, torch.stack(probs), unwarped=torch.stack(unwarped) if unwarped else None)   # [k, vocab]

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
            raise ValueError(f"a {type(self).__name__} drafts for the model it was built from; "
                             "build one for this target")


# Chosen by measurement on the offline default (SmolLM2-135M, 30 layers): bench/choose_skip_layers.py ranks
# layers by greedy acceptance when skipped alone, then times sets of the most skippable ones against plain
# decoding (bench/results/choose_skip_layers.txt). No set pays on this small model: the best were 0.76x
# (skip [17], k=1) and 0.74x (these four, k=1, acceptance 0.48), equal within noise; we ship the four-layer
# set because it is a real draft (13% cheaper per token) rather than the target minus one layer.
DEFAULT_SKIP_LAYERS = [10, 12, 17, 18]


def early_exit_layers(n_layers: int, exit_after: int) -> list[int]:
    """The skip set of an early exit after `exit_after` layers."""
    return list(range(exit_after, n_layers))
