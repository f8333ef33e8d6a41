"""Draft names, as the CLI, the presets and the app spell them, turned into drafters.

    layer-skip                     the target without DEFAULT_SKIP_LAYERS (self-speculative)
    early-exit[:N]                 the target's first N layers (default EARLY_EXIT_AFTER), a lesson, not a default
    layer-skip-tree                the layer-skip self-draft growing a draft tree: its top TREE_WIDTH = 2 tokens as
                                   siblings at every node, k nodes breadth first (drafters/tree.py)
    prompt-lookup[:N[:M]]          n-gram lookup: the longest match of M <= n <= N tokens (defaults
                                   PROMPT_LOOKUP_MAX_NGRAM = 8 and PROMPT_LOOKUP_MIN_NGRAM = 1), drafts sized by cost
    lookup-tree[:N]                prompt lookup as a draft tree: the continuations of up to N earlier matches
                                   (default TREE_LOOKUP_BRANCHES = 3) merged into one tree of k nodes
    eagle[:C]                      the shipped EAGLE head for the offline default (spec_engine/drafters/weights/); a
                                   round stops drafting when the head's top probability < C / 100 (default: the
                                   measured recommendation stored with the weights)
    eagle+lookup[:C]               prompt lookup (matches of 2+ tokens) where the text repeats itself, the EAGLE
                                   head elsewhere
    eagle-tree[:N]                 EAGLE-2's dynamic tree from the shipped head: grown by path confidence, the best N
                                   nodes kept (default: as many as the measured verify-cost curve pays for)
    eagle+lookup-tree[:N]          prompt lookup's chain where the text repeats itself, the EAGLE tree elsewhere
    suffix                         suffix decoding: a tree of what followed the longest earlier match of the text's
                                   newest tokens (prompt, output, the drafter's earlier runs), scored by frequency
    eagle+suffix[:N]               suffix decoding where its index matches 2+ tokens, the EAGLE tree elsewhere
    quantized-self[:B]             a copy of the target with B-bit weights (16: bf16, 8: int8, 4: int4; default
                                   QUANTIZED_SELF_BITS) drafts, the full-precision target verifies
    <preset or path>               a separate draft model with the target's tokenizer
    <preset>:cross-tokenizer       a draft with another tokenizer, text re-tokenized
    <preset>:naive-ids             the tokenizer-mismatch mistake: ids passed through unchanged

Every mode is registered here, once, with `@register(...)`: its builder, how its ":N" argument reads, and the
label and one-sentence lesson the app shows. The CLI, the presets and the app all read this registry, so adding a
drafter is its module plus one registration.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from spec_engine.drafters.base import Drafter
from spec_engine.drafters.cross_tokenizer import CrossTokenizerDrafter, NaiveIdDrafter
from spec_engine.drafters.lookup import (PROMPT_LOOKUP_MAX_NGRAM, PROMPT_LOOKUP_MIN_NGRAM, TREE_LOOKUP_BRANCHES,
                                         LookupFirstDrafter, PromptLookupDrafter, TreeLookupDrafter,
                                         fixed_length_lookup)
from spec_engine.drafters.model import DEFAULT_SKIP_LAYERS, LayerSkipDrafter, ModelDrafter, early_exit_layers
from spec_engine.drafters.quantized import SCHEMES_BY_BITS, QuantizedSelfDrafter
from spec_engine.drafters.sizing import Sizing, pin_sizing
from spec_engine.drafters.suffix import SuffixDrafter, SuffixFirstDrafter
from spec_engine.drafters.tree import LayerSkipTreeDrafter

EARLY_EXIT_AFTER = 20


@dataclass(frozen=True)
class DraftSpec:
    mode: str                    # a registered mode (MODES)
    model: str | None = None     # the draft model's preset name or path, for model drafts
    arg: int | None = None       # early-exit layers, prompt-lookup n-gram, lookup-tree branches or eagle confidence
    min_ngram: int | None = None # prompt lookup: the shortest n-gram that may propose
    layers: tuple[int, ...] | None = None   # layer-skip modes: the layers skipped (None: DEFAULT_SKIP_LAYERS)

    @property
    def needs_model(self) -> bool:
        return self.model is not None


def whole_number(mode: str, tail: str) -> tuple[int | None, int | None]:
    """The default ":N" of a self draft: nothing, or a whole number."""
    if tail and not tail.isdigit():
        raise ValueError(f"{mode}:N needs a whole number N, got {tail!r}")
    return (int(tail) if tail else None), None


def no_argument(mode: str, tail: str, instead: str = "") -> tuple[None, None]:
    if tail:
        raise ValueError(f"{mode} takes no argument" + (f"; {instead}" if instead else f", got {tail!r}"))
    return None, None


def always_available(target: str) -> tuple[bool, str]:
    return True, ""


@dataclass(frozen=True)
class DraftMode:
    name: str                                               # the draft name's head: "prompt-lookup", "eagle", ...
    build: Callable[..., Drafter]                           # build(spec, target, draft, fixed_length) -> Drafter
    label: str                                              # the app's dropdown label ({draft}: the draft model)
    lesson: str                                             # one sentence: what this draft teaches
    needs_model: bool = False                               # spelled <preset>[:mode]: a second model drafts
    parse: Callable[[str, str], tuple] = whole_number       # (mode, tail after ":") -> (arg, min_ngram)
    available: Callable[[str], tuple[bool, str]] = always_available   # by target preset name: (usable, why not)
    tree: bool = False                                      # proposes draft trees (core/tree_rule.py), not chains


MODES_BY_NAME: dict[str, DraftMode] = {}


def register(name: str, label: str, lesson: str, needs_model: bool = False, parse=whole_number, available=None,
             tree: bool = False):
    """Decorator: register `build(spec, target, draft, fixed_length) -> Drafter` as the draft mode `name`."""
    def add(build):
        MODES_BY_NAME[name] = DraftMode(name, build, label, lesson, needs_model, parse,
                                        available or always_available, tree)
        return build
    return add


register_draft = register      # the public name (spec_engine.register_draft)


def modes() -> tuple[str, ...]:
    """The registered draft modes, in registration order."""
    return tuple(MODES_BY_NAME)


def parse_draft(name: str) -> DraftSpec:
    """Parse a draft name (see the module docstring); ValueError names the accepted forms."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError("draft name is empty; use layer-skip, early-exit, prompt-lookup, or a model preset")
    head, _, tail = name.strip().partition(":")
    mode = MODES_BY_NAME.get(head)
    if mode is not None and not mode.needs_model:
        arg, min_ngram = mode.parse(head, tail)
        return DraftSpec(head, None, arg, min_ngram)
    model_modes = [m for m in MODES_BY_NAME.values() if m.needs_model and m.name != "same-tokenizer"]
    if tail in {m.name for m in model_modes}:
        return DraftSpec(tail, head)
    if tail:
        spelled = " or ".join(f"<model>:{m.name}" for m in model_modes)
        raise ValueError(f"unknown draft mode {tail!r} in {name!r}: use {spelled}")
    return DraftSpec("same-tokenizer", head)


def make_drafter(spec: DraftSpec | str, target, draft=None, fixed_length: bool = False, *,
                 skip_layers: Sequence[int] | None = None, sizing: Sizing | None = None) -> Drafter:
    """A fresh drafter for one run. `target` and `draft` are LoadedModel-like (`.model`, `.tokenizer`).

    `fixed_length`: the drafters that size their drafts (prompt lookup by cost, the EAGLE head by cost and by its
    confidence stops, eagle:C's included) draft k every round instead, where they can (a lookup without a match, or
    with a shorter continuation, still drafts what it found); the others do not size their drafts (a cross-tokenizer
    draft may still re-tokenize to fewer). With equal draft lengths the measured tokens per forward can be held
    against (1 - a^(k+1)) / (1 - a).

    `skip_layers`: the layers a layer-skip mode skips (default DEFAULT_SKIP_LAYERS). `sizing`: the verify-cost curve
    the drafts are sized by (a run's earlier `drafter_sizing`), instead of the target's curve as it stands when the
    decoder is built."""
    spec = parse_draft(spec) if isinstance(spec, str) else spec
    if spec.mode not in MODES_BY_NAME:
        raise ValueError(f"unknown draft mode {spec.mode!r}; registered: {', '.join(modes())}")
    if spec.needs_model and draft is None:
        raise ValueError(f"draft mode {spec.mode} needs the draft model {spec.model!r} loaded")
    if skip_layers is not None:
        if spec.mode not in LAYER_SKIP_MODES:
            raise ValueError(f"skip_layers: only {' and '.join(LAYER_SKIP_MODES)} skip layers, not {spec.mode}")
        spec = replace(spec, layers=tuple(int(i) for i in skip_layers))
    drafter = MODES_BY_NAME[spec.mode].build(spec, target, draft, fixed_length)
    pin_sizing(drafter, sizing)
    return drafter


LAYER_SKIP_MODES = ("layer-skip", "layer-skip-tree")


def skipped_layers(spec: DraftSpec, target) -> list[int]:
    n_layers = len(target.model.model.layers)
    return list(spec.layers) if spec.layers is not None else [i for i in DEFAULT_SKIP_LAYERS if i < n_layers]


# ---- the registrations: one per draft mode ----

@register("layer-skip", "Layer-skip self-draft (the target minus some layers)",
          "The target drafts for itself with some layers skipped: no second model, shared weights.",
          parse=lambda mode, tail: no_argument(mode, tail,
                                               "build LayerSkipDrafter(target, skip_layers) for other sets"))
def build_layer_skip(spec, target, draft, fixed_length):
    return LayerSkipDrafter(target.model, skipped_layers(spec, target))


@register("layer-skip-tree", "Layer-skip tree (the self-draft's top 2 tokens at every node)",
          "The same self-draft proposes a tree: its two likeliest tokens at every node, k nodes in all, and the "
          "target checks every branch in one forward; where the draft's first guess is second-best, the sibling "
          "still gets accepted.",
          parse=lambda mode, tail: no_argument(mode, tail, "build LayerSkipTreeDrafter(target, skip_layers, width)"),
          tree=True)
def build_layer_skip_tree(spec, target, draft, fixed_length):
    return LayerSkipTreeDrafter(target.model, skipped_layers(spec, target))


@register("early-exit", "Early-exit self-draft (first layers + the LM head)",
          "The lesson: the final LM head reads mid-network features poorly, so without a trained exit head "
          "acceptance collapses.")
def build_early_exit(spec, target, draft, fixed_length):
    n_layers = len(target.model.model.layers)
    exit_after = spec.arg or min(EARLY_EXIT_AFTER, n_layers - 1)
    if not 1 <= exit_after < n_layers:
        raise ValueError(f"early-exit:N needs 1 <= N < {n_layers} (the target's layer count), got {exit_after}")
    return LayerSkipDrafter(target.model, early_exit_layers(n_layers, exit_after))


def lookup_lengths(mode: str, tail: str) -> tuple[int | None, int | None]:
    """prompt-lookup[:N[:M]]: the longest and the shortest n-gram."""
    if tail.count(":") == 1:
        longest, _, shortest = tail.partition(":")
        if not (longest.isdigit() and shortest.isdigit() and 1 <= int(shortest) <= int(longest)):
            raise ValueError(f"prompt-lookup:N:M needs whole numbers 1 <= M <= N, got {tail!r}")
        return int(longest), int(shortest)
    return whole_number(mode, tail)


@register("prompt-lookup", "Prompt lookup (copy n-grams from the context)",
          "No model at all: propose what followed the last n tokens earlier in the text; shines when the "
          "answer copies the prompt.", parse=lookup_lengths)
def build_prompt_lookup(spec, target, draft, fixed_length):
    longest = spec.arg or PROMPT_LOOKUP_MAX_NGRAM
    return PromptLookupDrafter(max_ngram=longest, min_ngram=min(spec.min_ngram or PROMPT_LOOKUP_MIN_NGRAM, longest),
                               sizing="full" if fixed_length else "cost")


def branch_count(mode: str, tail: str) -> tuple[int | None, None]:
    if tail and not (tail.isdigit() and int(tail) >= 1):
        raise ValueError(f"{mode}:N needs a whole number of branches N >= 1, got {tail!r}")
    return (int(tail) if tail else None), None


@register("lookup-tree", "Prompt-lookup tree (several earlier matches as branches)",
          "Prompt lookup that copies what followed up to 3 earlier matches, merged into one tree: when the latest "
          "match copies the wrong continuation, another branch may hold the right one, and one forward checks all.",
          parse=branch_count, tree=True)
def build_lookup_tree(spec, target, draft, fixed_length):
    return TreeLookupDrafter(branches=spec.arg or TREE_LOOKUP_BRANCHES)


def confidence_percent(mode: str, tail: str) -> tuple[int | None, None]:
    if tail and not (tail.isdigit() and int(tail) < 100):
        raise ValueError(f"{mode}:C needs a confidence percentage C in 0..99, got {tail!r}")
    return (int(tail) if tail else None), None


def eagle_available(target: str) -> tuple[bool, str]:
    """The shipped EAGLE head drafts for the model it was trained on (its JSON record names it)."""
    from spec_engine.drafters import eagle
    try:
        record = json.loads(eagle.DEFAULT_WEIGHTS.with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False, "no trained EAGLE head ships with this version"
    trained_for = record.get("target")
    if trained_for != target:
        return False, f"the shipped head was trained for {trained_for}"
    return True, ""


def shipped_eagle(spec, target, fixed_length):
    from spec_engine.drafters.eagle import load_eagle_drafter      # loads weights: only when asked for
    return load_eagle_drafter(target.model, min_confidence=None if spec.arg is None else spec.arg / 100,
                              fixed_length=fixed_length)


@register("eagle", "EAGLE head (trained on the target's features)",
          "A one-layer head trained to predict the target's next features from its hidden states (the last layer, "
          "and lower ones if the head fuses them, as in EAGLE-3): cheap drafts, no extra target work.",
          parse=confidence_percent, available=eagle_available)
def build_eagle(spec, target, draft, fixed_length):
    return shipped_eagle(spec, target, fixed_length)


@register("eagle+lookup", "EAGLE head + prompt lookup (copies when the text repeats)",
          "Two draft sources, one rule: copy an n-gram continuation when the context has one, else ask the "
          "EAGLE head; each round's drafts stay exact because the choice depends on the text alone.",
          parse=confidence_percent, available=eagle_available)
def build_eagle_lookup(spec, target, draft, fixed_length):
    return LookupFirstDrafter(shipped_eagle(spec, target, fixed_length),
                              fixed_length_lookup() if fixed_length else None)


@register("same-tokenizer", "Separate draft model: {draft}",
          "A smaller model with the same tokenizer drafts; the classic pairing.", needs_model=True)
def build_model(spec, target, draft, fixed_length):
    return ModelDrafter(draft.model, name=spec.model)


@register("cross-tokenizer", "Cross-tokenizer draft: {draft}",
          "A draft with another tokenizer: its text is decoded and re-encoded with the target's tokenizer.",
          needs_model=True)
def build_cross_tokenizer(spec, target, draft, fixed_length):
    return CrossTokenizerDrafter(draft.model, draft.tokenizer, target.tokenizer, name=f"{spec.model}:cross-tokenizer")


@register("naive-ids", "Naive-id draft (tokenizer mismatch): {draft}",
          "The mistake: another tokenizer's ids passed to the target as if they were its own.", needs_model=True)
def build_naive_ids(spec, target, draft, fixed_length):
    return NaiveIdDrafter(draft.model, name=f"{spec.model}:naive-ids")


def tree_nodes(mode: str, tail: str) -> tuple[int | None, None]:
    """eagle-tree[:N]: keep N nodes every round (at most k) instead of sizing the tree by the verify costs."""
    from spec_engine.core.decoder import MAX_K      # a round verifies at most MAX_K drafts
    if tail and not (tail.isdigit() and 1 <= int(tail) <= MAX_K):
        raise ValueError(f"{mode}:N needs a node count N in 1..{MAX_K}, got {tail!r}")
    return (int(tail) if tail else None), None


def shipped_eagle_tree(spec, target, fixed_length):
    from spec_engine.drafters.eagle_tree import load_eagle_tree_drafter    # loads weights: only when asked for
    return load_eagle_tree_drafter(target.model, nodes=spec.arg, fixed_length=fixed_length)


@register("eagle-tree", "EAGLE-2 tree (the EAGLE head's likeliest branches)",
          "The EAGLE head grows a tree by path confidence (the product of its probabilities along a branch) and "
          "keeps the likeliest nodes: where its first guess is wrong, its second may be right, judged in one forward.",
          parse=tree_nodes, available=eagle_available, tree=True)
def build_eagle_tree(spec, target, draft, fixed_length):
    return shipped_eagle_tree(spec, target, fixed_length)


@register("eagle+lookup-tree", "EAGLE-2 tree + prompt lookup (copies when the text repeats)",
          "Prompt lookup's chain where the text repeats itself, else the EAGLE head's tree; the choice depends on the "
          "text alone, so every round stays exact.", parse=tree_nodes, available=eagle_available,
          tree=True)
def build_eagle_lookup_tree(spec, target, draft, fixed_length):
    return LookupFirstDrafter(shipped_eagle_tree(spec, target, fixed_length),
                              fixed_length_lookup() if fixed_length else None)


@register("suffix", "Suffix decoding (a frequency tree of earlier continuations)",
          "No model: every earlier occurrence of the text's newest tokens votes for what came next, and the likeliest "
          "continuations form a tree whose size grows with the length of the match.",
          parse=lambda mode, tail: no_argument(mode, tail, "build SuffixDrafter(max_spec_factor=...) for other sizes"),
          tree=True)
def build_suffix(spec, target, draft, fixed_length):
    return SuffixDrafter(size_by_cost=not fixed_length)


@register("eagle+suffix", "EAGLE-2 tree + suffix decoding (copies what followed earlier matches)",
          "Suffix decoding's frequency tree where the text's newest tokens occurred before, else the EAGLE head's "
          "tree; the choice depends on the text alone, so every round stays exact.", parse=tree_nodes,
          available=eagle_available, tree=True)
def build_eagle_suffix(spec, target, draft, fixed_length):
    return SuffixFirstDrafter(shipped_eagle_tree(spec, target, fixed_length),
                              SuffixDrafter(size_by_cost=not fixed_length))


# The measured best on the offline default (bench/results/quantized-smollm2-1thread, fp32 target, k = 3, a busy
# machine): bf16 1.61x plain decoding, int4 1.12x, int8 0.93x, all at 4.00 tokens per target forward. The bf16 copy
# keeps the CPU speed layer's lean forward and bf16 dot products; int8 / int4 run transformers' modules.
QUANTIZED_SELF_BITS = 16


def weight_bits(mode: str, tail: str) -> tuple[int | None, None]:
    """quantized-self[:B]: the bits a weight of the copy takes."""
    if tail and not (tail.isdigit() and int(tail) in SCHEMES_BY_BITS):
        raise ValueError(f"{mode}:B needs the bits per weight B, one of {', '.join(map(str, SCHEMES_BY_BITS))}; "
                         f"got {tail!r}")
    return (int(tail) if tail else None), None


@register("quantized-self", "Quantized self-draft (a bf16 copy of the target; :8 int8, :4 int4)",
          "The target's own weights in fewer bytes draft for it: the copy reads a fraction of the memory a step "
          "reads, and the full-precision target still decides, so the text stays exactly the target's.",
          parse=weight_bits)
def build_quantized_self(spec, target, draft, fixed_length):
    return QuantizedSelfDrafter(target.model, SCHEMES_BY_BITS[spec.arg or QUANTIZED_SELF_BITS])


MODES = modes()      # the modes registered above (a later registration extends modes(), not this tuple)
