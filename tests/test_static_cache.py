"""The static KV cache path (spec_engine/core/static_cache.py): preallocated buffers that never move, trimmed by
length, and the engine on it exact: greedy identity against plain decoding (which itself runs on the static path,
and against the default path) and against stock Hugging Face, the KV invariant and trimmed-cache logits every round,
the sampled chi-square tests. Each runs in both modes: `static` (forwards at their own width) and `fixed` (padded to
a verify bucket, attention over the whole capacity under a mask, as a captured forward runs; eagerly here)."""
import pytest
import torch
from transformers import DynamicCache

import spec_engine as se
from spec_engine.core import captured, speed, static_cache
from spec_engine.core.cache import cache_len, forward_logits, forward_tree_logits, new_cache
from spec_engine.core.static_cache import StaticLayer, bucket
from spec_engine.drafters.eagle import random_eagle_drafter
from spec_engine.drafters.tree import ModelTreeDrafter
from tiny import greedy_identity_runs

GREEDY_PROMPT = torch.tensor([[6, 7, 7, 6, 0, 1, 5, 1, 5, 0]])
SAMPLED = se.SamplingParams(0.9, top_k=6, top_p=0.95)


def test_buckets_and_bad_input_name_the_field():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 17, 32)] == [1, 2, 4, 4, 8, 8, 16, 32, 32]
    with pytest.raises(ValueError, match="rows"):
        bucket(0)
    with pytest.raises(ValueError, match="largest verify bucket"):
        bucket(33)
    with pytest.raises(ValueError, match="capacity"):
        static_cache.StaticSpeedLayer(0)


def test_env_switch_is_off_by_default_and_checked(monkeypatch):
    monkeypatch.delenv("SPEC_ENGINE_STATIC", raising=False)
    assert not static_cache.enabled_by_env()
    monkeypatch.setenv("SPEC_ENGINE_STATIC", "yes")
    with pytest.raises(ValueError, match="SPEC_ENGINE_STATIC"):
        static_cache.enabled_by_env()


def test_static_layer_keeps_its_buffers_trims_by_length_and_refuses_overflow():
    layer = StaticLayer(capacity=6)
    k = torch.randn(1, 2, 4, 3)
    keys, values = layer.update(k, -k)
    buffer = layer.key_buffer.data_ptr()
    assert torch.equal(keys, k) and torch.equal(values, -k) and layer.get_seq_length() == 4
    layer.crop(-3)
    layer.crop(0)                                                   # removes nothing, as DynamicLayer's
    assert layer.get_seq_length() == 1 and torch.equal(layer.keys, k[..., :1, :])
    more = torch.randn(1, 2, 5, 3)
    keys, _ = layer.update(more, more)
    assert layer.key_buffer.data_ptr() == buffer                    # written in place, never reallocated
    assert torch.equal(keys, torch.cat([k[..., :1, :], more], dim=-2))
    with pytest.raises(ValueError, match="capacity=6"):
        layer.update(more[..., :1, :], more[..., :1, :])
    with pytest.raises(ValueError, match="negative"):
        layer.crop(2)


def test_new_cache_on_the_static_path_is_static_and_the_default_is_not(target):
    assert not any(isinstance(layer, StaticLayer) for layer in new_cache(target).layers)
    with static_cache.use(64):
        cache = new_cache(target)
    assert cache.layers and all(isinstance(layer, StaticLayer) for layer in cache.layers)
    assert not isinstance(speed.active(), static_cache.StaticSpeedLayer)   # the context restored the layer


KINDS = {
    "model": lambda target, draft: se.ModelDrafter(draft),
    "layer-skip": lambda target, draft: se.LayerSkipDrafter(target, [1]),
    "prompt-lookup": lambda target, draft: se.PromptLookupDrafter(),
    "model-tree": lambda target, draft: ModelTreeDrafter(draft, width=2),
    "eagle": lambda target, draft: random_eagle_drafter(target, seed=3, scale=3.0),     # a head that is accepted
}
MODES = {"static": {}, "fixed": {"fixed": True}}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_identity_on_the_static_path(target, draft, kind, mode):
    """Plain greedy decoding on the default path is the reference; on the static path plain decoding and
    speculative decoding at k = 1, 3, 8 give exactly its tokens, with drafts accepted and corrected."""
    reference = se.autoregressive_generate(target, GREEDY_PROMPT, max_new_tokens=30, sampling=se.SamplingParams(0.0))
    with static_cache.use(128, **MODES[mode]):
        base, runs = greedy_identity_runs(target, lambda: KINDS[kind](target, draft), GREEDY_PROMPT)
    assert base.tokens == reference.tokens and len(set(base.tokens)) >= 3
    for k, result in runs.items():
        assert result.tokens == base.tokens, (kind, k)
        assert result.stats.accepted > 0, (kind, k)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("params", [se.SamplingParams(0.0), SAMPLED], ids=["greedy", "sampled"])
def test_kv_invariant_and_trimmed_cache_logits_every_round_on_the_static_path(target, draft, kind, params, mode):
    """After every round the static target cache holds committed[:-1] and its next-token logits equal a fresh
    forward's over the committed text on the default (dynamic) cache."""
    with static_cache.use(128, **MODES[mode]):
        decoder = se.SpeculativeDecoder(target, KINDS[kind](target, draft))
        state = decoder.start(GREEDY_PROMPT, k=4, max_new_tokens=24, sampling=params, seed=5)
        assert all(isinstance(layer, StaticLayer) for layer in state.target_cache.layers)
        while state.stop_reason is None:
            event = decoder.step(state)
            assert cache_len(state.target_cache) == len(state.committed) - 1 == event.target_cache_len
            trimmed = forward_logits(target, state.committed[-1:], state.target_cache, 1)[-1]
            state.target_cache.crop(-1)                                 # undo the probe
            fresh = forward_logits(target, state.committed, DynamicCache(config=target.config), 1)[-1]
            assert torch.allclose(trimmed, fresh, atol=1e-5)
    assert state.generated == 24


@pytest.mark.parametrize("mode", list(MODES))
def test_same_seed_same_sampled_text_on_both_paths(target, draft, mode):
    """A sampled run is a function of its seed: the static path gives the default path's tokens."""
    run = lambda: se.SpeculativeDecoder(target, se.ModelDrafter(draft)).generate(
        GREEDY_PROMPT, k=4, max_new_tokens=24, sampling=SAMPLED, seed=11).tokens
    default = run()
    with static_cache.use(128, **MODES[mode]):
        assert run() == default


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_identity_with_stock_hugging_face_generate(target, draft, mode):
    """Stock transformers `generate()` (do_sample=False, its own DynamicCache, one forward a token) on the tiny
    target gives the static path's plain and speculative tokens."""
    stock = target.generate(GREEDY_PROMPT, attention_mask=torch.ones_like(GREEDY_PROMPT), do_sample=False,
                            max_new_tokens=30, min_new_tokens=30, pad_token_id=0)[0, GREEDY_PROMPT.shape[1]:].tolist()
    with static_cache.use(128, **MODES[mode]):
        base, runs = greedy_identity_runs(target, lambda: se.ModelDrafter(draft), GREEDY_PROMPT)
    assert base.tokens == stock
    assert all(result.tokens == stock for result in runs.values())


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", ["model", "prompt-lookup"])
def test_sampled_chi_square_on_the_static_path(target, draft, kind, mode):
    """The first three sampled tokens on the static path follow the exact target distribution (enumerated), by
    tests/test_statistical.py's chi-square test: a correct sampler fails it with probability ALPHA = 1e-4 per test,
    so these four fail falsely with probability below 4e-4 (the seeds are fixed: a pass is reproducible)."""
    from test_statistical import ALPHA, PROMPT, SAMPLED as SETTINGS, chi_square_pvalue, exact_joint, speculative_samples
    params = SETTINGS[1]                                         # T 0.7, top-p 0.9
    with static_cache.use(64, **MODES[mode]):
        samples = speculative_samples(target, lambda: KINDS[kind](target, draft), params)
    assert chi_square_pvalue(samples, exact_joint(target, PROMPT, params)) > ALPHA


@pytest.mark.parametrize("value, active", [("1", "static"), ("fixed", "static-fixed"), ("0", "cpu")])
def test_spec_engine_static_selects_the_path_when_the_speed_layer_is_installed(value, active):
    """Importing the package installs nothing; use_speed_layer() (or load_model) installs what the environment
    selects, and an explicit install before it is left alone."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "SPEC_ENGINE_STATIC": value, "SPEC_ENGINE_ACCEL": "1"}
    code = ("import spec_engine as se; from spec_engine.core import speed; print(speed.active().name); "
            "print(se.use_speed_layer()); speed.install(speed.SpeedLayer()); print(se.use_speed_layer())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["off", active, "off"]


@pytest.fixture
def widths(monkeypatch):
    """The widths (padded row counts) of the fixed-shape forwards run while the test runs."""
    seen, eager = [], captured.eager_step

    def spy(model, cache, input_ids, *rest):
        seen.append(input_ids.shape[1])
        return eager(model, cache, input_ids, *rest)
    monkeypatch.setattr(captured, "eager_step", spy)
    return seen


def test_fixed_forward_pads_to_the_bucket_and_the_padded_rows_stay_out(target, widths):
    """Rows are padded to the bucket; the padded rows are written past the count, and neither they nor the stale
    slots after them change a real row's logits or features (compared with the default path's dynamic cache)."""
    prompt, more, after = [6, 7, 7, 6, 0], [1, 5, 1], [2, 3]
    with static_cache.use(16, fixed=True):
        cache = new_cache(target)
        forward_logits(target, prompt, cache, 1)
        logits, features = forward_logits(target, more, cache, 3, feature_layers=(1, -1))
        assert cache_len(cache) == 8 and cache.layers[0].key_buffer[..., 8, :].abs().sum() > 0    # a padded row
        later = forward_logits(target, after, cache, 2)
    reference = DynamicCache(config=target.config)
    forward_logits(target, prompt, reference, 1)
    expected_logits, expected_features = forward_logits(target, more, reference, 3, feature_layers=(1, -1))
    assert torch.allclose(logits, expected_logits, atol=1e-5) and torch.allclose(features, expected_features, atol=1e-5)
    assert torch.allclose(later, forward_logits(target, after, reference, 2), atol=1e-5)
    assert widths == [8, 4, 2] and cache_len(cache) == 10


def test_fixed_tree_forward_matches_the_dynamic_one(target, widths):
    """A tree of 4 nodes (5 rows, padded to 8) scores as on the default path, each node seeing only its ancestors."""
    tokens, parents, depths = [3, 4, 5, 1], [-1, 0, -1, 2], [1, 2, 1, 2]
    with static_cache.use(32, fixed=True):
        cache = new_cache(target)
        forward_logits(target, [6, 7, 7, 6, 0, 1], cache, 1)
        tree = forward_tree_logits(target, 5, tokens, parents, depths, cache)
        assert cache_len(cache) == 11
    reference = DynamicCache(config=target.config)
    forward_logits(target, [6, 7, 7, 6, 0, 1], reference, 1)
    assert torch.allclose(tree, forward_tree_logits(target, 5, tokens, parents, depths, reference), atol=1e-5)
    assert widths == [8, 8]


def test_fixed_forward_falls_back_where_the_padding_does_not_fit_and_refuses_overflow(target, widths):
    with static_cache.use(16, fixed=True):
        cache = new_cache(target)
        forward_logits(target, list(range(8)) + list(range(5)), cache, 1)                    # 13 rows -> width 16
        forward_logits(target, [1, 2, 3], cache, 1)        # width 4 would pass the capacity: the generic path, exact
        assert cache_len(cache) == 16 and widths == [16]
        with pytest.raises(ValueError, match="capacity=16"):
            forward_logits(target, [1], cache, 1)


@pytest.mark.slow
def test_fixed_forwards_under_inductor_are_exact_and_compiled_once_per_bucket():
    """The CPU's compiled form (core/captured.py CompiledSteps: inductor, fullgraph, dynamic=False) gives plain
    greedy decoding's tokens, plain and speculative, and a second run compiles nothing new: one graph per bucket and
    model. Stock models: the CPU speed layer's packed linears read a context variable dynamo cannot trace. Slow:
    inductor compiles each graph (minutes on a loaded 2-core host)."""
    from torch._dynamo.utils import counters

    from tiny import tiny_llama
    previous = speed.install(speed.SpeedLayer())
    try:
        target, draft = tiny_llama(vocab=8, layers=3, seed=0), tiny_llama(vocab=8, layers=1, seed=1)
    finally:
        speed.install(previous)
    reference = se.autoregressive_generate(target, GREEDY_PROMPT, max_new_tokens=24, sampling=se.SamplingParams(0.0))
    with static_cache.use(128, fixed=True, compile_cpu=True):
        run = lambda: greedy_identity_runs(target, lambda: se.ModelDrafter(draft), GREEDY_PROMPT, ks=(3,), tokens=24)
        base, runs = run()
        graphs = counters["stats"]["unique_graphs"]
        again, runs_again = run()
        assert counters["stats"]["unique_graphs"] == graphs                 # nothing recompiled
    assert base.tokens == again.tokens == reference.tokens
    assert runs[3].tokens == runs_again[3].tokens == reference.tokens and runs[3].stats.accepted > 0
