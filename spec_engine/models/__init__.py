"""Models: the presets catalog (presets.py: presets/models.yaml, and whether each can be loaded here) and loading
(loading.py: packaged GGUF, local paths and Hub ids). No kernel setup happens here."""
from spec_engine.models.loading import (FP32_MAX_PARAMETERS, LoadedModel, check_quantization, load_model, locate_gguf,
                                        parameter_count, resolve_device, resolve_dtype)
from spec_engine.models.presets import (CROSS_TOKENIZER_MODES, DEFAULT_MODEL, OFFLINE_HUB_REASON, PRESET_KINDS,
                                        QUANTIZATIONS, SELF_DRAFTS, ModelLoadError, ModelPair, ModelPreset,
                                        default_model_name, hub_cached, hub_offline_reason, hub_source,
                                        is_offline_available, list_pairs, list_presets, load_source,
                                        parse_parameter_count, presets_path, resolve_preset)

__all__ = ["FP32_MAX_PARAMETERS", "LoadedModel", "check_quantization", "load_model", "locate_gguf", "parameter_count",
           "parse_parameter_count", "resolve_device", "resolve_dtype",
           "CROSS_TOKENIZER_MODES", "DEFAULT_MODEL", "OFFLINE_HUB_REASON", "PRESET_KINDS", "QUANTIZATIONS",
           "SELF_DRAFTS", "ModelLoadError", "ModelPair", "ModelPreset", "default_model_name", "hub_cached",
           "hub_offline_reason", "hub_source", "is_offline_available", "load_source", "list_pairs", "list_presets",
           "presets_path", "resolve_preset"]
