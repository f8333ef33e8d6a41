"""Draft sources: the protocol (base.py), one module per drafter family, draft sizing from measured costs
(sizing.py) and the one registry of draft names (registry.py) that the CLI, the presets and the app all read.

Adding a drafter: write its module here, and register its name in registry.py with `@register(...)`.
"""
from spec_engine.drafters.base import Drafter, Proposal, common_prefix_len, vocab_size
from spec_engine.drafters.cross_tokenizer import CrossTokenizerDrafter, NaiveIdDrafter
from spec_engine.drafters.lookup import (LOOKUP_FIRST_MIN_NGRAM, LOOKUP_NOTE, PROMPT_LOOKUP_MAX_NGRAM,
                                         PROMPT_LOOKUP_MIN_NGRAM, LookupFirstDrafter, LookupOdds, PromptLookupDrafter,
                                         TreeLookupDrafter, fixed_length_lookup, longest_suffix_match,
                                         lookup_continuation)
from spec_engine.drafters.model import (DEFAULT_SKIP_LAYERS, LayerSkipDrafter, ModelDrafter, early_exit_layers,
                                        layer_skip_view)
from spec_engine.drafters.quantized import QuantizedSelfDrafter
from spec_engine.drafters.tree import LayerSkipTreeDrafter, ModelTreeDrafter

__all__ = [
    "Drafter", "Proposal", "common_prefix_len", "vocab_size", "CrossTokenizerDrafter", "NaiveIdDrafter",
    "LOOKUP_FIRST_MIN_NGRAM", "LOOKUP_NOTE", "PROMPT_LOOKUP_MAX_NGRAM", "PROMPT_LOOKUP_MIN_NGRAM",
    "LookupFirstDrafter", "LookupOdds", "PromptLookupDrafter", "fixed_length_lookup", "longest_suffix_match",
    "lookup_continuation", "DEFAULT_SKIP_LAYERS", "LayerSkipDrafter", "ModelDrafter", "early_exit_layers",
    "layer_skip_view", "TreeLookupDrafter", "LayerSkipTreeDrafter", "ModelTreeDrafter", "QuantizedSelfDrafter",
]
