"""Verification as the engine runs it: which drafted tokens the target keeps, the token it adds, and what the
display shows about the decision. The rule itself, in the paper's terms, is `rule.speculative_step` (the reference
the proofs call); `settle` here is tested equal to it draw for draw.

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
its own path under every rule: accept while the draft equals the target's argmax (`topp_membership` keeps its own).
The other rules (`rule.RULE_INFO` says what each is): `strict` (exact: the target's own draw must equal the draft),
`typical` (Medusa's, lossy), and the deliberate mistakes `q_mismatch`, `topp_membership`, `no_residual`, kept for
the classroom so the drift they cause can be measured.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from spec_engine.core import speed
from spec_engine.core.rule import (CHAIN_RULES, EXACT, INVARIANT, Q_MISMATCH, STRICT, TYPICAL, WRONG, invariant_step,
                                  typical_threshold)
from spec_engine.core.rule import residual as residual_distribution       # normalize(max(0, p - q))
from spec_engine.core.sampling import (SamplingParams, argmax_rows, sample_at, top_entries, top_p_members, unit_draw,
                                       warp)
from spec_engine.core.tree_rule import TREE_RULES, TokenTree, tree_greedy_step, tree_invariant_step, tree_step

RULES = CHAIN_RULES
WRONG_RULES = WRONG
RESIDUAL_TOP = 5


@dataclass(frozen=True)
class Verdict:
    accepted: int                      # number of draft tokens kept
    next_token: int                    # correction (accepted < k) or bonus (accepted == k)
    accept_probs: list[float]          # min(1, p/q) for each decided draft token (greedy: 1.0 / 0.0)
    uniforms: list[float]              # the draws compared with accept_probs (empty for greedy; strict: where each
                                       #   row's CDF was inverted for the target's own draw)
    next_probs_top: list[tuple[int, float]]  # top candidates of the distribution next_token came from
    drafted_p: list[float] = field(default_factory=list)   # p(x_i) of every draft token (sampled rounds; else empty)
    drafted_q: list[float] = field(default_factory=list)   # q(x_i) likewise (1.0 for a deterministic drafter)

    @property
    def is_bonus(self) -> bool:
        return len(self.accept_probs) == self.accepted


def drafted_probs(probs: torch.Tensor, drafted: torch.Tensor) -> torch.Tensor:
    """probs [n + 1 or n, vocab], drafted [n] -> probs[i, drafted[i]] as [n]."""
    n = drafted.shape[0]
    return probs[:n].gather(-1, drafted[:, None])[:, 0]


def acceptance_prob(target_p: float, draft_q: float) -> float:
    """min(1, p/q) for one draft token. A zero q rejects rather than divides (the draft could not have drawn that
    token, so there is nothing to accept)."""
    return min(1.0, target_p / draft_q) if draft_q > 0 else 0.0


def rule_acceptance(rule: str, target_p: float, draft_q: float) -> float:
    """Probability of keeping a drafted token with target probability p and draft probability q."""
    if rule == "topp_membership":
        # WRONG on purpose: target_probs is already top-p filtered, so its support is the top-p set; any
        # drafted token inside it is kept, whatever its probability under the draft.
        return 1.0 if target_p > 0 else 0.0
    return acceptance_prob(target_p, draft_q)


def accept_chances(rule: str, target_probs: torch.Tensor, target_p: list[float], draft_q: list[float]) -> list[float]:
    """Each draft token's chance of being kept, [n]. typical: 1 or 0 (its threshold decides, no draw); the others
    but strict (`settle_strict`): `rule_acceptance`."""
    if rule == TYPICAL:
        return [1.0 if p > typical_threshold(target_probs[i]) else 0.0 for i, p in enumerate(target_p)]
    return [rule_acceptance(rule, p, q) for p, q in zip(target_p, draft_q)]


def judged_draft_probs(rule: str, draft_probs: torch.Tensor | None,
                       unwarped: torch.Tensor | None) -> torch.Tensor | None:
    """The q the rule reads: the distributions the drafts were drawn from, except under `q_mismatch`, whose bug is to
    read the draft's distributions before warping, `unwarped` [n, vocab]. A deterministic draft (None) stays one-hot."""
    if rule != Q_MISMATCH or draft_probs is None:
        return draft_probs
    if unwarped is None:
        raise ValueError("rule 'q_mismatch' reads the draft's distribution before warping, and this drafter does not "
                         "report it (Proposal.unwarped): use a model draft, layer skip or the EAGLE head")
    assert unwarped.shape == draft_probs.shape, (unwarped.shape, draft_probs.shape)
    return unwarped.to(draft_probs.dtype)


def rule_correction_distribution(rule: str, target_row: torch.Tensor, draft_row: torch.Tensor,
                                 support=None) -> torch.Tensor:
    """The distribution the token after a rejection is drawn from; [vocab], [vocab] -> [vocab].
    The exact rule (and q_mismatch, with its wrong q) uses the residual; typical and the wrong rules draw from p,
    which over-weights the draft's picks.
    `support`: ids holding every nonzero entry of target_row (its top-p members), which a speed layer may compute
    the residual over alone (core/speed.py)."""
    if rule not in (EXACT, Q_MISMATCH):
        return target_row
    found = None if support is None else speed.active().residual(target_row, draft_row, support)
    return found if found is not None else residual_distribution(target_row, draft_row)


def one_hot_row(token: int, like: torch.Tensor) -> torch.Tensor:
    row = torch.zeros_like(like)
    row[token] = 1.0
    return row


def count_accepted_host(accept_probs: list[float], uniforms: list[float]) -> int:
    """Length of the prefix whose draw falls under its acceptance probability (on the host: the verdict needs the
    numbers there anyway)."""
    return next((i for i, (a, u) in enumerate(zip(accept_probs, uniforms)) if u >= a), len(accept_probs))


def top_candidates(probs: torch.Tensor, n: int = RESIDUAL_TOP, support=None) -> list[tuple[int, float]]:
    """The n most likely entries of probs [vocab] with probability > 0, for the display; `support`, ids that hold
    every nonzero entry (the row's top-p members, most likely first), spares a search of the whole row."""
    if support is None:
        values, ids = top_entries(probs, n)
        return [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist()) if v > 0]
    values = probs[torch.as_tensor(support, device=probs.device)].tolist()
    order = sorted(range(len(values)), key=lambda j: -values[j])[:n]               # stable: ties keep support order
    return [(int(support[j]), values[j]) for j in order if values[j] > 0]


def verify_greedy(drafted: torch.Tensor, target_logits: torch.Tensor) -> Verdict:
    """drafted [n], target_logits [n + 1, vocab]: accept while draft == argmax, then take the argmax."""
    n = drafted.shape[0]
    found = speed.active().argmax_rows(target_logits)     # not sampling.argmax_rows: its fallback reads twice
    if found is not None:
        argmax, drafted_ids = found, drafted.tolist()
    else:
        host = torch.cat([target_logits.argmax(dim=-1), drafted]).tolist()   # [n + 1 argmax, n drafted]: one transfer
        argmax, drafted_ids = host[:n + 1], host[n + 1:]
    accepted = next((i for i in range(n) if argmax[i] != drafted_ids[i]), n)
    decided = min(accepted + 1, n)
    accept_probs = [1.0] * accepted + [0.0] * (decided - accepted)
    next_token = argmax[accepted]
    return Verdict(accepted, next_token, accept_probs, [], [(next_token, 1.0)])


def decision_inputs(drafted: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                    generator: torch.Generator) -> tuple[list[float], list[float], list[float], list[int]]:
    """On the host: p(x_i), q(x_i) (1.0 for a one-hot draft), a uniform draw per draft token and the drafted ids,
    in one device-to-host transfer (a speed layer may read CPU rows in place instead, core/speed.py)."""
    n = drafted.shape[0]
    dtype = target_probs.dtype
    uniforms = torch.rand(n, generator=generator, device=target_probs.device, dtype=dtype)
    found = speed.active().host_reads(drafted, draft_probs, target_probs)
    if found is not None:
        target_p, draft_q, ids = found
        return target_p, draft_q, uniforms.tolist(), ids
    parts = [drafted_probs(target_probs, drafted), uniforms, drafted.to(dtype)]
    if draft_probs is not None:
        parts.append(drafted_probs(draft_probs, drafted).to(dtype))
    host = torch.cat(parts).tolist()
    draft_q = host[3 * n:] if draft_probs is not None else [1.0] * n
    return host[:n], draft_q, host[n:2 * n], [int(t) for t in host[2 * n:3 * n]]


def verify_sampled(
    drafted: torch.Tensor,              # [n]
    draft_probs: torch.Tensor | None,   # [n, vocab] or None (one-hot)
    target_probs: torch.Tensor,         # [n + 1, vocab], warped
    generator: torch.Generator,
    rule: str = "exact",
    members: list | None = None,        # per target row, its top-p members (warp's record), or None
    unwarped: torch.Tensor | None = None,   # [n, vocab] the draft's distributions before warping (q_mismatch only)
) -> Verdict:
    """The sampled round: a uniform per draft token, then one draw for the token after them (sampling.unit_draw),
    in that order from the run's generator; the rule itself is `settle`."""
    n = drafted.shape[0]
    draft_probs = judged_draft_probs(rule, draft_probs, unwarped)
    assert target_probs.shape[0] == n + 1, (target_probs.shape, n)
    assert draft_probs is None or draft_probs.shape == (n, target_probs.shape[1]), \
        (draft_probs.shape, target_probs.shape)
    target_p, draft_q, uniform_list, drafted_ids = decision_inputs(drafted, draft_probs, target_probs, generator)
    point = unit_draw(generator, target_probs.device)
    return settle(rule, drafted_ids, draft_probs, target_probs, target_p, draft_q, uniform_list, point, members)


def verify_with_draws(
    drafted: torch.Tensor,              # [n]
    draft_probs: torch.Tensor | None,   # [n, vocab] or None (one-hot)
    target_probs: torch.Tensor,         # [n + 1, vocab], warped
    uniforms: list[float],              # [n] in [0, 1): draft token i is accepted when uniforms[i] < its min(1, p/q)
    point: float,                       # in [0, 1): where the next token's CDF is inverted (sampling.sample_at)
    rule: str = "exact",
    members: list | None = None,
    unwarped: torch.Tensor | None = None,   # [n, vocab] the draft's distributions before warping (q_mismatch only)
) -> Verdict:
    """verify_sampled with its random draws given instead of drawn: the same `settle`, so the exactness proof
    (tests/test_verify_enumeration.py) can enumerate the draws through the engine's own code."""
    n = drafted.shape[0]
    draft_probs = judged_draft_probs(rule, draft_probs, unwarped)
    assert target_probs.shape[0] == n + 1 and len(uniforms) == n, (target_probs.shape, n, len(uniforms))
    assert draft_probs is None or draft_probs.shape == (n, target_probs.shape[1]), \
        (draft_probs.shape, target_probs.shape)
    target_p = drafted_probs(target_probs, drafted).tolist()
    draft_q = [1.0] * n if draft_probs is None else drafted_probs(draft_probs, drafted).tolist()
    return settle(rule, drafted.tolist(), draft_probs, target_probs, target_p, draft_q, list(uniforms), point, members)


def settle(rule: str, drafted_ids: list[int], draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
           target_p: list[float], draft_q: list[float], uniforms: list[float], point, members: list | None) -> Verdict:
    """The rule with its draws given. Draft token i (p(x_i) = target_p[i], q(x_i) = draft_q[i]) is accepted while
    uniforms[i] < min(1, p/q); at the first rejection the correction comes from the residual of that row (the
    wrong rules: from p), after k acceptances the bonus from target row k; either is the token whose CDF step holds
    `point`. strict: the target's own draw at row i is the token whose CDF step holds uniforms[i]; draft i is kept
    while they are equal, and the first draw that differs is the correction. typical: kept while p(x_i) is above
    the row's threshold (no draw), the correction drawn from p."""
    if rule == STRICT:
        return settle_strict(drafted_ids, target_probs, target_p, draft_q, uniforms, point, members)
    n = len(drafted_ids)
    accept_list = accept_chances(rule, target_probs, target_p, draft_q)
    accepted = count_accepted_host(accept_list, uniforms)
    decided = min(accepted + 1, n)
    # the residual's and the bonus row's nonzero entries lie among that target row's top-p members
    support = members[accepted] if members else None
    if accepted < n:
        q_row = (one_hot_row(drafted_ids[accepted], target_probs[accepted]) if draft_probs is None
                 else draft_probs[accepted])
        next_dist = rule_correction_distribution(rule, target_probs[accepted], q_row, support)
    else:
        next_dist = target_probs[n]
    next_token = sample_at(next_dist, point, support)
    return Verdict(accepted, next_token, accept_list[:decided], uniforms[:decided],
                   top_candidates(next_dist, support=support), target_p, draft_q)


def settle_strict(drafted_ids: list[int], target_probs: torch.Tensor, target_p: list[float], draft_q: list[float],
                  uniforms: list[float], point, members: list | None) -> Verdict:
    """The strict rule with its draws given: at each row the target draws its own token (sampling.sample_at at
    uniforms[i]); equal to the draft, the draft is kept; else that draw is emitted. After n keeps, the bonus at
    `point`. accept_probs: p(x_i), the chance that the target's draw is x_i."""
    n = len(drafted_ids)
    for i in range(n):
        support = members[i] if members else None
        own = sample_at(target_probs[i], uniforms[i], support)
        if own != drafted_ids[i]:
            return Verdict(i, own, target_p[:i + 1], uniforms[:i + 1],
                           top_candidates(target_probs[i], support=support), target_p, draft_q)
    support = members[n] if members else None
    token = sample_at(target_probs[n], point, support)
    return Verdict(n, token, target_p[:n], uniforms[:n], top_candidates(target_probs[n], support=support),
                   target_p, draft_q)


def verify(
    rule: str,
    params: SamplingParams,
    drafted: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    generator: torch.Generator,
    unwarped: torch.Tensor | None = None,   # [n, vocab] the draft's distributions before warping (q_mismatch only)
    display: bool = True,
    noise: torch.Tensor | None = None,      # [n + 1, vocab] rule.position_noise (the invariant rule only)
) -> tuple[Verdict, torch.Tensor | None, list | None]:
    """Dispatch on the rule and the sampling mode. Returns the verdict, target_probs [n + 1, vocab] (warped;
    for greedy, the temperature-1 softmax, shown to people but not used by the decision, and None when nothing is
    shown: `display=False`) and, when the CPU top-p search ran, each row's members most likely first
    (sampling.warp), else None."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    if params.greedy:
        # float32 once: the display needs it, and argmax over bf16 logits costs ~10x more than over float32 on the
        # CPU (same index: the conversion is exact)
        target_logits = target_logits.float()
        display_probs = warp(target_logits, SamplingParams()) if display else None     # softmax at temperature 1
        if rule == "topp_membership":
            membership_params = SamplingParams(temperature=1.0, top_k=params.top_k, top_p=params.top_p)
            return _greedy_membership(drafted, target_logits, membership_params), display_probs, None
        return verify_greedy(drafted, target_logits), display_probs, None
    members = []
    target_probs = warp(target_logits, params, members)
    members = members if len(members) == target_probs.shape[0] else None
    if rule == INVARIANT:
        return verify_invariant(drafted, draft_probs, target_probs, noise), target_probs, members
    verdict = verify_sampled(drafted, draft_probs, target_probs, generator, rule, members, unwarped)
    return verdict, target_probs, members


def verify_invariant(drafted: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     noise: torch.Tensor | None) -> Verdict:
    """The drafter-invariant rule (rule.invariant_step) with what the display shows: accept_probs are p(x_i), each
    draft's chance of being the target's own draw; drafted [n], target_probs [n + 1, vocab], noise [n + 1, vocab]."""
    n = drafted.shape[0]
    if noise is None or noise.shape != target_probs.shape:
        raise ValueError("rule 'invariant' needs the noise of every scored position (rule.position_noise)")
    accepted, token = invariant_step(target_probs, drafted.tolist(), noise.to(target_probs.device))
    target_p = drafted_probs(target_probs, drafted).tolist()
    draft_q = [1.0] * n if draft_probs is None else drafted_probs(draft_probs, drafted).tolist()
    decided = min(accepted + 1, n)
    return Verdict(accepted, token, target_p[:decided], [], top_candidates(target_probs[accepted]), target_p, draft_q)


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


@dataclass(frozen=True)
class TreeVerdict:
    """A verified tree round: the accepted path (node indices, root's child first) and the token after it, with what
    the display shows. tried / accept_probs / uniforms: the siblings judged, in order (sampling only; greedy follows
    the argmax)."""
    accepted: list[int]
    next_token: int
    tried: list[int]
    accept_probs: list[float]
    uniforms: list[float]
    next_probs_top: list[tuple[int, float]]


def verify_tree(rule: str, params: SamplingParams, tree: TokenTree, draft_probs: torch.Tensor | None,
                target_logits: torch.Tensor, generator: torch.Generator,
                display: bool = True, noise: torch.Tensor | None = None) -> tuple[TreeVerdict, torch.Tensor | None]:
    """tree (n nodes), draft_probs [n + 1, vocab] or None (deterministic), target_logits [n + 1, vocab] -> (verdict,
    the rows the display reads [n + 1, vocab]; greedy with `display=False`: None, nothing computed for it). Greedy:
    `tree_greedy_step`. Sampling: the reference itself, `tree_rule.tree_step`, fed one uniform per node and then the
    CDF point from `generator` (all n uniforms are drawn whether read or not, so a run's draws do not depend on the
    outcome)."""
    if rule not in TREE_RULES:
        raise ValueError(f"a tree round's rule must be one of {TREE_RULES}, got {rule!r}")
    n = len(tree.tokens)
    assert target_logits.shape[0] == n + 1 and (draft_probs is None or draft_probs.shape[0] == n + 1)
    if params.greedy:
        path, token = tree_greedy_step(target_logits, tree, argmax_rows(target_logits))
        rows = torch.softmax(target_logits.float(), dim=-1) if display else None
        return TreeVerdict(path, token, [], [], [], [(token, 1.0)]), rows
    target_probs = warp(target_logits, params)                                                   # [n + 1, vocab]
    if rule == INVARIANT:
        if noise is None:
            raise ValueError("rule 'invariant' needs the noise of every depth (rule.position_noise)")
        path, token, tried = tree_invariant_step(target_probs, tree, noise.to(target_probs.device))
        chances = [float(target_probs[tree.parents[node] + 1, tree.tokens[node]]) for node in tried]
        verdict = TreeVerdict(path, token, tried, chances, [],
                              top_candidates(target_probs[(path[-1] + 1) if path else 0]))
        return verdict, target_probs
    if draft_probs is None and any(how != "deterministic" for how in tree.drawn):
        raise ValueError("a sampled tree needs draft_probs for its nodes whose children were drawn")
    uniforms = torch.rand(n, generator=generator, device=target_probs.device, dtype=torch.float64).tolist()
    point = float(unit_draw(generator, target_probs.device))
    step = tree_step(target_probs, None if draft_probs is None else draft_probs.to(target_probs.dtype), tree,
                     uniforms, point, rule)
    tried = [node for node, _ in step.tried]
    return TreeVerdict(step.accepted, step.token, tried, [chance for _, chance in step.tried],
                       [uniforms[node] for node in tried], top_candidates(step.next_probs)), target_probs
