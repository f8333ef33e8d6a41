"""The CPU speed layer: everything the engine does only to be faster on a CPU, behind the core's one seam.

    lean_llama.py      a second Llama forward that skips transformers' module machinery (fused projections)
    cpu_gemm.py        packed fp32 / bf16 products (MKL, oneDNN, the blocked kernel) with measured per-shape plans
    blocked_gemm.py    the blocked kernel (csrc/blocked_gemm.cpp), compiled on first use
    cpu_attention.py   grouped-query attention without the KV copy
    growing_cache.py   KV cache layers that grow in place instead of concatenating
    searches.py        the sampling searches (csrc/sampling.cpp, else numpy in place)
    native.py          compiling and loading the C++ sources

`CpuSpeedLayer` answers the core's hooks (core/speed.py) with these. `install_from_env()` installs it unless
SPEC_ENGINE_ACCEL=0, which turns every path above off: the core then runs its device-generic torch code, the code a
GPU runs. The finer switches stay for measurements: SPEC_ENGINE_LEAN, SPEC_ENGINE_PACKED_GEMM,
SPEC_ENGINE_BLOCKED_GEMM, SPEC_ENGINE_GEMM_TUNE, SPEC_ENGINE_NATIVE_SEARCH.
"""
from __future__ import annotations

import os

import torch
from transformers import PreTrainedModel

from spec_engine.accel import cpu_attention, cpu_gemm, growing_cache, lean_llama, native_layers, searches
from spec_engine.core import speed


class CpuSpeedLayer(speed.SpeedLayer):
    """The core's hooks answered by the CPU paths; each declines (None) off the CPU or outside its cases."""

    name = "cpu"

    def adopt(self, module) -> str | None:
        packed = cpu_gemm.pack_linears(module)     # fp32 / bf16 CPU layers only: cheaper batched verification
        stacks = [module] if isinstance(module, PreTrainedModel) else \
            [child for child in module.children() if isinstance(child, PreTrainedModel)]   # e.g. the EAGLE head's body
        for stack in stacks:
            cpu_attention.use_engine_attention(stack)     # grouped-query attention without the KV copy
            lean_llama.use_lean_forward(stack)            # Llama on the CPU: skip transformers' module machinery
        return f"batched verification: {packed / 2**20:.0f} MB of linear weights to pack on first use" if packed \
            else None

    def warm(self, module) -> None:
        cpu_gemm.prepack(module)

    def products(self):
        return cpu_gemm.batched_gemm()

    def forward(self, model, input_ids, cache, logits_to_keep: int, feature_layers: tuple[int, ...],
                positions=None, visible=None):
        if not lean_llama.enabled(model):
            return None
        return lean_llama.forward_logits(model, input_ids, cache, logits_to_keep, feature_layers, positions, visible)

    def run_layers(self, stack, embeds, cache, positions=None, visible=None):
        if not lean_llama.enabled(stack):
            return None
        return lean_llama.run_layers(stack, embeds, cache, positions=positions, visible=visible)[0]

    def run_packed(self, model, embeds, caches, starts, sizes, visibles, positions, wanted):
        if not lean_llama.enabled(model):
            return None
        return lean_llama.run_packed(model, embeds, caches, starts, sizes, visibles, positions, wanted)

    def packed_products(self, model):
        return lean_llama.packed_products(model)

    def new_layer(self, layer):
        return growing_cache.growing(layer)

    def move_positions(self, cache, moves):
        return native_layers.move_positions(cache, moves)

    def draft_dtype(self, target_model):
        """bf16 beside an fp32 target on a CPU with bf16 dot products: a draft step reads the head's weights from
        memory, and bf16 halves that (measurements in drafters/eagle.py `head_dtype`)."""
        cpu_fp32 = target_model.dtype == torch.float32 and target_model.device.type == "cpu"
        return torch.bfloat16 if cpu_fp32 and cpu_gemm.bf16_available() else None

    def warp_rows(self, logits, params):
        return searches.warp_rows(logits, params)

    def top_p_rows(self, probs, top_p: float):
        return searches.top_p_rows(probs, top_p)

    def top_entries(self, probs, n: int, members):
        return searches.top_entries(probs, n, members)

    def top_probability(self, logits):
        return searches.top_probability(logits)

    def argmax_rows(self, logits):
        return searches.argmax_rows(logits)

    def sample_at(self, probs, unit, support):
        return searches.sample_at(probs, unit, support)

    def residual(self, target_row, draft_row, support):
        return searches.residual(target_row, draft_row, support)

    def host_reads(self, drafted, draft_probs, target_probs):
        return searches.host_reads(drafted, draft_probs, target_probs)


def enabled_by_env() -> bool:
    return os.environ.get("SPEC_ENGINE_ACCEL", "1") != "0"


def install_from_env() -> speed.SpeedLayer:
    """Install the CPU speed layer unless SPEC_ENGINE_ACCEL=0; returns the active layer."""
    if enabled_by_env() and not isinstance(speed.active(), CpuSpeedLayer):
        speed.install(CpuSpeedLayer())
    return speed.active()


def accelerate(model) -> str | None:
    """Adopt `model` into the active speed layer (what `load_model` does for every model it loads)."""
    return speed.active().adopt(model)
