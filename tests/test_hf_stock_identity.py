"""Greedy identity against Hugging Face `generate()` on stock, unpatched transformers modules (issue #23).

tests/test_real_models.py holds the engine against the engine: both sides run the engine's own forward (on the CPU
the lean Llama path, packed linear layers and the engine's attention, all set up by load_model). Here the reference
is transformers alone: the offline default (SmolLM2-135M-Instruct, fp32, CPU) loaded a second time with
`AutoModelForCausalLM.from_pretrained`, nothing of spec_engine applied to it, decoding with its own `generate()`
(do_sample=False, its own DynamicCache, one stock forward per token). The engine's plain decoding and its
speculative decoding (prompt lookup, EAGLE + lookup; k = 4) must give the same token ids, token for token, on
chat-templated prompts as the app encodes them (chat=True).

Only the public API (`import spec_engine as se`) is used, so the test holds whichever forward the engine runs
(lean or transformers' modules, with or without its CPU kernels: SPEC_ENGINE_LEAN=0, SPEC_ENGINE_ACCEL=0).
On a mismatch the failure names the first differing position with both sides' top-2 logit margins there, so a
float near-tie can be told from a real bug.
"""
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
from transformers.models.llama.modeling_llama import LlamaForCausalLM

import spec_engine as se

PROMPTS = [
    # ends at EOS after 33 tokens (checked below: the run that stops at EOS, with 30+ tokens before it)
    "Rewrite these sentences in the past tense: The cat sits on the mat and watches the birds. "
    "The dog runs in the park and barks at the children. The sun sets behind the hills.",
    "Write a Python function that returns the factorial of n.",                          # code, runs to the limit
    "Give me three tips for learning a new language, one short sentence each.",         # repeats itself: lookup hits
    "Explain in a few sentences why the sky is blue.",
]
NEW_TOKENS = 48
MIN_COMPARED = 30            # tokens compared per prompt at least, so a run that stops early cannot pass
K = 4
# (draft name for se.make_drafter, fixed_length): as the app sizes drafts (by the measured verify cost), and with
# every round drafting k where it can, so 5-row verify forwards are held against stock one-row steps too.
DRAFTS = [("prompt-lookup", False), ("eagle+lookup", False), ("prompt-lookup", True), ("eagle+lookup", True)]
pytestmark = pytest.mark.measured_costs     # drafts sized by this machine's measured verify costs, as in the app


def load_stock(source: str):
    """The engine's weights, loaded again by transformers alone. load_model reports where it read them
    (LoadedModel.source): on every start but the first, "cache:<dir>", the plain float32 safetensors checkpoint it
    dequantized from the packaged GGUF; that directory is what this loads (a second of work, the same float32
    numbers; checked bit for bit below). On a first start ("gguf:<file>") it dequantizes the GGUF as load_model did."""
    kind, _, where = source.partition(":")
    if kind in ("cache", "local", "hub"):
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(where)
    elif kind == "gguf":
        gguf = Path(where)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    else:
        raise AssertionError(f"unexpected LoadedModel.source {source!r}")
    return model.to("cpu").eval(), tokenizer


@pytest.fixture(scope="module")
def stock(smollm2):
    """(model, tokenizer) of transformers alone, from the engine's weights."""
    return load_stock(smollm2.source)


@pytest.fixture(scope="module")
def prompts(request):
    """The default tier compares the first two prompts (one run ends at EOS, one at the limit; the first repeats the
    prompt, so lookup drafts are accepted); the full tier (pytest --full) all four."""
    return PROMPTS if request.config.getoption("--full") else PROMPTS[:2]


@pytest.fixture(scope="module")
def prompt_ids(stock, prompts):
    """The prompts chat-templated by the stock tokenizer: one user turn and the assistant header, as the app does."""
    _, tokenizer = stock
    encoded = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True, return_tensors="pt")["input_ids"]
               for p in prompts]
    return [ids.to(torch.long) for ids in encoded]


@pytest.fixture(scope="module")
def reference(stock, prompt_ids):
    """Stock `generate()` per prompt: (new token ids, ending with EOS when it stopped there; the raw logits of
    every step [vocab], for the diagnosis of a mismatch)."""
    model, tokenizer = stock
    runs = []
    for ids in prompt_ids:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, temperature=None, top_p=None,
                             top_k=None, num_beams=1, max_new_tokens=NEW_TOKENS, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id, return_dict_in_generate=True, output_logits=True)
        tokens = out.sequences[0, ids.shape[1]:].tolist()
        runs.append((tokens, [step[0].clone() for step in out.logits]))
    return runs


def top2(logits: torch.Tensor) -> str:
    values, ids = torch.topk(logits.float(), 2)
    return (f"top-2 ids {ids.tolist()} logits {[round(v, 5) for v in values.tolist()]} "
            f"margin {values[0].item() - values[1].item():.6f}")


def engine_rows(rounds) -> list:
    """The target's top-3 (id, temperature-1 probability) for each token the engine emitted, in order."""
    return [row for r in rounds for row in r.target_top[:len(r.emitted)]]


class NoDraft(se.Drafter):
    """Drafts nothing: every round is one one-token target forward, plain decoding with each step's top-3 shown."""
    name = "no-draft"

    def propose(self, committed, k, params, generator):
        return se.Proposal([], None)


def assert_identical(label: str, expected: list[int], got: list[int], reference_logits, smollm2, ids, rounds=None):
    """`got` equals `expected` token for token (both stop at EOS, inclusive, or at NEW_TOKENS); else fail with the
    first differing position and both sides' top-2 margins there."""
    if got == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    lines = [f"{label}: the engine differs from stock HF generate() at new token {first} "
             f"(HF {len(expected)} tokens, engine {len(got)})"]
    tokenizer = smollm2.tokenizer
    lines.append(f"  common text: {tokenizer.decode(expected[:first])!r}")
    lines.append(f"  HF next: {expected[first:first + 1]} {tokenizer.decode(expected[first:first + 1])!r}, "
                 f"engine next: {got[first:first + 1]} {tokenizer.decode(got[first:first + 1])!r}")
    if first < len(reference_logits):
        logits = reference_logits[first]
        lines.append(f"  HF generate step logits: {top2(logits)}")
        if first < len(got):
            lines.append(f"  HF logit of HF's token {logits[expected[first]].item():.6f}, "
                         f"of the engine's token {logits[got[first]].item():.6f}")
    if rounds is None:           # plain decoding: the same one-token steps, through the decoder to see its top-3
        sampling = se.SamplingParams(0.0)
        rounds = se.SpeculativeDecoder(smollm2.model, NoDraft()).generate(
            ids, k=1, max_new_tokens=NEW_TOKENS, sampling=sampling, eos_token_id=tokenizer.eos_token_id).rounds
    rows = engine_rows(rounds)
    if first < len(rows):
        (a, pa), (b, pb) = rows[first][:2]
        margin = math.log(pa / pb) if pb > 0 else math.inf
        lines.append(f"  engine step: top-2 ids [{a}, {b}] probabilities [{pa:.6g}, {pb:.6g}] "
                     f"logit margin {margin:.6f}")
    pytest.fail("\n".join(lines), pytrace=False)


def test_the_reference_is_stock_transformers_with_the_engines_weights(smollm2, stock):
    """Nothing of spec_engine reaches the reference: transformers' own classes and forwards, its own SDPA attention,
    none of the attributes load_model adds (the lean path's fused projections, packed linear layers, measured costs),
    and the same float32 numbers as the engine's model, bit for bit."""
    model, tokenizer = stock
    engine = smollm2.model
    assert model is not engine
    assert type(model) is LlamaForCausalLM and type(model).forward is LlamaForCausalLM.forward
    assert model.config._attn_implementation == "sdpa"
    assert not model.training
    stock_modules, engine_modules = list(model.named_modules()), list(engine.named_modules())
    assert [n for n, _ in stock_modules] == [n for n, _ in engine_modules]
    for (name, mine), (_, theirs) in zip(stock_modules, engine_modules):
        assert type(mine).__module__.startswith(("transformers.", "torch.nn.")), (name, type(mine))
        assert "forward" not in vars(mine), f"{name}: forward replaced on the instance"
        if isinstance(mine, nn.Linear):
            assert type(mine) is nn.Linear, (name, type(mine))
        added = set(vars(theirs)) - set(vars(mine))          # what load_model put on the engine's copy
        assert not [a for a in added if hasattr(mine, a)], (name, added)
        assert not [a for a in vars(mine) if "spec_engine" in a], name
    engine_state, stock_state = engine.state_dict(), model.state_dict()
    assert engine_state.keys() == stock_state.keys()
    for key, value in stock_state.items():
        assert value.dtype == torch.float32 and torch.equal(value, engine_state[key]), key
        assert value.data_ptr() != engine_state[key].data_ptr(), f"{key} shares memory with the engine's model"
    assert tokenizer.eos_token_id == smollm2.tokenizer.eos_token_id == model.generation_config.eos_token_id
    print(f"\nengine model: attention {engine.config._attn_implementation!r}, linear classes "
          f"{sorted({type(m).__name__ for m in engine.modules() if isinstance(m, nn.Linear)})}, attributes added "
          f"{sorted(set(vars(engine)) - set(vars(model)))}; reference: source {smollm2.source}")


def test_prompts_are_chat_templated_as_the_app_encodes_them(smollm2, prompts, prompt_ids):
    for prompt, ids in zip(prompts, prompt_ids, strict=True):
        assert torch.equal(smollm2.encode_prompt(prompt, chat=True), ids)


def test_the_reference_runs_are_long_enough_and_cover_both_stops(smollm2, reference):
    eos = smollm2.tokenizer.eos_token_id
    lengths = [len(tokens) for tokens, _ in reference]
    assert min(lengths) >= MIN_COMPARED, lengths
    stopped_at_eos = [tokens[-1] == eos for tokens, _ in reference]
    assert all(eos not in tokens[:-1] for tokens, _ in reference)
    assert all(n == NEW_TOKENS or ended for n, ended in zip(lengths, stopped_at_eos))
    # both ways a run ends are compared: at EOS (inclusive) and at max_new_tokens
    assert any(stopped_at_eos) and not all(stopped_at_eos), (lengths, stopped_at_eos)


def test_plain_decoding_matches_stock_generate(smollm2, prompt_ids, reference):
    eos = smollm2.tokenizer.eos_token_id
    for index, (ids, (expected, logits)) in enumerate(zip(prompt_ids, reference)):
        result = se.autoregressive_generate(smollm2.model, ids, max_new_tokens=NEW_TOKENS,
                                            sampling=se.SamplingParams(0.0), eos_token_id=eos)
        assert len(expected) >= MIN_COMPARED
        assert_identical(f"plain, prompt {index}", expected, result.tokens, logits, smollm2, ids)
        assert result.stop_reason == ("eos" if expected[-1] == eos else "max_new_tokens")


@pytest.mark.parametrize("draft,fixed_length", DRAFTS,
                         ids=[f"{d}-{'fixed-k' if f else 'cost-sized'}" for d, f in DRAFTS])
def test_speculative_decoding_matches_stock_generate(smollm2, prompt_ids, reference, draft, fixed_length):
    eos = smollm2.tokenizer.eos_token_id
    accepted = drafted = rounds = 0
    for index, (ids, (expected, logits)) in enumerate(zip(prompt_ids, reference)):
        decoder = se.SpeculativeDecoder(smollm2.model, se.make_drafter(draft, smollm2, fixed_length=fixed_length))
        result = decoder.generate(ids, k=K, max_new_tokens=NEW_TOKENS, sampling=se.SamplingParams(0.0),
                                  eos_token_id=eos)
        assert len(expected) >= MIN_COMPARED
        assert_identical(f"{draft} (fixed_length={fixed_length}), prompt {index}", expected, result.tokens, logits,
                         smollm2, ids, result.rounds)
        assert result.stop_reason == ("eos" if expected[-1] == eos else "max_new_tokens")
        accepted += sum(r.accepted for r in result.rounds)
        drafted += sum(len(r.drafted) for r in result.rounds)
        rounds += len(result.rounds)
    print(f"\n{draft} fixed_length={fixed_length}: {accepted}/{drafted} drafts accepted, {rounds} rounds for "
          f"{sum(len(t) for t, _ in reference)} tokens")
    assert accepted >= 1, f"{draft}: no draft token accepted over {len(reference)} prompts ({drafted} drafted)"
