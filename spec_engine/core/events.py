"""What the engine tells the world: one frozen `RoundEvent` per round, and a `GenerationResult`.

Events are plain data (ints, floats, lists, strings) so that they serialise to JSON for trace export and
replay, and so that the UI, the CLI and the benchmarks never need to touch a tensor.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from spec_engine.core.metrics import acceptance_by_position, acceptance_rate, draft_length, judged_acceptance


@dataclass(frozen=True)
class RoundEvent:
    """One round: draft, verify, accept, trim.

    Probabilities are per drafted token: `target_probs[i]` = p(drafted[i]), `draft_probs[i]` = q(drafted[i])
    (1.0 for deterministic drafters). Under greedy decoding the decision is the argmax test; `target_probs`
    then shows the temperature-1 softmax for people to read, and `uniforms` is empty. A run decoded with
    `display=False` (nobody draws it: a timed run, a benchmark) leaves `target_probs`, `draft_probs` and `target_top`
    empty; everything else, the decisions included, is the same.
    """

    index: int                          # 0-based round number
    drafted: list[int]                  # the draft tokens proposed this round (may be fewer than k)
    accepted: int                       # how many of `drafted` were kept (a prefix)
    emitted: list[int]                  # accepted drafts + correction or bonus (EOS-truncated)
    correction: int | None              # sampled from the residual at the first rejection
    bonus: int | None                   # sampled from the target after all drafts were accepted
    target_probs: list[float]           # p(x_i) of each drafted token
    draft_probs: list[float]            # q(x_i) of each drafted token
    accept_probs: list[float]           # min(1, p/q) for each decided drafted token
    uniforms: list[float]               # the draw compared with each accept_prob (sampling only)
    next_top: list[tuple[int, float]]   # top candidates of the distribution the correction/bonus came from
    target_top: list[list[tuple[int, float]]]  # target's top tokens at each of the len(drafted)+1 positions
    k: int                              # the k asked for
    target_cache_len_before: int        # after the verify forward, before trimming
    target_cache_len: int               # after trimming
    draft_cache_len_before: int | None  # None for drafters without a KV cache
    draft_cache_len: int | None
    committed_len: int                  # prompt + generated tokens after this round
    draft_seconds: float
    verify_seconds: float
    round_seconds: float                # the whole round, bookkeeping included
    prefill_seconds: float = 0.0        # prompt prefill of target and draft (first round only)
    finished: bool = False
    stop_reason: str | None = None      # "max_new_tokens" | "eos" | "cancelled" on the last round
    note: str | None = None             # drafter remark, e.g. a cross-tokenizer boundary fix
    # A tree round (core/tree_rule.py) lists every node in `drafted`; `accepted` counts the nodes on the accepted path,
    # `target_probs` / `draft_probs` are each node's p and q under its parent's row, and `accept_probs` / `uniforms`
    # belong to the siblings judged, in order (`tree_tried`; empty under greedy). None for chain rounds.
    tree_parents: list[int] | None = None     # each node's parent (-1: the root, the last committed token)
    tree_path: list[int] | None = None        # the accepted nodes, root's child first
    tree_tried: list[int] | None = None       # the nodes judged, in order (sampling)
    drafter: str | None = None          # who proposed this round's drafts (a combined drafter: the part that did)

    @property
    def is_tree(self) -> bool:
        return self.tree_parents is not None

    @property
    def draft_length(self) -> int:
        """The most draft tokens this round could have kept: len(drafted) for a chain; for a tree its depth (the
        longest root-to-leaf path), since one path at most is kept. Acceptance is accepted / draft_length, so the
        siblings a tree tried beside its path do not count as failures (`core.metrics.acceptance_rate`)."""
        return draft_length(self)

    @property
    def rejected(self) -> int | None:
        """The rejected draft token, if any (a chain's; a tree round has no single one: None)."""
        if self.tree_parents is not None:
            return None
        return self.drafted[self.accepted] if self.accepted < len(self.drafted) else None

    @property
    def discarded(self) -> list[int]:
        """Draft tokens after the rejected one: never judged, thrown away (a tree round: every node off the path)."""
        if self.tree_parents is not None:
            return [t for i, t in enumerate(self.drafted) if i not in set(self.tree_path or [])]
        return self.drafted[self.accepted + 1:]

    @property
    def provenance(self) -> list[dict]:
        """Each emitted token with where it came from: {"token", "kind": "draft" (a kept draft) | "correction" |
        "bonus", "drafter": who proposed it (None for the target's correction or bonus)}."""
        out = [{"token": t, "kind": "draft", "drafter": self.drafter} for t in self.emitted[:self.accepted]]
        for token, kind in ((self.correction, "correction"), (self.bonus, "bonus")):
            if token is not None:
                out.append({"token": token, "kind": kind, "drafter": None})
        return out

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RoundEvent":
        data = dict(data)
        data["next_top"] = [tuple(x) for x in data.get("next_top", [])]
        data["target_top"] = [[tuple(x) for x in row] for row in data.get("target_top", [])]
        return cls(**data)


@dataclass(frozen=True)
class RunStats:
    rounds: int
    new_tokens: int
    drafted: int
    accepted: int
    acceptance_rate: float              # accepted / drafted, a tree's counted by its depth (metrics.acceptance_rate)
    tokens_per_round: float             # = tokens per target verify forward
    draft_seconds: float
    verify_seconds: float
    total_seconds: float
    tokens_per_second: float
    accepted_histogram: list[int]       # count of rounds by number of accepted drafts, index 0..k
    judged_acceptance: float = 0.0      # accepted / judged drafts: the per-token a of the i.i.d. formula
    acceptance_by_position: list[float] = field(default_factory=list)   # index i: draft position i + 1 (trees: depth)
                                        #   kept among the rounds that judged it (core.metrics.acceptance_by_position)


def run_stats(rounds: list[RoundEvent], total_seconds: float) -> RunStats:
    drafted = sum(len(r.drafted) for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    new_tokens = sum(len(r.emitted) for r in rounds)
    max_k = max((r.k for r in rounds), default=0)
    histogram = [0] * (max_k + 1)
    for r in rounds:
        histogram[r.accepted] += 1
    return RunStats(
        rounds=len(rounds),
        new_tokens=new_tokens,
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=acceptance_rate(rounds),
        tokens_per_round=new_tokens / len(rounds) if rounds else 0.0,
        draft_seconds=sum(r.draft_seconds for r in rounds),
        verify_seconds=sum(r.verify_seconds for r in rounds),
        total_seconds=total_seconds,
        tokens_per_second=new_tokens / total_seconds if total_seconds > 0 else 0.0,
        accepted_histogram=histogram,
        judged_acceptance=judged_acceptance(rounds),
        acceptance_by_position=acceptance_by_position(rounds),
    )


@dataclass(frozen=True)
class GenerationResult:
    tokens: list[int]                   # new tokens only
    rounds: list[RoundEvent]
    prompt_len: int
    prefill_seconds: float
    total_seconds: float                # prefill + all rounds
    stop_reason: str
    stats: RunStats = field(repr=False)

    @property
    def provenance(self) -> list[dict]:
        """Every new token, in order, with its kind (draft, correction, bonus) and drafter (RoundEvent.provenance)."""
        return [entry for r in self.rounds for entry in r.provenance]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class BaselineResult:
    """Plain autoregressive decoding with the same sampling code: the measured reference for speedup."""

    tokens: list[int]
    prompt_len: int
    prefill_seconds: float
    total_seconds: float
    step_seconds: list[float]           # one target forward per token after the first
    stop_reason: str

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.total_seconds if self.total_seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
