"""KV cache layers that grow in place.

transformers' DynamicLayer appends by concatenation, copying the whole layer's keys and values on every forward (at
600 cached tokens of SmolLM2-135M, 27 MB a token); a GrowingLayer writes into spare room and doubles it when full,
so a forward copies only its new positions. The speed layer puts one in place of every full-attention DynamicLayer
(core/speed.py `new_layer`).
"""
from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

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
        length, new = self.reserve(key_states, key_states.shape[-2]), key_states.shape[-2]
        self.key_buffer.narrow(-2, length, new).copy_(key_states)
        self.value_buffer.narrow(-2, length, new).copy_(value_states)
        return self.extend(new)

    def reserve(self, like: torch.Tensor, new: int) -> int:
        """Room for `new` positions after the cached ones in `key_buffer` / `value_buffer` ([B, Hkv, capacity, D],
        shaped like `like` [B, Hkv, *, D] and of its dtype); returns the cached length. A writer fills positions length.. of both
        buffers, then calls `extend(new)` (update does; so do the compiled layers, accel/native_layers.py)."""
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        length = self.get_seq_length()
        if not (self._holds_views() and length + new <= self.key_buffer.shape[-2]
                and self.key_buffer.dtype == like.dtype):           # a writer of another dtype: converted, once
            capacity = max(2 * (length + new), MIN_CAPACITY)
            self.key_buffer = grown(self.keys, like, length, capacity)                       # [B, Hkv, capacity, D]
            self.value_buffer = grown(self.values, like, length, capacity)
        return length

    def extend(self, new: int):
        """Take the `new` positions written after the cached ones (see reserve) into the cache."""
        length = self.get_seq_length()
        self.keys = self.key_buffer.narrow(-2, 0, length + new)                              # [B, Hkv, L, D] views
        self.values = self.value_buffer.narrow(-2, 0, length + new)
        return self.keys, self.values


def grown(old: torch.Tensor, like: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
    """A buffer [B, H, capacity, D] shaped like `like` [B, H, n, D], holding old's first `length` positions."""
    buffer = like.new_empty((*like.shape[:-2], capacity, like.shape[-1]))
    if length:
        buffer[..., :length, :] = old[..., :length, :]
    return buffer


def growing(layer):
    """A GrowingLayer in place of a full-attention DynamicLayer (others, such as sliding-window layers, stay)."""
    return GrowingLayer() if type(layer) is DynamicLayer else layer
