import pytest

from spec_engine.core.metrics import expected_tokens_per_round


@pytest.mark.parametrize("a,k,expected", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 1, 1.5), (0.5, 2, 1.75),
                                          (0.8, 4, 3.3616)])
def test_expected_tokens_per_round(a, k, expected):
    assert expected_tokens_per_round(a, k) == pytest.approx(expected)


def fake_round(accepted: int, k: int, rejected: bool):
    from types import SimpleNamespace
    return SimpleNamespace(drafted=[0] * k, accepted=accepted, correction=7 if rejected else None)


def test_judged_acceptance_counts_only_judged_drafts():
    from spec_engine.core.metrics import judged_acceptance
    rounds = [fake_round(2, 4, True), fake_round(4, 4, False), fake_round(0, 4, True)]
    # judged: 3 (2 accepted + the rejected one) + 4 + 1 = 8; accepted 6; accepted / drafted would say 0.5
    assert judged_acceptance(rounds) == pytest.approx(6 / 8)
    assert judged_acceptance([]) == 0.0
    # EOS accepted inside the drafts ends the round without a rejection
    assert judged_acceptance([fake_round(1, 4, False)]) == 1.0


def test_judged_acceptance_recovers_iid_rate_and_predicts_tokens_per_round():
    """Simulated i.i.d. acceptance a = 0.6, k = 4, 20000 rounds (seeded): the estimate is within 0.01 of a and
    the formula matches the simulated tokens per round within 0.02 (both > 8 standard errors); accepted /
    drafted (0.41 here) would be far off."""
    import random

    from spec_engine.core.metrics import judged_acceptance
    rng, a, k = random.Random(0), 0.6, 4
    rounds = []
    for _ in range(20000):
        n = 0
        while n < k and rng.random() < a:
            n += 1
        rounds.append(fake_round(n, k, n < k))
    estimate = judged_acceptance(rounds)
    assert estimate == pytest.approx(a, abs=0.01)
    tokens_per_round = sum(r.accepted + 1 for r in rounds) / len(rounds)
    assert expected_tokens_per_round(estimate, k) == pytest.approx(tokens_per_round, abs=0.02)
    assert sum(r.accepted for r in rounds) / (k * len(rounds)) < 0.45


def timed_round(drafted: int, accepted: int, rejected: bool, draft_s: float, verify_s: float, round_s: float):
    from types import SimpleNamespace
    emitted = [1] * (accepted + 1)
    return SimpleNamespace(drafted=[0] * drafted, accepted=accepted, correction=7 if rejected else None,
                           emitted=emitted, draft_seconds=draft_s, verify_seconds=verify_s, round_seconds=round_s)


def test_speedup_model_from_hand_made_events():
    from spec_engine.core.metrics import speedup_model
    rounds = [timed_round(4, 2, True, 0.02, 0.03, 0.06),     # 2 accepted + correction: 3 tokens
              timed_round(4, 4, False, 0.02, 0.03, 0.06),    # all 4 + bonus: 5 tokens
              timed_round(0, 0, False, 0.00, 0.03, 0.03)]    # nothing drafted: the target's own token
    model = speedup_model(rounds, [0.01, 0.03, 0.02])        # plain step 0.02 s
    a = 6 / 7                                                # 6 accepted of 7 judged (the rejected one)
    assert model.acceptance == pytest.approx(a)
    assert model.mean_drafted == pytest.approx(8 / 3)
    assert model.tokens_per_round == pytest.approx(9 / 3)
    assert model.expected_tokens_per_round == pytest.approx((2 * (1 - a ** 5) / (1 - a) + 1) / 3)
    assert model.plain_step_seconds == pytest.approx(0.02)
    assert model.draft_cost == pytest.approx((0.04 / 3) / 0.02)     # 0.667 plain steps per round
    assert model.verify_cost == pytest.approx(1.5)
    assert model.overhead_cost == pytest.approx((0.02 / 3) / 0.02)     # round - draft - verify: 0.01 + 0.01 + 0
    assert model.round_cost == pytest.approx(1.5 + 2 / 3)
    assert model.predicted_speedup == pytest.approx(model.expected_tokens_per_round / (1.5 + 2 / 3))
    assert model.measured_round_speedup == pytest.approx(3.0 / (0.15 / 3 / 0.02))


def test_speedup_model_is_the_papers_formula_when_a_round_is_k_draft_steps_and_one_forward():
    """Leviathan et al. (2023): speedup = (1 - a^(k+1)) / ((1 - a)(k c + 1)). Here k = 3 drafts of c = 0.1 steps
    each and a verify that costs one plain step, a = 0.75 (3 accepted of 4 judged)."""
    from spec_engine.core.metrics import speedup_model
    rounds = [timed_round(3, 3, False, 0.003, 0.01, 0.013), timed_round(3, 0, True, 0.003, 0.01, 0.013)]
    model = speedup_model(rounds, [0.01])
    a, k, c = 0.75, 3, 0.1
    assert model.acceptance == pytest.approx(a)
    assert model.predicted_speedup == pytest.approx((1 - a ** (k + 1)) / ((1 - a) * (k * c + 1)))


def test_speedup_model_needs_rounds_and_a_plain_step():
    from spec_engine.core.metrics import speedup_model
    assert speedup_model([], [0.02]) is None
    assert speedup_model([timed_round(2, 1, True, 0.01, 0.02, 0.03)], []) is None
