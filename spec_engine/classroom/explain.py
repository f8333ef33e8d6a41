"""A run in a few plain sentences, computed from its RoundEvents only, so the words always match the numbers
the UI shows next to them (acceptance, tokens per target forward, where drafts were rejected).

Words as in spec_engine/core/verify.py (draft tokens, accepted, rejected, correction, bonus). Positions are 1-based
draft positions: "position 2" is the second draft token of a round. A round with a rejection is one that ended with a
correction; a round whose text ended (EOS) inside its accepted drafts has neither a rejection nor a bonus.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from spec_engine.core.events import RoundEvent
from spec_engine.core.metrics import expected_tokens_per_round
from spec_engine.drafters.sizing import PAUSED, PROBE

STOP_REASONS = {
    "max_new_tokens": "it reached the maximum number of new tokens",
    "eos": "the model emitted its end-of-sequence token",
    "cancelled": "it was stopped by hand",
}
MAX_NOTES = 2


@dataclass(frozen=True)
class RunFacts:
    rounds: int
    new_tokens: int
    k: int
    drafted: int                         # draft tokens proposed, all rounds (a tree round: its depth, see below)
    accepted: int
    drafting_rounds: int                 # rounds that proposed at least one draft token
    fully_accepted: int                  # drafting rounds whose every draft token was accepted
    rejection_positions: dict[int, int]  # 1-based position of the first rejection -> rounds
    discarded: int                       # draft tokens after a rejection (never judged)
    corrections: int
    bonuses: int
    notes: dict[str, int]                # drafter remark -> rounds that carry it
    stop_reason: str | None              # of the last round; None while the run goes on
    greedy: bool | None                  # None when the events cannot tell (no round decided a draft)
    tree_rounds: int = 0                 # rounds that drafted a tree (RoundEvent.draft_length: its depth counts)
    tree_nodes: int = 0                  # the nodes those trees proposed, every branch
    paused: int = 0                      # rounds the verify-cost curve paused drafting in (drafters/sizing.py)
    last_pause: str | None = None        # the latest of their notes ("drafting paused: ...", with the numbers)
    probes: int = 0                      # rounds that drafted to time the verify cost again

    @property
    def rejections(self) -> int:
        return sum(self.rejection_positions.values())

    @property
    def tokens_per_forward(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def judged_acceptance(self) -> float:
        """accepted / judged drafts (the accepted ones plus each round's rejected one): the a of the theory."""
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else 0.0

    @property
    def common_rejection(self) -> tuple[int, int] | None:
        """(position, rounds) of the most frequent first-rejection position; ties go to the earlier position."""
        if not self.rejection_positions:
            return None
        return min(self.rejection_positions.items(), key=lambda item: (-item[1], item[0]))


def infer_greedy(rounds: list[RoundEvent]) -> bool | None:
    """Sampling draws a uniform for every decided draft token; greedy decides by argmax and draws none."""
    if any(r.uniforms for r in rounds):
        return False
    if any(r.accept_probs for r in rounds):
        return True
    return None


def facts(rounds: list[RoundEvent], k: int | None = None, greedy: bool | None = None) -> RunFacts:
    rejections = Counter(r.accepted + 1 for r in rounds if r.correction is not None)
    pauses = [r.note for r in rounds if r.note and r.note.startswith(PAUSED)]
    notes = Counter(r.note for r in rounds if r.note and not r.note.startswith((PAUSED, PROBE)))
    return RunFacts(
        rounds=len(rounds),
        new_tokens=sum(len(r.emitted) for r in rounds),
        k=k if k is not None else max((r.k for r in rounds), default=0),
        drafted=sum(r.draft_length for r in rounds),
        accepted=sum(r.accepted for r in rounds),
        drafting_rounds=sum(1 for r in rounds if r.drafted),
        fully_accepted=sum(1 for r in rounds if r.drafted and r.accepted == r.draft_length),
        rejection_positions=dict(sorted(rejections.items())),
        discarded=sum(len(r.drafted) - r.accepted - 1 for r in rounds if r.correction is not None and not r.is_tree),
        corrections=sum(1 for r in rounds if r.correction is not None),
        bonuses=sum(1 for r in rounds if r.bonus is not None),
        notes=dict(notes),
        paused=len(pauses),
        last_pause=pauses[-1] if pauses else None,
        probes=sum(1 for r in rounds if r.note and r.note.startswith(PROBE)),
        stop_reason=rounds[-1].stop_reason if rounds else None,
        greedy=greedy if greedy is not None else infer_greedy(rounds),
        tree_rounds=sum(1 for r in rounds if r.is_tree),
        tree_nodes=sum(len(r.drafted) for r in rounds if r.is_tree),
    )


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n} {word if n == 1 else (many or word + 's')}"


def correction_source(greedy: bool | None, rule: str) -> str:
    if greedy:
        return " (the target's argmax where the draft went wrong)"
    if greedy is None:
        return ""
    if rule == "exact":
        return " drawn from the residual max(0, p − q)"
    if rule == "strict":
        return " (the target's own draw where it differed from the draft: strict is exact too)"
    if rule == "q_mismatch":
        return (" drawn from the residual of the wrong q (the draft's distribution before warping, the shipped "
                "bug), which biases the text")
    if rule == "typical":
        return " drawn from p itself (Medusa's typical acceptance is lossy: the text drifts from the target's)"
    return f" drawn from p itself (the '{rule}' rule skips the residual, which biases the text)"


def explain(rounds: list[RoundEvent], k: int | None = None, greedy: bool | None = None,
            rule: str = "exact") -> list[str]:
    """A few sentences about `rounds`; [] for no rounds. `greedy` is inferred from the events when None."""
    f = facts(rounds, k, greedy)
    if not f.rounds:
        return []
    sentences = [
        f"{plural(f.rounds, 'round')} (one target forward each) produced {plural(f.new_tokens, 'new token')}: "
        f"{f.tokens_per_forward:.2f} tokens per target forward, against at most k + 1 = {f.k + 1} "
        f"and exactly 1 for plain decoding."
    ]
    if f.paused:
        probes = f" ({plural(f.probes, 'probe')} drafted to time it again)" if f.probes else ""
        sentences.append(f"{plural(f.paused, 'round')} drafted nothing because the verify cost said so{probes}: "
                         f"{f.last_pause}.")
    if not f.drafting_rounds:
        sentences.append("No round drafted anything, so every token came from the target alone.")
    else:
        sentences.append(f"In {f.fully_accepted} of the {plural(f.drafting_rounds, 'round')} that drafted, every "
                         f"draft token was accepted.")
        accepted = (f"Overall {f.accepted} of {plural(f.drafted, 'draft token')} were accepted "
                    f"({f.acceptance:.0%} acceptance)")
        if f.discarded:
            accepted += (f"; {plural(f.discarded, 'later draft token')} {'was' if f.discarded == 1 else 'were'} "
                         f"discarded unjudged after a rejection")
        sentences.append(accepted + ".")
        if f.tree_rounds:
            sentences.append(f"{plural(f.tree_rounds, 'round')} drafted a tree ({plural(f.tree_nodes, 'node')} in all, "
                             f"checked in one forward each); a tree keeps one path at most, so its drafts count here "
                             f"by its depth, and a rejection means every sibling at that level was refused.")
        if f.accepted + f.rejections:
            a = f.judged_acceptance
            sentences.append(f"Of the judged drafts (the accepted ones plus each round's rejected one) {a:.0%} were "
                             f"accepted; with that per-token rate a, the theory (1 − a^(k+1))/(1 − a) expects "
                             f"{expected_tokens_per_round(a, f.k):.2f} tokens per target forward.")
        common = f.common_rejection
        if common is None:
            sentences.append("No draft token was rejected.")
        else:
            position, count = common
            sentences.append(f"The first rejection was most often at draft position {position} "
                             f"({count} of {plural(f.rejections, 'round')} with a rejection).")
    sentences.append(f"{plural(f.corrections, 'round')} ended with a correction{correction_source(f.greedy, rule)} "
                     f"and {f.bonuses} with a bonus token.")
    for note, count in sorted(f.notes.items(), key=lambda item: -item[1])[:MAX_NOTES]:
        sentences.append(f"{plural(count, 'round')} carried a drafter note: “{note}”.")
    if f.stop_reason in STOP_REASONS:
        sentences.append(f"The run ended because {STOP_REASONS[f.stop_reason]}.")
    elif f.stop_reason is None:
        sentences.append("The run has not finished yet.")
    return sentences
