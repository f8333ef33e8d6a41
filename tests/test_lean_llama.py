"""The engine's lean Llama forward (spec_engine/accel/lean_llama.py) and the growing KV cache layer (cache.py): the same
logits, hidden states and cache entries as transformers' forward, taken only by the engine's forwards, and the
model's weights shared with transformers' modules rather than copied."""
import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers.cache_utils import DynamicLayer

from spec_engine.accel import lean_llama
from spec_engine.accel.growing_cache import GrowingLayer
from spec_engine.core.cache import cache_len, forward_logits, forward_tree_logits, keep_path, new_cache, trim_cache
from spec_engine.accel.cpu_attention import use_engine_attention
from spec_engine.accel.cpu_gemm import PackedLinear, available, pack_linears, prepack
from spec_engine.drafters import layer_skip_view
from spec_engine.core.sampling import SamplingParams
from spec_engine.core.tree_rule import TokenTree
from spec_engine.drafters.eagle import random_eagle_drafter
from spec_engine.drafters.eagle_tree import EagleTreeDrafter

FEATURES = (0, 1, 2, 3, -1)   # embeddings, layer outputs, the post-norm final states (3 of 3 layers, as -1 is)


def llama(layers: int = 3, dtype=torch.float32, attention_bias: bool = False, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         attention_bias=attention_bias, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).to(dtype).eval().requires_grad_(False)
    use_engine_attention(model)
    return model


@pytest.fixture
def lean_off(monkeypatch):
    """A function running `fn()` with the lean path switched off (SPEC_ENGINE_LEAN=0), as transformers' modules."""
    def run(fn):
        with monkeypatch.context() as patch:
            patch.setenv("SPEC_ENGINE_LEAN", "0")
            return fn()
    return run


@pytest.mark.parametrize("attention_bias", [False, True])
def test_lean_forward_equals_transformers_over_rounds(lean_off, attention_bias):
    """Rounds of 1-9 new tokens with rollbacks, as the engine runs them: logits, the requested hidden states and
    every cached key and value agree with transformers' forward on a twin cache."""
    model = llama(attention_bias=attention_bias)
    assert lean_llama.use_lean_forward(model) and lean_llama.enabled(model)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 96, (60,), generator=generator).tolist()
    lean_cache, stock_cache = new_cache(model), new_cache(model)
    forward_logits(model, ids[:7], lean_cache, 1)
    lean_off(lambda: forward_logits(model, ids[:7], stock_cache, 1))
    committed = 7
    for n in (1, 4, 9, 2, 3, 1, 6):
        tokens = ids[committed:committed + n]
        lean_logits, lean_states = forward_logits(model, tokens, lean_cache, n, FEATURES)
        stock_logits, stock_states = lean_off(lambda: forward_logits(model, tokens, stock_cache, n, FEATURES))
        assert lean_states.shape == (n, len(FEATURES) * 64)
        torch.testing.assert_close(lean_states[:, -128:-64], lean_states[:, -64:], rtol=0, atol=0)
        torch.testing.assert_close(lean_logits, stock_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lean_states, stock_states, rtol=1e-5, atol=1e-5)
        committed += max(1, n // 2)                           # accept some, roll back the rest
        trim_cache(lean_cache, committed)
        trim_cache(stock_cache, committed)
        for lean_layer, stock_layer in zip(lean_cache.layers, stock_cache.layers):
            torch.testing.assert_close(lean_layer.keys, stock_layer.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lean_layer.values, stock_layer.values, rtol=1e-5, atol=1e-5)


def test_lean_forward_in_bf16_stays_within_bf16_rounding(lean_off):
    model = llama(dtype=torch.bfloat16)
    assert lean_llama.use_lean_forward(model)
    ids = list(range(3, 40))
    lean = forward_logits(model, ids, new_cache(model), 5)
    stock = lean_off(lambda: forward_logits(model, ids, new_cache(model), 5))
    assert lean.dtype == torch.bfloat16
    torch.testing.assert_close(lean.float(), stock.float(), rtol=0.02, atol=0.05)


def test_switching_on_again_after_a_dtype_change_fuses_the_new_weights(lean_off):
    """`.to(dtype)` gives the modules new weights and leaves the fused ones (held outside the module tree) behind:
    use_lean_forward sees that and fuses again, so the lean path multiplies by the weights the model now has."""
    model = llama()
    assert lean_llama.use_lean_forward(model)
    first = lean_llama.lean_layers(model)
    assert lean_llama.use_lean_forward(model) and lean_llama.lean_layers(model) is first       # idempotent
    model.to(torch.bfloat16)
    assert not first.current(model.model)
    assert lean_llama.use_lean_forward(model) and lean_llama.lean_layers(model) is not first
    ids = list(range(3, 30))
    lean = forward_logits(model, ids, new_cache(model), 4)
    stock = lean_off(lambda: forward_logits(model, ids, new_cache(model), 4))
    assert lean.dtype == torch.bfloat16
    torch.testing.assert_close(lean.float(), stock.float(), rtol=0.02, atol=0.05)


def test_moving_or_casting_the_model_after_switching_on_turns_the_lean_path_off(lean_off):
    """`.to(torch.float64)` (or to another device) gives the modules new weights; the fused ones held outside the
    module tree are then stale. The per-forward check sees it: the switch is dropped and the engine's forwards run
    transformers' modules on the weights the model now has (they raised, or would have used the old weights)."""
    from spec_engine.accel import CpuSpeedLayer
    model = llama()
    assert lean_llama.use_lean_forward(model)
    model.to(torch.float64)
    ids = list(range(3, 30))
    logits = forward_logits(model, ids, new_cache(model), 4)
    assert logits.dtype == torch.float64 and lean_llama.lean_layers(model) is None and not lean_llama.enabled(model)
    torch.testing.assert_close(logits, lean_off(lambda: forward_logits(model, ids, new_cache(model), 4)),
                               rtol=0, atol=0)
    # switched on again: fused anew, in float64
    assert lean_llama.use_lean_forward(model) and lean_llama.enabled(model)
    torch.testing.assert_close(forward_logits(model, ids, new_cache(model), 4), logits, rtol=1e-12, atol=1e-12)

    moved = llama()                                   # to an accelerator: off (meta stands in for CUDA here)
    assert lean_llama.use_lean_forward(moved) and lean_llama.enabled(moved)
    view = layer_skip_view(moved, [1])                # a view made before the move shares the stale switch
    moved.to("meta")
    assert not lean_llama.enabled(moved) and lean_llama.lean_layers(moved) is None
    assert not lean_llama.enabled(view) and not lean_llama.use_lean_forward(moved)
    layer = CpuSpeedLayer()
    assert layer.forward(moved, torch.tensor([[1, 2]], device="meta"), None, 1, ()) is None
    assert layer.run_layers(moved.model, None, None) is None


def test_only_the_engines_forwards_take_the_lean_path(monkeypatch):
    """forward_logits runs the lean layers; calling the model (as Hugging Face generate does) runs transformers'."""
    model = llama()
    lean_llama.use_lean_forward(model)
    runs = []
    real = lean_llama.run_layers
    monkeypatch.setattr(lean_llama, "run_layers", lambda *a, **k: runs.append(a[1].shape[1]) or real(*a, **k))
    forward_logits(model, [1, 2, 3], new_cache(model), 1)
    assert runs == [3]
    generated = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    assert runs == [3] and generated.shape == (1, 7)


def test_fusion_shares_the_weights_and_leaves_transformers_forward_unchanged():
    model = llama()
    before = copy.deepcopy(model)
    ids = torch.tensor([[5, 9, 2, 7]])
    assert lean_llama.use_lean_forward(model) and lean_llama.use_lean_forward(model)     # idempotent
    lean = lean_llama.lean_layers(model)
    assert len(lean.fused) == 3
    for layer in model.model.layers:
        qkv, gate_up = lean.fused[layer].qkv_proj, lean.fused[layer].gate_up_proj
        attn, mlp = layer.self_attn, layer.mlp
        assert qkv.weight.shape == (64 + 2 * 32, 64) and gate_up.weight.shape == (2 * 128, 64)
        assert attn.q_proj.weight.data_ptr() == qkv.weight.data_ptr()                 # views, not copies
        assert attn.v_proj.weight.data_ptr() == qkv.weight.data_ptr() + (64 + 32) * 64 * 4
        assert mlp.up_proj.weight.data_ptr() == gate_up.weight.data_ptr() + 128 * 64 * 4
        assert attn.q_proj.superseded and not hasattr(attn.o_proj, "superseded")
    assert set(model.state_dict()) == set(before.state_dict())                         # nothing new to save
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, before(ids).logits, rtol=0, atol=0)


def test_unsupported_models_stay_on_transformers_forward():
    eager = llama()
    eager.set_attn_implementation("eager")
    assert not lean_llama.use_lean_forward(eager) and not lean_llama.enabled(eager)
    assert "not SDPA" in lean_llama.unsupported_reason(eager.model)
    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                               num_attention_heads=4, num_key_value_heads=2)).eval()
    assert not lean_llama.use_lean_forward(mistral)
    assert "not a LlamaModel" in lean_llama.unsupported_reason(mistral.model)
    assert lean_llama.lean_layers(mistral) is None


def test_switch_off_by_environment(monkeypatch):
    model = llama()
    lean_llama.use_lean_forward(model)
    monkeypatch.setenv("SPEC_ENGINE_LEAN", "0")
    assert not lean_llama.enabled(model)


def test_layer_skip_views_run_lean_with_the_full_models_cache_layout(lean_off):
    model = llama(layers=4)
    lean_llama.use_lean_forward(model)
    view = layer_skip_view(model, [2])
    assert lean_llama.enabled(view)
    ids = list(range(10, 30))
    lean_cache, stock_cache = new_cache(model), new_cache(model)
    lean = forward_logits(view, ids, lean_cache, 3, (0, 2, -1))
    stock = lean_off(lambda: forward_logits(view, ids, stock_cache, 3, (0, 2, -1)))
    torch.testing.assert_close(lean[0], stock[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lean[1], stock[1], rtol=1e-5, atol=1e-5)
    assert not lean_cache.layers[2].is_initialized and cache_len(lean_cache) == 20     # the skipped layer stays empty


def test_eagle_head_steps_run_lean_and_agree(lean_off):
    target = llama()
    lean_llama.use_lean_forward(target)
    drafter = random_eagle_drafter(target, feature_layers=(1, -1), scale=2.0)
    assert lean_llama.enabled(drafter.head.body)
    features = torch.randn(12, 2 * 64, generator=torch.Generator().manual_seed(0))
    ids = list(range(20, 33))

    def predicted():
        drafter.begin(ids, features)
        return drafter._predicted
    torch.testing.assert_close(predicted(), lean_off(predicted), rtol=1e-5, atol=1e-5)


def counting_tree_runs(monkeypatch) -> list[int]:
    """Rows of every lean run given a tree's visibility (appended as they run)."""
    runs, real = [], lean_llama.run_layers

    def run_layers(inner, embeds, *args, **kwargs):
        if kwargs.get("visible") is not None:
            runs.append(embeds.shape[1])
        return real(inner, embeds, *args, **kwargs)
    monkeypatch.setattr(lean_llama, "run_layers", run_layers)
    return runs


def test_lean_tree_forward_equals_transformers_with_the_tree_mask(lean_off, monkeypatch):
    """Trees of several shapes after a committed text: the lean forward (given the tree's positions and visibility)
    gives transformers' logits and hidden states for every node, and after `keep_path` the same cache entries."""
    model = llama()
    lean_llama.use_lean_forward(model)
    runs = counting_tree_runs(monkeypatch)
    shapes = [[-1], [-1, -1, -1], [-1, 0, 1, 2], [-1, -1, 0, 0, 1, 2, 5], [-1, 0, -1, 2, 1, 3, -1, 6]]
    generator = torch.Generator().manual_seed(4)
    for trial, parents in enumerate(shapes):
        committed = torch.randint(0, 96, (5 + 3 * trial,), generator=generator).tolist()
        tree = TokenTree.of(torch.randint(0, 96, (len(parents),), generator=generator).tolist(), parents)
        caches = new_cache(model), new_cache(model)
        results = []
        for cache, run in zip(caches, (lambda fn: fn(), lean_off)):
            run(lambda: forward_logits(model, committed[:-1], cache, 1))
            results.append(run(lambda: forward_tree_logits(model, committed[-1], tree.tokens, tree.parents,
                                                           tree.depths(), cache, FEATURES)))
        (lean_logits, lean_states), (stock_logits, stock_states) = results
        assert lean_logits.shape == (len(parents) + 1, 96) and lean_states.shape == (len(parents) + 1, 5 * 64)
        torch.testing.assert_close(lean_logits, stock_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lean_states, stock_states, rtol=1e-5, atol=1e-5)
        path = tree.path_to(len(parents) - 1)
        for cache in caches:
            keep_path(cache, len(committed), [len(committed) + i for i in path])
        for lean_layer, stock_layer in zip(*(cache.layers for cache in caches)):
            torch.testing.assert_close(lean_layer.keys, stock_layer.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lean_layer.values, stock_layer.values, rtol=1e-5, atol=1e-5)
    assert runs == [len(parents) + 1 for parents in shapes]          # the lean side ran each tree, the stock side not


def test_eagle_tree_growth_runs_lean_and_agrees(lean_off, monkeypatch):
    """The EAGLE-2 drafter's expansions (one head forward over a frontier under a tree mask) run lean and grow the
    same tree, with the same path confidences, as transformers' forward of the head; the features each expansion
    predicts are within 1e-5 of the same forward in float64 (transformers' own fp32 forward is 2.2e-5 from it here, so
    comparing the two fp32 paths would measure transformers' rounding as much as the lean path's)."""
    features = torch.randn(12, 2 * 64, generator=torch.Generator().manual_seed(0))
    ids = list(range(20, 33))

    def grow(dtype):
        target = llama(dtype=dtype)
        lean_llama.use_lean_forward(target)
        drafter = random_eagle_drafter(target, feature_layers=(1, -1), scale=2.0)
        tree_drafter = EagleTreeDrafter(drafter.head, target, drafter.vocab_index, width=3, depth=4,
                                        size_by_cost=False)
        tree_drafter.prune_unkeepable = False     # every level grows, so every expansion is compared
        predicted, expand = [], tree_drafter._expand    # each expansion's predicted features [3, H]
        tree_drafter._expand = lambda *args: predicted.append(expand(*args)) or predicted[-1]
        tree_drafter.begin(ids, features.to(dtype))
        proposal = tree_drafter.propose(ids, 8, SamplingParams(0.0), torch.Generator())
        return proposal.tree.tokens, proposal.tree.parents, tree_drafter.last_scores, torch.stack(predicted)
    runs = counting_tree_runs(monkeypatch)
    lean = grow(torch.float32)
    assert runs == [3, 3, 3]                      # depth 4: three expansions of a 3-node frontier, lean
    stock, exact = lean_off(lambda: grow(torch.float32)), lean_off(lambda: grow(torch.float64))
    assert runs == [3, 3, 3]                      # transformers' forwards ran the other two
    assert lean[:2] == stock[:2] == exact[:2] and len(lean[0]) == 8
    torch.testing.assert_close(lean[2], stock[2], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(lean[3].double(), exact[3], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not available(), reason="this torch has no MKL packed sgemm")
def test_prepack_packs_the_fused_projections_not_the_superseded_ones(lean_off):
    model = llama(layers=2)
    pack_linears(model)
    lean_llama.use_lean_forward(model)
    fused = lean_llama.lean_layers(model).linears()
    assert all(isinstance(linear, PackedLinear) for linear in fused)
    assert prepack(model) == 2 * 2 + 2 * 2 + 1                # fused (2 per layer), o and down (2 per layer), LM head
    assert all(linear.packed is not None for linear in fused)
    assert all(m.packed is None for m in model.modules() if getattr(m, "superseded", False))
    ids = list(range(30))
    cache = new_cache(model)
    forward_logits(model, ids[:-6], cache, 1)
    six = forward_logits(model, ids[-6:], cache, 6)                                  # 6 rows: the packed product
    stock_cache = new_cache(model)
    lean_off(lambda: forward_logits(model, ids[:-6], stock_cache, 1))
    torch.testing.assert_close(six, lean_off(lambda: forward_logits(model, ids[-6:], stock_cache, 6)),
                               rtol=1e-4, atol=1e-4)


# ---- the growing cache layer ----

def test_new_caches_grow_in_place():
    model = llama(layers=2)
    cache = new_cache(model)
    assert all(type(layer) is GrowingLayer for layer in cache.layers)
    forward_logits(model, list(range(10)), cache, 1)
    buffer = cache.layers[0].key_buffer
    assert buffer.shape[-2] == 64 and cache.layers[0].keys.data_ptr() == buffer.data_ptr()
    for _ in range(20):
        forward_logits(model, [3], cache, 1)
    assert cache.layers[0].key_buffer is buffer                                        # appended in place
    forward_logits(model, list(range(40)), cache, 1)                                  # 70 > 64: doubled once
    assert cache.layers[0].key_buffer.shape[-2] == 140 and cache_len(cache) == 70


def test_growing_layer_equals_dynamic_layer_under_updates_crops_and_replacement():
    """Random appends and crops; then the keys replaced from outside (as beam reordering does) are kept."""
    generator = torch.Generator().manual_seed(0)
    growing, dynamic = GrowingLayer(), DynamicLayer()
    length = 0
    for step in range(60):
        if length and torch.rand((), generator=generator) < 0.35:
            drop = int(torch.randint(1, length + 1, (), generator=generator))
            growing.crop(-drop)
            dynamic.crop(-drop)
            length -= drop
        else:
            n = int(torch.randint(1, 12, (), generator=generator))
            keys, values = torch.randn(1, 2, n, 8, generator=generator), torch.randn(1, 2, n, 8, generator=generator)
            got, want = growing.update(keys, values), dynamic.update(keys, values)
            length += n
            torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
            torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
        assert growing.get_seq_length() == dynamic.get_seq_length() == length
        if step == 30 and length:
            growing.keys, growing.values = growing.keys.clone() * 2, growing.values.clone() * 2
            dynamic.keys, dynamic.values = dynamic.keys * 2, dynamic.values * 2
    torch.testing.assert_close(growing.keys, dynamic.keys, rtol=0, atol=0)


def test_benchmark_clock_counts_lean_forwards_as_model_time():
    """The benchmark's overhead share is total time minus model time: forwards on the lean path (which never call
    the module, so no forward hook fires) must be counted, and only for the clocked models."""
    from spec_engine.bench import ForwardClock
    model, other = llama(), llama(seed=1)
    lean_llama.use_lean_forward(model)
    lean_llama.use_lean_forward(other)
    clock = ForwardClock([model])
    forward_logits(model, list(range(20)), new_cache(model), 1)
    counted = clock.seconds
    forward_logits(other, list(range(20)), new_cache(other), 1)
    clock.close()
    assert counted > 0 and clock.seconds == counted
    forward_logits(model, list(range(20)), new_cache(model), 1)                         # closed: no longer counted
    assert clock.seconds == counted and lean_llama.forward_logits.__name__ == "forward_logits"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_rotary_table_gives_the_modules_own_numbers_and_grows(dtype):
    """lean_llama.rotary reads cos and sin from a table the rotary module computed once; every entry must be bit
    for bit what the module computes for that position in a call of any length, past the first table's end too."""
    module = llama().model.rotary_emb
    probe = torch.empty(0, dtype=dtype)
    for start, n in [(0, 1), (5, 8), (250, 9), (255, 1), (1000, 17), (40, 3)]:   # 250 + 9 and 1000: the table grows
        positions = torch.arange(start, start + n)
        cos, sin = lean_llama.rotary(module, dtype, positions)
        expected_cos, expected_sin = module(probe, positions[None])
        assert cos.dtype == dtype and torch.equal(cos, expected_cos) and torch.equal(sin, expected_sin), (start, n)
    tree = torch.tensor([7, 8, 8, 9, 8])                                          # a tree's positions repeat depths
    assert torch.equal(lean_llama.rotary(module, dtype, tree)[0], module(probe, tree[None])[0])
    assert module._spec_engine_rotary[dtype][0].shape[1] >= 1017
