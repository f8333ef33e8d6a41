"""The exactness lab and the sweeps, engine side (spec_engine.classroom.lab, spec_engine.classroom.sweep,
spec_engine.classroom.toy).

1. `exact_distribution` equals a brute-force enumeration (every sequence of the vocabulary, read off one
   full forward of prompt + sequence, no pruning) to 1e-9, with and without top-k / top-p warping; the toy models
   run in float64.
2. Seeded chi-square: N = 500 draws per sampler on the toy pair. A correct sampler's p-value is uniform, so each
   of the two "does not reject" tests fails with probability ALPHA = 1e-4 for a random choice of seeds (2e-4 for
   both); the seeds are fixed, so a pass is reproducible. The same test rejects both wrong rules at the same N
   (p about 1e-12 for "no residual" and below 1e-150 for "top-p membership" when written).
3. Sweep rows equal direct `SpeculativeDecoder.generate` runs with the same settings.
"""
import itertools
import math

import pytest
import torch
from scipy import stats

import spec_engine as se
from spec_engine.classroom import lab, sweep, toy
from spec_engine.core.metrics import expected_tokens_per_round
from spec_engine.core.sampling import warp

ALPHA = 1e-4
N = 500
DEPTH = 2
K = 2
LAB_SAMPLING = se.SamplingParams(1.0, top_p=0.9)


@pytest.fixture(scope="module")
def pair():
    return toy.toy_pair()


@pytest.fixture(scope="module")
def prompt(pair):
    return pair.encode(toy.DEFAULT_PROMPT)


# ------------------------------------------------------------------------------------------ the toy pair

def test_toy_tokenizer_round_trips_and_names_unknown_words(pair):
    tok = pair.target.tokenizer
    ids = tok.encode("the cat sat on a mat .")
    assert tok.decode(ids) == "the cat sat on a mat ."
    with pytest.raises(ValueError, match="no word 'bird'"):
        pair.encode("the bird")
    with pytest.raises(ValueError, match="empty"):
        pair.encode("   ")


@torch.inference_mode()
def test_toy_target_has_favourites_and_the_draft_disagrees(pair, prompt):
    p = torch.softmax(pair.target.model(input_ids=prompt).logits[0, -1], -1)     # [vocab]
    q = torch.softmax(pair.draft.model(input_ids=prompt).logits[0, -1], -1)
    assert p.dtype == torch.float64
    assert p.max() > 0.4 and (p > 0.1).sum() >= 2                               # a few clear favourites
    assert 0.5 * (p - q).abs().sum() > 0.2                                       # a clearly different draft


# ------------------------------------------------------------------------------------ exact distribution

@torch.inference_mode()
def brute_force(model, prompt_ids: list[int], depth: int, params: se.SamplingParams) -> dict:
    """Every sequence of the vocabulary (no pruning), its probability read off one full forward of prompt +
    sequence (all positions, no cache, all sequences in one batch)."""
    vocab = model.config.vocab_size
    seqs = list(itertools.product(range(vocab), repeat=depth))
    ids = torch.tensor([prompt_ids + list(seq) for seq in seqs])                 # [V^depth, T + depth]
    probs = warp(model(input_ids=ids).logits[:, -depth - 1:-1], params)          # [V^depth, depth, vocab]
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return {seq: math.prod(float(probs[row, i, t]) for i, t in enumerate(seq)) for row, seq in enumerate(seqs)}


SETTINGS = [se.SamplingParams(1.0), se.SamplingParams(0.7, top_p=0.9), se.SamplingParams(1.5, top_k=4),
            se.SamplingParams(1.0, top_k=5, top_p=0.8)]


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_exact_distribution_equals_brute_force_enumeration(pair, params, depth):
    prompt_ids = [0, 2, 4]                                                        # "the cat sat"
    got = lab.exact_distribution(pair.target.model, prompt_ids, depth, params)
    want = brute_force(pair.target.model, prompt_ids, depth, params)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    assert set(got) == {seq for seq, prob in want.items() if prob > 0}
    for seq, prob in want.items():
        assert abs(got.get(seq, 0.0) - prob) < 1e-9, seq


def test_exact_distribution_refuses_an_enumeration_too_large(pair):
    with pytest.raises(ValueError, match="lower the depth"):
        lab.exact_distribution(pair.target.model, [0], 3, se.SamplingParams(1.0), max_forward=50)
    with pytest.raises(ValueError, match="depth"):
        lab.exact_distribution(pair.target.model, [0], 4, se.SamplingParams(1.0))


def test_greedy_exact_distribution_is_one_sequence(pair):
    dist = lab.exact_distribution(pair.target.model, [0, 2], 2, se.SamplingParams(0.0))
    assert list(dist.values()) == [1.0]


def test_marginal_sums_out_the_later_tokens():
    dist = {(0, 0): 0.1, (0, 1): 0.2, (1, 0): 0.7}
    assert lab.marginal(dist, 1) == pytest.approx({(0,): 0.3, (1,): 0.7})
    assert lab.marginal(dist, 2) == dist


# ---------------------------------------------------------------------------------- distances and tests

def test_total_variation():
    a = {(0,): 0.5, (1,): 0.5}
    assert lab.total_variation(a, a) == 0.0
    assert lab.total_variation(a, {(2,): 1.0}) == 1.0
    b = {(0,): 0.8, (1,): 0.2}
    assert lab.total_variation(a, b) == pytest.approx(0.3)
    assert lab.total_variation(b, a) == lab.total_variation(a, b)


def test_chi2_sf_matches_scipy():
    for statistic, dof in [(0.0, 1), (3.2, 2), (11.1, 11), (150.0, 8), (1e4, 3)]:
        assert lab.chi2_sf(statistic, dof) == pytest.approx(stats.chi2.sf(statistic, dof), rel=1e-9, abs=1e-300)
    assert lab.chi2_sf(5.0, 0) == 1.0 and lab.chi2_sf(math.inf, 4) == 0.0


def test_chi_square_pools_rare_cells_and_matches_scipy():
    exact = {(0,): 0.5, (1,): 0.3, (2,): 0.15, (3,): 0.03, (4,): 0.02}
    counts = {(0,): 52, (1,): 27, (2,): 13, (3,): 5, (4,): 3}                   # n = 100
    cells = lab.pooled_cells(counts, exact, 100)
    assert [observed for _, observed in cells] == [13, 27, 52, 8]                # ascending, then the pool
    assert [expected for expected, _ in cells] == pytest.approx([15.0, 30.0, 50.0, 5.0])
    result = lab.chi_square(counts, exact)
    want = stats.chisquare([52, 27, 13, 8], [50, 30, 15, 5])
    assert (result.bins, result.dof) == (4, 3)
    assert result.statistic == pytest.approx(want.statistic) and result.pvalue == pytest.approx(want.pvalue)


def test_a_pool_below_five_takes_the_next_rarest_cell():
    exact = {(0,): 0.9, (1,): 0.06, (2,): 0.04}
    cells = lab.pooled_cells({}, exact, 100)                                     # expected 90, 6, 4
    assert sorted(e for e, _ in cells) == pytest.approx([10.0, 90.0])


def test_an_impossible_draw_rejects_outright():
    result = lab.chi_square({(0,): 99, (5,): 1}, {(0,): 0.5, (1,): 0.5})
    assert result.pvalue == 0.0 and result.impossible == 1 and math.isinf(result.statistic)


# ------------------------------------------------------------------------------------ seeded draws

@pytest.fixture(scope="module")
def lab_draws(pair, prompt):
    """{sampler: SamplerDraws} for N draws of DEPTH tokens, seeds 0..N-1, and the exact distribution."""
    exact = lab.exact_distribution(pair.target.model, prompt[0].tolist(), DEPTH, LAB_SAMPLING)
    drafter = lambda: se.ModelDrafter(pair.draft.model)                          # noqa: E731
    out = {}
    for sampler in (s for s in lab.SAMPLERS if s != "q_mismatch"):       # at T = 1 its drift is too small for N
        for draws in lab.draw(pair.target.model, drafter, prompt, DEPTH, K, LAB_SAMPLING, N, sampler, seed=0):
            pass
        out[sampler] = draws
    return exact, out


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["plain", "exact", "strict"])
def test_chi_square_does_not_reject_the_exact_samplers(lab_draws, sampler):
    exact, draws = lab_draws
    report = lab.report(exact, draws[sampler])
    assert report.n == N and sum(draws[sampler].counts.values()) == N
    assert report.chi.pvalue > ALPHA, report


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [rule for rule in se.WRONG_RULES if rule != "q_mismatch"])
def test_chi_square_rejects_the_wrong_rules_at_the_same_n(lab_draws, sampler):
    """typical and the older mistakes. q_mismatch is left out: at temperature 1 its wrong q differs from the right
    one only by top-p's cut (a seeded run: TV 0.067, p = 0.08 at this N); test_statistical.py rejects it at T = 0.7."""
    exact, draws = lab_draws
    report = lab.report(exact, draws[sampler])
    assert report.n == N
    assert report.chi.pvalue < ALPHA, report
    assert report.tv > 0.1


@pytest.mark.slow
def test_acceptance_is_measured_for_speculative_draws_only(lab_draws):
    _, draws = lab_draws
    assert draws["plain"].acceptance is None
    assert 0 < draws["exact"].acceptance < 1
    assert draws["strict"].acceptance < draws["exact"].acceptance < draws["typical"].acceptance   # sampled draft
    assert draws["exact"].drafted >= N * K                                       # every round drafts k


def test_draws_are_reproducible_and_honour_stop(pair, prompt):
    def run(n, should_stop=None):
        for d in lab.draw(pair.target.model, lambda: se.ModelDrafter(pair.draft.model), prompt, DEPTH, K,
                          LAB_SAMPLING, n, "exact", seed=7, should_stop=should_stop):
            pass
        return d
    assert run(20).counts == run(20).counts
    calls = iter(range(100))
    assert run(20, should_stop=lambda: next(calls) >= 5).n == 5


def test_draw_rejects_greedy_and_unknown_samplers(pair, prompt):
    with pytest.raises(ValueError, match="temperature > 0"):
        next(lab.draw(pair.target.model, None, prompt, 1, 2, se.SamplingParams(0.0), 10, "plain"))
    with pytest.raises(ValueError, match="sampler must be one of"):
        next(lab.draw(pair.target.model, None, prompt, 1, 2, LAB_SAMPLING, 10, "heuristic"))


@pytest.mark.slow
def test_histogram_lists_likely_outcomes_then_the_rest(lab_draws):
    exact, draws = lab_draws
    hist = lab.histogram(exact, list(draws.values()), length=2, top=3)
    assert len(hist.outcomes) == 4 and hist.outcomes[-1] == ()
    assert hist.exact == sorted(hist.exact[:3], reverse=True) + [hist.exact[-1]]
    assert sum(hist.exact) == pytest.approx(1.0)
    for row in hist.empirical.values():
        assert sum(row) == pytest.approx(1.0)
    one = lab.histogram(exact, list(draws.values()), length=1)
    assert all(len(seq) == 1 for seq in one.outcomes)


# ---------------------------------------------------------------------------------------------- sweeps

def toy_drafter(pair):
    def make(name: str) -> se.Drafter:
        return se.PromptLookupDrafter() if name == "prompt-lookup" else se.ModelDrafter(pair.draft.model)
    return make


def direct(pair, prompt, point: sweep.SweepPoint, max_new_tokens: int, seed: int):
    decoder = se.SpeculativeDecoder(pair.target.model, toy_drafter(pair)(point.draft))
    return decoder.generate(prompt, k=point.k, max_new_tokens=max_new_tokens, sampling=point.sampling, seed=seed)


@pytest.mark.parametrize("axis,values", [("k", [1, 2, 3, 5]), ("temperature", [0.0, 0.7, 1.2]),
                                         ("draft", ["toy-draft", "prompt-lookup"])])
def test_sweep_rows_match_direct_engine_runs(pair, prompt, axis, values):
    points = sweep.sweep_points(axis, values, "toy-draft", 3, se.SamplingParams(1.0, top_p=0.9))
    baselines = {}
    rows = list(sweep.run_sweep(pair.target.model, toy_drafter(pair), prompt, axis, points, max_new_tokens=12,
                                seed=3, baselines=baselines))
    assert [r.value for r in rows] == values
    assert len(baselines) == len({sweep.baseline_key(p.sampling) for p in points})
    for row, point in zip(rows, points):
        ref = direct(pair, prompt, point, 12, 3)
        assert row.tokens == ref.tokens
        assert row.acceptance == ref.stats.acceptance_rate
        assert row.rounds == ref.stats.rounds and row.tokens_per_forward == ref.stats.tokens_per_round
        assert row.judged_acceptance == ref.stats.judged_acceptance
        assert row.expected_tokens_per_forward == expected_tokens_per_round(row.judged_acceptance, point.k)
        plain = baselines[sweep.baseline_key(point.sampling)][0]
        assert row.plain_tokens_per_second == plain.tokens_per_second
        assert row.speedup == pytest.approx(row.tokens_per_second / plain.tokens_per_second)


def test_sweep_baseline_is_plain_decoding_with_the_same_settings(pair, prompt):
    points = sweep.sweep_points("k", [2], "toy-draft", 2, se.SamplingParams(0.8))
    baselines = {}
    list(sweep.run_sweep(pair.target.model, toy_drafter(pair), prompt, "k", points, 10, seed=5, baselines=baselines))
    plain = se.autoregressive_generate(pair.target.model, prompt, 10, se.SamplingParams(0.8), seed=5)
    assert baselines[sweep.baseline_key(se.SamplingParams(0.8))][0].tokens == plain.tokens


def test_best_is_the_highest_measured_speedup():
    def row(value, speedup):
        point = sweep.SweepPoint("d", value, se.SamplingParams())
        return sweep.SweepRow("k", value, point, 0.5, 1.5, 1.5, 1, 1, 1.0, 1.0, 1.0, speedup, [])
    rows = [row(1, 0.9), row(2, 1.4), row(3, 1.2)]
    assert sweep.best(rows).value == 2
    assert sweep.best([]) is None


def test_sweep_points_validate_and_keep_the_other_settings():
    base = se.SamplingParams(1.0, top_k=5, top_p=0.9)
    temps = sweep.sweep_points("temperature", [0.0, 1.5], "layer-skip", 4, base)
    assert [(p.k, p.draft, p.sampling) for p in temps] == [(4, "layer-skip", se.SamplingParams(0.0, 5, 0.9)),
                                                           (4, "layer-skip", se.SamplingParams(1.5, 5, 0.9))]
    with pytest.raises(ValueError, match="k values"):
        sweep.sweep_points("k", [0, 1], "layer-skip", 4, base)
    with pytest.raises(ValueError, match="axis"):
        sweep.sweep_points("top_p", [0.5], "layer-skip", 4, base)
    with pytest.raises(ValueError, match="at least one"):
        sweep.sweep_points("draft", [], "layer-skip", 4, base)
