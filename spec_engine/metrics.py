"""Run arithmetic shared by the CLI, the benchmarks and the UI."""
from __future__ import annotations


def expected_tokens_per_round(acceptance: float, k: int) -> float:
    """Leviathan et al. (2023): with i.i.d. per-token acceptance a and k drafts, E[tokens per target forward]
    is (1 - a^(k+1)) / (1 - a); k + 1 at a = 1. `a` is the probability that a *judged* draft token is
    accepted (see `judged_acceptance`), not accepted / drafted."""
    a = min(max(float(acceptance), 0.0), 1.0)
    if a >= 1.0 - 1e-12:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def judged_acceptance(rounds) -> float:
    """The i.i.d. model's a, estimated from RoundEvents: accepted / judged, where a round judges its accepted
    drafts plus the rejected one; the drafts after a rejection are discarded unjudged.

    accepted / drafted is the usual "acceptance rate", but it counts the discarded drafts as failures: with
    k = 2 and a = 0.5, accepted / drafted = (0.5 + 0.25) / 2 = 0.375, and the formula above would then predict
    1.52 tokens per round instead of the true 1.75."""
    accepted = sum(r.accepted for r in rounds)
    rejected = sum(1 for r in rounds if r.correction is not None)     # EOS inside the drafts is no rejection
    return accepted / (accepted + rejected) if accepted + rejected else 0.0
