"""Run arithmetic shared by the CLI, the benchmarks and the UI."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


def expected_tokens_per_round(acceptance: float, k: int) -> float:
    """Leviathan et al. (2023): with i.i.d. per-token acceptance a and k drafts, E[tokens per target forward]
    is (1 - a^(k+1)) / (1 - a); k + 1 at a = 1. `a` is the probability that a *judged* draft token is
    accepted (see `judged_acceptance`), not accepted / drafted."""
    a = min(max(float(acceptance), 0.0), 1.0)
    if a >= 1.0 - 1e-12:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def draft_length(round_) -> int:
    """The most draft tokens a round could have kept: len(drafted) for a chain; for a tree (`tree_parents` set) its
    depth, the longest root-to-leaf path, since one path at most is kept. Reads only `drafted` and `tree_parents`."""
    parents = getattr(round_, "tree_parents", None)
    if parents is None:
        return len(round_.drafted)
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return max(depth, default=0)


def acceptance_rate(rounds) -> float:
    """accepted / drafted over RoundEvents, a tree round's drafts counted by its `draft_length` (its depth): a tree
    keeps one path at most, so a tree that tried 8 nodes 4 deep and kept 4 accepted all it could (100%), where
    accepted / nodes would read 50% and call the siblings it tried failures. For chains it is accepted / drafted."""
    offered = sum(draft_length(r) for r in rounds)
    return sum(r.accepted for r in rounds) / offered if offered else 0.0


def judged_acceptance(rounds) -> float:
    """The i.i.d. model's a, estimated from RoundEvents: accepted / judged, where a round judges its accepted
    drafts plus the rejected one; the drafts after a rejection are discarded unjudged. A tree round judges one level
    per accepted node, plus the level whose siblings were all refused (it has a correction): a is then the chance
    that a level passes, whichever sibling passes it.

    accepted / drafted is the usual "acceptance rate", but it counts the discarded drafts as failures: with
    k = 2 and a = 0.5, accepted / drafted = (0.5 + 0.25) / 2 = 0.375, and the formula above would then predict
    1.52 tokens per round instead of the true 1.75."""
    accepted = sum(r.accepted for r in rounds)
    rejected = sum(1 for r in rounds if r.correction is not None)     # EOS inside the drafts is no rejection
    return accepted / (accepted + rejected) if accepted + rejected else 0.0


def position_counts(rounds) -> tuple[list[int], list[int]]:
    """(kept, judged) per draft position (index i: position i + 1; a tree: depth i + 1). A round judges its positions
    1..accepted (all kept) and, when it has a correction, position accepted + 1 (refused; a tree: every sibling at that
    depth refused). Drafts after a refusal are discarded unjudged, and a round cut by EOS inside its drafts counts the
    drafts it kept only, as `judged_acceptance` does: sum(kept) / sum(judged) is that a."""
    kept: list[int] = []
    judged: list[int] = []
    for r in rounds:
        reached = r.accepted + (1 if r.correction is not None else 0)
        while len(judged) < reached:
            kept.append(0)
            judged.append(0)
        for i in range(reached):
            judged[i] += 1
            kept[i] += i < r.accepted
    return kept, judged


def acceptance_by_position(rounds) -> list[float]:
    """alpha_i: the share of draft position i + 1 kept among the rounds that judged it, i.e. whose earlier drafts
    were all kept and that drafted it (trees: by depth). As long as the deepest position any round judged."""
    kept, judged = position_counts(rounds)
    return [k / j for k, j in zip(kept, judged)]


def expected_tokens_by_position(alphas: Sequence[float]) -> float:
    """E[tokens per round] = 1 + sum_i prod_{j <= i} alpha_j for rounds that draft len(alphas) tokens: the chance of
    reaching and keeping each position, plus the correction or bonus. With alpha_j = a for all j it is
    `expected_tokens_per_round(a, k)`."""
    total, reach = 1.0, 1.0
    for alpha in alphas:
        reach *= alpha
        total += reach
    return total


@dataclass(frozen=True)
class SpeedupModel:
    """The speedup formula with every term measured, in units of one plain decoding step (one target forward
    over one token, the mean of the plain run's `step_seconds`).

    Leviathan et al. (2023, eq. 1 and thm. 3.8) predict speedup = (1 - a^(k+1)) / ((1 - a)(k c + 1)): expected
    tokens per round over the cost of a round, which is k draft steps of relative cost c plus one target forward
    taken to cost what a plain step does. Our drafters are not all k equal steps (lookup costs ~nothing, an EAGLE
    head may stop early, a verify of k + 1 rows costs more than one row on a CPU), so the cost is measured per
    round instead: predicted speedup = E[tokens per round] / (verify_cost + draft_cost). With draft_cost = k c
    and verify_cost = 1 it is the paper's formula.
    """

    acceptance: float                 # a: accepted / judged drafts (`judged_acceptance`)
    mean_drafted: float               # drafted tokens per round (k when every round drafts k; a tree: its depth)
    tokens_per_round: float           # measured: emitted tokens per round (= per target forward)
    expected_tokens_per_round: float  # mean over rounds of (1 - a^(n+1)) / (1 - a), n = that round's draft count
    plain_step_seconds: float         # mean plain decoding step: the unit of cost
    draft_cost: float                 # mean draft_seconds per round / plain step
    verify_cost: float                # mean verify_seconds per round / plain step
    overhead_cost: float              # the rest of a round (accept, trim, bookkeeping) / plain step

    @property
    def round_cost(self) -> float:
        """verify + draft: the paper's k c + 1."""
        return self.verify_cost + self.draft_cost

    @property
    def predicted_speedup(self) -> float:
        """E[tokens per round] / (verify_cost + draft_cost): the formula at the measured a, c and v."""
        return self.expected_tokens_per_round / self.round_cost if self.round_cost > 0 else 0.0

    @property
    def measured_round_speedup(self) -> float:
        """Measured tokens per round over the whole measured round cost (overhead included): the speedup of the
        rounds alone, prefill left out."""
        cost = self.round_cost + self.overhead_cost
        return self.tokens_per_round / cost if cost > 0 else 0.0


def speedup_model(rounds, plain_step_seconds: Sequence[float]) -> SpeedupModel | None:
    """The terms of the speedup formula from RoundEvents and a plain run's per-step times (see SpeedupModel);
    None when there are no rounds or no plain step to take as the unit. Nothing is assumed: a comes from
    `judged_acceptance`, each round's draft count from its events, the costs from its timings."""
    rounds, steps = list(rounds), [float(s) for s in plain_step_seconds]
    step = sum(steps) / len(steps) if steps else 0.0
    if not rounds or step <= 0:
        return None
    n = len(rounds)
    a = judged_acceptance(rounds)
    draft = sum(r.draft_seconds for r in rounds) / n
    verify = sum(r.verify_seconds for r in rounds) / n
    whole = sum(r.round_seconds for r in rounds) / n
    return SpeedupModel(
        acceptance=a, mean_drafted=sum(draft_length(r) for r in rounds) / n,
        tokens_per_round=sum(len(r.emitted) for r in rounds) / n,
        expected_tokens_per_round=sum(expected_tokens_per_round(a, draft_length(r)) for r in rounds) / n,
        plain_step_seconds=step, draft_cost=draft / step, verify_cost=verify / step,
        overhead_cost=max(0.0, whole - draft - verify) / step)
