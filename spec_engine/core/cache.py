"""KV caches: creation, trimming to the committed text, and the invariant checked every round.

Invariant (both models): the cache holds exactly the committed tokens except the newest one, whose key and
value are computed when the next round feeds it. Rejected and discarded draft positions never survive a
round. Trimming uses transformers' own `Cache.crop` (a negative argument removes that many tokens).
A speed layer may replace the cache's layers and run the forward itself (core/speed.py).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from spec_engine.core import speed

# Prompt tokens per prefill forward. A prompt near the context is otherwise one forward that neither a deadline nor
# Stop can interrupt (issue #25); a chunk is one forward over tokens placed after a cache, which every verify round
# already runs, so chunking changes no token (tests/test_engine.py::test_chunked_prefill_*). Smaller chunks cost
# more in all (SmolLM2-135M, 512 tokens on 2 loaded cores: one forward 15-22 s, chunks of 128 tokens 28 s), so a
# chunk is as large as a Stop may wait for: docs/hardening.md has the measurement.
PREFILL_CHUNK = 512

def new_cache(model) -> DynamicCache:
    """A dynamic cache laid out for `model` (sliding-window layers included), able to roll back."""
    cache = DynamicCache(config=model.config)
    layer_for = speed.active().new_layer
    cache.layers = [layer_for(layer) for layer in cache.layers]
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
        return 0     # nothing stored yet (transformers' sliding layers cannot crop before their first update)
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
    skip layers still place tokens correctly. A speed layer may run the forward instead (core/speed.py).
    """
    assert token_ids, "forward needs at least one token"
    assert logits_to_keep >= 1   # 0 would mean "all positions" to transformers
    device = model.device
    input_ids = torch.tensor([token_ids], dtype=torch.long, device=device)             # [1, n]
    layer = speed.active()
    with layer.products():
        found = layer.forward(model, input_ids, cache, logits_to_keep, feature_layers)
        if found is not None:
            logits, features = found
            return (logits, features) if feature_layers else logits
        start = cache_len(cache)
        position_ids = torch.arange(start, start + len(token_ids), device=device)[None]    # [1, n]
        out = model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True,
                    logits_to_keep=logits_to_keep, output_hidden_states=bool(feature_layers))
    if feature_layers:
        features = torch.cat([out.hidden_states[layer][0] for layer in feature_layers], dim=-1)   # [n, F]
        return out.logits[0], features                                                 # [keep, vocab], [n, F]
    return out.logits[0]                                                               # [logits_to_keep, vocab]


def prefill(model, token_ids: list[int], cache, feature_layers: tuple[int, ...] = (), should_stop=None,
            chunk: int = PREFILL_CHUNK):
    """Feed a prompt in forwards of at most `chunk` tokens, asking `should_stop()` between two of them; returns
    (logits [1, vocab] of the last position, features [n, F] or None) as `forward_logits` over the whole prompt
    would, or None when `should_stop()` turned true first (the cache then holds a prefix of the prompt: the caller
    drops it). A prompt of one chunk is one forward, as before, and asks nothing."""
    assert chunk >= 1
    logits, parts = None, []
    for begin in range(0, len(token_ids), chunk):
        if begin and should_stop is not None and should_stop():
            return None
        out = forward_logits(model, token_ids[begin:begin + chunk], cache, 1, feature_layers)
        logits, features = out if feature_layers else (out, None)
        if features is not None:
            parts.append(features)                                                     # [chunk, F]
    return logits, (torch.cat(parts) if parts else None)


def tree_visibility(parents: list[int], cached: int, device) -> torch.Tensor:
    """What each row of a tree forward over [root, node 0..n-1] after `cached` positions sees, [n + 1, cached + n + 1]
    bool: every row the cached text and the root (the last committed token); node i also its own ancestors and
    itself, and nothing else of the tree."""
    n = len(parents)
    visible = torch.zeros(n + 1, cached + n + 1, dtype=torch.bool, device=device)
    visible[:, :cached + 1] = True                                            # the committed text and the root
    for i, parent in enumerate(parents):
        row = i + 1
        if parent >= 0:
            visible[row, cached + 1:] = visible[parent + 1, cached + 1:]      # the parent's ancestors, topological
        visible[row, cached + row] = True
    return visible


def tree_attention_mask(parents: list[int], cached: int, dtype: torch.dtype, device) -> torch.Tensor:
    """`tree_visibility` as transformers' additive mask [1, 1, n + 1, cached + n + 1]: 0 where visible, the dtype's
    minimum where not."""
    return additive_mask(tree_visibility(parents, cached, device), dtype)


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """visible [n, L] bool -> [1, 1, n, L]: 0 where visible, the dtype's minimum where not (what transformers adds)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


@torch.inference_mode()
def forward_tree_logits(model, root: int, tokens: list[int], parents: list[int], depths: list[int], cache,
                        feature_layers: tuple[int, ...] = ()):
    """Score a token tree in one forward: feed [root, tokens...] after what `cache` holds, node i at position
    (cache length + depths[i]) under `tree_attention_mask`; returns logits [n + 1, vocab] (after the root, then
    after each node). The cache then holds every node's entries; `keep_path` keeps the accepted ones. With
    `feature_layers` (as `forward_logits`), also the hidden states of those layers at [root, nodes...],
    [n + 1, len(feature_layers) * hidden]: under the mask each node's are those of its own path.

    A speed layer may run it (core/speed.py `forward`, given the positions and the visibility); else transformers'
    forward with the mask as `attention_mask` (transformers takes a 4-D mask as given)."""
    layers = getattr(cache, "layers", [])
    if any(getattr(layer, "is_sliding", False) for layer in layers):
        raise ValueError("tree drafts need a model without sliding-window attention layers (their KV cannot be "
                         "compacted yet)")
    device = model.device
    start = cache_len(cache)
    input_ids = torch.tensor([[root, *tokens]], dtype=torch.long, device=device)                  # [1, n + 1]
    position_ids = torch.tensor([[start, *(start + d for d in depths)]], dtype=torch.long, device=device)   # [1, n + 1]
    visible = tree_visibility(parents, start, device)                            # [n + 1, start + n + 1]
    layer = speed.active()
    with layer.products():
        found = layer.forward(model, input_ids, cache, len(tokens) + 1, feature_layers, position_ids[0], visible)
        if found is not None:
            logits, features = found
            return (logits, features) if feature_layers else logits
        mask = additive_mask(visible, model.dtype)                               # [1, 1, n + 1, start + n + 1]
        out = model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, cache=cache, use_cache=True,
                    logits_to_keep=len(tokens) + 1, output_hidden_states=bool(feature_layers))
    if feature_layers:
        features = torch.cat([out.hidden_states[layer][0] for layer in feature_layers], dim=-1)   # [n + 1, F]
        return out.logits[0], features
    return out.logits[0]                                                                           # [n + 1, vocab]


@torch.inference_mode()
def keep_path(cache, start: int, sources: list[int]) -> None:
    """Move the entries at positions `sources` (increasing, each >= start) to start, start + 1, ... in every layer
    and drop everything after them: a tree's accepted path takes its place after the committed text."""
    assert sources == sorted(sources) and all(s >= start for s in sources), (start, sources)
    moves = [(start + j, s) for j, s in enumerate(sources) if s != start + j]
    if moves and not speed.active().move_positions(cache, moves):
        indices: dict = {}                # device -> (to, from): made once per round, not once per layer
        for layer in cache.layers:
            device = layer.keys.device
            if device not in indices:
                indices[device] = (torch.tensor([m[0] for m in moves], device=device),
                                   torch.tensor([m[1] for m in moves], device=device))
            to, frm = indices[device]
            layer.keys[..., to, :] = layer.keys[..., frm, :]          # the gather copies first: overlaps are safe
            layer.values[..., to, :] = layer.values[..., frm, :]
    trim_cache(cache, start + len(sources))
