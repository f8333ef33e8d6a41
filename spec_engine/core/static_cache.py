"""A static KV cache path (issue #61, first step): preallocated keys and values per layer, trimmed by length.

A `StaticLayer` stands in for transformers' full-attention DynamicLayer. Its buffers [B, Hkv, capacity, D] are
allocated once, at the first update, for `capacity` positions, and never move or grow: `keys` / `values` read as
views of their first `length` positions (so transformers' masks and core/cache.py's crop, invariant check and
keep_path work unchanged), `update` copies new positions in place, and `crop` changes the count only. Fixed buffer
addresses are what a captured forward (a CUDA graph, torch.compile's "reduce-overhead") needs; a forward past the
capacity raises a ValueError naming the capacity instead of reallocating.

Verify widths are bucketed by `bucket` (1, 2, 4, 8, 16, 32 rows) so that a captured forward can be reused for
every width of a bucket; padding trees with masked rows is not wired into the engine yet (see docs/benchmarks.md,
"Static cache and compiled forwards").

Selected by `use(capacity)` (a context manager installing `StaticSpeedLayer`) or SPEC_ENGINE_STATIC=1 through
`install_from_env`; the default path is untouched. The static layer runs the core's device-generic forward (it wraps
a plain core.speed.SpeedLayer, whose hooks all decline), since the CPU speed layer's compiled layers write into
their own growing buffers.
"""
from __future__ import annotations

import contextlib
import os

import torch
from transformers.cache_utils import DynamicLayer

from spec_engine.core import speed

BUCKETS = (1, 2, 4, 8, 16, 32)
DEFAULT_CAPACITY = 2048      # positions per layer: the app's context limit


def bucket(rows: int) -> int:
    """The smallest verify width of BUCKETS holding `rows` rows."""
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive integer, got {rows!r}")
    for width in BUCKETS:
        if rows <= width:
            return width
    raise ValueError(f"rows={rows} is more than the largest verify bucket ({BUCKETS[-1]})")


class StaticLayer(DynamicLayer):
    """A full-attention KV cache layer over buffers preallocated for `capacity` positions (see the module text)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, **kwargs):
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        self.capacity = capacity
        self.key_buffer = self.value_buffer = None
        self.length = 0
        super().__init__(**kwargs)

    # keys / values: views of the buffers' first `length` positions (None before the first update)
    @property
    def keys(self):
        return None if self.key_buffer is None else self.key_buffer.narrow(-2, 0, self.length)

    @keys.setter
    def keys(self, tensor):
        if tensor is not None:
            raise TypeError("a StaticLayer's keys live in its preallocated buffer and cannot be replaced")

    @property
    def values(self):
        return None if self.value_buffer is None else self.value_buffer.narrow(-2, 0, self.length)

    @values.setter
    def values(self, tensor):
        if tensor is not None:
            raise TypeError("a StaticLayer's values live in its preallocated buffer and cannot be replaced")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = (*key_states.shape[:-2], self.capacity, key_states.shape[-1])      # [B, Hkv, capacity, D]
        self.key_buffer = key_states.new_zeros(shape)
        self.value_buffer = value_states.new_zeros((*value_states.shape[:-2], self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    def crop(self, tokens_to_remove: int) -> None:
        """As DynamicLayer.crop: crop(-n) removes n positions, crop(0) nothing; only the count changes."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        self.length = max(self.length + tokens_to_remove, 0)

    def reset(self) -> None:
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self.length + new > self.capacity:
            raise ValueError(f"the static KV cache holds capacity={self.capacity} positions; {self.length} cached "
                             f"and {new} more do not fit (raise the capacity)")
        self.key_buffer.narrow(-2, self.length, new).copy_(key_states)
        self.value_buffer.narrow(-2, self.length, new).copy_(value_states)
        self.length += new
        return self.keys, self.values


class StaticSpeedLayer(speed.SpeedLayer):
    """The core's device-generic code with StaticLayer caches in place of full-attention DynamicLayers."""

    name = "static"

    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        StaticLayer(capacity)                 # checks the capacity now, not at the first cache
        self.capacity = capacity

    def new_layer(self, layer):
        return StaticLayer(self.capacity) if type(layer) is DynamicLayer else layer


@contextlib.contextmanager
def use(capacity: int = DEFAULT_CAPACITY):
    """Run the block on the static path (caches made inside it are static)."""
    previous = speed.install(StaticSpeedLayer(capacity))
    try:
        yield
    finally:
        speed.install(previous)


def enabled_by_env() -> bool:
    value = os.environ.get("SPEC_ENGINE_STATIC", "0")
    if value not in ("0", "1"):
        raise ValueError(f"SPEC_ENGINE_STATIC must be 0 or 1, got {value!r}")
    return value == "1"


def install_from_env() -> speed.SpeedLayer:
    """Install the static path when SPEC_ENGINE_STATIC=1; returns the active layer."""
    if enabled_by_env() and not isinstance(speed.active(), StaticSpeedLayer):
        speed.install(StaticSpeedLayer())
    return speed.active()
