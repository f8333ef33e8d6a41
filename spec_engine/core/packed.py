"""One target forward for many sequences: their new rows packed side by side, each attending only to its own cache.

Batching shares one read of the weights across sequences, as speculation shares one across future positions of one
sequence. A round of the batched engine (core/batch.py) feeds, for every sequence, its [last committed, drafts...]
rows (a chain, a tree, or a prompt to prefill) after that sequence's own KV cache. The products (q|k|v, o, the MLP,
the LM head) run once over all N packed rows: one weight read for the whole batch. Attention runs per sequence
against its own cache, with its own mask (causal for a chain, the tree's visibility for a tree), so no row sees
another sequence's keys. Nothing is padded: a sequence of 1 row costs 1 row (vLLM packs ragged drafts the same way,
`cu_num_draft_tokens`).

Why hand-written: transformers' forward takes one cache for the whole batch, [B, heads, L, D], padded to the longest
sequence and cropped for all rows at once (`DynamicCache.crop`), while here each sequence trims its own rejected
positions every round. So the decoder layers are run here, by the modules' own weights, for the Llama-family layout
(Llama, Qwen2, Mistral: pre-norm, rotary, q/k/v/o, gated MLP); `packed_support` says what else falls back to one
forward per sequence (still correct, not batched). A speed layer may supply faster products (core/speed.py
`packed_products`); the arithmetic is otherwise this file's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from spec_engine.core import speed
from spec_engine.core.cache import cache_len, forward_logits, forward_tree_logits, tree_visibility

PACKED_MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class Segment:
    """One sequence's rows in a packed forward: `tokens` fed after what `cache` holds; logits come back for the last
    `keep` rows. A tree, tokens [root, node 0..n-1], gives each node's parent and depth (core/cache.py
    `forward_tree_logits`); a run of consecutive tokens gives neither (positions follow the cache, the mask is
    causal)."""
    tokens: list[int]
    cache: object
    keep: int
    parents: list[int] | None = None            # [n] a tree's parents (-1: the root)
    depths: list[int] | None = None             # [n] a tree's depths (the root's children: 1)

    def rows(self, start: int, device) -> tuple[list[int], torch.Tensor | None]:
        """(positions [len(tokens)], what each row sees [len(tokens), start + len(tokens)] bool or None: a single
        row of a chain sees everything cached)."""
        n = len(self.tokens)
        if self.parents is not None:
            return [start] + [start + d for d in self.depths], tree_visibility(self.parents, start, device)
        positions = list(range(start, start + n))
        if n == 1:
            return positions, None
        rows = torch.arange(start, start + n, device=device)[:, None]                          # [n, 1]
        return positions, torch.arange(start + n, device=device)[None] <= rows                  # [n, start + n]


class Products:
    """The products of a decoder layer, by its modules (the device-generic code). A speed layer may give a subclass
    that multiplies the same weights faster (fused q|k|v, packed kernels)."""

    def qkv(self, attn, x):                 # x [1, N, H] -> q [1, N, Hq * D], k and v [1, N, Hkv * D]
        return attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)

    def out(self, attn, x):                 # [1, N, Hq * D] -> [1, N, H]
        return attn.o_proj(x)

    def mlp(self, block, x):                # [1, N, H] -> [1, N, H]
        return block(x)

    def norm(self, module, x):
        return module(x)

    def head(self, model, x):               # [1, R, H] -> [1, R, vocab]
        return model.lm_head(x)


def packed_support(model) -> str | None:
    """Why `model` (a causal LM, or a bare decoder stack such as the EAGLE head's body) cannot run a packed forward
    (then each sequence gets its own forward), or None."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in PACKED_MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {PACKED_MODEL_TYPES}"
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return "sliding-window attention layers"
    inner = getattr(model, "model", model)
    if not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "no decoder stack with a rotary embedding (at model.model, or the model itself)"
    return None


@torch.inference_mode()
def forward_packed(model, segments: list[Segment], feature_layers: tuple[int, ...] = ()) -> list:
    """Every segment's logits [keep, vocab] (with `feature_layers`: (logits, features [n, F]) as
    cache.forward_logits gives them) from one pass over all rows; each segment's cache gains its rows. A model the
    packed pass does not cover (`packed_support`), or a single segment, runs the single-sequence forward per segment:
    the same code a lone run takes, so a batch of one is that run."""
    assert segments and all(segment.tokens for segment in segments), "every segment needs at least one row"
    if len(segments) == 1 or packed_support(model) is not None:
        return [one_forward(model, segment, feature_layers) for segment in segments]
    products = speed.active().packed_products(model) or Products()
    inner, device = model.model, model.device
    ids = torch.tensor([[t for segment in segments for t in segment.tokens]], dtype=torch.long, device=device)
    last = len(inner.layers)
    wanted = {index % (last + 1) for index in feature_layers}
    bounds = torch.tensor([0] + [len(segment.tokens) for segment in segments]).cumsum(0).tolist()   # [S + 1]
    with speed.active().products():
        hidden = inner.embed_tokens(ids)                                                   # [1, N, H]
        hidden, states = run_stack(model, hidden, segments, wanted, products)
        kept = torch.cat([torch.arange(bounds[s + 1] - segment.keep, bounds[s + 1])
                          for s, segment in enumerate(segments)]).to(device)               # [R]
        logits = products.head(model, hidden[:, kept])[0]                                  # [R, vocab]: one read
    out, row = [], 0
    for s, segment in enumerate(segments):
        seg_logits = logits[row:row + segment.keep]
        row += segment.keep
        if feature_layers:
            rows = slice(bounds[s], bounds[s + 1])
            out.append((seg_logits, torch.cat([states[i % (last + 1)][0, rows] for i in feature_layers], dim=-1)))
        else:
            out.append(seg_logits)
    return out


def run_stack(model, hidden: torch.Tensor, segments: list[Segment], wanted: set[int] = frozenset(),
              products: Products | None = None) -> tuple[torch.Tensor, dict]:
    """The decoder stack of `model` (a causal LM's, at model.model, or a bare stack: the EAGLE head's body) over
    packed rows hidden [1, N, H], segment s's rows after what its cache holds -> (post-norm final states [1, N, H],
    {index: state} for `wanted`); each cache gains its segment's rows. The speed layer's compiled pass where it
    applies, else the loop below (`packed_support` must hold)."""
    inner, device = getattr(model, "model", model), hidden.device
    starts = [cache_len(segment.cache) for segment in segments]
    sizes = [len(segment.tokens) for segment in segments]
    assert sum(sizes) == hidden.shape[1], (sizes, tuple(hidden.shape))
    bounds = torch.tensor([0] + sizes).cumsum(0).tolist()                                  # row offsets, [S + 1]
    laid = [segment.rows(start, device) for segment, start in zip(segments, starts)]
    positions = torch.tensor([p for rows, _ in laid for p in rows], dtype=torch.long, device=device)   # [N]
    masks = [visible for _, visible in laid]
    ran = speed.active().run_packed(model, hidden, [segment.cache for segment in segments], starts, sizes, masks,
                                    positions, wanted)
    if ran is not None:
        return ran
    products = products or speed.active().packed_products(model) or Products()
    return run_layers(inner, products, hidden, positions, segments, bounds, masks, wanted)


def run_layers(inner, products: Products, hidden: torch.Tensor, positions: torch.Tensor, segments: list[Segment],
               bounds: list[int], masks: list, wanted: set[int]) -> tuple[torch.Tensor, dict]:
    """The decoder stack over packed rows hidden [1, N, H] -> (post-norm final states [1, N, H], {index: state}),
    each segment's rows attending to its own cache (`attend`)."""
    cos, sin = inner.rotary_emb(hidden, positions[None])                                   # [1, N, D] each
    last, states = len(inner.layers), {}
    for i, layer in enumerate(inner.layers):
        if i in wanted:
            states[i] = hidden
        normed = products.norm(layer.input_layernorm, hidden)
        hidden = hidden + products.out(layer.self_attn, attend(layer.self_attn, products, normed, cos, sin,
                                                               segments, bounds, masks))
        hidden = hidden + products.mlp(layer.mlp, products.norm(layer.post_attention_layernorm, hidden))
    hidden = products.norm(inner.norm, hidden)
    states[last] = hidden
    return hidden, states


def attend(attn, products: Products, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[Segment],
           bounds: list[int], masks: list) -> torch.Tensor:
    """The attention block over packed rows x [1, N, H] -> [1, N, Hq * D] (before o_proj). Queries, keys and values
    of all rows come from one product; each segment's keys and values are appended to its own cache, and its queries
    attend to that cache alone under its mask."""
    head_dim = attn.head_dim
    query, key, value = products.qkv(attn, x)
    query = query.unflatten(-1, (-1, head_dim)).transpose(1, 2)                            # [1, Hq, N, D]
    key = key.unflatten(-1, (-1, head_dim)).transpose(1, 2)                                # [1, Hkv, N, D]
    value = value.unflatten(-1, (-1, head_dim)).transpose(1, 2)
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    outs = []
    for s, segment in enumerate(segments):
        rows = slice(bounds[s], bounds[s + 1])
        keys, values = segment.cache.update(key[:, :, rows], value[:, :, rows], attn.layer_idx)   # [1, Hkv, L, D]
        outs.append(F.scaled_dot_product_attention(query[:, :, rows], keys, values, attn_mask=masks[s],
                                                   scale=attn.scaling, enable_gqa=query.shape[1] != keys.shape[1]))
    return torch.cat(outs, dim=2).transpose(1, 2).flatten(-2)                              # [1, N, Hq * D]


def one_forward(model, segment: Segment, feature_layers: tuple[int, ...]):
    """A segment through the single-sequence forwards (cache.py), as a lone run feeds it."""
    if segment.parents is None:
        return forward_logits(model, segment.tokens, segment.cache, segment.keep, feature_layers)
    assert segment.keep == len(segment.tokens)
    root, *nodes = segment.tokens
    return forward_tree_logits(model, root, nodes, segment.parents, segment.depths, segment.cache, feature_layers)
