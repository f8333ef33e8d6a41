"""EagleDrafter: exactness on tiny models whatever the head proposes (random and briefly trained heads, a reduced
vocabulary whose outside tokens get q = 0; heads reading one or several target layers), head-cache invariants every
round (only committed positions, built from true target features), a training step that lowers the loss, the
shipped weights' sha256, and greedy identity on the real offline default with the shipped head.

The chi-square tests reuse test_statistical's enumeration; each fails falsely with probability ALPHA = 1e-4.
"""
import copy
import json
import os

import pytest
import torch

import spec_engine as se
from spec_engine.core.cache import cache_len
from bench.train_eagle import eagle_loss
from spec_engine.drafters.eagle import (DEFAULT_WEIGHTS, EagleDrafter, EagleHead, head_config, load_head,
                               random_eagle_drafter, save_head, sha256_file, shared_head)
from test_statistical import ALPHA, exact_joint, chi_square_pvalue, speculative_samples
from tiny import greedy_identity_runs, tiny_llama

PROMPT = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2]])
GREEDY = se.SamplingParams(0.0)
REDUCED = torch.tensor([0, 1, 2, 3, 5, 7])          # ids 4 and 6 are never proposed
LAYERS = (0, 2, -1)                                 # a layered head reads the embeddings, layer 2 and the final states


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab=8, layers=3, seed=0)


def layer_features(target, tokens: torch.Tensor, layers=(-1,)) -> torch.Tensor:
    """The target's hidden states of `layers` side by side: tokens [B, L] -> [B, L, len(layers) * H]."""
    with torch.no_grad():
        states = target(input_ids=tokens, output_hidden_states=True).hidden_states
    return torch.cat([states[layer] for layer in layers], dim=-1)


def tiny_batch(target, generator, batch=16, length=24, layers=(-1,)):
    """Random sequences with the tiny target's hidden states: tokens [B, L], features [B, L, F], mask [B, L]."""
    tokens = torch.randint(0, target.config.vocab_size, (batch, length), generator=generator)
    return tokens, layer_features(target, tokens, layers), torch.ones(batch, length)


def train_tiny_head(target, steps: int, seed: int = 0, layers=(-1,)):
    torch.manual_seed(seed)
    head = EagleHead(head_config(target.config, feature_layers=layers))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    embed, rows = target.get_input_embeddings().weight, target.get_output_embeddings().weight[REDUCED]
    losses = []
    for _ in range(steps):
        tokens, features, mask = tiny_batch(target, generator, layers=layers)
        loss, _ = eagle_loss(head, tokens, features, mask, embed, rows, noise=0.05, generator=generator, unroll=2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    for p in head.parameters():
        p.requires_grad_(False)
    return head.eval(), losses


@pytest.fixture(scope="module")
def trained(target):
    return train_tiny_head(target, steps=60)


@pytest.fixture(scope="module")
def layered(target):
    return train_tiny_head(target, steps=60, seed=1, layers=LAYERS)


@pytest.mark.parametrize("which", ["trained", "layered"])
def test_training_step_lowers_the_loss(trained, layered, which):
    _, losses = {"trained": trained, "layered": layered}[which]
    assert sum(losses[-10:]) / 10 < 0.85 * sum(losses[:5]) / 5, losses


def test_layered_head_moves_its_fusion_weights(layered):
    """The fusion layer learns to read the lower layers: not still the pass-through it starts as."""
    head, _ = layered
    hidden = head.config.hidden_size
    assert head.fuse.weight[:, :-hidden].abs().max() > 1e-3


def test_a_widened_head_starts_as_the_single_layer_head(target, trained):
    """bench.train_eagle.widen_head adds a fusion layer that passes the final states through: same predictions and
    drafts as the head it came from, whatever the lower layers hold."""
    from bench.train_eagle import widen_head
    wide = widen_head(trained[0], LAYERS).eval()
    assert wide.feature_layers == LAYERS
    tokens = torch.randint(0, 8, (2, 12), generator=torch.Generator().manual_seed(0))
    embeds = target.get_input_embeddings().weight[tokens[:, 1:]]
    with torch.no_grad():
        narrow_out = trained[0](layer_features(target, tokens)[:, :-1], embeds)
        wide_out = wide(layer_features(target, tokens, LAYERS)[:, :-1], embeds)
    assert torch.allclose(narrow_out, wide_out, atol=1e-5)
    narrow = se.SpeculativeDecoder(target, EagleDrafter(trained[0], target, REDUCED)).generate(PROMPT, k=3,
                                                                                               max_new_tokens=20)
    widened = se.SpeculativeDecoder(target, EagleDrafter(wide, target, REDUCED)).generate(PROMPT, k=3,
                                                                                          max_new_tokens=20)
    assert [r.drafted for r in narrow.rounds] == [r.drafted for r in widened.rounds]


def test_forward_logits_hands_over_the_listed_layers_side_by_side(target):
    from spec_engine.core.cache import forward_logits, new_cache
    ids = PROMPT[0].tolist()
    logits, features = forward_logits(target, ids, new_cache(target), 1, LAYERS)
    assert features.shape == (len(ids), len(LAYERS) * target.config.hidden_size)
    assert torch.allclose(features, layer_features(target, PROMPT, LAYERS)[0], atol=1e-5)


def test_a_layered_head_round_trips_through_its_weights_file(target, layered, tmp_path):
    """fp16 safetensors keep the feature layers (in the config metadata) and the fusion weights."""
    path = tmp_path / "head.safetensors"
    save_head(layered[0], REDUCED, path, {"target": "tiny"})
    head, vocab_index = load_head(path)
    assert head.feature_layers == LAYERS and vocab_index.tolist() == REDUCED.tolist()
    assert torch.equal(head.fuse.weight, layered[0].fuse.weight.half().float())
    first = se.SpeculativeDecoder(target, EagleDrafter(head, target, REDUCED)).generate(PROMPT, k=3, max_new_tokens=16)
    assert first.stats.drafted > 0


@pytest.mark.parametrize("layers", [(), (1, 2), (2, 1, -1), (1, 1, -1), (3, -1), (-2, -1)])
def test_head_config_refuses_bad_feature_layers(target, layers):
    with pytest.raises(ValueError, match="feature_layers"):
        head_config(target.config, feature_layers=layers)


def drafters(target, trained, layered=None):
    return {"random": lambda: random_eagle_drafter(target, seed=1),
            "layered-random": lambda: random_eagle_drafter(target, REDUCED, seed=4, feature_layers=LAYERS),
            "layered-trained": lambda: EagleDrafter(layered[0], target, REDUCED),
            "random-reduced": lambda: random_eagle_drafter(target, REDUCED, seed=2),
            "trained-reduced": lambda: EagleDrafter(trained[0], target, REDUCED),
            "trained-dynamic": lambda: EagleDrafter(trained[0], target, REDUCED, min_confidence=0.5,
                                                    min_path_confidence=0.3),
            "lookup-first": lambda: se.LookupFirstDrafter(EagleDrafter(trained[0], target, REDUCED)),
            # a bf16 head beside the fp32 target, as load_eagle_drafter builds it on CPUs with bf16 dot products
            "trained-bf16": lambda: EagleDrafter(copy.deepcopy(trained[0]).to(torch.bfloat16), target, REDUCED)}

KINDS = ["random", "random-reduced", "trained-reduced", "trained-dynamic", "lookup-first", "layered-random",
         "layered-trained", "trained-bf16"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("params", [GREEDY, se.SamplingParams(0.9, top_k=6, top_p=0.95)], ids=["greedy", "sampled"])
def test_head_cache_holds_committed_positions_every_round(target, trained, layered, kind, params):
    drafter = drafters(target, trained, layered)[kind]()
    decoder = se.SpeculativeDecoder(target, drafter)
    state = decoder.start(PROMPT, k=4, max_new_tokens=30, sampling=params, seed=3)
    accepted, sources, waited = 0, set(), 0
    while state.stop_reason is None:
        event = decoder.step(state)
        accepted += event.accepted
        sources.add(event.note)
        # After a round prompt lookup drafted, the head's catch-up waits (base.FirstThenFallback): its cache holds a
        # prefix of the committed text, and the waiting features cover exactly the rest.
        waiting = sum(len(f) for f in getattr(drafter, "waiting", []))
        waited += waiting > 0
        assert waiting == 0 or event.note == se.drafters.LOOKUP_NOTE
        assert drafter.cache_ids == state.committed[:len(state.committed) - 1 - waiting]
        assert cache_len(drafter.cache) == event.draft_cache_len == len(state.committed) - 1 - waiting
        assert all(t in REDUCED.tolist() for t in event.drafted) or kind in ("random", "lookup-first")
    if kind in ("trained-reduced", "layered-trained", "trained-bf16"):
        assert accepted > 0      # the accepted-draft path is exercised, not only rejections
    if kind == "lookup-first":
        # rounds from both sources, the head kept in step across both
        assert sources == {None, se.drafters.LOOKUP_NOTE}
        assert waited                                         # and a catch-up waited at least once


@pytest.mark.parametrize("which", ["trained", "layered"])
def test_head_cache_equals_a_fresh_pass_over_true_features(target, trained, layered, which):
    """After rounds with accepted drafts, the head's last prediction equals one from a fresh head pass over the
    target's features of the committed text: no predicted feature survives in the cache."""
    head = {"trained": trained, "layered": layered}[which][0]
    drafter = EagleDrafter(head, target, REDUCED)
    decoder = se.SpeculativeDecoder(target, drafter)
    state = decoder.start(PROMPT, k=3, max_new_tokens=20, sampling=GREEDY, seed=0)
    accepted = 0
    while state.stop_reason is None:
        accepted += decoder.step(state).accepted
    assert accepted > 0
    committed = state.committed
    with torch.no_grad():
        features = layer_features(target, torch.tensor([committed]), head.feature_layers)[0, :-1]    # [T - 1, F]
        embeds = target.get_input_embeddings().weight[torch.tensor(committed[1:])]
        fresh = head(features[None], embeds[None])[0, -1]
    assert torch.allclose(drafter._predicted, fresh, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_identity_with_plain_decoding(target, trained, layered, kind):
    base, runs = greedy_identity_runs(target, drafters(target, trained, layered)[kind], PROMPT)
    for result in runs.values():
        assert result.tokens == base.tokens


def test_one_token_prompt(target, trained):
    """No features at prefill: the first round drafts nothing, later rounds draft from the verify features."""
    prompt = PROMPT[:, :1]
    base = se.autoregressive_generate(target, prompt, max_new_tokens=12, sampling=GREEDY)
    result = se.SpeculativeDecoder(target, EagleDrafter(trained[0], target, REDUCED)).generate(
        prompt, k=3, max_new_tokens=12, sampling=GREEDY)
    assert result.tokens == base.tokens and result.rounds[0].drafted == []


def test_dynamic_draft_length_drafts_fewer_when_unsure(target, trained):
    """min_confidence cuts rounds short (some drafted < k, never empty while features exist) and 0 never does."""
    lengths = {}
    for confidence in (0.0, 0.5):
        drafter = EagleDrafter(trained[0], target, REDUCED, min_confidence=confidence)
        result = se.SpeculativeDecoder(target, drafter).generate(PROMPT, k=4, max_new_tokens=40, sampling=GREEDY)
        lengths[confidence] = [len(r.drafted) for r in result.rounds
                               if r.k == 4 and r.committed_len < len(PROMPT[0]) + 36]
    assert set(lengths[0.0]) == {4}
    assert min(lengths[0.5]) >= 1 and any(n < 4 for n in lengths[0.5])
    with pytest.raises(ValueError, match="min_confidence"):
        EagleDrafter(trained[0], target, REDUCED, min_confidence=1.0)


def test_path_confidence_skips_the_head_steps_of_unlikely_drafts(target, trained, monkeypatch):
    """min_path_confidence stops drafting once the product of the head's top probabilities is below it: fewer head
    steps and shorter drafts than without it, the same first draft of every round, and the same output."""
    runs = {}
    for path in (0.0, 0.5):
        drafter = EagleDrafter(trained[0], target, REDUCED, min_path_confidence=path)
        steps, real_step = [], drafter._step
        monkeypatch.setattr(drafter, "_step", lambda *args: steps.append(len(args[1])) or real_step(*args))
        result = se.SpeculativeDecoder(target, drafter).generate(PROMPT, k=4, max_new_tokens=40, sampling=GREEDY)
        runs[path] = (result, sum(1 for n in steps if n == 1))      # one-pair calls: the draft steps, not feeds
    (free, free_steps), (stopped, stopped_steps) = runs[0.0], runs[0.5]
    assert stopped.tokens == free.tokens == se.autoregressive_generate(target, PROMPT, max_new_tokens=40,
                                                                         sampling=GREEDY).tokens
    assert stopped_steps < free_steps
    assert any(0 < len(r.drafted) < 4 for r in stopped.rounds) and all(r.drafted for r in stopped.rounds[1:])
    with pytest.raises(ValueError, match="min_path_confidence"):
        EagleDrafter(trained[0], target, REDUCED, min_path_confidence=-0.1)


def test_drafts_are_cut_to_the_prefix_worth_its_verify_rows(target, trained):
    """Under a cost curve where a second row costs as much as five tokens are worth, no draft pays: every round
    verifies one row and emits the target's own token; under free verification nothing is cut."""
    steep = (0.0, 1.0) + (5.0,) * 16
    for costs, expect_drafts in ((steep, False), ((0.0,) + (1.0,) * 17, True)):
        drafter = EagleDrafter(trained[0], target, REDUCED)
        decoder = se.SpeculativeDecoder(target, drafter)
        drafter.costs = costs
        result = decoder.generate(PROMPT, k=4, max_new_tokens=12, sampling=GREEDY)
        assert any(r.drafted for r in result.rounds) == expect_drafts
        plain = se.autoregressive_generate(target, PROMPT, max_new_tokens=12, sampling=GREEDY)
        assert result.tokens == plain.tokens
    unsized = EagleDrafter(trained[0], target, REDUCED, size_by_cost=False)
    se.SpeculativeDecoder(target, unsized)
    assert unsized.costs is None


@pytest.mark.slow          # chi-square: the default tier runs the app's two EAGLE drafts, the full tier every head
@pytest.mark.parametrize("make", ["trained-reduced", "lookup-first"] + [
    pytest.param(name, marks=pytest.mark.full)
    for name in ("random-reduced", "trained-dynamic", "layered-trained", "trained-bf16")])
def test_sampled_output_follows_the_target_distribution(target, trained, layered, make):
    params = se.SamplingParams(0.7, top_p=0.9) if make == "random-reduced" else se.SamplingParams(1.0, top_k=5)
    samples = speculative_samples(target, drafters(target, trained, layered)[make], params)
    assert chi_square_pvalue(samples, exact_joint(target, PROMPT, params)) > ALPHA


def test_reported_q_is_the_sampled_distribution_over_the_full_vocabulary(target, trained):
    drafter = EagleDrafter(trained[0], target, REDUCED)
    decoder = se.SpeculativeDecoder(target, drafter)
    state = decoder.start(PROMPT, k=4, max_new_tokens=10, sampling=se.SamplingParams(1.0), seed=0)
    proposal = drafter.propose(state.committed, 4, state.sampling, torch.Generator().manual_seed(0))
    assert proposal.probs.shape == (4, 8)
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(4))
    assert (proposal.probs[:, [4, 6]] == 0).all()


@pytest.mark.parametrize("params", [se.SamplingParams(0.8, top_p=0.7), se.SamplingParams(1.0)],
                         ids=["top-p", "no-top-p"])
def test_q_written_from_the_heads_top_p_members_equals_the_whole_reduced_rows(target, trained, params, monkeypatch):
    """With top-p, propose writes only each draft's members into q; without, the whole reduced rows: either way
    the same q as scattering the reduced rows into the vocabulary."""
    import spec_engine.drafters.eagle as eagle_module

    def proposal(members_path: bool):
        drafter = EagleDrafter(trained[0], target, REDUCED)
        state = se.SpeculativeDecoder(target, drafter).start(PROMPT, k=4, max_new_tokens=10, sampling=params, seed=0)
        with monkeypatch.context() as patch:
            if not members_path:
                patch.setattr(eagle_module, "writes_in_place", lambda full: False)
            return drafter.propose(state.committed, 4, params, torch.Generator().manual_seed(3))

    fast, whole = proposal(True), proposal(False)
    assert fast.tokens == whole.tokens and torch.equal(fast.probs, whole.probs)
    if params.top_p < 1:
        assert (fast.probs > 0).sum() < (whole.probs[:, REDUCED] > -1).sum()      # some reduced ids cut by top-p


def test_a_bf16_head_reports_q_in_the_targets_dtype(target, trained):
    """The head's numerics are its own; what it reports is a distribution in the target's dtype over the full
    vocabulary, zero outside its reduced one, and equal to the warp of its own (bf16) logits."""
    drafter = drafters(target, trained)["trained-bf16"]()
    assert drafter.dtype == torch.bfloat16 and drafter.lm_head.rows.dtype == torch.bfloat16
    decoder = se.SpeculativeDecoder(target, drafter)
    params = se.SamplingParams(0.8, top_k=6)
    state = decoder.start(PROMPT, k=3, max_new_tokens=10, sampling=params, seed=0)
    proposal = drafter.propose(state.committed, 3, params, torch.Generator().manual_seed(0))
    assert proposal.probs.dtype == torch.float32 and proposal.probs.shape == (len(proposal.tokens), 8)
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(len(proposal.tokens)))
    assert (proposal.probs[:, [4, 6]] == 0).all()
    with torch.no_grad():      # the first draft's q: the warp of the head's bf16 logits at the newest committed token
        first = se.warp(drafter.lm_head(drafter._predicted).float(), params)
    assert torch.equal(proposal.probs[0, REDUCED], first)


def test_head_dtype_policy(target, monkeypatch):
    from spec_engine.accel import cpu_gemm
    from spec_engine.drafters.eagle import head_dtype
    monkeypatch.delenv("SPEC_ENGINE_EAGLE_DTYPE", raising=False)
    accelerated = se.speed_layer() == "cpu"
    assert head_dtype(target) == (torch.bfloat16 if accelerated and cpu_gemm.bf16_available() else torch.float32)
    monkeypatch.setattr(cpu_gemm, "bf16_available", lambda: False)
    assert head_dtype(target) == torch.float32                 # no bf16 dot products: bf16 would be slower
    assert head_dtype(copy.deepcopy(target).to(torch.bfloat16)) == torch.bfloat16     # a bf16 target's own dtype
    monkeypatch.setenv("SPEC_ENGINE_EAGLE_DTYPE", "bfloat16")
    assert head_dtype(target) == torch.bfloat16
    monkeypatch.setenv("SPEC_ENGINE_EAGLE_DTYPE", "fp8")
    with pytest.raises(ValueError, match="SPEC_ENGINE_EAGLE_DTYPE"):
        head_dtype(target)


def test_a_random_head_lands_on_the_targets_device_and_dtype():
    """random_eagle_drafter moves its head (drawn on the CPU) to the target's device: a meta target stands in for
    CUDA here, where the head used to stay behind on the CPU."""
    meta = tiny_llama(vocab=8, layers=3, seed=0).to("meta")
    drafter = random_eagle_drafter(meta, scale=3.0)
    assert {p.device.type for p in drafter.head.parameters()} == {"meta"}
    assert drafter.lm_head.rows.device.type == "meta" and drafter.vocab_index.device.type == "meta"
    assert drafter._vocab_ids == list(range(8))
    wide = tiny_llama(vocab=8, layers=3, seed=0).to(torch.float64)
    drafter = random_eagle_drafter(wide, scale=3.0)
    assert {p.dtype for p in drafter.head.parameters()} == {torch.float64}
    assert {p.device.type for p in drafter.head.parameters()} == {"cpu"}
    plain, runs = greedy_identity_runs(wide, lambda: random_eagle_drafter(wide, scale=3.0), PROMPT, ks=(3,), tokens=12)
    assert runs[3].tokens == plain.tokens


def test_drafter_refuses_another_target(target):
    with pytest.raises(ValueError, match="built from"):
        se.SpeculativeDecoder(tiny_llama(vocab=8, layers=3, seed=5), random_eagle_drafter(target))


# ---- the shipped head ----

def test_shipped_weights_match_their_record():
    record = json.loads(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
    assert sha256_file(DEFAULT_WEIGHTS) == record["sha256"]
    assert DEFAULT_WEIGHTS.stat().st_size < 12_000_000


def test_tampered_weights_are_refused(tmp_path):
    copy = tmp_path / DEFAULT_WEIGHTS.name
    data = bytearray(DEFAULT_WEIGHTS.read_bytes())
    data[-1] ^= 1
    copy.write_bytes(bytes(data))
    copy.with_suffix(".json").write_text(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
    with pytest.raises(ValueError, match="sha256"):
        load_head(copy)


@pytest.mark.slow
@pytest.mark.measured_costs                        # drafts sized by this machine's verify costs, as in the app
@pytest.mark.parametrize("k", [2, 3])             # k = 3 verifies 4 tokens: the packed CPU product (cpu_gemm.py)
@pytest.mark.parametrize("draft", ["eagle", "eagle+lookup"])
def test_greedy_identity_on_the_offline_default(smollm2, draft, k):
    from test_real_models import NEW_TOKENS, PROMPTS
    eos = smollm2.tokenizer.eos_token_id
    accepted = drafted = 0
    notes = set()
    for text in PROMPTS:
        prompt_ids = smollm2.encode_prompt(text)
        expected = se.autoregressive_generate(smollm2.model, prompt_ids, max_new_tokens=NEW_TOKENS, sampling=GREEDY,
                                              eos_token_id=eos).tokens
        drafter = se.make_drafter(draft, smollm2)
        head = drafter if draft == "eagle" else drafter.fallback
        assert head.dtype == se.drafters.eagle.head_dtype(smollm2.model)   # bf16 beside the fp32 target where it pays
        result = se.SpeculativeDecoder(smollm2.model, drafter).generate(
            prompt_ids, k=k, max_new_tokens=NEW_TOKENS, sampling=GREEDY, eos_token_id=eos)
        assert result.tokens == expected, smollm2.tokenizer.decode(result.tokens)
        accepted, drafted = accepted + result.stats.accepted, drafted + result.stats.drafted
        notes |= {r.note for r in result.rounds}
    assert accepted / drafted > 0.15     # trained (an untrained head is near 0 here); held-out numbers are in its JSON
    # The drafts come from the head (and, with eagle+lookup, from prompt lookup); a note of the cost sizing (drafting
    # paused, a probe) depends on this machine's timing, not on the drafter.
    sizing = {n for n in notes if n and n.startswith((se.drafters.sizing.PAUSED, se.drafters.sizing.PROBE))}
    assert notes - sizing == ({None, se.drafters.LOOKUP_NOTE} if draft == "eagle+lookup" else {None})


@pytest.mark.slow
def test_the_head_cost_benchmark_times_the_engines_own_head(smollm2):
    """bench/eagle_head_cost.py builds its head as the engine builds the shipped one (so it times the engine's
    kernels): the same predictions and LM-head logits, bitwise, as the drafter the engine makes; its catch-up timing
    reports four positive medians and leaves the head's cache as it found it."""
    from bench.eagle_head_cost import engine_drafter, time_catch_up
    from spec_engine.core import speed
    from spec_engine.drafters.eagle import head_dtype, load_eagle_drafter
    engine = load_eagle_drafter(smollm2.model, fixed_length=True)
    bench = engine_drafter(smollm2.model, head_dtype(smollm2.model))
    kinds = lambda drafter: [type(m).__name__ for part in (drafter.head, drafter.lm_head) for m in part.modules()]  # noqa: E731
    assert kinds(bench) == kinds(engine)           # the speed layer's modules (packed products) where it has them
    width = len(engine.feature_layers) * engine.head.config.hidden_size
    features = torch.randn(3, width, generator=torch.Generator().manual_seed(0))              # [3, F]
    for drafter in (engine, bench):
        drafter.begin([1, 2, 3, 4], features)
    assert torch.equal(engine._predicted, bench._predicted)
    with speed.active().products():
        assert torch.equal(engine.lm_head(engine._predicted), bench.lm_head(bench._predicted))
    times = time_catch_up(bench, smollm2.model, rows=2, repeats=3)
    assert set(times) == {"cold step", "cold LM head", "warm step", "warm LM head"}
    assert all(value > 0 for value in times.values()), times
    assert bench.cache.get_seq_length() == 1 and bench.cache_ids == [1]


def test_eagle_draft_names():
    assert se.parse_draft("eagle") == se.DraftSpec("eagle")
    assert se.parse_draft("eagle:30").arg == 30
    assert se.parse_draft("eagle+lookup:40") == se.DraftSpec("eagle+lookup", None, 40)
    for bad in ("eagle:100", "eagle:x", "eagle:0.3", "eagle+lookup:x"):
        with pytest.raises(ValueError, match="confidence percentage"):
            se.parse_draft(bad)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_topk_benchmarks_recording_drafter_drafts_what_the_plain_drafter_does(target, temperature):
    """bench/eagle_topk.py grows a second chain from the step-1 second choice each round: it must leave the head's
    cache as it found it, so the run it records is the run the plain drafter makes."""
    from bench.eagle_topk import RecordingEagleDrafter
    head = random_eagle_drafter(target, REDUCED, seed=2, scale=2.0).head
    plain, recording = EagleDrafter(head, target, REDUCED), RecordingEagleDrafter(head, target, REDUCED)
    ids = torch.tensor([[1, 2, 3, 1, 2]])
    runs = [se.SpeculativeDecoder(target, d).generate(ids, k=3, max_new_tokens=24, seed=5,
                                                      sampling=se.SamplingParams(temperature))
            for d in (plain, recording)]
    assert [r.drafted for r in runs[0].rounds] == [r.drafted for r in runs[1].rounds]
    assert runs[0].tokens == runs[1].tokens
    assert 0 < len(recording.branches) <= len(runs[1].rounds) and len(recording.step_one) == len(recording.branches)
    for (at, chain, second), (at_top, top) in zip(recording.branches, recording.step_one):
        assert at == at_top and second[0] == top[1] and 1 <= len(second) <= 3
        assert second[0] != top[0] and (temperature > 0 or not chain or chain[0] == top[0])


def test_drafters_of_one_target_share_the_loaded_head_yet_run_apart(smollm2):
    """The head is loaded once per target (eagle.shared_head): drafters share its modules and LM-head rows, yet each
    keeps its own cache, so two runs stepped in turn both give plain decoding's tokens."""
    eos = smollm2.tokenizer.eos_token_id
    tree, chain = se.make_drafter("eagle-tree", smollm2), se.make_drafter("eagle", smollm2)
    assert tree.head is chain.head and tree.lm_head is chain.lm_head
    prompts = [smollm2.encode_prompt(text) for text in ("Name three colours.", "Count from one to ten.")]
    expected = [se.autoregressive_generate(smollm2.model, ids, max_new_tokens=24, sampling=GREEDY,
                                           eos_token_id=eos).tokens for ids in prompts]
    decoders = [se.SpeculativeDecoder(smollm2.model, drafter) for drafter in (tree, chain)]
    states = [decoder.start(ids, k=k, max_new_tokens=24, sampling=GREEDY, eos_token_id=eos)
              for decoder, ids, k in zip(decoders, prompts, (8, 3))]
    emitted = [[], []]
    while any(state.stop_reason is None for state in states):
        for i, (decoder, state) in enumerate(zip(decoders, states)):
            if state.stop_reason is None:
                emitted[i] += decoder.step(state).emitted
    assert emitted == expected


def test_a_changed_weights_file_is_loaded_again(smollm2, tmp_path):
    copy = tmp_path / DEFAULT_WEIGHTS.name
    copy.write_bytes(DEFAULT_WEIGHTS.read_bytes())
    copy.with_suffix(".json").write_text(DEFAULT_WEIGHTS.with_suffix(".json").read_text())
    first = shared_head(smollm2.model, copy)
    assert shared_head(smollm2.model, copy)[0] is first[0]
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert shared_head(smollm2.model, copy)[0] is not first[0]
    data = bytearray(copy.read_bytes())
    data[-1] ^= 1
    copy.write_bytes(bytes(data))            # tampered after it was loaded: checked again, and refused
    with pytest.raises(ValueError, match="sha256"):
        shared_head(smollm2.model, copy)
