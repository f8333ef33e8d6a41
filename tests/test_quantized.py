"""Quantized models on the CPU (spec_engine/models/quantize.py) and the quantized self-draft (drafters/quantized.py).

The kernels are held against plain reference arithmetic; a quantized copy must leave its original untouched and
actually be smaller and different; the quantized self-draft must reproduce plain greedy decoding of the
full-precision target token for token (its chi-square tests are in test_statistical.py); load_model must load each
format on the CPU or say what is missing.
"""
import pytest
import torch
from torch import nn

import spec_engine as se
from spec_engine.accel import lean_llama
from spec_engine.models import ModelLoadError, check_quantization, load_model, loading
from spec_engine.models import quantize as q
from tiny import greedy_identity_runs, tiny_llama

GREEDY = se.SamplingParams(temperature=0)
PROMPT = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2]])
BITS = {"bf16": 16, "int8": 8, "int4": 4}


def linear(out_features: int, in_features: int, seed: int = 0, bias: bool = False) -> nn.Linear:
    torch.manual_seed(seed)
    layer = nn.Linear(in_features, out_features, bias=bias)
    layer.requires_grad_(False)
    return layer


# ------------------------------------------------------------------------------------------- the arithmetic


def test_int8_rows_round_each_weight_to_its_rows_step():
    weight = linear(24, 64).weight
    codes, scales = q.int8_rows(weight)
    assert codes.dtype == torch.int8 and scales.dtype == torch.bfloat16 and scales.shape == (24,)
    error = (codes.float() * scales.float()[:, None] - weight).abs()
    assert (error <= scales.float()[:, None] * 0.5 * (1 + 1e-3)).all()        # round to nearest of the row's grid
    assert (codes.abs() == 127).any(dim=1).sum() >= 20                         # the grid spans each row (bf16 scales)


def test_int4_groups_round_each_weight_to_its_groups_step():
    weight = linear(16, 96).weight
    codes, scales, zeros = q.int4_groups(weight, group=32)
    assert codes.min() >= 0 and codes.max() <= 15 and scales.shape == zeros.shape == (16, 3)
    error = (q.dequantize_int4(codes, scales, zeros, group=32) - weight).abs()
    step = scales.float().repeat_interleave(32, dim=1)
    assert (error <= step * 0.5 + 1e-2 * step.amax()).all()     # half a step, plus the bf16 rounding of the zero
    with pytest.raises(ValueError, match="divisible by 32"):
        q.int4_groups(linear(16, 40).weight, group=32)


@pytest.mark.parametrize("out_features", [32, 10])      # 10: output rows padded to the kernel's multiple of 16
def test_the_kernels_multiply_by_the_quantized_weights(out_features):
    layer = linear(out_features, 64, seed=1, bias=True)
    x = torch.randn(3, 5, 64)
    for module, weight in ((q.Int8Linear(layer), q.Int8Linear(layer).dequantized()),
                           (q.Int4Linear(layer), q.dequantize_int4(*q.int4_groups(layer.weight)))):
        reference = x.to(torch.bfloat16).float() @ weight.T + layer.bias                 # [3, 5, out]
        out = module(x)
        assert out.shape == (3, 5, out_features) and out.dtype == torch.float32
        torch.testing.assert_close(out, reference, atol=0.05, rtol=0.02)               # bf16 output rounding
        assert not torch.allclose(out, layer(x), atol=1e-4)                            # it is not the fp32 product


# ------------------------------------------------------------------------------------------- whole models


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=8, layers=3, seed=0)


@pytest.mark.parametrize("scheme", q.TORCH_SCHEMES)
def test_a_quantized_copy_leaves_the_original_untouched_and_is_smaller(target, scheme):
    before = target(PROMPT).logits
    state = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    buffers = {name: tensor.clone() for name, tensor in target.named_buffers()}
    copy = q.quantized_copy(target, scheme)
    assert torch.equal(target(PROMPT).logits, before)
    assert all(torch.equal(tensor, state[name]) for name, tensor in target.state_dict().items())
    assert all(tensor.dtype == buffers[name].dtype and torch.equal(tensor, buffers[name])
               for name, tensor in target.named_buffers())
    after = copy(PROMPT).logits.float()
    assert 0 < (after - before).abs().max() < 0.25 * before.abs().max()               # changed, a little
    ratio = q.weight_bytes_per_token(copy) / q.weight_bytes_per_token(target)
    assert ratio < {"bf16": 0.51, "int8": 0.35, "int4": 0.25}[scheme], ratio
    kinds = {type(m) for m in copy.model.layers[0].modules()}
    assert (q.Int8Linear in kinds) == (scheme == "int8") and (q.Int4Linear in kinds) == (scheme == "int4")


def test_the_lean_forward_declines_quantized_linears_and_keeps_bf16(target):
    assert lean_llama.unsupported_reason(q.quantized_copy(target, "int8").model).endswith(
        "has quantized projections (transformers' modules run them)")
    assert lean_llama.unsupported_reason(q.quantized_copy(target, "bf16").model) is None


@pytest.mark.parametrize("scheme", q.TORCH_SCHEMES)
def test_the_quantized_self_draft_reproduces_plain_greedy_decoding(target, scheme):
    plain, runs = greedy_identity_runs(target, lambda: se.make_drafter(f"quantized-self:{BITS[scheme]}",
                                                                       type("Loaded", (), {"model": target})),
                                       PROMPT)
    assert len(plain.tokens) == 30
    for k, result in runs.items():
        assert result.tokens == plain.tokens, k
        assert len(result.rounds) < 30 if k > 1 else True            # drafts were accepted: not plain decoding


def test_where_the_int4_copy_disagrees_the_full_precision_target_decides():
    """A target (seed 1, vocabulary 10) where the int4 copy's argmax differs from the target's in some rounds: those
    drafts are rejected and the target's token is emitted, so the text is still plain decoding's."""
    target = tiny_llama(vocab=10, layers=2, seed=1)
    plain, runs = greedy_identity_runs(target, lambda: se.QuantizedSelfDrafter(target, "int4"), PROMPT, ks=(3,))
    rejected = [r for r in runs[3].rounds if r.drafted and r.accepted < len(r.drafted)]
    assert rejected and runs[3].tokens == plain.tokens


def test_other_architectures_gemma_drafts_exactly_and_gpt2_conv1d_is_refused():
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=64, hidden_size=64, intermediate_size=128, head_dim=16,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    gemma.eval().requires_grad_(False)
    plain, runs = greedy_identity_runs(gemma, lambda: se.QuantizedSelfDrafter(gemma, "int4"), PROMPT, ks=(3,),
                                       tokens=12)
    assert runs[3].tokens == plain.tokens
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0))
    with pytest.raises(ValueError, match="no floating-point nn.Linear layers besides its LM head"):
        q.quantized_copy(gpt2.eval(), "int8")


def test_the_quantized_self_draft_is_registered_and_checks_its_target(target):
    spec = se.parse_draft("quantized-self:4")
    assert spec.arg == 4 and "quantized-self" in se.draft_modes()
    with pytest.raises(ValueError, match="one of 16, 8, 4"):
        se.parse_draft("quantized-self:2")
    drafter = se.QuantizedSelfDrafter(target, "int4")
    assert drafter.name == "quantized-self:int4"
    with pytest.raises(ValueError, match="drafts for the model it was copied from"):
        se.SpeculativeDecoder(tiny_llama(vocab=8, layers=3, seed=5), drafter).generate(
            PROMPT, k=2, max_new_tokens=4, sampling=GREEDY)
    with pytest.raises(ValueError, match="one of bf16, int8, int4"):
        se.QuantizedSelfDrafter(target, "int3")


def test_drafters_of_one_target_share_its_quantized_copy(target):
    """The app builds a drafter per run: the copy is made once per target and scheme, not once per run."""
    first, second = se.QuantizedSelfDrafter(target, "int8"), se.QuantizedSelfDrafter(target, "int8")
    assert first.model is second.model
    other = tiny_llama(vocab=8, layers=3, seed=0)
    assert se.QuantizedSelfDrafter(other, "int8").model is not first.model
    assert se.QuantizedSelfDrafter(target, "int4").model is not first.model


@pytest.mark.slow         # SmolLM2-135M: three quantized copies and 3 x 2 decodes of 24 tokens
def test_on_smollm2_each_self_draft_gives_plain_decodings_text(smollm2):
    prompt = smollm2.encode_prompt("Name three colours of the rainbow.")
    plain = se.autoregressive_generate(smollm2.model, prompt, max_new_tokens=24, sampling=GREEDY)
    for bits in BITS.values():
        drafter = se.make_drafter(f"quantized-self:{bits}", smollm2)
        result = se.SpeculativeDecoder(smollm2.model, drafter).generate(prompt, k=3, max_new_tokens=24,
                                                                        sampling=GREEDY)
        assert result.tokens == plain.tokens, bits
        assert len(result.rounds) < 24, bits                      # the copy's drafts were accepted


# ------------------------------------------------------------------------------------------- load_model


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    """A random 2-layer Llama (hidden 64) saved with a small BPE tokenizer of its own."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from hub_cache import tiny_gpt2

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt2(tmp_path_factory.mktemp("tokenizer")))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("quantization", ["bf16", "int8", "int4", "8bit", "4bit"])
def test_each_format_loads_on_the_cpu_and_decodes_exactly(llama_dir, quantization):
    messages = []
    loaded = load_model(str(llama_dir), device="cpu", quantization=quantization, progress=messages.append)
    assert loaded.quantization == quantization and loaded.device.type == "cpu"
    proj = loaded.model.model.layers[0].mlp.up_proj
    expected = {"bf16": "Linear", "int8": "Int8Linear", "int4": "Int4Linear", "8bit": "Linear8bitLt",
                "4bit": "Linear4bit"}[quantization]
    assert type(proj).__name__ in (expected, "PackedLinear" if quantization == "bf16" else expected)
    assert loaded.dtype == (torch.bfloat16 if quantization == "bf16" else torch.float32)
    if quantization in ("int8", "int4"):
        assert any("read per token" in m for m in messages) and not lean_llama.enabled(loaded.model)
    prompt = loaded.encode_prompt("The capital of France is", chat=False)
    plain = se.autoregressive_generate(loaded.model, prompt, max_new_tokens=12, sampling=GREEDY)
    spec = se.SpeculativeDecoder(loaded.model, se.PromptLookupDrafter()).generate(prompt, k=3, max_new_tokens=12,
                                                                                 sampling=GREEDY)
    assert len(plain.tokens) == 12
    if quantization not in ("8bit", "4bit"):      # bitsandbytes' CPU products may round k + 1 rows differently
        assert spec.tokens == plain.tokens


def test_formats_are_checked_before_loading_and_name_what_is_missing(llama_dir, monkeypatch):
    with pytest.raises(ValueError, match="quantization must be None, 'bf16', 'int8', 'int4' .torch. or '8bit'"):
        check_quantization("3bit", torch.device("cpu"))
    with pytest.raises(ModelLoadError, match="torch's CPU kernels; the model is on cuda"):
        check_quantization("int4", torch.device("cuda"))
    with pytest.raises(ValueError, match="contradicts dtype=torch.float32"):
        load_model(str(llama_dir), device="cpu", dtype="float32", quantization="bf16")
    monkeypatch.setattr(loading, "_find_spec", lambda name: None if name == "bitsandbytes" else object())
    with pytest.raises(ModelLoadError, match="needs bitsandbytes, which is not installed"):
        load_model(str(llama_dir), device="cpu", quantization="4bit")


# ------------------------------------------------------------------------------------------- bench/quantized.py


def test_the_benchmark_measures_what_it_says_on_a_tiny_model(target):
    """bench/quantized.py's measurements on a tiny model: fp32 against itself agrees fully, every quantized row
    reads fewer bytes, and the self-drafts' runs (checked inside against plain decoding) report their forwards."""
    from types import SimpleNamespace
    from bench.quantized import measure_drafts, measure_targets, report

    args = SimpleNamespace(tokens=6, repeats=1, k=2, threads=1, prompts=1)
    rows, plain = measure_targets(target, {"p": PROMPT}, args)
    by_name = {row["target"]: row for row in rows}
    assert list(by_name) == ["fp32", "fp32 (transformers' modules)", "bf16", "int8", "int4"]
    assert by_name["fp32"]["top1_agreement"] == 1.0 and by_name["fp32"]["kl_nats"] == 0.0
    assert by_name["fp32"]["first_divergence"] == {"p": None} and len(plain["p"]) == 6
    assert all(by_name[s]["weight_mb_per_token"] < by_name["fp32"]["weight_mb_per_token"] for s in q.TORCH_SCHEMES)
    assert all(by_name[s]["kl_nats"] > 0 for s in q.TORCH_SCHEMES)
    drafts = measure_drafts(target, {"p": PROMPT}, plain, args)
    assert [d["draft"] for d in drafts] == [f"quantized-self:{s}" for s in q.TORCH_SCHEMES]
    assert all(1 <= d["tokens_per_forward"] <= args.k + 1 and d["speedup"] > 0 for d in drafts)
    assert "| int4 |" in report([], args, rows, drafts, (0.0, 0.0))
