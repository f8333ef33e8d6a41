"""spec_engine: exact speculative decoding on torch + transformers, with typed per-round events.

Layers (docs/architecture.md): core/ (the rule, the loop, sampling, the KV cache, events; device-generic torch),
drafters/ (one module per drafter family and the one registry of draft names), models/ (presets and loading),
accel/ (the optional CPU speed layer behind core/speed.py, installed by load_model or use_speed_layer() unless
SPEC_ENGINE_ACCEL=0) and classroom/ (lab, sweeps, traces, explanations, toy models).
"""
from spec_engine import accel
from spec_engine.core import speed
from spec_engine.core.batch import BatchCosts, BatchDecoder, BatchEvent, Request
from spec_engine.core.decoder import (MAX_K, MAX_NEW_TOKENS, DecodeState, SpeculativeDecoder, autoregressive_generate,
                                     context_length, validate_request)
from spec_engine.drafters import (DEFAULT_SKIP_LAYERS, CrossTokenizerDrafter, Drafter, LayerSkipDrafter,
                                  LookupFirstDrafter, ModelDrafter, NaiveIdDrafter, PromptLookupDrafter, Proposal,
                                  early_exit_layers, TreeLookupDrafter, LayerSkipTreeDrafter, ModelTreeDrafter,
                                  QuantizedSelfDrafter)
from spec_engine.drafters.eagle import EagleDrafter, EagleHead, load_eagle_drafter
from spec_engine.drafters.base import vocab_size
from spec_engine.drafters.eagle import recommended_settings as eagle_recommended_settings
from spec_engine.drafters.lookup import PROMPT_LOOKUP_MAX_NGRAM, PROMPT_LOOKUP_MIN_NGRAM
from spec_engine.drafters.registry import (EARLY_EXIT_AFTER, LAYER_SKIP_MODES, DraftMode, DraftSpec, make_drafter,
                                          parse_draft, register_draft)
from spec_engine.drafters.sizing import Sizing, drafter_sizing, not_observed, startup_sizing
from spec_engine.core.events import BaselineResult, GenerationResult, RoundEvent, RunStats, run_stats
from spec_engine.core.metrics import (acceptance_by_position, acceptance_rate, expected_tokens_by_position,
                                      expected_tokens_per_round, judged_acceptance, speedup_model)
from spec_engine.core import static_cache
from spec_engine.core.rule import LIBRARY_RULES, RULE_INFO, RuleInfo
from spec_engine.core.sampling import SamplingParams, warp
from spec_engine.core.verify import RULES, WRONG_RULES
from spec_engine.core.tree_rule import TREE_RULES, WRONG_TREE as WRONG_TREE_RULES

# What load_model and use_speed_layer() install (core/speed.py is the seam): the CPU speed layer unless
# SPEC_ENGINE_ACCEL=0, then the static KV cache path instead with SPEC_ENGINE_STATIC=1 (core/static_cache.py).
speed.select_from_env(accel.install_from_env, static_cache.install_from_env)

__all__ = [
    "MAX_K", "MAX_NEW_TOKENS", "RULES", "WRONG_RULES", "TREE_RULES", "WRONG_TREE_RULES",
    "TreeLookupDrafter", "LayerSkipTreeDrafter", "ModelTreeDrafter", "QuantizedSelfDrafter",
    "SamplingParams", "warp", "SpeculativeDecoder", "context_length", "DecodeState", "autoregressive_generate",
    "validate_request",
    "Drafter", "Proposal", "ModelDrafter", "LayerSkipDrafter", "PromptLookupDrafter", "LookupFirstDrafter",
    "CrossTokenizerDrafter",
    "acceptance_rate", "expected_tokens_per_round", "judged_acceptance", "speedup_model",
    "acceptance_by_position", "expected_tokens_by_position", "RULE_INFO", "RuleInfo", "LIBRARY_RULES",
    "NaiveIdDrafter", "EagleDrafter", "EagleHead", "load_eagle_drafter", "early_exit_layers", "DEFAULT_SKIP_LAYERS",
    "DraftSpec", "parse_draft", "make_drafter", "register_draft", "draft_modes",
    "RoundEvent", "GenerationResult", "BaselineResult", "RunStats", "run_stats",
    "load_model", "LoadedModel", "prepare", "speed_layer", "use_speed_layer",
    "BatchDecoder", "BatchEvent", "BatchCosts", "Request",
    "vocab_size", "eagle_recommended_settings", "PROMPT_LOOKUP_MAX_NGRAM", "PROMPT_LOOKUP_MIN_NGRAM",
    "EARLY_EXIT_AFTER", "LAYER_SKIP_MODES", "DraftMode", "Sizing", "drafter_sizing", "not_observed", "startup_sizing",
    "default_model_name",
    "parse_parameter_count", "load_source",
    "hub_source", "hub_offline_reason", "is_offline_available", "OFFLINE_HUB_REASON", "resolve_device", "resolve_dtype",
]


def draft_modes() -> dict:
    """The registered draft modes by name (spec_engine.drafters.registry.DraftMode: builder, label, lesson, ...)."""
    from spec_engine.drafters.registry import MODES_BY_NAME
    return dict(MODES_BY_NAME)


def prepare(model, curve: bool = True) -> None:
    """Build now what the engine would build on first use, so a timed run does not pay it: the speed layer's packed
    weights, and (`curve`) the verify-cost curve that sizes the drafts (measured once per model and thread count)."""
    from spec_engine.drafters.sizing import verify_costs
    speed.active().warm(model)
    if curve:
        verify_costs(model)


def speed_layer() -> str:
    """The active speed layer's name: "cpu", or "off" (SPEC_ENGINE_ACCEL=0: the device-generic code a GPU runs)."""
    return speed.active().name


def use_speed_layer() -> str:
    """Install the speed layer the environment selects, once per process (load_model does it too): the CPU speed
    layer unless SPEC_ENGINE_ACCEL=0, the static KV cache path with SPEC_ENGINE_STATIC=1. Code that runs models it
    did not load with load_model calls this first. Returns the active layer's name."""
    return speed.use_from_env().name


MODEL_NAMES = ("load_model", "LoadedModel", "list_presets", "resolve_preset", "list_pairs", "default_model_name",
               "parse_parameter_count", "load_source", "hub_source", "hub_offline_reason", "is_offline_available",
               "OFFLINE_HUB_REASON", "resolve_device", "resolve_dtype")


def __getattr__(name):
    # models.py pulls in the GGUF machinery; import it only when asked for.
    if name in MODEL_NAMES:
        from spec_engine import models
        return getattr(models, name)
    raise AttributeError(name)
