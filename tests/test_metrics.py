import pytest

from spec_engine.metrics import expected_tokens_per_round


@pytest.mark.parametrize("a,k,expected", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 1, 1.5), (0.5, 2, 1.75), (0.8, 4, 3.3616)])
def test_expected_tokens_per_round(a, k, expected):
    assert expected_tokens_per_round(a, k) == pytest.approx(expected)


def fake_round(accepted: int, k: int, rejected: bool):
    from types import SimpleNamespace
    return SimpleNamespace(drafted=[0] * k, accepted=accepted, correction=7 if rejected else None)


def test_judged_acceptance_counts_only_judged_drafts():
    from spec_engine.metrics import judged_acceptance
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

    from spec_engine.metrics import judged_acceptance
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
