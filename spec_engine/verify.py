"""Verification rules: which drafted tokens the target keeps, and the token it adds.

Words (used the same way everywhere in this project):
  draft tokens  the k proposals of one round, x_1..x_k.
  accepted      the drafted prefix the rule kept.
  rejected      the first drafted token the rule refused; later draft tokens are *discarded*.
  correction    the token sampled from the residual normalize(max(0, p - q)) at the rejection.
  bonus         the token sampled from the target after all k drafts were accepted.
  target_probs  p: the target's warped distributions at the k + 1 positions, [k + 1, vocab].
  draft_probs   q: the distributions the draft tokens were drawn from, [k, vocab];
                None for a deterministic drafter (q is then one-hot on the drafted token).

The exact rule (Leviathan et al. 2023; Chen et al. 2023) accepts x_i with probability min(1, p(x_i)/q(x_i))
and samples the correction from the residual; the emitted token then has exactly distribution p. Greedy is
its own path: accept while the draft equals the target's argmax. `topp_membership` and `no_residual` are
deliberately wrong rules kept for the classroom, so the drift a heuristic causes can be measured.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .sampling import SamplingParams, sample, top_entries, top_p_members, warp

RULES = ("exact", "topp_membership", "no_residual")
WRONG_RULES = ("topp_membership", "no_residual")
RESIDUAL_TOP = 5


@dataclass(frozen=True)
class Verdict:
    accepted: int                      # number of draft tokens kept
    next_token: int                    # correction (accepted < k) or bonus (accepted == k)
    accept_probs: list[float]          # min(1, p/q) for each decided draft token (greedy: 1.0 / 0.0)
    uniforms: list[float]              # the draws compared with accept_probs (empty for greedy)
    next_probs_top: list[tuple[int, float]]  # top candidates of the distribution next_token came from

    @property
    def is_bonus(self) -> bool:
        return len(self.accept_probs) == self.accepted


def drafted_probs(probs: torch.Tensor, drafted: torch.Tensor) -> torch.Tensor:
    """probs [n + 1 or n, vocab], drafted [n] -> probs[i, drafted[i]] as [n]."""
    n = drafted.shape[0]
    return probs[torch.arange(n, device=probs.device), drafted]


def acceptance_probs(target_p: torch.Tensor, draft_q: torch.Tensor) -> torch.Tensor:
    """min(1, p/q) elementwise; [n] -> [n]. A zero q rejects rather than divides (the draft could not have
    drawn that token, so there is nothing to accept)."""
    safe_q = torch.where(draft_q > 0, draft_q, torch.ones_like(draft_q))
    return torch.where(draft_q > 0, torch.clamp(target_p / safe_q, max=1.0), torch.zeros_like(target_p))


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) over [vocab]. If p <= q everywhere (only possible when p == q up to
    rounding, in which case a rejection has probability ~0) it falls back to p."""
    residual = torch.clamp(target_probs - draft_probs, min=0.0)
    total = residual.sum()
    if total <= torch.finfo(residual.dtype).tiny:
        return target_probs
    return residual / total


def rule_acceptance(rule: str, target_p: torch.Tensor, draft_q: torch.Tensor) -> torch.Tensor:
    """Probability of keeping each drafted token; [n], [n] -> [n]."""
    if rule == "topp_membership":
        # WRONG on purpose: target_probs is already top-p filtered, so its support is the top-p set; any
        # drafted token inside it is kept, whatever its probability under the draft.
        return (target_p > 0).to(target_p.dtype)
    return acceptance_probs(target_p, draft_q)


def rule_correction_distribution(rule: str, target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """The distribution the token after a rejection is drawn from; [vocab], [vocab] -> [vocab].
    Only the exact rule uses the residual; the wrong rules fall back to p, which over-weights the draft's picks."""
    if rule == "exact":
        return residual_distribution(target_row, draft_row)
    return target_row


def one_hot_row(token: int, like: torch.Tensor) -> torch.Tensor:
    row = torch.zeros_like(like)
    row[token] = 1.0
    return row


def count_accepted(accept_probs: torch.Tensor, uniforms: torch.Tensor) -> int:
    """Length of the prefix whose draw falls under its acceptance probability; [n], [n] -> int."""
    rejected = (uniforms >= accept_probs).nonzero()
    return int(rejected[0, 0]) if rejected.numel() else int(accept_probs.shape[0])


def count_accepted_host(accept_probs: list[float], uniforms: list[float]) -> int:
    """`count_accepted` on host lists (the verdict needs them on the host anyway: one transfer, not two)."""
    return next((i for i, (a, u) in enumerate(zip(accept_probs, uniforms)) if u >= a), len(accept_probs))


def top_candidates(probs: torch.Tensor, n: int = RESIDUAL_TOP,
                   support: np.ndarray | None = None) -> list[tuple[int, float]]:
    """The n most likely entries of probs [vocab] with probability > 0; `support`, ids that hold every nonzero
    entry (the row's top-p members), spares a search of the whole row."""
    if support is None:
        values, ids = top_entries(probs, n)
        return [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist()) if v > 0]
    ids = torch.from_numpy(support)
    values = probs[ids].tolist()
    order = sorted(range(len(values)), key=lambda j: -values[j])[:n]               # stable: ties keep support order
    return [(int(support[j]), values[j]) for j in order if values[j] > 0]


def verify_greedy(drafted: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """drafted [n], target_logits [n + 1, vocab]: accept while draft == argmax, then take the argmax."""
    n = drafted.shape[0]
    host = torch.cat([target_logits.argmax(dim=-1), drafted]).tolist()   # [n + 1 argmax, n drafted]: one transfer
    argmax, drafted_ids = host[:n + 1], host[n + 1:]
    accepted = next((i for i in range(n) if argmax[i] != drafted_ids[i]), n)
    decided = min(accepted + 1, n)
    accept_probs = [1.0] * accepted + [0.0] * (decided - accepted)
    next_token = argmax[accepted]
    return Verdict(accepted, next_token, accept_probs, [], [(next_token, 1.0)])


def verify_sampled(
    drafted: torch.Tensor,              # [n]
    draft_probs: torch.Tensor | None,   # [n, vocab] or None (one-hot)
    target_probs: torch.Tensor,         # [n + 1, vocab], warped
    generator: torch.Generator,
    rule: str = "exact",
    members: list | None = None,        # per target row, its top-p members (warp's record), or None
) -> Verdict:
    n = drafted.shape[0]
    assert target_probs.shape[0] == n + 1, (target_probs.shape, n)
    assert draft_probs is None or draft_probs.shape == (n, target_probs.shape[1]), (draft_probs.shape, target_probs.shape)
    target_p = drafted_probs(target_probs, drafted)
    draft_q = torch.ones_like(target_p) if draft_probs is None else drafted_probs(draft_probs, drafted)
    uniforms = torch.rand(n, generator=generator, device=target_probs.device, dtype=target_probs.dtype)
    accept = rule_acceptance(rule, target_p, draft_q)
    host = torch.cat([accept, uniforms, drafted.to(accept.dtype)]).tolist()   # one transfer for the decision
    accept_list, uniform_list, drafted_ids = host[:n], host[n:2 * n], [int(t) for t in host[2 * n:]]
    accepted = count_accepted_host(accept_list, uniform_list)
    decided = min(accepted + 1, n)
    if accepted < n:
        q_row = one_hot_row(drafted_ids[accepted], target_probs[accepted]) if draft_probs is None else draft_probs[accepted]
        next_dist = rule_correction_distribution(rule, target_probs[accepted], q_row)
    else:
        next_dist = target_probs[n]
    next_token = sample(next_dist, generator)
    # the residual's and the bonus row's nonzero entries lie among that target row's top-p members
    support = members[accepted] if members else None
    return Verdict(accepted, next_token, accept_list[:decided], uniform_list[:decided],
                   top_candidates(next_dist, support=support))


def verify(
    rule: str,
    params: SamplingParams,
    drafted: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    generator: torch.Generator,
) -> tuple[Verdict, torch.Tensor, list | None]:
    """Dispatch on the rule and the sampling mode. Returns the verdict, target_probs [n + 1, vocab] (warped;
    for greedy, the temperature-1 softmax, shown to people but not used by the decision) and, when the CPU top-p
    search ran, each row's members most likely first (sampling.warp), else None."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if params.greedy:
        # float32 once: the display needs it, and argmax over bf16 logits costs ~10x more than over float32 on the
        # CPU (same index: the conversion is exact)
        target_logits = target_logits.float()
        display_probs = torch.softmax(target_logits, dim=-1)
        if rule == "topp_membership":
            membership_params = SamplingParams(temperature=1.0, top_k=params.top_k, top_p=params.top_p)
            return _greedy_membership(drafted, target_logits, membership_params), display_probs, None
        return verify_greedy(drafted, target_logits), display_probs, None
    members = []
    target_probs = warp(target_logits, params, members)
    members = members if len(members) == target_probs.shape[0] else None
    verdict = verify_sampled(drafted, draft_probs, target_probs, generator, rule, members)
    return verdict, target_probs, members


def _greedy_membership(drafted: torch.Tensor, target_logits: torch.Tensor, membership: SamplingParams) -> Verdict:
    """The wrong rule under greedy decoding: keep drafts inside the temperature-1 top-p set, then take the
    argmax. Shows that even greedy output changes when membership replaces the argmax test."""
    n = drafted.shape[0]
    members = top_p_members(warp(target_logits[:n], membership), membership.top_p)
    inside = drafted_probs(members.float(), drafted)
    outside = (inside == 0).nonzero()
    accepted = int(outside[0, 0]) if outside.numel() else n
    next_token = int(target_logits[accepted].argmax())
    decided = min(accepted + 1, n)
    return Verdict(accepted, next_token, inside[:decided].tolist(), [], [(next_token, 1.0)])
