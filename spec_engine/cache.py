"""KV caches: creation, trimming to the committed text, and the invariant checked every round.

Invariant (both models): the cache holds exactly the committed tokens except the newest one, whose key and
value are computed when the next round feeds it. Rejected and discarded draft positions never survive a
round. Trimming uses transformers' own `Cache.crop` (a negative argument removes that many tokens).

Full-attention layers are `GrowingLayer`s: transformers' DynamicLayer appends by concatenation, copying the whole
layer's keys and values on every forward (at 600 cached tokens of SmolLM2-135M, 27 MB a token); a GrowingLayer
writes into spare room and doubles it when full, so a forward copies only its new positions.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from . import lean_llama
from .cpu_gemm import batched_gemm

MIN_CAPACITY = 64            # positions a GrowingLayer reserves at first


class GrowingLayer(DynamicLayer):
    """transformers' DynamicLayer, appending into a buffer with spare room instead of concatenating.

    `keys` / `values` [B, H, length, D] stay what DynamicLayer exposes (views of the buffer's first `length`
    positions), so its crop, length and mask sizes apply unchanged. `update` writes the new positions after
    them, in place, and reallocates (doubling) only when the buffer is full. Positions a crop dropped are
    overwritten by the next update; nothing outside a forward keeps views of them. When something replaced
    `keys` by another tensor (beam reordering, offloading), the next update starts a new buffer from it.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer = self.value_buffer = None

    def _holds_views(self) -> bool:
        return (self.key_buffer is not None and self.keys.data_ptr() == self.key_buffer.data_ptr()
                and self.values.data_ptr() == self.value_buffer.data_ptr()
                and self.keys.stride() == self.key_buffer.stride())

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length, new = self.get_seq_length(), key_states.shape[-2]
        if not (self._holds_views() and length + new <= self.key_buffer.shape[-2]):
            capacity = max(2 * (length + new), MIN_CAPACITY)
            self.key_buffer = grown(self.keys, key_states, length, capacity)                # [B, Hkv, capacity, D]
            self.value_buffer = grown(self.values, value_states, length, capacity)
        self.key_buffer.narrow(-2, length, new).copy_(key_states)
        self.value_buffer.narrow(-2, length, new).copy_(value_states)
        self.keys = self.key_buffer.narrow(-2, 0, length + new)                              # [B, Hkv, L, D] views
        self.values = self.value_buffer.narrow(-2, 0, length + new)
        return self.keys, self.values


def grown(old: torch.Tensor, like: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
    """A buffer [B, H, capacity, D] shaped like `like` [B, H, n, D], holding old's first `length` positions."""
    buffer = like.new_empty((*like.shape[:-2], capacity, like.shape[-1]))
    if length:
        buffer[..., :length, :] = old[..., :length, :]
    return buffer


def new_cache(model) -> DynamicCache:
    """A dynamic cache laid out for `model` (sliding-window layers included), able to roll back; its full-attention
    layers are GrowingLayers."""
    cache = DynamicCache(config=model.config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    for layer in cache.layers:
        if hasattr(layer, "activate_past_recording"):
            layer.activate_past_recording()   # sliding-window layers must keep the past to be croppable
    return cache


def cache_len(cache) -> int:
    return int(cache.get_seq_length())


def trim_cache(cache, keep: int) -> int:
    """Crop `cache` to its first `keep` positions; returns the number removed."""
    current = cache_len(cache)
    if keep > current:
        raise AssertionError(f"cannot trim a cache of {current} positions up to {keep}")
    if current == 0:
        return 0                 # nothing stored yet (transformers' sliding layers cannot crop before their first update)
    cache.crop(keep - current)   # crop(-n) removes n positions; crop(0) also bounds sliding-window layers
    return current - keep


def check_invariant(cache, expected_len: int, who: str) -> None:
    actual = cache_len(cache)
    if actual != expected_len:
        raise AssertionError(f"{who} KV cache holds {actual} positions, expected {expected_len}")


@torch.inference_mode()
def forward_logits(model, token_ids: list[int], cache, logits_to_keep: int, feature_layers: tuple[int, ...] = ()):
    """Feed `token_ids` after what `cache` holds; returns logits [logits_to_keep, vocab] for the last positions.

    With `feature_layers` (indices into `hidden_states`, -1 = the post-norm final states the LM head reads), also
    returns those hidden states of all fed positions side by side, [n, len(feature_layers) * hidden], for
    drafters that predict from the target's features. Positions are passed explicitly, so views of a model that
    skip layers still place tokens correctly. Models switched to the engine's lean forward run it (lean_llama.py).
    """
    assert token_ids, "forward needs at least one token"
    assert logits_to_keep >= 1   # 0 would mean "all positions" to transformers
    device = model.device
    input_ids = torch.tensor([token_ids], dtype=torch.long, device=device)             # [1, n]
    with batched_gemm():            # packed CPU weights for 4-16 rows, where models were packed (cpu_gemm.py)
        if lean_llama.enabled(model):
            logits, features = lean_llama.forward_logits(model, input_ids, cache, logits_to_keep, feature_layers)
            return (logits, features) if feature_layers else logits
        start = cache_len(cache)
        position_ids = torch.arange(start, start + len(token_ids), device=device)[None]    # [1, n]
        out = model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True,
                    logits_to_keep=logits_to_keep, output_hidden_states=bool(feature_layers))
    if feature_layers:
        features = torch.cat([out.hidden_states[layer][0] for layer in feature_layers], dim=-1)   # [n, F]
        return out.logits[0], features                                                 # [keep, vocab], [n, F]
    return out.logits[0]                                                               # [logits_to_keep, vocab]
