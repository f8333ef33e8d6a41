"""Sweeps that say when a difference is noise, and fixed-length drafts: repeated runs and their spread, the verdict
(a best only beyond the spread), identical rounds named, and drafters that draft exactly k when told to."""
import pytest
import torch

import spec_engine as se
from spec_engine.classroom import sweep
from spec_engine.drafters import PROMPT_LOOKUP_MAX_NGRAM, LookupFirstDrafter, PromptLookupDrafter, lookup_continuation
from spec_engine.drafters.eagle import random_eagle_drafter
from test_lab import pair, prompt, toy_drafter  # noqa: F401  (fixtures)

GREEDY = se.SamplingParams(0.0)
STEEP = (0.0, 1.0) + (5.0,) * 16        # a second verify row costs as much as five tokens are worth: no draft pays


def row(value, speedup, low=None, high=None, repeats=3, signature=None, longest=None):
    point = sweep.SweepPoint("d", value, GREEDY)
    return sweep.SweepRow("k", value, point, 0.5, 1.5, 1.5, 1, 1, 1.0, 1.0, 1.0, speedup, [1, 2], index=value,
                          repeats=repeats, speedup_min=low, speedup_max=high,
                          signature=signature if signature is not None else ((tuple(range(value)), 0),),
                          longest_draft=value if longest is None else longest)


# ------------------------------------------------------------------------------------------- repeats and spread

def test_repeated_sweep_measures_each_point_repeats_times_in_passes(pair, prompt):
    points = sweep.sweep_points("k", [1, 3], "toy-draft", 3, GREEDY)
    baselines = {}
    streamed = list(sweep.run_sweep(pair.target.model, toy_drafter(pair), prompt, "k", points, max_new_tokens=10,
                                    seed=2, baselines=baselines, repeats=3))
    assert [(r.index, r.repeats) for r in streamed] == [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3)]
    assert len(baselines[sweep.baseline_key(GREEDY)]) == 3                # plain decoding once per pass
    rows = sweep.latest(streamed)
    assert [r.value for r in rows] == [1, 3] and all(r.repeats == 3 for r in rows)
    for r, point in zip(rows, points):
        ref = se.SpeculativeDecoder(pair.target.model, toy_drafter(pair)(point.draft)).generate(
            prompt, k=point.k, max_new_tokens=10, sampling=GREEDY, seed=2)
        assert r.tokens == ref.tokens and r.rounds == ref.stats.rounds
        assert r.signature == tuple((tuple(e.drafted), e.accepted) for e in ref.rounds)
        assert r.low <= r.speedup <= r.high
        assert r.draft_cost > 0 and r.verify_cost > 0 and r.predicted_speedup > 0
        assert r.longest_draft == point.k
    with pytest.raises(ValueError, match="repeats"):
        list(sweep.run_sweep(pair.target.model, toy_drafter(pair), prompt, "k", points, 10, repeats=0))


# ------------------------------------------------------------------------------------------------- the verdict

def test_a_best_is_named_only_beyond_the_spread():
    clear = [row(1, 1.0, 0.95, 1.05), row(2, 1.4, 1.3, 1.5), row(3, 1.2, 1.1, 1.25)]
    verdict = sweep.verdict(clear, "k")
    assert verdict.best is clear[1] and verdict.text.startswith("Best k = 2: ×1.40 (×1.30-1.50 over 3 repeats)")
    noisy = [row(1, 1.0, 0.95, 1.05), row(2, 1.4, 1.2, 1.5), row(3, 1.3, 1.1, 1.35)]
    verdict = sweep.verdict(noisy, "k")
    assert verdict.best is None and "within noise" in verdict.text and "overlaps k = 3" in verdict.text
    once = [row(1, 1.0, repeats=1), row(2, 1.4, repeats=1)]
    verdict = sweep.verdict(once, "k")
    assert verdict.best is None and "measured once" in verdict.text
    assert sweep.verdict([], "k").best is None and sweep.verdict(clear[:1], "k").best is None


def test_identical_rounds_are_one_setting_and_are_named():
    """eagle+lookup with cost sizing: every k from 2 up gave the same rounds, so the fastest among them is timing
    noise; the sweep says k above 2 changes nothing and names no best from noise."""
    same = ((tuple(range(2)), 1),)
    rows = [row(1, 1.0, 0.95, 1.05)] + [row(k, 1.3 + 0.01 * k, 1.2, 1.45, signature=same, longest=2)
                                        for k in range(2, 9)]
    verdict = sweep.verdict(rows, "k")
    assert [[r.value for r in g] for g in sweep.identical_groups(rows)] == [list(range(2, 9))]
    assert ("The draft cut its drafts to what pays: k above 2 changes nothing (k = 2, 3, 4, 5, 6, 7, 8 gave "
            "identical rounds; the longest draft was 2 tokens)") in verdict.text
    assert verdict.best is rows[1] and "Best k = 2 (same rounds as k = 3, 4, 5, 6, 7, 8)" in verdict.text
    overlapping = [row(1, 1.25, 1.1, 1.3)] + rows[1:]
    verdict = sweep.verdict(overlapping, "k")
    assert verdict.best is None and "within noise" in verdict.text and "k above 2 changes nothing" in verdict.text
    assert "The drafter never drafted more: k above 2" in sweep.verdict(rows, "k", sized=False).text
    all_same = [row(k, 1.3 + 0.01 * k, 1.2, 1.45, signature=same) for k in (3, 4)]
    assert "every run gave identical rounds" in sweep.verdict(all_same, "k").text


# ---------------------------------------------------------------------------------------- fixed-length drafts

def test_fixed_length_lookup_drafts_all_it_found_where_cost_sizing_cuts(target):
    prompt_ids = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]
    ids = torch.tensor([prompt_ids])
    plain = se.autoregressive_generate(target, ids, max_new_tokens=16, sampling=GREEDY).tokens
    runs = {}
    for name, drafter in (("cost", PromptLookupDrafter()), ("fixed", se.make_drafter("prompt-lookup", None,
                                                                                        fixed_length=True))):
        decoder = se.SpeculativeDecoder(target, drafter)
        drafter.costs = STEEP if name == "cost" else drafter.costs
        runs[name] = decoder.generate(ids, k=4, max_new_tokens=16, sampling=GREEDY)
        assert runs[name].tokens == plain                                   # exact either way
    assert runs["fixed"].rounds[0].drafted == [4, 5, 1, 2]
    assert not any(r.drafted for r in runs["cost"].rounds)                 # nothing pays under STEEP
    generated = 0
    for r in runs["fixed"].rounds:                                         # exactly what the lookup found, up to k
        committed = prompt_ids + runs["fixed"].tokens[:generated]
        n_draft = min(4, 16 - generated - 1)
        assert r.drafted == lookup_continuation(committed, n_draft, PROMPT_LOOKUP_MAX_NGRAM, 1)
        generated += len(r.emitted)


def test_fixed_length_eagle_drafts_exactly_k(target):
    """With its stops and cost sizing off the head drafts k (or what max_new_tokens leaves) every round."""
    sized, fixed = random_eagle_drafter(target, seed=2), random_eagle_drafter(target, seed=2)
    sized.min_confidence, fixed.size_by_cost = 0.6, False
    ids = torch.tensor([[1, 2, 3]])
    plain = se.autoregressive_generate(target, ids, max_new_tokens=20, sampling=GREEDY).tokens
    for drafter in (sized, fixed):
        result = se.SpeculativeDecoder(target, drafter).generate(ids, k=4, max_new_tokens=20, sampling=GREEDY)
        assert result.tokens == plain
        generated, lengths = 0, []
        for r in result.rounds:
            lengths.append((len(r.drafted), min(4, 20 - generated - 1)))
            generated += len(r.emitted)
        if drafter is fixed:
            assert all(n == want for n, want in lengths)
        else:
            assert any(n < want for n, want in lengths)                   # the confidence stop cut some


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["eagle", "eagle+lookup", "prompt-lookup"])
def test_fixed_length_drafts_on_the_offline_default(smollm2, draft):
    """make_drafter(..., fixed_length=True): the shipped head drafts k every round (its recommended 0.4 confidence
    stop and 0.2 path stop off, no cost sizing); a lookup drafts up to k of what it found; output exact."""
    prompt_ids = smollm2.encode_prompt("List the days of the week, then list them again.")
    eos = smollm2.tokenizer.eos_token_id
    plain = se.autoregressive_generate(smollm2.model, prompt_ids, max_new_tokens=24, sampling=GREEDY,
                                       eos_token_id=eos).tokens
    drafter = se.make_drafter(draft, smollm2, fixed_length=True)
    if isinstance(drafter, LookupFirstDrafter):
        assert drafter.lookup.sizing == "full" and not drafter.fallback.size_by_cost
    result = se.SpeculativeDecoder(smollm2.model, drafter).generate(prompt_ids, k=4, max_new_tokens=24,
                                                                    sampling=GREEDY, eos_token_id=eos)
    assert result.tokens == plain
    generated = 0
    for r in result.rounds:
        want = min(4, 24 - generated - 1)
        committed = prompt_ids[0].tolist() + result.tokens[:generated]
        if draft == "prompt-lookup" or r.note == se.drafters.LOOKUP_NOTE:
            assert r.drafted == lookup_continuation(committed, want, PROMPT_LOOKUP_MAX_NGRAM,
                                                    1 if draft == "prompt-lookup" else 2)
        else:
            assert len(r.drafted) == want
        generated += len(r.emitted)
