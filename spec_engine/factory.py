"""Draft names, as the CLI, the presets and the app spell them, turned into drafters.

    layer-skip                     the target without DEFAULT_SKIP_LAYERS (self-speculative)
    early-exit[:N]                 the target's first N layers (default EARLY_EXIT_AFTER), a lesson, not a default
    prompt-lookup[:N[:M]]          n-gram lookup: the longest match of M <= n <= N tokens (defaults
                                   PROMPT_LOOKUP_MAX_NGRAM = 8 and PROMPT_LOOKUP_MIN_NGRAM = 1), drafts sized by cost
    eagle[:C]                      the shipped EAGLE head for the offline default (spec_engine/weights/); a round
                                   stops drafting when the head's top probability < C / 100 (default: the
                                   measured recommendation stored with the weights)
    eagle+lookup[:C]               prompt lookup (matches of 2+ tokens) where the text repeats itself, the EAGLE
                                   head elsewhere
    <preset or path>               a separate draft model with the target's tokenizer
    <preset>:cross-tokenizer       a draft with another tokenizer, text re-tokenized
    <preset>:naive-ids             the tokenizer-mismatch mistake: ids passed through unchanged
"""
from __future__ import annotations

from dataclasses import dataclass

from .drafters import (CrossTokenizerDrafter, DEFAULT_SKIP_LAYERS, Drafter, LayerSkipDrafter, LookupFirstDrafter,
                       ModelDrafter, NaiveIdDrafter, PROMPT_LOOKUP_MAX_NGRAM, PROMPT_LOOKUP_MIN_NGRAM, PromptLookupDrafter,
                       early_exit_layers, fixed_length_lookup)

EARLY_EXIT_AFTER = 20
MODES = ("layer-skip", "early-exit", "prompt-lookup", "eagle", "eagle+lookup", "same-tokenizer", "cross-tokenizer", "naive-ids")


@dataclass(frozen=True)
class DraftSpec:
    mode: str                    # one of MODES
    model: str | None = None     # the draft model's preset name or path, for model drafts
    arg: int | None = None       # early-exit layers, prompt-lookup n-gram size or eagle confidence percentage
    min_ngram: int | None = None # prompt lookup: the shortest n-gram that may propose

    @property
    def needs_model(self) -> bool:
        return self.model is not None


def parse_draft(name: str) -> DraftSpec:
    """Parse a draft name (see the module docstring); ValueError names the accepted forms."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("draft name is empty; use layer-skip, early-exit, prompt-lookup, or a model preset")
    head, _, tail = name.strip().partition(":")
    if head in ("eagle", "eagle+lookup"):
        if tail and not (tail.isdigit() and int(tail) < 100):
            raise ValueError(f"{head}:C needs a confidence percentage C in 0..99, got {tail!r}")
        return DraftSpec(head, None, int(tail) if tail else None)
    if head == "prompt-lookup" and tail.count(":") == 1:
        longest, _, shortest = tail.partition(":")
        if not (longest.isdigit() and shortest.isdigit() and 1 <= int(shortest) <= int(longest)):
            raise ValueError(f"prompt-lookup:N:M needs whole numbers 1 <= M <= N, got {tail!r}")
        return DraftSpec(head, None, int(longest), int(shortest))
    if head in ("layer-skip", "early-exit", "prompt-lookup"):
        if head == "layer-skip" and tail:
            raise ValueError("layer-skip takes no argument; build LayerSkipDrafter(target, skip_layers) for other sets")
        if tail and not tail.isdigit():
            raise ValueError(f"{head}:N needs a whole number N, got {tail!r}")
        return DraftSpec(head, None, int(tail) if tail else None)
    if tail in ("cross-tokenizer", "naive-ids"):
        return DraftSpec(tail, head)
    if tail:
        raise ValueError(f"unknown draft mode {tail!r} in {name!r}: use <model>:cross-tokenizer or <model>:naive-ids")
    return DraftSpec("same-tokenizer", head)


def make_drafter(spec: DraftSpec | str, target, draft=None, fixed_length: bool = False) -> Drafter:
    """A fresh drafter for one run. `target` and `draft` are LoadedModel-like (`.model`, `.tokenizer`).

    `fixed_length`: the drafters that size their drafts (prompt lookup by cost, the EAGLE head by cost and by its
    confidence stops, eagle:C's included) draft k every round instead, where they can (a lookup without a match, or
    with a shorter continuation, still drafts what it found); the others do not size their drafts (a cross-tokenizer
    draft may still re-tokenize to fewer). With equal draft lengths the measured tokens per forward can be held
    against (1 - a^(k+1)) / (1 - a)."""
    spec = parse_draft(spec) if isinstance(spec, str) else spec
    if spec.needs_model and draft is None:
        raise ValueError(f"draft mode {spec.mode} needs the draft model {spec.model!r} loaded")
    if spec.mode == "layer-skip":
        n_layers = len(target.model.model.layers)
        return LayerSkipDrafter(target.model, [i for i in DEFAULT_SKIP_LAYERS if i < n_layers])
    if spec.mode == "early-exit":
        n_layers = len(target.model.model.layers)
        exit_after = spec.arg or min(EARLY_EXIT_AFTER, n_layers - 1)
        if not 1 <= exit_after < n_layers:
            raise ValueError(f"early-exit:N needs 1 <= N < {n_layers} (the target's layer count), got {exit_after}")
        return LayerSkipDrafter(target.model, early_exit_layers(n_layers, exit_after))
    if spec.mode == "prompt-lookup":
        longest = spec.arg or PROMPT_LOOKUP_MAX_NGRAM
        return PromptLookupDrafter(max_ngram=longest, min_ngram=min(spec.min_ngram or PROMPT_LOOKUP_MIN_NGRAM, longest),
                                   sizing="full" if fixed_length else "cost")
    if spec.mode in ("eagle", "eagle+lookup"):
        from .eagle import load_eagle_drafter
        eagle = load_eagle_drafter(target.model, min_confidence=None if spec.arg is None else spec.arg / 100,
                                   fixed_length=fixed_length)
        if spec.mode == "eagle":
            return eagle
        return LookupFirstDrafter(eagle, fixed_length_lookup() if fixed_length else None)
    if spec.mode == "cross-tokenizer":
        return CrossTokenizerDrafter(draft.model, draft.tokenizer, target.tokenizer, name=f"{spec.model}:cross-tokenizer")
    if spec.mode == "naive-ids":
        return NaiveIdDrafter(draft.model, name=f"{spec.model}:naive-ids")
    return ModelDrafter(draft.model, name=spec.model)
