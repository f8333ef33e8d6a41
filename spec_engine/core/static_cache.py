"""A static KV cache path: preallocated keys and values per layer, trimmed by length, and fixed-shape forwards.

A `StaticLayer` stands in for transformers' full-attention DynamicLayer. Its buffers [B, Hkv, capacity, D] are
allocated once, at the first update, for `capacity` positions, and never move or grow: `keys` / `values` read as
views of their first `length` positions (so transformers' masks and core/cache.py's crop, invariant check and
keep_path work unchanged), `update` copies new positions in place, and `crop` changes the count only. A forward past
the capacity raises a ValueError naming the capacity instead of reallocating.

With `fixed=True` (`use(capacity, fixed=True)`, SPEC_ENGINE_STATIC=fixed) every forward of at most BUCKETS[-1] rows
runs at a fixed shape: its rows padded to the next bucket (1, 2, 4, 8, 16, 32), the padded rows written to the
slots after the real ones and seen by no real row, attention taken over the whole capacity under a mask. Only the
real rows enter the count `length`, so a padded row never survives a round and never changes a real row's result.
Every input that varies between rounds is then a tensor of fixed shape, so one compiled or captured forward per
bucket serves every round (core/captured.py: a CUDA graph on CUDA, eager or inductor on the CPU). Longer forwards
(a prompt's prefill) and caches with other layers (sliding windows) take the generic path.

Selected by `use(capacity)` (a context manager installing `StaticSpeedLayer`) or SPEC_ENGINE_STATIC through
`install_from_env`; the default path is untouched. The static layer runs the core's device-generic forward (it wraps
a plain core.speed.SpeedLayer, whose hooks all decline), since the CPU speed layer's compiled layers write into
their own growing buffers.
"""
from __future__ import annotations

import contextlib
import os

import torch
from transformers.cache_utils import DynamicLayer

from spec_engine.core import captured, speed
from spec_engine.core.cache import additive_mask

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
        self.slots = None        # [W] cache slots of a fixed-shape forward's rows, set only around that forward
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
        if self.slots is not None:       # a fixed-shape forward: rows to their slots, the whole buffers attended
            self.key_buffer.index_copy_(-2, self.slots, key_states)
            self.value_buffer.index_copy_(-2, self.slots, value_states)
            return self.key_buffer, self.value_buffer
        new = key_states.shape[-2]
        if self.length + new > self.capacity:
            raise ValueError(f"the static KV cache holds capacity={self.capacity} positions; {self.length} cached "
                             f"and {new} more do not fit (raise the capacity)")
        self.key_buffer.narrow(-2, self.length, new).copy_(key_states)
        self.value_buffer.narrow(-2, self.length, new).copy_(value_states)
        self.length += new
        return self.keys, self.values


class StaticSpeedLayer(speed.SpeedLayer):
    """The core's device-generic code with StaticLayer caches in place of full-attention DynamicLayers, and with
    `fixed`, forwards of at most BUCKETS[-1] rows at fixed shapes (see the module text)."""

    name = "static"

    def __init__(self, capacity: int = DEFAULT_CAPACITY, fixed: bool = False, compile_cpu: bool = False):
        StaticLayer(capacity)                 # checks the capacity now, not at the first cache
        self.capacity, self.fixed, self.compile_cpu = capacity, fixed, compile_cpu
        self.runners: dict = {}               # device type -> the fixed-shape runner (core/captured.py)
        if fixed:
            self.name = "static-fixed"

    def new_layer(self, layer):
        return StaticLayer(self.capacity) if type(layer) is DynamicLayer else layer

    def runner(self, device: torch.device):
        if device.type not in self.runners:
            self.runners[device.type] = captured.runner_for(device, self.compile_cpu)
        return self.runners[device.type]

    def forward(self, model, input_ids, cache, logits_to_keep: int, feature_layers: tuple[int, ...],
                positions=None, visible=None):
        """The fixed-shape forward (None, the generic path, when not `fixed`, for more than BUCKETS[-1] rows, for a
        cache with other layers, or when the padded rows would not fit the capacity)."""
        layers = getattr(cache, "layers", None)
        rows = input_ids.shape[1]
        if not self.fixed or not layers or rows > BUCKETS[-1] or not all(type(l) is StaticLayer for l in layers):
            return None
        start, width = layers[0].length, bucket(rows)
        if start + width > self.capacity:
            return None
        device = input_ids.device
        ids = torch.nn.functional.pad(input_ids, (0, width - rows))                                  # [1, W]
        slots = torch.arange(start, start + width, device=device)                                    # [W]
        if positions is None:
            positions = slots[None]                                                                  # [1, W]
            seen = torch.arange(self.capacity, device=device)[None] <= slots[:, None]                # [W, capacity]
        else:
            positions = torch.nn.functional.pad(positions, (0, width - rows), value=start)[None]     # [1, W]
            seen = torch.zeros(width, self.capacity, dtype=torch.bool, device=device)
            seen[:rows, :start + rows] = visible                                        # visible [rows, start + rows]
            seen[torch.arange(rows, width, device=device), slots[rows:]] = True     # a padded row sees only itself
        mask = additive_mask(seen, model.dtype)                                         # [1, 1, W, capacity]
        logits, hidden = self.runner(device)(model, cache, ids, positions, slots, mask, bool(feature_layers))
        for layer in layers:
            layer.length = start + rows       # the padded rows' slots stay outside the count
        features = torch.cat([hidden[i][0, :rows] for i in feature_layers], dim=-1) if feature_layers else None
        return logits[rows - logits_to_keep:rows], features


@contextlib.contextmanager
def use(capacity: int = DEFAULT_CAPACITY, fixed: bool = False, compile_cpu: bool = False):
    """Run the block on the static path (caches made inside it are static); `fixed` pads forwards to buckets and
    runs them at fixed shapes, under inductor on the CPU with `compile_cpu`."""
    previous = speed.install(StaticSpeedLayer(capacity, fixed, compile_cpu))
    try:
        yield
    finally:
        speed.install(previous)


def enabled_by_env() -> str | None:
    """SPEC_ENGINE_STATIC: 0 (default) off, 1 the static cache, fixed the static cache with fixed-shape forwards."""
    value = os.environ.get("SPEC_ENGINE_STATIC", "0")
    if value not in ("0", "1", "fixed"):
        raise ValueError(f"SPEC_ENGINE_STATIC must be 0, 1 or fixed, got {value!r}")
    return None if value == "0" else value


def install_from_env() -> speed.SpeedLayer:
    """Install the static path when SPEC_ENGINE_STATIC is 1 or fixed; returns the active layer."""
    mode = enabled_by_env()
    if mode and not isinstance(speed.active(), StaticSpeedLayer):
        speed.install(StaticSpeedLayer(fixed=mode == "fixed"))
    return speed.active()
