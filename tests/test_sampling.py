"""Warping equals what Hugging Face's own logits processors do, so "the target's distribution" matches what a
user of `generate(do_sample=True, ...)` would sample from."""
import math

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from spec_engine.accel import searches as sampling          # the CPU searches (the generic code: core/sampling.py)
from spec_engine.accel.searches import native_warp_rows
from spec_engine.core.sampling import (MAX_TOP_K, SamplingParams, choose_token, make_generator, sample, top_entries,
                                       top_p_filter, topk_top_p, warp)

SETTINGS = [(1.0, 0, 1.0), (0.7, 0, 0.9), (1.3, 5, 1.0), (0.5, 20, 0.8), (2.0, 3, 0.5), (1.0, 0, 0.05)]


def hf_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores, dim=-1)


@pytest.mark.parametrize("temperature,top_k,top_p", SETTINGS)
def test_warp_matches_transformers_processors(temperature, top_k, top_p):
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(3), dtype=torch.float64) * 3
    ours = warp(logits, SamplingParams(temperature, top_k, top_p))
    theirs = hf_probs(logits, temperature, top_k, top_p)
    assert torch.allclose(ours, theirs, atol=1e-12)
    assert torch.allclose(ours.sum(-1), torch.ones(6, dtype=torch.float64))


FLOAT32_SETTINGS = SETTINGS + [(0.5, 0, 0.9), (1.7, 0, 0.8), (0.3, 0, 0.95), (0.8, 40, 0.9)]


@pytest.mark.parametrize("temperature,top_k,top_p", FLOAT32_SETTINGS)
def test_warp_of_float32_logits_matches_transformers_processors(temperature, top_k, top_p, cpu_search):
    """The app's dtype: float32 logits take the compiled warp_rows (csrc/sampling.cpp: temperature, softmax, then
    top-p) where it builds, else numpy's top-p search; both against Hugging Face's processors on the same float32
    logits and against the float64 definition: the same members, numbers within float32 rounding (total variation
    < 1e-4; top-p applied before the temperature moves it by 0.04-0.1 here)."""
    generator = torch.Generator().manual_seed(21)
    for vocab, scale in ((50, 3.0), (3000, 2.0), (49152, 1.0)):
        logits = torch.randn(4, vocab, generator=generator) * scale                     # float32 [rows, vocab]
        params = SamplingParams(temperature, top_k, top_p)
        ours = warp(logits, params)
        assert ours.dtype == torch.float32
        for reference in (hf_probs(logits, temperature, top_k, top_p), warp(logits.double(), params).float()):
            # float32 mass accumulated over tens of thousands of near-equal tokens may move the top-p boundary by a
            # token or two (each ~1e-5) in the big flat rows; the sets are otherwise the same
            differ = int(((ours > 0) != (reference > 0)).sum())
            assert differ == 0 if vocab <= 3000 else differ <= 4, (vocab, params, differ)
            assert 0.5 * float((ours - reference).abs().sum(-1).max()) < 1e-4, (vocab, params)   # total variation
            both = (ours > 0) & (reference > 0)
            torch.testing.assert_close(ours[both], reference[both], rtol=1e-4, atol=1e-7)
        assert torch.allclose(ours.sum(-1), torch.ones(4), atol=1e-5)


@pytest.mark.usefixtures("cpu_speed_layer")
def test_the_compiled_warp_is_the_one_float32_logits_take(monkeypatch):
    """warp_rows really runs for float32 CPU logits without top-k (so the comparisons above test it)."""
    library = sampling.native_searches()
    if library is None:
        pytest.skip("no compiled searches here")
    calls = []
    monkeypatch.setattr(sampling, "native_warp_rows", lambda *a: calls.append(1) or native_warp_rows(*a))
    warp(torch.randn(2, 100), SamplingParams(0.7, top_p=0.9))
    assert calls == [1]


def test_top_p_keeps_the_crossing_token_and_never_empties():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    assert top_p_filter(probs, 0.6).tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])
    assert top_p_filter(probs, 0.01).tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert top_p_filter(probs, 1.0).tolist() == pytest.approx(probs.tolist())


@pytest.mark.usefixtures("cpu_speed_layer")
def test_a_token_whose_mass_before_it_is_exactly_top_p_is_left_out(cpu_search):
    """The top-p set is the smallest whose mass reaches top_p: with dyadic masses, which add up exactly, the token
    whose mass before it equals top_p is outside (kept while the mass before it is below top_p), in the CPU searches
    (numpy, compiled) and the generic one, float32 and float64."""
    probs = torch.tensor([0.125, 0.5, 0.125, 0.25])
    for dtype in (torch.float32, torch.float64):
        for search in (top_p_filter, topk_top_p):
            assert search(probs.to(dtype)[None], 0.75)[0].tolist() == pytest.approx([0.0, 2 / 3, 0.0, 1 / 3])
            assert search(probs.to(dtype)[None], 0.5)[0].tolist() == [0.0, 1.0, 0.0, 0.0]


def test_greedy_warp_is_the_one_hot_argmax_of_every_row():
    logits = torch.tensor([[0.1, 2.0, 1.9], [3.0, -1.0, 2.9]])                 # [rows, vocab]
    assert warp(logits, SamplingParams(0.0)).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    assert warp(logits[None], SamplingParams(0.0)).tolist() == [[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]]


def test_the_cdf_draw_is_a_float64_uniform_from_the_runs_generator():
    """unit_draw takes a float64 draw (53 random bits; a float32 draw has 2^24 values, so a CDF step narrower than
    2^-24 would be drawn at the wrong frequency), one draw of the run's generator."""
    from spec_engine.core.sampling import unit_draw
    for seed in range(5):
        draw = unit_draw(make_generator("cpu", seed), torch.device("cpu"))
        assert draw.dtype == torch.float64 and draw.dim() == 0
        assert float(draw) == float(torch.rand((), generator=make_generator("cpu", seed), dtype=torch.float64))


def test_greedy_is_argmax_not_a_tiny_temperature():
    logits = torch.tensor([0.1, 2.0, 1.9])
    params = SamplingParams(temperature=0.0)
    assert params.greedy
    token, probs = choose_token(logits, params, make_generator("cpu", 0))
    assert token == 1 and probs.tolist() == [0.0, 1.0, 0.0]


def test_same_seed_same_draws():
    probs = torch.softmax(torch.randn(100), -1)
    draws = [torch.multinomial(probs, 5, generator=make_generator("cpu", 7)).tolist() for _ in range(2)]
    assert draws[0] == draws[1]


@pytest.mark.parametrize("kwargs,field", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": math.inf}, "temperature"),
    ({"temperature": math.nan}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_p": math.nan}, "top_p"), ({"top_p": "0.9"}, "top_p"), ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"),
    ({"top_k": MAX_TOP_K + 1}, "top_k"),
])
def test_bad_sampling_params_say_what_to_change(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_warp_of_bfloat16_logits_is_computed_in_float32():
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1)).bfloat16()
    for params in (SamplingParams(0.7, top_p=0.9), SamplingParams(1.3, top_k=5)):
        probs = warp(logits, params)
        assert probs.dtype == torch.float32 and torch.equal(probs, warp(logits.float(), params))


def test_the_largest_settings_are_accepted():
    assert SamplingParams(temperature=1, top_k=MAX_TOP_K, top_p=1).top_k == MAX_TOP_K


def test_sample_at_with_a_support_and_no_speed_layer_inverts_the_whole_row():
    """A support is only a hint to a speed layer: without one, sample_at still returns the whole row's token."""
    from conftest import speed_layer_off
    from spec_engine.core.sampling import sample_at
    row = torch.tensor([0.0, 0.25, 0.0, 0.75])
    with speed_layer_off():
        assert [sample_at(row, point, np.array([3, 1])) for point in (0.1, 0.3)] == [1, 3]


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, True])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match="seed"):
        make_generator("cpu", seed)


def test_inverse_cdf_sampler_matches_the_distribution_and_never_draws_zero_probability():
    """Chi-square on 20,000 draws; a correct sampler fails with probability 1e-4."""
    from scipy.stats import chisquare
    from spec_engine.core.sampling import sample
    probs = torch.tensor([0.0, 0.1, 0.0, 0.25, 0.05, 0.6, 0.0])
    generator = make_generator("cpu", 0)
    counts = torch.bincount(torch.tensor([sample(probs, generator) for _ in range(20_000)]), minlength=7)
    assert counts[probs == 0].sum() == 0
    support = probs > 0
    assert chisquare(counts[support].numpy(), (probs[support] * 20_000).numpy()).pvalue > 1e-4


@pytest.mark.parametrize("search", [top_p_filter, topk_top_p], ids=["cpu-floors", "topk"])
@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999, 0.99999])
def test_top_p_candidate_search_equals_a_full_sort(top_p, search):
    """Both candidate searches (floors lowered on the CPU, topk widened elsewhere) find the full sort's set;
    flat distributions force them to lower or widen."""
    for scale in (0.1, 1.0, 5.0):
        logits = torch.randn(3, 5000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        probs = torch.softmax(logits * scale, -1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(
            -1, order, (torch.cumsum(sorted_probs, -1) - sorted_probs) >= top_p)
        reference = probs.masked_fill(drop, 0.0)
        reference = reference / reference.sum(-1, keepdim=True)
        assert torch.allclose(search(probs, top_p), reference, atol=1e-15)


@pytest.fixture(params=["numpy", "compiled"])
def cpu_search(request, monkeypatch, cpu_speed_layer):
    """Run a test with the numpy searches, then with the compiled ones (csrc/sampling.cpp) where they build."""
    if request.param == "compiled" and sampling.native_searches() is None:
        pytest.skip("no compiled searches here")
    if request.param == "numpy":
        monkeypatch.setattr(sampling, "_SEARCHES", [None])
    return request.param


@pytest.mark.parametrize("n", [1, 3, 5, 60])
def test_top_entries_equal_topk(n, cpu_search):
    """The search for the display's top entries finds what torch.topk finds, peaked or flat, any shape."""
    generator = torch.Generator().manual_seed(2)
    for scale, shape in ((0.01, (4, 49152)), (1.0, (3, 2000)), (8.0, (2, 3, 500)), (3.0, (40,))):
        for dtype in (torch.float32, torch.float64):
            probs = torch.softmax(torch.randn(shape, generator=generator, dtype=dtype) * scale, -1)
            values, ids = top_entries(probs, n)
            expected_values, expected_ids = torch.topk(probs, min(n, shape[-1]), dim=-1)
            assert torch.equal(ids, expected_ids) and torch.equal(values, expected_values)
    sparse = torch.tensor([0.0, 0.7, 0.0, 0.3])                      # fewer nonzero entries than asked for
    assert top_entries(sparse, 3)[1][:2].tolist() == [1, 3] and top_entries(sparse, 3)[0][2] == 0
    # top-p rows of a real vocabulary: 1, 2 or n + 1 members, some below every floor; zeros complete a short row
    for members in (1, 2, n + 1):
        row = torch.zeros(49152, dtype=torch.float64)
        ids = torch.randperm(49152, generator=generator)[:members]
        row[ids] = torch.softmax(torch.randn(members, generator=generator, dtype=torch.float64) * 20, -1)
        values, found = top_entries(row, n)
        expected_values, expected_ids = torch.topk(row, n)
        assert torch.equal(values, expected_values)
        assert found[:members].tolist() == expected_ids[:members].tolist() and len(set(found.tolist())) == n


def test_searches_fall_back_to_torch_outside_numpys_reach():
    """bf16 and autograd tensors take the topk path (numpy has no bf16 and cannot read a tensor that needs grad)."""
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    expected = top_p_filter(probs, 0.6)
    assert torch.allclose(top_p_filter(probs.to(torch.bfloat16), 0.6).float(), expected, atol=1e-2)
    assert torch.allclose(top_p_filter(probs.clone().requires_grad_(True), 0.6).detach(), expected)
    assert top_entries(probs.clone().requires_grad_(True), 2)[1].tolist() == [0, 1]


@pytest.mark.usefixtures("cpu_speed_layer")
@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_warp_records_each_rows_members_for_the_displays_top_entries(top_p, cpu_search):
    """warp's record of the top-p members (most likely first) gives top_entries the same answer as its own search,
    rows with fewer members than asked for included."""
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 49152, generator=generator) * 4.0
    logits[0, 7] = 40.0                                                          # one row with a single member
    params = SamplingParams(temperature=0.7, top_p=top_p)
    members = []
    probs = warp(logits, params, members)
    assert len(members) == 4
    for row, ids in zip(probs, members):
        assert set(ids.tolist()) == set(torch.nonzero(row).flatten().tolist())
        assert torch.all(row[torch.from_numpy(ids)][:-1] >= row[torch.from_numpy(ids)][1:])   # most likely first
    for n in (1, 3, 5):
        values, ids = top_entries(probs, n, members)
        expected_values, expected_ids = top_entries(probs, n)
        assert torch.equal(values, expected_values) and torch.equal(ids, expected_ids)
    assert warp(logits, SamplingParams(temperature=0.7), members := []) is not None and members == []   # no top-p


def top_p_by_full_sort(row: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The CPU searches' definition, by sorting the whole row: mass accumulated in the row's dtype, most likely
    first (ties by id), each token kept while the mass before it is below top_p, renormalised by the members' mass
    summed in double, in that order. Returns (kept row, member ids most likely first)."""
    order = np.argsort(-row, kind="stable")
    values = row[order]
    through = np.cumsum(values)
    inside = (through - values) < row.dtype.type(top_p)
    count = values.shape[0] if inside.all() else int(np.argmin(inside))
    kept = np.zeros_like(row)
    kept[order[:count]] = values[:count] / row.dtype.type(np.cumsum(values[:count], dtype=np.float64)[-1])
    return kept, order[:count]


def cpu_rows() -> list[np.ndarray]:
    """float32 probability rows that reach every branch of the searches: peaked and flat softmaxes of a real
    vocabulary (flat ones need every token, past the first try's room for member ids), ties, one certain token."""
    generator = torch.Generator().manual_seed(9)
    rows = [torch.softmax(torch.randn(49152, generator=generator) * scale, -1).numpy()
            for scale in (0.01, 0.3, 1, 3, 8)]
    rows += [torch.softmax(torch.randn(7, generator=generator), -1).numpy()]
    rows += [np.full(49152, 1 / 49152, dtype=np.float32)]
    ties = np.zeros(49152, dtype=np.float32)
    ties[[5, 900, 17, 40000]] = 0.25
    certain = np.zeros(49152, dtype=np.float32)
    certain[123] = 1.0
    mixed = (0.5 * torch.softmax(torch.randn(49152, generator=generator) * 0.01, -1)).numpy()
    mixed[[3, 77]] += 0.25                               # two big tokens, the rest under every floor
    return rows + [ties, certain, mixed]


@pytest.mark.usefixtures("cpu_speed_layer")
@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.99, 0.99999])
def test_cpu_top_p_searches_equal_the_definition_bit_for_bit(top_p, cpu_search):
    """Both CPU searches (numpy, and csrc/sampling.cpp compiled) keep exactly the full sort's members with exactly
    its numbers, in the same order, so the two never disagree about a distribution."""
    for row in cpu_rows():
        members = []
        kept = top_p_filter(torch.from_numpy(row.copy())[None], top_p, members)[0].numpy()
        expected, expected_ids = top_p_by_full_sort(row, top_p)
        assert np.array_equal(kept, expected) and np.array_equal(members[0], expected_ids), (row.shape, top_p)


@pytest.mark.usefixtures("cpu_speed_layer")
def test_without_a_compiler_top_p_is_searched_in_numpy(monkeypatch, tmp_path):
    monkeypatch.setattr(sampling, "_SEARCHES", [])
    monkeypatch.setenv("SPEC_ENGINE_CACHE", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.warns(RuntimeWarning, match="numpy"):
        assert sampling.native_searches() is None
    row = cpu_rows()[2]
    assert np.array_equal(top_p_filter(torch.from_numpy(row)[None], 0.9)[0].numpy(), top_p_by_full_sort(row, 0.9)[0])
    assert torch.equal(top_entries(torch.from_numpy(row), 3)[1], torch.topk(torch.from_numpy(row), 3).indices)
    monkeypatch.setattr(sampling, "_SEARCHES", [])
    monkeypatch.setenv("SPEC_ENGINE_NATIVE_SEARCH", "0")                 # switched off: no warning, numpy
    assert sampling.native_searches() is None


@pytest.mark.usefixtures("cpu_speed_layer")
def test_sampling_over_the_members_draws_the_token_the_whole_row_draws():
    """sample(probs, generator, support) accumulates the CDF over the members only: same token as the whole row
    for the same generator state, every time (the zeros between members add nothing)."""
    generator = torch.Generator().manual_seed(4)
    for scale, top_p in ((1.0, 0.9), (3.0, 0.5), (0.3, 0.99)):
        members = []
        probs = warp(torch.randn(5, 49152, generator=generator) * scale, SamplingParams(0.8, top_p=top_p), members)
        for row, support in zip(probs, members):
            for seed in range(40):
                assert sample(row, make_generator("cpu", seed), support) == sample(row, make_generator("cpu", seed))
    found = []
    token, probs = choose_token(torch.randn(3000, generator=generator), SamplingParams(0.8, top_p=0.9),
                                make_generator("cpu", 1), found)
    assert len(found) == 1 and token in found[0].tolist()
    assert token == sample(probs, make_generator("cpu", 1))                  # the whole row's draw


@pytest.mark.usefixtures("cpu_speed_layer")
def test_top_entries_break_ties_by_id_in_both_searches(cpu_search):
    """Equal values (zeros of a top-p row, exact ties) come lowest id first, in numpy and compiled alike."""
    row = torch.zeros(300)
    row[[250, 40, 7]] = torch.tensor([0.2, 0.5, 0.2])
    values, ids = top_entries(row, 5)
    assert ids.tolist() == [40, 7, 250, 0, 1] and values.tolist() == pytest.approx([0.5, 0.2, 0.2, 0.0, 0.0])


def test_top_probability_is_the_softmax_maximum_and_the_first_argmax(cpu_search):
    from spec_engine.core.sampling import top_probability
    generator = torch.Generator().manual_seed(8)
    for vocab, scale in ((8192, 3.0), (49152, 0.1), (7, 10.0), (17, 1.0)):
        logits = torch.randn(vocab, generator=generator) * scale
        prob, index = top_probability(logits)
        assert index == int(logits.argmax()) and prob == pytest.approx(float(torch.softmax(logits, -1).max()), rel=1e-6)
    tied = torch.tensor([1.0, 3.0, -2.0, 3.0])
    assert top_probability(tied) == (pytest.approx(float(torch.softmax(tied, -1)[1]), rel=1e-6), 1)
    assert top_probability(torch.full((40,), -1e4)) == (pytest.approx(1 / 40, rel=1e-6), 0)


def test_argmax_rows_is_torch_argmax_ties_first(cpu_search):
    """The greedy decisions' search (sampling.argmax_rows; compiled: the top-1 search) finds torch.argmax's index in
    every row: peaked and flat rows, negative and -inf entries, exact ties (the first wins), one row or many."""
    from spec_engine.core.sampling import argmax_rows
    generator = torch.Generator().manual_seed(9)
    for rows, vocab, scale in ((9, 49152, 3.0), (1, 49152, 0.01), (4, 8192, 1.0), (3, 7, 10.0), (2, 130, 1.0)):
        logits = torch.randn(rows, vocab, generator=generator) * scale - 50.0
        logits[0, :vocab // 2] = -math.inf
        assert argmax_rows(logits) == logits.argmax(dim=-1).tolist()
    tied = torch.tensor([[1.0, 3.0, -2.0, 3.0], [-math.inf, -1.0, -1.0, -math.inf], [0.0, 0.0, 0.0, 0.0]])
    assert argmax_rows(tied) == [1, 1, 0] == tied.argmax(dim=-1).tolist()
    late = torch.full((2, 1000), -3.0)
    late[0, 999], late[1, 64] = -2.0, -2.0                    # in the last block, and first in a later block
    assert argmax_rows(late) == [999, 64]


@pytest.mark.usefixtures("cpu_speed_layer")
def test_warp_of_a_flat_row_finds_every_member(cpu_search):
    """A flat row needs more member ids than the compiled search's first buffer holds: it runs again with room for
    every token, and finds what numpy finds."""
    members = []
    probs = warp(torch.zeros(2, 49152), SamplingParams(0.7, top_p=0.9), members)
    # float32 accumulation of 44k equal masses drifts: the definition keeps ~0.03% more than 0.9 * 49152
    expected, _ = top_p_by_full_sort(warp(torch.zeros(49152), SamplingParams(0.7)).numpy(), 0.9)
    assert len(members) == 2 and all(len(ids) == int((expected > 0).sum()) for ids in members)
    assert abs(len(members[0]) - 0.9 * 49152) < 0.001 * 49152
    assert torch.allclose(probs.sum(-1), torch.ones(2)) and int((probs[0] > 0).sum()) == len(members[0])
