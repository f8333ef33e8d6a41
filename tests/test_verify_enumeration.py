"""Exact enumeration on a tiny vocabulary: the speculative process emits tokens with exactly the target's
warped probabilities (to 1e-9 in float64), for random p and q that depend on the context, several warping
settings, k = 1..3, stochastic and deterministic drafts. The same enumeration shows the wrong rules drift; for the
rules of issue #37 it holds strict to the target (exact for any draft, fewer drafts kept than the exact rule with a
sampled draft, as many with a one-hot one) and typical and q_mismatch to the drift their definitions predict.

The enumerator runs the rule's reference, `rule.speculative_step` (the paper's algorithm as one pure function, its cells
cut where the paper's definitions say), and the engine's own rule, `verify_with_draws` (the `settle` that
`verify_sampled` runs once it has drawn), over every drafted sequence and every cell of its random draws: the uniforms
compared with min(1, p/q) and the point where the next token's CDF is inverted. A wiring bug (the correction drawn from
p, the bonus from the wrong row, the draws compared the wrong way) therefore fails here deterministically;
`verify_sampled`'s own draws are tied to `verify_with_draws` by replay (same generator, same verdict), and greedy
verification is enumerated over every draft against plain greedy decoding.
"""
import itertools
import zlib
from functools import lru_cache

import numpy as np
import pytest
import torch

from spec_engine.core.rule import residual, speculative_step
from spec_engine.core.sampling import SamplingParams, make_generator, unit_draw, warp
from spec_engine.core.verify import (acceptance_prob, count_accepted_host, residual_distribution, verify, verify_greedy,
                                verify_sampled, verify_with_draws)

VOCAB = 4
LENGTH = 3     # compare the joint distribution of the first 3 emitted tokens


def toy_logits(kind: str, context: tuple, salt: int) -> torch.Tensor:
    seed = zlib.crc32(repr((kind, context, salt)).encode())     # stable across processes, unlike hash()
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2.0


class Toy:
    """A context-dependent target p and draft q over VOCAB tokens, both warped with the same settings."""

    def __init__(self, params: SamplingParams, salt: int, deterministic_draft: bool):
        self.params, self.salt, self.deterministic = params, salt, deterministic_draft

    @lru_cache(maxsize=None)
    def p(self, context: tuple) -> torch.Tensor:
        return warp(toy_logits("target", context, self.salt), self.params)

    @lru_cache(maxsize=None)
    def q(self, context: tuple) -> torch.Tensor:
        probs = warp(toy_logits("draft", context, self.salt), self.params)
        if self.deterministic:                      # a deterministic drafter: q is one-hot on its pick
            return torch.nn.functional.one_hot(probs.argmax(), VOCAB).to(torch.float64)
        return probs

    @lru_cache(maxsize=None)
    def q_unwarped(self, context: tuple) -> torch.Tensor:
        """The draft's temperature-1 softmax before top-k / top-p: the q the shipped bug (q_mismatch) reads."""
        return torch.softmax(toy_logits("draft", context, self.salt), dim=-1)


def add(dist: dict, seq: tuple, prob: float) -> None:
    dist[seq[:LENGTH]] = dist.get(seq[:LENGTH], 0.0) + prob


def members_of(row: torch.Tensor) -> np.ndarray:
    """A warped row's nonzero ids, most likely first: what warp records as the row's top-p members."""
    values = row.numpy()
    ids = np.flatnonzero(values)
    return ids[np.argsort(-values[ids], kind="stable")]


def cells(breaks: list[float]) -> list[tuple[float, float]]:
    """[0, 1) cut at `breaks`: (midpoint, width) of every nonempty cell."""
    edges = sorted({0.0, 1.0, *(min(max(b, 0.0), 1.0) for b in breaks)})
    return [((lo + hi) / 2, hi - lo) for lo, hi in zip(edges, edges[1:]) if hi > lo]


def definition_outcomes(drafted: tuple, q_rows: torch.Tensor, target_probs: torch.Tensor, rule: str) -> dict:
    """{(accepted, next token): probability} of one round of the reference, `speculative_step`, over its uniforms and
    CDF point. Its cells are cut where the paper's definitions say (min(1, p/q) for each uniform; the CDF of the
    residual, of p for the wrong rules' corrections, or of the bonus row for the point) and each is evaluated at its
    midpoint: a function that strays from the definitions lands its outcomes in the wrong cells."""
    n = len(drafted)
    p_rows, q_rows = target_probs, q_rows                                               # [n + 1, V], [n, V]

    def breaks(i):
        """Where uniform i's outcome can change: min(1, p/q) (strict: every step of p_i's CDF, its own draw)."""
        p_x, q_x = float(p_rows[i, drafted[i]]), float(q_rows[i, drafted[i]])
        if rule == "strict":
            return list(np.cumsum(p_rows[i].tolist()) / float(p_rows[i].sum()))
        if rule in ("topp_membership", "typical"):
            return []                                          # no draw decides these
        return [min(1.0, p_x / q_x) if q_x > 0 else 0.0]

    def next_dist(accepted):
        if accepted == n:
            return p_rows[n]
        return residual(p_rows[accepted], q_rows[accepted]) if rule in ("exact", "q_mismatch") else p_rows[accepted]

    outcomes: dict = {}

    def visit(uniforms: list[float], weight: float) -> None:
        i = len(uniforms)
        full = uniforms + [0.0] * (n - i)                      # later uniforms are never read after a rejection
        accepted = speculative_step(p_rows, q_rows, list(drafted), full, 0.5, rule)[0]
        if i < n and accepted >= i:                            # position i is judged: uniform i decides it
            for middle, width in cells(breaks(i)):
                visit(uniforms + [middle], weight * width)
            return
        dist = next_dist(accepted).tolist()
        for middle, width in cells(list(np.cumsum(dist) / sum(dist))):
            key = speculative_step(p_rows, q_rows, list(drafted), full, middle, rule)
            outcomes[key] = outcomes.get(key, 0.0) + weight * width
    visit([], 1.0)
    return outcomes


def round_outcomes(drafted: tuple, draft_probs, target_probs: torch.Tensor, rule: str, members, unwarped=None) -> dict:
    """{(accepted, next token): probability} of one verified round, over the uniforms and the CDF point, from
    verify_with_draws alone. Its outcome is piecewise constant in the draws: uniform i matters only through
    `uniform < accept_probs[i]`, the point only through the CDF of the distribution the next token comes from. The
    cells are cut where the verdict itself says (its accept_probs and the distribution it reports) and each is
    evaluated at its midpoint, so a rule that reports one distribution and samples another shows."""
    n = len(drafted)
    drafted_t = torch.tensor(drafted, dtype=torch.long)
    call = lambda uniforms, point: verify_with_draws(drafted_t, draft_probs, target_probs, uniforms, point, rule,
                                                     members, unwarped)
    outcomes: dict = {}

    def visit(uniforms: list[float], weight: float) -> None:
        i = len(uniforms)
        probe = call(uniforms + [0.0] * (n - i), 0.5)
        if i < n and probe.accepted >= i:                # position i is judged: cut uniform i at its accept prob
            cuts = [probe.accept_probs[i]]               # (strict: at every step of the row's CDF, its own draw)
            if rule == "strict":
                cuts += list(np.cumsum(target_probs[i].tolist()) / float(target_probs[i].sum()))
            for middle, width in cells(cuts):
                visit(uniforms + [middle], weight * width)
            return
        full = uniforms + [0.0] * (n - i)                # later uniforms are never read after a rejection
        reported = dict(probe.next_probs_top)            # the whole next-token distribution: VOCAB <= RESIDUAL_TOP
        total = sum(reported.values())
        for middle, width in cells(list(np.cumsum([reported.get(y, 0.0) for y in range(VOCAB)]) / total)):
            verdict = call(full, middle)
            key = (verdict.accepted, verdict.next_token)
            outcomes[key] = outcomes.get(key, 0.0) + weight * width
    visit([], 1.0)
    return outcomes


def emitted_distribution(toy: Toy, k: int, rule: str, on_support: bool = False, reference: bool = False) -> dict:
    """Exact distribution of the first LENGTH tokens emitted by speculative rounds of k drafts, each verified by
    verify_with_draws (`reference`: by rule.speculative_step); `on_support`: each target row's top-p members handed
    to verify_with_draws, as verify() does from warp."""
    dist: dict = {}

    def run(context: tuple, prob: float) -> None:
        if len(context) >= LENGTH or prob == 0:
            add(dist, context, prob)
            return
        n = min(k, LENGTH - len(context) - 1)
        for drafts in itertools.product(range(VOCAB), repeat=n):
            draft_prob = prob
            for i, x in enumerate(drafts):
                draft_prob *= float(toy.q(context + drafts[:i])[x])
            if draft_prob == 0:
                continue
            target_probs = torch.stack([toy.p(context + drafts[:i]) for i in range(n + 1)])     # [n + 1, vocab]
            draft_rows = [toy.q(context + drafts[:i]) for i in range(n)]                          # [n, vocab]
            draft_probs = None if toy.deterministic else \
                torch.stack(draft_rows) if draft_rows else torch.zeros(0, VOCAB, dtype=torch.float64)
            members = [members_of(row) for row in target_probs] if on_support else None
            unwarped = None if draft_probs is None else torch.stack(
                [toy.q_unwarped(context + drafts[:i]) for i in range(n)]
                or [torch.zeros(VOCAB, dtype=torch.float64)])[:n]
            if reference:
                q_rows = torch.stack([torch.nn.functional.one_hot(torch.tensor(x), VOCAB).to(torch.float64)
                                      for x in drafts]) if toy.deterministic and n else \
                    draft_probs if draft_probs is not None else torch.zeros(0, VOCAB, dtype=torch.float64)
                if rule == "q_mismatch" and unwarped is not None:
                    q_rows = unwarped                    # the bug is the exact rule fed this q
                outcomes = definition_outcomes(drafts, q_rows, target_probs, rule)
            else:
                outcomes = round_outcomes(drafts, draft_probs, target_probs, rule, members, unwarped)
            for (accepted, token), weight in outcomes.items():
                run(context + drafts[:accepted] + (token,), draft_prob * weight)

    run((), 1.0)
    return dist


def target_distribution(toy: Toy) -> dict:
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=LENGTH):
        prob = 1.0
        for i, y in enumerate(seq):
            prob *= float(toy.p(seq[:i])[y])
        dist[seq] = prob
    return dist


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(s, 0.0) - b.get(s, 0.0)) for s in set(a) | set(b))


SETTINGS = [SamplingParams(1.0), SamplingParams(0.7, top_p=0.9), SamplingParams(1.5, top_k=3),
            SamplingParams(0.8, top_k=3, top_p=0.7), SamplingParams(2.0, top_p=0.5)]


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-draft", "one-hot-draft"])
@pytest.mark.parametrize("salt", [0, 1])
@pytest.mark.parametrize("path", ["reference", "engine-whole-row", "engine-members"])
def test_exact_rule_emits_the_target_distribution(params, k, deterministic, salt, path):
    toy = Toy(params, salt, deterministic)
    got = emitted_distribution(toy, k, "exact", on_support=path == "engine-members", reference=path == "reference")
    want = target_distribution(toy)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    for seq in want:
        assert abs(got.get(seq, 0.0) - want[seq]) < 1e-9, seq


@pytest.mark.parametrize("rule", ["topp_membership", "no_residual"])
@pytest.mark.parametrize("reference", [True, False], ids=["reference", "engine"])
def test_wrong_rules_drift_from_the_target(rule, reference):
    toy = Toy(SamplingParams(1.0, top_p=0.9), salt=0, deterministic_draft=False)
    tv = total_variation(emitted_distribution(toy, 2, rule, reference=reference), target_distribution(toy))
    assert tv > 0.05, f"{rule} should visibly differ from the target (TV {tv:.3f})"


@pytest.mark.parametrize("rule", ["exact", "strict", "typical", "topp_membership", "no_residual"])
@pytest.mark.parametrize("on_support", [False, True], ids=["whole-row", "members"])
def test_the_engines_rule_equals_the_reference_draw_for_draw(rule, on_support):
    """verify_with_draws (what verify_sampled settles with) and rule.speculative_step agree on the accepted count and
    the next token, bitwise, for random p, q, drafts and draws over a 300-token vocabulary, float32 and float64,
    sampled and one-hot drafts, with and without the top-p members the CPU search records."""
    generator = torch.Generator().manual_seed(5)
    for trial in range(300):
        dtype = (torch.float64, torch.float32)[trial % 2]
        n = 1 + trial % 4
        params = SamplingParams(0.9, top_p=(1.0, 0.8, 0.5)[trial % 3])
        target_probs = warp(torch.randn(n + 1, 300, generator=generator, dtype=dtype) * 3, params)
        one_hot = trial % 5 == 0
        draft_probs = warp(torch.randn(n, 300, generator=generator, dtype=dtype) * 3, params)
        if trial % 7 == 0:                                     # drafts close to the target: acceptances run long
            draft_probs = target_probs[:n].clone()
        drafted = torch.multinomial(draft_probs, 1, generator=generator)[:, 0]
        q_rows = torch.nn.functional.one_hot(drafted, 300).to(dtype) if one_hot else draft_probs
        uniforms = torch.rand(n, generator=generator, dtype=torch.float64).tolist()
        point = float(torch.rand((), generator=generator, dtype=torch.float64))
        members = [members_of(row) for row in target_probs] if on_support else None
        verdict = verify_with_draws(drafted, None if one_hot else draft_probs, target_probs, uniforms, point, rule,
                                    members)
        assert (verdict.accepted, verdict.next_token) == \
            speculative_step(target_probs, q_rows, drafted.tolist(), uniforms, point, rule), trial


def test_residual_is_normalised_positive_part_and_falls_back_to_p():
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.2, 0.6, 0.2], dtype=torch.float64)
    assert residual_distribution(p, q).tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert residual_distribution(p, p).tolist() == pytest.approx(p.tolist())


@pytest.mark.usefixtures("cpu_speed_layer")      # the members come from the CPU search
def test_the_residual_over_the_members_is_the_whole_rows_residual():
    """residual_on_support (verify_sampled's path when warp recorded the top-p members) gives the whole row's
    residual: sampled drafts, one-hot drafts, and a draft that covers p (fallback to p)."""
    from spec_engine.accel.searches import residual as residual_on_support
    from spec_engine.core.sampling import SamplingParams, warp
    generator = torch.Generator().manual_seed(6)
    for _ in range(20):
        members = []
        p = warp(torch.randn(1, 3000, generator=generator) * 3, SamplingParams(0.8, top_p=0.9), members)[0]
        q = torch.softmax(torch.randn(3000, generator=generator) * 3, -1)
        one_hot = torch.zeros(3000)
        one_hot[int(members[0][0])] = 1.0
        for draft in (q, one_hot, p.clone()):
            torch.testing.assert_close(residual_on_support(p, draft, members[0]), residual_distribution(p, draft),
                                       rtol=1e-6, atol=1e-9)
    assert residual_on_support(p, p.clone(), members[0]) is p                 # p <= q everywhere: falls back to p


def test_zero_draft_probability_rejects_instead_of_dividing():
    assert [acceptance_prob(p, q) for p, q in ((0.4, 0.0), (0.0, 0.5), (0.3, 0.6), (0.7, 0.2))] == \
        pytest.approx([0.0, 0.0, 0.5, 1.0])


def test_the_reference_and_the_engine_agree_at_the_edges_of_the_draws():
    """Where random draws never land: a uniform exactly equal to min(1, p/q) rejects (accept when u < a, u in
    [0, 1)), in the reference and the engine alike, and a drafted token the draft gave q = 0 is rejected by both
    instead of dividing by zero."""
    p = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)   # [n + 1, vocab]
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)                               # one-hot: a = 0.5
    for u, accepted in ((0.5, 0), (0.5 - 2 ** -53, 1)):
        assert speculative_step(p, q, [0], [u], 0.0)[0] == accepted
        assert verify_with_draws(torch.tensor([0]), q, p, [u], 0.0).accepted == accepted
        assert verify_with_draws(torch.tensor([0]), None, p, [u], 0.0).accepted == accepted
    never = torch.tensor([[0.0, 0.5, 0.5, 0.0]], dtype=torch.float64)                           # q(0) = 0
    assert speculative_step(p, never, [0], [0.0], 0.0) == (0, 0)          # residual max(0, p - q) is one-hot on 0
    assert (verify_with_draws(torch.tensor([0]), never, p, [0.0], 0.0).accepted,
            verify_with_draws(torch.tensor([0]), never, p, [0.0], 0.0).next_token) == (0, 0)


def test_the_cdf_is_inverted_at_point_times_the_total_accumulated_in_float64():
    """inverse_cdf (the reference's draw) and sample_at (the engine's): the token whose step [cdf before, cdf) holds
    point * total, for rows that do not sum to 1, at the steps' very edges, and with a token of probability 1e-8
    after a large one (float32 accumulation would erase its step: 1 + 1e-8 == 1 in float32)."""
    from spec_engine.core.rule import inverse_cdf
    from spec_engine.core.sampling import sample_at
    row = torch.tensor([0.5, 0.5, 0.0, 1.0], dtype=torch.float64)                # total 2, cdf [0.5, 1, 1, 2]
    for point, token in ((0.0, 0), (0.2499, 0), (0.25, 1), (0.4999, 1), (0.5, 3), (0.9999, 3)):
        assert inverse_cdf(row, point) == token and sample_at(row, point) == token, point
        assert sample_at(row, torch.tensor(point, dtype=torch.float64)) == token
    tiny = torch.tensor([1.0, 1e-8, 1.0], dtype=torch.float32)
    total = 2.0 + float(torch.tensor(1e-8, dtype=torch.float32))
    point = (1.0 + 0.5e-8) / total                                               # inside the tiny token's step
    assert inverse_cdf(tiny, point) == 1 and sample_at(tiny, point) == 1


def test_count_accepted_stops_at_first_rejection():
    accept = [1.0, 0.5, 1.0]
    assert count_accepted_host(accept, [0.9, 0.4, 0.99]) == 3
    assert count_accepted_host(accept, [0.9, 0.6, 0.0]) == 1
    assert count_accepted_host([0.0], [0.0]) == 0


def test_greedy_forced_outcomes():
    logits = torch.full((4, 5), -10.0)
    for position, token in enumerate([2, 4, 1, 3]):
        logits[position, token] = 10.0
    verdict = verify_greedy(torch.tensor([2, 4, 0]), logits)          # rejection forced at position 2
    assert (verdict.accepted, verdict.next_token, verdict.is_bonus) == (2, 1, False)
    verdict = verify_greedy(torch.tensor([2, 4, 1]), logits)          # everything accepted: bonus is the argmax
    assert (verdict.accepted, verdict.next_token, verdict.is_bonus) == (3, 3, True)
    verdict = verify_greedy(torch.tensor([], dtype=torch.long), logits[:1])
    assert (verdict.accepted, verdict.next_token) == (0, 2)


@pytest.mark.usefixtures("cpu_speed_layer")      # the members come from the CPU search
def test_the_verdicts_top_candidates_come_from_the_rows_members_unchanged():
    """verify() hands verify_sampled each target row's top-p members; the residual's or bonus row's top candidates
    it reports equal a search of the whole row."""
    from spec_engine.core.sampling import SamplingParams, make_generator
    from spec_engine.core.verify import top_candidates, verify
    logits = torch.randn(4, 3000, generator=torch.Generator().manual_seed(3)) * 3.0        # [n + 1, vocab]
    params = SamplingParams(temperature=0.8, top_p=0.9)
    noise = torch.randn(3, 3000, generator=torch.Generator().manual_seed(4))
    draft_probs = torch.softmax(logits[:3] / 0.8 + noise, -1)                # near the target: some drafts accepted
    seen_accepted = set()
    for seed in range(40):
        drafted = torch.multinomial(draft_probs, 1, generator=torch.Generator().manual_seed(seed))[:, 0]   # [n]
        verdict, target_probs, members = verify("exact", params, drafted, draft_probs, logits,
                                                make_generator("cpu", seed))
        assert members is not None and len(members) == 4
        row = target_probs[verdict.accepted]
        next_dist = row if verdict.accepted == 3 else torch.clamp(row - draft_probs[verdict.accepted], min=0.0)
        next_dist = next_dist / next_dist.sum()
        expected = top_candidates(next_dist)
        assert [i for i, _ in verdict.next_probs_top] == [i for i, _ in expected]
        assert [v for _, v in verdict.next_probs_top] == pytest.approx([v for _, v in expected], rel=1e-6)
        seen_accepted.add(verdict.accepted)
    assert len(seen_accepted) >= 2                 # both residual rows and others were checked


def test_decision_inputs_read_in_place_equal_the_one_transfer_path(monkeypatch):
    """The CPU path (numpy reads of p(x_i), q(x_i)) and the device path (one concatenated transfer) hand the rule the
    same numbers and consume the generator alike, for sampled and one-hot drafts."""
    from conftest import speed_layer_off
    from spec_engine.core.sampling import make_generator
    from spec_engine.core.verify import decision_inputs
    target_probs = torch.softmax(torch.randn(4, 300, generator=torch.Generator().manual_seed(1)), -1)   # [n + 1, vocab]
    draft_probs = torch.softmax(torch.randn(3, 300, generator=torch.Generator().manual_seed(2)), -1)    # [n, vocab]
    drafted = torch.tensor([5, 299, 0])
    for draft in (draft_probs, None):
        in_place = decision_inputs(drafted, draft, target_probs, make_generator("cpu", 7))
        with speed_layer_off():
            transferred = decision_inputs(drafted, draft, target_probs, make_generator("cpu", 7))
        assert in_place == transferred
        assert in_place[0] == [float(target_probs[i, t]) for i, t in enumerate([5, 299, 0])]
        assert in_place[3] == [5, 299, 0] and (draft is not None or in_place[1] == [1.0] * 3)
        assert in_place[1] == ([1.0] * 3 if draft is None else [float(draft[i, t]) for i, t in enumerate([5, 299, 0])])


def test_verify_sampled_is_verify_with_draws_fed_the_generators_draws():
    """verify_sampled draws a uniform per draft token, then the CDF point, and settles exactly as
    verify_with_draws does with those numbers: the enumeration above is the engine's sampled path, draw for draw."""
    generator = torch.Generator().manual_seed(11)
    for trial in range(60):
        n, vocab = trial % 4, 6
        dtype = torch.float64 if trial % 2 else torch.float32       # the uniforms are drawn in the rows' dtype
        target_probs = warp(torch.randn(n + 1, vocab, generator=generator, dtype=dtype) * 2,
                            SamplingParams(0.9, top_p=0.9))
        draft_probs = torch.softmax(torch.randn(n, vocab, generator=generator, dtype=dtype) * 2, -1)
        drafted = (torch.multinomial(draft_probs, 1, generator=generator)[:, 0] if n
                   else torch.zeros(0, dtype=torch.long))
        for draft in (draft_probs, None):
            seed = 1000 + trial
            replay = make_generator("cpu", seed)
            uniforms = torch.rand(n, generator=replay, dtype=target_probs.dtype).tolist()
            point = float(unit_draw(replay, target_probs.device))
            for rule in ("exact", "no_residual"):
                drawn = verify_sampled(drafted, draft, target_probs, make_generator("cpu", seed), rule)
                assert drawn == verify_with_draws(drafted, draft, target_probs, uniforms, point, rule), (trial, rule)
            assert verify_sampled(drafted, draft, target_probs, make_generator("cpu", seed)) == \
                verify_sampled(drafted, draft, target_probs, make_generator("cpu", seed), "exact")      # the default
            assert verify_with_draws(drafted, draft, target_probs, uniforms, point) == \
                verify_with_draws(drafted, draft, target_probs, uniforms, point, "exact")


def test_a_forced_rejection_draws_the_correction_from_the_residual_every_time():
    """p = [0.6, 0.4, 0, 0]; q = [0.6, 0, 0.4, 0] drafted token 2 (p = 0: rejected for sure). The residual
    max(0, p - q) is one-hot on token 1, so every seed must correct to 1 (drawing from p would give 0 in ~60%)."""
    target_logits = torch.log(torch.tensor([[0.6, 0.4, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]))     # [n + 1, vocab]
    draft_probs = torch.tensor([[0.6, 0.0, 0.4, 0.0]])
    for params in (SamplingParams(1.0), SamplingParams(1.0, top_p=0.99)):       # whole-row and members paths
        for seed in range(30):
            verdict, _, _ = verify("exact", params, torch.tensor([2]), draft_probs, target_logits,
                                   make_generator("cpu", seed))
            assert (verdict.accepted, verdict.next_token, verdict.is_bonus) == (0, 1, False), seed
            assert [t for t, _ in verdict.next_probs_top] == [1]


def test_a_forced_acceptance_draws_the_bonus_from_the_last_row():
    """Drafts that the target certainly keeps (p = q one-hot); the bonus must come from row n, which puts all its
    mass on a token no other row allows."""
    rows = torch.full((4, 5), -1e9)                                       # [n + 1, vocab]
    for i, token in enumerate([2, 0, 3, 4]):
        rows[i, token] = 0.0
    drafted = torch.tensor([2, 0, 3])
    draft_probs = torch.nn.functional.one_hot(drafted, 5).float()
    for draft in (draft_probs, None):
        for seed in range(10):
            verdict, _, _ = verify("exact", SamplingParams(1.0), drafted, draft, rows, make_generator("cpu", seed))
            assert (verdict.accepted, verdict.next_token, verdict.is_bonus) == (3, 4, True)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("salt", [0, 1, 2])
def test_greedy_verification_of_every_draft_emits_plain_greedy_decoding(k, salt):
    """Greedy through verify(): for every possible draft of k tokens after every context, the emitted tokens
    (accepted drafts, then the correction or bonus) are exactly the next tokens of plain greedy decoding, and the
    accepted count is the length of the draft's agreement with it."""
    greedy = SamplingParams(0.0)
    argmax = lambda context: int(toy_logits("target", context, salt).argmax())
    for context in itertools.product(range(VOCAB), repeat=2):
        plain = list(context)
        for _ in range(k + 1):
            plain.append(argmax(tuple(plain)))
        expected = plain[len(context):]                                          # k + 1 greedy tokens
        for drafts in itertools.product(range(VOCAB), repeat=k):
            logits = torch.stack([toy_logits("target", context + drafts[:i], salt) for i in range(k + 1)]).float()
            verdict, _, _ = verify("exact", greedy, torch.tensor(drafts), None, logits, make_generator("cpu", 0))
            agree = next((i for i in range(k) if drafts[i] != expected[i]), k)
            assert verdict.accepted == agree and verdict.is_bonus == (agree == k)
            assert verdict.accept_probs == [1.0] * agree + [0.0] * (min(agree + 1, k) - agree)   # decided ones only
            assert verdict.uniforms == [] and verdict.next_probs_top == [(verdict.next_token, 1.0)]
            assert list(drafts[:verdict.accepted]) + [verdict.next_token] == expected[:agree + 1], (context, drafts)


def test_the_wrong_rule_under_greedy_keeps_drafts_inside_the_top_p_set_then_takes_the_argmax():
    """topp_membership with greedy params: drafts inside each row's temperature-1 top-p set are kept, up to the first
    one outside; the next token is that row's argmax. Every row's top-0.9 set here is {0, 1}, its argmax 0."""
    logits = torch.log(torch.tensor([[0.6, 0.35, 0.03, 0.01, 0.01]] * 4))                      # [n + 1, vocab]
    params = SamplingParams(0.0, top_p=0.9)
    cases = {(1, 0, 2): (2, [1.0, 1.0, 0.0]), (1, 1, 0): (3, [1.0, 1.0, 1.0]), (4, 0, 0): (0, [0.0])}   # 2: in at T = 2
    for drafts, (accepted, accept_probs) in cases.items():
        verdict, _, _ = verify("topp_membership", params, torch.tensor(drafts), None, logits, make_generator("cpu", 0))
        assert (verdict.accepted, verdict.next_token, verdict.accept_probs) == (accepted, 0, accept_probs), drafts
        assert verdict.uniforms == [] and verdict.next_probs_top == [(0, 1.0)]
    top1 = SamplingParams(0.0, top_k=1, top_p=0.9)                              # top-k narrows the set to {0}
    verdict, _, _ = verify("topp_membership", top1, torch.tensor([1, 0, 0]), None, logits, make_generator("cpu", 0))
    assert (verdict.accepted, verdict.accept_probs) == (0, [0.0])


def test_verify_names_an_unknown_rule_and_verify_with_draws_checks_its_draws():
    logits = torch.zeros(2, 4)
    with pytest.raises(ValueError, match=r"rule must be one of .*got 'residual'"):
        verify("residual", SamplingParams(1.0), torch.tensor([1]), None, logits, make_generator("cpu", 0))
    with pytest.raises(AssertionError):
        verify_with_draws(torch.tensor([1]), None, torch.softmax(logits, -1), [], 0.5)          # one uniform per draft


def test_the_membership_rule_keeps_any_draft_the_target_allows_whatever_q():
    """The deliberately wrong rule's acceptance, pinned (the drift test only says it differs): 1 where p(x) > 0, even
    when q(x) is far above p(x), 0 where p(x) = 0; the exact rule gives min(1, p/q) on the same draws."""
    target_probs = torch.tensor([[0.3, 0.7, 0.0], [0.5, 0.5, 0.0]], dtype=torch.float64)   # [n + 1, vocab]
    draft_probs = torch.tensor([[0.9, 0.1, 0.0]], dtype=torch.float64)
    for rule, accept in (("topp_membership", 1.0), ("exact", 0.3 / 0.9)):
        verdict = verify_with_draws(torch.tensor([0]), draft_probs, target_probs, [0.5], 0.5, rule)
        assert verdict.accept_probs == [pytest.approx(accept)] and verdict.accepted == (1 if accept > 0.5 else 0)
    one_hot = verify_with_draws(torch.tensor([2]), None, target_probs, [0.0], 0.5, "topp_membership")
    assert (one_hot.accepted, one_hot.accept_probs) == (0, [0.0])


# ------------------------------------------------------------------ strict, typical, q_mismatch (issue #37)

def definition(rule: str, p: torch.Tensor, q: torch.Tensor, x: int) -> tuple[float, torch.Tensor]:
    """(chance of keeping draft x, the distribution of the token emitted when it is refused), written from each rule's
    definition alone (not the engine's code): the analytic side the engine's enumeration is held to."""
    if rule == "strict":                                   # the target's own draw equals x with probability p(x)
        rest = p.clone()
        rest[x] = 0.0
        return float(p[x]), rest / rest.sum() if rest.sum() > 0 else p
    if rule == "typical":                                  # Medusa: p(x) > min(0.09, 0.3 exp(-H)), H with log(p + 1e-5)
        entropy = float(-(p * torch.log(p + 1e-5)).sum())
        return (1.0 if float(p[x]) > min(0.09, 0.3 * np.exp(-entropy)) else 0.0), p
    chance = min(1.0, float(p[x]) / float(q[x])) if q[x] > 0 else 0.0       # exact; q_mismatch is given its wrong q
    left = torch.clamp(p - q, min=0.0)
    return chance, left / left.sum() if left.sum() > 0 else p


def analytic_distribution(toy: Toy, k: int, rule: str) -> dict:
    """The first LENGTH tokens' distribution under `rule` from `definition`: drafts drawn from the warped q, judged
    (q_mismatch) against the draft's q before warping."""
    dist: dict = {}

    def run(context: tuple, prob: float) -> None:
        if len(context) >= LENGTH or prob == 0:
            add(dist, context, prob)
            return
        n = min(k, LENGTH - len(context) - 1)
        for drafts in itertools.product(range(VOCAB), repeat=n):
            draft_prob = prob
            for i, x in enumerate(drafts):
                draft_prob *= float(toy.q(context + drafts[:i])[x])
            if draft_prob > 0:
                judge(context, drafts, 0, draft_prob)

    def judge(context: tuple, drafts: tuple, i: int, prob: float) -> None:
        prefix = context + drafts[:i]
        p = toy.p(prefix)
        if i == len(drafts):
            for y in range(VOCAB):
                run(prefix + (y,), prob * float(p[y]))
            return
        q = toy.q_unwarped(prefix) if rule == "q_mismatch" and not toy.deterministic else toy.q(prefix)
        chance, refused = definition(rule, p, q, drafts[i])
        judge(context, drafts, i + 1, prob * chance)
        for y in range(VOCAB):
            run(prefix + (y,), prob * (1 - chance) * float(refused[y]))

    run((), 1.0)
    return dist


def assert_same(got: dict, want: dict, tol: float = 1e-9) -> None:
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-12)
    for seq in set(got) | set(want):
        assert abs(got.get(seq, 0.0) - want.get(seq, 0.0)) < tol, (seq, got.get(seq), want.get(seq))


@pytest.mark.parametrize("params", SETTINGS[:4], ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-draft", "one-hot-draft"])
@pytest.mark.parametrize("path", ["reference", "engine-whole-row", "engine-members"])
def test_strict_rule_emits_the_target_distribution(params, k, deterministic, path):
    """strict is exact for any draft: the reference and the engine's `settle`, enumerated over every cell of their
    draws (each uniform cut at every step of its row's CDF: it is the target's own draw), emit the target's joint."""
    toy = Toy(params, 0, deterministic)
    got = emitted_distribution(toy, k, "strict", on_support=path == "engine-members", reference=path == "reference")
    assert_same(got, target_distribution(toy))


def first_round_acceptance(toy: Toy, k: int, rule: str) -> float:
    """E[accepted drafts] of the first round of k drafts after the empty context, enumerated through the engine."""
    total = 0.0
    for drafts in itertools.product(range(VOCAB), repeat=k):
        draft_prob = float(np.prod([float(toy.q(drafts[:i])[x]) for i, x in enumerate(drafts)]))
        if draft_prob == 0:
            continue
        target_probs = torch.stack([toy.p(drafts[:i]) for i in range(k + 1)])
        draft_probs = None if toy.deterministic else torch.stack([toy.q(drafts[:i]) for i in range(k)])
        for (accepted, _), weight in round_outcomes(drafts, draft_probs, target_probs, rule, None).items():
            total += draft_prob * weight * accepted
    return total


@pytest.mark.parametrize("params", SETTINGS[:3], ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}")
@pytest.mark.parametrize("salt", [0, 1])
def test_strict_accepts_less_than_exact_with_a_sampled_draft_and_the_same_with_a_one_hot_draft(params, salt):
    """Per judged draft, strict keeps x with p(x), exact with min(1, p(x)/q(x)): on average over a sampled draft
    sum q p < sum min(p, q) unless q is one-hot, where both are p(x). Measured on the first round of 2 drafts."""
    sampled, one_hot = Toy(params, salt, False), Toy(params, salt, True)
    strict, exact = first_round_acceptance(sampled, 2, "strict"), first_round_acceptance(sampled, 2, "exact")
    assert strict < exact - 0.01, (strict, exact)
    assert first_round_acceptance(one_hot, 2, "strict") == pytest.approx(first_round_acceptance(one_hot, 2, "exact"),
                                                                        abs=1e-12)


DRIFT = SamplingParams(0.7, top_p=0.9)


@pytest.mark.parametrize("rule", ["strict", "typical", "q_mismatch"])
@pytest.mark.parametrize("path", ["reference", "engine-whole-row", "engine-members"])
@pytest.mark.parametrize("k", [1, 2])
def test_the_new_rules_emit_what_their_definitions_say(rule, path, k):
    """The reference and the engine's `settle` (with the q the decoder hands it: `unwarped` for q_mismatch) emit, to
    1e-9, the joint computed from each rule's definition alone (`definition`): strict the target's, typical and
    q_mismatch their own drift. A wiring bug (a flipped threshold, the warped q read by q_mismatch, the argmax
    compared instead of the target's draw) moves probability and fails here."""
    toy = Toy(DRIFT, 0, False)
    got = emitted_distribution(toy, k, rule, on_support=path == "engine-members", reference=path == "reference")
    assert_same(got, analytic_distribution(toy, k, rule))


# TV of the first 3 tokens from the target, enumerated (k = 2, DRIFT settings, salt 0); the drift each rule causes.
DRIFTS = {"typical": 0.5, "q_mismatch": 0.05}         # measured: 0.580 and 0.073


@pytest.mark.parametrize("rule", list(DRIFTS))
def test_typical_and_q_mismatch_drift_from_the_target_and_by_how_much(rule):
    """Quantified: typical's TV from the target is 0.580 here and q_mismatch's 0.073 (the assertion prints them;
    k = 2); with a one-hot draft q_mismatch is the exact rule (no q to get wrong), and at temperature 1
    without top-k / top-p the draft's q before warping is the q it sampled from: the bug is invisible."""
    toy = Toy(DRIFT, 0, False)
    tv = total_variation(emitted_distribution(toy, 2, rule), target_distribution(toy))
    assert tv > DRIFTS[rule], f"{rule}: TV {tv:.4f}"
    if rule == "q_mismatch":
        for quiet in (Toy(DRIFT, 0, True), Toy(SamplingParams(1.0), 0, False)):
            assert_same(emitted_distribution(quiet, 2, rule), target_distribution(quiet))


def test_typical_keeps_by_threshold_whatever_the_draws_and_strict_by_the_targets_own_draw():
    """Forced outcomes. typical on p = [0.5, 0.3, 0.15, 0.05] (threshold min(0.09, 0.3 e^-H) = 0.09): token 2 kept at
    every uniform, token 3 refused at every uniform and the correction drawn from p (not the residual). strict: the
    draft 1 is kept exactly when the uniform falls in token 1's CDF step [0.5, 0.8), else that draw is emitted."""
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.0, 0.0, 0.05, 0.95]], dtype=torch.float64)
    for u in (0.0, 0.5, 0.999):
        assert verify_with_draws(torch.tensor([2]), q, p, [u], 0.9, "typical").accepted == 1
        refused = verify_with_draws(torch.tensor([3]), q, p, [u], 0.9, "typical")
        assert (refused.accepted, refused.next_token, refused.accept_probs) == (0, 2, [0.0])   # p's CDF at 0.9: 2
    for u, kept, token in ((0.2, 0, 0), (0.5, 1, 3), (0.79, 1, 3), (0.8, 0, 2), (0.97, 0, 3)):
        verdict = verify_with_draws(torch.tensor([1]), q, p, [u], 0.99, "strict")
        assert (verdict.accepted, verdict.next_token) == (kept, token), u
        assert verdict.accept_probs == [pytest.approx(0.3)]


def test_q_mismatch_needs_the_unwarped_draft_and_a_one_hot_draft_needs_none():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    with pytest.raises(ValueError, match="q_mismatch.*before warping"):
        verify_with_draws(torch.tensor([1]), p[:1], p, [0.5], 0.5, "q_mismatch")
    assert verify_with_draws(torch.tensor([1]), None, p, [0.4], 0.5, "q_mismatch").accepted == 1


def test_under_greedy_every_new_rule_is_the_argmax_test():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8]]))
    for rule in ("strict", "typical", "q_mismatch"):
        verdict, _, _ = verify(rule, SamplingParams(0.0), torch.tensor([0, 2]), None, logits, make_generator("cpu", 0))
        assert (verdict.accepted, verdict.next_token, verdict.uniforms) == (1, 1, []), rule


def test_typicals_threshold_follows_the_entropy_when_p_is_flat():
    """Medusa's threshold is min(0.09, 0.3 exp(-H)): a flat row (ten tokens at 0.06, one at 0.4; H = 2.054 nats)
    lowers it to 0.3 e^-2.054 = 0.0385, so a draft of probability 0.06 is kept there, while the peaked row of the
    forced-outcome test keeps the 0.09 cap. A threshold that ignores the entropy (or flips its sign) refuses it."""
    from spec_engine.core.rule import typical_threshold
    flat = torch.tensor([0.06] * 10 + [0.4], dtype=torch.float64)
    entropy = -(10 * 0.06 * np.log(0.06 + 1e-5) + 0.4 * np.log(0.4 + 1e-5))
    assert typical_threshold(flat) == pytest.approx(0.3 * np.exp(-entropy), rel=1e-12)
    assert 0.038 < typical_threshold(flat) < 0.039
    assert typical_threshold(torch.tensor([0.97, 0.01, 0.01, 0.01], dtype=torch.float64)) == 0.09
    p = torch.stack([flat, flat])                                                   # [n + 1, vocab]
    kept = verify_with_draws(torch.tensor([3]), None, p, [0.99], 0.5, "typical")
    assert (kept.accepted, kept.accept_probs) == (1, [1.0])
