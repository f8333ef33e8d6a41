"""Greedy token identity with plain decoding on the real offline default (SmolLM2-135M-Instruct, fp32), for
every drafter kind, including the Gemma-3 cross-tokenizer and naive-id drafts, on several prompts; plus a
sampled run on the real model with its KV invariants checked every round."""
import pytest
import torch

import spec_engine as se
from spec_engine.core.cache import cache_len, forward_logits, new_cache, trim_cache

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the factorial of n.",
    "Rewrite this sentence in the past tense: The cat sits on the mat and watches the birds.",
]
NEW_TOKENS = 24
pytestmark = pytest.mark.measured_costs     # drafts sized by this machine's measured verify costs, as in the app


@pytest.fixture(scope="module")
def prompts(smollm2):
    return [smollm2.encode_prompt(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def plain(smollm2, prompts):
    """Plain greedy decoding of prompt i, computed when first asked for."""
    eos, done = smollm2.tokenizer.eos_token_id, {}

    def of(i: int) -> list[int]:
        if i not in done:
            done[i] = se.autoregressive_generate(smollm2.model, prompts[i], max_new_tokens=NEW_TOKENS,
                                                 sampling=se.SamplingParams(0.0), eos_token_id=eos).tokens
        return done[i]
    return of


def make_drafter(kind, smollm2, gemma):
    target = smollm2.model
    return {
        "layer-skip": lambda: se.LayerSkipDrafter(target, se.DEFAULT_SKIP_LAYERS),
        "early-exit": lambda: se.LayerSkipDrafter(target, se.early_exit_layers(len(target.model.layers), 20)),
        "prompt-lookup": lambda: se.PromptLookupDrafter(),
        "model": lambda: se.ModelDrafter(target),      # the same weights as a separate draft: accepts everything
        "cross-tokenizer": lambda: se.CrossTokenizerDrafter(gemma.model, gemma.tokenizer, smollm2.tokenizer),
        "naive-ids": lambda: se.NaiveIdDrafter(gemma.model),
    }[kind]()


KINDS = ["layer-skip", "early-exit", "prompt-lookup", "model", "cross-tokenizer", "naive-ids"]
# The default tier runs every drafter kind on one prompt, the prompts taken in turn so that each is run twice; the
# full tier (pytest --full) the whole matrix.
MATRIX = [pytest.param(kind, i, marks=() if i == n % len(PROMPTS) else pytest.mark.full)
          for n, kind in enumerate(KINDS) for i in range(len(PROMPTS))]


@pytest.mark.parametrize("kind, prompt", MATRIX)
def test_greedy_identity_on_the_offline_default(smollm2, gemma, prompts, plain, kind, prompt):
    eos = smollm2.tokenizer.eos_token_id
    decoder = se.SpeculativeDecoder(smollm2.model, make_drafter(kind, smollm2, gemma))
    result = decoder.generate(prompts[prompt], k=4, max_new_tokens=NEW_TOKENS, sampling=se.SamplingParams(0.0),
                              eos_token_id=eos)
    assert result.tokens == plain(prompt), smollm2.tokenizer.decode(result.tokens)
    if kind == "model":      # identical weights: every draft is kept (the last round may end at EOS)
        assert all(r.accepted == len(r.drafted) for r in result.rounds[:-1])


def test_sampled_run_keeps_cache_invariants_on_the_real_model(smollm2, prompts):
    target = smollm2.model
    decoder = se.SpeculativeDecoder(target, se.PromptLookupDrafter())
    state = decoder.start(prompts[2], k=4, max_new_tokens=20, sampling=se.SamplingParams(0.7, top_p=0.9), seed=0)
    while state.stop_reason is None:
        decoder.step(state)
        assert cache_len(state.target_cache) == len(state.committed) - 1
    trimmed = forward_logits(target, state.committed[-1:], state.target_cache, 1)[-1]
    fresh = forward_logits(target, state.committed, new_cache(target), 1)[-1]
    assert torch.allclose(trimmed, fresh, atol=1e-4)


def test_draft_vocabulary_mismatch_is_a_clear_error(smollm2, gemma):
    with pytest.raises(ValueError, match="CrossTokenizerDrafter"):
        se.SpeculativeDecoder(smollm2.model, se.ModelDrafter(gemma.model))


def test_prompt_longer_than_the_context_is_refused(smollm2):
    too_long = torch.ones((1, smollm2.model.config.max_position_embeddings), dtype=torch.long)
    with pytest.raises(ValueError, match="context"):
        se.SpeculativeDecoder(smollm2.model, se.PromptLookupDrafter()).stream(too_long, max_new_tokens=1)


@pytest.mark.skipif(se.speed_layer() != "cpu", reason="the CPU speed layer is off (SPEC_ENGINE_ACCEL=0)")
def test_loaded_models_verify_through_the_engines_kernels(smollm2, gemma):
    """load_model switches both real models to the engine's grouped attention (cpu_attention.py), packs the
    target's fp32 linear layers (cpu_gemm.py) and runs the Llama one (SmolLM2) on the engine's lean forward
    (lean_llama.py; Gemma 3 stays on transformers'); a 5-token verify through them equals transformers' stock
    forward, and so do a one-token step's logits and the hidden states the EAGLE head reads."""
    from spec_engine.accel import lean_llama
    from spec_engine.accel.cpu_attention import ENGINE_ATTENTION
    from spec_engine.accel.cpu_gemm import PackedLinear
    for loaded in (smollm2, gemma):
        assert loaded.model.config._attn_implementation == ENGINE_ATTENTION
    target = smollm2.model
    assert lean_llama.enabled(target) and not lean_llama.enabled(gemma.model)
    assert all(isinstance(m, PackedLinear) for m in target.modules() if isinstance(m, torch.nn.Linear))
    ids = smollm2.encode_prompt(PROMPTS[0])[0].tolist()
    cache = new_cache(target)
    forward_logits(target, ids[:-5], cache, 1)
    engine = forward_logits(target, ids[-5:], cache, 5)                               # [5, vocab]
    with torch.inference_mode():                                                      # stock: outside the engine
        out = target(input_ids=torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    torch.testing.assert_close(engine, out.logits[0, -5:], rtol=1e-4, atol=1e-4)
    trim_cache(cache, len(ids) - 1)
    one, features = forward_logits(target, ids[-1:], cache, 1, (2, 15, 27, -1))
    torch.testing.assert_close(one, out.logits[0, -1:], rtol=1e-4, atol=1e-4)
    stock_features = torch.cat([out.hidden_states[i][0, -1:] for i in (2, 15, 27, -1)], dim=-1)
    torch.testing.assert_close(features, stock_features, rtol=1e-4, atol=2e-4)
