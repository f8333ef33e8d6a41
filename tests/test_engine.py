"""The engine on tiny random models: KV-cache invariants every round, a trimmed cache that is as good as a
fresh forward, forced outcomes, EOS, cancellation, determinism, greedy identity, and bad input."""
import contextlib
import math

import pytest
import torch

import spec_engine as se
from spec_engine.core.cache import cache_len, check_invariant, forward_logits, new_cache, trim_cache
from spec_engine.drafters import Proposal, lookup_continuation
from tiny import DRAFT_PIECES, TARGET_PIECES, ToyTokenizer, greedy_identity_runs, tiny_llama

PROMPT = torch.tensor([[1, 2, 3, 4, 1, 2, 3, 5, 1, 2]])
GREEDY = se.SamplingParams(0.0)
SAMPLED = se.SamplingParams(0.9, top_k=6, top_p=0.95)


def drafters(target, draft):
    return {
        "model": lambda: se.ModelDrafter(draft),
        "layer-skip": lambda: se.LayerSkipDrafter(target, [1]),
        "early-exit": lambda: se.LayerSkipDrafter(target, se.early_exit_layers(3, 1)),
        "prompt-lookup": lambda: se.PromptLookupDrafter(),
        "naive-ids": lambda: se.NaiveIdDrafter(tiny_llama(vocab=12, layers=1, seed=2)),
        "cross-tokenizer": lambda: se.CrossTokenizerDrafter(tiny_llama(vocab=len(DRAFT_PIECES), layers=1, seed=3),
                                                            ToyTokenizer(DRAFT_PIECES), ToyTokenizer(TARGET_PIECES)),
    }


KINDS = ["model", "layer-skip", "early-exit", "prompt-lookup", "naive-ids", "cross-tokenizer"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_cache_invariants_and_trimmed_cache_logits_every_round(target, draft, kind, params):
    """After every round the target cache holds committed[:-1] and gives the same next-token logits as a
    fresh forward over the committed text; the draft cache holds only committed positions."""
    drafter = drafters(target, draft)[kind]()
    decoder = se.SpeculativeDecoder(target, drafter)
    state = decoder.start(PROMPT, k=4, max_new_tokens=24, sampling=params, seed=5)
    while state.stop_reason is None:
        event = decoder.step(state)
        assert cache_len(state.target_cache) == len(state.committed) - 1 == event.target_cache_len
        assert event.target_cache_len_before == event.target_cache_len + len(event.drafted) + 1 - len(event.emitted)
        if getattr(drafter, "cache_ids", None) is not None and kind != "cross-tokenizer":
            assert drafter.cache_ids == state.committed[:len(drafter.cache_ids)]
            assert event.draft_cache_len == len(drafter.cache_ids) <= len(state.committed) - 1
        trimmed = forward_logits(target, state.committed[-1:], state.target_cache, 1)[-1]
        state.target_cache.crop(-1)                                     # undo the probe
        fresh = forward_logits(target, state.committed, new_cache(target), 1)[-1]
        assert torch.allclose(trimmed, fresh, atol=1e-5)
    assert state.generated == 24


# On PROMPT plain greedy decoding of the tiny target is [7] * 30, and most drafters never draft a 7: identity would
# hold with much of the engine wrong. On this prompt the target's greedy text varies (7 3 7 3 ... 7 6 0) and every
# drafter gets drafts accepted, the cross-tokenizer one with its draft model's seed 9 (seed 3 accepts one token).
GREEDY_PROMPT = torch.tensor([[6, 7, 7, 6, 0, 1, 5, 1, 5, 0]])
GREEDY_CROSS_SEED = 9


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_identity_with_plain_decoding(target, draft, kind):
    """Greedy speculative decoding emits exactly plain greedy decoding's tokens, on a prompt where every drafter's
    drafts are accepted at every k (a round of k = 1 that accepts ends with a bonus token), so the accept, bonus
    and correction paths all carry tokens."""
    make = drafters(target, draft)[kind]
    if kind == "cross-tokenizer":
        make = lambda: se.CrossTokenizerDrafter(tiny_llama(vocab=len(DRAFT_PIECES), layers=1, seed=GREEDY_CROSS_SEED),
                                                ToyTokenizer(DRAFT_PIECES), ToyTokenizer(TARGET_PIECES))
    base, runs = greedy_identity_runs(target, make, GREEDY_PROMPT)
    assert len(set(base.tokens)) >= 3                               # not a constant text
    for k, result in runs.items():
        assert result.tokens == base.tokens
        assert len(result.tokens) == 30
        assert result.stats.accepted > 0, (kind, k)                 # drafts were kept, not only corrected
        assert any(r.correction is not None for r in result.rounds), (kind, k)
    assert any(r.bonus is not None for r in runs[1].rounds), kind


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_output(target, draft, kind):
    runs = [se.SpeculativeDecoder(target, drafters(target, draft)[kind]()).generate(
        PROMPT, k=3, max_new_tokens=20, sampling=SAMPLED, seed=11) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens
    assert [r.uniforms for r in runs[0].rounds] == [r.uniforms for r in runs[1].rounds]


def test_events_are_consistent(target, draft):
    result = se.SpeculativeDecoder(target, se.ModelDrafter(draft)).generate(PROMPT, k=4, max_new_tokens=40,
                                                                             sampling=SAMPLED, seed=3)
    assert result.tokens == [t for r in result.rounds for t in r.emitted]
    for r in result.rounds:
        assert r.emitted[:r.accepted] == r.drafted[:r.accepted]
        assert (r.correction is None) != (r.bonus is None)
        assert len(r.target_probs) == len(r.draft_probs) == len(r.drafted)
        assert len(r.uniforms) == len(r.accept_probs) == min(r.accepted + 1, len(r.drafted))
        for a, p, q in zip(r.accept_probs, r.target_probs, r.draft_probs):
            assert a == pytest.approx(min(1.0, p / q), rel=1e-5)
        if r.correction is not None:
            assert r.uniforms[r.accepted] >= r.accept_probs[r.accepted]
            assert r.discarded == r.drafted[r.accepted + 1:]
        assert all(u < a for u, a in zip(r.uniforms[:r.accepted], r.accept_probs))
        assert se.RoundEvent.from_dict(r.to_dict()) == r
    stats = result.stats
    assert stats.new_tokens == 40 and stats.rounds == len(result.rounds)
    assert stats.acceptance_rate == pytest.approx(stats.accepted / stats.drafted)
    assert sum(stats.accepted_histogram) == stats.rounds


class ScriptedDrafter(se.Drafter):
    """Proposes fixed tokens with a fixed q, to force outcomes."""

    def __init__(self, tokens, probs=None):
        self.tokens, self.probs = tokens, probs

    def propose(self, committed, k, params, generator):
        return Proposal(self.tokens[:k], None if self.probs is None else self.probs[:k])


def test_forced_rejection_with_zero_target_probability(target):
    """top_k=1 makes p one-hot: a drafted token other than the argmax has p = 0 and must be rejected,
    and the correction must be the argmax."""
    params = se.SamplingParams(1.0, top_k=1)
    argmax = se.autoregressive_generate(target, PROMPT, max_new_tokens=1, sampling=se.SamplingParams(0.0)).tokens[0]
    wrong = (argmax + 1) % 8
    event = next(se.SpeculativeDecoder(target, ScriptedDrafter([wrong, wrong])).stream(PROMPT, k=2, max_new_tokens=5,
                                                                                          sampling=params))
    assert (event.accepted, event.correction, event.bonus) == (0, argmax, None)
    assert event.accept_probs == [0.0] and event.target_probs[0] == 0.0


def test_forced_acceptance_and_bonus(target):
    plain = se.autoregressive_generate(target, PROMPT, max_new_tokens=4, sampling=GREEDY).tokens
    params = se.SamplingParams(1.0, top_k=1)                      # p one-hot on the greedy path
    event = next(se.SpeculativeDecoder(target, ScriptedDrafter(plain[:3])).stream(PROMPT, k=3, max_new_tokens=8,
                                                                                   sampling=params))
    assert event.accepted == 3 and event.bonus == plain[3] and event.correction is None
    assert event.emitted == plain


def test_eos_stops_inside_the_drafts(target):
    plain = se.autoregressive_generate(target, PROMPT, max_new_tokens=6, sampling=GREEDY).tokens
    eos = plain[2]
    result = se.SpeculativeDecoder(target, ScriptedDrafter(plain)).generate(PROMPT, k=5, max_new_tokens=20,
                                                                             sampling=GREEDY, eos_token_id=eos)
    assert result.tokens == plain[:plain.index(eos) + 1]
    assert result.stop_reason == "eos" and result.rounds[-1].finished
    base = se.autoregressive_generate(target, PROMPT, max_new_tokens=20, sampling=GREEDY, eos_token_id=eos)
    assert base.tokens == result.tokens and base.stop_reason == "eos"


def test_cancellation_ends_within_one_round(target, draft):
    calls = []
    stop = lambda: calls.append(1) or len(calls) >= 2
    result = se.SpeculativeDecoder(target, se.ModelDrafter(draft)).generate(PROMPT, k=2, max_new_tokens=50,
                                                                             sampling=SAMPLED, should_stop=stop)
    assert len(result.rounds) == 2 and result.stop_reason == "cancelled"
    base = se.autoregressive_generate(target, PROMPT, max_new_tokens=50, sampling=SAMPLED, should_stop=lambda: True)
    assert base.stop_reason == "cancelled" and len(base.tokens) == 1


LONG_PROMPT = torch.tensor([[(7 * i + i // 5) % 8 for i in range(45)]])          # 44 prefilled tokens: 7 chunks of 7


@pytest.mark.parametrize("layer", ["cpu_speed_layer", "speed_layer_off"])
def test_chunked_prefill_gives_the_logits_features_and_cache_of_one_forward(target, layer, request):
    """cache.prefill in chunks of 7 against one forward over 44 tokens: the last logits, every fed position's
    features and the cache's next-token logits agree (to float rounding: the products have other shapes)."""
    from conftest import speed_layer_off
    from spec_engine.core.cache import prefill
    ids = LONG_PROMPT[0, :-1].tolist()
    with (speed_layer_off() if layer == "speed_layer_off"
          else request.getfixturevalue(layer) or contextlib.nullcontext()):
        whole_cache, chunked_cache = new_cache(target), new_cache(target)
        logits, features = forward_logits(target, ids, whole_cache, 1, (-1, 1))
        chunked_logits, chunked_features = prefill(target, ids, chunked_cache, (-1, 1), chunk=7)
        assert cache_len(chunked_cache) == cache_len(whole_cache) == len(ids)
        nxt = [forward_logits(target, [3], cache, 1) for cache in (whole_cache, chunked_cache)]
    torch.testing.assert_close(chunked_logits, logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked_features, features, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nxt[1], nxt[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layer", ["cpu_speed_layer", "speed_layer_off"])
def test_chunked_prefill_keeps_greedy_identity_and_the_cache_invariant(target, draft, kind, layer, request):
    """A prompt of seven chunks decodes to the same greedy tokens as with one prefill forward and as plain
    decoding; the engine checks the KV invariant every round."""
    from conftest import speed_layer_off
    with (speed_layer_off() if layer == "speed_layer_off"
          else request.getfixturevalue(layer) or contextlib.nullcontext()):
        runs = []
        for chunk in (7, 10_000):
            decoder = se.SpeculativeDecoder(target, drafters(target, draft)[kind]())
            decoder.prefill_chunk = chunk
            runs.append(decoder.generate(LONG_PROMPT, k=3, max_new_tokens=20, sampling=GREEDY).tokens)
        plain = [se.autoregressive_generate(target, LONG_PROMPT, max_new_tokens=20, sampling=GREEDY,
                                            prefill_chunk=chunk).tokens for chunk in (7, 10_000)]
    assert runs[0] == runs[1] == plain[0] == plain[1] and len(runs[0]) == 20


def test_a_new_cache_is_laid_out_for_the_model_and_prefill_takes_chunks_of_one(target):
    """new_cache lays the cache out from the model's config (a layer per model layer: what a speed layer replaces and
    sliding-window layers need); a chunk of one token is a valid prefill, the same as one forward; zero is refused."""
    from spec_engine.core.cache import prefill
    cache = new_cache(target)
    assert len(cache.layers) == target.config.num_hidden_layers and cache_len(cache) == 0
    ids = LONG_PROMPT[0, :6].tolist()
    whole = forward_logits(target, ids, new_cache(target), 1)
    by_one, _ = prefill(target, ids, cache, chunk=1)
    assert cache_len(cache) == len(ids)
    torch.testing.assert_close(by_one, whole, rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError):
        prefill(target, ids, new_cache(target), chunk=0)


def test_stop_between_prefill_chunks_ends_the_run_before_any_round(target, draft):
    """should_stop is asked between two chunks (never before the first): true after the second chunk, the run
    ends with no round, stop_reason "cancelled", and the drafter was never begun."""
    def stop_after(chunks):
        calls = []
        return calls, lambda: calls.append(1) or len(calls) >= chunks
    calls, stop = stop_after(2)
    decoder = se.SpeculativeDecoder(target, se.ModelDrafter(draft))
    decoder.prefill_chunk = 7
    state = decoder.start(LONG_PROMPT, k=2, max_new_tokens=20, sampling=GREEDY, should_stop=stop)
    assert state.stop_reason == "cancelled" and len(calls) == 2 and cache_len(state.target_cache) == 14
    assert decoder.drafter.cache is None                   # never begun
    calls, stop = stop_after(2)
    assert list(decoder.stream(LONG_PROMPT, k=2, max_new_tokens=20, should_stop=stop)) == []
    calls, stop = stop_after(1)
    result = decoder.generate(LONG_PROMPT, k=2, max_new_tokens=20, should_stop=stop)
    assert (result.tokens, result.rounds, result.stop_reason) == ([], [], "cancelled")
    calls, stop = stop_after(3)
    base = se.autoregressive_generate(target, LONG_PROMPT, max_new_tokens=20, should_stop=stop, prefill_chunk=7)
    assert (base.tokens, base.stop_reason, len(calls)) == ([], "cancelled", 3)
    short = se.SpeculativeDecoder(target, se.ModelDrafter(draft)).generate(PROMPT, k=2, max_new_tokens=5,
                                                                           should_stop=lambda: True)
    assert len(short.rounds) == 1              # a prompt of one chunk asks nothing before its first round


class CountingCache:
    """What trim_cache and check_invariant read of a cache: its length, and crop(-n) removing n positions."""

    def __init__(self, length: int):
        self.length = length

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, change: int) -> None:
        assert self.length > 0 and change <= 0, "crop of an empty cache (transformers' sliding layers refuse it)"
        self.length += change


def test_trimming_removes_the_positions_past_keep_and_the_checks_say_what_is_wrong():
    for length, keep in ((5, 3), (1, 0), (4, 4), (0, 0)):
        cache = CountingCache(length)
        assert trim_cache(cache, keep) == length - keep and cache.length == keep
    with pytest.raises(AssertionError, match="cannot trim a cache of 3 positions up to 5"):
        trim_cache(CountingCache(3), 5)
    with pytest.raises(AssertionError, match="target KV cache holds 3 positions, expected 4"):
        check_invariant(CountingCache(3), 4, "target")
    check_invariant(CountingCache(4), 4, "target")


def test_exactly_max_new_tokens_even_when_a_round_could_overshoot(target):
    result = se.SpeculativeDecoder(target, se.PromptLookupDrafter()).generate(PROMPT, k=16, max_new_tokens=7,
                                                                              sampling=GREEDY)
    assert len(result.tokens) == 7


def test_prompt_lookup_finds_latest_longest_match():
    assert lookup_continuation([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 2, 3, 1) == [7, 5]
    assert lookup_continuation([4, 5, 6], 3, 3, 1) == []
    assert lookup_continuation([8], 3, 3, 1) == []
    assert lookup_continuation([1, 2, 1], 4, 3, 1) == [2, 1]
    assert lookup_continuation([1, 2, 1], 4, 3, 2) == []           # only a 1-gram matches: no draft at min 2
    assert lookup_continuation([5, 1, 2, 6, 1, 2], 2, 3, 2) == [6, 1]


def test_longest_suffix_match():
    from spec_engine.drafters import longest_suffix_match
    seq = [1, 2, 3, 4, 9, 8, 3, 4, 7, 2, 3, 4]
    assert longest_suffix_match(seq, 8) == (3, 4)                 # [2, 3, 4] at 1..3, continuation from 4
    assert longest_suffix_match(seq, 2) == (2, 8)                 # capped at 2: the latest [3, 4] is at 6..7
    assert longest_suffix_match([5, 6, 7], 8) == (0, -1)
    assert longest_suffix_match([5], 8) == (0, -1)
    assert longest_suffix_match([3, 3], 0) == (0, -1)

    def by_every_window(tokens, max_ngram):     # the definition: try each length, longest first, latest window
        for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
            starts = [s for s in range(len(tokens) - n) if tokens[s:s + n] == tokens[-n:]]
            if starts:
                return n, starts[-1] + n
        return 0, -1

    generator = torch.Generator().manual_seed(0)
    for length in (2, 3, 10, 60, 300):
        for alphabet in (2, 3, 8):
            tokens = torch.randint(alphabet, (length,), generator=generator).tolist()
            for max_ngram in (1, 2, 4, 64):
                assert longest_suffix_match(tokens, max_ngram) == by_every_window(tokens, max_ngram), \
                    (tokens, max_ngram)


def test_best_draft_length_by_enumeration():
    """Against a brute force over all accept/reject patterns: expected tokens of a round that drafts m tokens."""
    import itertools
    from spec_engine.drafters.sizing import best_draft_length, expected_tokens
    chances = [0.9, 0.8, 0.7, 0.95]
    for m in range(len(chances) + 1):
        total = 0.0
        for outcome in itertools.product([True, False], repeat=m):
            p = math.prod(c if ok else 1 - c for c, ok in zip(chances, outcome))
            accepted = next((i for i, ok in enumerate(outcome) if not ok), m)
            total += p * (accepted + 1)
        assert expected_tokens(chances)[m] == pytest.approx(total)
    flat = (0.0,) + (1.0,) * 17                                    # free verification: draft everything
    assert best_draft_length(chances, flat) == 4
    cliff = (0.0, 1.0, 1.07, 1.19, 1.32, 1.47)                     # rows 1..5; a 5th row would step up
    assert best_draft_length([0.9] * 4, cliff[:5] + (3.0,)) == 3
    assert best_draft_length([0.05] * 4, cliff) == 0               # weak evidence: not worth a row
    assert best_draft_length([0.9] * 10, cliff) == 4               # never past the measured rows


def test_verify_cost_curve_stays_within_its_time_budget(target):
    """With no time to spare the curve measures one and two rows once and continues their slope."""
    from spec_engine.drafters.sizing import MAX_ROWS, measure_verify_costs
    costs = measure_verify_costs(target, budget_s=0.0)
    assert len(costs) == MAX_ROWS + 1 == se.MAX_K + 2 and costs[1] == 1.0
    steps = [costs[r + 1] - costs[r] for r in range(2, MAX_ROWS)]
    assert all(step == pytest.approx(steps[0]) for step in steps) and steps[0] >= 0


def test_lookup_sizes_drafts_by_odds_and_cost():
    from spec_engine.drafters import LookupOdds
    propose = lambda d, ids, k: d.propose(ids, k, GREEDY, torch.Generator()).tokens
    one_token_match = [5, 1, 2, 3, 4, 6, 7, 8, 9, 10, 5]            # only [5] matches
    long_match = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3]  # [1, 2, 3] matches
    full = se.PromptLookupDrafter(sizing="full")
    assert propose(full, one_token_match, 8) == [1, 2, 3, 4, 6, 7, 8, 9]
    assert propose(se.PromptLookupDrafter(min_ngram=2, sizing="full"), one_token_match, 8) == []
    sized = se.PromptLookupDrafter()
    sized.costs = (0.0, 1.0, 1.07, 1.19, 1.32, 1.47, 1.48, 1.56, 1.56, 2.04, 2.10)  # measured here: a step at 9 rows
    assert propose(sized, one_token_match, 8) == [1, 2]             # 26% odds: worth two rows, not eight
    assert propose(sized, long_match, 16) == [4, 5, 6, 7, 8, 9, 10]     # stops below the step (7 drafts = 8 rows)
    # Odds follow the run: after rounds where 1-token matches were copied right, they earn longer drafts.
    sized.begin([0])
    for _ in range(12):
        sized.odds.observe(1, 4, 4)
    assert len(propose(sized, one_token_match, 8)) > 1
    odds = LookupOdds()
    odds.observe(3, 5, 2)                                           # first right, second right, third wrong
    assert odds.counts[3] == [4 * 0.78 + 1, 5, 4 * 0.85 + 1, 6]


def test_lookup_learns_from_the_rounds_it_proposed(target):
    drafter = se.PromptLookupDrafter()
    decoder = se.SpeculativeDecoder(target, drafter)
    assert drafter.costs is not None and len(drafter.costs) == se.MAX_K + 2 and drafter.costs[1] == 1.0
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2]])
    result = decoder.generate(prompt, k=6, max_new_tokens=24, sampling=GREEDY)
    rounds_with_drafts = sum(1 for r in result.rounds if r.drafted)
    trials = sum(c[1] - se.drafters.LookupOdds.PRIOR_WEIGHT for c in drafter.odds.counts.values())
    assert rounds_with_drafts >= 1 and trials == pytest.approx(rounds_with_drafts)


def test_lookup_first_leaves_one_token_matches_to_its_fallback():
    class Fallback(se.Drafter):
        name, feature_layers = "fallback", ()
        def begin(self, prompt_ids, target_features=None): pass
        def rollback(self, committed, target_features=None): pass
        def propose(self, committed, k, params, generator):
            return Proposal([42] * k, None)
    drafter = se.LookupFirstDrafter(Fallback())
    propose = lambda ids: drafter.propose(ids, 3, GREEDY, torch.Generator())
    assert propose([5, 1, 2, 3, 4, 5]).tokens == [42, 42, 42]       # a 1-token match: the fallback drafts
    copied = propose([5, 6, 1, 2, 3, 5, 6])
    assert copied.tokens == [1, 2, 3] and copied.note == se.drafters.LOOKUP_NOTE


def test_prompt_lookup_draft_names():
    assert se.parse_draft("prompt-lookup:4:2") == se.DraftSpec("prompt-lookup", None, 4, 2)
    assert se.parse_draft("prompt-lookup:4") == se.DraftSpec("prompt-lookup", None, 4)
    default = se.make_drafter("prompt-lookup", None)
    assert (default.max_ngram, default.min_ngram, default.sizing) == (8, 1, "cost")
    assert (se.make_drafter("prompt-lookup:3:2", None).max_ngram,
            se.make_drafter("prompt-lookup:3:2", None).min_ngram) == (3, 2)
    for bad in ("prompt-lookup:2:3", "prompt-lookup:3:0", "prompt-lookup:3:x"):
        with pytest.raises(ValueError, match="1 <= M <= N"):
            se.parse_draft(bad)


def test_cross_tokenizer_boundary_merge_is_handled():
    """Committed text ends in 'a'; the draft continues with 'b...'. The target tokenizer would merge
    'a' + 'b' into 'ab', which cannot be proposed without rewriting committed text, so the draft text is
    re-tokenized on its own (and the note says so)."""
    target_tok, draft_tok = ToyTokenizer(TARGET_PIECES), ToyTokenizer(DRAFT_PIECES)
    drafter = se.CrossTokenizerDrafter(tiny_llama(vocab=len(DRAFT_PIECES), layers=1), draft_tok, target_tok)
    tokens, note = drafter._retokenize(target_tok.encode("cdea"), "bcde")
    assert note and target_tok.decode(tokens) == "bcd"             # 'bcde' -> b, cd, e; the last piece dropped
    tokens, note = drafter._retokenize(target_tok.encode("cde"), "abfe")
    assert note is None and target_tok.decode(tokens) == "abf"


def test_layer_skip_shares_weights_and_leaves_the_target_alone(target):
    layers_before = list(target.model.layers)
    drafter = se.LayerSkipDrafter(target, [1])
    assert len(drafter.model.model.layers) == 2 and len(target.model.layers) == 3
    assert list(target.model.layers) == layers_before
    assert drafter.model.model.layers[1] is target.model.layers[2]
    assert drafter.model.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    with pytest.raises(ValueError, match="layer 0"):
        se.LayerSkipDrafter(target, [0])
    with pytest.raises(ValueError, match="indices"):
        se.LayerSkipDrafter(target, [5])


@pytest.mark.parametrize("kwargs,match", [
    ({"input_ids": torch.zeros((1, 0), dtype=torch.long)}, "empty"),
    ({"input_ids": torch.tensor([1, 2])}, r"\[1, T\]"),
    ({"k": 0}, "k "), ({"k": 17}, "k "), ({"k": 2.0}, "k "),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": se.MAX_NEW_TOKENS + 1}, "max_new_tokens"),
    ({"input_ids": torch.ones((1, 250), dtype=torch.long), "max_new_tokens": 10}, "context"),
    ({"input_ids": torch.tensor([[1, 99]])}, "token ids"),
    ({"sampling": {"temperature": 1.0}}, "SamplingParams"),
])
def test_bad_input_raises_a_value_error_that_says_what_to_change(target, draft, kwargs, match):
    request = {"input_ids": PROMPT, "k": 4, "max_new_tokens": 8, "sampling": GREEDY, **kwargs}
    decoder = se.SpeculativeDecoder(target, se.ModelDrafter(draft))
    with pytest.raises(ValueError, match=match):
        decoder.stream(request.pop("input_ids"), **request)


def test_incompatible_draft_vocabulary_is_refused(target):
    with pytest.raises(ValueError, match="CrossTokenizerDrafter"):
        se.SpeculativeDecoder(target, se.ModelDrafter(tiny_llama(vocab=12, layers=1)))
    with pytest.raises(ValueError, match="rule"):
        se.SpeculativeDecoder(target, se.PromptLookupDrafter(), rule="close-enough")


def test_wrong_rules_run_and_are_labelled(target, draft):
    assert set(se.WRONG_RULES) == {"typical", "q_mismatch", "topp_membership", "no_residual"}
    for rule in se.WRONG_RULES:
        for params in (GREEDY, SAMPLED):
            result = se.SpeculativeDecoder(target, se.ModelDrafter(draft), rule=rule).generate(
                PROMPT, k=3, max_new_tokens=10, sampling=params)
            assert len(result.tokens) == 10 and all(math.isfinite(p) for r in result.rounds for p in r.target_probs)


DECISIONS = ("drafted", "accepted", "emitted", "correction", "bonus", "accept_probs", "uniforms", "next_top",
             "target_cache_len_before", "target_cache_len", "draft_cache_len_before", "draft_cache_len",
             "committed_len", "tree_parents", "tree_path", "tree_tried", "drafter", "stop_reason")


def check_display_off_is_the_same_run(decoder_of, prompt, k, params, monkeypatch, tokens=24):
    """The run with display=False (what a timed run and the benchmarks decode) against the same run drawn: the same
    tokens and every decision, with the display parts (p, q and the target's top entries) left out and never
    computed: the top-entries search is made to fail while the lean run decodes."""
    import spec_engine.core.decoder as decoder_module
    drawn = decoder_of().generate(prompt, k=k, max_new_tokens=tokens, sampling=params, seed=7)
    assert all(len(r.target_top) == len(r.drafted) + 1 and len(r.target_probs) == len(r.drafted)
               for r in drawn.rounds if r.drafted)

    def refuse(*_args, **_kwargs):
        raise AssertionError("a display=False run computed the target's top entries")
    with monkeypatch.context() as patched:
        patched.setattr(decoder_module, "top_entries", refuse)
        lean = decoder_of().generate(prompt, k=k, max_new_tokens=tokens, sampling=params, seed=7, display=False)
    assert lean.tokens == drawn.tokens and len(lean.rounds) == len(drawn.rounds)
    for a, b in zip(lean.rounds, drawn.rounds):
        assert [getattr(a, f) for f in DECISIONS] == [getattr(b, f) for f in DECISIONS]
        assert a.target_probs == a.draft_probs == a.target_top == []
    assert lean.stats.accepted == drawn.stats.accepted and lean.stats.judged_acceptance == drawn.stats.judged_acceptance
    return drawn


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_run_nobody_draws_makes_the_same_decisions_without_the_display_parts(target, draft, kind, params,
                                                                                monkeypatch):
    make = drafters(target, draft)[kind]
    drawn = check_display_off_is_the_same_run(lambda: se.SpeculativeDecoder(target, make()), PROMPT, 4, params,
                                              monkeypatch)
    assert drawn.stats.drafted > 0
