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

    It holds `key_buffer` / `value_buffer` [B, H, capacity, D] and the count of positions cached in them; `keys` /
    `values` read as DynamicLayer's do ([B, H, length, D]: views of the buffers' first positions, made when read,
    so its length and mask sizes apply unchanged). `update` writes the new positions after them, in place, and
    reallocates (doubling) only when the buffer is full. `crop` and `extend` change the count only: a round's trim
    and a compiled forward's append make no tensor views (30 layers' worth was ~0.1 ms a round, and the same again a
    forward, on the offline default). Positions a crop dropped are overwritten by the next update; nothing outside a
    forward keeps views of them. When something assigns `keys` / `values` (beam reordering, offloading, a reset),
    the layer holds those tensors instead, and the next update starts a new buffer from them.
    """

    def __init__(self, **kwargs):
        self._keys = self._values = None
        self.key_buffer = self.value_buffer = None
        self._length: int | None = None     # positions held in the buffers; None: `keys` / `values` are its own
        super().__init__(**kwargs)

    @property
    def keys(self) -> torch.Tensor | None:
        if self._length is not None and self._keys is None:
            self._keys = self.key_buffer.narrow(-2, 0, self._length)
        return self._keys

    @keys.setter
    def keys(self, tensor: torch.Tensor | None) -> None:
        self._keys, self._length = tensor, None            # assigned from outside: no longer the buffer's views

    @property
    def values(self) -> torch.Tensor | None:
        if self._length is not None and self._values is None:
            self._values = self.value_buffer.narrow(-2, 0, self._length)
        return self._values

    @values.setter
    def values(self, tensor: torch.Tensor | None) -> None:
        self._values, self._length = tensor, None

    def in_buffers(self) -> bool:
        """Whether the cache is the buffers' first positions (not tensors assigned from outside)."""
        return self._length is not None

    def _hold(self, length: int) -> None:
        """The buffers' first `length` positions are the cache; views of them are made when read."""
        self._length, self._keys, self._values = length, None, None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.key_buffer = self.value_buffer = None

    def get_seq_length(self) -> int:
        return self._length if self._length is not None else super().get_seq_length()

    def crop(self, tokens_to_remove: int) -> None:
        if self._length is not None and tokens_to_remove < 0:      # DynamicLayer's keys[..., :-n, :], counted
            self._hold(max(self._length + tokens_to_remove, 0))
        else:
            super().crop(tokens_to_remove)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        length, new = self.reserve(key_states, key_states.shape[-2]), key_states.shape[-2]
        self.key_buffer.narrow(-2, length, new).copy_(key_states)
        self.value_buffer.narrow(-2, length, new).copy_(value_states)
        self.extend(new)
        return self.keys, self.values

    def reserve(self, like: torch.Tensor, new: int) -> int:
        """Room for `new` positions after the cached ones in `key_buffer` / `value_buffer` ([B, Hkv, capacity, D],
        shaped like `like` [B, Hkv, *, D] and of its dtype); returns the cached length. A writer fills positions
        length.. of both buffers, then calls `extend(new)` (update does; so do the compiled layers,
        accel/native_layers.py)."""
        if not self.is_initialized:
            self.lazy_initialization(like, like)
        length = self.get_seq_length()
        if not (self._length is not None and length + new <= self.key_buffer.shape[-2]
                and self.key_buffer.dtype == like.dtype):           # a writer of another dtype: converted, once
            capacity = max(2 * (length + new), MIN_CAPACITY)
            self.key_buffer = grown(self.keys, like, length, capacity)                       # [B, Hkv, capacity, D]
            self.value_buffer = grown(self.values, like, length, capacity)
            self._hold(length)
        return length

    def extend(self, new: int) -> None:
        """Take the `new` positions written after the cached ones (see reserve) into the cache."""
        self._hold(self._length + new)


def grown(old: torch.Tensor, like: torch.Tensor, length: int, capacity: int) -> torch.Tensor:
    """A buffer [B, H, capacity, D] shaped like `like` [B, H, n, D], holding old's first `length` positions."""
    buffer = like.new_empty((*like.shape[:-2], capacity, like.shape[-1]))
    if length:
        buffer[..., :length, :] = old[..., :length, :]
    return buffer


def growing(layer):
    """A GrowingLayer in place of a full-attention DynamicLayer (others, such as sliding-window layers, stay)."""
    return GrowingLayer() if type(layer) is DynamicLayer else layer
