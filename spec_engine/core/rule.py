"""The rule, in the paper's terms: one pure function, the reference every proof calls.

Speculative sampling (Leviathan et al. 2023, Algorithm 1; Chen et al. 2023): draft tokens x_1..x_k were drawn from
q_1..q_k; the target scored them in one forward, giving p_1..p_{k+1}. For i = 1..k, accept x_i if
u_i < min(1, p_i(x_i) / q_i(x_i)); at the first rejection emit a token from normalize(max(0, p_i - q_i)) and stop;
if all k were accepted, emit a bonus token from p_{k+1}. The emitted tokens then follow p exactly.

`speculative_step` is that, with its random draws given (so that tests can enumerate them) and nothing else: no host
batching, no numpy, no display. The engine runs `verify.verify_sampled` (the same rule plus what the display shows,
and a speed layer's shortcuts); tests/test_verify_enumeration.py proves this function exact by enumeration and the
engine's rule equal to it, draw for draw.
"""
from __future__ import annotations

import torch

EXACT = "exact"
# Deliberately wrong rules, kept for the classroom: keep any draft inside the target's top-p set ("topp_membership");
# or correct from p instead of the residual ("no_residual"). Both over-weight the draft's picks.
WRONG = ("topp_membership", "no_residual")


def speculative_step(
    p: torch.Tensor,            # [k + 1, vocab] the target's warped distributions at the k + 1 positions
    q: torch.Tensor,            # [k, vocab] the distributions the drafts were drawn from (one-hot: deterministic)
    drafted: list[int],         # [k] x_1..x_k
    uniforms: list[float],      # [k] u_i in [0, 1), one per draft token
    point: float,               # in [0, 1): where the emitted token's CDF is inverted
    rule: str = EXACT,
) -> tuple[int, int]:
    """-> (accepted: how many drafts are kept, next token: the correction after them, or the bonus)."""
    k = len(drafted)
    for i in range(k):
        p_x, q_x = float(p[i, drafted[i]]), float(q[i, drafted[i]])
        keep = p_x > 0 if rule == "topp_membership" else q_x > 0 and uniforms[i] < min(1.0, p_x / q_x)
        if not keep:
            return i, inverse_cdf(residual(p[i], q[i]) if rule == EXACT else p[i], point)
    return k, inverse_cdf(p[k], point)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)), [vocab]. Where p <= q everywhere (p == q up to rounding: a rejection then has
    probability ~0) it is p."""
    left = torch.clamp(p - q, min=0.0)
    total = left.sum()
    return p if total <= torch.finfo(left.dtype).tiny else left / total


def inverse_cdf(probs: torch.Tensor, point: float) -> int:
    """The token whose step of the CDF of probs [vocab] (accumulated in float64, in id order) holds point * total;
    a token of probability zero is never returned."""
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)
    return min(int(torch.searchsorted(cdf, point * cdf[-1], right=True)), probs.shape[-1] - 1)
