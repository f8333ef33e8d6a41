"""The engine on a CUDA GPU: exactness, cache invariants, quantized and accelerate-placed targets, and the
number of device-to-host synchronisations per round. Skipped where no GPU is present (CI); bench/gpu_check.sh
runs it on a lent GPU machine.

Real-model checks use a seeded random-weight model of SmolLM2-135M's shape (`spec_engine.bench.random_target`):
the packaged GGUF (98 MB) cannot travel to the lent machine, and greedy identity holds for any weights.
The tokenizer comes from $SPEC_TOKENIZER_DIR there (bench/gpu_prepare.sh), or from the packaged model.
"""
import copy
import warnings

import pytest
import torch

import spec_engine as se
from spec_engine.accel import lean_llama
from spec_engine.drafters.eagle import random_eagle_drafter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
PROMPT = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2]


GREEDY = se.SamplingParams(temperature=0.0)


def greedy_pair(target_model, drafter, prompt: torch.Tensor, tokens: int, k: int = 4):
    spec = se.SpeculativeDecoder(target_model, drafter).generate(prompt, k=k, max_new_tokens=tokens, sampling=GREEDY)
    plain = se.autoregressive_generate(target_model, prompt, max_new_tokens=tokens, sampling=GREEDY)
    return spec, plain


@pytest.fixture(scope="module")
def tiny_cuda():
    """Built (and adopted by the CPU speed layer: packed linears, the lean forward) on the CPU, then moved: the lean
    path must switch itself off on CUDA, and nothing may pack or build CPU kernels for these weights."""
    from tiny import tiny_llama
    return tiny_llama(vocab=8, layers=3, seed=0).to(CUDA), tiny_llama(vocab=8, layers=1, seed=1).to(CUDA)


@pytest.fixture(scope="module")
def random_smollm2():
    """No dtype given: a model of 0.5B parameters or less defaults to float32 on CUDA (greedy identity holds)."""
    from spec_engine.bench import random_target
    return random_target("random-smollm2-135m", device="cuda")


def drafters_for(model, draft_model=None):
    out = {"prompt-lookup": se.PromptLookupDrafter(), "layer-skip": se.LayerSkipDrafter(model, [1]),
           "eagle (random head)": random_eagle_drafter(model, scale=3.0)}
    if draft_model is not None:
        out["model"] = se.ModelDrafter(draft_model)
    return out


def test_tiny_models_greedy_identity_on_cuda(tiny_cuda):
    target, draft = tiny_cuda
    prompt = torch.tensor([PROMPT], device=CUDA)
    for name, drafter in drafters_for(target, draft).items():
        spec, plain = greedy_pair(target, drafter, prompt, 24, k=3)
        assert spec.tokens == plain.tokens, name
        assert {p.device.type for p in getattr(drafter, "head", target).parameters()} == {"cuda"}, name
    assert lean_llama.lean_layers(target) is None and lean_llama.lean_layers(draft) is None   # off on CUDA


def test_tiny_models_exact_rule_distribution_on_cuda(tiny_cuda):
    """First three tokens of speculative sampling on CUDA vs the exact enumeration (chi-square, alpha 1e-4:
    a correct sampler fails with probability 1e-4 for a random choice of seeds; the seeds are fixed)."""
    from test_statistical import ALPHA, LENGTH, chi_square_pvalue, exact_joint
    target, draft = tiny_cuda
    params = se.SamplingParams(temperature=1.0, top_p=0.9)
    prompt = torch.tensor([PROMPT], device=CUDA)
    joint = exact_joint(copy.deepcopy(target).cpu(), prompt.cpu(), params)    # the shared fixture stays on CUDA
    decoder = se.SpeculativeDecoder(target, se.ModelDrafter(draft))
    samples = [tuple(decoder.generate(prompt, k=2, max_new_tokens=LENGTH, sampling=params, seed=s).tokens)
               for s in range(1500)]
    assert chi_square_pvalue(samples, joint) > ALPHA


def test_random_smollm2_shape_greedy_identity_fp32(random_smollm2):
    assert random_smollm2.dtype == torch.float32 and random_smollm2.model.dtype == torch.float32
    prompt = random_smollm2.encode_prompt("Write three sentences about the sea, then repeat them.")
    for name, drafter in drafters_for(random_smollm2.model, random_smollm2.model).items():
        spec, plain = greedy_pair(random_smollm2.model, drafter, prompt, 48)
        assert spec.tokens == plain.tokens, name
        assert spec.rounds[-1].target_cache_len == spec.rounds[-1].committed_len - 1


def test_plain_decoding_clocks_wait_for_the_gpu(random_smollm2):
    """Plain decoding's step clocks synchronize (core/timing.py): the steps account for most of the run, and the
    speculative rounds' draft + verify never exceed the round. Without the synchronize a step timed the launch and
    its forward was billed to the next token's sampling, outside every step."""
    prompt = random_smollm2.encode_prompt("Count from one to twenty in words.")
    plain = se.autoregressive_generate(random_smollm2.model, prompt, max_new_tokens=32, sampling=GREEDY)
    assert len(plain.step_seconds) == 31 and min(plain.step_seconds) > 0
    assert plain.prefill_seconds + sum(plain.step_seconds) <= plain.total_seconds
    assert sum(plain.step_seconds) >= 0.5 * (plain.total_seconds - plain.prefill_seconds)
    spec = se.SpeculativeDecoder(random_smollm2.model, se.PromptLookupDrafter()).generate(
        prompt, k=4, max_new_tokens=32, sampling=GREEDY)
    assert all(0 <= r.draft_seconds + r.verify_seconds <= r.round_seconds for r in spec.rounds)


def test_bf16_runs_keep_the_cache_invariant():
    """bf16 verification of k + 1 positions can flip a near-tie argmax against one-token decoding, so greedy
    identity is only 'within bf16 numerics' (fp32 identity is asserted above). The engine checks the cache
    invariant every round; here every drafter must finish with the right length and commit what it emits."""
    from spec_engine.bench import random_target
    loaded = random_target("random-smollm2-135m", device="cuda", dtype="bfloat16")
    prompt = loaded.encode_prompt("Count from one to twenty in words.")
    for name, drafter in drafters_for(loaded.model, loaded.model).items():
        spec, plain = greedy_pair(loaded.model, drafter, prompt, 40)
        assert len(spec.tokens) == 40 and spec.stop_reason == "max_new_tokens", name
        same = sum(a == b for a, b in zip(spec.tokens, plain.tokens))
        print(f"bf16 {name}: {same}/40 tokens equal to plain decoding")


def test_device_to_host_syncs_per_round(random_smollm2):
    """Counts the synchronising CUDA calls of greedy prompt-lookup rounds (torch's sync debug mode). The engine
    needs the accepted count on the host once per round; verification and the event each move their numbers in
    one transfer. The bound (6 per round) fails if per-token transfers creep back into the loop."""
    prompt = random_smollm2.encode_prompt("Repeat after me: the cat sat on the mat, the cat sat on the mat.")
    decoder = se.SpeculativeDecoder(random_smollm2.model, se.PromptLookupDrafter())
    state = decoder.start(prompt, k=4, max_new_tokens=32, sampling=GREEDY)
    decoder.step(state)                                       # warm-up round
    syncs, rounds = synchronising_calls(decoder, state)
    print(f"{syncs} synchronising calls in {rounds} rounds")
    assert syncs <= 6 * rounds


def synchronising_calls(decoder, state, most_rounds: int = 8) -> tuple[int, int]:
    """(synchronising calls CUDA's sync debug mode warned about, rounds) over up to `most_rounds` more rounds."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rounds = 0
            while state.stop_reason is None and rounds < most_rounds:
                decoder.step(state)
                rounds += 1
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught), rounds


@pytest.fixture(scope="module")
def saved_random_dir(tmp_path_factory):
    from spec_engine.bench import random_target
    loaded = random_target("random-smollm2-135m", device="cpu", dtype="float32")
    path = tmp_path_factory.mktemp("random-smollm2")
    loaded.model.save_pretrained(path)
    loaded.tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("quantization", ["8bit", "4bit"])
def test_bitsandbytes_targets_greedy_identity(saved_random_dir, quantization):
    pytest.importorskip("bitsandbytes")
    loaded = se.load_model(str(saved_random_dir), device="cuda", dtype="bfloat16", quantization=quantization)
    prompt = loaded.encode_prompt("Say hello twice: hello hello.")
    for name, drafter in {"prompt-lookup": se.PromptLookupDrafter(), "model": se.ModelDrafter(loaded.model)}.items():
        spec, plain = greedy_pair(loaded.model, drafter, prompt, 24)
        same = sum(a == b for a, b in zip(spec.tokens, plain.tokens))
        print(f"{quantization} {name}: {same}/24 tokens equal to plain decoding")
        assert len(spec.tokens) == 24


def test_device_map_auto_target(saved_random_dir):
    pytest.importorskip("accelerate")
    loaded = se.load_model(str(saved_random_dir), dtype="float32", device_map="auto")
    assert loaded.device.type == "cuda"
    prompt = loaded.encode_prompt("One, two, three, one, two, three.")
    spec, plain = greedy_pair(loaded.model, se.PromptLookupDrafter(), prompt, 32)
    assert spec.tokens == plain.tokens


def captured_runner():
    """The active static layer's CUDA runner (core/captured.py CapturedSteps)."""
    from spec_engine.core import captured, speed
    runner = speed.active().runners["cuda"]
    assert isinstance(runner, captured.CapturedSteps)
    return runner


def test_captured_path_greedy_identity_on_cuda(tiny_cuda, random_smollm2):
    """The static path's fixed-shape forwards replayed from CUDA graphs give plain decoding's tokens on the default
    path, for every drafter, on the tiny models and the SmolLM2-135M shape in fp32; graphs are replayed far more
    often than captured (one per bucket, model and cache buffers)."""
    from spec_engine.core import static_cache
    target, draft = tiny_cuda
    cases = [(target, draft, torch.tensor([PROMPT], device=CUDA)),
             (random_smollm2.model, random_smollm2.model,
              random_smollm2.encode_prompt("Write three sentences about the sea, then repeat them."))]
    for model, draft_model, prompt in cases:
        reference = se.autoregressive_generate(model, prompt, max_new_tokens=40, sampling=GREEDY).tokens
        with static_cache.use(512, fixed=True):
            for name, drafter in drafters_for(model, draft_model).items():
                spec, plain = greedy_pair(model, drafter, prompt, 40, k=4)
                assert spec.tokens == plain.tokens == reference, name
            runner = captured_runner()
            print(f"{runner.captures} graphs captured, {runner.replays} replays")
            assert runner.captures >= 1 and runner.replays >= 4 * runner.captures


def test_captured_path_kv_invariant_and_trimmed_logits_every_round(random_smollm2):
    from transformers import DynamicCache

    from spec_engine.core import static_cache
    from spec_engine.core.cache import cache_len, forward_logits
    model = random_smollm2.model
    prompt = random_smollm2.encode_prompt("Repeat after me: the cat sat on the mat, the cat sat on the mat.")
    with static_cache.use(512, fixed=True):
        for name, drafter in drafters_for(model).items():
            decoder = se.SpeculativeDecoder(model, drafter)
            state = decoder.start(prompt, k=4, max_new_tokens=24, sampling=se.SamplingParams(0.8), seed=3)
            while state.stop_reason is None:
                event = decoder.step(state)
                assert cache_len(state.target_cache) == len(state.committed) - 1 == event.target_cache_len, name
                trimmed = forward_logits(model, state.committed[-1:], state.target_cache, 1)[-1]
                state.target_cache.crop(-1)
                fresh = forward_logits(model, state.committed, DynamicCache(config=model.config), 1)[-1]
                assert torch.allclose(trimmed, fresh, atol=1e-3), name


def test_captured_path_exact_rule_distribution(tiny_cuda):
    """As test_tiny_models_exact_rule_distribution_on_cuda, on the captured path (alpha 1e-4, fixed seeds)."""
    from test_statistical import ALPHA, LENGTH, chi_square_pvalue, exact_joint

    from spec_engine.core import static_cache
    target, draft = tiny_cuda
    params = se.SamplingParams(temperature=1.0, top_p=0.9)
    prompt = torch.tensor([PROMPT], device=CUDA)
    joint = exact_joint(copy.deepcopy(target).cpu(), prompt.cpu(), params)
    with static_cache.use(64, fixed=True):
        decoder = se.SpeculativeDecoder(target, se.ModelDrafter(draft))
        samples = [tuple(decoder.generate(prompt, k=2, max_new_tokens=LENGTH, sampling=params, seed=s).tokens)
                   for s in range(1500)]
    assert chi_square_pvalue(samples, joint) > ALPHA


def test_captured_path_syncs_per_round(random_smollm2):
    """The fixed-shape forward adds no synchronising call: the default path's bound (6 per round) holds."""
    from spec_engine.core import static_cache
    prompt = random_smollm2.encode_prompt("Repeat after me: the cat sat on the mat, the cat sat on the mat.")
    with static_cache.use(512, fixed=True):
        decoder = se.SpeculativeDecoder(random_smollm2.model, se.PromptLookupDrafter())
        state = decoder.start(prompt, k=4, max_new_tokens=32, sampling=GREEDY)
        for _ in range(2):
            decoder.step(state)                               # warm-up rounds: captures
        syncs, rounds = synchronising_calls(decoder, state)
    print(f"captured path: {syncs} synchronising calls in {rounds} rounds")
    assert syncs <= 6 * rounds
