"""The one seam between the core and an optional speed layer.

The core (sampling, the rule, the KV cache, the loop) is device-generic torch code: exactly what a GPU runs. A speed
layer may take over named steps by installing a `SpeedLayer` here. Each hook either returns a result computed the
same way (tested equal to the generic code) or None, and the core then runs its own code. The core never imports a
speed layer: `spec_engine/__init__.py` names the installers of the layers the environment selects (the CPU one,
`spec_engine/accel`, unless SPEC_ENGINE_ACCEL=0), and `use_from_env` runs them: `load_model` calls it, and so does
`spec_engine.use_speed_layer()`. Importing the package installs nothing.

    hook               what the core asks                                       generic code it replaces
    adopt(module)      prepare a loaded model or draft head (patch, fuse)        nothing: stock modules
    warm(module)       build what is built lazily, before anything is timed     nothing
    products()         a context every model forward runs inside                none
    forward(...)       logits (+ features) of a forward over new tokens, or      model(...) through transformers
                       over a token tree (its positions and visibility given)
    run_packed(...)    a decoder stack over many sequences' rows packed side   the packed loop's products and
                       by side, each run after its own cache (core/packed.py)   attention (core/packed.py)
    packed_products(m) the products of that loop where run_packed declines,     the modules' own (core/packed.py
                       e.g. fused q|k|v                                         Products)
    run_layers(...)    a bare decoder stack over embeddings (the EAGLE head),    the stack's own forward
                       also a tree's (positions and visibility given)
    new_layer(layer)   a KV cache layer to use instead of transformers' one      the layer itself
    move_positions     a tree's accepted path moved into place in every layer   indexing each layer's keys and
                                                                                values (core/cache.py keep_path)
    draft_dtype(m)     the dtype a small head should draft in beside model m     m's dtype
    warp_rows(...)     temperature/softmax/top-p of float rows, + top-p members  sampling.warp
    top_p_rows(...)    top-p of probability rows, + members                      sampling.topk_top_p
    top_entries(...)   the n largest entries of rows                             torch.topk
    top_probability    softmax's largest entry and its index                     softmax().max()
    argmax_rows(...)   each row's largest entry's index, on the host             argmax().tolist()
    sample_at(...)     inverse-CDF draw restricted to a known support           torch.cumsum + searchsorted
    residual(...)      normalize(max(0, p - q)) on a known support              verify.residual_distribution
    host_reads(...)    p(x_i), q(x_i) and ids read on the host                  one device-to-host transfer

`members` / `support`: a top-p search may report each row's members (its nonzero ids, most likely first); later steps
of the same round (sampling a token, the residual, the display's top candidates) then look only at those ids. With no
speed layer the generic code never produces them, and every such argument is None.
"""
from __future__ import annotations

import contextlib


class SpeedLayer:
    """No speed layer: every hook declines (returns None) or leaves things as they are."""

    name = "off"

    def adopt(self, module) -> str | None:
        """Prepare a loaded model or head; returns a line for the load log, or None."""
        return None

    def warm(self, module) -> None:
        """Build what the layer would otherwise build on first use (inside a timed run)."""

    def products(self):
        return contextlib.nullcontext()

    def forward(self, model, input_ids, cache, logits_to_keep: int, feature_layers: tuple[int, ...],
                positions=None, visible=None):
        """input_ids [1, n] after what `cache` holds; a tree forward also gives positions [n] and visible [n, L]
        (bool: which of the cache's L positions, these n included, each row sees). -> (logits, features) or None."""
        return None

    def run_layers(self, stack, embeds, cache, positions=None, visible=None):
        return None

    def run_packed(self, model, embeds, caches, starts, sizes, visibles, positions, wanted):
        """embeds [1, N, H]: runs of sizes[s] rows, run s after the starts[s] positions caches[s] holds, seeing them
        as visibles[s] says ([rows, starts[s] + rows] bool, or None: causal), rotary positions [N] -> (post-norm
        final states [1, N, H], {index: hidden state [1, N, H]} for `wanted`) or None."""
        return None

    def packed_products(self, model):
        """A core.packed.Products computing `model`'s layer products faster, or None (the modules' own)."""
        return None

    def new_layer(self, layer):
        return layer

    def move_positions(self, cache, moves: list[tuple[int, int]]) -> bool:
        """Copy position `from` to `to` for each (to, from) of `moves`, in order, in every layer of `cache`; False
        (nothing moved) where the core's code should."""
        return False

    def draft_dtype(self, target_model):
        return None

    def warp_rows(self, logits, params):
        return None

    def top_p_rows(self, probs, top_p: float):
        return None

    def top_entries(self, probs, n: int, members):
        return None

    def top_probability(self, logits):
        return None

    def argmax_rows(self, logits):
        """logits [rows, vocab] -> each row's argmax (the first of equal maxima) as a list, or None."""
        return None

    def sample_at(self, probs, unit, support):
        return None

    def residual(self, target_row, draft_row, support):
        return None

    def host_reads(self, drafted, draft_probs, target_probs):
        return None


_ACTIVE: list[SpeedLayer] = [SpeedLayer()]
_FROM_ENV: list = []                # the installers spec_engine/__init__.py names, each reading its environment setting
_SELECTED: list[bool] = [False]     # a layer was chosen: by use_from_env, or explicitly by install


def active() -> SpeedLayer:
    """The installed speed layer (SpeedLayer() when none is)."""
    return _ACTIVE[0]


def install(layer: SpeedLayer) -> SpeedLayer:
    """Make `layer` the active speed layer; returns the one it replaces. An explicit choice: `use_from_env` then
    leaves it."""
    _SELECTED[0] = True
    previous, _ACTIVE[0] = _ACTIVE[0], layer
    return previous


def select_from_env(*installers) -> None:
    """Name the zero-argument installers `use_from_env` runs, in order (the package does, as it cannot be done from
    the core without importing a speed layer)."""
    _FROM_ENV[:] = installers


def use_from_env() -> SpeedLayer:
    """Install the speed layer the environment selects, unless one was chosen already (by an earlier call or an
    explicit `install`); returns the active layer."""
    if not _SELECTED[0]:
        _SELECTED[0] = True
        for installer in _FROM_ENV:
            installer()
    return active()
