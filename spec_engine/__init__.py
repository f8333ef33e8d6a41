"""spec_engine: exact speculative decoding on torch + transformers, with typed per-round events."""
from .decoder import MAX_K, MAX_NEW_TOKENS, DecodeState, SpeculativeDecoder, autoregressive_generate, validate_request
from .drafters import (DEFAULT_SKIP_LAYERS, CrossTokenizerDrafter, Drafter, LayerSkipDrafter, LookupFirstDrafter, ModelDrafter,
                       NaiveIdDrafter, PromptLookupDrafter, Proposal, early_exit_layers)
from .eagle import EagleDrafter, EagleHead, load_eagle_drafter
from .factory import DraftSpec, make_drafter, parse_draft
from .events import BaselineResult, GenerationResult, RoundEvent, RunStats, run_stats
from .sampling import SamplingParams, warp
from .verify import RULES, WRONG_RULES

__all__ = [
    "MAX_K", "MAX_NEW_TOKENS", "RULES", "WRONG_RULES",
    "SamplingParams", "warp", "SpeculativeDecoder", "DecodeState", "autoregressive_generate", "validate_request",
    "Drafter", "Proposal", "ModelDrafter", "LayerSkipDrafter", "PromptLookupDrafter", "LookupFirstDrafter", "CrossTokenizerDrafter",
    "NaiveIdDrafter", "EagleDrafter", "EagleHead", "load_eagle_drafter", "early_exit_layers", "DEFAULT_SKIP_LAYERS", "DraftSpec", "parse_draft", "make_drafter", "RoundEvent", "GenerationResult", "BaselineResult", "RunStats", "run_stats",
    "load_model", "LoadedModel",
]


def __getattr__(name):
    # models.py pulls in the GGUF machinery; import it only when asked for.
    if name in ("load_model", "LoadedModel", "list_presets", "resolve_preset", "list_pairs"):
        from . import models
        return getattr(models, name)
    raise AttributeError(name)
