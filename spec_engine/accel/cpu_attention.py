"""Cheaper batched verification on CPU, part two: grouped-query attention without copying the KV cache.

Why this exists (measured here: torch 2.13 CPU, transformers 5.24, one thread, SmolLM2-135M, 9 query heads sharing
3 KV heads): for a forward over several new tokens with a cache, transformers' SDPA path has a mask, and with a
mask it copies every layer's keys and values three times over (`repeat_kv`) before calling
`F.scaled_dot_product_attention`, because some GPU kernels fall back to slow math when given both a mask and
grouped heads. Its one-token path avoids the copy, so plain decoding never pays it and every verify forward does.
On the CPU, torch's SDPA takes the mask and `enable_gqa=True` together with identical results; per layer, 4 queries
over 164 cached positions cost 43 us instead of 79 us, 9 over 300 cost 109 instead of 198 (bench/results/
verify-cost-fp32.md has the whole forward). transformers switches this on only through a process-wide environment
variable (TRANSFORMERS_SDPA_FORCE_GQA), which would also change what the benchmark's Hugging Face baseline runs, so
the engine registers its own attention function instead.

Scoped like the packed weights: it takes the grouped path only inside `cpu_gemm.batched_gemm()` (the engine's own
forwards) and only for CPU tensors with a mask; everything else, Hugging Face `generate` on the same model object
included, runs transformers' stock `sdpa_attention_forward`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from spec_engine.accel import cpu_gemm

ENGINE_ATTENTION = "spec_engine_sdpa"


def engine_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, Hq, n, D], key / value [B, Hkv, L, D],
    attention_mask [B, 1, n, L] (bool) -> ([B, n, Hq, D], None)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if not (cpu_gemm.enabled() and attention_mask is not None and groups > 1 and query.device.type == "cpu"
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, enable_gqa=True)               # [B, Hq, n, D]
    return out.transpose(1, 2).contiguous(), None                                      # [B, n, Hq, D]


AttentionInterface.register(ENGINE_ATTENTION, engine_sdpa_forward)
AttentionMaskInterface.register(ENGINE_ATTENTION, sdpa_mask)       # the same masks as "sdpa"


def use_engine_attention(model) -> bool:
    """Switch a model that runs transformers' "sdpa" attention to the engine's (identical outside the engine's
    forwards); returns whether it was switched. Other implementations (eager, flash) are left alone."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) not in ("sdpa", ENGINE_ATTENTION):
        return False
    if config._attn_implementation != ENGINE_ATTENTION:
        model.set_attn_implementation(ENGINE_ATTENTION)
    return True
