"""The engine's grouped-query attention (spec_engine/accel/cpu_attention.py): the same outputs as transformers' SDPA,
taken only for masked CPU forwards inside the engine's block, and never for anything else on the same model."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from spec_engine.accel import cpu_attention
from spec_engine.core.cache import forward_logits, new_cache, trim_cache
from spec_engine.accel.cpu_attention import ENGINE_ATTENTION, use_engine_attention


def grouped_llama(attn_implementation: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None, attn_implementation=attn_implementation)
    return LlamaForCausalLM(config).eval().requires_grad_(False)


@pytest.fixture
def stock_calls(monkeypatch):
    """Query lengths of every call that went to transformers' stock SDPA function instead of the grouped path."""
    calls, real = [], cpu_attention.sdpa_attention_forward

    def counting(module, query, *args, **kwargs):
        calls.append(query.shape[2])
        return real(module, query, *args, **kwargs)
    monkeypatch.setattr(cpu_attention, "sdpa_attention_forward", counting)
    return calls


@pytest.fixture
def grouped_calls(monkeypatch):
    """Query lengths of every call that took the grouped path."""
    calls = []

    def counting(query, *args, **kwargs):
        assert kwargs["enable_gqa"] and kwargs["attn_mask"] is not None
        calls.append(query.shape[2])
        return F.scaled_dot_product_attention(query, *args, **kwargs)
    monkeypatch.setattr(cpu_attention, "F", SimpleNamespace(scaled_dot_product_attention=counting))
    return calls


def test_grouped_path_equals_stock_sdpa_for_every_verify_length(stock_calls, grouped_calls):
    stock, engine = grouped_llama(), grouped_llama()
    assert use_engine_attention(engine) and engine.config._attn_implementation == ENGINE_ATTENTION
    prompt = list(range(3, 23))
    stock_cache, engine_cache = new_cache(stock), new_cache(engine)
    forward_logits(stock, prompt, stock_cache, 1), forward_logits(engine, prompt, engine_cache, 1)
    stock_calls.clear()
    for n in range(2, 10):
        block = [(7 * i + n) % 64 for i in range(n)]
        expected = forward_logits(stock, block, stock_cache, n)                  # [n, vocab]
        actual = forward_logits(engine, block, engine_cache, n)
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
        trim_cache(stock_cache, len(prompt)), trim_cache(engine_cache, len(prompt))
    assert stock_calls == [] and grouped_calls == [n for n in range(2, 10) for _layer in range(2)]


def test_grouped_path_only_inside_the_engines_block(stock_calls, grouped_calls):
    model = grouped_llama()
    use_engine_attention(model)
    cache = new_cache(model)
    forward_logits(model, list(range(10)), cache, 1)             # prefill: no mask, stock (which groups heads itself)
    with torch.inference_mode():
        model(input_ids=torch.tensor([[5, 6, 7]]), cache=cache, use_cache=True)   # e.g. HF generate: outside the block
    assert stock_calls == [10, 10, 3, 3] and grouped_calls == []
    stock_calls.clear()
    forward_logits(model, [8, 9], cache, 2)                      # the engine's verify: grouped, no stock call
    assert stock_calls == [] and grouped_calls == [2, 2]


def test_generate_on_the_same_model_is_unchanged():
    stock, engine = grouped_llama(), grouped_llama()
    use_engine_attention(engine)
    prompt = torch.tensor([[1, 2, 3, 4]])
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(stock.generate(prompt, **kwargs), engine.generate(prompt, **kwargs))


def test_other_attention_implementations_are_left_alone():
    eager = grouped_llama("eager")
    assert not use_engine_attention(eager) and eager.config._attn_implementation == "eager"
    model = grouped_llama()
    assert use_engine_attention(model) and use_engine_attention(model)       # idempotent
    assert not use_engine_attention(object())
