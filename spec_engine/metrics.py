"""Run arithmetic shared by the CLI, the benchmarks and the UI."""
from __future__ import annotations


def expected_tokens_per_round(acceptance: float, k: int) -> float:
    """Leviathan et al. (2023): with i.i.d. acceptance a and k drafts, E[tokens per target forward] is
    (1 - a^(k+1)) / (1 - a); k + 1 at a = 1."""
    a = min(max(float(acceptance), 0.0), 1.0)
    if a >= 1.0 - 1e-12:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)
