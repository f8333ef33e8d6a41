"""The compiled decoder layers (spec_engine/accel/native_layers.py, csrc/lean_layers.cpp): transformers' numbers over
rounds with rollbacks, trees and hidden states; a row's numbers bit for bit the same whatever the other rows of its
call (so greedy speculative decoding emits plain decoding's tokens); and the torch path wherever they do not apply."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicLayer

import spec_engine as se
from spec_engine.accel import CpuSpeedLayer, native_layers
from spec_engine.core.cache import forward_logits, forward_tree_logits, keep_path, new_cache, trim_cache
from spec_engine.core.tree_rule import TokenTree

pytestmark = pytest.mark.skipif(native_layers.library() is None,
                                reason="no AVX-512 / AVX2 build of the compiled layers on this machine")
FEATURES = (0, 2, 3, -1)


def llama(attention_bias: bool = False, kv_heads: int = 2, dtype=torch.float32, seed: int = 0) -> LlamaForCausalLM:
    """A small Llama prepared as load_model prepares the offline default (packed products, lean path)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=256,
                         attention_bias=attention_bias, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).to(dtype).eval().requires_grad_(False)
    layer = CpuSpeedLayer()
    layer.adopt(model)
    layer.warm(model)
    return model


@pytest.fixture
def compiled_runs(monkeypatch):
    """Rows of every forward the compiled layers ran (appended as they run)."""
    runs, real = [], native_layers.run

    def run(inner, lean, embeds, *args, **kwargs):
        out = real(inner, lean, embeds, *args, **kwargs)
        if out is not None:
            runs.append(embeds.shape[1])
        return out
    monkeypatch.setattr(native_layers, "run", run)
    return runs


def torch_path(monkeypatch, fn):
    with monkeypatch.context() as patch:
        patch.setenv("SPEC_ENGINE_NATIVE_LAYERS", "0")
        return fn()


def transformers_path(monkeypatch, fn):
    with monkeypatch.context() as patch:
        patch.setenv("SPEC_ENGINE_LEAN", "0")
        return fn()


@pytest.mark.parametrize("attention_bias, kv_heads", [(False, 2), (True, 2), (False, 4), (False, 1)])
def test_compiled_layers_equal_transformers_over_rounds(monkeypatch, compiled_runs, attention_bias, kv_heads):
    """Rounds of 1-16 new tokens with rollbacks: logits, hidden states and every cached key and value agree with the
    lean path's torch operations and with transformers' forward, each on its own cache."""
    model = llama(attention_bias, kv_heads)
    ids = torch.randint(0, 96, (90,), generator=torch.Generator().manual_seed(1)).tolist()
    runners = (lambda fn: fn(), lambda fn: torch_path(monkeypatch, fn), lambda fn: transformers_path(monkeypatch, fn))
    caches = [new_cache(model) for _ in runners]
    for run, cache in zip(runners, caches):
        run(lambda: forward_logits(model, ids[:7], cache, 1))
    committed = 7
    for n in (1, 4, 16, 2, 9, 1, 6):
        tokens = ids[committed:committed + n]
        (logits, states), *others = [run(lambda: forward_logits(model, tokens, cache, n, FEATURES))
                                     for run, cache in zip(runners, caches)]
        for other_logits, other_states in others:
            torch.testing.assert_close(logits, other_logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(states, other_states, rtol=1e-5, atol=1e-5)
        committed += max(1, n // 2)                                           # accept some, roll back the rest
        for cache in caches:
            trim_cache(cache, committed)
        for layers in zip(*(cache.layers for cache in caches)):
            for other in layers[1:]:
                torch.testing.assert_close(layers[0].keys, other.keys, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(layers[0].values, other.values, rtol=1e-5, atol=1e-5)
    assert compiled_runs == [7, 1, 4, 16, 2, 9, 1, 6]       # the compiled layers ran the first 7 tokens and every round


def test_trees_equal_transformers_with_the_tree_mask(monkeypatch, compiled_runs):
    model = llama()
    generator = torch.Generator().manual_seed(4)
    shapes = [[-1], [-1, -1, -1], [-1, 0, 1, 2], [-1, -1, 0, 0, 1, 2, 5], [-1, 0, -1, 2, 1, 3, -1, 6]]
    for trial, parents in enumerate(shapes):
        committed = torch.randint(0, 96, (5 + 3 * trial,), generator=generator).tolist()
        tree = TokenTree.of(torch.randint(0, 96, (len(parents),), generator=generator).tolist(), parents)
        caches, results = (new_cache(model), new_cache(model)), []
        for cache, run in zip(caches, (lambda fn: fn(), lambda fn: transformers_path(monkeypatch, fn))):
            run(lambda: forward_logits(model, committed[:-1], cache, 1))
            results.append(run(lambda: forward_tree_logits(model, committed[-1], tree.tokens, tree.parents,
                                                           tree.depths(), cache, FEATURES)))
        torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-5)
        path = tree.path_to(len(parents) - 1)
        for cache in caches:
            keep_path(cache, len(committed), [len(committed) + i for i in path])
        for compiled, stock in zip(*(cache.layers for cache in caches)):
            torch.testing.assert_close(compiled.keys, stock.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(compiled.values, stock.values, rtol=1e-5, atol=1e-5)
    assert len(compiled_runs) == 2 * len(shapes)             # each committed text (5-17 rows) and each tree
    assert compiled_runs[1::2] == [len(parents) + 1 for parents in shapes]


def test_a_tree_path_moves_into_place_in_one_compiled_call_bit_for_bit_as_the_torch_code_moves_it(monkeypatch):
    """keep_path's moves (core/cache.py) by the compiled call equal the torch indexing they replace, bit for bit, in
    every layer; where a layer's keys were assigned from outside (not its buffers) the call declines and the torch
    code moves them."""
    model = llama()
    generator = torch.Generator().manual_seed(7)
    real, calls = native_layers.move_positions, []

    def counted(cache, moves):
        moved = real(cache, moves)
        calls.append(moved)
        return moved
    monkeypatch.setattr(native_layers, "move_positions", counted)
    for trial, path in enumerate([[1, 3], [0, 2, 5], [4], [2, 3, 6, 7]]):
        committed = torch.randint(0, 96, (6 + trial,), generator=generator).tolist()
        tokens = torch.randint(0, 96, (8,), generator=generator).tolist()
        parents = [-1, 0, 0, 1, -1, 4, 2, 6]
        caches = (new_cache(model), new_cache(model))
        for cache in caches:
            forward_logits(model, committed[:-1], cache, 1)
            forward_tree_logits(model, committed[-1], tokens, parents, TokenTree.of(tokens, parents).depths(), cache)
        start = len(committed)
        keep_path(caches[0], start, [start + i for i in path])
        with monkeypatch.context() as patch:
            patch.setattr(native_layers, "move_positions", lambda cache, moves: False)
            keep_path(caches[1], start, [start + i for i in path])
        assert calls[-1] is True
        for compiled, stock in zip(*(cache.layers for cache in caches)):
            assert compiled.get_seq_length() == stock.get_seq_length() == start + len(path)
            assert torch.equal(compiled.keys, stock.keys) and torch.equal(compiled.values, stock.values)
    cache = new_cache(model)
    forward_logits(model, list(range(10)), cache, 1)
    layer = cache.layers[1]
    layer.keys, layer.values = layer.keys.clone(), layer.values.clone()          # as beam reordering assigns them
    want = [(layer.keys[..., 8, :].clone(), layer.values[..., 8, :].clone()) for layer in cache.layers]
    keep_path(cache, 6, [6, 8])
    assert calls[-1] is False
    for layer, (keys, values) in zip(cache.layers, want):
        assert torch.equal(layer.keys[..., 7, :], keys) and torch.equal(layer.values[..., 7, :], values)


def test_a_rows_numbers_do_not_depend_on_the_other_rows(compiled_runs):
    """Bit for bit: a chain of n rows gives each row what one-row forwards give it in turn, and a tree's node gives
    what the same tokens give as a chain (its path), so greedy verification accepts exactly plain decoding's tokens."""
    model = llama()
    ids = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    chain_cache, single_cache = new_cache(model), new_cache(model)
    for cache in (chain_cache, single_cache):
        forward_logits(model, ids[:20], cache, 1)
    chain, chain_states = forward_logits(model, ids[20:28], chain_cache, 8, FEATURES)
    singles = [forward_logits(model, ids[i:i + 1], single_cache, 1, FEATURES) for i in range(20, 28)]
    assert torch.equal(chain, torch.cat([logits for logits, _ in singles]))
    assert torch.equal(chain_states, torch.cat([states for _, states in singles]))

    tree_cache = new_cache(model)
    forward_logits(model, ids[:20], tree_cache, 1)
    parents = [-1, -1, 0, 1, 3, 2]                          # two branches: nodes 1, 3, 4 are the path 20..23's tokens
    tokens = [ids[30], ids[21], ids[31], ids[22], ids[23], ids[32]]
    tree, _ = forward_tree_logits(model, ids[20], tokens, parents, TokenTree.of(tokens, parents).depths(), tree_cache,
                                  FEATURES)
    assert torch.equal(tree[[0, 2, 4, 5]], chain[:4])       # the root and the path's nodes: the chain's rows
    assert all(rows <= 8 for rows in compiled_runs)


@pytest.mark.parametrize("context", [14, 15, 31, 45, 60, 63, 121])
def test_a_rows_hidden_states_do_not_depend_on_the_other_rows_across_attention_blocks(compiled_runs, context):
    """The attention scores keys 16 positions at a time, and a KV head's queries take the keys 64 at a time
    (csrc/lean_layers.cpp): around and past those blocks and chunks, every layer's states of a row are bit for bit the
    same alone, in a chain and as a tree's node at other cache places. (The
    logits are compared above; here they are left out because this tiny model's LM head may take MKL at some row
    counts on some machines, cpu_gemm's plans, which the compiled layers never run.)"""
    model = llama()
    ids = torch.randint(0, 96, (140,), generator=torch.Generator().manual_seed(3)).tolist()
    caches = [new_cache(model) for _ in range(3)]
    for cache in caches:
        forward_logits(model, ids[:context], cache, 1)
    chain_cache, single_cache, tree_cache = caches
    _, chain = forward_logits(model, ids[context:context + 8], chain_cache, 8, FEATURES)
    singles = torch.cat([forward_logits(model, ids[i:i + 1], single_cache, 1, FEATURES)[1]
                         for i in range(context, context + 8)])
    assert torch.equal(chain, singles)
    parents = [-1, 0, -1, 1, 2, 3, 3, -1]     # the chain's next four tokens are nodes 0, 1, 3, 5
    tokens = [ids[context + 1], ids[context + 2], ids[130], ids[context + 3], ids[131], ids[context + 4], ids[132],
              ids[133]]
    _, tree = forward_tree_logits(model, ids[context], tokens, parents, TokenTree.of(tokens, parents).depths(),
                                  tree_cache, FEATURES)
    assert torch.equal(tree[[0, 1, 2, 4, 6]], chain[:5])     # the root and the path's nodes: the chain's rows
    assert compiled_runs[-1] == 9 and 8 in compiled_runs


def test_where_they_do_not_apply_the_torch_path_runs(monkeypatch, compiled_runs):
    model = llama()
    ids = list(range(3, 60))
    cache = new_cache(model)
    forward_logits(model, ids[:40], cache, 1)                      # 40 rows (a prefill block): the torch path
    assert compiled_runs == []
    forward_logits(model, ids[40:41], cache, 1)
    assert compiled_runs == [1]
    torch_path(monkeypatch, lambda: forward_logits(model, ids[41:43], cache, 2))       # switched off
    assert compiled_runs == [1]
    plain = new_cache(model)                                       # transformers' own cache layers
    plain.layers = [DynamicLayer() for _ in plain.layers]
    forward_logits(model, ids[:3], plain, 1)
    assert compiled_runs == [1]
    double = llama(dtype=torch.float64)                            # float64: the torch path
    forward_logits(double, ids[:3], new_cache(double), 1)
    assert compiled_runs == [1]


def test_bf16_stacks_run_compiled_within_bf16_rounding(monkeypatch, compiled_runs):
    """bf16 weights (the EAGLE head beside an fp32 target) multiply by AVX-512 BF16 dot products with fp32 rows in
    between; a prefill block of the torch path leaves bf16 keys, which the first compiled forward converts."""
    if not native_layers.library().bf16:
        pytest.skip("this CPU has no AVX-512 BF16")
    model = llama(dtype=torch.bfloat16)
    ids = list(range(3, 60))
    caches, results = (new_cache(model), new_cache(model)), []
    for run, cache in zip((lambda fn: fn(), lambda fn: transformers_path(monkeypatch, fn)), caches):
        run(lambda: forward_logits(model, ids[:30], cache, 1))                # 30 rows: the torch path, bf16 keys
        results.append([run(lambda: forward_logits(model, ids[30 + i:31 + i], cache, 1)) for i in range(3)]
                       + [run(lambda: forward_logits(model, ids[33:38], cache, 5))])
    for compiled, stock in zip(*results):
        assert compiled.dtype == torch.bfloat16
        torch.testing.assert_close(compiled.float(), stock.float(), rtol=0.02, atol=0.05)
    assert compiled_runs == [1, 1, 1, 5] and caches[0].layers[0].keys.dtype == torch.float32


def test_the_offline_default_and_its_head_run_compiled(smollm2, compiled_runs):
    """SmolLM2-135M's decoding takes the compiled layers (else the tests above would not cover the product), and a
    default run still emits plain decoding's tokens."""
    eos = smollm2.tokenizer.eos_token_id
    ids = smollm2.encode_prompt("Write one sentence about rivers.")
    greedy = se.SamplingParams(0.0)
    expected = se.autoregressive_generate(smollm2.model, ids, max_new_tokens=16, sampling=greedy, eos_token_id=eos)
    assert compiled_runs and set(compiled_runs) == {1}
    del compiled_runs[:]
    result = se.SpeculativeDecoder(smollm2.model, se.make_drafter("eagle+lookup-tree", smollm2)).generate(
        ids, k=12, max_new_tokens=16, sampling=greedy, eos_token_id=eos)
    assert result.tokens == expected.tokens
    assert any(rows > 1 for rows in compiled_runs)


@pytest.mark.parametrize("in_features", [95, 96])
def test_the_bf16_product_equals_bf16_linear_and_pads_odd_inputs(in_features):
    if not native_layers.library().bf16:
        pytest.skip("this CPU has no AVX-512 BF16")
    from torch import nn
    from spec_engine.accel.cpu_gemm import PackedLinear, batched_gemm
    torch.manual_seed(0)
    linear = nn.Linear(in_features, 130).to(torch.bfloat16).requires_grad_(False)
    PackedLinear.wrap(linear)
    x = torch.randn(16, in_features, dtype=torch.bfloat16)
    with torch.no_grad(), batched_gemm():
        whole = native_layers.bf16_product(linear, x)
        rows = torch.cat([native_layers.bf16_product(linear, x[i:i + 1]) for i in range(16)])
    assert torch.equal(whole, rows)                                   # a row's numbers do not depend on the others
    torch.testing.assert_close(whole.float(), torch.nn.functional.linear(x, linear.weight, linear.bias).float(),
                               rtol=0.01, atol=0.01)
