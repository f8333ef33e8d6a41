"""The engine's own forward for Llama-architecture models on the CPU: the same weights, the same transformers cache,
a fraction of the tensor operations.

Why this exists (measured here: torch 2.13 CPU, transformers 5.24, one thread, SmolLM2-135M in fp32, 160 cached
tokens): a one-token forward costs ~51.5 ms, of which its 211 matrix products take ~37 ms (the weights read at
~14 GB/s, this core's memory bound). The other ~14 ms are spent around them: transformers' modules issue about
6,300 tensor operations per forward (RMSNorm in seven, the rotary embedding in ten per tensor, mask building,
output capturing, deprecation and checkpointing wrappers), each dispatched on its own. Plain decoding pays that
once per token and speculative decoding once per round, so it is the part of a CPU step an engine can still cut.
torch.compile, the maintained remedy, measured slower here: 73 ms a token after 77 s of compiling, with
DynamicCache breaking the graph and recompiling per layer. So, as gpt-fast does with its own `model.py`, the
engine runs the decoder layers itself: ~25 operations per layer, the same modules' weights (q|k|v and gate|up fused
into one product each, the originals re-pointed at views of the fused weights so nothing is copied; each product
by the kernel cpu_gemm.py picks for its row count), transformers' rotary embedding module and transformers' cache
(`cache.update`, so cropping and the cache invariant are unchanged). A one-token forward then costs ~46 ms: the
layers' products ~34 ms and the LM head's ~8 ms (together ~12.5 GB/s, the memory bound) and ~4.4 ms for everything
else (measured by replacing the products with preallocated outputs), so what is left is mostly the weights' bytes.

Scoped like the engine's other kernels: only `cache.forward_logits` (and the EAGLE head's own steps) take it,
only for models switched on by `use_lean_forward` (load_model does) whose every module is transformers' Llama
class, on the CPU, batch 1; Hugging Face `generate` on the same model object runs transformers' modules, so
the benchmark's baseline stays stock. SPEC_ENGINE_LEAN=0 switches it off, and so does moving or casting the model
after it was switched on (`enabled` checks before every forward that the weights are still the fused ones).
Numerics: equal to transformers' forward within float rounding (|d logit| ~ 2e-5 on the offline default, as for
the packed product); tests/test_lean_llama.py compares logits, hidden states and cache entries.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (LlamaAttention, LlamaDecoderLayer, LlamaMLP, LlamaModel,
                                                      LlamaRMSNorm)

from spec_engine.accel import blocked_gemm, cpu_gemm, native_layers
from spec_engine.accel.cpu_gemm import ENGINE_LINEARS, PackedLinear, product
from spec_engine.core.packed import Products

LEAN_ATTRIBUTE = ENGINE_LINEARS     # cpu_gemm.prepack packs the fused projections stored under it
SDPA_IMPLEMENTATIONS = ("sdpa", "spec_engine_sdpa")   # the lean path computes attention as SDPA does


def unsupported_reason(inner: nn.Module) -> str | None:
    """Why the lean path cannot run `inner` (a LlamaModel, the decoder stack), or None when it can."""
    if not isinstance(inner, LlamaModel):
        return f"{type(inner).__name__} is not a LlamaModel"
    if getattr(inner.config, "_attn_implementation", None) not in SDPA_IMPLEMENTATIONS:
        return f"attention implementation {inner.config._attn_implementation!r} is not SDPA"
    if inner.embed_tokens.weight.device.type != "cpu":
        return "the lean path is for the CPU (on accelerators transformers' forward runs)"
    for layer in inner.layers:
        kinds = (type(layer), type(layer.self_attn), type(layer.mlp), type(layer.input_layernorm),
                 type(layer.post_attention_layernorm))
        if kinds != (LlamaDecoderLayer, LlamaAttention, LlamaMLP, LlamaRMSNorm, LlamaRMSNorm):
            return f"layer {layer.self_attn.layer_idx} has modules other than transformers' Llama ones"
        projections = (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                       layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj)
        if not all(isinstance(p, nn.Linear) and p.weight.is_floating_point() for p in projections):
            return f"layer {layer.self_attn.layer_idx} has quantized projections (transformers' modules run them)"
        if len({attn.bias is None
                for attn in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)}) > 1:
            return f"layer {layer.self_attn.layer_idx} mixes projections with and without bias"
    if type(inner.norm) is not LlamaRMSNorm:
        return "the final norm is not LlamaRMSNorm"
    return None


def fuse_linears(*linears: nn.Linear) -> nn.Linear:
    """One linear layer computing `linears` side by side (their outputs concatenated). Each of them is re-pointed at
    its rows of the fused weight and bias, so the model still holds one copy and transformers' own forward (which
    calls them one by one) computes the same products from the same memory. A PackedLinear's fusion is one too."""
    weight = torch.cat([linear.weight.detach() for linear in linears])                    # [sum of outs, in]
    has_bias = linears[0].bias is not None
    bias = torch.cat([linear.bias.detach() for linear in linears]) if has_bias else None
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    fused.bias = nn.Parameter(bias, requires_grad=False) if has_bias else None
    row = 0
    for linear in linears:
        rows = slice(row, row + linear.out_features)
        linear.weight = nn.Parameter(weight[rows], requires_grad=False)                  # views: no second copy
        if has_bias:
            linear.bias = nn.Parameter(bias[rows], requires_grad=False)
        linear.superseded = True          # prepack leaves it alone: the lean path multiplies by `fused` instead
        row = rows.stop
    if isinstance(linears[0], PackedLinear):
        PackedLinear.wrap(fused)
    return fused


@dataclass(frozen=True)
class LeanLayer:
    """What the lean path needs of one decoder layer beyond its modules, worked out once rather than per forward."""
    qkv_proj: nn.Linear                 # q|k|v in one product
    gate_up_proj: nn.Linear             # gate|up in one product
    kv_heads: int
    act: Callable                       # F.silu itself for SiLU (a function call, not a module call)


class LeanLayers:
    """The fused projections of a decoder stack, by layer. Views of the model that skip layers share it and look
    their layers up."""

    def __init__(self, inner: LlamaModel):
        self.fused = {}
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.fused[layer] = LeanLayer(fuse_linears(attn.q_proj, attn.k_proj, attn.v_proj),
                                          fuse_linears(mlp.gate_proj, mlp.up_proj),
                                          attn.k_proj.out_features // attn.head_dim,
                                          F.silu if mlp.config.hidden_act == "silu" else mlp.act_fn)

    def linears(self) -> list[nn.Linear]:
        return [linear for lean in self.fused.values() for linear in (lean.qkv_proj, lean.gate_up_proj)]

    def current(self, inner: LlamaModel) -> bool:
        """The modules still multiply by views of these fused weights (not so after `model.to(dtype)`, which gives
        the modules new weights and leaves these, held outside the module tree, as they were)."""
        def shares(module: nn.Linear, fused: nn.Linear) -> bool:
            return module.weight.data_ptr() == fused.weight.data_ptr()
        return all(layer in self.fused and shares(layer.self_attn.q_proj, self.fused[layer].qkv_proj)
                   and shares(layer.mlp.gate_proj, self.fused[layer].gate_up_proj) for layer in inner.layers)

    def fresh(self, inner: LlamaModel) -> bool:
        """A cheap `current` (it runs before every forward): the stack's first layer still has its fused projections
        here, and its q_proj still multiplies by a view of them, on the CPU. `model.to(dtype)` or `.to(device)`
        replaces every weight at once, so the first layer tells; `current` checks them all when switching on."""
        if not len(inner.layers):
            return True
        layer = inner.layers[0]
        lean = self.fused.get(layer)
        weight = layer.self_attn.q_proj.weight
        return (lean is not None and weight.device.type == "cpu"
                and weight.data_ptr() == lean.qkv_proj.weight.data_ptr())


def use_lean_forward(model: nn.Module) -> bool:
    """Switch the engine's forwards of `model` (a LlamaForCausalLM, or a LlamaModel such as the EAGLE head's body)
    to the lean path, fusing its projections; returns whether it is switched (False, and nothing changed, for
    anything unsupported). Idempotent; fuses again if the model's weights were replaced since (e.g. `.to(dtype)`)."""
    inner = getattr(model, "model", model)
    if unsupported_reason(inner) is not None:
        return False
    lean = getattr(model, LEAN_ATTRIBUTE, None)
    if lean is None or not lean.current(inner):
        setattr(model, LEAN_ATTRIBUTE, LeanLayers(inner))
    return True


def lean_layers(model: nn.Module) -> LeanLayers | None:
    """The fused projections of a model switched on by `use_lean_forward`, or None."""
    return getattr(model, LEAN_ATTRIBUTE, None)


def enabled(model: nn.Module) -> bool:
    """`model` was switched on by `use_lean_forward`, its weights are still the ones fused then, and SPEC_ENGINE_LEAN
    is not 0. A model moved or cast since (`model.to(torch.float64)`, `.to("cuda")`, `.to("meta")`) has new weights
    that the fused projections no longer share: its switch is dropped here (freeing the old fused weights), so its
    forwards run transformers' modules on whatever the model now holds; `use_lean_forward` switches it on again."""
    lean = lean_layers(model)
    if lean is None or os.environ.get("SPEC_ENGINE_LEAN", "1") == "0":
        return False
    if lean.fresh(getattr(model, "model", model)):
        return True
    model.__dict__.pop(LEAN_ATTRIBUTE, None)      # stale: never multiply by the old weights (pop: threads may race)
    return False


def rms_norm(norm: LlamaRMSNorm, x: torch.Tensor) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic (normalise in float32, cast back, then scale) in torch's fused kernel."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)
    return norm.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=norm.variance_epsilon).to(x.dtype)


def project(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """linear(x) by the kernel cpu_gemm picks for its shape and row count, without a module call (which costs more
    here than the dispatch itself)."""
    return product(linear, x)


def attention(attn: LlamaAttention, lean: LeanLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              mask: torch.Tensor | None, cache) -> torch.Tensor:
    """x [1, n, H] -> the attention block's output [1, n, H]; appends the n new keys and values to `cache`.
    cos [1, n, 1, D] and sin [1, n, 1, D], its first half negated: the rotary embedding in transformers' half-split
    layout (x * cos + rotate_half(x) * sin, with rotate_half(x) * sin = swap_halves(x) * signed sin), applied to
    queries and keys at once (split and chunk rather than indexing: fewer operations)."""
    kv_heads = lean.kv_heads
    qkv = project(lean.qkv_proj, x).unflatten(-1, (-1, attn.head_dim))                          # [1, n, Hq + 2 Hkv, D]
    # [1, n, Hq + Hkv, D], [1, n, Hkv, D]
    qk, value = qkv.split([qkv.shape[2] - kv_heads, kv_heads], dim=2)
    first, second = qk.chunk(2, dim=-1)                                               # [1, n, Hq + Hkv, D / 2]
    qk = torch.addcmul(qk * cos, torch.cat((second, first), dim=-1), sin)
    query, key = qk.split([qk.shape[2] - kv_heads, kv_heads], dim=2)
    key, value = cache.update(key.transpose(1, 2), value.transpose(1, 2), attn.layer_idx)   # [1, Hkv, L, D]
    out = F.scaled_dot_product_attention(query.transpose(1, 2), key, value, attn_mask=mask, scale=attn.scaling,
                                         enable_gqa=query.shape[2] != key.shape[1])    # [1, Hq, n, D]
    return project(attn.o_proj, out.transpose(1, 2).flatten(-2))                     # [1, n, H]


def mlp(block: LlamaMLP, lean: LeanLayer, x: torch.Tensor) -> torch.Tensor:
    """x [1, n, H] -> down(act(gate(x)) * up(x)) [1, n, H], gate and up in one product."""
    gate, up = project(lean.gate_up_proj, x).chunk(2, dim=-1)                        # [1, n, I] each
    return project(block.down_proj, lean.act(gate) * up)


STATIC_ROPE = ("default", "linear", "llama3")    # rotary types whose tables depend on the position alone
ROTARY_TABLE_MIN = 256                              # positions a rotary table covers at first (it doubles as needed)


def rotary(module: nn.Module, dtype: torch.dtype, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' rotary embedding (cos, sin [1, n, D] in `dtype`) of positions [n], read from a table that
    `module` computed once for positions 0.. (kept on it, per dtype, doubled when a position is past its end).
    Each entry is a function of its position alone, so the numbers are bit for bit the module's own
    (tests/test_lean_llama.py); what this saves is the module's ten-odd operations a forward (in the decode loop
    53 -> 32 us), once per target forward and per head forward.
    Rotary types that rescale with the sequence length (dynamic, YaRN...) are computed as the module computes them."""
    if getattr(module, "rope_type", "default") not in STATIC_ROPE or positions.device.type != "cpu":
        probe = torch.empty(0, dtype=dtype, device=positions.device)
        return module(probe, positions[None])
    tables = module.__dict__.setdefault("_spec_engine_rotary", {})  # dtype -> (cos, sin [1, P, D], the inv_freq used)
    need = int(positions.max()) + 1
    table = tables.get(dtype)
    if table is None or table[0].shape[1] < need or table[2] is not module.inv_freq:
        size = max(ROTARY_TABLE_MIN, 2 * need)
        cos, sin = module(torch.empty(0, dtype=dtype), torch.arange(size)[None])
        table = tables[dtype] = (cos, sin, module.inv_freq)
    return table[0][:, positions], table[1][:, positions]


def run_layers(inner: LlamaModel, embeds: torch.Tensor, cache, state_indices=(),
               lean: LeanLayers | None = None, positions: torch.Tensor | None = None,
               visible: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The decoder stack over embeds [1, n, H] placed after what `cache` holds -> (final post-norm states [1, n, H],
    {index: hidden state [1, n, H]} for `state_indices`). Indices are transformers' `hidden_states` ones, counted
    from 0 (the embeddings; i is the output of layer i - 1, the layer count the post-norm final states, as -1 is)
    and returned so. `lean`: the fused projections (those of `inner`'s own switch when None). A token tree gives
    its rotary positions [n] and its visibility [n, start + n] (bool, core/cache.py `tree_visibility`); a run of
    consecutive tokens gives neither (positions follow the cache, the mask is causal)."""
    assert embeds.dim() == 3 and embeds.shape[0] == 1, f"the lean path runs one sequence, got {tuple(embeds.shape)}"
    lean = lean or lean_layers(inner)
    n, last = embeds.shape[1], len(inner.layers)
    wanted = {index % (last + 1) for index in state_indices}
    start = int(cache.get_seq_length())
    if positions is None:
        positions = torch.arange(start, start + n, device=embeds.device)              # [n]
    cos, sin = rotary(inner.rotary_emb, embeds.dtype, positions)                      # [1, n, D] each
    if visible is not None:
        assert visible.shape == (n, start + n) and visible.dtype == torch.bool, (tuple(visible.shape), start, n)
    compiled = native_layers.run(inner, lean, embeds, cache, start, cos, sin, visible, wanted)
    if compiled is not None:                    # every layer in one compiled call (fp32, blocked products)
        hidden, states = compiled
        hidden = rms_norm(inner.norm, hidden)
        if last in wanted:
            states[last] = hidden
        return hidden, states
    half = sin.shape[-1] // 2
    cos, sin = cos[:, :, None], torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)[:, :, None]   # [1, n, 1, D]
    # One query attends to every cached key; several need the causal mask, offset by the cache: [n, start + n].
    # A tree brings its own: [n, start + n].
    if visible is not None:
        mask = visible
    else:
        mask = None if n == 1 else torch.arange(start + n, device=embeds.device) <= positions[:, None]
    hidden, states = embeds, {}
    for i, layer in enumerate(inner.layers):
        if i in wanted:
            states[i] = hidden
        fused = lean.fused[layer]
        hidden = hidden + attention(layer.self_attn, fused, rms_norm(layer.input_layernorm, hidden), cos, sin,
                                    mask, cache)
        hidden = hidden + mlp(layer.mlp, fused, rms_norm(layer.post_attention_layernorm, hidden))
    hidden = rms_norm(inner.norm, hidden)
    if last in wanted:
        states[last] = hidden
    return hidden, states


def forward_logits(model, input_ids: torch.Tensor, cache, logits_to_keep: int, feature_layers: tuple[int, ...] = (),
                   positions: torch.Tensor | None = None,
                   visible: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What `cache.forward_logits` (or, given a tree's positions and visibility, `cache.forward_tree_logits`)
    computes, on the lean path: input_ids [1, n] -> (logits [logits_to_keep, vocab], the `feature_layers` hidden
    states side by side [n, len(feature_layers) * H], or None)."""
    inner = model.model
    final, states = run_layers(inner, inner.embed_tokens(input_ids), cache, feature_layers, lean_layers(model),
                               positions=positions, visible=visible)
    logits = model.lm_head(final[:, -logits_to_keep:])                                 # [1, keep, vocab]
    count = len(inner.layers) + 1
    features = torch.cat([states[i % count][0] for i in feature_layers], dim=-1) if feature_layers else None
    return logits[0], features


def run_packed(model, embeds: torch.Tensor, caches: list, starts: list[int], sizes: list[int], visibles: list,
               positions: torch.Tensor, wanted: set[int]) -> tuple[torch.Tensor, dict] | None:
    """core/packed.py's stack over many sequences' rows (speed.SpeedLayer.run_packed) in one compiled call
    (native_layers.run_packed), with the final norm; None where that call declines (the packed loop runs, with
    LeanProducts)."""
    inner = getattr(model, "model", model)                                           # a causal LM, or a bare stack
    cos, sin = rotary(inner.rotary_emb, embeds.dtype, positions)                      # [1, N, D] each
    compiled = native_layers.run_packed(inner, lean_layers(model), embeds, caches, starts, sizes, visibles, cos, sin,
                                        wanted)
    if compiled is None:
        return None
    hidden, states = compiled
    hidden = rms_norm(inner.norm, hidden)
    last = len(inner.layers)
    if last in wanted:
        states[last] = hidden
    return hidden, states


def rowwise(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """linear(x) by the blocked kernel wherever it serves this fp32 weight, whatever kernel cpu_gemm's plan picks
    for the row count: its rows' numbers do not depend on the other rows (a plan may pick F.linear or oneDNN for a
    block of 32 rows, whose rows differ from a lone one-row product in the last bits); else as `project`."""
    if (cpu_gemm.enabled() and isinstance(linear, PackedLinear) and x.dtype == torch.float32 == linear.weight.dtype
            and x.device.type == "cpu" and blocked_gemm.kernel() is not None and not torch.is_grad_enabled()):
        return blocked_gemm.product(x, linear.packed_weight("blocked"), linear.bias, linear.out_features)
    return project(linear, x)


class LeanProducts(Products):
    """The products of core/packed.py's many-sequence forward on the lean path: q|k|v and gate|up fused, every
    product by the blocked kernel where it serves (`rowwise`: its many-row tiles), RMSNorm in torch's fused kernel.
    Row-independent kernels: a row's numbers do not depend on the other rows of the batch."""

    def __init__(self, lean: LeanLayers):
        self.lean = lean

    def qkv(self, attn, x):
        fused = self.lean.fused[self._layers[attn.layer_idx]]
        qkv = rowwise(fused.qkv_proj, x)                                               # [1, N, (Hq + 2 Hkv) D]
        kv = fused.kv_heads * attn.head_dim
        return qkv.split([qkv.shape[-1] - 2 * kv, kv, kv], dim=-1)

    def out(self, attn, x):
        return rowwise(attn.o_proj, x)

    def mlp(self, block, x):
        lean = self._mlps[block]
        gate, up = rowwise(lean.gate_up_proj, x).chunk(2, dim=-1)                        # [1, N, I] each
        return rowwise(block.down_proj, lean.act(gate) * up)

    def norm(self, module, x):
        return rms_norm(module, x)

    def head(self, model, x):
        return rowwise(model.lm_head, x)

    def bind(self, inner: LlamaModel) -> "LeanProducts":
        self._layers = list(inner.layers)
        self._mlps = {layer.mlp: self.lean.fused[layer] for layer in inner.layers}
        return self


def packed_products(model) -> LeanProducts | None:
    """LeanProducts for a model switched on by `use_lean_forward` (and still fresh), else None."""
    if not enabled(model):
        return None
    return LeanProducts(lean_layers(model)).bind(getattr(model, "model", model))
